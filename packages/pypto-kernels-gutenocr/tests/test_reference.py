import pytest
import torch

from pypto_kernels_gutenocr import mrope_reference, rms_norm_reference, swiglu_mlp_reference


def test_rms_norm_reference_matches_the_formula_in_fp64():
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    w = torch.randn(64, dtype=torch.float64)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    got = rms_norm_reference(x.float(), w.float(), 1e-6)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert rms_norm_reference(x.bfloat16(), w.bfloat16(), 1e-6).dtype == torch.bfloat16


def test_mrope_reference_equals_transformers_recomposed_rotary():
    mod = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
    torch.manual_seed(0)
    b, s, d, sections = 2, 7, 128, [16, 24, 24]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2).float() / d))
    pos = torch.randint(0, 50, (3, b, s)).float()
    freqs = pos[..., None] * inv_freq  # [3, B, S, D/2]
    emb = torch.cat((freqs, freqs), -1)  # 3-axis cos/sin, the kernel's input form
    cos3, sin3 = emb.cos(), emb.sin()
    # transformers 5.x recomposes per section on the half dim, then duplicates.
    rec = lambda f: torch.cat(  # noqa: E731
        [torch.cat([m[i % 3] for i, m in enumerate(f.split(sections, -1))], -1)] * 2, -1
    )
    q, k = torch.randn(b, 16, s, d), torch.randn(b, 2, s, d)
    want_q, want_k = mod.apply_rotary_pos_emb(q, k, rec(freqs.cos()), rec(freqs.sin()))
    got_q, got_k = mrope_reference(q, k, cos3, sin3, sections)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)


def test_swiglu_reference_matches_linear_layers():
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    g, u, dn = (
        torch.nn.Linear(64, 128, bias=False),
        torch.nn.Linear(64, 128, bias=False),
        torch.nn.Linear(128, 64, bias=False),
    )
    want = dn(torch.nn.functional.silu(g(x)) * u(x))
    got = swiglu_mlp_reference(x, g.weight.t(), u.weight.t(), dn.weight.t())
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
