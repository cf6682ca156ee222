"""Dump and compare a real tiny Llama (transformers' own classes): an identical run passes,
a planted 1% error in one layer's MLP is named as the first diverging module, bf16 passes
against its noise floor and fails without it, non-finite values fail, and the CLI speaks in
one line with its documented codes."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from pypto_precision import (
    EXIT,
    NotComparableError,
    PrecisionError,
    Recorder,
    Rule,
    compare_dumps,
    read_dump,
    write_reports,
)
from pypto_precision.cli import main
from pypto_testing.models import tiny_config

LAYERS = 3
IDS = torch.tensor([[5, 9, 17, 33, 65, 129, 200, 7]])


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tiny_config("llama", num_hidden_layers=LAYERS)
    # the same weights in every dtype: initialised in float32, then converted
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(dtype).eval()


@pytest.fixture(scope="module")
def fp32_model():
    return _model()


def _dump(model, folder, mode="tensor", ids=IDS, **kw):
    with (
        torch.no_grad(),
        Recorder(model, folder, mode=mode, meta={"input_ids": ids.tolist()}, **kw),
    ):
        model(ids)
    return read_dump(folder)


def _scale_mlp(model, layer: int, factor: float):
    mlp = model.model.layers[layer].mlp
    return mlp.register_forward_hook(lambda m, a, out: out * factor)


def test_the_same_run_passes_with_zero_error(fp32_model, tmp_path):
    a = _dump(fp32_model, tmp_path / "a")
    b = _dump(fp32_model, tmp_path / "b")
    result = compare_dumps(a, b)
    assert result.ok
    assert result.first_divergent is None
    assert len(result.rows) == len(a.entries) > 10 * LAYERS
    assert all(r.metrics["rel_l2"] == 0.0 and r.metrics["cosine"] == pytest.approx(1.0)
               for r in result.rows)  # fmt: skip


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_a_planted_one_percent_error_is_named_at_its_module(fp32_model, tmp_path, mode):
    ref = _dump(fp32_model, tmp_path / "ref", mode=mode)
    handle = _scale_mlp(fp32_model, 1, 1.01)
    try:
        bad = _dump(fp32_model, tmp_path / "bad", mode=mode)
    finally:
        handle.remove()
    result = compare_dumps(bad, ref)
    assert not result.ok
    first = result.first_divergent
    assert first is not None
    assert first.module == "model.layers.1.mlp#0", first
    assert first.verdict.value == pytest.approx(0.01, rel=0.05)  # the 1% it was given
    # every module before it is exact; layer 0 passes
    assert all(r.verdict.ok for r in result.rows if r.order < first.order)
    # the largest error is somewhere later (the logits), not what names the culprit
    assert result.worst is not None
    assert result.worst.order >= first.order


def test_bf16_passes_against_its_noise_floor_and_a_planted_error_does_not(tmp_path):
    """Target: the same weights in bf16; reference: float64; floor: the same bf16 run on
    this trusted CPU. The target is the floor here (same device), so it passes at k=2, as
    it does against the dtype's default; fixed fp32-style thresholds would fail it."""
    ref = _dump(_model(torch.float64), tmp_path / "ref")
    bf16 = _model(torch.bfloat16)
    target = _dump(bf16, tmp_path / "target")
    floor = _dump(bf16, tmp_path / "floor")
    judged = compare_dumps(target, ref, floor=floor)
    assert judged.ok, judged.first_divergent
    row = next(r for r in judged.rows if r.module == "lm_head#0")
    assert row.verdict.floor is not None
    assert row.verdict.floor > 1e-3
    assert compare_dumps(target, ref).ok  # bf16's default allowance (no floor)
    assert compare_dumps(target, ref, rule=Rule(default_allowed={"bfloat16": 1e-5})).ok is False
    # and a 1% error planted in bf16 fails against the same floor
    handle = _scale_mlp(bf16, 2, 1.05)
    try:
        planted = _dump(bf16, tmp_path / "planted")
    finally:
        handle.remove()
    bad = compare_dumps(planted, ref, floor=floor)
    assert not bad.ok
    assert bad.first_divergent.module == "model.layers.2.mlp#0"


def test_non_finite_values_fail_whatever_the_rest(fp32_model, tmp_path):
    ref = _dump(fp32_model, tmp_path / "ref")
    handle = fp32_model.model.layers[0].register_forward_hook(
        lambda m, a, out: out.index_fill(-1, torch.tensor([0]), float("nan"))
        if isinstance(out, torch.Tensor) else (out[0].index_fill(-1, torch.tensor([0]), float("nan")),
                                             *out[1:])
    )  # fmt: skip
    try:
        bad = _dump(fp32_model, tmp_path / "nan")
    finally:
        handle.remove()
    result = compare_dumps(bad, ref)
    first = result.first_divergent
    assert first is not None
    assert first.module == "model.layers.0#0"
    assert first.verdict.metric == "nonfinite_mismatch"


def test_different_inputs_are_not_comparable(fp32_model, tmp_path):
    a = _dump(fp32_model, tmp_path / "a", mode="statistics")
    b = _dump(fp32_model, tmp_path / "b", mode="statistics", ids=IDS.flip(-1))
    with pytest.raises(NotComparableError, match="other token ids"):
        compare_dumps(a, b)


def test_tensor_mode_refuses_past_max_bytes_and_leaves_nothing(fp32_model, tmp_path):
    with pytest.raises(PrecisionError, match="--max-bytes 4096") as err:
        _dump(fp32_model, tmp_path / "big", max_bytes=4096)
    assert err.value.exit_code == EXIT.TOO_LARGE
    assert list(tmp_path.iterdir()) == []  # no folder, no partial sibling


def test_md5_mode_records_each_tensor_hash(fp32_model, tmp_path):
    d = _dump(fp32_model, tmp_path / "m", mode="md5")
    assert all(e.md5 and len(e.md5) == 32 for e in d.entries)
    assert d.meta["versions"]["torch"] == torch.__version__


def test_reports_and_the_cli(fp32_model, tmp_path, capsys):
    ref = _dump(fp32_model, tmp_path / "ref")
    handle = _scale_mlp(fp32_model, 0, 1.01)
    try:
        _dump(fp32_model, tmp_path / "bad")
    finally:
        handle.remove()
    out = tmp_path / "out"
    code = main(["compare", str(tmp_path / "bad"), str(tmp_path / "ref"), "--out", str(out),
                 "--json"])  # fmt: skip
    assert code == EXIT.DIVERGED
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["first_divergent"]["module"] == "model.layers.0.mlp#0"
    assert "first diverging module is model.layers.0.mlp#0" in captured.err
    assert (out / "compare.md").read_text().count("model.layers.0.mlp") >= 1
    page = (out / "compare.html").read_text()
    assert "default-src 'none'" in page
    assert "model.layers.0.mlp" in page
    assert main(["compare", str(tmp_path / "ref"), str(tmp_path / "ref")]) == EXIT.OK
    # the same from a report written by the library
    paths = write_reports(compare_dumps(ref, ref), tmp_path / "lib")
    assert json.loads(paths["json"].read_text())["ok"] is True
    del ref


def test_cli_bad_inputs_are_one_line(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope"), str(tmp_path / "nope2")]) == EXIT.BAD_DUMP
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "no such folder" in err[0]
    assert main(["compare", "a", "b", "--k", "nan"]) == EXIT.USAGE
    assert main([]) == EXIT.USAGE
    capsys.readouterr()


def test_rule_constants_and_k():
    rule = Rule(k=3)
    assert rule.allowed("float32", 1e-3) == pytest.approx(3e-3)
    assert rule.allowed("float32", 0.0) == rule.min_allowed["float32"]
    assert rule.allowed("bfloat16", None) == rule.default_allowed["bfloat16"]
    with pytest.raises(ValueError):
        Rule(k=float("inf"))


def test_replay_names_only_the_module_wrong_on_its_own(fp32_model, tmp_path):
    """Accumulated, every output after a 1% error in one projection fails; replaying the
    float64 reference's leaf modules on the target's own inputs fails that projection only."""
    from pypto_precision import replay_local_errors

    down = fp32_model.model.layers[1].mlp.down_proj
    handle = down.register_forward_hook(lambda m, a, out: out * 1.01)
    try:
        bad = _dump(fp32_model, tmp_path / "bad", with_inputs=True)
    finally:
        handle.remove()
    floor = _dump(fp32_model, tmp_path / "floor", with_inputs=True)
    reference = _model(torch.float64)
    accumulated = compare_dumps(bad, _dump(reference, tmp_path / "ref"), floor=floor)
    assert len([r for r in accumulated.failed if r.io == "output"]) > 1
    local = replay_local_errors(reference, bad, floor=floor)
    assert [r.module for r in local.failed] == ["model.layers.1.mlp.down_proj#0"]
    assert len(local.rows) >= 6 * LAYERS  # projections, norms, activations replayed
    with pytest.raises(NotComparableError, match="with inputs"):
        replay_local_errors(reference, _dump(fp32_model, tmp_path / "no-inputs"))
