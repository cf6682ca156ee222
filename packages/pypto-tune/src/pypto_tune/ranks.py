"""Profiles per rank: ``pypto-tune profile --nproc N`` (and ``--nnodes``).

A multi-rank step is as slow as its slowest rank, and the others spend the difference
waiting inside collectives; one rank's profile cannot show that. So every rank keeps the
step it profiles for its communication figures (pypto-bench's ranks do the measuring:
:mod:`pypto_bench.multi.comm`), all under one parent folder in the layout the field's
cluster tools read, and this module summarises them side by side:

* ``<out>/ranks/<arm>/``: on NPU each rank's torch_npu ``*_ascend_pt`` folder (the folder
  msprof-analyze's cluster analysis takes), elsewhere ``rank<R>.trace.json`` per rank
  (Chrome traces with torch's ``distributedInfo``; open one in Perfetto);
* ``<out>/ranks.json`` / ``ranks.md``: per rank the timed step (median of the run's
  iterations), the profiled step split into time inside collectives and the rest; the
  slowest rank, the straggler (most time outside collectives: the rank the others wait
  for) and the imbalance between ranks;
* ``<out>/report.json``: the bench report of the run (every rank's figures).

The 1-rank baseline of ``--nproc`` is not run (a profile is about the ranks). A node of
``--nnodes`` that did not run rank 0 keeps its own ranks' profiles and writes no summary
(the node that ran rank 0 gathers every rank's figures).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pypto_common import atomic_write_text, redact_obj

from .errors import BadInputError, OutputWriteError, ProfileFormatError, from_bench_error

__all__ = [
    "RANKS_SCHEMA",
    "RankProfiles",
    "profile_ranks",
    "rank_summary",
    "ranks_markdown",
]

log = logging.getLogger(__name__)

#: The summary's schema tag (``ranks.json``).
RANKS_SCHEMA = "pypto-tune.ranks/1"
#: A kept profile is linked by name, never read back: the name is checked (length, no path).
_MAX_NAME = 255


class RankProfiles:
    """What ``profile_ranks`` produced on this node: the summary (None where rank 0 ran
    on another node), the folder of per-rank profiles, the files written."""

    def __init__(
        self, summary: dict[str, Any] | None, folder: Path, written: dict[str, str]
    ) -> None:
        self.summary = summary
        self.folder = folder
        self.written = written


def _on_cpu(device: Any) -> bool:
    """Whether ``device`` (``cpu``, ``auto``, ``cuda:0``, ...) is this machine's CPU."""
    try:
        from pypto_capture import resolve_device

        return resolve_device(device).type == "cpu"
    except Exception:  # a device that is not here: the run's own check names it
        return False


def profile_ranks(
    config: Any,
    *,
    arm: str,
    out: Path,
    progress: Callable[[str, int, int], None] | None = None,
) -> RankProfiles:
    """Run ``config`` (``--nproc`` > 1 or ``--nnodes`` > 1) with every rank keeping its
    profiled step under ``out/ranks``; write the summary on the node that ran rank 0.

    Raises pypto-tune's errors: ``BadInputError`` for a request a multi-rank profile cannot
    take, ``ProfileFailedError`` when a rank failed (every rank ended), ``OutputWriteError``
    when ``out`` cannot be written."""
    import pypto_bench

    if config.placement != "tensor":
        raise BadInputError(
            "per-rank profiles are of tensor-parallel ranks; --placement pipeline runs in "
            "one process: profile it without --nproc"
        )
    if arm == "graph" and _on_cpu(config.device):
        # Refused before anything is written: the run would end with no per-rank profile
        # and a summary naming a ranks/graph/ folder that was never made.
        raise BadInputError(
            "--arm graph keeps no per-rank profile on a CPU (torch.profiler over the "
            "compiled step with gloo collectives in flight can crash a rank): profile --arm "
            "eager here, or the graph arm on CUDA / NPU"
        )
    folder = out / "ranks"
    for made in (folder, folder / arm):
        if made.is_symlink() or (made.exists() and not made.is_dir()):
            # Created, never followed: a link planted at DIR/ranks (or DIR/ranks/<arm>,
            # where the ranks write) sent the per-rank traces to a folder outside --out.
            raise BadInputError(
                f"{made} is {'a symbolic link' if made.is_symlink() else 'not a folder'}: "
                "pypto-tune creates its folders and never follows one; remove it or name "
                "another --out"
            )
    run = replace(
        config,
        arms=(arm,),
        rank_profiles=str(folder),
        report_file=str(out / "report.json"),
        nproc_baseline=False,
    )
    try:
        run.validate()  # a bad request is refused before anything is written
    except pypto_bench.BenchError as err:
        raise from_bench_error(err) from err
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputWriteError(
            f"cannot create {folder} ({err.strerror or err}): name a writable folder with --out"
        ) from None
    try:
        if run.nnodes > 1:
            from pypto_bench.multi import run_node

            report = run_node(run, validated=True)
        else:
            report = pypto_bench.run_bench(run, progress=progress)
    except pypto_bench.BenchError as err:
        raise from_bench_error(err) from err
    if report is None:
        return RankProfiles(None, folder, {"ranks": str(folder)})
    summary = rank_summary(report.to_dict(), folder)
    written = {"ranks": str(folder), "report": str(out / "report.json")}
    for name, text in (
        ("ranks.json", json.dumps(redact_obj(summary), indent=1)),
        ("ranks.md", ranks_markdown(summary)),
    ):
        try:
            atomic_write_text(out / name, text + "\n")
        except OSError as err:
            raise OutputWriteError(
                f"cannot write {out / name} ({err.strerror or err}): free space or name "
                "another folder with --out"
            ) from None
        written[name] = str(out / name)
    return RankProfiles(summary, folder, written)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def _rank(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any, limit: int) -> str | None:
    """A name from the report as one line, clipped (None when empty)."""
    text = " ".join(str(value or "").split())[:limit]
    return text or None


def _kept(folder: Path, arm: str, name: Any) -> str | None:
    """The rank's kept profile as a path relative to ``folder``'s parent, if it is a plain
    name of a file or folder inside the arm's folder (the report is read back from disk:
    a name is never followed out of the folder)."""
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        return None
    if name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        return None
    path = folder / arm / name
    try:
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            return None
    except OSError:
        return None
    return f"{folder.name}/{arm}/{name}"


def rank_summary(report: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Per rank: the timed step, the profiled step's time inside and outside collectives,
    its kept profile; then the slowest rank, the straggler and the imbalance.

    ``report`` is pypto-bench's report (a dict) of a multi-rank run of one arm; every
    figure is read defensively (a report file can be edited): a missing or non-numeric
    figure is None, never a guess."""
    dist = report.get("distributed")
    if not isinstance(dist, dict) or not isinstance(dist.get("ranks"), list):
        raise ProfileFormatError(
            "the bench report has no per-rank figures (distributed.ranks): it is not a "
            "--nproc run; rerun pypto-tune profile with --nproc N"
        )
    arms = report.get("arms") or []
    arm = str(arms[0].get("name")) if arms and isinstance(arms[0], dict) else "eager"
    rows: list[dict[str, Any]] = []
    for entry in dist["ranks"]:
        if not isinstance(entry, dict):
            continue
        step = _number((entry.get("step_s") or {}).get("median"))
        got = entry.get("communication")
        comm: dict[str, Any] = got if isinstance(got, dict) else {}
        inside = _number(comm.get("seconds"))
        profiled = _number(comm.get("step_seconds"))
        outside = profiled - inside if profiled is not None and inside is not None else None
        ops = comm.get("by_op_s")
        by_op: dict[str, Any] = ops if isinstance(ops, dict) else {}
        top = max(
            ((str(k)[:80], v) for k, v in by_op.items() if _number(v) is not None),
            key=lambda kv: kv[1],
            default=None,
        )
        rows.append(
            {
                "rank": _rank(entry.get("rank")),
                "host": _text(entry.get("host"), 80),
                "device": _text(entry.get("device"), 40),
                "step_s": step,
                "profiled_step_s": profiled,
                "collectives_s": inside,
                "outside_collectives_s": outside,
                "collectives_share": inside / profiled if inside is not None and profiled else None,
                "top_collective": top[0] if top else None,
                "unmeasured": str(comm["unmeasured"])[:300] if comm.get("unmeasured") else None,
                "profile": _kept(folder, arm, comm.get("profile")),
            }
        )
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0))

    def extreme(key: str) -> dict[str, Any] | None:
        have = [r for r in rows if r[key] is not None]
        return max(have, key=lambda r: r[key]) if have else None

    slowest, straggler = extreme("step_s"), extreme("outside_collectives_s")
    spent = [float(r["outside_collectives_s"]) for r in rows if r["outside_collectives_s"]]
    steps = [float(r["step_s"]) for r in rows if r["step_s"]]
    return {
        "schema": RANKS_SCHEMA,
        "arm": arm,
        "regime": (report.get("config") or {}).get("regime"),
        "device_type": dist.get("device_type"),
        "backend": dist.get("backend"),
        "nodes": dist.get("nodes"),
        "ranks": rows,
        "slowest_rank": slowest["rank"] if slowest else None,
        "straggler_rank": straggler["rank"] if straggler else None,
        # max / median over ranks: 1.0 is perfectly even.
        "step_imbalance": max(steps) / statistics.median(steps) if steps else None,
        "compute_imbalance": max(spent) / statistics.median(spent) if spent else None,
        "layout": (
            "one torch_npu *_ascend_pt folder per rank (msprof-analyze cluster input)"
            if dist.get("device_type") == "npu"
            else "one Chrome trace per rank, rank<R>.trace.json (torch distributedInfo)"
        ),
        "profiles": f"{folder.name}/{arm}",
    }


def _cell(text: str, limit: int = 80) -> str:
    """One table cell: one line, pipes escaped, clipped (host names come from peers)."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1e3 * value:.2f}"


def ranks_markdown(summary: dict[str, Any]) -> str:
    """The summary for a person: the table, then who the others wait for, and why."""
    lines = [
        f"# Per-rank profile: {summary['arm']} arm, {len(summary['ranks'])} ranks "
        f"({summary.get('backend')}, {summary.get('device_type')})",
        "",
        "| rank | host | step ms (timed, median) | profiled step ms | in collectives ms | "
        "share | outside ms | top collective | profile |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in summary["ranks"]:
        share = "-" if r["collectives_share"] is None else f"{100 * r['collectives_share']:.0f}%"
        lines.append(
            f"| {r['rank']} | {_cell(r['host'] or '-')} | {_ms(r['step_s'])} | "
            f"{_ms(r['profiled_step_s'])} | {_ms(r['collectives_s'])} | {share} | "
            f"{_ms(r['outside_collectives_s'])} | {_cell(r['top_collective'] or '-')} | "
            f"{_cell(r['profile'] or '-')} |"
        )
    lines.append("")
    if summary["straggler_rank"] is not None:
        lines.append(
            f"Straggler: rank {summary['straggler_rank']} spends the most time outside "
            "collectives in the profiled step; the other ranks wait for it inside theirs "
            f"(compute imbalance, max / median: {summary['compute_imbalance']:.2f})."
        )
    if summary["slowest_rank"] is not None:
        lines.append(
            f"Slowest timed step: rank {summary['slowest_rank']} (max / median over ranks: "
            f"{summary['step_imbalance']:.2f}); a collective step ends when its slowest rank "
            "does."
        )
    for r in summary["ranks"]:
        if r["unmeasured"]:
            lines.append(f"Rank {r['rank']}: no profile kept: {_cell(r['unmeasured'])}.")
    lines += ["", f"Profiles: `{summary['profiles']}/` ({summary['layout']})."]
    return "\n".join(lines)
