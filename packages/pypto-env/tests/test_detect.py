from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_env import default_roots, detect_cann, find_cann, installed_versions
from pypto_env.detect import read_version_cfg

NO_ROOTS: list[Path] = []


def test_ascend_toolkit_layout_via_ascend_home_path(cann_tree):
    home = cann_tree("8.3.RC1", layout="ascend-toolkit")
    found = detect_cann(env={"ASCEND_HOME_PATH": str(home)}, roots=NO_ROOTS)
    assert found is not None
    assert found.version == "8.3.RC1"
    assert found.home == home
    assert found.arch == "aarch64"
    assert found.layout == "ascend-toolkit"
    assert found.source == home / "aarch64-linux" / "ascend_toolkit_install.info"


def test_cann_layout_found_in_roots(cann_tree):
    home = cann_tree("9.1.0", layout="cann", arch="x86_64")
    found = detect_cann(env={}, roots=[home.parent / "nothing-here", home])
    assert found is not None
    assert (found.version, found.layout, found.arch) == ("9.1.0", "cann", "x86_64")


def test_ascend_home_path_wins_over_toolkit_home_and_roots(cann_tree):
    first = cann_tree("9.0.0", prefix="a")
    second = cann_tree("8.5.0", prefix="b")
    third = cann_tree("8.2.RC1", prefix="c")
    env = {"ASCEND_HOME_PATH": str(first), "ASCEND_TOOLKIT_HOME": str(second)}
    assert detect_cann(env=env, roots=[third]).version == "9.0.0"
    assert detect_cann(env={"ASCEND_TOOLKIT_HOME": str(second)}, roots=[third]).version == "8.5.0"
    assert detect_cann(env={}, roots=[third]).version == "8.2.RC1"


def test_broken_env_path_falls_back_and_says_why(cann_tree, tmp_path):
    good = cann_tree("8.5.0")
    empty = tmp_path / "empty-toolkit"
    empty.mkdir()
    env = {"ASCEND_HOME_PATH": str(tmp_path / "gone"), "ASCEND_TOOLKIT_HOME": str(empty)}
    detection = find_cann(env=env, roots=[good])
    assert detection.install is not None
    assert detection.install.version == "8.5.0"
    reasons = dict(detection.tried)
    assert reasons[str(tmp_path / "gone")] == "not a directory"
    assert "version.cfg" in reasons[str(empty)]


def test_version_cfg_gives_the_version_after_the_colon(tmp_path):
    home = tmp_path / "latest"
    home.mkdir()
    (home / "version.cfg").write_text(
        "# comment\ncompiler_running_version=[7.6.0.1.220:7.9.9]\n"
        "runtime_running_version=[7.6.0.1.220:8.0.0]\n"
    )
    found = detect_cann(env={"ASCEND_HOME_PATH": str(home)}, roots=NO_ROOTS)
    assert found is not None
    assert found.version == "8.0.0"
    assert found.source == home / "version.cfg"
    assert found.arch is None


def test_install_info_preferred_over_version_cfg(cann_tree):
    home = cann_tree("8.3.RC1.alpha002", layout="ascend-toolkit")
    (home / "version.cfg").write_text("runtime_running_version=[7.6.0.1.220:8.0.0]\n")
    assert (
        detect_cann(env={"ASCEND_HOME_PATH": str(home)}, roots=NO_ROOTS).version
        == "8.3.RC1.alpha002"
    )


def test_info_file_at_home_top_level_takes_arch_from_its_key(tmp_path, write_info):
    home = tmp_path / "cann"
    write_info(home, "9.0.0", arch="x86_64")
    found = detect_cann(env={}, roots=[home])
    assert (found.version, found.arch, found.layout) == ("9.0.0", "x86_64", "cann")


def test_other_install_info_is_the_last_resort(tmp_path):
    home = tmp_path / "cann"
    (home / "aarch64-linux").mkdir(parents=True)
    (home / "aarch64-linux" / "runtime_install.info").write_text("version=9.1.0\n")
    found = detect_cann(env={}, roots=[home])
    assert (found.version, found.arch) == ("9.1.0", "aarch64")


@pytest.mark.parametrize(
    ("info", "cfg"),
    [
        (b"\x00\x01\x02version=8.5.0\xff", None),
        (b"package_name=Ascend-cann-toolkit\nos=linux\n", None),
        (b"version=\n", b"runtime_running_version=[7.6.0.1.220:]\n"),
        (b"version=not a version\n", b"runtime_running_version=7.6.0\n"),
        ("version=\u00e9\u00e8\n".encode(), b"\xff\xfe garbage [:\n"),
    ],
)
def test_garbled_files_give_none_without_raising(tmp_path, info, cfg):
    home = tmp_path / "cann"
    (home / "aarch64-linux").mkdir(parents=True)
    (home / "aarch64-linux" / "ascend_toolkit_install.info").write_bytes(info)
    if cfg is not None:
        (home / "version.cfg").write_bytes(cfg)
    detection = find_cann(env={"ASCEND_HOME_PATH": str(home)}, roots=NO_ROOTS)
    assert detection.install is None
    assert any("no usable version" in why for _, why in detection.tried)


def test_garbled_info_falls_back_to_version_cfg(tmp_path):
    home = tmp_path / "cann"
    (home / "aarch64-linux").mkdir(parents=True)
    (home / "aarch64-linux" / "ascend_toolkit_install.info").write_bytes(b"\x00\x00")
    (home / "version.cfg").write_text("runtime_running_version=[7.6.0.1.220:8.5.0]\n")
    assert detect_cann(env={}, roots=[home]).version == "8.5.0"


def test_directory_where_a_file_should_be_is_skipped(tmp_path):
    home = tmp_path / "cann"
    (home / "aarch64-linux" / "ascend_toolkit_install.info").mkdir(parents=True)
    assert detect_cann(env={}, roots=[home]) is None


def test_host_arch_folder_is_preferred(tmp_path, write_info):
    home = tmp_path / "cann"
    host = platform.machine()
    other = "aarch64" if host != "aarch64" else "x86_64"
    write_info(home / f"{other}-linux", "8.5.0", arch=other)
    write_info(home / f"{host}-linux", "9.0.0", arch=host)
    found = detect_cann(env={}, roots=[home])
    assert (found.version, found.arch) == ("9.0.0", host)


def test_default_roots_system_then_home_and_override():
    roots = default_roots({"HOME": "/home/u"})
    assert roots == [
        Path("/usr/local/Ascend/ascend-toolkit/latest"),
        Path("/usr/local/Ascend/cann"),
        Path("/home/u/Ascend/ascend-toolkit/latest"),
        Path("/home/u/Ascend/cann"),
    ]
    assert default_roots({"HOME": "/h", "PYPTO_CANN_ROOTS": "/a:/b"}) == [Path("/a"), Path("/b")]
    assert default_roots({"PYPTO_CANN_ROOTS": ""}) == []


@pytest.mark.skipif(
    Path("/usr/local/Ascend").exists(), reason="a real CANN here would be found first"
)
def test_home_install_found_with_default_roots(tmp_path, cann_tree):
    home = cann_tree("8.2.RC1", layout="ascend-toolkit", prefix="user")
    found = detect_cann(env={"HOME": str(tmp_path / "user")})
    assert found is not None
    assert (found.version, found.home) == ("8.2.RC1", home)


def test_read_version_cfg_handles_missing_file(tmp_path):
    assert read_version_cfg(tmp_path / "nope.cfg") is None


def test_installed_versions_reports_cann_without_importing_torch(cann_tree):
    home = cann_tree("9.1.0")
    code = (
        "import sys, json, pypto_env\n"
        f"v = pypto_env.installed_versions(env={{'ASCEND_HOME_PATH': {str(home)!r}}}, roots=[])\n"
        "print(json.dumps(v)); assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    v = json.loads(out.stdout)
    assert v["cann"] == "9.1.0"
    assert v["cann_home"] == str(home)
    assert v["python"] == platform.python_version()
    expected = {
        "python",
        "platform",
        "machine",
        "torch",
        "torch_npu",
        "transformers",
        "huggingface_hub",
        "pypto",
    }
    assert expected <= set(v)
    assert installed_versions(env={}, roots=[])["cann"] is None
