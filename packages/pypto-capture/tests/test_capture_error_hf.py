"""A real model's own exception inside a compiled step: carried, and not called a graph break.

Falcon-H1's decoder takes a ``{layer_type: mask}`` mapping and reads its
``"full_attention"`` entry; a step that hands it only ``{"hybrid": mask}`` (what an older
capture-safe cache built for its ``hybrid`` layers) makes the model raise ``KeyError`` while
dynamo traces it. dynamo reports that as ``Unsupported: Observed exception``, which used
to be explained as a host-sync graph break.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
architectures = pytest.importorskip("pypto_testing.architectures")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from pypto_capture import CaptureFailedError, DecodeStepRunner, capture_and_replay  # noqa: E402


@pytest.fixture(scope="module")
def falcon_h1(tmp_path_factory):
    why = architectures.available("falcon_h1")
    if why:
        pytest.skip(why)
    path = architectures.make_tiny_architecture(
        tmp_path_factory.mktemp("tiny") / "fh1", "falcon_h1"
    )
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


@pytest.mark.parametrize("backend", ["compile", "fused"])
def test_a_mask_mapping_without_the_models_key_is_a_model_error(falcon_h1, backend):
    runner = DecodeStepRunner(falcon_h1, batch_size=1, max_cache_len=16, backend="eager")
    runner.prefill(torch.zeros(1, 2, dtype=torch.long))
    cache = runner.cache
    mask = cache.decode_masks(torch.float32)["hybrid"]
    pos = cache.decode_position_ids()

    def step():
        return falcon_h1(
            input_ids=runner.tok,
            attention_mask={"hybrid": mask},  # lacks the "full_attention" key the model reads
            position_ids=pos,
            cache=cache,
            use_cache=True,
        ).logits

    with torch.no_grad(), pytest.raises(CaptureFailedError) as exc:
        capture_and_replay(step, warmup=1, replays=1, backend=backend, device="cpu")
    err = exc.value
    assert (err.cause_type, err.cause_message) == ("KeyError", "'full_attention'")
    expl = err.explanation
    assert expl.code == "model_error"
    assert expl.cause.startswith(
        "the model's own code raised KeyError: 'full_attention' while being traced"
    )
    assert "modeling_falcon_h1.py" in expl.cause  # near where dynamo saw it
    assert "host sync" not in str(err)
    assert "graph break" not in expl.name
    assert "attention_mask" in expl.fix
    assert "bisect_capture" in expl.fix
    data = expl.to_dict()
    assert (data["cause_type"], data["cause_message"]) == ("KeyError", "'full_attention'")
    json.dumps(data)
