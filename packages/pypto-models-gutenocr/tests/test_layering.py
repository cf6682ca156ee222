"""What the library may import: no test helpers, and the shared device and timing layers."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pypto_bench.measure
import pypto_capture
import pypto_models_gutenocr
from pypto_models_gutenocr import runner

SRC = Path(pypto_models_gutenocr.__file__).resolve().parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_library_code_imports_no_test_helpers():
    """The tiny-folder builder lives in pypto_testing.gutenocr, outside the installed library."""
    assert importlib.util.find_spec("pypto_models_gutenocr.testing") is None
    offenders = {
        p.name: sorted(m for m in _imported_modules(p) if m.split(".")[0] == "pypto_testing")
        for p in SRC.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_runner_uses_the_shared_device_and_timing_helpers():
    """One device vocabulary and one estimator across pypto-capture, pypto-bench and this CLI."""
    assert runner.resolve_device is pypto_capture.resolve_device
    assert runner.synchronize is pypto_capture.synchronize
    assert runner.reset_peak_memory is pypto_capture.reset_peak_memory
    assert runner.memory_stats is pypto_capture.memory_stats
    assert runner.count_tokens is pypto_bench.measure.count_tokens
    assert runner.summarize_seconds is pypto_bench.measure.summarize_seconds
    for copy in ("_reset_peak", "_peak_bytes", "_count_tokens"):
        assert not hasattr(runner, copy), copy


def test_library_takes_only_public_names_from_other_packages():
    """Every name the library imports from pypto-bench / pypto-capture is in that module's
    ``__all__``: the statistics come from the bench's one public implementation, not a
    private copy or a reach into its internals."""
    reaches = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if node.module.split(".")[0] not in ("pypto_bench", "pypto_capture"):
                continue
            public = set(getattr(importlib.import_module(node.module), "__all__", ()))
            reaches += [
                f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name not in public
            ]
    assert reaches == []
