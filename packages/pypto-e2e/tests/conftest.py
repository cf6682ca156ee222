"""What pypto-e2e's tests share: main()'s logging undone after each test, a copy of the
embedded demo model, the real CLI called in-process, and a work dir's exact state (as
fixtures: importlib mode cannot import conftest)."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from pathlib import Path

import pytest

from pypto_e2e.cli import main
from pypto_e2e.demo import demo_model_dir


@pytest.fixture(autouse=True)
def _restore_logging():
    """main() installs its stderr handler and levels: undo them for the next test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of the embedded demo model per test module (tests only read it)."""
    dest = tmp_path_factory.mktemp("demo") / "model"
    shutil.copytree(demo_model_dir(), dest)
    return dest


def _run_main(*argv: str) -> tuple[int, str, str]:
    """``pypto-e2e ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _tree_state(root: Path) -> dict[str, object]:
    """Every entry under ``root`` (links not followed): a file's bytes, else its kind."""
    state: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            state[rel] = ("link", str(path.readlink()))
        elif path.is_dir():
            state[rel] = "dir"
        elif path.is_file():
            state[rel] = path.read_bytes()
        else:
            state[rel] = "special"
    return state


@pytest.fixture
def e2e_cli():
    """``e2e_cli(*argv) -> (exit code, stdout, stderr)`` of ``pypto-e2e ARGV`` in-process."""
    return _run_main


@pytest.fixture
def tree_state():
    """``tree_state(root)``: every entry under root (a file's bytes, else its kind)."""
    return _tree_state
