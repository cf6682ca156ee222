"""Detectors: each reads a Profile, compares one measured figure with a threshold that
can be changed, and reports a finding with its evidence (never a guess without one).

A finding carries ``share``: the fraction of the step the problem occupies, and
``fix_factor``: how much faster that share could become with the fix (a bound from
the measurement, e.g. 1/efficiency). The advice turns them into an estimated speedup
with Amdahl's law, so every estimate can be traced to two measured numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from typing import Any

from .records import Profile, not_a_profile
from .summary import CAST_OPS, MATMUL_OPS, SYNC_OPS, matmul_dims, op_time

__all__ = [
    "ALIGNMENT",
    "DETECTORS",
    "Thresholds",
    "detect_aicpu",
    "detect_attention_memory_bound",
    "detect_casts",
    "detect_graph_breaks",
    "detect_host_bound",
    "detect_host_syncs",
    "detect_kv_layout",
    "detect_matmul_efficiency",
    "detect_memory_growth",
    "detect_norm_launch_overhead",
    "diagnose",
    "kv_layout_suspects",
]

#: Tile alignment of matmul dimensions per device type (elements): the cube unit's
#: 16x16 fractal on Ascend, tensor-core friendly multiples on CUDA, AVX-512 lanes on CPU.
ALIGNMENT = {"npu": 16, "cuda": 8, "cpu": 16}

_COPY_OPS = ("aten::clone", "aten::contiguous", "aten::copy_")
_LAYOUT_OPS = ("aten::transpose", "aten::permute")


@dataclass
class Thresholds:
    """Every detector's threshold (CLI: ``--threshold NAME=VALUE``)."""

    matmul_efficiency: float = 0.60  # below this fraction of the attainable peak
    matmul_min_share: float = 0.02  # ...and holding at least this share of the step
    launch_bound_calls: float = 3.0  # a matmul call under this many empty-op launches is skipped
    attention_memory_bound: float = 0.70  # share of attention time explained by bytes/bw
    attention_min_share: float = 0.10  # ...when attention holds at least this share of the step
    norm_share: float = 0.10  # norm modules' share of the step (inclusive, host included)
    small_op_us: float = 10.0  # ...made of operators shorter than this per call
    host_gap_share: float = 0.30  # device idle share of the step
    host_syncs_per_step: float = 0.5  # host syncs per step above this
    cast_share: float = 0.05  # dtype casts' share of the step
    memory_growth_mib: float = 16.0  # growth across profiled iterations
    aicpu_us: float = 20.0  # an AICPU operator slower than this per step (msprof's figure)
    kv_copy_share: float = 0.01  # cache copies/transposes in attention above this share
    graph_breaks: float = 0.0  # graph breaks or recompiles during the profiled steps

    @classmethod
    def from_pairs(cls, pairs: list[str]) -> Thresholds:
        """``["norm_share=0.2", ...]``; unknown names and non-numbers raise ValueError."""
        known = {f.name for f in fields(cls)}
        values: dict[str, float] = {}
        for pair in pairs:
            name, sep, raw = pair.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in known:
                raise ValueError(
                    f"unknown threshold {pair!r}: use NAME=VALUE with NAME one of {', '.join(sorted(known))}"
                )
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"threshold {name} needs a number, got {raw!r}") from None
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"threshold {name} needs a finite number >= 0, got {raw.strip()!r}"
                )
            values[name] = value
        return cls(**values)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _finding(
    fid: str,
    title: str,
    *,
    share: float,
    fix_factor: float | None,
    evidence: dict[str, Any],
    threshold: dict[str, float],
    fix: str,
    where: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "id": fid,
        "title": title,
        "share": max(0.0, min(share, 1.0)),
        "fix_factor": fix_factor,
        "evidence": evidence,
        "threshold": threshold,
        "fix": fix,
        "where": where or [],
    }


def _device(p: Profile) -> str:
    return str(p.meta.get("device_type") or "cpu")


# --------------------------------------------------------------------------- detectors


def detect_matmul_efficiency(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    """Matmuls below ``matmul_efficiency`` of what the roofline allows at their shape.

    Attainable = min(measured matmul peak, arithmetic intensity x measured bandwidth):
    a batch-1 GEMV is judged against bandwidth, a prefill GEMM against compute, so a
    memory-bound decode matmul is not called slow for missing the compute peak.

    In a decode step a matmul's M is the batch (one new token per sequence; 1 per
    sequence in a batched matmul): nothing to pad or tile there, since a decode GEMV
    costs its weight read whatever M is. Those shapes are skipped.
    """
    peak = p.peaks.get("matmul_flops_per_s")
    bw = p.peaks.get("bandwidth_bytes_per_s")
    step = p.step_us
    if not peak or not bw or not step:
        return []
    align = ALIGNMENT.get(_device(p), 16)
    groups: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(
        lambda: {"us": 0.0, "flops": 0.0, "bytes": 0.0, "calls": 0.0, "modules": []}
    )
    for op in p.ops:
        if op.name not in MATMUL_OPS:
            continue
        dims = matmul_dims(op.name, op.shapes)
        if dims is None or not op.flops:
            continue
        g = groups[(op.name, dims)]
        g["us"] += op_time(op, _device(p))
        g["flops"] += op.flops
        g["bytes"] += op.bytes or 0.0
        g["calls"] += op.calls
        if op.module:
            g["modules"].append(op.module)
    out = []
    launch = float(p.step.get("launch_us") or p.peaks.get("op_launch_us") or 0.0)
    decode = p.meta.get("regime") == "decode"
    batch = p.meta.get("batch") if isinstance(p.meta.get("batch"), int) else 1
    for (name, (b, m, n, k)), g in groups.items():
        if decode and (m == batch or (b > 1 and m == 1)):
            continue  # a decode step's rows: M is the batch, not a shape to pad
        share = g["us"] / step
        if g["us"] <= 0 or share < th.matmul_min_share:
            continue
        if g["calls"] and g["us"] / g["calls"] < th.launch_bound_calls * launch:
            continue  # a call this short is launch cost, not tiling: host_bound covers it
        achieved = g["flops"] / (g["us"] * 1e-6)
        intensity = g["flops"] / g["bytes"] if g["bytes"] else float("inf")
        attainable = min(peak, intensity * bw)
        eff = achieved / attainable if attainable else 0.0
        if eff >= th.matmul_efficiency:
            continue
        misaligned = {d: v for d, v in (("M", m), ("N", n), ("K", k)) if v % align}
        out.append(
            _finding(
                "matmul_efficiency",
                f"{name} [{b}x]{m}x{k} @ {k}x{n} runs at {eff:.0%} of its attainable peak",
                share=share,
                fix_factor=min(1.0 / max(eff, 1e-3), 10.0) * th.matmul_efficiency,
                evidence={
                    "op": name,
                    "batch_M_N_K": [b, m, n, k],
                    "efficiency": eff,
                    "achieved_flops_per_s": achieved,
                    "attainable_flops_per_s": attainable,
                    "bound": "compute" if peak <= intensity * bw else "memory",
                    "misaligned_dims": misaligned,
                    "alignment": align,
                    "calls_per_step": g["calls"],
                    "us_per_step": g["us"],
                },
                threshold={
                    "matmul_efficiency": th.matmul_efficiency,
                    "matmul_min_share": th.matmul_min_share,
                },
                fix="pad_matmul" if misaligned else "matmul_tiles",
                where=sorted(set(g["modules"]))[:8],
            )
        )
    return out


def _attention_core_ops(p: Profile) -> list[Any]:
    """Attention operators other than the q/k/v/o projections (the part a fused kernel
    replaces)."""
    return [
        op
        for op in p.ops
        if op.block == "attention" and not (op.module or "").rsplit(".", 1)[-1].endswith("proj")
    ]


def detect_attention_memory_bound(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    bw = p.peaks.get("bandwidth_bytes_per_s")
    if not bw or not p.step_us:
        return []
    ops = _attention_core_ops(p)
    t = sum(op_time(o, _device(p)) for o in ops)
    moved = sum(o.bytes or 0.0 for o in ops)
    if t <= 0 or not moved:
        return []
    explained = (moved / bw) * 1e6 / t
    if explained < th.attention_memory_bound:
        return []
    if t / p.step_us < th.attention_min_share:
        # A fused attention kernel can only save what attention takes: in a captured step
        # whose attention is a sliver (its own breakdown says so), it is not the next fix.
        return []
    return [
        _finding(
            "attention_memory_bound",
            f"attention is memory-bound: bytes moved at the measured bandwidth explain {explained:.0%} of its time",
            share=t / p.step_us,
            fix_factor=None,
            evidence={"attention_us_per_step": t, "bytes_per_step": moved, "explained": explained},
            threshold={
                "attention_memory_bound": th.attention_memory_bound,
                "attention_min_share": th.attention_min_share,
            },
            fix="fused_attention",
        )
    ]


def kv_layout_suspects(p: Profile) -> list[Any]:
    """Attention operators that copy a transposed 4-D tensor (a cache re-laid every step)."""
    layout_modules = {
        o.module for o in p.ops if o.block == "attention" and o.name in _LAYOUT_OPS and o.module
    }
    return [
        o
        for o in p.ops
        if o.block == "attention"
        and o.name in _COPY_OPS
        and o.module in layout_modules
        and o.shapes
        and isinstance(o.shapes[0], list)
        and len(o.shapes[0]) == 4
    ]


def _copies(ops: list[Any]) -> float:
    """Copies per step, one per outermost copy operator (contiguous -> clone -> copy_
    are one copy)."""
    total = 0.0
    for module in {o.module for o in ops}:
        here = {o.name: o.calls for o in ops if o.module == module}
        total += next((here[n] for n in _COPY_OPS if n in here), 0.0)
    return total


def detect_kv_layout(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    suspects = kv_layout_suspects(p)
    if not suspects or not p.step_us:
        return []
    t = sum(op_time(o, _device(p)) for o in suspects)
    share = t / p.step_us
    bench = p.microbench.get("kv_layout")
    if share < th.kv_copy_share or not bench:
        return []
    speedup = bench.get("head_major_speedup") or 0.0
    if speedup <= 1.0:
        return []  # measured: the other layout is not faster here, so nothing to recommend
    return [
        _finding(
            "kv_layout",
            f"the KV cache is transposed and copied every step ({share:.1%} of the step); "
            f"a head-major cache measured {speedup:.2f}x faster at these shapes",
            share=share,
            fix_factor=speedup,
            evidence={
                "copies_per_step": _copies(suspects),
                "copy_us_per_step": t,
                "shapes": suspects[0].shapes,
                "microbenchmark": bench,
            },
            threshold={"kv_copy_share": th.kv_copy_share},
            fix="kv_layout",
            where=sorted({o.module for o in suspects if o.module}),
        )
    ]


def detect_norm_launch_overhead(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    """Norm modules taking ``norm_share`` of the step (inclusive: host glue counted) while
    built from small operators (mean self time per call under ``small_op_us``): their time
    is launches, which a fused norm kernel (one launch per call) or capture removes."""
    if not p.step_us or p.meta.get("arm") in ("graph", "pypto+graph", "hf-compile"):
        # A captured step launches one fused kernel per norm (its modules rebuilt from
        # provenance): there are no per-operator launches to remove.
        return []
    norms = [c for c in p.call_graph if c["block"] == "norm"]
    # Count only outermost norm modules (a norm inside a norm would count twice).
    names = {c["module"] for c in norms}
    outer = [c for c in norms if not any(c["module"].startswith(n + ".") for n in names)]
    inclusive = sum(c["us"] for c in outer)
    calls = sum(c["calls"] for c in outer)
    share = inclusive / p.step_us
    ops = [o for o in p.ops if o.block == "norm"]
    n_ops = sum(o.calls for o in ops)
    kernel = sum(op_time(o, _device(p)) for o in ops)
    if share < th.norm_share or not n_ops or not calls:
        return []
    per_op = kernel / n_ops
    if per_op >= th.small_op_us:
        return []
    ops_per_call = n_ops / calls
    return [
        _finding(
            "norm_launch_overhead",
            f"{calls:.0f} norm calls per step take {share:.0%} of the step as "
            f"{ops_per_call:.0f} small operators each ({per_op:.1f} us per operator)",
            share=share,
            fix_factor=min(max(ops_per_call, 1.0), 10.0),
            evidence={
                "norm_calls_per_step": calls,
                "norm_ops_per_step": n_ops,
                "ops_per_call": ops_per_call,
                "inclusive_us_per_step": inclusive,
                "kernel_us_per_step": kernel,
                "kernel_per_op_us": per_op,
                "launch_interval_us": inclusive / n_ops,
            },
            threshold={"norm_share": th.norm_share, "small_op_us": th.small_op_us},
            fix="fuse_norm",
            where=[c["module"] for c in outer][:8],
        )
    ]


def detect_host_bound(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    step = p.step_us
    gap = float(p.step.get("host_gap_us") or 0.0)
    busy = float(p.step.get("device_busy_us") or 0.0)
    if not step or gap / step < th.host_gap_share:
        return []
    captured = p.meta.get("arm", "eager") != "eager"
    return [
        _finding(
            "host_bound",
            f"the device is idle {gap / step:.0%} of the step while the host prepares the next operator",
            share=gap / step,
            fix_factor=None,  # the gap can go (almost) entirely: advice bounds it
            evidence={
                "step_us": step,
                "device_busy_us": busy,
                "host_gap_us": gap,
                "utilisation": busy / step,
                "ops_per_step": sum(o.calls for o in p.ops),
                "arm": p.meta.get("arm"),
            },
            threshold={"host_gap_share": th.host_gap_share},
            fix="fused_capture" if captured else "graph_arm",
        )
    ]


def detect_graph_breaks(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    c = p.counters or {}
    warm = c.get("warmup") or {}
    breaks = int(c.get("graph_break_count") or 0) + int(warm.get("graph_break_count") or 0)
    recompiles = int(c.get("graphs_compiled") or 0)  # new graphs while profiling
    regions = float(p.step.get("compiled_regions") or 0.0)
    # One compiled region per step is a whole-step graph; more means the step re-entered
    # Python between graphs (a break), even if it was compiled before this profile.
    extra_regions = max(regions - 1.0, 0.0) if regions else 0.0
    if breaks + recompiles + extra_regions <= th.graph_breaks:
        return []
    gap = float(p.step.get("host_gap_us") or 0.0)
    return [
        _finding(
            "graph_breaks",
            f"torch.compile broke the graph {breaks} time(s), runs {regions:.0f} compiled "
            f"regions per step and compiled {recompiles} new graph(s) while profiling",
            share=gap / p.step_us if p.step_us else 0.0,
            fix_factor=None,
            evidence={
                "graph_breaks": {**warm.get("graph_breaks", {}), **c.get("graph_breaks", {})},
                "compiled_regions_per_step": regions,
                "graphs_compiled": recompiles,
                "frames_traced": c.get("frames_traced"),
            },
            threshold={"graph_breaks": th.graph_breaks},
            fix="remove_graph_breaks",
        )
    ]


def detect_host_syncs(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    syncs = [o for o in p.ops if o.name in SYNC_OPS]
    per_step = sum(o.calls for o in syncs)
    if per_step <= th.host_syncs_per_step or not p.step_us:
        return []
    t = sum(o.host_us for o in syncs)
    where = sorted({o.module or "(outside the model: the generation loop)" for o in syncs})
    in_model = any(o.module for o in syncs)
    return [
        _finding(
            "host_syncs",
            f"{per_step:.1f} host syncs per step ({', '.join(sorted({o.name for o in syncs}))})",
            share=t / p.step_us,
            fix_factor=None,
            evidence={
                "syncs_per_step": per_step,
                "sync_us_per_step": t,
                "by_place": {(o.module or "(generation loop)"): o.calls for o in syncs if o.calls},
                "device_type": _device(p),
            },
            threshold={"host_syncs_per_step": th.host_syncs_per_step},
            fix="remove_sync" if in_model else "graph_arm",
            where=where[:8],
        )
    ]


def detect_aicpu(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    slow = [o for o in p.ops if (o.core or "").upper() == "AI_CPU" and o.device_us > th.aicpu_us]
    if not slow or not p.step_us:
        return []
    t = sum(o.device_us for o in slow)
    return [
        _finding(
            "aicpu_ops",
            f"{len(slow)} operator(s) run on the AI CPU (slower than {th.aicpu_us:g} us per step)",
            share=t / p.step_us,
            fix_factor=None,
            evidence={
                "ops": [{"name": o.name, "us": o.device_us, "module": o.module} for o in slow]
            },
            threshold={"aicpu_us": th.aicpu_us},
            fix="aicpu",
            where=sorted({o.module for o in slow if o.module})[:8],
        )
    ]


def detect_casts(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    casts = [o for o in p.ops if o.name in CAST_OPS]
    t = sum(op_time(o, _device(p)) for o in casts)
    if not p.step_us or t / p.step_us < th.cast_share:
        return []
    return [
        _finding(
            "casts",
            f"dtype casts take {t / p.step_us:.0%} of the step",
            share=t / p.step_us,
            fix_factor=None,
            evidence={"casts_per_step": sum(o.calls for o in casts), "cast_us_per_step": t},
            threshold={"cast_share": th.cast_share},
            fix="casts",
            where=sorted({o.module for o in casts if o.module})[:8],
        )
    ]


def detect_memory_growth(p: Profile, th: Thresholds) -> list[dict[str, Any]]:
    growth = float((p.memory or {}).get("growth") or 0)
    if growth < th.memory_growth_mib * 2**20:
        return []
    return [
        _finding(
            "memory_growth",
            f"memory grew by {growth / 2**20:.1f} MiB across the profiled iterations",
            share=0.0,
            fix_factor=None,
            evidence={"kind": p.memory.get("kind"), "per_iter": p.memory.get("per_iter")},
            threshold={"memory_growth_mib": th.memory_growth_mib},
            fix="memory_growth",
        )
    ]


DETECTORS = (
    detect_host_bound,
    detect_matmul_efficiency,
    detect_attention_memory_bound,
    detect_kv_layout,
    detect_norm_launch_overhead,
    detect_graph_breaks,
    detect_host_syncs,
    detect_aicpu,
    detect_casts,
    detect_memory_growth,
)


def diagnose(p: Profile, thresholds: Thresholds | None = None) -> list[dict[str, Any]]:
    """Every detector's findings, largest share of the step first.

    Raises ``TypeError`` when ``p`` is not a :class:`Profile` or ``thresholds`` not a
    :class:`Thresholds`, naming what to pass.
    """
    if not isinstance(p, Profile):
        raise TypeError(not_a_profile("diagnose", "its first argument", p))
    if thresholds is not None and not isinstance(thresholds, Thresholds):
        raise TypeError(
            f"diagnose() takes thresholds as pypto_tune.Thresholds, got "
            f"{type(thresholds).__name__}: pass Thresholds(...) or Thresholds.from_pairs([...])"
        )
    th = thresholds or Thresholds()
    found: list[dict[str, Any]] = []
    for detector in DETECTORS:
        found.extend(detector(p, th))
    found.sort(key=lambda f: -f["share"])
    return found
