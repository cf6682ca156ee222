"""Planted numerical bugs: a kernel plug-in whose "fused MLP" of one layer is off by 1%,
and a model whose MLP is off by 1% only when it is sharded (tensor parallel).

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

__all__ = ["OnePercentMLP", "plant_sharded_only_error"]

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
