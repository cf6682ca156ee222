from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_env import EXIT


def test_not_installed_prints_the_recommended_line(run_doctor):
    r = run_doctor("--cann", "8.5.0")
    assert r.returncode == EXIT.OK, r.stderr
    assert r.stdout == "pip install torch==2.9.0 torch-npu==2.9.0\n"
    assert "torch: not installed" in r.stderr


def test_consistent_install_on_detected_cann(run_doctor, cann_tree):
    home = cann_tree("9.1.0", layout="ascend-toolkit")
    dists = {"torch": "2.9.0+cpu", "torch_npu": "2.9.0.post6"}
    env = {"ASCEND_HOME_PATH": str(home)}
    r = run_doctor(dists=dists, env=env)
    assert r.returncode == EXIT.OK, r.stderr
    assert r.stdout == "pip install torch==2.9.0 torch-npu==2.9.0.post6\n"
    assert f"CANN 9.1.0 detected at {home}" in r.stderr

    j = run_doctor("--json", dists=dists, env=env)
    assert j.returncode == EXIT.OK
    doc = json.loads(j.stdout)
    assert doc["status"] == "ok"
    assert doc["exit_code"] == EXIT.OK
    assert doc["cann"]["origin"] == "detected"
    assert doc["cann"]["layout"] == "ascend-toolkit"
    assert doc["cann"]["version"] == doc["cann"]["release"] == "9.1.0"
    assert doc["installed"] == {"torch": "2.9.0+cpu", "torch_npu": "2.9.0.post6"}
    assert doc["pins"] == {"cann": "9.1.0", "torch": "2.9.0", "torch_npu": "2.9.0.post6"}
    assert doc["recommended"]["torch"] == "2.12.0"


def test_only_torch_installed_keeps_that_torch(run_doctor):
    r = run_doctor("--cann", "9.0.0", "--json", dists={"torch": "2.7.1"})
    assert r.returncode == EXIT.OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "incomplete"
    assert doc["pip_command"] == "pip install torch==2.7.1 torch-npu==2.7.1.post4"


def test_wrong_torch_npu_post_release_is_a_mismatch(run_doctor, cann_tree):
    home = cann_tree("9.1.0")
    r = run_doctor(
        dists={"torch": "2.9.0", "torch_npu": "2.9.0.post2"}, env={"ASCEND_HOME_PATH": str(home)}
    )
    assert r.returncode == EXIT.FAILED
    assert r.stdout == "pip install torch==2.9.0 torch-npu==2.9.0.post6\n"
    assert "torch_npu 2.9.0.post2 is not paired with CANN 9.1.0" in r.stderr


def test_unpaired_torch_is_a_mismatch_and_gets_the_recommended_line(run_doctor):
    r = run_doctor("--cann", "9.1.0", "--json", dists={"torch": "2.13.0+cpu"})
    assert r.returncode == EXIT.FAILED
    doc = json.loads(r.stdout)
    assert doc["status"] == "mismatch"
    assert doc["pip_command"] == "pip install torch==2.12.0 torch-npu==2.12.0"
    assert any("2.13.0" in n and "not documented" in n for n in doc["notes"])


def test_torch_for_another_cann_says_which(run_doctor):
    r = run_doctor("--cann", "8.1.RC1", dists={"torch": "2.9.0", "torch_npu": "2.9.0"})
    assert r.returncode == EXIT.FAILED
    assert r.stdout == "pip install torch==2.5.1 torch-npu==2.5.1\n"
    assert "torch 2.9.0 pairs with CANN 9.1.0, 9.0.0, 8.5.0" in r.stderr


def test_unknown_cann_argument_is_bad_input(run_doctor):
    r = run_doctor("--cann", "7.0.0")
    assert r.returncode == EXIT.USAGE
    assert r.stdout == ""
    assert "unknown CANN '7.0.0'" in r.stderr
    assert "9.1.0, 9.0.0, 8.5.0, 8.3.RC1, 8.2.RC1, 8.1.RC1" in r.stderr

    j = run_doctor("--cann", "7.0.0", "--json")
    doc = json.loads(j.stdout)
    assert (j.returncode, doc["status"], doc["pip_command"]) == (EXIT.USAGE, "bad-input", None)
    assert "8.3.RC1" in doc["known_cann"]


def test_no_cann_found_says_how_to_set_it(run_doctor, tmp_path):
    r = run_doctor(env={"ASCEND_HOME_PATH": str(tmp_path / "missing")})
    assert r.returncode == EXIT.ENVIRONMENT
    assert r.stdout == ""
    assert "ASCEND_HOME_PATH" in r.stderr
    assert "set_env.sh" in r.stderr
    assert f"looked at {tmp_path / 'missing'}: not a directory" in r.stderr

    doc = json.loads(run_doctor("--json").stdout)
    assert (doc["exit_code"], doc["status"], doc["cann"]) == (EXIT.ENVIRONMENT, "no-cann", None)


def test_detected_cann_outside_the_matrix(run_doctor, cann_tree):
    home = cann_tree("8.3.RC2")
    r = run_doctor("--json", env={"PYPTO_CANN_ROOTS": str(home)})
    assert r.returncode == EXIT.UNKNOWN_CANN
    doc = json.loads(r.stdout)
    assert doc["status"] == "unknown-cann"
    assert doc["cann"]["version"] == "8.3.RC2"
    assert "8.3.RC1" in doc["message"]


def test_detected_build_uses_its_release_row(run_doctor, cann_tree):
    home = cann_tree("8.3.RC1.alpha002", layout="ascend-toolkit")
    r = run_doctor("--json", env={"ASCEND_TOOLKIT_HOME": str(home)})
    assert r.returncode == EXIT.OK, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["cann"]["version"], doc["cann"]["release"]) == ("8.3.RC1.alpha002", "8.3.RC1")
    assert doc["pip_command"] == "pip install torch==2.8.0 torch-npu==2.8.0"
    assert "release 8.3.RC1" in r.stderr


def test_console_script_is_installed():
    script = shutil.which("pypto-doctor", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip(
            "pypto-doctor script not installed next to this interpreter (not pip-installed)"
        )
    r = subprocess.run(
        [script, "--cann", "bogus"], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == EXIT.USAGE
    assert r.stdout == ""
    assert "unknown CANN 'bogus'" in r.stderr


def test_exit_codes_are_pypto_doctors_own_and_listed_in_help(run_doctor):
    """The tool-specific code sits in pypto-doctor's range (it was 10, pypto-download's)."""
    from pypto_common import EXIT_RANGES

    assert EXIT.UNKNOWN_CANN in EXIT_RANGES["pypto-doctor"]
    assert EXIT.tool == "pypto-doctor"
    r = run_doctor("--help")
    assert r.returncode == EXIT.OK
    assert f"{EXIT.UNKNOWN_CANN} UNKNOWN_CANN" in " ".join(r.stdout.split())
