"""Real transformers experts modules at tiny sizes, and random routing for them."""

from __future__ import annotations

import torch


def qwen3_moe_experts(hidden: int = 64, inter: int = 32, experts: int = 8, seed: int = 0):
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = AutoConfig.for_model(
        "qwen3_moe", hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts
    )
    torch.manual_seed(seed)
    module = Qwen3MoeExperts(config)
    torch.nn.init.normal_(module.gate_up_proj, std=0.1)
    torch.nn.init.normal_(module.down_proj, std=0.1)
    return module.eval()


def minimax_m3_experts(hidden: int = 64, inter: int = 32, experts: int = 8, seed: int = 0):
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig
    from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLExperts

    config = MiniMaxM3VLTextConfig(
        hidden_size=hidden, intermediate_size=inter, num_local_experts=experts
    )
    torch.manual_seed(seed)
    module = MiniMaxM3VLExperts(config)
    # std 1 so the clamps at +-7 are actually hit
    torch.nn.init.normal_(module.gate_up_proj, std=1.0)
    torch.nn.init.normal_(module.down_proj, std=0.1)
    return module.eval()


def routing(tokens: int, k: int, experts: int, hidden: int, seed: int = 1, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g) * scale
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, k, generator=g), -1)
    return x, ids, w


def gemma4_experts(hidden: int = 64, inter: int = 32, experts: int = 8, seed: int = 0):
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts

    config = Gemma4TextConfig(
        hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts, top_k_experts=2
    )
    torch.manual_seed(seed)
    module = Gemma4TextExperts(config)
    torch.nn.init.normal_(module.gate_up_proj, std=0.2)
    torch.nn.init.normal_(module.down_proj, std=0.1)
    return module.eval()
