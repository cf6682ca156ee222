"""The step chain lives in pypto_e2e.chain (run state in pypto_e2e.state); the old
``pypto_e2e.pipeline`` path still works, warns, and nothing in the package uses it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pypto_e2e
from pypto_e2e import chain, state

SRC = Path(pypto_e2e.__file__).resolve().parent


def _python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=120
    )


def test_old_pipeline_path_reexports_the_same_objects():
    proc = _python(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import pypto_e2e.pipeline as p, pypto_e2e.chain as c, pypto_e2e.state as s\n"
        "assert p.run is c.run and p.RunResult is c.RunResult\n"
        "assert p.RunState is s.RunState and p.StepOutcome is s.StepOutcome\n"
        "assert p.MANIFEST_NAME == c.MANIFEST_NAME and p.STEPS == c.STEPS\n"
        "print(sorted(p.__all__))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(
        sorted(["MANIFEST_NAME", "STEPS", "RunResult", "RunState", "StepOutcome", "run"])
    )


def test_old_pipeline_path_warns_deprecated():
    proc = _python("import pypto_e2e.pipeline", "-W", "error::DeprecationWarning")
    assert proc.returncode != 0
    assert "pypto_e2e.pipeline is deprecated" in proc.stderr
    assert "pypto_e2e.chain" in proc.stderr


def test_package_never_imports_the_deprecated_path():
    """Importing the package and its CLI loads no pypto_e2e.pipeline (so no warning)."""
    proc = _python(
        "import sys, pypto_e2e, pypto_e2e.cli, pypto_e2e.demo\n"
        "print('pypto_e2e.pipeline' in sys.modules)",
        "-W",
        "error::DeprecationWarning",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
    for path in SRC.glob("*.py"):
        if path.name == "pipeline.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("pipeline", "pypto_e2e.pipeline"), path.name


def test_public_names_have_one_home():
    assert pypto_e2e.run is chain.run
    assert pypto_e2e.RunResult is chain.RunResult
    assert pypto_e2e.StepOutcome is state.StepOutcome
    assert chain.RunState is state.RunState
