"""Kernel plug-ins (entry-point group ``pypto.kernels``, contract C).

The bench names no kernel and no model: a kernel package registers an object with
``name``, ``applies_to(model)``, ``enable(model)`` (a context manager that switches its
fused kernels on) and ``report()``. The ``pypto+graph`` arm enters every applicable
plug-in's ``enable`` around the graph arm and records each ``report()``.

``register_plugin`` is a library hook for callers that hold a plug-in object without an
installed distribution (notebooks, pypto-e2e experiments); installed entry points and
registered objects are treated the same.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

from .errors import PluginError

__all__ = [
    "GROUP",
    "KERNEL_PACKAGE_FOR",
    "applicable_plugins",
    "discover_plugins",
    "register_plugin",
    "unregister_plugin",
]

log = logging.getLogger(__name__)

GROUP = "pypto.kernels"
_REGISTERED: list[Any] = []


def register_plugin(plugin: Any) -> None:
    """Add a plug-in object for this process (in addition to installed entry points)."""
    _check_shape(plugin, getattr(plugin, "name", repr(plugin)))
    _REGISTERED.append(plugin)


def unregister_plugin(plugin: Any) -> None:
    if plugin in _REGISTERED:
        _REGISTERED.remove(plugin)


def _check_shape(obj: Any, where: str) -> None:
    missing = [a for a in ("name", "applies_to", "enable", "report") if not hasattr(obj, a)]
    if missing:
        raise PluginError(
            f"kernel plug-in {where} lacks {', '.join(missing)}: it must follow the pypto.kernels contract"
        )


def discover_plugins() -> list[Any]:
    """Every installed and registered plug-in object (a bad one raises PluginError)."""
    found: list[Any] = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        where = f"{ep.name} ({ep.value})"
        try:
            obj = ep.load()
        except Exception as err:
            raise PluginError(f"kernel plug-in {where} failed to import: {err}") from err
        if callable(obj) and not hasattr(obj, "applies_to"):
            obj = obj()
        _check_shape(obj, where)
        found.append(obj)
    return found + list(_REGISTERED)


#: The kernels package to suggest for a family whose kernels live in a shared package.
KERNEL_PACKAGE_FOR = {
    "gemma4": "pypto-kernels-attention",
    "gemma4_text": "pypto-kernels-attention",
    # Gated DeltaNet and KDA hybrids: their decode-step kernels live in one package.
    **dict.fromkeys(
        ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "kimi_linear"),
        "pypto-kernels-linear-attention",
    ),
}


def applicable_plugins(model: Any) -> list[Any]:
    """Plug-ins whose ``applies_to(model)`` is true; none -> the contract's message."""
    plugins = [p for p in discover_plugins() if p.applies_to(model)]
    if not plugins:
        family = getattr(getattr(model, "config", None), "model_type", None) or "<family>"
        package = KERNEL_PACKAGE_FOR.get(family, f"pypto-kernels-{family}")
        raise PluginError(f"no kernel plug-in applies to this model (install {package})")
    log.info("kernel plug-ins for %s: %s", type(model).__name__, [p.name for p in plugins])
    return plugins
