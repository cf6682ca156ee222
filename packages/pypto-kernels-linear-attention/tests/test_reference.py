"""The references equal transformers' own decode step of each layer type."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from _la_inputs import gdn_inputs, kda_inputs

from pypto_kernels_linear_attention import gated_delta_step_reference, kda_step_reference

pytest.importorskip("transformers")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_delta_reference_is_transformers_recurrent_step_and_gated_norm(dtype):
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    x = gdn_inputs(bsz=2, dtype=dtype)
    state = x["state"].clone()
    got = gated_delta_step_reference(**x, eps=1e-6)

    norm = m.Qwen3NextRMSNormGated(16, eps=1e-6).to(dtype)
    norm.weight.data.copy_(x["norm_weight"])
    beta = x["b"].sigmoid()
    g = -x["A_log"].float().exp() * F.softplus(x["a"].float() + x["dt_bias"])
    # key heads repeated over their value heads as the layer does (5.8 repeats in the
    # layer's forward, later versions inside this function; equal heads suit both)
    core, new_state = m.torch_recurrent_gated_delta_rule(
        x["q"].repeat_interleave(2, dim=1).unsqueeze(1),
        x["k"].repeat_interleave(2, dim=1).unsqueeze(1),
        x["v"].unsqueeze(1),
        g=g.unsqueeze(1),
        beta=beta.unsqueeze(1),
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    want = norm(core.reshape(-1, 16), x["z"].reshape(-1, 16)).reshape(2, 4, 16)
    # The reference follows transformers >= the release that l2-normalises q and k after
    # their fp32 cast (5.24 here); older ones (5.8) normalise in the io dtype, so in bf16
    # they differ by bf16 rounding, by their design, not ours.
    src = inspect.getsource(_function(m.torch_recurrent_gated_delta_rule))
    fp32_first = src.index("torch.float32") < src.index("l2norm(")
    tol = 1e-6 if dtype == torch.float32 or fp32_first else 0.03
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(x["state"], new_state, rtol=tol, atol=tol)
    assert not x["state"].equal(state)  # updated in place


def _function(fn):
    """The plain function: transformers 5.25 wraps hub-kernel functions such as
    ``torch_recurrent_gated_delta_rule`` in a module object whose ``forward`` closes over
    the function (inspect cannot read the wrapper's source)."""
    if inspect.isfunction(fn):
        return fn
    for cell in fn.forward.__closure__ or ():
        if (
            inspect.isfunction(cell.cell_contents)
            and cell.cell_contents.__name__ == "torch_recurrent_gated_delta_rule"
        ):
            return cell.cell_contents
    raise AssertionError(f"no function inside {fn!r}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_reference_is_transformers_forget_gate_recurrent_step_and_gated_norm(dtype):
    from pypto_testing.architectures import available

    if available("kimi_linear") is not None:
        pytest.skip(available("kimi_linear"))
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear import modeling_kimi_linear as m

    x = kda_inputs(bsz=2, dtype=dtype)
    # transformers' own forget gate makes g from the hidden states; its f_b_proj output is
    # the op's g_raw
    gate_mod = m.KimiLinearForgetGate(
        KimiLinearConfig(hidden_size=32, linear_head_dim=16, linear_num_heads=4)
    ).to(dtype)
    torch.manual_seed(1)
    for p in (gate_mod.f_a_proj.weight, gate_mod.f_b_proj.weight):
        p.data.normal_(0, 0.3)
    gate_mod.dt_bias.data = x["dt_bias"].clone()
    gate_mod.A_log.data = x["A_log"].clone()
    hidden = torch.randn(2, 1, 32).to(dtype)
    with torch.no_grad():
        g = gate_mod(hidden)
        x["g_raw"] = gate_mod.f_b_proj(gate_mod.f_a_proj(hidden)).reshape(2, 4, 16)
    state = x["state"].clone()
    got = kda_step_reference(**x, eps=1e-6)

    norm = m.KimiLinearRMSNormGated(16, eps=1e-6)
    norm.weight.data.copy_(x["norm_weight"])
    core, new_state = m.recurrent_kimi_delta_attention(
        x["q"].unsqueeze(1),
        x["k"].unsqueeze(1),
        x["v"].unsqueeze(1),
        g=g.reshape(2, 1, 4, 16),
        beta=torch.sigmoid(x["b"]).unsqueeze(1),
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    want = norm(core, x["gate"].unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x["state"], new_state, rtol=1e-6, atol=1e-6)
