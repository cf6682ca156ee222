"""The run's human report: pypto-bench's tables plus what the workflow knows around them."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from .config import RunConfig

__all__ = [
    "arm_ratio",
    "model_lines",
    "render_markdown",
    "render_remote_markdown",
    "tuning_section",
    "write_plot",
]

log = logging.getLogger(__name__)


def render_markdown(
    data: dict[str, Any],
    smoke: dict[str, Any] | None,
    config: RunConfig,
    *,
    patch: dict[str, Any] | None = None,
    bench_json: Path | None = None,
    tune: dict[str, Any] | None = None,
    report_dir: Path | None = None,
) -> str:
    """Markdown for ``report.md``; the caller redacts it before it is written.

    ``tune`` is the tune step's outputs (``--tune``); its files are linked relative to
    ``report_dir`` so the report folder can be moved or archived as a whole.
    """
    from pypto_bench import report_to_markdown

    lines = ["# pypto end-to-end report", ""]
    lines += model_lines(config, patch)
    lines.append(f"- regime: **{data.get('regime')}**, arms: {', '.join(config.effective_arms)}")
    lines += _smoke_lines(smoke)
    if config.fuse:
        ratio = arm_ratio(data, "pypto+graph", "graph")
        lines.append(
            "- fused kernels (pypto+graph vs graph, same run): "
            + (f"{ratio:.3f}x" if ratio is not None else "not available (an arm failed)")
        )
    if "hf-compile" in config.effective_arms:
        ratio = arm_ratio(data, "graph", "hf-compile")
        lines.append(
            "- graph vs hf-compile (transformers' static cache + torch.compile, same run): "
            + (f"{ratio:.3f}x" if ratio is not None else "not available (an arm failed)")
        )
    if bench_json is not None:
        lines.append(f"- bench JSON: `{bench_json}`")
    lines += ["", report_to_markdown(data)]
    if tune and tune.get("files"):
        lines += ["", *tuning_section(tune, report_dir)]
    return "\n".join(lines) + "\n"


def model_lines(config: RunConfig, patch: dict[str, Any] | None) -> list[str]:
    """The report's first lines: the model, its pin and the remote-code decision."""
    lines = [f"- model: `{config.model_id or config.model_path}`"]
    if config.family:
        lines.append(f"- pinned to preset: `{config.family}`")
    removed = (patch or {}).get("removed_auto_map") or []
    if removed:
        shown = ", ".join(f"`{e.get('file')}:{e.get('key')}`" for e in removed)
        lines.append(f"- repo code entries removed by the pin (never run): {shown}")
    trust = (patch or {}).get("trust")
    if trust:
        lines.append(f"- remote code: {trust}")
    return lines


def _smoke_lines(smoke: dict[str, Any] | None) -> list[str]:
    if not smoke:
        return []
    return [
        f"- smoke gate: {'passed' if smoke.get('passed') else 'FAILED'}, "
        f"coherence {smoke.get('coherence')}: prompt {smoke.get('prompt')!r} -> {smoke.get('text')!r}"
    ]


def render_remote_markdown(
    smoke: dict[str, Any] | None,
    config: RunConfig,
    *,
    patch: dict[str, Any] | None = None,
    node_figures: str | None = None,
) -> str:
    """``report.md`` of a node of ``--nnodes N`` that did not run rank 0: what ran here and
    where the bench report is. No figures: this node's ranks' figures are in that report
    (and in ``node_figures``, the file pypto-bench kept of them here, when given)."""
    b = config.bench
    node = "This node" if b.node_rank is None else f"This node (`--node-rank {b.node_rank}`)"
    lines = ["# pypto end-to-end report (one node of a multi-node run)", ""]
    lines += model_lines(config, patch)
    lines.append(f"- regime: **{b.regime}**, arms: {', '.join(config.effective_arms)}")
    lines += _smoke_lines(smoke)
    lines += [
        f"- bench: {b.nnodes} nodes x {b.nproc} ranks, rendezvous `{b.rdzv_endpoint}` "
        f"(id `{b.rdzv_id or 'pypto-bench'}`)",
        "",
        "## Where the report is",
        "",
        f"{node} ran {b.nproc} of the bench's {b.nnodes * b.nproc} ranks; their figures "
        "went to rank 0. The report is on the node that ran rank 0 (the rendezvous assigns "
        "it, whatever `--node-rank` says): `report/bench.json` and `report/report.md` in that "
        "node's work dir, the path its `pypto-e2e run` printed as `PYPTO_REPORT`.",
    ]
    if node_figures:
        lines += [
            "",
            f"This node's own ranks' figures (step times, communication, memory): "
            f"{_code(node_figures)}.",
        ]
    return "\n".join(lines) + "\n"


def _code(text: str) -> str:
    """``text`` as one inline code span, whatever backticks it holds (a path may have some)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _link(path: str, report_dir: Path | None) -> str:
    target = Path(path)
    if report_dir is not None:
        try:
            target = Path(os.path.relpath(target, report_dir))
        except ValueError:  # another drive: keep the absolute path
            pass
    shown = target.as_posix()
    # Angle brackets keep spaces and parentheses in a path part of the link target.
    return f"[{shown}](<{shown}>)"


def tuning_section(tune: dict[str, Any], report_dir: Path | None = None) -> list[str]:
    """The "Tuning" section: the profiled step time, the best advice and the files."""
    files = tune.get("files") or {}
    step_us = tune.get("step_us") or 0.0
    unit = tune.get("step_unit") or "step"
    lines = [
        "## Tuning",
        "",
        f"pypto-tune profiled the **{tune.get('arm')}** arm ({tune.get('level')} level): "
        f"**{step_us / 1000:.2f} ms** per {unit}.",
        "",
    ]
    recs = tune.get("recommendations") or []
    if recs:
        lines += ["Top recommendations (estimated whole-step speedup):", ""]
        for i, rec in enumerate(recs, 1):
            est = rec.get("estimated_speedup")
            est_text = f"~{est:.2f}x" if isinstance(est, (int, float)) and est else "not estimated"
            lines.append(f"{i}. **{rec.get('title')}** ({est_text}, {_code(str(rec.get('id')))})")
            if rec.get("command"):
                lines.append(f"   - command: {_code(str(rec['command']))}")
    else:
        lines.append("No finding above pypto-tune's thresholds: no recommendation.")
    lines += [""]
    if files.get("markdown"):
        lines.append(
            f"- profile: {_link(files['markdown'], report_dir)} (findings, thresholds, evidence)"
        )
    if files.get("trace"):
        lines.append(
            f"- trace: {_link(files['trace'], report_dir)} (open in https://ui.perfetto.dev)"
        )
    if files.get("plot"):
        lines.append(f"- time by block: {_link(files['plot'], report_dir)}")
    if files.get("profile"):
        lines.append(f"- profile JSON: {_link(files['profile'], report_dir)}")
    return lines


def arm_ratio(data: dict[str, Any], num: str, den: str) -> float | None:
    """Best tokens/s of arm ``num`` over arm ``den``; None when either is missing."""
    arms = {a.get("name"): a for a in data.get("arms", [])}
    try:
        a = arms[num]["tokens_per_s"]["best"]
        b = arms[den]["tokens_per_s"]["best"]
    except (KeyError, TypeError):
        return None
    return float(a / b) if a and b else None


def write_plot(data: dict[str, Any], path: Path) -> bool:
    """The tokens/s chart; a missing matplotlib or a failed write leaves the report useful."""
    from pypto_bench import EnvironmentMissingError, plot

    try:
        plot([data], path)
    except EnvironmentMissingError as err:
        log.warning("plot not written: %s", err)
        return False
    except OSError as err:
        log.warning("plot not written to %s: %s", path, err.strerror or err)
        return False
    return path.exists()
