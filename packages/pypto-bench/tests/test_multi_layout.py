"""pypto_bench.multi's layout (issue 28): one trade per module, no private name taken across
its modules, no import cycle among them; the old module paths are gone and every name they
carried is public in its one home; the launcher and rank entry points resolve by name; a run
validates its config once."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import pypto_bench
import pypto_bench.multi
from pypto_bench import BenchConfig, ModelNotFoundError
from pypto_bench.config import validate_placement
from pypto_bench.errors import EXIT, BadInputError

MULTI = Path(pypto_bench.multi.__file__).parent
#: The old homes of the multi-device code (removed: their callers import the new homes).
OLD_HOMES = ("distributed", "pipeline", "tensor_parallel", "lifecycle")
#: Every name the old homes carried, by its one home (old private spellings: ``_union`` is
#: ``comm.union_of_spans``, ``_out_of_memory`` is ``fit.out_of_memory``, ``group_members``
#: is ``lifecycle.live_group_members``, ``validate_distributed`` is ``validate_placement``).
HOMES = {
    "pypto_bench.config": (
        "DEFAULT_RANK_TIMEOUT", "DISTRIBUTED_ARMS", "DISTRIBUTED_REGIMES", "MAX_RANK_TIMEOUT",
        "PLACEMENTS", "check_rank_timeout", "validate_placement",
    ),
    "pypto_bench.multi": ("DEVICE_ID_ENV", "run_distributed", "run_pipeline"),
    "pypto_bench.multi.aggregate": (
        "LOGITS_ATOL", "LOGITS_EPS_FACTOR", "NO_BASELINE_FIGURES", "add_arm",
    ),
    "pypto_bench.multi.arms": ("DISTRIBUTED_AUTO_BACKEND",),
    "pypto_bench.multi.comm": (
        "COLLECTIVE_PREFIXES", "GRAPH_COMM_UNMEASURED_CPU", "hccl_spans", "union_of_spans",
    ),
    "pypto_bench.multi.fit": (
        "BASELINE_HEADROOM", "baseline_skip_reason", "checkpoint_bytes", "fit_reason",
        "out_of_memory",
    ),
    "pypto_bench.multi.launch": ("ORPHAN_GRACE_S", "free_port", "launcher_main", "run_distributed"),
    "pypto_bench.multi.lifecycle": (
        "EXIT_ORPHANED", "GROUP_METHOD", "ORPHAN_SIGNAL", "TERMINATED_EXIT", "Terminated",
        "end_group_members", "group_jiffies", "group_load_sampler", "group_stats",
        "live_group_members", "proc_stat", "sigterm_as_interrupt",
    ),
    "pypto_bench.multi.pipeline": (
        "MAX_PIPELINE_LAYERS", "declared_layers", "decoder_layers", "run_pipeline",
        "stage_device_map",
    ),
    "pypto_bench.multi.preflight": (
        "BACKEND_FOR", "check_model_code", "check_nproc", "check_tokenizer", "check_tp_plan",
        "require_accelerate", "visible_devices",
    ),
    "pypto_bench.multi.rank": ("DEVICE_ID_ENV", "LAUNCHER_PID_ENV", "RANK_PARENT_POLL_S"),
    "pypto_bench.multi.tensor": (
        "PYPTO_PLAN_PREFIX", "STYLES", "Rule", "ShardReport", "check_plan", "load_placed",
        "parse_plan", "plan_of", "shard_model",
    ),
}  # fmt: skip


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


@pytest.mark.parametrize("old", OLD_HOMES)
def test_old_module_paths_are_gone(old):
    """No re-export module is left behind: its callers import the new homes."""
    assert importlib.util.find_spec(f"pypto_bench.{old}") is None
    assert not hasattr(pypto_bench, old)


@pytest.mark.parametrize("home", sorted(HOMES))
def test_every_name_of_the_old_paths_is_public_in_its_home(home):
    module = importlib.import_module(home)
    missing = [name for name in HOMES[home] if name not in module.__all__]
    assert not missing, f"{home} does not export {missing}"


def test_package_api_takes_run_distributed_from_its_home():
    assert pypto_bench.run_distributed is pypto_bench.multi.run_distributed


def test_pipeline_placement_rules_refuse_decode():
    """The old ``validate_pipeline``: ``validate_placement`` placed by pipeline."""
    with pytest.raises(BadInputError, match="prefill regime only"):
        validate_placement(
            BenchConfig(nproc=2, regime="decode", arms=("eager",), placement="pipeline")
        )
    validate_placement(
        BenchConfig(nproc=2, regime="prefill", arms=("eager",), placement="pipeline")
    )


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
