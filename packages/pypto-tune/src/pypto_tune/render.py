"""The small pieces every rendering of a profile shares (Markdown, the HTML page).

Kept apart from :mod:`.outputs` (which writes the files) so the HTML renderer can use
them while ``write_outputs`` uses the renderer: no import cycle.
"""

from __future__ import annotations

import math
from typing import Any

from .records import Profile

__all__ = ["attribution_line", "clip", "layer_times", "us_text"]


def clip(text: str, limit: int = 160) -> str:
    """``text`` on one line, at most ``limit`` characters (``...`` where cut)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def us_text(v: float | None) -> str:
    """``1.23 ms`` / ``45.6 us``: a time per step as every rendering writes it."""
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} us"


def layer_times(p: Profile) -> dict[int, float]:
    """Per-step time of each decoder layer (operators attributed to a layer index)."""
    from .summary import op_time

    dev = str(p.meta.get("device_type") or "cpu")
    out: dict[int, float] = {}
    for op in p.ops:
        if isinstance(op.layer, int):
            out[op.layer] = out.get(op.layer, 0.0) + op_time(op, dev)
    return out


def attribution_line(a: dict[str, Any]) -> str:
    """One paragraph on how the captured step was attributed (``meta.attribution``; read
    from a file too: every value is checked, every text clipped)."""
    raw = a.get("cost")
    cost: dict[str, Any] = raw if isinstance(raw, dict) else {}
    compile_s = cost.get("compile_s")
    spent = (
        f"; the attribution pass took {compile_s:.1f} s of compiling, outside the profiled steps"
        if isinstance(compile_s, (int, float)) and math.isfinite(compile_s)
        else ""
    )
    if a.get("status") != "ok":
        return (
            f"Not attributed: {clip(str(a.get('why')))}. The captured step is one "
            f"`captured` block{spent}."
        )

    def n(key: str) -> str:
        v = a.get(key)
        return str(v) if isinstance(v, int) else "?"

    return (
        f"Every kernel of the captured step attributed from {clip(str(a.get('source')), 20)} "
        f"provenance: {n('kernels_matched')} kernels over {n('calls')} graph calls, "
        f"{n('fused_across')} fused across modules (split: {clip(str(a.get('split_rule')), 400)}); "
        f"what is left in `captured` ran outside the compiled graph{spent}."
    )
