"""The workflow as resumable steps: download -> patch -> smoke -> precision -> bench -> tune -> report.

Every step is a library call into the package that owns it (:mod:`pypto_e2e.steps`);
this module runs them in order (the run state, :mod:`pypto_e2e.state`, decides what is
reused and records it in the run manifest) and hands the model folder from one step to
the next explicitly (never through ``MODEL_PATH``).
A step is reused only when it completed before *and* its inputs (including the
outputs of the steps it depends on, and a fingerprint of every file of the model
folder) are unchanged; anything else runs again, and so does everything after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import STEPS, RunConfig
from .errors import E2EError
from .manifest import MANIFEST_NAME
from .state import RunState, StepOutcome
from .steps import (
    do_bench,
    do_download,
    do_patch,
    do_precision,
    do_report,
    do_smoke,
    do_tune,
)
from .workdir import held_work_dir

__all__ = ["MANIFEST_NAME", "STEPS", "RunResult", "RunState", "StepOutcome", "run"]


@dataclass
class RunResult:
    work_dir: Path
    model_path: Path | None
    steps: list[StepOutcome]
    report_json: Path | None = None
    report_markdown: Path | None = None
    #: The self-contained page beside report.md (pypto_bench.html_report).
    report_html: Path | None = None
    plot: Path | None = None
    smoke: dict[str, Any] | None = None
    failed_arms: list[str] = field(default_factory=list)
    removed_auto_map: list[dict[str, Any]] = field(default_factory=list)
    remote_code: str = ""
    #: The tune step's files (``profile``, ``markdown``, ``trace``, ``plot``); empty
    #: without ``--tune``.
    tune: dict[str, str] = field(default_factory=dict)
    #: ``--nnodes N`` on a node that did not run rank 0: its ranks are done and the bench
    #: report is on the node that ran rank 0 (``report_json`` is None here, and
    #: ``report_markdown`` says where the report is).
    remote_report: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "work_dir": str(self.work_dir),
            "model_path": str(self.model_path) if self.model_path else None,
            "report_json": str(self.report_json) if self.report_json else None,
            "report_markdown": str(self.report_markdown) if self.report_markdown else None,
            "report_html": str(self.report_html) if self.report_html else None,
            "plot": str(self.plot) if self.plot else None,
            "failed_arms": self.failed_arms,
            "removed_auto_map": self.removed_auto_map,
            "remote_code": self.remote_code,
            "tune": dict(self.tune) or None,
            "remote_report": self.remote_report,
            "steps": [
                {"name": s.name, "status": s.status, "seconds": round(s.seconds, 3), "note": s.note}
                for s in self.steps
            ],
        }


def run(config: RunConfig, *, progress: Callable[[str], None] | None = None) -> RunResult:
    """Run (or resume) the workflow; raises ``E2EError`` naming the failed step."""
    config.validate()
    # Held from before the manifest is read until the run ends: a second run into the
    # same work dir (a resume while a killed run's processes still live, or a twin)
    # stops here in one line instead of running beside it.
    with held_work_dir(Path(config.work_dir).expanduser().resolve()):
        return _run_locked(config, progress)


def _run_locked(config: RunConfig, progress: Callable[[str], None] | None) -> RunResult:
    state = RunState(config, progress)
    try:
        steps = [
            state.run_step("download", do_download),
            state.run_step("patch", do_patch),
            state.run_step("smoke", do_smoke),
            state.run_step("precision", do_precision),
            state.run_step("bench", do_bench),
            state.run_step("tune", do_tune),
            state.run_step("report", do_report),
        ]
    except E2EError as err:
        state.manifest.data["result"] = {"error": err.to_dict()}
        try:
            state.manifest.save()
        except E2EError:
            pass  # the manifest itself is what failed; the original error says so
        raise
    report_out = state.outputs.get("report", {})
    bench_out = state.outputs.get("bench", {})
    result = RunResult(
        work_dir=state.work_dir,
        model_path=state.model_path(),
        steps=steps,
        report_json=_path(report_out.get("report_json") or bench_out.get("report_json")),
        report_markdown=_path(report_out.get("report_markdown")),
        report_html=_path(report_out.get("report_html")),
        plot=_path(report_out.get("plot")),
        smoke=state.outputs.get("smoke", {}).get("result"),
        failed_arms=list(bench_out.get("failed_arms", [])),
        removed_auto_map=state.patch_summary()["removed_auto_map"],
        remote_code=state.remote_code_text(),
        tune=dict(state.outputs.get("tune", {}).get("files") or {}),
        remote_report=bool(bench_out.get("remote_report")),
    )
    state.manifest.data["result"] = result.to_dict()
    state.manifest.save()
    return result


def _path(value: Any) -> Path | None:
    return Path(value) if value else None
