"""Small models with one planted hotspot each (and the shapes a detector needs).

Each is real torch code run on the CPU; nothing about its profile is made up: the
detector has to find the hotspot in what torch.profiler recorded.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn


class OddBatchedMatmul(nn.Module):
    """Batched matmuls with small odd dims (33x17 @ 17x31): far below the matmul peak."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(512, 33, 17))
        self.register_buffer("b", torch.randn(512, 17, 31))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(self.a, self.b).sum() + x


class TinyRMSNorm(nn.Module):
    """RMSNorm written as transformers writes it: several small operators per call."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + 1e-6)).to(x.dtype)


class _Block(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList([TinyRMSNorm(8) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm in self.norms:
            x = norm(x)
        return x


class ManyTinyNorms(nn.Module):
    """64 RMSNorms of width 8 per step: each operator launch costs more than its work."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(16) for _ in range(4)])
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.proj(x)


class _SeqMajorAttention(nn.Module):
    """Keeps K/V as [B, S, H, D] and makes them head-major every step."""

    def __init__(self, heads: int, head_dim: int, context: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.q_proj = nn.Linear(heads * head_dim, heads * head_dim)
        self.register_buffer("k_cache", torch.randn(1, context, heads, head_dim))
        self.register_buffer("v_cache", torch.randn(1, context, heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x).view(1, 1, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_cache.transpose(1, 2).contiguous()
        v = self.v_cache.transpose(1, 2).contiguous()
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(1, 1, -1)


class TransposedCache(nn.Module):
    """Two layers whose attention re-lays its cache every step."""

    SHAPES: ClassVar[dict[str, int]] = {
        "batch": 1,
        "heads": 8,
        "kv_heads": 8,
        "head_dim": 64,
        "context": 1024,
    }

    def __init__(self) -> None:
        super().__init__()
        s = self.SHAPES
        self.layers = nn.ModuleList()
        for _ in range(2):
            layer = nn.Module()
            layer.self_attn = _SeqMajorAttention(s["heads"], s["head_dim"], s["context"])
            self.layers.append(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer.self_attn(x)
        return x


class SyncPerLayer(nn.Module):
    """Reads a device value on the host after every layer (``.item()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
            if x.abs().max().item() > 1e6:
                x = x / 2
        return x


class GraphBreak(nn.Module):
    """A print in the forward: torch.compile splits the step into two graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        print("", end="")
        return self.b(x)
