"""Local error: each module of the trusted reference re-run on the *target's* own inputs.

An accumulated compare says where the numbers first leave the rule, but a module downstream
of a small error can inherit it and cross the line without being wrong itself. Replaying
tells them apart (msprobe's API pre-check idea, per module): the reference module is fed
exactly what the target's module was fed (cast to the reference's dtype), so the
difference between its output and the target's is that module's own error. Judged by the
same rule, against the same replay of the noise-floor dump.

Replayed: leaf modules (no children) called with exactly one tensor (linear and embedding
layers, norms, activations) whose input and output the dump recorded (``--with-inputs``,
tensor mode). Modules called with more (attention with its masks and positions) are left
to the accumulated compare.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .compare import Comparison, Row
from .dump import Entry
from .errors import NotComparableError
from .metrics import tensor_metrics
from .reader import Dump
from .rule import Rule

__all__ = ["replay_local_errors"]

log = logging.getLogger(__name__)


def _pairs(dump: Dump) -> dict[tuple[str, int], tuple[Entry, Entry]]:
    """(name, call) -> (its only input, its first output), for one-input calls."""
    inputs: dict[tuple[str, int], list[Entry]] = {}
    outputs: dict[tuple[str, int], Entry] = {}
    for e in dump.entries:
        if e.io == "input":
            inputs.setdefault((e.name, e.call), []).append(e)
        elif e.index == 0:
            outputs[(e.name, e.call)] = e
    return {k: (v[0], outputs[k]) for k, v in inputs.items() if len(v) == 1 and k in outputs}


def _local(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any] | None:
    param = next(module.parameters(), None)
    dtype = param.dtype if param is not None else torch.float64
    device = param.device if param is not None else torch.device("cpu")
    xin = x.to(device) if not x.is_floating_point() else x.to(device, dtype)
    with torch.no_grad():
        out = module(xin)
    if not isinstance(out, torch.Tensor) or out.shape != y.shape:
        return None
    return tensor_metrics(y, out)


def replay_local_errors(
    reference: torch.nn.Module,
    target: Dump,
    *,
    floor: Dump | None = None,
    rule: Rule | None = None,
) -> Comparison:
    """Each replayable leaf module of ``reference`` on ``target``'s recorded inputs; rows in
    the target's execution order, judged by ``rule`` against ``floor`` replayed the same
    way. ``target`` (and ``floor``) must be tensor dumps made with inputs."""
    rule = rule or Rule()
    for d in (target, floor):
        if d is not None and (not d.has_tensors() or not any(e.io == "input" for e in d.entries)):
            raise NotComparableError(
                f"{d.folder}: replaying needs a tensor dump with inputs (--mode tensor "
                "--with-inputs)"
            )
    leaves = {n: m for n, m in reference.named_modules() if n and not any(m.children())}
    t_pairs = _pairs(target)
    f_pairs = _pairs(floor) if floor is not None else {}
    rows: list[Row] = []
    for (name, call), (t_in, t_out) in sorted(t_pairs.items(), key=lambda kv: kv[1][1].order):
        module = leaves.get(name)
        if module is None:
            continue
        try:
            m = _local(module, target.tensor(t_in), target.tensor(t_out))
            if m is None:
                continue
            floor_value = None
            if (name, call) in f_pairs:
                f_in, f_out = f_pairs[(name, call)]
                fm = _local(module, floor.tensor(f_in), floor.tensor(f_out))  # type: ignore[union-attr]
                floor_value = fm.get("rel_l2") if fm else None
                m["floor_rel_l2"] = floor_value
        except (RuntimeError, TypeError, ValueError) as err:  # a module that will not replay
            log.info("replay of %s#%d skipped: %s", name, call, err)
            continue
        verdict = rule.judge("rel_l2", m.get("rel_l2"), t_out.dtype, floor_value,
                             int(m.get("nonfinite_mismatch") or 0))  # fmt: skip
        rows.append(Row(t_out.id, t_out.module, "output", t_out.order, t_out.shape, t_out.dtype,
                        t_out.dtype, m, verdict))  # fmt: skip
    if not rows:
        raise NotComparableError(
            f"{target.folder}: no module of the reference could be replayed on its inputs "
            "(leaf modules called with one tensor, dumped with --with-inputs)"
        )
    return Comparison(
        target={"folder": str(target.folder), "source": target.source, "mode": "replay",
                "device": target.meta.get("device"), "dtype": target.meta.get("dtype"),
                "arm": target.meta.get("arm"), "model": target.meta.get("model"),
                "entries": len(rows)},
        reference={"folder": "(the reference model, replayed)", "source": "replay",
                   "mode": "replay", "device": None, "dtype": None, "arm": None,
                   "model": None, "entries": len(rows)},
        floor=None if floor is None else {"folder": str(floor.folder), "source": floor.source,
                                          "mode": "replay", "device": floor.meta.get("device"),
                                          "dtype": floor.meta.get("dtype"), "arm": None,
                                          "model": None, "entries": len(f_pairs)},
        rule=rule,
        metric="rel_l2",
        rows=rows,
    )  # fmt: skip
