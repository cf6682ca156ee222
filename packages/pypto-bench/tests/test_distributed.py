"""--nproc 2 on CPU (gloo, 2 ranks on the 2 cores): tiny Llama prefill, sharded by its plan.

One launch for the module (the prefill run below); the refusals are checked without any
launch: they must happen before a process starts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from pypto_bench import BadInputError, open_session, schema
from pypto_bench.cli import main
from pypto_bench.errors import EXIT, NoTensorParallelPlanError
from pypto_bench.multi import run_distributed, visible_devices
from pypto_bench.multi.preflight import check_tp_plan
from pypto_bench.report import format_table

sys.path.insert(0, str(Path(__file__).parent))
from _dist_fixtures import (
    alive,
    group_members,
    make_tiny_gpt2,
    prefill_config,
    reference_logits,
)

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


def _config(folder, **kw):
    return prefill_config(folder, **{"batch": 1, "warmup": 1, "iters": 2, **kw})


@pytest.fixture(scope="module")
def llama_run(tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    report = run_distributed(
        _config(tiny_llama, report_file=str(out / "r.json")), state_dir=out / "state"
    )
    return report, out


def test_prefill_logits_equal_single_process(llama_run, tiny_llama):
    import torch

    report, out = llama_run
    from transformers import AutoTokenizer

    from pypto_bench.bench import make_prompt_ids

    saved = torch.load(out / "state" / "outputs.pt")

    tok = AutoTokenizer.from_pretrained(str(tiny_llama), local_files_only=True)
    ids = make_prompt_ids(tok, 1, 8, {0, 1, 2})
    ref = reference_logits(tiny_llama, ids)
    assert saved["distributed"].shape == ref.shape
    assert (saved["distributed"] - ref).abs().max() < 1e-4
    assert (saved["baseline"] - ref).abs().max() < 1e-5
    agreement = report.distributed["agreement"]
    assert agreement["ok"]
    assert agreement["max_abs_diff"] < 1e-4
    assert report.arms[0].token_match["rate"] == 1.0
    # the numerical gate: every prompt position's logits against the 1-rank run's
    num = report.arms[0].numerics
    assert num["verdict"] == "pass", num
    assert num["basis"] == "every prompt position's logits"
    assert num["metrics"]["kl_max"] <= 1e-9


def test_a_model_wrong_only_when_sharded_fails_the_gate(tiny_llama, tmp_path):
    """Issue #42: accuracy that breaks "only with TP > 1". A tiny Llama whose layer-1 MLP is
    1% off only when its weights are sharded (a mis-sharded layer's stand-in) ran --nproc 2
    with exit 0 and tokens equal to the 1-rank run's; now the arm fails the numerical gate
    against the 1-rank eager logits, its speedup is not comparable, and the run exits 110."""
    import shutil
    import subprocess

    from pypto_testing.planted import plant_sharded_only_error

    folder = tmp_path / "planted"
    shutil.copytree(tiny_llama, folder)
    plant_sharded_only_error(folder)
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "pypto_bench", "run", "--model-path", str(folder),
         "--trust-remote-code", "--device", "cpu", "--nproc", "2", "--regime", "decode",
         "--seq", "8", "--gen", "6", "--arms", "eager", "--warmup", "0", "--iters", "2",
         "--ignore-eos", "--no-bandwidth", "--no-progress", "--report-file", str(out)],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == EXIT.INACCURATE, done.stderr[-3000:]
    data = json.loads(out.read_text())
    num = data["arms"][0]["numerics"]
    assert num["verdict"] == "fail"
    assert num["metrics"]["kl_max"] > 1e-9
    assert num["metrics"]["top1_agreement"] == 1.0  # the argmax survives: tokens cannot see it
    assert data["distributed"]["agreement"]["ok"] is True  # ... and the token check passed
    assert data["distributed"]["speedup"] is None
    assert "numerics FAIL" in data["distributed"]["not_comparable"]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("pypto-bench: error:")]
    assert len(errors) == 1
    assert "something else than the 1-rank eager run" in errors[0]
    assert "speedup not comparable" in done.stderr


def test_report_gathers_every_rank(llama_run):
    report, out = llama_run
    dist = report.distributed
    assert report.ok
    assert dist["nproc"] == 2
    assert dist["backend"] == "gloo"
    assert dist["threads_per_rank"] >= 1
    assert [r["rank"] for r in dist["ranks"]] == [0, 1]
    full = report.model["parameters"] * 4  # fp32
    for r in dist["ranks"]:
        s = r["step_s"]
        assert 0 < s["min"] <= s["median"] <= s["max"]
        assert len(r["samples_s"]) == 2
        assert r["memory"]["rss_peak_bytes"] > 0
        comm = r["communication"]
        assert comm["collective_spans"] > 0
        assert 0 < comm["share"] < 1
        # Sharded: each rank holds well under the whole model.
        assert r["local_parameter_bytes"] < 0.8 * full
    # The collective step ends with its slowest rank.
    slowest = [max(r["samples_s"][i] for r in dist["ranks"]) for i in range(2)]
    assert report.arms[0].seconds["samples"] == pytest.approx(slowest)
    assert dist["aggregate_tokens_per_s"]["best"] == pytest.approx(8 / min(slowest))
    base = dist["baseline"]["tokens_per_s"]["best"]
    assert dist["speedup"] == pytest.approx(dist["aggregate_tokens_per_s"]["best"] / base)
    assert dist["scaling_efficiency"] == pytest.approx(dist["speedup"] / 2)
    table = format_table(report)
    assert "2 ranks (gloo" in table
    assert "rank 1: step ms min/median/max" in table
    written = json.loads((out / "r.json").read_text())
    jsonschema.validate(written, schema())
    assert written["config"]["nproc"] == 2
    assert written["distributed"]["ranks"][1]["communication"]["share"] > 0


def test_no_process_outlives_the_run(llama_run):
    _, out = llama_run
    state = out / "state"
    pids = [json.loads((state / f"rank{r}.json").read_text())["pid"] for r in (0, 1)]
    assert not any(alive(p) for p in pids)
    launcher = int((state / "launcher.pid").read_text())
    assert group_members(launcher) == []


def test_too_many_ranks_refused_before_launch(tiny_llama, tmp_path, capsys):
    n = visible_devices("cpu") + 1
    report = tmp_path / "r.json"
    rc = main(
        ["run", "--model-path", str(tiny_llama), "--device", "cpu", "--regime", "prefill",
         "--arms", "eager", "--nproc", str(n), "--report-file", str(report)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == EXIT.TOO_MANY_RANKS
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(lines) == 1
    assert f"--nproc {n}" in lines[0]
    assert "CPU cores" in lines[0]
    assert "launching" not in err
    assert not report.exists()


def test_model_without_plan_names_the_fallback(tmp_path, capsys):
    folder = make_tiny_gpt2(tmp_path / "gpt2")
    rc = main(
        ["run", "--model-path", str(folder), "--device", "cpu", "--regime", "prefill",
         "--arms", "eager", "--nproc", "2"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == EXIT.USAGE
    assert "no tensor-parallel plan" in err
    assert "pipeline placement" in err
    assert "device map" in err
    assert "--placement pipeline" in err  # the fallback exists: tests/test_pipeline.py
    assert "launching" not in err
    with pytest.raises(NoTensorParallelPlanError):
        check_tp_plan(_config(folder))


def test_heads_not_divisible_refused(tiny_llama):
    with pytest.raises(BadInputError, match="not divisible by --nproc 3"):
        check_tp_plan(_config(tiny_llama, nproc=3))


def test_per_layer_head_counts_are_checked_per_layer(tmp_path):
    """Gemma 4's config refuses a global read of its per-layer KV head count."""
    from pypto_testing.gemma4 import make_tiny_gemma4

    folder = make_tiny_gemma4(tmp_path / "gemma4", "31b", vision=False)
    with pytest.raises(BadInputError, match="num_key_value_heads = 1 of 'gemma4'"):
        check_tp_plan(_config(folder, nproc=2))


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"arms": ("eager", "graph")}, "graph arm in the decode regime only"),
        ({"arms": ("eager", "hf-compile"), "regime": "decode"}, "eager and graph arms only"),
        ({"regime": "diffusion-generate"}, "--regime prefill"),
        ({"nproc": 0}, "--nproc must be"),
        ({"rank_timeout": 0}, "--rank-timeout"),
        ({"batch": 1, "batches": (1, 2)}, "not a sweep"),
        ({"target_ci": 5.0}, "drop --target-ci and pass --iters N"),
    ],
)
def test_bad_requests_are_usage_errors(tiny_llama, kw, words):
    with pytest.raises(BadInputError, match=words.replace("-", r"\-")):
        _config(tiny_llama, **kw).validate()


def test_fingerprint_unchanged_for_one_process(tiny_llama):
    assert "nproc" not in _config(tiny_llama, nproc=1).to_dict()
    assert _config(tiny_llama).to_dict()["nproc"] == 2


def test_session_is_one_process(tiny_llama):
    with pytest.raises(BadInputError, match="--nproc 1"):
        open_session(_config(tiny_llama))


def test_flags_reach_the_config():
    import argparse

    from pypto_bench import add_bench_arguments, bench_config_from_args

    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    cfg = bench_config_from_args(p.parse_args(["--nproc", "2", "--rank-timeout", "30"]))
    assert cfg.nproc == 2
    assert cfg.rank_timeout == 30.0


def test_noise_guard_assesses_the_distributed_run(llama_run):
    """The noise guard ran on the multi-rank report (it was null there): the aggregate
    arm's and the 1-rank baseline's spreads and the load over both runs, with the ranks
    counted as this run's own work, not as other load."""
    report, out = llama_run
    noise = report.noise
    assert noise is not None
    where = {(c["name"], c["where"]) for c in noise["checks"]}
    assert ("spread", "eager") in where
    assert ("spread", "1-rank baseline / eager") in where
    assert ("load", "run") in where
    load = noise["load"]
    assert "process group" in load["method"]
    assert load["own_share"] > 0  # the ranks' work is the run's own
    arm_held = [c for c in noise["checks"] if c["holds"] and c["where"] in ("eager", "run")]
    assert bool(report.arms[0].unreliable) == bool(arm_held)
    written = json.loads((out / "r.json").read_text())
    assert written["noise"]["checks"] == noise["checks"]


def test_group_load_sampler_counts_the_group_as_own_work():
    """A busy process of the sampled group is own work; without the group it would be the
    "other load" that marks a 2-rank run noisy on every 2-core machine."""
    import os
    import subprocess
    import time

    from pypto_bench.multi.lifecycle import group_load_sampler

    burner = subprocess.Popen(
        [sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<5: pass"],
        start_new_session=True,
    )
    try:
        time.sleep(0.3)
        sampler = group_load_sampler(os.getpgid(burner.pid))
        time.sleep(1.0)
        load = sampler.stop()
    finally:
        burner.kill()
        burner.wait()
    assert "process group" in load["method"]
    cores = os.cpu_count() or 1
    assert load["own_share"] > 0.3 / cores  # one busy core, at least partly scheduled
    assert load["own_share"] + load["other_share"] <= 1.0 + 1e-9


def _hostile_copy(tiny_llama, tmp_path):
    """A folder that ships code which would leave a file behind if it ever ran."""
    import shutil

    folder = tmp_path / "hostile"
    shutil.copytree(tiny_llama, folder)
    ran = tmp_path / "shipped-code-ran"
    (folder / "modeling_evil.py").write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n"
    )
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        model_type="pypto_evil",
        auto_map={
            "AutoConfig": "modeling_evil.EvilConfig",
            "AutoModelForCausalLM": "modeling_evil.EvilLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder, ran


@pytest.mark.parametrize("placement", ["tensor", "pipeline"])
def test_shipped_code_is_refused_before_launch_and_never_runs(
    tiny_llama, tmp_path, capsys, placement
):
    """Both placements read the folder's config: neither runs the code it ships."""
    from pypto_testing.folders import folder_bytes

    folder, ran = _hostile_copy(tiny_llama, tmp_path)
    before = folder_bytes(folder)
    report = tmp_path / "r.json"
    argv = ["run", "--model-path", str(folder), "--device", "cpu", "--regime", "prefill",
            "--nproc", "2", "--arms", "eager", "--report-file", str(report),
            "--placement", placement]  # fmt: skip
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT.LOAD_FAILED
    assert "ships its own code" in err[-1]
    assert "--trust-remote-code" in err[-1]
    assert not ran.exists()
    assert not report.exists()
    assert folder_bytes(folder) == before


@pytest.mark.parametrize(
    "text", ["[1, 2]", "{" * 100_000 + "}" * 100_000, "\udcff"], ids=["array", "deep", "bytes"]
)
def test_hostile_config_json_is_one_line_before_launch(tiny_llama, tmp_path, text):
    import shutil

    from pypto_bench import ModelNotFoundError

    folder = tmp_path / "bad"
    shutil.copytree(tiny_llama, folder)
    raw = text.encode("utf-8", "surrogateescape")
    (folder / "config.json").write_bytes(raw)
    with pytest.raises(ModelNotFoundError) as info:
        check_tp_plan(_config(folder))
    assert "\n" not in str(info.value)
    from pypto_bench.multi import run_pipeline

    with pytest.raises(ModelNotFoundError) as info:  # the pipeline placement reads it too
        run_pipeline(_config(folder, placement="pipeline", batch=1))
    assert "\n" not in str(info.value)
