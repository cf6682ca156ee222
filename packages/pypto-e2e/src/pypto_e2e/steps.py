"""The seven steps, each a library call into the package that owns the work.

A step returns ``(outputs, note)``; the step chain in :mod:`pypto_e2e.chain`
records it. Typed errors of the step tools become :class:`StepFailedError` with the
e2e code of the step and the tool's own code as ``cause``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pypto_common import atomic_write_text, redact, redact_obj

from .errors import EXIT, StepFailedError, cause_of, step_failure
from .remote_code import entries_text, remote_code_entries, verify_pin
from .report import render_markdown, render_remote_markdown, write_plot
from .state import RunState

if TYPE_CHECKING:
    from pypto_bench import BenchConfig, Report

# remote_code_entries, step_failure and verify_pin live in lower modules (remote_code,
# errors) so the run state can use them; they stay importable from here.
__all__ = [
    "StepResult",
    "do_bench",
    "do_download",
    "do_patch",
    "do_precision",
    "do_report",
    "do_smoke",
    "do_tune",
    "node_label",
    "remote_code_entries",
    "step_failure",
    "tune_dir",
    "verify_pin",
]

log = logging.getLogger(__name__)

StepResult = tuple[dict[str, Any], str]


# --------------------------------------------------------------------------- download


def do_download(state: RunState) -> StepResult:
    from pypto_download import DownloadError, download

    c = state.config
    target = state.work_dir / "model"
    assert c.model_id is not None  # validate() guarantees it
    try:
        path = download(
            c.model_id,
            target,
            revision=c.revision,
            token=c.token,
            allow_patterns=c.allow_patterns,
            ignore_patterns=c.ignore_patterns,
            endpoint=c.endpoint,
            max_workers=c.max_workers,
        )
    except DownloadError as err:
        raise step_failure("download", err) from err
    folder = Path(path).resolve()
    return {
        "model_path": str(folder),
        "folder": state.folder_fingerprint(folder).summary(),
    }, f"{c.model_id} -> {folder}"


# --------------------------------------------------------------------------- patch


def do_patch(state: RunState) -> StepResult:
    from pypto_patch import PatchError, apply

    c = state.config
    source_text = state.outputs.get("download", {}).get("model_path") or c.model_path
    if source_text is None:
        raise StepFailedError(
            "patch",
            "no model folder to patch: the download step was skipped without --model-path",
            exit_code=EXIT.USAGE,
        )
    source = Path(source_text).expanduser().resolve()
    if not (c.family or c.auto_map or c.copies):
        remote = remote_code_entries(source)
        if not remote:
            return {"not_needed": True}, "model needs no pinning: it names no code of its own"
        if c.trust_remote_code:
            return {"not_needed": True, "remote_code": remote}, (
                f"not pinned: the folder's own code ({entries_text(remote)}) runs because "
                "--trust-remote-code was given"
            )
        raise StepFailedError(
            "patch",
            f"the model ships its own code ({entries_text(remote)}) and no preset pins it",
            exit_code=EXIT.REMOTE_CODE_REFUSED,
            resume="pass --family F (see `pypto-patch list`) or --auto-map/--copy to pin it, "
            "or --trust-remote-code if you trust that code",
        )
    # An overlay keeps the downloaded folder byte-identical to the hub, so a re-run's
    # integrity check never sees our edits as corruption.
    overlay = state.work_dir / "patched"
    try:
        result = apply(
            source,
            family=c.family,
            auto_map=c.auto_map or None,
            copies=c.copies or None,
            source_root=c.source_root,
            output_dir=overlay,
            # e2e owns WORK/patched: an earlier overlay there (ours) is rebuilt, and
            # hand edits in it are discarded rather than trusted.
            force=True,
            replace_overlay=True,
        )
    except PatchError as err:
        raise step_failure("patch", err) from err
    model_path = Path(result.model_path or overlay).resolve()
    verify_pin(model_path, step="patch")
    removed = [
        {
            "file": str(e.get("file")),
            "at": str(e.get("at") or ""),
            "key": str(e.get("key")),
            "value": e.get("value"),
        }
        for e in result.removed_auto_map
    ]
    label = c.family or "custom auto_map"
    if removed:
        state.say(
            f"[patch] removed the repo's own code entries (they never run): {entries_text(removed)}"
        )
    return {
        "model_path": str(model_path),
        "auto_map": dict(result.auto_map),
        "removed_auto_map": removed,
        "preset": label,
        "pinned": True,
        "folder": state.folder_fingerprint(model_path).summary(),
    }, f"pinned to {label}" + (f"; removed {len(removed)} repo code entries" if removed else "")


# --------------------------------------------------------------------------- smoke


def do_smoke(state: RunState) -> StepResult:
    from pypto_bench import BenchError, smoke

    c = state.config
    trust = state.trust_for_load("smoke")
    kwargs: dict[str, Any] = {
        "device": c.bench.device,
        "dtype": c.bench.dtype,
        "trust_remote_code": trust,
        "attn_implementation": c.bench.attn_implementation,
    }
    if c.prompt:
        kwargs["prompt"] = c.prompt
    if c.bench.image:
        # The gate also runs the image prompt the bench step will measure.
        kwargs["image"] = c.bench.image
    try:
        result = smoke(state.model_path(), **kwargs)
    except BenchError as err:
        raise step_failure("smoke", err) from err
    data = result.to_dict()
    if not result.passed:
        reason = result.reason or "smoke gate failed"
        hint = "fix the model or its pinning, then re-run the same command"
        if result.stage in ("check", "coherence") and "--skip smoke" not in reason:
            hint = (
                "random weights cannot pass this gate: pass --skip smoke for a throughput-only "
                "run; else " + hint
            )
        raise StepFailedError(
            "smoke",
            f"{reason} (eager must work before anything is measured)",
            exit_code=EXIT.SMOKE_FAILED,
            resume=hint,
            cause=cause_of("pypto-bench", "pypto_bench", result.exit_code),
        )
    return {"result": data}, f"{data.get('text', '')!r} (coherence {data.get('coherence')})"


# --------------------------------------------------------------------------- precision


def precision_dir(state: RunState) -> Path:
    """Where the precision step's check.json, check.md and module compare go."""
    return state.work_dir / "report" / "precision"


def do_precision(state: RunState) -> StepResult:
    """The eager model on the run's device and dtype against the same folder on the CPU
    (float64 under 1 GB of weights, else float32), teacher-forced, judged against the noise
    floor (``pypto-precision check``; pypto_bench.precision.run_check). A divergence fails
    the run (unless ``--allow-inaccurate``): check.md names the first diverging module.
    Skipped, said, when the reference would not fit the host's free memory."""
    import shutil

    from pypto_bench.precision import check_line, reference_does_not_fit, run_check
    from pypto_precision import PrecisionError

    from .config import PRECISION_CHECK

    c = state.config
    if c.bench.regime == "diffusion-generate":
        return {"not_needed": True}, (
            "not needed: the check compares causal logits; the diffusion regime's denoiser is "
            "judged step by step in the bench's numerical gate"
        )
    path = state.model_path()
    assert path is not None
    trust = state.trust_for_load("precision")
    check = dict(PRECISION_CHECK)
    why = reference_does_not_fit(path, str(check["reference_device"]))
    if why:
        return {"not_needed": True}, f"skipped: {why}"
    out = precision_dir(state)
    shutil.rmtree(out, ignore_errors=True)  # the step owns it: a re-run starts clean
    try:
        report = run_check(
            path,
            out=out,
            device=c.bench.device,
            dtype=c.bench.dtype,
            seq=int(str(check["seq"])),
            gen=int(str(check["gen"])),
            seed=c.bench.seed,
            reference_device=str(check["reference_device"]),
            trust_remote_code=trust,
        )
    except PrecisionError as err:
        raise StepFailedError(
            "precision",
            str(err),
            exit_code=EXIT.BENCH_FAILED,
            resume="fix the cause, then re-run the same command (or --skip precision)",
            cause=cause_of("pypto-precision", "pypto_precision", err.exit_code),
        ) from err
    line = check_line(report)
    outputs: dict[str, Any] = {
        "check_json": str(out / "check.json"),
        "check_markdown": str(out / "check.md"),
        "ok": bool(report["ok"]),
        "line": line,
        "reference": report["reference"],
        "logits": report["logits"],
        "floor_logits": report["floor_logits"],
        "first_divergent": report.get("first_divergent"),
    }
    if not report["ok"] and not c.bench.allow_inaccurate:
        raise StepFailedError(
            "precision",
            f"the eager model's logits diverge from the CPU reference: {line}",
            exit_code=EXIT.ARM_FAILED,
            resume=f"see {out / 'check.md'} and its module compare; --allow-inaccurate "
            "continues to the bench, marked",
            cause=cause_of("pypto-precision", "pypto_precision", 100),
        )
    allowed = " (allowed by --allow-inaccurate)" if not report["ok"] else ""
    return outputs, line + allowed


# --------------------------------------------------------------------------- bench


def _bench_progress(say: Callable[[str], None]) -> Callable[[str, int, int], None]:
    def progress(arm: str, done: int, total: int) -> None:
        if done == total:
            say(f"[bench] arm {arm}: {done}/{total} iterations")

    return progress


def do_bench(state: RunState) -> StepResult:
    from pypto_bench import BenchError, run_bench

    trust = state.trust_for_load("bench")
    report_dir = state.work_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    report_json = report_dir / "bench.json"
    bench_config = state.config.bench_config(
        model_path=str(state.model_path()),
        report_file=str(report_json),
        trust_remote_code=trust,
        command_line=state.command_line,
    )
    try:
        if bench_config.nnodes > 1:
            report = _bench_node(state, bench_config)
            if report is None:
                return _remote_bench(state, bench_config)
        else:
            report = run_bench(bench_config, progress=_bench_progress(state.say))
    except BenchError as err:
        # Across nodes a rank that "never started" is often a node that never joined.
        resume = _NODES_RESUME if bench_config.nnodes > 1 else ""
        failure = step_failure("bench", err, resume=resume)
        if err.exit_code == _bench_code("REPORT_UNWRITTEN"):
            failure.exit_code = EXIT.REPORT_FAILED
        raise failure from err
    written = Path(getattr(report, "written_to", None) or report_json)
    note = ""
    if written.resolve() != report_json.resolve():
        note = f"the report could not be written to {report_json}; it was saved to {written}"
        state.say(f"[bench] {note}")
    failed = list(report.failed_arms)
    # An arm that computes something else than eager (pypto-bench's numerical gate) fails
    # the run like a failed arm, unless --allow-inaccurate (the report still marks it).
    if not bench_config.allow_inaccurate:
        failed += [f"{name} (numerics: fail)" for name in report.numerics_failed]
        if report.reference_failed:
            where = (report.reference_check or {}).get("device")
            failed.append(f"eager (numerics vs the {where} reference: fail)")
    summary = f"arms failed: {', '.join(failed)}" if failed else "all arms ok"
    outputs: dict[str, Any] = {
        "report_json": str(written),
        # What the report step renders from: a new measurement re-renders it.
        "report_sha256": hashlib.sha256(written.read_bytes()).hexdigest(),
        "failed_arms": failed,
    }
    if bench_config.history:
        outputs["history"] = _record_history(state, bench_config.history, report)
    return outputs, (f"{summary}; {note}" if note else summary)


def _record_history(state: RunState, path: str, report: Any) -> dict[str, Any]:
    """``--history DB``: this measurement recorded as pypto-bench run records it (a step
    reused from an earlier run recorded its report then, and is not recorded twice)."""
    from pypto_bench import BenchError
    from pypto_bench.history import record

    try:
        run_id = record(path, report)
    except BenchError as err:
        raise step_failure("bench", err) from err
    state.say(f"[bench] recorded as run {run_id} in history {path}")
    return {"path": str(Path(path).expanduser().resolve()), "run_id": run_id}


_NODES_RESUME = (
    "fix the cause, then run the same command on every node, with --from bench on a node "
    "whose bench step would be reused: every node must join the rendezvous"
)


def node_label(config: BenchConfig) -> str:
    """``node 1 of 2`` (``--node-rank`` given) or ``a node of 2``: how a node is named."""
    if config.node_rank is None:
        return f"a node of {config.nnodes}"
    return f"node {config.node_rank} of {config.nnodes}"


def _bench_node(state: RunState, config: BenchConfig) -> Report | None:
    """One node of ``--nnodes N`` (pypto-bench's own launcher, as ``pypto-bench run``
    runs it): the report where rank 0 ran, else None (its ranks' figures are there)."""
    from pypto_bench.loading import check_regime_fits_folder
    from pypto_bench.multi import run_node

    config.validate()
    # A regime the folder's model cannot run is refused before any rank starts.
    check_regime_fits_folder(config.model_path, config.regime)
    # Every node must run this step: one whose bench was reused never joins, and the
    # others wait for it until the rendezvous times out.
    state.say(
        f"[bench] {node_label(config)}: {config.nproc} rank(s) here, joining the "
        f"rendezvous at {config.rdzv_endpoint}; every node must run this step (where it "
        "was reused, re-run with --from bench)"
    )
    return run_node(config, progress=_bench_progress(state.say), validated=True)


def _remote_bench(state: RunState, config: BenchConfig) -> StepResult:
    """The bench step of a node that did not run rank 0: nothing to render here.

    An earlier run's report in this work dir (rank 0 ran here then) is superseded by this
    run's, which is on another node: it is removed, as a re-run here would overwrite it.
    """
    for name in ("bench.json", "tokens_per_s.png"):
        stale = state.work_dir / "report" / name
        try:
            stale.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:  # it stays, superseded; report.md says where the report is
            log.warning("could not remove the earlier run's %s: %s", stale, err.strerror or err)
    outputs: dict[str, Any] = {
        # No report_json: the report (every rank's figures) is on the node that ran rank 0.
        "remote_report": True,
        "nnodes": config.nnodes,
        "node_rank": config.node_rank,
        "failed_arms": [],
    }
    from pypto_bench.multi.launch import node_figures_path

    assert config.report_file is not None  # the bench step always names report/bench.json
    kept = node_figures_path(config.report_file, config.node_rank)
    if kept.is_file():  # this node's own ranks' figures (pypto-bench wrote them)
        outputs["node_figures"] = str(kept)
    return outputs, (
        f"{node_label(config)}: its ranks are done; the report is written on the node that "
        "ran rank 0"
    )


def _bench_code(name: str) -> int | None:
    """pypto-bench's exit code called ``name`` (None when its table has no such code)."""
    from pypto_bench import EXIT as BENCH_EXIT

    try:
        return int(getattr(BENCH_EXIT, name))
    except AttributeError:
        return None


# --------------------------------------------------------------------------- tune

#: What the tune step writes under ``WORK/report/tune`` (pypto-tune's own file names).
TUNE_FILES = {
    "profile": "profile.json",
    "markdown": "profile.md",
    "trace": "trace.json",
    "plot": "breakdown.png",
}
#: How many recommendations the step records and the report shows.
TUNE_TOP = 3


def tune_dir(state: RunState) -> Path:
    return state.work_dir / "report" / "tune"


def do_tune(state: RunState) -> StepResult:
    """Profile the bench's own step with pypto-tune, advise, and write its outputs.

    The profile runs the bench step's configuration on the same folder with the same
    remote-code decision, so the advice is about what the report measured, not about a
    second harness.
    """
    c = state.config
    if not c.tune:
        return {"not_needed": True}, "not requested (pass --tune to profile and advise)"
    from pypto_tune import TuneError, advise, profile_model, write_outputs

    trust = state.trust_for_load("tune")
    bench_config = c.bench_config(
        model_path=str(state.model_path()),
        report_file=None,
        trust_remote_code=trust,
        command_line=state.command_line,
    )
    out = tune_dir(state)
    try:
        # Before the profile: a folder that cannot be written fails now, not after it.
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _unwritable(out, err) from err
    try:
        prof = profile_model(
            bench_config,
            arm=c.tune_arm,
            level=c.tune_level,
            iters=c.tune_iters,
            # The graph arm compiles in its first call: that must not be profiled.
            warmup=max(1, int(bench_config.warmup)),
            progress=lambda msg: state.say(f"[tune] {msg}"),
        )
        advise(prof)
    except TuneError as err:
        raise step_failure("tune", err, resume=_TUNE_RESUME) from err
    try:
        written = write_outputs(prof, out)
    except TuneError as err:
        raise step_failure("tune", err, resume=_TUNE_RESUME) from err
    except OSError as err:
        raise _unwritable(out, err) from err
    files = {key: str(Path(value).resolve()) for key, value in written.items() if value}
    # A file an earlier run wrote and this one did not (no matplotlib now, say) would be
    # linked as if it were this profile's: remove it.
    for key, name in TUNE_FILES.items():
        stale = out / name
        if key not in files and stale.is_file():
            stale.unlink()
    recs = [
        {
            "id": r.get("id"),
            "title": r.get("title"),
            "estimated_speedup": r.get("estimated_speedup"),
            "command": r.get("command"),
        }
        for r in prof.recommendations[:TUNE_TOP]
    ]
    outputs: dict[str, Any] = {
        "dir": str(out.resolve()),
        "files": files,
        "arm": c.tune_arm,
        "level": c.tune_level,
        "step_us": prof.step_us,
        "step_unit": prof.step.get("unit"),
        "findings": len(prof.findings),
        "recommendations": recs,
    }
    best = recs[0] if recs else None
    note = f"{prof.step_us / 1000:.2f} ms per {prof.step.get('unit') or 'step'}"
    if best and best.get("estimated_speedup"):
        note += f"; best advice: {best['id']} (estimated {best['estimated_speedup']:.2f}x)"
    else:
        note += "; no recommendation above the thresholds"
    return outputs, note


def _unwritable(out: Path, err: OSError) -> StepFailedError:
    return StepFailedError(
        "tune",
        f"cannot write the profile to {out}: {err.strerror or err}; the bench results are "
        "safe in the report folder",
        exit_code=EXIT.TUNE_FAILED,
        resume="make that folder writable (or remove the file in its place), then re-run "
        "the same command",
    )


_TUNE_RESUME = (
    "fix the cause and re-run the same command, which reuses the completed steps and the "
    "bench; or drop --tune to render the report without a profile"
)


# --------------------------------------------------------------------------- report


def do_report(state: RunState) -> StepResult:
    from pypto_bench import BenchError, load_report, report_to_html

    bench = state.outputs.get("bench", {})
    if bench.get("remote_report"):
        return _remote_report(state, bench)
    if not bench.get("report_json"):
        return {"not_needed": True}, "no bench report to render (bench skipped)"
    report_json = Path(bench["report_json"])
    try:
        data = load_report(report_json)
    except BenchError as err:
        raise step_failure("report", err) from err
    report_dir = state.work_dir / "report"
    markdown = report_dir / "report.md"
    plot = report_dir / "tokens_per_s.png"
    smoke_result = state.outputs.get("smoke", {}).get("result")
    tune = state.outputs.get("tune", {})
    precision = state.outputs.get("precision", {})
    if precision.get("check_json") and not data.get("reference_check"):
        # The precision step's verdict on the same surfaces as the bench's own --reference
        # check (the bench JSON on disk is unchanged).
        data = {**data, "reference_check": precision_as_reference_check(precision)}
    text = render_markdown(
        data,
        smoke_result,
        state.config,
        patch=state.patch_summary(),
        bench_json=report_json,
        tune=None if tune.get("not_needed") else tune,
        report_dir=report_dir,
    )
    # The same run as one page beside report.md (pypto_bench.html_report), linking the
    # bench JSON and, with --tune, the diagnosis page; redacted before it is rendered.
    page = report_dir / "report.html"
    tune_page = (tune.get("files") or {}).get("html") if not tune.get("not_needed") else None
    links = [("the diagnosis (pypto-tune)", _relative(tune_page, report_dir))] if tune_page else []
    if precision.get("check_markdown"):
        links.append(
            (
                "the precision check (pypto-precision)",
                _relative(precision["check_markdown"], report_dir),
            )
        )
    html = report_to_html(
        redact_obj(data, state.secrets),
        json_href=_relative(report_json, report_dir),
        links=links,
    )
    for path, content in ((markdown, redact(text, state.secrets)), (page, html)):
        try:
            report_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, content)
        except OSError as err:
            raise StepFailedError(
                "report",
                f"cannot write {path}: {err.strerror or err}; the bench results are safe in "
                f"{report_json}",
                exit_code=EXIT.REPORT_FAILED,
                resume="make the report folder writable, then re-run with --from report",
            ) from err
    outputs: dict[str, Any] = {
        "report_json": str(report_json),
        "report_markdown": str(markdown),
        "report_html": str(page),
    }
    if write_plot(data, plot):
        outputs["plot"] = str(plot)
    return outputs, f"wrote {markdown} and {page.name}"


def precision_as_reference_check(precision: dict[str, Any]) -> dict[str, Any]:
    """The precision step's outputs in the shape of a bench report's ``reference_check``."""
    logits = precision.get("logits") or {}
    reference = precision.get("reference") or {}
    return {
        "verdict": "pass" if precision.get("ok") else "fail",
        "device": str(reference.get("device")),
        "dtype": reference.get("dtype"),
        "basis": "the precision step (pypto-precision check): the eager model, teacher-forced "
        "on the reference's greedy tokens",
        "allowed_kl_max": logits.get("allowed"),
        "metrics": logits.get("metrics") or {},
        "floor_metrics": precision.get("floor_logits") or {},
        "why": str(logits.get("why")),
        "first_diverging_module": precision.get("first_divergent"),
    }


def _relative(target: str | Path, folder: Path) -> str:
    """``target``'s path from ``folder`` (a page's links travel with the work dir)."""
    return os.path.relpath(Path(target).resolve(), folder.resolve())


def _remote_report(state: RunState, bench: dict[str, Any]) -> StepResult:
    """report.md of a node whose ranks ran but not rank 0: where the report is, no figures."""
    report_dir = state.work_dir / "report"
    markdown = report_dir / "report.md"
    text = render_remote_markdown(
        state.outputs.get("smoke", {}).get("result"),
        state.config,
        patch=state.patch_summary(),
        node_figures=bench.get("node_figures"),
    )
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(markdown, redact(text, state.secrets))
    except OSError as err:
        raise StepFailedError(
            "report",
            f"cannot write {markdown}: {err.strerror or err}; this node's ranks are done and "
            "the bench report is on the node that ran rank 0",
            exit_code=EXIT.REPORT_FAILED,
            resume="make the report folder writable, then re-run with --from report",
        ) from err
    outputs: dict[str, Any] = {"report_markdown": str(markdown), "remote_report": True}
    return outputs, f"wrote {markdown} (the bench report is on the node that ran rank 0)"
