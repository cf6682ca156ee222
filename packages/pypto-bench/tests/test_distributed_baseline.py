"""--nproc N for a model that does not fit one device: the 1-rank baseline is skipped
(by --no-baseline, by the size check before loading, or on an out-of-memory error) and
the sharded run is still measured and reported, without speedup or agreement figures."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
import torch

from pypto_bench import BadInputError, BenchConfig, schema
from pypto_bench.cli import main
from pypto_bench.errors import ModelLoadError
from pypto_bench.multi.fit import checkpoint_bytes, fit_reason, out_of_memory
from pypto_bench.multi.preflight import visible_devices
from pypto_bench.report import format_table
from pypto_capture.device import free_bytes


def test_no_baseline_run_is_measured_and_says_what_is_missing(tiny_llama, tmp_path, capsys):
    if visible_devices("cpu") < 2:
        pytest.skip("needs 2 CPU cores")
    out = tmp_path / "r.json"
    code = main([
        "run", "--model-path", str(tiny_llama), "--device", "cpu", "--regime", "prefill",
        "--seq", "8", "--arms", "eager", "--warmup", "0", "--iters", "1", "--dtype", "float32",
        "--no-bandwidth", "--nproc", "2", "--no-baseline", "--report-file", str(out),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    jsonschema.validate(data, schema())
    dist = data["distributed"]
    assert dist["baseline"] is None
    assert dist["baseline_skipped"] == "skipped by --no-baseline"
    assert dist["speedup"] is None
    assert dist["scaling_efficiency"] is None
    assert dist["agreement"]["ok"] is None
    assert dist["aggregate_tokens_per_s"]["best"] > 0
    assert len(dist["ranks"]) == 2
    assert any("1-rank baseline skipped" in w for w in data["warnings"])
    assert "no 1-rank run (skipped by --no-baseline)" in format_table(data)
    assert data["config"]["nproc_baseline"] is False


def test_no_baseline_needs_several_ranks(tiny_llama):
    with pytest.raises(BadInputError, match="--no-baseline skips the 1-rank run"):
        BenchConfig(model_path=str(tiny_llama), nproc=1, nproc_baseline=False).validate()


def test_checkpoint_bytes_reads_the_headers_at_the_run_s_dtype(tiny_llama):
    from safetensors import safe_open

    stored = 0
    numel = 0
    for f in tiny_llama.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118  (safe_open is not iterable)
                t = h.get_tensor(k)
                stored += t.numel() * t.element_size()
                numel += t.numel()
    assert checkpoint_bytes(tiny_llama, "auto") == stored  # fp32 folder, as stored
    assert checkpoint_bytes(tiny_llama, "float32") == numel * 4
    assert checkpoint_bytes(tiny_llama, "bfloat16") == numel * 2


def test_checkpoint_bytes_is_unknown_for_hostile_or_broken_weights(tiny_llama, tmp_path, caplog):
    import shutil

    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(next(tiny_llama.glob("*.safetensors")), outside)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(outside)  # a weight file outside the folder
    assert checkpoint_bytes(linked, "auto") is None
    assert "is a symbolic link no pypto-patch overlay of this folder records" in caplog.text
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{")
    assert checkpoint_bytes(broken, "auto") is None
    assert "model.safetensors is not a readable safetensors file" in caplog.text
    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint_bytes(empty, "auto") is None  # no weights at all


@pytest.fixture
def sharded_overlay(tiny_llama, tmp_path):
    """tiny_llama's weights in 2 indexed shards, and a pypto-patch overlay of that folder
    (its shards and index are links into the source)."""
    import shutil

    from safetensors.torch import load_file

    from pypto_patch import apply
    from pypto_testing.checkpoints import write_sharded

    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(tiny_llama / "config.json", source / "config.json")
    write_sharded(source, load_file(str(tiny_llama / "model.safetensors")), 2)
    code = tmp_path / "modeling_pinned.py"
    code.write_text("class Pinned: pass\n")
    overlay = tmp_path / "overlay"
    apply(
        source,
        auto_map={"AutoModelForCausalLM": "modeling_pinned.Pinned"},
        copies={"modeling_pinned.py": code},
        output_dir=overlay,
    )
    return source, overlay


def test_checkpoint_bytes_of_a_pinned_overlay_follows_exactly_its_recorded_links(
    tiny_llama, sharded_overlay, tmp_path
):
    from pypto_testing.checkpoints import safetensors_bytes
    from pypto_testing.folders import folder_bytes

    source, overlay = sharded_overlay
    assert (overlay / "model-00001-of-00002.safetensors").is_symlink()
    want = checkpoint_bytes(tiny_llama, "bfloat16")
    assert want is not None
    assert checkpoint_bytes(source, "bfloat16") == want
    assert checkpoint_bytes(overlay, "bfloat16") == want  # through the overlay's links
    assert checkpoint_bytes(overlay, "auto") == checkpoint_bytes(tiny_llama, "auto")
    before = folder_bytes(source)
    # a stray shard the index does not name: not counted, even an unreadable one
    (source / "model-00003-of-00003.safetensors").write_bytes(
        safetensors_bytes({"stray.weight": ("F32", [1024, 1024])})
    )
    (source / "junk.safetensors").write_bytes(b"\xff" * 16)
    (overlay / "stray.safetensors").symlink_to(source / "model-00003-of-00003.safetensors")
    assert checkpoint_bytes(source, "bfloat16") == want
    assert checkpoint_bytes(overlay, "bfloat16") == want
    # a link planted in the overlay in place of a recorded one: never followed
    planted = tmp_path / "planted.safetensors"
    planted.write_bytes((source / "model-00002-of-00002.safetensors").read_bytes())
    (overlay / "model-00002-of-00002.safetensors").unlink()
    (overlay / "model-00002-of-00002.safetensors").symlink_to(planted)
    assert checkpoint_bytes(overlay, "bfloat16") is None
    after = folder_bytes(source)  # nothing read was changed
    del after["model-00003-of-00003.safetensors"], after["junk.safetensors"]
    assert after == before


def test_an_unreadable_indexed_shard_makes_the_size_unknown_and_says_why(sharded_overlay, caplog):
    source, _ = sharded_overlay
    (source / "model-00002-of-00002.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"[1]")
    assert checkpoint_bytes(source, "bfloat16") is None
    assert "model-00002-of-00002.safetensors is not a readable safetensors file" in caplog.text
    assert "the 1-rank baseline is not skipped" in caplog.text


def test_the_fit_rule():
    gib = 2**30
    assert fit_reason(10 * gib, 12 * gib, "cuda", "bfloat16") is None  # 10 x 1.2 <= 12
    why = fit_reason(10 * gib, 11 * gib, "cuda", "bfloat16")
    assert why is not None
    assert "does not fit one cuda device" in why
    assert "11.00 GiB free" in why
    assert fit_reason(None, 1, "cuda", "auto") is None  # unknown: run it (OOM still skips)
    assert fit_reason(1, None, "npu", "auto") is None


def test_free_bytes_on_this_cpu():
    free = free_bytes(torch.device("cpu"))
    assert free is not None
    assert 0 < free <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_out_of_memory_is_recognised_through_the_loader_s_wrapping():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    wrapped = ModelLoadError("loading /m failed: OutOfMemoryError: ...")
    wrapped.__cause__ = oom  # what ``raise ModelLoadError(...) from err`` sets
    assert out_of_memory(wrapped)
    assert out_of_memory(RuntimeError("NPU out of memory. Tried to allocate"))
    assert not out_of_memory(ValueError("bad shape"))


def test_flag_reaches_the_config():
    from pypto_bench.args import FLAG_FOR

    assert FLAG_FOR["nproc_baseline"] == "--no-baseline"
