"""The ``pypto.kernels`` plug-in pypto-bench's pypto+graph arm loads (contract C).

The kernel package registers the plug-in itself, and recognises a GutenOCR model
by a class attribute (``pypto_kernel_family == "gutenocr"``) that the model
package sets on its classes. That keeps the dependency arrow pointing one way:
the models package imports this one, never the reverse, and a plain
Qwen2.5-VL model (which has no injection points) is never claimed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from . import stats
from .switches import OPS, pto_switches

__all__ = ["FAMILY", "MARKER", "PLUGIN", "GutenOCRKernelPlugin"]

FAMILY = "gutenocr"
MARKER = "pypto_kernel_family"


class GutenOCRKernelPlugin:
    name = FAMILY

    def __init__(self, ops: tuple[str, ...] = OPS) -> None:
        self.ops = ops

    def applies_to(self, model: torch.nn.Module) -> bool:
        return getattr(model, MARKER, None) == FAMILY

    @contextlib.contextmanager
    def enable(self, model: torch.nn.Module) -> Iterator[None]:
        if not self.applies_to(model):
            raise ValueError(f"{type(model).__name__} is not a GutenOCR model with kernel hooks")
        stats.reset()  # report() covers this enable(): one arm's calls, not the process's
        with pto_switches(dict.fromkeys(self.ops, True)):
            yield

    def report(self) -> dict[str, Any]:
        return stats.report()

    def tunables(self) -> dict[str, Any]:
        """Kernels whose tile shapes pypto-tune can search over the PyPTO cost model.

        Each value has ``simulate``, ``candidate_tiles``, ``default_tiles``,
        ``shape_names`` (see :class:`.costmodel.TunableKernel`). Imported lazily so
        loading the plug-in for a bench run does not pull the cost-model code in.
        """
        from .costmodel import TUNABLES

        return dict(TUNABLES)


PLUGIN = GutenOCRKernelPlugin()
