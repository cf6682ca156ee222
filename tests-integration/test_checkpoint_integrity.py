"""Wrong weights never load, at the CLI edge: a poisoned MiniMax checkpoint behind a
pypto-patch overlay (as pypto-e2e pins it) makes ``pypto-bench run`` exit LOAD_FAILED
with one line naming the tensor and the shard; nothing on disk changes. The same
overlay's weights are sized through the links it records (the 1-rank baseline rule)."""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("pypto_models_minimax")

from pypto_bench import EXIT
from pypto_bench.cli import main
from pypto_bench.multi.fit import checkpoint_bytes
from pypto_patch import apply
from pypto_testing.checkpoints import other_shard, poison, rewrite_shard
from pypto_testing.folders import folder_bytes

RUN = ["run", "--device", "cpu", "--regime", "prefill", "--seq", "8", "--arms", "eager"]
RUN += ["--warmup", "0", "--iters", "1", "--no-bandwidth", "--trust-remote-code"]


@pytest.fixture(scope="module")
def m27_fp8(tmp_path_factory):
    from pypto_testing.minimax import make_tiny_minimax_m27

    return make_tiny_minimax_m27(tmp_path_factory.mktemp("m27") / "m27", weights="fp8")


def _nan_scale(folder):
    key = "model.layers.1.self_attn.v_proj.weight_scale_inv"
    poison(folder, key, {(0, 0): float("nan")})
    return key


def _zeroed_duplicate(folder):
    key = "model.layers.1.block_sparse_moe.gate.weight"
    value = torch.zeros(8, 256)  # the router of 8 experts over hidden 256, zeroed
    rewrite_shard(other_shard(folder, key), lambda t: t.update({key: value}))
    return key


@pytest.mark.parametrize("poison", [_nan_scale, _zeroed_duplicate])
def test_a_poisoned_pinned_checkpoint_is_load_failed_in_one_line(m27_fp8, tmp_path, capsys, poison):
    source = tmp_path / "model"
    shutil.copytree(m27_fp8, source)
    key = poison(source)
    overlay = tmp_path / "pinned"
    apply(source, family="minimax_m27", output_dir=overlay)
    before = folder_bytes(source), folder_bytes(overlay)
    code = main([*RUN, "--model-path", str(overlay), "--report-file", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT.LOAD_FAILED, err
    assert f"{key} " in err[-1]
    assert ".safetensors" in err[-1]  # the shard is named
    assert "re-download the model" in err[-1]
    assert (folder_bytes(source), folder_bytes(overlay)) == before
    assert not (tmp_path / "r.json").exists()


def test_the_overlay_s_weights_are_sized_through_its_recorded_links(m27_fp8, tmp_path):
    overlay = tmp_path / "pinned"
    apply(m27_fp8, family="minimax_m27", output_dir=overlay)
    assert checkpoint_bytes(overlay, "bfloat16") == checkpoint_bytes(m27_fp8, "bfloat16") > 0
