"""The workflow as resumable steps: download -> patch -> smoke -> bench -> report.

Every step is a library call into the package that owns it; this module only decides
what runs, records it, and hands ``MODEL_PATH`` from one step to the next. The run
manifest (``pypto-e2e.json`` in the work dir) is what makes a re-run cheap and honest:
a step is reused only when it completed before *and* its inputs (including the outputs
of the steps it depends on) are unchanged; anything else runs again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STEPS = ("download", "patch", "smoke", "bench", "report")
MANIFEST_NAME = "pypto-e2e.json"
MANIFEST_SCHEMA_VERSION = 1

EXIT_STEP_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3


class E2EError(Exception):
    """Base error; ``str()`` is one line, ``exit_code`` what the CLI exits with."""

    exit_code = EXIT_STEP_FAILED


class BadRunInputError(E2EError):
    """The request is inconsistent before any step runs."""

    exit_code = EXIT_BAD_INPUT


class StepFailedError(E2EError):
    """A step failed; names it and how to resume. Earlier steps stay completed."""

    def __init__(
        self, step: str, message: str, *, exit_code: int = EXIT_STEP_FAILED, resume: str = ""
    ):
        self.step = step
        self.exit_code = exit_code
        hint = resume or "fix the cause and re-run the same command: completed steps are reused"
        super().__init__(f"step {step!r} failed: {message} ({hint})")


@dataclass
class RunConfig:
    """Everything a run depends on. ``token`` is never written to the manifest."""

    work_dir: str | os.PathLike[str]
    model_id: str | None = None
    model_path: str | None = None  # with --skip download: an existing folder
    # download
    revision: str | None = None
    token: str | None = None
    endpoint: str | None = None
    allow_patterns: list[str] | None = None
    ignore_patterns: list[str] | None = None
    max_workers: int = 8
    # patch
    family: str | None = None
    auto_map: dict[str, str] = field(default_factory=dict)
    copies: dict[str, str] = field(default_factory=dict)
    source_root: str | None = None
    # smoke + bench
    device: str = "0"
    prompt: str | None = None
    trust_remote_code: bool | None = None  # None: only when the patch pinned remote code
    regime: str = "decode"
    arms: tuple[str, ...] = ("eager", "graph")
    fuse: bool = False
    seq: int = 16
    gen: int = 128
    batch: int = 1
    warmup: int = 2
    iters: int = 3
    dtype: str = "auto"
    graph_backend: str = "auto"
    seed: int = 0
    attn_implementation: str | None = None
    # flow control
    skip: tuple[str, ...] = ()
    from_step: str | None = None
    command_line: list[str] | None = None

    @property
    def effective_arms(self) -> tuple[str, ...]:
        """With ``fuse`` the pypto+graph arm runs in the same bench run as the others,
        so the before/after ratio is measured side by side, not across runs."""
        arms = tuple(self.arms)
        if self.fuse:
            if "graph" not in arms:
                arms += ("graph",)
            if "pypto+graph" not in arms:
                arms += ("pypto+graph",)
        return arms

    def validate(self) -> None:
        for step in self.skip:
            if step not in STEPS:
                raise BadRunInputError(
                    f"unknown step {step!r} in --skip: choose from {', '.join(STEPS)}"
                )
        if self.from_step is not None and self.from_step not in STEPS:
            raise BadRunInputError(
                f"unknown step {self.from_step!r} in --from: choose from {', '.join(STEPS)}"
            )
        if self.from_step in self.skip:
            raise BadRunInputError(
                f"--from {self.from_step} names a step that --skip skips: drop one of them"
            )
        if "download" in self.skip:
            if not self.model_path:
                raise BadRunInputError(
                    "--skip download needs --model-path DIR (the folder to use instead)"
                )
        elif not self.model_id:
            raise BadRunInputError(
                "--model-id ORG/REPO is required (or --skip download --model-path DIR)"
            )
        if self.family and (self.auto_map or self.copies):
            raise BadRunInputError(
                "--family and --auto-map/--copy are exclusive: use a preset or custom mode"
            )
        if self.fuse and "bench" in self.skip:
            raise BadRunInputError("--fuse measures in the bench step, which --skip bench skips")
        wd = Path(self.work_dir)
        if wd.exists() and not wd.is_dir():
            raise BadRunInputError(f"work dir {wd} is a file: pass a directory path to --work-dir")
        if "bench" not in self.skip:
            # Bench flags are checked before any step runs, so a typo in --arms does not
            # surface only after a long download.
            from pypto_bench import BadInputError

            try:
                self.bench_config(model_path=None, report_file=None).validate()
            except BadInputError as err:
                raise BadRunInputError(str(err)) from err

    def bench_config(
        self, *, model_path: str | None, report_file: str | None, trust_remote_code: bool = False
    ):
        """The pypto-bench configuration this run's bench step uses."""
        from pypto_bench import BenchConfig

        return BenchConfig(
            model_path=model_path,
            device=self.device,
            regime=self.regime,
            seq=self.seq,
            gen=self.gen,
            batch=self.batch,
            arms=self.effective_arms,
            warmup=self.warmup,
            iters=self.iters,
            dtype=self.dtype,
            graph_backend=self.graph_backend,
            seed=self.seed,
            attn_implementation=self.attn_implementation,
            trust_remote_code=trust_remote_code,
            report_file=report_file,
            command_line=self.command_line,
        )


# --------------------------------------------------------------------------- manifest


def _fingerprint(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


class Manifest:
    """The run record in the work dir; written atomically after every state change."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {"schema_version": MANIFEST_SCHEMA_VERSION, "steps": {}}
        if path.exists():
            try:
                loaded = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise BadRunInputError(
                    f"run manifest {path} is unreadable ({err}): delete it to start the run afresh"
                ) from err
            if isinstance(loaded, dict) and loaded.get("schema_version") == MANIFEST_SCHEMA_VERSION:
                self.data = loaded
            else:
                log.warning("ignoring run manifest %s of another schema version", path)

    def step(self, name: str) -> dict[str, Any]:
        return self.data["steps"].get(name, {})

    def record(self, name: str, **entry: Any) -> None:
        self.data["steps"][name] = entry
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path)


# --------------------------------------------------------------------------- steps


@dataclass
class StepOutcome:
    name: str
    status: str  # "ok" | "reused" | "skipped" | "not-needed"
    outputs: dict[str, Any]
    seconds: float
    note: str = ""


@dataclass
class RunResult:
    work_dir: Path
    model_path: Path | None
    steps: list[StepOutcome]
    report_json: Path | None = None
    report_markdown: Path | None = None
    plot: Path | None = None
    smoke: dict[str, Any] | None = None
    failed_arms: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "work_dir": str(self.work_dir),
            "model_path": str(self.model_path) if self.model_path else None,
            "report_json": str(self.report_json) if self.report_json else None,
            "report_markdown": str(self.report_markdown) if self.report_markdown else None,
            "plot": str(self.plot) if self.plot else None,
            "failed_arms": self.failed_arms,
            "steps": [
                {"name": s.name, "status": s.status, "seconds": round(s.seconds, 3), "note": s.note}
                for s in self.steps
            ],
        }


def _error_exit_code(err: BaseException) -> int:
    code = getattr(err, "exit_code", None)
    return code if isinstance(code, int) and code > 0 else EXIT_STEP_FAILED


class _Run:
    def __init__(self, config: RunConfig, progress: Callable[[str], None] | None):
        self.config = config
        self.work_dir = Path(config.work_dir).expanduser().resolve()
        self.manifest = Manifest(self.work_dir / MANIFEST_NAME)
        self.say = progress or (lambda msg: log.info("%s", msg))
        self.outputs: dict[str, dict[str, Any]] = {}
        self.forced = False  # once a step re-runs, its dependants re-run too

    # -- inputs of each step (what decides reuse). Never include the token.
    def inputs(self, name: str) -> dict[str, Any]:
        c = self.config
        if name == "download":
            return {
                # The endpoint is left out on purpose: a mirror serves the same
                # repository, and the demo's local hub gets a new port every run.
                "model_id": c.model_id,
                "revision": c.revision,
                "allow_patterns": c.allow_patterns,
                "ignore_patterns": c.ignore_patterns,
            }
        if name == "patch":
            return {
                "source": self.outputs.get("download", {}),
                "family": c.family,
                "auto_map": c.auto_map,
                "copies": c.copies,
                "source_root": c.source_root,
            }
        if name == "smoke":
            return {
                "model": self.model_fingerprint(),
                "device": c.device,
                "prompt": c.prompt,
                "trust_remote_code": self.trust_remote_code(),
                "dtype": c.dtype,
            }
        if name == "bench":
            return {
                "model": self.model_fingerprint(),
                "device": c.device,
                "regime": c.regime,
                "arms": list(c.effective_arms),
                "seq": c.seq,
                "gen": c.gen,
                "batch": c.batch,
                "warmup": c.warmup,
                "iters": c.iters,
                "dtype": c.dtype,
                "graph_backend": c.graph_backend,
                "seed": c.seed,
                "attn_implementation": c.attn_implementation,
                "trust_remote_code": self.trust_remote_code(),
            }
        return {"bench": self.outputs.get("bench", {}), "smoke": self.outputs.get("smoke", {})}

    def model_path(self) -> Path | None:
        for step in ("patch", "download"):
            path = self.outputs.get(step, {}).get("model_path")
            if path:
                return Path(path)
        return (
            Path(self.config.model_path).expanduser().resolve() if self.config.model_path else None
        )

    def model_fingerprint(self) -> dict[str, Any]:
        path = self.model_path()
        if path is None:
            return {}
        config = path / "config.json"
        return {"path": str(path), "config": _file_digest(config) if config.is_file() else None}

    def trust_remote_code(self) -> bool:
        if self.config.trust_remote_code is not None:
            return self.config.trust_remote_code
        return bool(self.outputs.get("patch", {}).get("auto_map"))

    def outputs_exist(self, outputs: dict[str, Any]) -> bool:
        for key in ("model_path", "report_json", "report_markdown"):
            value = outputs.get(key)
            if value and not Path(value).exists():
                return False
        return True

    def run_step(self, name: str, fn: Callable[[], tuple[dict[str, Any], str]]) -> StepOutcome:
        c = self.config
        if name in c.skip:
            self.manifest.record(name, status="skipped", inputs=None, outputs={})
            self.say(f"[{name}] skipped (--skip)")
            return StepOutcome(name, "skipped", {}, 0.0)
        if c.from_step == name:
            self.forced = True
        inputs = self.inputs(name)
        fingerprint = _fingerprint(inputs)
        previous = self.manifest.step(name)
        if (
            not self.forced
            and previous.get("status") in ("ok", "not-needed")
            and previous.get("fingerprint") == fingerprint
            and self.outputs_exist(previous.get("outputs", {}))
        ):
            self.outputs[name] = previous.get("outputs", {})
            self.say(f"[{name}] reused from the previous run (inputs unchanged)")
            return StepOutcome(name, "reused", self.outputs[name], 0.0, previous.get("note", ""))
        self.forced = True
        started = time.time()
        self.manifest.record(
            name, status="running", fingerprint=fingerprint, inputs=inputs, started=started
        )
        self.say(f"[{name}] running")
        t0 = time.perf_counter()
        try:
            outputs, note = fn()
        except StepFailedError as err:
            self._failed(name, fingerprint, inputs, started, t0, err)
            raise
        except Exception as err:
            message = " ".join(str(err).split()) or type(err).__name__
            failure = StepFailedError(name, message, exit_code=_error_exit_code(err))
            self._failed(name, fingerprint, inputs, started, t0, failure)
            raise failure from err
        seconds = time.perf_counter() - t0
        status = "not-needed" if outputs.get("not_needed") else "ok"
        self.outputs[name] = outputs
        self.manifest.record(
            name,
            status=status,
            fingerprint=fingerprint,
            inputs=inputs,
            outputs=outputs,
            started=started,
            seconds=round(seconds, 3),
            note=note,
        )
        if "model_path" in outputs:
            os.environ["MODEL_PATH"] = str(outputs["model_path"])
        self.say(f"[{name}] {status} in {seconds:.1f}s{': ' + note if note else ''}")
        return StepOutcome(name, status, outputs, seconds, note)

    def _failed(self, name, fingerprint, inputs, started, t0, err: StepFailedError) -> None:
        self.manifest.record(
            name,
            status="failed",
            fingerprint=fingerprint,
            inputs=inputs,
            started=started,
            seconds=round(time.perf_counter() - t0, 3),
            error=str(err),
        )

    # -- the steps themselves
    def do_download(self) -> tuple[dict[str, Any], str]:
        from pypto_download import download

        c = self.config
        target = self.work_dir / "model"
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
        return {"model_path": str(Path(path).resolve())}, f"{c.model_id} -> {path}"

    def do_patch(self) -> tuple[dict[str, Any], str]:
        from pypto_patch import apply

        c = self.config
        source = self.outputs.get("download", {}).get("model_path") or c.model_path
        if source is None:
            raise BadRunInputError(
                "no model folder to patch: the download step was skipped without --model-path"
            )
        source = Path(source).expanduser().resolve()
        if not (c.family or c.auto_map or c.copies):
            remote = _remote_auto_map(source)
            if remote:
                raise StepFailedError(
                    "patch",
                    f"config.json points at remote code ({', '.join(sorted(remote))}) and no preset was given",
                    exit_code=EXIT_BAD_INPUT,
                    resume="pass --family F (see `pypto-patch list`) or --auto-map/--copy, or --skip patch",
                )
            return {"not_needed": True}, "model needs no pinning: config.json has no auto_map"
        # An overlay keeps the downloaded folder byte-identical to the hub, so a re-run's
        # integrity check never sees our edits as corruption.
        overlay = self.work_dir / "patched"
        result = apply(
            source,
            family=c.family,
            auto_map=c.auto_map or None,
            copies=c.copies or None,
            source_root=c.source_root,
            output_dir=overlay,
            force=True,
        )
        model_path = Path(getattr(result, "model_path", None) or overlay).resolve()
        auto_map = json.loads((model_path / "config.json").read_text()).get("auto_map", {})
        label = c.family or "custom auto_map"
        return {
            "model_path": str(model_path),
            "auto_map": auto_map,
            "preset": label,
        }, f"pinned to {label}"

    def do_smoke(self) -> tuple[dict[str, Any], str]:
        from pypto_bench import smoke

        c = self.config
        kwargs: dict[str, Any] = {
            "device": c.device,
            "dtype": c.dtype,
            "trust_remote_code": self.trust_remote_code(),
            "attn_implementation": c.attn_implementation,
        }
        if c.prompt:
            kwargs["prompt"] = c.prompt
        result = smoke(self.model_path(), **kwargs)
        data = result.to_dict()
        if not result.passed:
            raise StepFailedError(
                "smoke",
                f"{result.reason} (eager must work before anything is measured)",
                exit_code=result.exit_code or EXIT_STEP_FAILED,
                resume="fix the model or its pinning, then re-run the same command",
            )
        return {"result": data}, f"{data.get('text', '')!r} (coherence {data.get('coherence')})"

    def do_bench(self) -> tuple[dict[str, Any], str]:
        from pypto_bench import run_bench

        report_dir = self.work_dir / "report"
        report_dir.mkdir(parents=True, exist_ok=True)
        report_json = report_dir / "bench.json"
        bench_config = self.config.bench_config(
            model_path=str(self.model_path()),
            report_file=str(report_json),
            trust_remote_code=self.trust_remote_code(),
        )
        report = run_bench(bench_config, progress=_bench_progress(self.say))
        data = report.to_dict() if hasattr(report, "to_dict") else dict(report)
        failed = [a["name"] for a in data.get("arms", []) if not a.get("ok")]
        return {"report_json": str(report_json), "failed_arms": failed}, (
            f"arms failed: {', '.join(failed)}" if failed else "all arms ok"
        )

    def do_report(self) -> tuple[dict[str, Any], str]:
        from pypto_bench import load_report

        bench = self.outputs.get("bench", {})
        if not bench.get("report_json"):
            return {"not_needed": True}, "no bench report to render (bench skipped)"
        data = load_report(bench["report_json"])
        report_dir = Path(bench["report_json"]).parent
        markdown = report_dir / "report.md"
        plot = report_dir / "tokens_per_s.png"
        smoke_result = self.outputs.get("smoke", {}).get("result")
        markdown.write_text(render_markdown(data, smoke_result, self.config))
        plotted = _plot(data, plot)
        outputs = {"report_json": bench["report_json"], "report_markdown": str(markdown)}
        if plotted:
            outputs["plot"] = str(plot)
        return outputs, f"wrote {markdown}"


def _remote_auto_map(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    return auto_map if isinstance(auto_map, dict) else {}


def _bench_progress(say: Callable[[str], None]) -> Callable[[str, int, int], None]:
    def progress(arm: str, done: int, total: int) -> None:
        if done == total:
            say(f"[bench] arm {arm}: {done}/{total} iterations")

    return progress


def _plot(data: dict[str, Any], path: Path) -> bool:
    from pypto_bench import EnvironmentMissingError, plot

    try:
        plot([data], path)
    except EnvironmentMissingError as err:  # matplotlib missing: the report stays useful
        log.warning("plot not written: %s", err)
        return False
    return path.exists()


def render_markdown(data: dict[str, Any], smoke: dict[str, Any] | None, config: RunConfig) -> str:
    """The run's human report: bench tables (from pypto-bench) plus the workflow context."""
    from pypto_bench import report_to_markdown

    lines = ["# pypto end-to-end report", ""]
    lines.append(f"- model: `{config.model_id or config.model_path}`")
    if config.family:
        lines.append(f"- pinned to preset: `{config.family}`")
    lines.append(f"- regime: **{data.get('regime')}**, arms: {', '.join(config.effective_arms)}")
    if smoke:
        lines.append(
            f"- smoke gate: {'passed' if smoke.get('passed') else 'FAILED'}, "
            f"coherence {smoke.get('coherence')}: prompt {smoke.get('prompt')!r} -> {smoke.get('text')!r}"
        )
    if config.fuse:
        ratio = _arm_ratio(data, "pypto+graph", "graph")
        lines.append(
            "- fused kernels (pypto+graph vs graph, same run): "
            + (f"{ratio:.3f}x" if ratio is not None else "not available (an arm failed)")
        )
    lines += ["", report_to_markdown(data)]
    return "\n".join(lines) + "\n"


def _arm_ratio(data: dict[str, Any], num: str, den: str) -> float | None:
    arms = {a.get("name"): a for a in data.get("arms", [])}
    try:
        a = arms[num]["tokens_per_s"]["best"]
        b = arms[den]["tokens_per_s"]["best"]
    except (KeyError, TypeError):
        return None
    return a / b if a and b else None


def run(config: RunConfig, *, progress: Callable[[str], None] | None = None) -> RunResult:
    """Run (or resume) the workflow; raises ``E2EError`` naming the failed step."""
    config.validate()
    state = _Run(config, progress)
    steps = [
        state.run_step("download", state.do_download),
        state.run_step("patch", state.do_patch),
        state.run_step("smoke", state.do_smoke),
        state.run_step("bench", state.do_bench),
        state.run_step("report", state.do_report),
    ]
    report_out = state.outputs.get("report", {})
    bench_out = state.outputs.get("bench", {})
    result = RunResult(
        work_dir=state.work_dir,
        model_path=state.model_path(),
        steps=steps,
        report_json=Path(report_out["report_json"]) if report_out.get("report_json") else None,
        report_markdown=Path(report_out["report_markdown"])
        if report_out.get("report_markdown")
        else None,
        plot=Path(report_out["plot"]) if report_out.get("plot") else None,
        smoke=state.outputs.get("smoke", {}).get("result"),
        failed_arms=list(bench_out.get("failed_arms", [])),
    )
    state.manifest.data["result"] = result.to_dict()
    state.manifest.save()
    return result
