"""Advice: each finding becomes an action with an estimated speedup and its command.

Estimates use Amdahl's law on two measured numbers: the share ``s`` of the step the
problem occupies and the factor ``f`` the fix can give that share
(speedup = 1 / (1 - s + s / f)). Where the fix removes the share outright (host gaps
that capture removes), ``f`` is bounded by what is left: the device's busy time stays.
The basis of every estimate is written next to it.
"""

from __future__ import annotations

import shlex
from typing import Any

from .detect import Thresholds, diagnose
from .records import Profile, not_a_profile
from .summary import HEAVY_OP_PATTERNS, HOST_OVERHEAD_OPS, op_time

__all__ = [
    "CAPTURE_RECOVERY",
    "COMPILE_RECOVERY",
    "advise",
    "amdahl",
    "capture_floor",
    "recovery",
]

#: How much of a host gap graph capture is assumed to remove (the rest: replay launch,
#: input copies). The compare command checks the estimate afterwards.
CAPTURE_RECOVERY = 0.9
#: On CPU the graph arm is torch.compile: the fused operators still run as generated
#: kernels called one by one from the compiled wrapper, so less of their time goes.
COMPILE_RECOVERY = 0.8


def recovery(p: Profile) -> float:
    """Share of the non-kept time the graph arm is assumed to remove on this device."""
    return (
        COMPILE_RECOVERY if str(p.meta.get("device_type") or "cpu") == "cpu" else CAPTURE_RECOVERY
    )


def amdahl(share: float, factor: float) -> float:
    """Whole-step speedup when ``share`` of it becomes ``factor`` times faster."""
    factor = max(factor, 1.0)
    return 1.0 / (1.0 - share + share / factor)


def _model_args(p: Profile, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The profiled run's bench flags (both tools take them), with ``overrides`` applied."""
    cfg = dict(p.meta.get("bench_config") or {})
    cfg.update(overrides)
    args = ["--model-path", str(cfg.get("model_path") or "DIR")]
    for flag, key in (
        ("--regime", "regime"),
        ("--seq", "seq"),
        ("--gen", "gen"),
        ("--batch", "batch"),
        ("--device", "device"),
        ("--dtype", "dtype"),
        ("--attn-implementation", "attn_implementation"),
    ):
        if cfg.get(key) is not None:
            args += [flag, str(cfg[key])]
    if cfg.get("graph_backend") not in (None, "auto"):
        args += ["--graph-backend", str(cfg["graph_backend"])]
    if cfg.get("moe_routing") not in (None, "exact"):
        args += ["--moe-routing", str(cfg["moe_routing"])]
    if cfg.get("trust_remote_code"):
        args.append("--trust-remote-code")
    return cfg, args


def _bench_command(p: Profile, **overrides: Any) -> str:
    cfg, args = _model_args(p, overrides)
    arms = ",".join(cfg.get("arms") or ["eager", "graph"])
    return shlex.join(["pypto-bench", "run", *args, "--arms", arms])


def _tune_command(p: Profile, arm: str, **overrides: Any) -> str:
    _, args = _model_args(p, overrides)
    out = f"profile-{arm.replace('+', '-')}"
    return shlex.join(["pypto-tune", "profile", *args, "--arm", arm, "--out", out])


def _bisect_command(p: Profile) -> str:
    """``pypto-capture bisect`` on the profiled model, device, dtype and attention."""
    cfg = p.meta.get("bench_config") or {}
    copied = {
        "--device": cfg.get("device"),
        "--dtype": cfg.get("dtype"),
        "--attn-implementation": cfg.get("attn_implementation"),
        "--batch-size": cfg.get("batch"),
        "--backend": None if cfg.get("graph_backend") == "auto" else cfg.get("graph_backend"),
    }
    flags = [x for flag, v in copied.items() if v is not None for x in (flag, str(v))]
    model = str(cfg.get("model_path") or "DIR")
    return shlex.join(["pypto-capture", "bisect", "--model-path", model, *flags])


def _plugins(p: Profile) -> list[dict[str, Any]]:
    return list(p.meta.get("kernel_plugins") or [])


def _tile_command(p: Profile, kernel: str) -> str | None:
    """``pypto-tune tile-search KERNEL --shape ...`` at this model's sizes, when a kernel
    plug-in that applies to the model makes ``kernel`` tunable and every size is known."""
    shapes = p.meta.get("model_shapes") or {}
    for plugin in _plugins(p):
        names = (plugin.get("tunables") or {}).get(kernel)
        if names is None:
            continue
        if not all(n in shapes for n in names):
            return None
        spec = ",".join(f"{n}={shapes[n]}" for n in names)
        dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(
            str(p.meta.get("dtype")), "bf16"
        )
        return f"pypto-tune tile-search {kernel} --shape {spec} --dtype {dtype}"
    return None


def capture_floor(p: Profile) -> tuple[float, str]:
    """Time per step that capture keeps, and why.

    On an accelerator the device busy time stays: a graph replays the same kernels and
    removes only the host's launch work. On CPU the "device" is the host, and an
    operator's self time is mostly dispatch unless it is one a compiled graph still
    calls (matmuls, attention, convolutions, embeddings); the rest fuses away.
    """
    busy = float(p.step.get("device_busy_us") or 0.0)
    if str(p.meta.get("device_type") or "cpu") != "cpu":
        return busy, "device busy time: the same kernels replay"
    heavy = sum(
        op_time(o, "cpu")
        for o in p.ops
        if o.name not in HOST_OVERHEAD_OPS and any(k in o.name.lower() for k in HEAVY_OP_PATTERNS)
    )
    return min(heavy, busy), "matmul/attention operators a compiled graph still calls"


def _recommend(p: Profile, f: dict[str, Any]) -> dict[str, Any] | None:
    fix = f["fix"]
    s = float(f["share"])
    step = p.step_us
    rec: dict[str, Any] = {"finding": f["id"], "share": s}
    if fix == "graph_arm":
        floor, why = capture_floor(p)
        replay = float((p.peaks.get("replay") or {}).get("us") or 0.0)
        rec_share = recovery(p)
        left = floor + replay + (1 - rec_share) * max(step - floor, 0.0)
        est = step / left if left > 0 else None
        rec.update(
            id="graph_arm",
            title="run the captured graph arm (pypto-capture): one replay per step, no per-operator launches",
            action="measure and use the graph arm",
            command=_bench_command(p, arms=["eager", "graph"]),
            verify=_tune_command(p, "graph"),
            estimated_speedup=est,
            basis=(
                f"step {step:.0f} us -> {floor:.0f} us that capture keeps ({why}) + "
                f"{replay:.0f} us per replay (measured on a captured probe of this structure) + "
                f"{1 - rec_share:.0%} of the other {max(step - floor, 0.0):.0f} us"
            ),
            applies_when={"arm": ["graph", "pypto+graph"]},
        )
        return rec
    if fix == "fused_capture":
        if str(p.meta.get("device_type") or "cpu") == "cpu" or any(
            x["id"] == "graph_breaks" for x in p.findings
        ):
            # CPU's only capture is already compile (inductor fuses): what is left is the
            # compiled call's guards and wrappers. Graph breaks explain a gap first.
            return None
        rec.update(
            id="fused_capture",
            title="the captured step is still host-bound: fuse before capture (compile, then capture)",
            action=(
                "use --graph-backend fused (inductor fuses operators, then the compiled step "
                "is captured; auto's choice on CUDA) and check the report's backend column"
            ),
            command=_bench_command(p, arms=["eager", "graph"], graph_backend="fused"),
            estimated_speedup=amdahl(s, 1.0 / (1 - CAPTURE_RECOVERY)),
            basis=f"{s:.0%} of the step is host gap; fusion can remove up to {CAPTURE_RECOVERY:.0%} of it",
            applies_when={"arm": ["graph", "pypto+graph"]},
        )
        return rec
    if fix in ("pad_matmul", "matmul_tiles"):
        ev = f["evidence"]
        factor = float(f.get("fix_factor") or 1.0)
        plugins = [pl for pl in _plugins(p) if pl.get("tunables")]
        dims = ev["batch_M_N_K"]
        if fix == "pad_matmul":
            mis = ", ".join(f"{k}={v}" for k, v in ev["misaligned_dims"].items())
            action = (
                f"pad {mis} to a multiple of {ev['alignment']} (weights padded once at load; "
                "outputs sliced), or choose tile shapes that divide them"
            )
        else:
            action = "search tile shapes for this matmul in the project's PyPTO kernels"
        command = (
            _tile_command(p, "swiglu_mlp") if any(".mlp" in w for w in f.get("where", [])) else None
        )
        if plugins and command is None:
            command = _tile_command(p, next(iter(plugins[0]["tunables"])))
        rec.update(
            id=f"matmul:{dims[1]}x{dims[3]}x{dims[2]}",
            title=f.get("title", "matmul efficiency"),
            action=action,
            command=command,
            estimated_speedup=amdahl(s, factor),
            basis=(
                f"{s:.1%} of the step at {ev['efficiency']:.0%} efficiency, raised to the "
                f"{p.meta.get('thresholds', {}).get('matmul_efficiency', 0.6):.0%} threshold"
            ),
            applies_when={"changed": "modeling or kernel tiles"},
        )
        return rec
    if fix == "fused_attention":
        rec.update(
            id="fused_attention",
            title="attention is memory-bound: use a fused attention implementation",
            action="switch attention to SDPA (or a fused PyPTO decode-attention kernel where a plug-in applies)",
            command=_bench_command(p, attn_implementation="sdpa"),
            verify=_tune_command(p, str(p.meta.get("arm", "eager")), attn_implementation="sdpa"),
            estimated_speedup=amdahl(s, 2.0),
            basis=f"{s:.0%} of the step; a fused kernel reads K/V once (bound 2x on that share)",
            applies_when={"attn_implementation": "sdpa"},
        )
        return rec
    if fix == "kv_layout":
        factor = float(f.get("fix_factor") or 1.0)
        rec.update(
            id="kv_layout",
            title="store the KV cache head-major ([B, H, S, D]) instead of transposing it every step",
            action=(
                "keep the cache in the layout attention reads (pypto-capture's static cache is "
                "head-major: the graph arm uses it), or change the modeling's cache update"
            ),
            command=_bench_command(p, arms=["eager", "graph"]),
            verify=_tune_command(p, "graph"),
            estimated_speedup=amdahl(s, factor),
            basis=f"{s:.1%} of the step in cache copies; head-major measured {factor:.2f}x faster here",
            applies_when={"arm": ["graph", "pypto+graph"]},
        )
        return rec
    if fix == "fuse_norm":
        factor = float(f.get("fix_factor") or 1.0)
        norm_plugins = [pl["name"] for pl in _plugins(p)]
        if norm_plugins:
            action = (
                f"switch on the fused PyPTO RMSNorm ({', '.join(norm_plugins)}) "
                "in the pypto+graph arm"
            )
            arms = ["eager", "graph", "pypto+graph"]
            applies = ["pypto+graph"]
        elif any(x["fix"] == "graph_arm" for x in p.findings):
            return None  # the norms' launches are part of the host gap the graph arm removes
        else:
            action = (
                "capture the step (the graph arm) so the norms' launches are replayed, not issued"
            )
            arms = ["eager", "graph"]
            applies = ["graph", "pypto+graph"]
        rec.update(
            id="fuse_norm",
            title="norms are launch-bound: fuse or capture them",
            action=action,
            command=_bench_command(p, arms=arms),
            tile_search=_tile_command(p, "rms_norm"),
            estimated_speedup=amdahl(s, factor),
            basis=f"{s:.0%} of the step in norms of {factor:.0f} operators each; fused: one launch per call",
            applies_when={"arm": applies},
        )
        return rec
    if fix == "remove_graph_breaks":
        rec.update(
            id="remove_graph_breaks",
            title="remove the graph breaks / recompiles (each break returns to Python)",
            action="find the first cause with `pypto-capture bisect` and `pypto-capture explain`; "
            "see the reasons in the evidence",
            command=_bisect_command(p),
            estimated_speedup=amdahl(s, 1.0 / (1 - CAPTURE_RECOVERY)),
            basis=f"{s:.0%} of the step is host time outside compiled code",
            applies_when={"changed": "modeling"},
        )
        return rec
    if fix == "remove_sync":
        rec.update(
            id="remove_sync",
            title="remove the host syncs inside the model's forward",
            action="keep the value on the device (no .item()/.tolist()/nonzero in the step): "
            + ", ".join(f["where"][:4]),
            command=None,
            estimated_speedup=amdahl(s, 10.0),
            basis=f"{s:.1%} of the step inside sync operators (on CPU this is their own time; "
            "on an accelerator the pipeline drain adds to it)",
            applies_when={"changed": "modeling"},
        )
        return rec
    if fix == "aicpu":
        rec.update(
            id="aicpu",
            title="operators fall back to the AI CPU",
            action="check dtypes/shapes against the AI Core operator's support; cast or reshape so the AI Core version runs",
            command=None,
            estimated_speedup=amdahl(s, 5.0),
            basis=f"{s:.1%} of the step on the AI CPU (AI Core versions are typically several times faster)",
            applies_when={"changed": "modeling"},
        )
        return rec
    if fix == "casts":
        rec.update(
            id="casts",
            title="dtype casts inside the step",
            action="keep the step in one dtype (load the weights in it; upcast only where precision needs it)",
            command=_bench_command(p, dtype="bfloat16")
            if p.meta.get("device_type") != "cpu"
            else None,
            estimated_speedup=amdahl(s, 10.0),
            basis=f"{s:.1%} of the step in casts",
            applies_when={"changed": "dtype or modeling"},
        )
        return rec
    if fix == "memory_growth":
        rec.update(
            id="memory_growth",
            title="memory grows between steps (dynamic shapes reach the allocator)",
            action="use the static cache / graph arm; check the bench report's reserved_growth",
            command=_bench_command(p, arms=["eager", "graph"]),
            estimated_speedup=None,
            basis="no time estimate: growth costs memory, not time, until it fails",
            applies_when={"arm": ["graph", "pypto+graph"]},
        )
        return rec
    return None


def advise(
    p: Profile, thresholds: Thresholds | None = None, *, npu_output: str | None = None
) -> Profile:
    """Diagnose ``p`` and fill ``findings`` and ``recommendations`` (best estimate first).

    On NPU profiles, where ``npu_output`` (the ``*_ascend_pt`` folder) is given (or the
    profile was recorded in this process and names its folder), the
    flagged matmuls also get an operator-tuning configuration and msprof-analyze's
    advisor runs on the same data where it is installed, its findings merged with
    their source named.
    """
    if not isinstance(p, Profile):
        raise TypeError(not_a_profile("advise", "its first argument", p))
    th = thresholds or Thresholds()
    p.findings = diagnose(p, th)
    p.meta["thresholds"] = th.to_dict()
    recs = []
    for f in p.findings:
        rec = _recommend(p, f)
        if rec is not None:
            recs.append(rec)
    merged: dict[str, dict[str, Any]] = {}
    for rec in recs:  # one recommendation per action, the larger estimate kept
        key = rec["id"]
        if key not in merged or (rec.get("estimated_speedup") or 0) > (
            merged[key].get("estimated_speedup") or 0
        ):
            merged[key] = rec
    p.recommendations = sorted(merged.values(), key=lambda r: -(r.get("estimated_speedup") or 0))
    # A profile read back from JSON names a folder nobody checked: only a profile recorded
    # in this process (its raw trace in memory) or an explicit npu_output is written to.
    folder = npu_output or (p.meta.get("profiler_output") if p.trace is not None else None)
    if p.meta.get("device_type") == "npu" and folder:
        _npu_extras(p, str(folder))
    return p


def _mm_shapes(dims: list[int] | None) -> list[list[int]] | None:
    if not dims:
        return None
    b, m, n, k = dims
    return [[b, m, k], [b, k, n]] if b > 1 else [[m, k], [k, n]]


def _npu_extras(p: Profile, folder: str) -> None:
    from pathlib import Path

    from . import npu

    flagged = [
        {
            "name": f["evidence"].get("op"),
            "shapes": _mm_shapes(f["evidence"].get("batch_M_N_K")),
            "dtype": p.meta.get("dtype"),
        }
        for f in p.findings
        if f["id"] == "matmul_efficiency"
    ]
    if flagged:
        cfg = npu.operator_tuning_config(flagged, Path(folder) / "pypto_tune_op_tuning.cfg")
        p.meta["operator_tuning_config"] = str(cfg)
    advisor = npu.run_msprof_advisor(folder)
    p.meta["msprof_advisor"] = advisor
    for item in advisor.get("findings", []) if isinstance(advisor, dict) else []:
        p.findings.append({**item, "id": "msprof_advisor", "share": 0.0, "fix": "msprof"})
