"""pypto_bench.multi's layout (issue 28): one trade per module, no private name taken across
its modules, no import cycle among them; the old module paths re-export the very objects of
the new homes; the launcher and rank entry points resolve by name; a run validates its
config once."""

from __future__ import annotations

import ast
import importlib
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import pypto_bench.multi
from pypto_bench import BenchConfig, ModelNotFoundError
from pypto_bench.errors import EXIT, BadInputError

MULTI = Path(pypto_bench.multi.__file__).parent
SHIMS = {
    "pypto_bench.distributed": ("pypto_bench.multi", "pypto_bench.config"),
    "pypto_bench.pipeline": ("pypto_bench.multi", "pypto_bench.config"),
    "pypto_bench.tensor_parallel": ("pypto_bench.multi",),
    "pypto_bench.lifecycle": ("pypto_bench.multi",),
}


def _multi_modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(MULTI.glob("*.py"))}


def _sibling_imports(tree: ast.Module) -> list[tuple[str, str]]:
    """(sibling module, imported name) of every ``from .x import y`` (function-level too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found += [(node.module, a.name) for a in node.names]
    return found


def test_every_multi_module_declares_all_and_takes_no_private_name_from_a_sibling():
    modules = _multi_modules()
    assert {"launch", "rank", "tensor", "pipeline", "aggregate", "comm", "fit"} <= set(modules)
    for name, tree in modules.items():
        assigned = {
            t.id
            for n in tree.body
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Name)
        }
        assert "__all__" in assigned, f"multi/{name}.py declares no __all__"
        private = [f"{mod}.{imp}" for mod, imp in _sibling_imports(tree) if imp.startswith("_")]
        assert not private, f"multi/{name}.py imports private names of its siblings: {private}"


def test_no_import_cycle_among_multi_modules():
    edges = {
        name: {mod.split(".")[0] for mod, _ in _sibling_imports(tree)}
        for name, tree in _multi_modules().items()
    }
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = [*path[path.index(node) :], node]
            raise AssertionError(f"import cycle in pypto_bench.multi: {' -> '.join(cycle)}")
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for name in sorted(edges):
        visit(name, [])


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_old_module_paths_re_export_the_new_homes_objects(shim):
    """Each name of an old module is the object its new home defines (an alias, not a copy
    that could drift); the one exception is the pipeline rules' old entry point."""
    module = importlib.import_module(shim)
    homes = {}
    for sub in sorted(MULTI.glob("*.py")):
        if sub.stem != "__main__":
            homes[f"pypto_bench.multi.{sub.stem}"] = importlib.import_module(
                f"pypto_bench.multi.{sub.stem}"
            )
    homes["pypto_bench.config"] = importlib.import_module("pypto_bench.config")
    for name in module.__all__:
        obj = getattr(module, name)
        if shim == "pypto_bench.pipeline" and name == "validate_pipeline":
            continue
        owners = [
            home
            for home, mod in homes.items()
            if home.startswith(SHIMS[shim]) and any(v is obj for v in vars(mod).values())
        ]
        assert owners, f"{shim}.{name} is not an object of {', '.join(SHIMS[shim])}"


def test_old_pipeline_rules_entry_point_still_refuses_decode():
    from pypto_bench.pipeline import validate_pipeline

    with pytest.raises(BadInputError, match="prefill regime only"):
        validate_pipeline(BenchConfig(nproc=2, regime="decode", arms=("eager",)))
    validate_pipeline(BenchConfig(nproc=2, regime="prefill", arms=("eager",)))


def test_rank_entry_point_travels_by_reference():
    """torch's elastic agent pickles the rank's function for its spawned processes: it must
    be a module-level function of an importable module, not of the launcher's __main__."""
    from pypto_bench.multi.launch import LAUNCHER_MODULE
    from pypto_bench.multi.rank import rank_main

    data = pickle.dumps(rank_main)
    assert b"pypto_bench.multi.rank" in data
    assert b"rank_main" in data
    assert pickle.loads(data) is rank_main
    assert importlib.util.find_spec(f"{LAUNCHER_MODULE}.__main__") is not None


def test_launcher_module_without_a_spec_is_a_usage_line():
    done = subprocess.run(
        [sys.executable, "-m", "pypto_bench.multi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT.USAGE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "usage: python -m pypto_bench.multi SPEC.json" in lines[0]


class _Counting(BenchConfig):
    """A real BenchConfig that counts its validations."""

    calls = 0

    def validate(self) -> None:
        type(self).calls += 1
        super().validate()


@pytest.mark.parametrize("placement", ["tensor", "pipeline"])
@pytest.mark.parametrize("validated", [False, True])
def test_a_multi_device_run_validates_its_config_once(tmp_path, placement, validated):
    """Called directly, a run validates once (a library caller stays safe); called with
    ``validated=True`` (what ``run_bench`` may pass after its own validate) not again.
    The folder is missing, so the run stops at its first check after validation."""
    from pypto_bench.multi import run_distributed, run_pipeline

    _Counting.calls = 0
    config = _Counting(
        model_path=str(tmp_path / "absent"), nproc=2, regime="prefill", arms=("eager",),
        device="cpu", placement=placement,
    )  # fmt: skip
    run = run_pipeline if placement == "pipeline" else run_distributed
    with pytest.raises(ModelNotFoundError):
        run(config, validated=validated)
    assert _Counting.calls == (0 if validated else 1)


@pytest.mark.parametrize("placement", ["tensor", "pipeline"])
def test_a_direct_call_still_refuses_a_bad_config(tmp_path, placement):
    from pypto_bench.multi import run_distributed, run_pipeline

    config = BenchConfig(
        model_path=str(tmp_path), nproc=2, regime="diffusion-generate", arms=("eager",),
        device="cpu", placement=placement,
    )  # fmt: skip
    run = run_pipeline if placement == "pipeline" else run_distributed
    with pytest.raises(BadInputError):
        run(config)
    assert not any(tmp_path.iterdir())  # nothing written
