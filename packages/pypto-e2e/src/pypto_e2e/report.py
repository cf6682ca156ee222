"""The run's human report: pypto-bench's tables plus what the workflow knows around them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .config import RunConfig

log = logging.getLogger(__name__)


def render_markdown(
    data: dict[str, Any],
    smoke: dict[str, Any] | None,
    config: RunConfig,
    *,
    patch: dict[str, Any] | None = None,
    bench_json: Path | None = None,
) -> str:
    """Markdown for ``report.md``; the caller redacts it before it is written."""
    from pypto_bench import report_to_markdown

    lines = ["# pypto end-to-end report", ""]
    lines.append(f"- model: `{config.model_id or config.model_path}`")
    if config.family:
        lines.append(f"- pinned to preset: `{config.family}`")
    removed = (patch or {}).get("removed_auto_map") or []
    if removed:
        shown = ", ".join(f"`{e.get('file')}:{e.get('key')}`" for e in removed)
        lines.append(f"- repo code entries removed by the pin (never run): {shown}")
    trust = (patch or {}).get("trust")
    if trust:
        lines.append(f"- remote code: {trust}")
    lines.append(f"- regime: **{data.get('regime')}**, arms: {', '.join(config.effective_arms)}")
    if smoke:
        lines.append(
            f"- smoke gate: {'passed' if smoke.get('passed') else 'FAILED'}, "
            f"coherence {smoke.get('coherence')}: prompt {smoke.get('prompt')!r} -> {smoke.get('text')!r}"
        )
    if config.fuse:
        ratio = arm_ratio(data, "pypto+graph", "graph")
        lines.append(
            "- fused kernels (pypto+graph vs graph, same run): "
            + (f"{ratio:.3f}x" if ratio is not None else "not available (an arm failed)")
        )
    if bench_json is not None:
        lines.append(f"- bench JSON: `{bench_json}`")
    lines += ["", report_to_markdown(data)]
    return "\n".join(lines) + "\n"


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
