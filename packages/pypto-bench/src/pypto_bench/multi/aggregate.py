"""A multi-device run's report from what the ranks measured: per arm the collective step
(a step ends when its slowest rank does), the 1-rank baseline, speedup and scaling
efficiency, the agreement of the outputs with the baseline's, every rank's figures, and
the noise guard's verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._shared import spread
from .arms import Measured

if TYPE_CHECKING:
    from ..config import BenchConfig
    from ..report import ArmResult, Report

__all__ = [
    "LOGITS_ATOL",
    "LOGITS_EPS_FACTOR",
    "NO_BASELINE_FIGURES",
    "add_arm",
    "aggregate_arm",
    "build_report",
]

#: Max |logit difference| accepted between the sharded and the single-process prefill.
LOGITS_ATOL = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 5e-2}
#: ... or this many machine epsilons of the largest |logit|, whichever is larger. A
#: half-precision run rounds every row-parallel partial sum before the all-reduce, so the
#: sharded logits differ from the 1-rank ones by a few units in the last place of the
#: largest logit; an absolute bound alone fails whenever the logits are large. (The tiny
#: bf16 MiniMax M2.7 folder: logits up to 11.7, bf16 eps 2**-7, sharded vs 1-rank 0.153,
#: while the 1-rank bf16 run itself is 0.120 off the float32 result, the sharded one 0.109:
#: rounding, not a sharding error; its float32 folder agrees to 7e-6.)
LOGITS_EPS_FACTOR = 4.0
_EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
NO_BASELINE_FIGURES = "no speedup, scaling efficiency or agreement figures"


def build_report(
    config: BenchConfig,
    spec: dict[str, Any],
    device: Any,
    runs: dict[str, Measured],
    baselines: dict[str, Measured] | None,
    gathered: list[dict[str, Any]],
    load: dict[str, Any] | None = None,
    *,
    skipped: str | None = None,
) -> dict[str, Any]:
    """Rank 0: per arm the aggregate figures, baseline, scaling and agreement; every rank's
    figures; the noise guard's verdict on the aggregate arms and the 1-rank baselines.

    The first arm's figures stay at the top of ``distributed`` (and of each rank's entry);
    ``distributed["arms"]`` holds every arm's."""
    from dataclasses import replace

    from pypto_capture import device_name

    from ..report import new_report

    report = new_report(
        replace(config, command_line=spec["command_line"]),
        device=device,
        device_name=device_name(device),
    )
    first = config.arms[0]
    report.model = runs[first].model_info
    # The order every rank ran its arms' timed iterations in (multi.arms.measure_arms).
    report.schedule = spec.get("schedule")
    per_arm: dict[str, dict[str, Any]] = {}
    for name in config.arms:
        ranks = [g[name] for g in gathered]
        base = baselines[name] if baselines is not None else None
        arm, figures = aggregate_arm(config, name, runs[name], base, ranks, skipped)
        per_arm[name] = figures
        add_arm(report, arm, figures, f"{name} on {len(gathered)} ranks")
    if skipped:
        report.warnings.append(f"1-rank baseline skipped ({skipped}): {NO_BASELINE_FIGURES}")
    # pypto_bench.noise over the collective steps and the 1-rank baselines (a noisy
    # baseline marks that arm's scaling efficiency untrustworthy), the load over both runs.
    from ..noise import guard

    guard(report, load, baselines=[baselines[n].arm for n in config.arms] if baselines else [])
    ranks_out = []
    for g in gathered:
        entry = dict(g[first])
        entry["arms"] = {n: g[n] for n in config.arms if n != first}
        ranks_out.append(entry)
    report.distributed = {
        "nproc": len(gathered),  # every rank, on every node
        # Hosts the ranks ran on and the ranks each started (--nnodes N x --nproc K, or
        # the user's launcher's world).
        "nodes": int(spec.get("nodes", 1)),
        "nnodes": int(spec.get("nnodes", 1)),
        "nproc_per_node": config.nproc if spec.get("nnodes", 1) != 1 else len(gathered),
        # Interfaces / ports the collectives were told to use (multi-node runs).
        **({"comm_env": spec["comm_env"]} if "comm_env" in spec else {}),
        "placement": "tensor",
        "device_type": spec["device_type"],
        "backend": spec["backend"],
        "threads_per_rank": spec["threads"],
        "launcher": spec.get(
            "launcher",
            "torch.distributed.launcher.api.elastic_launch (c10d rendezvous on 127.0.0.1)",
        ),
        "tp_plan": spec["plan"],
        **per_arm[first],
        "ranks": sorted(ranks_out, key=lambda r: r["rank"]),
        "arms": per_arm,
    }
    report.finish()
    return report.to_dict()


def add_arm(report: Report, arm: ArmResult, figures: dict[str, Any], where: str) -> None:
    """Append an aggregated arm; a disagreement with the 1-rank run is a warning on both."""
    report.arms.append(arm)
    if figures["agreement"]["ok"] is False:
        msg = f"{where}: {figures['agreement']['summary']}"
        arm.warnings.append(msg)
        report.warnings.append(msg)


def aggregate_arm(
    config: BenchConfig,
    name: str,
    run: Measured,
    baseline: Measured | None,
    ranks: list[dict[str, Any]],
    skipped: str | None = None,
) -> tuple[ArmResult, dict[str, Any]]:
    """One arm across ranks: a collective step ends when its slowest rank does."""
    from ..measure import summarize, summarize_seconds
    from ..report import ArmResult

    n_iter = len(run.figures["samples_s"])
    step = [max(r["samples_s"][i] for r in ranks) for i in range(n_iter)]
    tokens = run.figures["tokens_per_iter"]
    arm = ArmResult(name=name)
    arm.seconds = summarize_seconds(step)
    arm.tokens_per_s = summarize(
        [t / s if s > 0 else 0.0 for t, s in zip(tokens, step, strict=True)]
    )
    arm.tokens_per_iter = list(tokens)
    arm.memory = run.arm.memory
    arm.details = dict(run.arm.details)
    arm.details["ranks"] = len(ranks)  # the world (--nproc per node x --nnodes)
    arm.numerics = run.arm.numerics  # rank 0's verdict against the 1-rank reference
    arm.outputs_differ_by_design = run.arm.outputs_differ_by_design
    if config.regime == "decode":
        arm.ttft_s = summarize_seconds(
            [max(r["ttft_s"][i] for r in ranks) for i in range(len(run.figures["ttft_s"]))]
        )
    if baseline is None:
        agreement: dict[str, Any] = {
            "ok": None,
            "compared": None,
            "summary": f"not compared: {skipped or 'no 1-rank run'}",
        }
        return arm, {
            "aggregate_tokens_per_s": arm.tokens_per_s,
            "step_s": spread(step),
            "communication_share": spread(_shares(ranks)),
            "baseline": None,
            "baseline_skipped": skipped or "no 1-rank run",
            "speedup": None,
            "scaling_efficiency": None,
            "agreement": agreement,
            **_capture_figures(name, arm),
        }
    agreement = _agreement(config, run, baseline)
    arm.token_match = agreement.get("token_match")
    base_best = baseline.arm.tokens_per_s.get("best")
    best = arm.tokens_per_s.get("best")
    speedup = best / base_best if best and base_best else None
    wrong = (arm.numerics or {}).get("verdict") == "fail"
    if wrong:  # a speedup of an arm that computes something else is no speedup
        speedup = None
    figures: dict[str, Any] = {
        "aggregate_tokens_per_s": arm.tokens_per_s,
        "step_s": spread(step),
        "communication_share": spread(_shares(ranks)),
        "baseline": {
            "nproc": 1,
            "device": str(run.model_info.get("device") or ranks[0].get("device")),
            "tokens_per_s": baseline.arm.tokens_per_s,
            "seconds": baseline.arm.seconds,
            "memory": baseline.arm.memory,
        },
        "speedup": speedup,
        "scaling_efficiency": speedup / len(ranks) if speedup is not None else None,
        "agreement": agreement,
        **({"not_comparable": "numerics FAIL against the 1-rank run"} if wrong else {}),
        **_capture_figures(name, arm),
    }
    return arm, figures


def _shares(ranks: list[dict[str, Any]]) -> list[float]:
    return [
        float((r.get("communication") or {})["share"])
        for r in ranks
        if (r.get("communication") or {}).get("share") is not None
    ]


def _capture_figures(name: str, arm: ArmResult) -> dict[str, Any]:
    if name != "graph":
        return {}
    capture: dict[str, Any] = {
        k: arm.details.get(k) for k in ("backend", "capture_s") if k in arm.details
    }
    if str(capture.get("backend", "")).startswith(("compile", "fused")):
        capture["freezing"] = False
    return {"capture": capture}


def _agreement(config: BenchConfig, run: Measured, baseline: Measured) -> dict[str, Any]:
    """The sharded outputs against the 1-rank run's: prefill logits within a tolerance
    (and their argmax tokens), decode tokens equal."""
    from ..measure import count_tokens, match_rate

    ref, got = baseline.output, run.output
    if config.regime == "prefill":
        dtype = str(run.model_info.get("dtype"))
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        atol = max(LOGITS_ATOL.get(dtype, 5e-2), LOGITS_EPS_FACTOR * _EPS.get(dtype, 0.0) * scale)
        diff = float((ref - got).abs().max()) if ref.shape == got.shape else float("inf")
        ok = diff <= atol
        n = [ref.shape[1]] * ref.shape[0]
        match = match_rate(ref.argmax(-1), got.argmax(-1), n, n)
        return {
            "compared": "prefill logits vs the 1-rank run",
            "max_abs_diff": diff,
            "atol": atol,
            "atol_rule": (
                f"max({LOGITS_ATOL.get(dtype, 5e-2):g}, {LOGITS_EPS_FACTOR:g} x {dtype} eps x "
                f"max |logit| {scale:.3g})"
            ),
            "ok": ok,
            "token_match": match,
            "summary": f"prefill logits differ from the 1-rank run by {diff:.3g} (atol {atol:g})",
        }
    eos = run.ctx.eos_ids if run.ctx is not None else []
    match = match_rate(ref, got, count_tokens(ref, eos), count_tokens(got, eos))
    rate = match.get("rate")
    return {
        "compared": "greedy decode tokens vs the 1-rank run",
        "ok": rate == 1.0,
        "token_match": match,
        "summary": f"decode tokens match the 1-rank run at {rate}",
    }
