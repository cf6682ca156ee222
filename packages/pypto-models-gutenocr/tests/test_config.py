import pytest

from pypto_models_gutenocr import GutenOCRConfig, MRopeSectionError

BASE = {
    "hidden_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 300,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
}


@pytest.mark.parametrize(
    "extra",
    [
        {"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},  # 4.x flat checkpoint
        {
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "text_config": {**BASE, "model_type": "qwen2_5_vl_text"},
        },  # nested text_config without it
        {
            "text_config": {
                **BASE,
                "rope_parameters": {
                    "rope_type": "default",
                    "mrope_section": [16, 24, 24],
                    "rope_theta": 1e6,
                },
            }
        },
    ],
    ids=["flat-rope_scaling", "nested-text-without-section", "nested-rope_parameters"],
)
def test_mrope_section_lands_in_text_rope_parameters(extra):
    cfg = GutenOCRConfig(**extra) if "text_config" in extra else GutenOCRConfig(**BASE, **extra)
    params = cfg.text_config.rope_parameters
    assert params["mrope_section"] == [16, 24, 24]
    assert params["rope_type"] == "default"


def test_missing_section_uses_the_default_only_when_it_fits():
    cfg = GutenOCRConfig(**BASE)  # head_dim 128
    assert cfg.text_config.rope_parameters["mrope_section"] == [16, 24, 24]
    with pytest.raises(MRopeSectionError, match="head_dim 64"):
        GutenOCRConfig(**{**BASE, "hidden_size": 128})


def test_a_section_that_does_not_cover_head_dim_is_refused():
    with pytest.raises(MRopeSectionError, match="summing to head_dim/2 = 64"):
        GutenOCRConfig(**BASE, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 16]})
