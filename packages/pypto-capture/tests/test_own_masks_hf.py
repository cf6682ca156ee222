"""Models that build their attention inputs from a 2-D padding mask in their own code are
refused in one line before a decode step is captured (issue #44: BLOOM, CPM-Ant and
ProphetNet crashed inside their own code on the captured step's 4-D mask over static
slots). Tiny folders from each type's own config and model classes (pypto_testing.zoo);
the rule reads the code, so a type that uses transformers' masking utilities is not
touched, and Falcon is refused only with ALiBi on."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
zoo = pytest.importorskip("pypto_testing.zoo")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from pypto_capture import DecodeStepRunner, UnsupportedModelError  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("own-masks")
    made = {}

    def get(model_type, **overrides):
        key = (model_type, tuple(sorted(overrides.items())))
        if key not in made:
            path = zoo.make_zoo_model(root / f"{model_type}-{len(made)}", model_type)
            if overrides:
                config = AutoConfig.from_pretrained(path)
                for k, v in overrides.items():
                    setattr(config, k, v)
                config.save_pretrained(path)
            made[key] = path
        return made[key]

    return get


def _runner(path):
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=16, backend="eager", warmup=1)
    return model, runner


@pytest.mark.parametrize(
    ("model_type", "overrides", "reason"),
    [
        ("bloom", {}, "ALiBi bias from a 2-D padding mask"),
        ("falcon", {"alibi": True}, "ALiBi bias from a 2-D padding mask"),
        ("cpmant", {}, "does not use transformers' masking utilities"),
        ("prophetnet", {}, "does not use transformers' masking utilities"),
    ],
)
def test_a_model_that_builds_its_own_masks_is_refused_in_one_line(
    folder, model_type, overrides, reason
):
    model, runner = _runner(folder(model_type, **overrides))
    first = runner.prefill(torch.tensor([[5, 6, 7, 8]]))
    with pytest.raises(UnsupportedModelError) as err:
        runner.decode(first, 3)
    message = str(err.value)
    assert reason in message
    assert type(model).__name__ in message
    assert "bench its eager arm" in message
    assert "\n" not in message


@pytest.mark.parametrize(("model_type", "overrides"), [("falcon", {}), ("llama", {})])
def test_a_model_on_the_masking_utilities_decodes_eager_s_tokens(folder, model_type, overrides):
    """The rule reads the code: Falcon without ALiBi and Llama capture and decode as before,
    with eager's greedy tokens."""
    model, runner = _runner(folder(model_type, **overrides))
    ids = torch.tensor([[5, 6, 7, 8]])
    first = runner.prefill(ids)
    got = torch.cat([first.view(1, 1), runner.decode(first, 5)], dim=1)
    want = model.generate(ids, do_sample=False, max_new_tokens=6, min_new_tokens=6)[:, 4:]
    assert torch.equal(got, want)


def test_a_model_that_adds_cache_layers_while_it_runs_is_refused_in_one_line():
    """Dory loops its middle layers and appends a copy of their cache layers per loop to
    the cache it is handed: inside a captured step those copies would hold the wrong
    loop's keys (the zoo's tiny Dory gave a graph arm at KL 1e-4, caught by the gate).
    Refused at the prefill, with the counts."""
    import transformers

    DoryConfig = getattr(transformers, "DoryConfig", None)
    if DoryConfig is None:
        pytest.skip("this transformers has no Dory")
    config = DoryConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_hidden_layers=3, n_input_layers=1,
        n_recurrent_layers=1, n_output_layers=1, n_recurrent_loops=2,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
        sliding_window=16, max_position_embeddings=512, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=16, backend="eager")
    with pytest.raises(UnsupportedModelError) as err:
        runner.prefill(torch.tensor([[3, 4, 5, 6]]))
    message = str(err.value)
    assert "holds 4 layers for its 3 decoder layers" in message
    assert "bench its eager arm" in message
    assert "\n" not in message
