"""Every command a pypto-tune recommendation can print exists and takes its exact flags.

Issue 27, item 8: advice recommended ``pypto-capture bisect --model-path ...``, a command
that did not exist. Here every fix the detectors can name (read from pypto_tune.detect's
source, so a new fix is covered without editing this file) is turned into its
recommendation on profiles that set every bench flag advice copies, on each device kind,
with and without kernel plug-ins; the markdown report is rendered, and each command it
shows in backticks is run through its installed console script up to ``--help``: the exit
code is 0 (argparse checked every value before ``--help``) and every ``--flag`` of the
command is one the command's own help lists (argparse would otherwise skip an unknown flag
silently on the way to ``--help``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
from importlib.metadata import entry_points
from typing import Any

import pytest

pytest.importorskip("transformers")

from pypto_tune import detect
from pypto_tune.outputs import to_markdown
from pypto_tune.records import Profile
from pypto_tune.tiles import discover_tunables

# The module (the package's ``advise`` attribute is the function of that name).
advise_module = importlib.import_module("pypto_tune.advise")


def _fix_ids() -> set[str]:
    """Every ``fix`` value the detectors can set (``fix="x"``, ``"fix": "x"``, and both
    branches of ``"x" if ... else "y"``)."""
    tree = ast.parse(inspect.getsource(detect))
    found: set[str] = set()

    def strings(node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
        elif isinstance(node, ast.IfExp):
            strings(node.body)
            strings(node.orelse)

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "fix":
            strings(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "fix":
                    strings(value)
    return found


FIXES = sorted(_fix_ids())


def _finding(fix: str) -> dict[str, Any]:
    return {
        "id": fix,
        "fix": fix,
        "share": 0.3,
        "fix_factor": 2.0,
        "title": f"finding {fix}",
        "threshold": 0.1,
        "where": ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn"],
        "evidence": {
            "batch_M_N_K": [1, 7, 4096, 4096],
            "misaligned_dims": {"M": 7},
            "alignment": 16,
            "efficiency": 0.3,
            "op": "aten::mm",
        },
    }


def _plugins() -> list[dict[str, Any]]:
    tunables = discover_tunables()
    if not tunables:
        return []
    return [
        {
            "name": "installed",
            "tunables": {k: list(getattr(t, "shape_names", ())) for k, t in tunables.items()},
        }
    ]


def _profile(device_type: str, plugins: list[dict[str, Any]], full: bool) -> Profile:
    names = {n for p in plugins for ns in p["tunables"].values() for n in ns}
    config: dict[str, Any] = {"model_path": "/models/my model", "arms": ["eager", "graph"]}
    if full:  # every flag advice copies from the profiled run
        config.update(
            regime="decode",
            seq=32,
            gen=16,
            batch=2,
            device={"cpu": "cpu", "cuda": "cuda:0", "npu": "npu:0"}[device_type],
            dtype="bfloat16",
            attn_implementation="eager",
            graph_backend="fused",
            moe_routing="static",
            trust_remote_code=True,
        )
    return Profile(
        meta={
            "device_type": device_type,
            "dtype": "bfloat16",
            "arm": "eager",
            "bench_config": config,
            "kernel_plugins": plugins,
            "model_shapes": {**dict.fromkeys(names, 64), "rows": 2, "hidden": 64, "inter": 128},
        },
        peaks={"replay": {"us": 10.0}},
        step={"time_us": {"mean": 1000.0}, "device_busy_us": 400.0},
        ops=[],
        blocks={},
        call_graph=[],
    )


def _printed_commands() -> set[str]:
    commands: set[str] = set()
    for device_type in ("cpu", "cuda", "npu"):
        for plugins in (_plugins(), []):
            for full in (True, False):
                p = _profile(device_type, plugins, full)
                p.findings = [_finding(fix) for fix in FIXES]
                p.recommendations = [
                    r for f in p.findings if (r := advise_module._recommend(p, f)) is not None
                ]
                report = to_markdown(p)
                commands |= {c for c in re.findall(r"`([^`]+)`", report) if c.startswith("pypto-")}
    return commands


COMMANDS = sorted(_printed_commands())


def test_every_detector_fix_and_command_kind_is_covered():
    # The fixes the issue named, and commands of each tool advice points to.
    assert {"graph_arm", "remove_graph_breaks", "pad_matmul", "fuse_norm"} <= set(FIXES)
    programs = {(c.split()[0], c.split()[1]) for c in COMMANDS}
    assert {
        ("pypto-bench", "run"),
        ("pypto-tune", "profile"),
        ("pypto-tune", "compare"),
        ("pypto-capture", "bisect"),
    } <= programs
    assert any("--attn-implementation" in c for c in COMMANDS if c.startswith("pypto-capture"))


def _console_main(program: str):
    found = [ep for ep in entry_points(group="console_scripts") if ep.name == program]
    assert found, f"{program} is not an installed console script"
    return found[0].load()


@pytest.mark.parametrize("command", COMMANDS)
def test_each_printed_command_accepts_its_exact_flags(command, capsys):
    argv = shlex.split(command)
    main = _console_main(argv[0])
    code = main([*argv[1:], "--help"])
    out, err = capsys.readouterr()
    assert code == 0, f"{command}: exit {code}: {err.strip()[-500:]}"
    assert f"usage: {argv[0]} {argv[1]}" in " ".join(out.split()), out[:300]
    for flag in (a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), (
            f"{command}: {argv[0]} {argv[1]} has no {flag} option"
        )
