"""Both MiniMax presets through the whole workflow (``pypto-e2e run``) from a local hub.

Tiny folders in the released formats (the FP8 M2.7 release; the M3 vision-language
checkpoint) are served by pypto_testing's LocalHub; ``pypto-e2e run --family ...
--skip smoke`` downloads, pins with the preset (pypto-patch), and benches eager vs graph:
the graph arm runs exact capture-safe MoE (and M3's capture-safe sparse attention) and
its greedy tokens equal eager's. Select with ``-k minimax``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pypto_models_minimax")

from pypto_e2e import EXIT, MANIFEST_NAME
from pypto_testing.hub import LocalHub

FAST = ["--device", "cpu", "--seq", "8", "--gen", "6", "--warmup", "0", "--iters", "1"]
FAST += ["--dtype", "float32", "--arms", "eager,graph"]


@pytest.fixture(scope="module")
def minimax_hub(tmp_path_factory):
    from pypto_testing.minimax import make_tiny_minimax_m3, make_tiny_minimax_m27

    root = tmp_path_factory.mktemp("minimax-repos")
    m27 = make_tiny_minimax_m27(root / "m27", weights="fp8")
    m3 = make_tiny_minimax_m3(root / "m3", weights="bf16")
    with LocalHub() as hub:
        hub.add_repo("MiniMaxAI/MiniMax-M2.7-tiny", m27)
        hub.add_repo("MiniMaxAI/MiniMax-M3-tiny", m3)
        yield hub


def _e2e(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pypto_e2e", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=900,
    )


@pytest.mark.parametrize(
    ("repo", "family", "model_class"),
    [
        ("MiniMaxAI/MiniMax-M2.7-tiny", "minimax_m27", "PyptoMiniMaxM27ForCausalLM"),
        ("MiniMaxAI/MiniMax-M3-tiny", "minimax_m3", "PyptoMiniMaxM3ForCausalLM"),
    ],
)
def test_minimax_preset_through_pypto_e2e_run(minimax_hub, tmp_path, repo, family, model_class):
    work = tmp_path / "run"
    done = _e2e(
        "run",
        "--model-id",
        repo,
        "--work-dir",
        str(work),
        "--endpoint",
        minimax_hub.endpoint,
        "--family",
        family,
        "--skip",
        "smoke",
        *FAST,
    )
    assert done.returncode == EXIT.OK, done.stderr[-3000:]
    manifest = json.loads((work / MANIFEST_NAME).read_text())
    statuses = {name: step["status"] for name, step in manifest["steps"].items()}
    assert statuses["download"] == "ok"
    assert statuses["patch"] == "ok"
    assert statuses["bench"] == "ok"
    report = json.loads((work / "report" / "bench.json").read_text())
    assert report["model"]["class"] == model_class
    arms = {a["name"]: a for a in report["arms"]}
    assert arms["eager"]["ok"], arms["eager"]["error"]
    graph = arms["graph"]
    assert graph["ok"], graph["error"]
    assert graph["details"]["moe_routing"] == "exact"
    assert graph["token_match"]["rate"] == 1.0
    pinned = json.loads((Path(report["model"]["path"]) / "config.json").read_text())
    assert pinned["auto_map"]["AutoModelForCausalLM"].endswith(model_class)
