"""One run in progress (:class:`RunState`): its config, manifest and the outputs so far.

It decides what each step's inputs are (what decides reuse), whether a completed step
can be reused, and records each step's outcome in the run manifest; the steps
(:mod:`pypto_e2e.steps`) read the model folder and settings from it, and the chain
(:mod:`pypto_e2e.chain`) runs them in order.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pypto_common import redact, redact_argv

from .config import PRECISION_CHECK, RunConfig
from .errors import E2EError, step_failure
from .fingerprint import FolderFingerprint, fingerprint_folder, sha256_file
from .manifest import MANIFEST_NAME, Manifest, changed_inputs, fingerprint
from .remote_code import verify_pin
from .software import software_versions

log = logging.getLogger(__name__)

__all__ = ["RunState", "StepFn", "StepOutcome", "preset_fingerprint"]


@dataclass
class StepOutcome:
    name: str
    status: str  # "ok" | "reused" | "skipped" | "not-needed"
    outputs: dict[str, Any]
    seconds: float
    note: str = ""


class RunState:
    """One run in progress: the config, the manifest and the outputs so far."""

    def __init__(self, config: RunConfig, progress: Callable[[str], None] | None):
        self.config = config
        self.secrets = config.secrets()
        self.work_dir = Path(config.work_dir).expanduser().resolve()
        self.manifest = Manifest(self.work_dir / MANIFEST_NAME, secrets=self.secrets)
        emit = progress or (lambda msg: log.info("%s", msg))
        self.say: Callable[[str], None] = lambda msg: emit(redact(msg, self.secrets))
        argv = config.command_line if config.command_line is not None else sys.argv
        self.command_line = redact_argv(list(argv), self.secrets)
        self.manifest.data["command_line"] = self.command_line
        self.outputs: dict[str, dict[str, Any]] = {}
        # --from STEP: that step and every one after it run again. Otherwise a step is
        # reused exactly when its inputs fingerprint the same; those inputs carry the
        # upstream outputs (folder digests, the bench report's digest), so a change
        # anywhere re-runs what depends on it and nothing else.
        self.forced = False
        self._software: dict[str, str] | None = None

    def software(self) -> dict[str, str]:
        """The versions that produce a step's results (python, torch, transformers, pypto-*).

        Part of every step's inputs but the download's (its bytes are verified against
        the hub whatever the tools' versions): an upgrade re-runs what it could change.
        """
        if self._software is None:
            self._software = software_versions()
        return self._software

    # -- where the model is and what it holds
    def model_path(self) -> Path | None:
        for step in ("patch", "download"):
            path = self.outputs.get(step, {}).get("model_path")
            if path:
                return Path(path)
        c = self.config
        return Path(c.model_path).expanduser().resolve() if c.model_path else None

    def folder_fingerprint(self, folder: Path) -> FolderFingerprint:
        roots = [self.work_dir / "model"]
        if self.config.model_path:
            roots.append(Path(self.config.model_path).expanduser())
        return fingerprint_folder(
            folder,
            cache=self.manifest.file_digests,
            previous=self.manifest.previous_digests,
            download_roots=tuple(roots),
        )

    def model_fingerprint(self) -> dict[str, Any]:
        path = self.model_path()
        if path is None:
            return {}
        return self.folder_fingerprint(path).summary()

    # -- remote code
    def pinned(self) -> bool:
        return bool(self.outputs.get("patch", {}).get("pinned"))

    def trust_remote_code(self) -> bool:
        """Whether loads pass ``trust_remote_code=True``: a verified pin, or the user's flag."""
        return self.pinned() or self.config.trust_remote_code

    def trust_for_load(self, step: str) -> bool:
        """:meth:`trust_remote_code`, after re-verifying the pin whenever there is one.

        Verified even with ``--trust-remote-code``: a pinned folder must load the
        preset's shims, and a pin that no longer holds is a failure, not a fallback.
        """
        if self.pinned():
            path = self.model_path()
            assert path is not None
            verify_pin(path, step=step)
        return self.trust_remote_code()

    def remote_code_text(self) -> str:
        patch = self.outputs.get("patch", {})
        if patch.get("pinned"):
            return f"only the pinned shims of {patch.get('preset')} (verified by pypto-patch)"
        if self.config.trust_remote_code:
            return "the folder's own code is allowed (--trust-remote-code)"
        return "off"

    def patch_summary(self) -> dict[str, Any]:
        patch = self.outputs.get("patch", {})
        return {
            "removed_auto_map": list(patch.get("removed_auto_map") or []),
            "trust": self.remote_code_text(),
        }

    # -- inputs of each step (what decides reuse). Never the token or the endpoint.
    def inputs(self, name: str) -> dict[str, Any]:
        values = self._inputs(name)
        if name != "download":
            values["software"] = self.software()
        return values

    def _inputs(self, name: str) -> dict[str, Any]:
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
            source: dict[str, Any] = dict(self.outputs.get("download", {}))
            if not source and c.model_path:
                source = self.folder_fingerprint(
                    Path(c.model_path).expanduser().resolve()
                ).summary()
            return {
                "source": source,
                "family": c.family,
                "preset": preset_fingerprint(c.family),
                "auto_map": c.auto_map,
                "copies": c.copies,
                "source_root": c.source_root,
                "trust_remote_code": c.trust_remote_code,
            }
        if name == "smoke":
            return {
                "model": self.model_fingerprint(),
                "device": c.bench.device,
                "dtype": c.bench.dtype,
                "attn_implementation": c.bench.attn_implementation,
                "prompt": c.prompt,
                "trust_remote_code": self.trust_remote_code(),
            }
        if name == "precision":
            return {
                "model": self.model_fingerprint(),
                "device": c.bench.device,
                "dtype": c.bench.dtype,
                "seed": c.bench.seed,
                "check": PRECISION_CHECK,
                "allow_inaccurate": c.bench.allow_inaccurate,
                "trust_remote_code": self.trust_remote_code(),
            }
        if name == "bench":
            settings = c.bench_config(
                model_path=None, report_file=None, trust_remote_code=self.trust_remote_code()
            ).to_dict()
            settings["model_path"] = self.model_fingerprint()
            return settings
        if name == "tune":
            if not c.tune:
                return {"requested": False}
            # The bench step's own settings on the same folder fingerprint: a changed
            # bench flag or model file profiles again (a new pypto-tune: ``software``).
            bench = c.bench_config(
                model_path=None, report_file=None, trust_remote_code=self.trust_remote_code()
            ).to_dict()
            bench["model_path"] = self.model_fingerprint()
            return {
                "bench": bench,
                "arm": c.tune_arm,
                "level": c.tune_level,
                "iters": c.tune_iters,
            }
        return {
            "bench": self.outputs.get("bench", {}),
            "tune": self.outputs.get("tune", {}),
            "smoke": self.outputs.get("smoke", {}),
            "precision": self.outputs.get("precision", {}),
            "patch": self.patch_summary(),
        }

    def outputs_valid(self, outputs: dict[str, Any]) -> bool:
        """A completed step's outputs are still there and (for folders) unchanged."""
        for key in (
            "model_path",
            "report_json",
            "report_markdown",
            "report_html",
            "node_figures",
            "check_json",
        ):
            value = outputs.get(key)
            if value and not Path(value).exists():
                return False
        files = outputs.get("files")
        if isinstance(files, dict) and not all(Path(str(v)).exists() for v in files.values()):
            return False
        digest = outputs.get("report_sha256")
        report = outputs.get("report_json")
        if digest and report and sha256_file(Path(report)) != digest:
            return False
        folder = outputs.get("folder")
        if isinstance(folder, dict) and folder.get("path"):
            now = self.folder_fingerprint(Path(folder["path"]))
            if now.digest != folder.get("digest"):
                return False
        return True

    # -- running one step
    def run_step(self, name: str, fn: StepFn) -> StepOutcome:
        c = self.config
        if name in c.skip:
            self.manifest.record(name, status="skipped", inputs=None, outputs={})
            self.say(f"[{name}] skipped (--skip)")
            return StepOutcome(name, "skipped", {}, 0.0)
        if c.from_step == name:
            self.forced = True
        inputs = self.inputs(name)
        digest = fingerprint(inputs)
        previous = self.manifest.step(name)
        completed = previous.get("status") in ("ok", "not-needed")
        why = ""
        if self.forced:
            why = f" (--from {c.from_step})" if completed else ""
        elif completed and previous.get("fingerprint") != digest:
            why = f" again: {changed_inputs(previous.get('inputs'), inputs)}"
        elif completed and self.outputs_valid(previous.get("outputs", {})):
            self.outputs[name] = previous.get("outputs", {})
            self.say(f"[{name}] reused from the previous run (inputs unchanged)")
            return StepOutcome(name, "reused", self.outputs[name], 0.0, previous.get("note", ""))
        elif completed:
            why = " again: what it produced changed or is gone"
        elif previous.get("status") == "running":
            why = " again: the previous run stopped during this step"
        elif previous.get("status") == "failed":
            why = " again: it failed in the previous run"
        started = time.time()
        self.manifest.record(
            name, status="running", fingerprint=digest, inputs=inputs, started=started
        )
        self.say(f"[{name}] running{why}")
        t0 = time.perf_counter()
        try:
            outputs, note = fn(self)
        except E2EError as err:
            self._failed(name, digest, inputs, started, t0, err)
            raise
        except Exception as err:  # a step tool's untyped failure: still one line, step named
            log.debug("step %s raised", name, exc_info=True)
            failure = step_failure(name, err)
            self._failed(name, digest, inputs, started, t0, failure)
            raise failure from err
        seconds = time.perf_counter() - t0
        status = "not-needed" if outputs.get("not_needed") else "ok"
        self.outputs[name] = outputs
        self.manifest.record(
            name,
            status=status,
            fingerprint=digest,
            inputs=inputs,
            outputs=outputs,
            started=started,
            seconds=round(seconds, 3),
            note=note,
        )
        self.say(f"[{name}] {status} in {seconds:.1f}s{': ' + note if note else ''}")
        return StepOutcome(name, status, outputs, seconds, note)

    def _failed(
        self,
        name: str,
        digest: str,
        inputs: dict[str, Any],
        started: float,
        t0: float,
        err: E2EError,
    ) -> None:
        self.manifest.record(
            name,
            status="failed",
            fingerprint=digest,
            inputs=inputs,
            started=started,
            seconds=round(time.perf_counter() - t0, 3),
            error=err.to_dict(),
        )


def preset_fingerprint(family: str | None) -> Any:
    """The installed preset's own fingerprint: an upgraded preset re-pins the model."""
    if not family:
        return None
    from pypto_patch import PatchError, get_preset

    try:
        preset = get_preset(family)
    except PatchError:
        return None
    return getattr(preset, "fingerprint", None) or getattr(preset, "version", None)


#: A step: reads the run state, returns ``(outputs, note)``.
StepFn = Callable[[RunState], tuple[dict[str, Any], str]]
