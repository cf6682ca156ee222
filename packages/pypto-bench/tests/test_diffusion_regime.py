"""The diffusion-generate regime on real block-diffusion LMs: LLaDA2 (the protocol, its
captured block step, pypto-capture's exact MoE) and transformers' native block-diffusion
class (driven through its own generate); honest token counting; the smoke gate."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from pypto_bench import EXIT, BenchConfig, run_bench, schema, smoke
from pypto_bench.diffusion import count_generated, native_block_diffusion
from pypto_bench.report import format_table, report_to_markdown

pytest.importorskip("pypto_models_llada2")


@pytest.fixture(scope="module")
def llada2_dir(tmp_path_factory) -> Path:
    from pypto_testing.llada2 import make_tiny_llada2

    return make_tiny_llada2(tmp_path_factory.mktemp("llada2") / "tiny-llada2")


@pytest.fixture(scope="module")
def diffusion_gemma_dir(tmp_path_factory) -> Path:
    from pypto_testing.diffusion import diffusion_gemma_available, make_tiny_diffusion_gemma

    reason = diffusion_gemma_available()
    if reason is not None:
        pytest.skip(reason)
    return make_tiny_diffusion_gemma(tmp_path_factory.mktemp("dgemma") / "tiny-diffusion-gemma")


SMALL = {"device": "cpu", "dtype": "float32", "warmup": 0, "iters": 1, "measure_bandwidth": False}


@pytest.fixture(scope="module")
def llada2_report(llada2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "llada2.json"
    report = run_bench(
        BenchConfig(
            model_path=str(llada2_dir),
            regime="diffusion-generate",
            seq=5,
            gen=24,
            batch=2,
            block_length=8,
            arms=("eager", "graph"),
            graph_backend="compile",
            report_file=str(out),
            **SMALL,
        )
    )
    return report, json.loads(out.read_text())


@pytest.mark.slow
def test_llada2_runs_the_regime_with_its_captured_block_step(llada2_report, llada2_dir):
    report, data = llada2_report
    assert report.ok, [a.error for a in report.arms]
    jsonschema.validate(data, schema())
    eager, graph = report.arm("eager"), report.arm("graph")
    assert report.model["class"] == "LLaDA2MoeModelLM"
    assert eager.details["diffusion"]["path"] == "block-cache, eager step"
    assert graph.details["diffusion"]["path"] == "block-cache, captured step (compile)"
    assert graph.details["backend"] == "compile"
    assert "forward_used" not in graph.details  # the model captures its own step
    # the graph arm's experts ran through pypto-capture's exact, capture-safe MoE
    assert graph.details.get("moe_routing") == "exact"
    assert graph.details.get("moe_layers") == 2
    assert graph.token_match["rate"] == 1.0  # identical tokens, greedy, fp32
    # the captured block step's logits against eager's, step by step (issue #42)
    steps = eager.details["diffusion"]["denoising_steps_per_iter"][0]
    assert graph.numerics["verdict"] == "pass", graph.numerics
    assert graph.numerics["denoising_steps"] == {"compared": steps, "eager": steps}
    for arm in (eager, graph):
        diff = arm.details["diffusion"]
        # prompt 5 + gen 24 in blocks of 8: blocks 0..3 hold generated positions
        assert len(diff["steps_per_block"]) == 4
        assert diff["denoising_steps_per_iter"] == [sum(diff["steps_per_block"])]
        # the cache costs one forward per finished block (not the last; no whole prompt block)
        assert diff["forward_passes_per_iter"] == [sum(diff["steps_per_block"]) + 3]
        tokens = arm.tokens_per_iter[0]
        assert diff["tokens_per_forward"]["samples"] == [
            pytest.approx(tokens / diff["denoising_steps_per_iter"][0])
        ]
        assert diff["forwards_per_s"]["samples"] == [
            pytest.approx(diff["denoising_steps_per_iter"][0] / arm.seconds["samples"][0])
        ]
        assert arm.tokens_per_s["samples"] == [pytest.approx(tokens / arm.seconds["samples"][0])]
        assert tokens == sum(diff["tokens_per_row"])
    table = format_table(data)
    assert "block-cache, captured step (compile)" in table
    markdown = report_to_markdown(data)
    assert "| arm | path | tok/forward | forwards/s |" in markdown


def test_generated_tokens_are_counted_honestly():
    """The seed harness subtracted the prompt twice (89 for 100 generated, 11-token prompt)."""
    prompt, gen, eos, mask = 11, 100, 2, 259
    seqs = torch.full((3, prompt + gen), 7)
    seqs[1, prompt + 49] = eos  # EOS at the 50th generated position, then continuation
    seqs[2, prompt + 60 :] = mask  # stopped early: never generated
    seqs[2, prompt + 59] = eos
    assert count_generated(seqs, prompt, [eos], unfilled_ids=[mask]) == [100, 50, 60]
    assert count_generated(seqs, prompt, [eos], ignore_eos=True, gen_length=gen)[0] == 100
    # a model that fills nothing produced nothing
    empty = torch.full((1, prompt + gen), mask)
    assert count_generated(empty, prompt, [eos], unfilled_ids=[mask]) == [0]


def test_the_regime_counts_the_generation_not_the_prompt(diffusion_model):
    report = run_bench(
        BenchConfig(
            model_path=str(diffusion_model),
            regime="diffusion-generate",
            seq=11,
            gen=100,
            batch=1,
            arms=("eager",),
            trust_remote_code=True,
            diffusion_steps=10,
            block_length=50,
            ignore_eos=True,
            **SMALL,
        )
    )
    arm = report.arm("eager")
    assert report.ok, arm.error
    assert arm.tokens_per_iter == [100]  # not 89
    assert arm.details["diffusion"]["path"] == "diffusion_generate (the model's own loop)"
    assert arm.details["diffusion"]["tokens_per_forward"]["samples"] == [10.0]


def test_llada2_up_to_eos_counts_the_answer(llada2_dir):
    """Without --ignore-eos each row counts up to its first EOS; the tiny model's EOS is rare,
    so its id is set to a token the model does produce."""
    from transformers import AutoModelForCausalLM

    from pypto_bench.diffusion import diffusion_generate

    model = AutoModelForCausalLM.from_pretrained(str(llada2_dir), local_files_only=True).eval()
    ids = torch.randint(3, 250, (1, 5), generator=torch.Generator().manual_seed(0))
    full = diffusion_generate(model, ids, gen_length=24, steps=24, block_length=8, ignore_eos=True)
    gen = full.sequences[0, 5:].tolist()
    eos = next(t for i, t in enumerate(gen) if i >= 8 and t not in gen[:i])
    model.config.eos_token_id = eos
    out = diffusion_generate(model, ids, gen_length=24, steps=24, block_length=8)
    assert count_generated(out.sequences, 5, [eos], unfilled_ids=[259]) == [gen.index(eos) + 1]
    assert len(out.steps_per_block) < len(full.steps_per_block)  # stopped after the EOS block


def test_transformers_native_block_diffusion_runs_through_its_own_generate(diffusion_gemma_dir):
    report = run_bench(
        BenchConfig(
            model_path=str(diffusion_gemma_dir),
            regime="diffusion-generate",
            seq=5,
            gen=16,
            batch=2,
            arms=("eager",),
            diffusion_steps=8,
            **SMALL,
        )
    )
    arm = report.arm("eager")
    assert report.ok, arm.error
    assert report.model["class"] == "DiffusionGemmaForBlockDiffusion"
    diff = arm.details["diffusion"]
    assert diff["path"] == "native DiffusionGemmaForBlockDiffusion.generate (dynamic cache, eager)"
    assert diff["denoising_steps_per_iter"] == [8]  # 2 canvases x 4 steps
    assert arm.tokens_per_iter == [sum(diff["tokens_per_row"])]
    assert all(0 < n <= 16 for n in diff["tokens_per_row"])


def test_a_block_length_the_native_class_cannot_use_is_named(diffusion_gemma_dir):
    report = run_bench(
        BenchConfig(
            model_path=str(diffusion_gemma_dir),
            regime="diffusion-generate",
            seq=5,
            gen=16,
            arms=("eager",),
            block_length=4,
            **SMALL,
        )
    )
    assert not report.ok
    assert "canvases of 8 tokens" in report.arm("eager").error


@pytest.mark.slow
def test_native_graph_arm_replays_one_captured_step_and_matches_eager(diffusion_gemma_dir):
    """The graph arm: the model's static-cache generate with one denoising step captured
    and replayed for every step of every canvas; seeded alike, its sampled tokens are the
    eager arm's (a compile capture with inductor's freezing read the cache as it was at
    capture: the second canvas diverged)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(diffusion_gemma_dir))
    assert native_block_diffusion(model)
    report = run_bench(
        BenchConfig(
            model_path=str(diffusion_gemma_dir),
            regime="diffusion-generate",
            seq=5,
            gen=16,
            batch=2,
            arms=("eager", "graph"),
            diffusion_steps=8,
            graph_backend="compile",
            **{**SMALL, "iters": 2},
        )
    )
    eager, graph = report.arm("eager"), report.arm("graph")
    assert report.ok, graph.error
    diff = graph.details["diffusion"]
    assert diff["path"].startswith(
        "native DiffusionGemmaForBlockDiffusion.generate (static cache; one denoising step "
        "captured (compile) and replayed"
    )
    assert graph.details["backend"] == "compile"
    # one capture, replayed for every denoising step: 2 canvases x 4 steps, for the
    # capturing call and the 2 measured iterations (the numerical gate's generation, after
    # them, replays it too: not counted here)
    capture = diff["capture"]
    assert capture["captures"] == 1
    assert capture["replays"] == 3 * 8
    # the denoiser's logits, step by step while fed eager's canvas: every step here
    assert graph.numerics["verdict"] == "pass", graph.numerics
    assert graph.numerics["denoising_steps"] == {"compared": 8, "eager": 8}
    assert capture["capture_s"] > 0
    assert (
        diff["denoising_steps_per_iter"] == eager.details["diffusion"]["denoising_steps_per_iter"]
    )
    # the comparison is made and stated: same seed, every generated position
    assert graph.outputs_differ_by_design is None
    assert "seeded with 0" in diff["token_match_basis"]
    assert graph.token_match == {
        "rate": 1.0,
        "compared": 32,
        "matched": 32,
        "first_mismatch": None,
    }
    assert not [w for w in graph.warnings if "match eager" in w]


def test_captured_denoiser_step_is_removed_from_the_model_after_generate(diffusion_gemma_dir):
    """The step stands in for ``forward`` only while generate runs (eager backend: the same
    step without a capture), and the tokens equal the uncaptured generate's."""
    from transformers import AutoModelForImageTextToText

    from pypto_bench.diffusion import CapturedDenoiserStep, diffusion_generate
    from pypto_capture import make_backend

    model = AutoModelForImageTextToText.from_pretrained(str(diffusion_gemma_dir)).eval()
    ids = torch.randint(3, 250, (1, 5), generator=torch.Generator().manual_seed(1))
    step = CapturedDenoiserStep(model, make_backend("eager", "cpu"))
    with torch.inference_mode():
        torch.manual_seed(3)
        plain = diffusion_generate(model, ids, gen_length=16, steps=8)
        torch.manual_seed(3)
        stepped = diffusion_generate(model, ids, gen_length=16, steps=8, native_step=step)
    assert "forward" not in vars(model)
    assert step.replays == 8
    assert step.captures == 1
    assert torch.equal(plain.sequences, stepped.sequences)


def _blocked_weights_copy(folder: Path, dest: Path) -> Path:
    """The folder's config and tokenizer with weights that cannot load (any read fails)."""
    import shutil

    dest.mkdir()
    for item in folder.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, dest / item.name)
    (dest / "model.safetensors").write_bytes(b"not a safetensors file")
    return dest


def test_decode_regime_refuses_a_block_diffusion_folder_before_loading(
    diffusion_gemma_dir, tmp_path
):
    """One line naming the diffusion-generate regime, exit 2, raised from the config: the
    weights (unloadable here) are never read and nothing in the folder changes."""
    import subprocess
    import sys

    from pypto_bench.errors import RegimeNotSupportedError
    from pypto_testing.folders import folder_bytes

    folder = _blocked_weights_copy(diffusion_gemma_dir, tmp_path / "dgemma")
    before = folder_bytes(folder)
    with pytest.raises(RegimeNotSupportedError, match="--regime diffusion-generate"):
        run_bench(BenchConfig(model_path=str(folder), regime="decode", **SMALL))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pypto_bench",
            "run",
            "--model-path",
            str(folder),
            "--regime",
            "decode",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == EXIT.USAGE == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "DiffusionGemmaForBlockDiffusion" in lines[0]
    assert "block-diffusion model" in lines[0]
    assert "the decode regime cannot run it; use --regime diffusion-generate" in lines[0]
    assert "Traceback" not in proc.stderr
    assert "TypeError" not in proc.stderr
    assert folder_bytes(folder) == before


def test_the_config_tells_a_block_diffusion_model_by_type_or_architecture():
    from pypto_bench.loading import block_diffusion_class

    by_type = {"model_type": "diffusion_gemma"}
    assert block_diffusion_class(by_type) == "DiffusionGemmaForBlockDiffusion"
    by_arch = {"model_type": "someones_own", "architectures": ["SomeForBlockDiffusion"]}
    assert block_diffusion_class(by_arch) == "SomeForBlockDiffusion"
    assert (
        block_diffusion_class({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
        is None
    )
    assert block_diffusion_class({"architectures": "not a list"}) is None


def test_a_block_diffusion_model_still_runs_prefill(diffusion_gemma_dir):
    """Only token-by-token regimes are refused: its forward over a prompt runs."""
    report = run_bench(
        BenchConfig(
            model_path=str(diffusion_gemma_dir), regime="prefill", seq=5, arms=("eager",), **SMALL
        )
    )
    assert report.ok, report.arm("eager").error


def test_smoke_gate_runs_llada2_through_its_diffusion_generation(llada2_dir):
    """The published forward needs a 4-D block mask, so ``model.generate``-style smoke
    tests fail on it; the gate runs the diffusion generation and checks its text."""
    res = smoke(llada2_dir, device="cpu", max_new_tokens=16, dtype="float32")
    assert res.stage in ("check", "done"), res.reason
    assert res.generation_path == "block-cache, eager step"
    assert res.logits_finite is True
    assert res.coherence is not None
    assert res.token_ids


def _letters_only(tensors, tokenizer_dir):
    """LM head rows of tokens that are not lowercase letters or a space zeroed: the answer
    is made of words (coherent enough for the gate's heuristic), like a trained model's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    head = tensors["lm_head.weight"].clone()
    for i in range(head.shape[0]):
        text = tok.decode([i]) if i < len(tok) else ""
        if len(text) == 1 and (text.islower() or text == " "):
            head[i] *= 4.0
        else:
            head[i] = 0.0
    return {**tensors, "lm_head.weight": head}


def test_smoke_gate_checks_llada2_text_coherence(llada2_dir, tmp_path):
    from safetensors.torch import load_file

    from pypto_testing.llada2 import make_tiny_llada2

    words = make_tiny_llada2(
        tmp_path / "words",
        weights=_letters_only(load_file(str(llada2_dir / "model.safetensors")), llada2_dir),
    )
    strict = smoke(
        words, device="cpu", max_new_tokens=32, dtype="float32", strict=True, min_coherence=0.3
    )
    assert strict.text.replace(" ", "").isalpha()
    assert strict.coherence is not None
    assert strict.passed == (strict.coherence >= 0.3)
    demanding = smoke(
        words, device="cpu", max_new_tokens=32, dtype="float32", strict=True, min_coherence=0.99
    )
    assert not demanding.passed
    assert demanding.exit_code == EXIT.LOW_COHERENCE
    assert demanding.generation_path == "block-cache, eager step"


def test_the_graph_arm_is_refused_past_the_sliding_window(tmp_path):
    """Past DiffusionGemma's sliding window transformers' static-cache generate (what the
    graph arm captures) computes other tokens than its own generate, capture or not: the
    graph arm at 59% token match was reported as a speedup. Refused in one line; eager runs."""
    from pypto_testing.diffusion import diffusion_gemma_available, make_tiny_diffusion_gemma

    reason = diffusion_gemma_available()
    if reason:
        pytest.skip(reason)
    folder = make_tiny_diffusion_gemma(tmp_path / "w8", canvas_length=16, sliding_window=8)
    report = run_bench(
        BenchConfig(
            model_path=str(folder),
            regime="diffusion-generate",
            seq=16,
            gen=32,
            block_length=16,
            arms=("eager", "graph"),
            diffusion_steps=8,
            graph_backend="eager",
            **SMALL,
        )
    )
    assert report.arm("eager").ok
    graph = report.arm("graph")
    assert not graph.ok
    assert "pass its sliding window (8)" in graph.error
    assert "keep --seq + --gen <= 8" in graph.error


def _denoiser_run(folder: Path, arms: tuple[str, ...], **extra) -> object:
    return run_bench(
        BenchConfig(
            model_path=str(folder),
            regime="diffusion-generate",
            seq=6,
            gen=8,
            batch=2,
            arms=arms,
            trust_remote_code=True,
            diffusion_steps=4,
            graph_backend="eager",
            **{**SMALL, **extra},
        )
    )


def test_the_denoiser_logits_of_every_step_are_judged(diffusion_model):
    """The gate's diffusion check (issue #42): the graph arm's generation, same seed, each
    denoising step held to eager's while both saw the same canvas: all 4 here."""
    report = _denoiser_run(diffusion_model, ("eager", "graph"))
    graph = report.arm("graph")
    assert report.ok, graph.error
    num = graph.numerics
    assert num["verdict"] == "pass", num
    assert num["denoising_steps"] == {"compared": 4, "eager": 4}
    assert num["basis"].startswith("4 of 4 denoising steps fed the same canvas as eager's")
    assert num["metrics"]["kl_max"] < 1e-9
    assert num["metrics"]["steps"] == 2 * 4 * 14  # every row and position of each canvas
    assert "graph: numerics pass" in format_table(report)


def test_a_kernel_that_is_one_percent_off_fails_the_diffusion_arm(diffusion_model):
    """The planted plug-in (layer 1's MLP x 1.01) on the pypto+graph arm: its sampled
    tokens can still equal eager's; its denoiser logits cannot hide it."""
    import pypto_bench
    from pypto_testing.planted import OnePercentMLP

    plugin = OnePercentMLP()
    pypto_bench.register_plugin(plugin)
    try:
        report = _denoiser_run(diffusion_model, ("eager", "pypto+graph"))
    finally:
        pypto_bench.unregister_plugin(plugin)
    arm = report.arm("pypto+graph")
    assert arm.ok, arm.error
    assert arm.numerics["verdict"] == "fail", arm.numerics
    assert arm.numerics["metrics"]["kl_max"] > 1e-9
    assert report.numerics_failed == ["pypto+graph"]
    assert arm.ratio_to_eager is None  # not comparable


def test_a_model_that_hides_its_steps_is_not_checked_and_says_why(tmp_path):
    """A protocol model whose diffusion_generate names no step_observer: the arm is `not
    checked`, with the reason, never silently passed."""
    from pypto_testing.diffusion import make_tiny_diffusion_model

    folder = make_tiny_diffusion_model(tmp_path / "m")
    (folder / "modeling_hidden.py").write_text(
        "from pypto_testing.diffusion import TinyDiffusionLM\n\n\n"
        "class HiddenSteps(TinyDiffusionLM):\n"
        "    def diffusion_generate(self, input_ids, *, gen_length, steps, block_length=None,"
        " forward=None):\n"
        "        return super().diffusion_generate(input_ids, gen_length=gen_length, "
        "steps=steps, block_length=block_length, forward=forward)\n"
    )
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"]["AutoModelForCausalLM"] = "modeling_hidden.HiddenSteps"
    (folder / "config.json").write_text(json.dumps(cfg))
    report = _denoiser_run(folder, ("eager", "graph"))
    graph = report.arm("graph")
    assert graph.ok, graph.error
    assert graph.numerics["verdict"] == "not checked"
    assert "HiddenSteps.diffusion_generate takes no step_observer" in graph.numerics["why"]
