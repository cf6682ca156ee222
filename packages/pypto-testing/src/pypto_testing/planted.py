"""Planted numerical bugs: a kernel plug-in whose "fused MLP" of one layer is off by 1%,
a model whose MLP is off by 1% only when it is sharded (tensor parallel), a model whose MLP
is off by 1% only in the first copy a process loads (a target device's own kernels, where
no second device exists), and a pinned modeling file whose rotary base differs in one
layer.

Why one definition: the numerical gate (pypto-bench) and the precision check
(pypto-precision) are both proven against the same wrong kernel, registered through the
`pypto.kernels` plug-in hook (``pypto_bench.register_plugin``), so both prove they catch the
same bug, and name the same module (``model.layers.<layer>.mlp#0``). A tiny model's greedy
tokens survive it: only its logits show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "OnePercentMLP",
    "plant_first_load_error",
    "plant_sharded_only_error",
    "write_rotary_planted_code",
]

_SHARDED_ONLY = '''"""Planted by pypto_testing.planted: layer {layer}'s MLP output is scaled by {factor}
only when this process holds a shard of the model (tensor parallel), as a mis-sharded
layer or a wrong reduction would. The same weights run alone compute the model exactly."""
from transformers import LlamaForCausalLM


class ShardedOnlyErrorLlama(LlamaForCausalLM):
    def forward(self, *args, **kwargs):
        mlp = self.model.layers[{layer}].mlp
        weight = mlp.gate_proj.weight
        sharded = hasattr(weight, "to_local") or weight.shape[0] != self.config.intermediate_size
        handle = mlp.register_forward_hook(lambda m, a, out: out * {factor}) if sharded else None
        try:
            return super().forward(*args, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
'''


def plant_sharded_only_error(folder: Any, layer: int = 1, factor: float = 1.01) -> None:
    """Turn a tiny Llama ``folder`` into one whose MLP of ``layer`` is off by ``factor`` only
    when sharded: ``modeling_planted.py`` and config.json's ``auto_map`` (loading it needs
    ``--trust-remote-code``). A 1-rank run computes the model; ``--nproc 2`` does not."""
    import json
    from pathlib import Path

    root = Path(folder)
    (root / "modeling_planted.py").write_text(_SHARDED_ONLY.format(layer=layer, factor=factor))
    cfg = json.loads((root / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_planted.ShardedOnlyErrorLlama"}
    (root / "config.json").write_text(json.dumps(cfg, indent=2))


_FIRST_LOAD = '''"""Planted by pypto_testing.planted: the first copy of this model a process builds has
layer {layer}'s MLP output scaled by {factor}; every later copy computes the model exactly.
On a machine with one device this stands in for a target whose own kernels are wrong: the
run's model (loaded first) is the target, the reference loaded after it is right."""
from transformers import LlamaForCausalLM

_BUILT = [0]


class FirstLoadErrorLlama(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        _BUILT[0] += 1
        if _BUILT[0] == 1:
            self.model.layers[{layer}].mlp.register_forward_hook(lambda m, a, out: out * {factor})
'''


def plant_first_load_error(folder: Any, layer: int = 1, factor: float = 1.01) -> None:
    """Turn a tiny Llama ``folder`` into one whose first copy in a process has layer
    ``layer``'s MLP off by ``factor`` (``modeling_planted.py`` and ``auto_map``; loading it
    needs ``--trust-remote-code``): ``pypto-bench run --reference cpu`` on one CPU holds a
    wrong target against a right reference."""
    import json
    from pathlib import Path

    root = Path(folder)
    (root / "modeling_planted.py").write_text(
        _FIRST_LOAD.format(layer=int(layer), factor=float(factor))
    )
    cfg = json.loads((root / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_planted.FirstLoadErrorLlama"}
    (root / "config.json").write_text(json.dumps(cfg, indent=2))


_ROTARY = '''"""Planted by pypto_testing.planted: a Llama whose layer {layer} computes its rotary
embedding with base {factor} x the config's rope_theta, inline in its attention (no new
module, no new weight: the folder's weights load exactly), as a ported modeling file with
a wrong constant in one place would."""
import torch
from transformers.models.llama import modeling_llama


def _base(config):
    params = getattr(config, "rope_parameters", None) or {{}}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class _ShiftedRopeAttention(modeling_llama.LlamaAttention):
    def forward(self, hidden_states, position_embeddings=None, *args, **kwargs):
        cos, sin = position_embeddings
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)[None]
        dim = cos.shape[-1]
        base = _base(self.config) * {factor}
        steps = torch.arange(0, dim, 2, dtype=torch.float, device=cos.device) / dim
        freqs = positions[..., None].float() * (1.0 / (base**steps))
        emb = torch.cat((freqs, freqs), dim=-1)
        shifted = (emb.cos().to(cos.dtype), emb.sin().to(sin.dtype))
        return super().forward(hidden_states, shifted, *args, **kwargs)


class RotaryPlantedLlama(modeling_llama.LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model.layers[{layer}].self_attn.__class__ = _ShiftedRopeAttention
'''


def write_rotary_planted_code(path: Any, layer: int = 1, factor: float = 4.0) -> str:
    """Write a modeling file to ``path`` (pin it with pypto-patch's custom mode) whose
    ``RotaryPlantedLlama`` computes layer ``layer``'s rotary embedding with ``factor`` x
    the configured base; returns the ``auto_map`` value naming the class."""
    from pathlib import Path

    target = Path(path)
    target.write_text(_ROTARY.format(layer=int(layer), factor=float(factor)))
    return f"{target.stem}.RotaryPlantedLlama"


class OnePercentMLP:
    """The plug-in: while its arm runs, layer ``layer``'s MLP output is scaled by ``factor``."""

    name = "broken_mlp"

    def __init__(self, layer: int = 1, factor: float = 1.01) -> None:
        self.layer = layer
        self.factor = factor

    def applies_to(self, model: Any) -> bool:
        return hasattr(model, "model")

    def enable(self, model: Any) -> Any:
        factor = self.factor

        @contextmanager
        def on() -> Iterator[None]:
            mlp = model.model.layers[self.layer].mlp
            handle = mlp.register_forward_hook(lambda m, a, out: out * factor)
            try:
                yield
            finally:
                handle.remove()

        return on()

    def report(self) -> dict[str, Any]:
        return {}
