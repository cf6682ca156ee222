"""Envelope check, then the PyPTO kernel or the counted fallback: the one dispatch rule.

Each op declares an :class:`Envelope` (dtypes, devices, shape rules). A call outside
it, with its switch off, or on a machine where PyPTO cannot run, goes to the torch
reference and is counted and logged once with the reason. A call inside the envelope
runs the PyPTO kernel; a kernel that then fails raises :class:`KernelError` rather than
being papered over, because a silent fallback would make an accuracy or speed
comparison meaningless.

:class:`KernelPackage` bundles one package's switches, stats and backend choice, so a
kernels package states its ops once and every wrapper dispatches the same way.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from . import sim
from .backend import Backend, backend
from .registry import StatsRegistry, SwitchRegistry
from .sim import SimUnavailableError

__all__ = [
    "DEFAULT_DTYPES",
    "Envelope",
    "KernelError",
    "KernelPackage",
    "PackCache",
    "compiling",
    "pypto_errors",
]

R = TypeVar("R")

DEFAULT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class KernelError(RuntimeError):
    """A PyPTO kernel inside its envelope failed to build or run."""


@dataclass(frozen=True)
class Envelope:
    """Where a kernel is valid. ``rules`` return a reason string when violated.

    The dtype and device checks look at floating tensors only when ``index_dtypes``
    is set, so an op with integer inputs (expert ids, lengths) declares those dtypes
    there instead of failing the "mixed dtypes" check.
    """

    op: str
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES
    devices: tuple[str, ...] = ("cpu", "npu")
    rules: tuple[Callable[..., str | None], ...] = field(default=())
    index_dtypes: tuple[torch.dtype, ...] = ()

    def violation(self, tensors: Sequence[torch.Tensor], **shape_args: object) -> str | None:
        """The first reason this call is outside the envelope, or None."""
        data = [t for t in tensors if t.dtype not in self.index_dtypes]
        if not data:
            return "no floating-point tensor to run on"
        dtype = data[0].dtype
        device = tensors[0].device
        for t in data:
            if t.dtype != dtype:
                return f"mixed dtypes {t.dtype} and {dtype}"
        for t in tensors:
            if t.device != device:
                return f"tensors on {t.device} and {device}"
        if dtype not in self.dtypes:
            return f"dtype {dtype} outside envelope {[str(d) for d in self.dtypes]}"
        if device.type not in self.devices:
            return f"device {device.type} outside envelope {list(self.devices)}"
        if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
            return "autograd is on (kernels are inference-only)"
        for rule in self.rules:
            reason = rule(*tensors, **shape_args)
            if reason:
                return reason
        return None


def pypto_errors() -> tuple[type[BaseException], ...]:
    """PyPTO's parser errors derive from Exception only; name them so they are wrapped."""
    try:
        from pypto.frontend.parser.error import ParserError
    except ImportError:
        return ()
    return (ParserError,)


def compiling() -> bool:
    """Inside torch.compile tracing (wrappers then route through an opaque custom op)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


class PackCache:
    """Weights packed once per weight tensor, keyed by identity and version.

    ``nn.Linear`` stores [out, in]; kernels want [in, out] contiguous (or stacked, for
    experts). The entry is dropped when the tensor is freed and rebuilt when it is
    modified in place (its ``_version`` moves) or re-pointed (``data_ptr`` changes).
    """

    def __init__(self) -> None:
        # id -> (weakref, version, data_ptr, packed). Keyed by id because tensors
        # compare elementwise, which a WeakKeyDictionary would trip over.
        self._cache: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}
        self.packs = 0

    def packed(
        self, weight: torch.Tensor, pack: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``pack(weight)``, computed once until ``weight`` changes or is freed.

        One cache holds one packing per weight: use a cache per packing.
        """
        key = id(weight)
        hit = self._cache.get(key)
        if (
            hit is not None
            and hit[0]() is weight
            and hit[1:3] == (weight._version, weight.data_ptr())
        ):
            return hit[3]
        out = pack(weight.detach())
        if hit is None or hit[0]() is not weight:
            weakref.finalize(weight, self._cache.pop, key, None)
        self._cache[key] = (weakref.ref(weight), weight._version, weight.data_ptr(), out)
        self.packs += 1
        return out

    def transposed(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight.t().contiguous()``, once per weight."""
        return self.packed(weight, lambda w: w.t().contiguous())

    def clear(self) -> None:
        self._cache.clear()
        self.packs = 0


class KernelPackage:
    """One kernels package's ops, switches, stats and dispatch.

    ``name`` is the package's logger (fallbacks are logged there); ``switches_env`` the
    variable that sets its switches at import; ``cpu_sim_env`` an optional package-own
    off switch for the CPU path (``$PYPTO_KERNELS_CPU_SIM=0`` always works);
    ``install_hint`` the install command errors name.
    """

    def __init__(
        self,
        name: str,
        ops: Sequence[str],
        *,
        switches_env: str,
        flag_names: Mapping[str, str] | None = None,
        cpu_sim_env: Iterable[str] = (),
        install_hint: str = sim.INSTALL_HINT,
    ) -> None:
        self.name = name
        self.ops = tuple(ops)
        self.install_hint = install_hint
        self.cpu_sim_env = tuple(cpu_sim_env)
        self.log = logging.getLogger(name)
        self.switches = SwitchRegistry(self.ops, switches_env, flag_names)
        self.stats = StatsRegistry(self.ops, self.log)

    def backend(self, device_type: str) -> Backend:
        return backend(device_type, install_hint=self.install_hint, cpu_sim_env=self.cpu_sim_env)

    def backend_or_reason(self, device_type: str) -> tuple[Backend | None, str | None]:
        try:
            return self.backend(device_type), None
        except SimUnavailableError as err:
            return None, str(err)

    def run(self, op: str, fn: Callable[[], R], *, sim_mode: bool = False) -> R:
        """Run a kernel call: errors become KernelError, success is counted.

        In SIM mode the call's output folder (1-170 MB of cost-model traces) is
        removed afterwards.
        """
        before = sim.run_output_names() if sim_mode else set()
        failures: tuple[type[BaseException], ...] = (RuntimeError, ValueError, *pypto_errors())
        try:
            out = fn()
        except failures as err:  # parse/compile/run errors
            raise KernelError(f"PyPTO {op} kernel failed: {err}") from err
        finally:
            if sim_mode:
                sim.discard_run_outputs(before)
        self.stats.record_pypto(op)
        return out

    def dispatch(
        self,
        op: str,
        device_type: str,
        kernel: Callable[[Backend], R],
        reference: Callable[[], R],
        *,
        check: Callable[[], str | None] | None = None,
    ) -> R:
        """The switch, ``check()`` (the envelope), the backend: the kernel or the fallback.

        ``kernel(bk)`` builds and runs the PyPTO kernel and returns the result; any
        failure in it is a KernelError. ``reference()`` is the torch fallback, counted
        and logged once per reason.
        """
        reason: str | None = None
        if not self.switches.is_on(op):
            reason = f"switch {self.switches.flag_names[op]} is off"
        if reason is None and check is not None:
            reason = check()
        bk: Backend | None = None
        if reason is None:
            bk, reason = self.backend_or_reason(device_type)
        if reason is not None or bk is None:
            self.stats.record_fallback(op, reason or "no backend")
            return reference()
        ready = bk
        return self.run(op, lambda: kernel(ready), sim_mode=ready.mode == "sim")

    def report(self) -> dict[str, Any]:
        """Switches, per-op call counts by backend, and the last fallback reason per op."""
        return self.stats.report(self.switches)
