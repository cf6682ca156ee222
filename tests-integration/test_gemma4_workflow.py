"""Gemma 4 through the whole workflow: a tiny gemma4_31b_it-structured repo on the local
hub -> pypto-e2e run --family gemma4_31b_it (download, patch, bench, report; the smoke gate
is skipped because random weights fail it by design) -> pypto-bench decode and prefill,
eager and graph, on the pinned folder; and the folders that must not load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_bench import EXIT as BENCH_EXIT
from pypto_e2e import EXIT as E2E_EXIT
from pypto_e2e import MANIFEST_NAME
from pypto_testing.folders import folder_bytes

pytest.importorskip("pypto_models_gemma4")

REPO = "pypto-test/tiny-gemma-4-31b-it"
SMALL = ["--device", "cpu", "--dtype", "float32", "--warmup", "0", "--iters", "1"]
# prompt 8 + 24 new tokens: the sliding window (8) fills and every ring wraps
SIZES = ["--seq", "8", "--gen", "24", "--batch", "2"]


def _cli(module: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=timeout,
    )


_state = folder_bytes


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory) -> Path:
    from pypto_testing.gemma4 import make_tiny_gemma4

    return make_tiny_gemma4(tmp_path_factory.mktemp("g4") / "tiny-gemma-4-31b-it", "31b")


@pytest.fixture(scope="module")
def e2e_run(gemma4_dir, tmp_path_factory) -> Path:
    from pypto_testing.hub import LocalHub

    work = tmp_path_factory.mktemp("g4run") / "run"
    with LocalHub() as hub:
        hub.add_repo(REPO, gemma4_dir)
        proc = _cli(
            "pypto_e2e",
            "run",
            "--model-id",
            REPO,
            "--work-dir",
            str(work),
            "--endpoint",
            hub.endpoint,
            "--family",
            "gemma4_31b_it",
            "--skip",
            "smoke",
            *SMALL,
            *SIZES,
        )
    assert proc.returncode == E2E_EXIT.OK, proc.stderr
    return work


@pytest.mark.slow
def test_e2e_runs_every_step_with_the_gemma4_preset(e2e_run):
    manifest = json.loads((e2e_run / MANIFEST_NAME).read_text())
    assert {k: v["status"] for k, v in manifest["steps"].items()} == {
        "download": "ok",
        "patch": "ok",
        "smoke": "skipped",
        "precision": "ok",
        "bench": "ok",
        "tune": "not-needed",
        "report": "ok",
    }
    report = json.loads((e2e_run / "report" / "bench.json").read_text())
    assert report["model"]["class"] == "PyptoGemma4ForConditionalGeneration31B"  # the pin ran
    arms = {a["name"]: a for a in report["arms"]}
    assert set(arms) == {"eager", "graph"}
    assert all(a["ok"] for a in arms.values()), arms
    assert arms["graph"]["token_match"]["rate"] == 1.0
    # The report names the layer-type pattern and the per-layer cache sizes: sliding layers
    # hold `window` slots, full layers max_len, and the bytes add up to the formula.
    from pypto_capture import layer_pattern
    from pypto_testing.gemma4 import expected_kv_cache_bytes

    cache = arms["graph"]["details"]["kv_cache"]
    full_config = json.loads((e2e_run / "model" / "config.json").read_text())
    config = full_config["text_config"]
    assert cache["pattern"] == layer_pattern(config["layer_types"])
    max_len = cache["max_cache_len"]
    slots = {layer["type"]: layer["slots"] for layer in cache["layers"] if not layer["shared"]}
    assert slots == {
        "sliding_attention": min(config["sliding_window"], max_len),
        "full_attention": max_len,
    }
    assert cache["total_bytes"] == expected_kv_cache_bytes(
        full_config, batch=2, max_cache_len=max_len
    )
    markdown = (e2e_run / "report" / "report.md").read_text()
    assert cache["pattern"] in markdown


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["decode", "prefill"])
def test_bench_eager_and_graph_on_the_pinned_folder(e2e_run, regime, tmp_path):
    patched = next(
        p for p in (e2e_run / "patched", e2e_run / "model") if (p / "config.json").exists()
    )
    assert "auto_map" in json.loads((patched / "config.json").read_text())
    out = tmp_path / f"{regime}.json"
    proc = _cli(
        "pypto_bench",
        "run",
        "--model-path",
        str(patched),
        "--trust-remote-code",
        "--regime",
        regime,
        "--arms",
        "eager,graph",
        "--no-bandwidth",
        "--report-file",
        str(out),
        *SMALL,
        *SIZES,
    )
    assert proc.returncode == BENCH_EXIT.OK, proc.stderr
    report = json.loads(out.read_text())
    assert report["model"]["class"] == "PyptoGemma4ForConditionalGeneration31B"
    arms = {a["name"]: a for a in report["arms"]}
    assert arms["eager"]["ok"], arms["eager"]
    assert arms["graph"]["ok"], arms["graph"]
    assert arms["graph"]["token_match"]["rate"] == 1.0


def _pin(folder: Path) -> None:
    proc = _cli(
        "pypto_patch", "apply", "--model-family", "gemma4_31b_it", "--model-path", str(folder)
    )
    assert proc.returncode == 0, proc.stderr


def _smoke(folder: Path) -> subprocess.CompletedProcess:
    return _cli(
        "pypto_bench", "smoke", "--model-path", str(folder), "--trust-remote-code", *SMALL[:4]
    )


@pytest.mark.slow
def test_a_llama_folder_pinned_as_gemma4_is_refused_then_fails_to_load_in_one_line(tmp_path):
    from pypto_models_gemma4.preset import PRESETS
    from pypto_patch import EXIT as PATCH_EXIT
    from pypto_patch import apply
    from pypto_testing.models import make_tiny_model

    folder = make_tiny_model(tmp_path / "llama", "llama")
    before = _state(folder)
    # pypto-patch runs the preset's check first: refused in one line, nothing written.
    proc = _cli(
        "pypto_patch", "apply", "--model-family", "gemma4_31b_it", "--model-path", str(folder)
    )
    assert proc.returncode == PATCH_EXIT.USAGE, proc.stderr
    assert "not a Gemma 4 checkpoint" in proc.stderr.strip().splitlines()[-1]
    assert _state(folder) == before
    # A folder pinned without that check (e.g. by an older pypto-patch) still fails at
    # load time in one line, untouched.
    unchecked = {k: v for k, v in PRESETS["gemma4_31b_it"].items() if k != "check"}
    apply(folder, preset=unchecked)
    pinned = _state(folder)
    proc = _smoke(folder)
    assert proc.returncode == BENCH_EXIT.LOAD_FAILED, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "not a Gemma 4 checkpoint (model_type 'llama'" in last
    assert _state(folder) == pinned


@pytest.mark.slow
def test_a_gemma4_folder_lacking_a_layer_fails_to_load_in_one_line(gemma4_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "truncated"
    shutil.copytree(gemma4_dir, folder)
    weights = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if "language_model.layers.2." not in k},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    _pin(folder)
    before = _state(folder)
    proc = _smoke(folder)
    assert proc.returncode == BENCH_EXIT.LOAD_FAILED, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "lacks weights for the text decoder's layer 2" in last
    assert _state(folder) == before
