import subprocess
import sys

import pytest

import pypto_kernels_gutenocr as pk
from pypto_kernels_gutenocr import switches


def test_module_attributes_read_and_write_the_shared_state():
    assert pk.USE_PTO_RMS_NORM is False
    pk.USE_PTO_RMS_NORM = True
    assert switches.is_on("rms_norm")
    assert switches.snapshot()["USE_PTO_RMS_NORM"] is True
    switches.set_switch("mrope", True)
    assert pk.USE_PTO_MROPE is True
    assert pk.USE_PTO_SWIGLU_MLP is False


def test_context_manager_sets_and_restores_even_on_error():
    pk.USE_PTO_MROPE = True
    seen = {}

    def body():
        with pk.pto_switches(swiglu_mlp=True, mrope=False):
            seen.update(swiglu=pk.USE_PTO_SWIGLU_MLP, mrope=pk.USE_PTO_MROPE)
            raise KeyError("boom")

    with pytest.raises(KeyError):
        body()
    assert seen == {"swiglu": True, "mrope": False}
    assert not pk.USE_PTO_SWIGLU_MLP
    assert pk.USE_PTO_MROPE
    with pk.pto_switches({"USE_PTO_RMS_NORM": True}, mrope=None):
        assert pk.USE_PTO_RMS_NORM
        assert pk.USE_PTO_MROPE


def test_unknown_switch_names_are_rejected():
    with pytest.raises(switches.SwitchError, match="unknown op 'layernorm'"):
        switches.parse("rms_norm,layernorm")
    with pytest.raises(switches.SwitchError), pk.pto_switches(flash=True):
        pass


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all", {"USE_PTO_RMS_NORM": True, "USE_PTO_MROPE": True, "USE_PTO_SWIGLU_MLP": True}),
        (
            "swiglu_mlp, mrope",
            {"USE_PTO_RMS_NORM": False, "USE_PTO_MROPE": True, "USE_PTO_SWIGLU_MLP": True},
        ),
        ("none", {"USE_PTO_RMS_NORM": False, "USE_PTO_MROPE": False, "USE_PTO_SWIGLU_MLP": False}),
    ],
)
def test_environment_variable_sets_switches_at_import(spec, expected):
    code = "import json, pypto_kernels_gutenocr as p; print(json.dumps(p.report()['switches']))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "PYPTO_GUTENOCR_SWITCHES": spec},
        capture_output=True,
        text=True,
        check=True,
    )
    assert __import__("json").loads(out.stdout) == expected
