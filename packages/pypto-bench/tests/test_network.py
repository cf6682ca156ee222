"""The collectives' network checked on a node (this host's real interfaces), and a rank's
device bound from its local rank before torch can initialise one (a real process)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_bench.errors import BadInputError
from pypto_bench.multi.network import (
    IFNAME_VARIABLE,
    check_network,
    interface_for,
    local_interfaces,
)

NAMES = list(local_interfaces())


def test_this_host_has_loopback_with_its_address() -> None:
    assert local_interfaces().get("lo") == "127.0.0.1"
    assert interface_for("127.0.0.1", 29500) == ("127.0.0.1", "lo")
    assert interface_for("no-such-host.invalid", 29500) == (None, None)


@pytest.mark.parametrize("backend", ["gloo", "nccl", "hccl"])
def test_an_interface_the_host_has_is_stated(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    monkeypatch.setenv(IFNAME_VARIABLE[backend], "lo")
    for name in ("HCCL_IF_IP", "HCCL_IF_BASE_PORT"):
        monkeypatch.delenv(name, raising=False)
    got = check_network(backend, "127.0.0.1", 29500)
    assert got["selected"] == ["lo"]
    assert got["route_interface"] == "lo"
    assert got["host"] == socket.gethostname()
    assert "note" not in got


@pytest.mark.parametrize(
    ("backend", "value", "needle"),
    [
        ("gloo", "nosuch0", "no interface 'nosuch0'"),
        ("gloo", "l", "no interface 'l'"),  # gloo: exact names
        ("nccl", "nosuch", "no interface starting with 'nosuch'"),
        ("nccl", "=l", "no interface 'l'"),  # '=': exact names
        ("hccl", "lo,zz", "no interface starting with 'zz'"),
    ],
)
def test_an_interface_the_host_lacks_is_one_line(
    monkeypatch: pytest.MonkeyPatch, backend: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(IFNAME_VARIABLE[backend], value)
    with pytest.raises(BadInputError) as caught:
        check_network(backend, "127.0.0.1", 29500)
    line = str(caught.value)
    assert needle in line
    assert "\n" not in line
    assert all(n in line for n in NAMES)  # what this host has, to choose from


def test_prefixes_and_exclusions_follow_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "l")  # a prefix: lo
    assert check_network("nccl", "127.0.0.1", 1)["selected"] == ["lo"]
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^nosuch,docker")  # exclusions: not checked
    assert check_network("nccl", "127.0.0.1", 1)["selected"] == []
    # gloo's variable is not the one NCCL reads: another backend's typo is not ours.
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
    check_network("nccl", "127.0.0.1", 1)


def test_a_selected_interface_off_the_route_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    others = [n for n, a in local_interfaces().items() if a and n != "lo"]
    if not others:
        pytest.skip("this host has no IPv4 interface besides loopback")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", others[0])
    got = check_network("gloo", "127.0.0.1", 1)
    assert "another network than the rendezvous" in got["note"]


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"HCCL_IF_IP": "10.255.255.254"}, "is not an address of"),
        ({"HCCL_IF_IP": "node0"}, "is not an IP address"),
        ({"HCCL_IF_BASE_PORT": "80"}, "use a port from 1024"),
        ({"HCCL_IF_BASE_PORT": "65530"}, "use a port from 1024"),
        ({"HCCL_IF_BASE_PORT": "x" * 500}, "use a port from 1024"),
    ],
)
def test_hccl_address_and_ports_are_checked(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], needle: str
) -> None:
    for name in ("HCCL_SOCKET_IFNAME", "HCCL_IF_IP", "HCCL_IF_BASE_PORT"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(BadInputError, match=needle) as caught:
        check_network("hccl", "127.0.0.1", 1)
    assert len(str(caught.value)) < 300


def test_an_owned_hccl_address_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_IF_IP", "127.0.0.1")
    monkeypatch.setenv("HCCL_IF_BASE_PORT", "60000")
    monkeypatch.delenv("HCCL_SOCKET_IFNAME", raising=False)
    assert check_network("hccl", "127.0.0.1", 1)["route_interface"] == "lo"


_BIND = """
import json, os, sys
from pypto_bench.multi.rank import bind_local_device
warnings = bind_local_device(3, sys.argv[1])
print(json.dumps({
    "device_id": os.environ.get("TILE_FWK_DEVICE_ID"),
    "alloc": os.environ.get("PYTORCH_NPU_ALLOC_CONF"),
    "torch_loaded": "torch" in sys.modules,
    "warnings": warnings,
}))
"""


@pytest.mark.parametrize(("device", "alloc"), [("npu", "expandable_segments:True"), ("cpu", None)])
def test_a_rank_is_bound_before_torch_loads(tmp_path: Path, device: str, alloc: str | None) -> None:
    """In a fresh process: the local device index and (where torch_npu is installed: an
    importable stand-in here, never imported) the NPU allocator's setting are in the
    environment before anything has imported torch."""
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("raise ImportError('not here')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NPU_ALLOC_CONF"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    got = subprocess.run(
        [sys.executable, "-c", _BIND, device], env=env, capture_output=True, text=True, check=True
    )
    out = json.loads(got.stdout)
    assert out == {"device_id": "3", "alloc": alloc, "torch_loaded": False, "warnings": []}
