"""A planted numerical bug: a kernel plug-in whose "fused MLP" of one layer is off by 1%.

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

__all__ = ["OnePercentMLP"]


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
