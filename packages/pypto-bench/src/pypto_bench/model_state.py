"""What each arm's open context did to the shared model, saved and put back per round.

An arm that patches the model while it is open (the graph arms' exact MoE routing, the
pypto+graph arm's kernel plug-ins: both swap experts modules' instance ``forward`` through
``pypto_capture.swap_forward``) used to force the sequential schedule, since eager would
otherwise run the patched model. Interleaved rounds instead keep one *state* per arm: the
instance attributes of every module of the model (``vars(module)``, with the contents of
its parameter, buffer and child-module tables), saved when the arm stops running and put
back before it runs again. The very objects come back (the same bound forwards, the
same tensors), so what a graph arm compiled or captured still matches (torch.compile's
guards check those objects' identities) and no tensor is copied.

What is not covered, and stays the sequential schedule's (the caller checks): state held
outside the modules, e.g. a config attribute the NPU capture mitigations change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ModelState", "snapshot"]

#: A module's tables whose *contents* (not only the table object) are saved.
_TABLES = ("_parameters", "_buffers", "_modules")


@dataclass(frozen=True)
class _Saved:
    module: Any
    attrs: dict[str, Any]
    tables: dict[str, dict[str, Any]]


class ModelState:
    """Every module's instance attributes at one moment (shallow: the objects, not copies)."""

    def __init__(self, saved: list[_Saved]) -> None:
        self._saved = saved

    def restore(self) -> None:
        """Put every saved module back as it was: attributes set since removed, changed
        ones set back, each table's entries as they were (the same objects)."""
        for s in self._saved:
            own = vars(s.module)
            for key in [k for k in own if k not in s.attrs]:
                del own[key]
            own.update(s.attrs)
            for name, entries in s.tables.items():
                table = own.get(name)
                if isinstance(table, dict):
                    table.clear()
                    table.update(entries)


def snapshot(model: Any) -> ModelState:
    """The state of ``model``: every module reachable from it now."""
    saved = []
    for module in model.modules():
        attrs = dict(vars(module))
        tables = {n: dict(attrs[n]) for n in _TABLES if isinstance(attrs.get(n), dict)}
        saved.append(_Saved(module, attrs, tables))
    return ModelState(saved)
