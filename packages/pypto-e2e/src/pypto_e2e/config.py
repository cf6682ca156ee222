"""What a run depends on, and the checks that reject a bad request before any step runs.

The bench settings are pypto-bench's own :class:`~pypto_bench.BenchConfig`, not a copy:
when e2e copied the fields, a flag added to the bench never reached e2e and a run "with
the same flags" measured something else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from pypto_bench import BenchConfig

from .errors import BadRunInputError, E2EEnvironmentError, cause_of

__all__ = ["PRECISION_CHECK", "STEPS", "TUNE_INSTALL", "RunConfig"]

STEPS = ("download", "patch", "smoke", "precision", "bench", "tune", "report")

#: The precision step's check (pypto_bench.precision.run_check): a seeded prompt of ``seq``
#: token ids, ``gen`` teacher-forced steps, against the same folder on the reference device
#: (float64 under 1 GB of weights, else float32).
PRECISION_CHECK: dict[str, object] = {"seq": 16, "gen": 8, "reference_device": "cpu"}

#: What the tune step needs installed; named in the error when it is missing.
TUNE_INSTALL = "pip install 'pypto-e2e[tune]'"


@dataclass
class RunConfig:
    """Everything a run depends on. ``token`` is never written anywhere.

    ``trust_remote_code`` is the user's explicit permission to run a model folder's own
    code as it came from the hub. Without it, remote code runs only after the patch step
    pinned the folder to a preset and pypto-patch verified the pin.
    """

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
    # smoke + bench: the bench's own configuration (its model_path, report_file and
    # trust_remote_code are set by the run, step by step)
    bench: BenchConfig = field(default_factory=BenchConfig)
    prompt: str | None = None
    trust_remote_code: bool = False
    fuse: bool = False
    # tune (pypto-tune, an optional extra): profile + advise after the bench
    tune: bool = False
    tune_arm: str = "eager"
    tune_level: str = "light"
    tune_iters: int = 3
    # flow control
    skip: tuple[str, ...] = ()
    from_step: str | None = None
    command_line: list[str] | None = None

    @classmethod
    def from_flat(cls, **values: Any) -> RunConfig:
        """A RunConfig from one flat set of settings: BenchConfig fields go into ``bench``.

        Why: the demo and scripts name a handful of settings (``gen``, ``family``...)
        without caring which of the two configurations owns each one.
        """
        bench_fields = set(BenchConfig.__dataclass_fields__)
        run_fields = set(cls.__dataclass_fields__) - {"bench"}
        unknown = sorted(set(values) - bench_fields - run_fields)
        if unknown:
            raise TypeError(f"not a RunConfig or BenchConfig field: {', '.join(unknown)}")
        bench = {k: v for k, v in values.items() if k in bench_fields and k not in run_fields}
        if "arms" in bench:
            bench["arms"] = tuple(bench["arms"])
        run = {k: v for k, v in values.items() if k in run_fields}
        return cls(bench=BenchConfig(**bench), **run)

    @property
    def effective_arms(self) -> tuple[str, ...]:
        """With ``fuse`` the pypto+graph arm runs in the same bench run as the others,
        so the before/after ratio is measured side by side, not across runs."""
        arms = tuple(self.bench.arms)
        if self.fuse:
            if "graph" not in arms:
                arms += ("graph",)
            if "pypto+graph" not in arms:
                arms += ("pypto+graph",)
        return arms

    def secrets(self) -> list[str]:
        """Strings that must never be printed or written: the token, endpoint credentials."""
        found = [self.token] if self.token else []
        if self.endpoint:
            try:
                parts = urlsplit(self.endpoint)
                found += [p for p in (parts.password, parts.username) if p]
            except ValueError:
                pass
        return found

    def bench_config(
        self,
        *,
        model_path: str | None,
        report_file: str | None,
        trust_remote_code: bool = False,
        command_line: list[str] | None = None,
    ) -> BenchConfig:
        """The pypto-bench configuration this run's bench step uses."""
        return replace(
            self.bench,
            model_path=model_path,
            report_file=report_file,
            trust_remote_code=trust_remote_code,
            arms=self.effective_arms,
            command_line=command_line,
        )

    def validate(self) -> None:
        """Reject a bad request with a one-line error before anything is written."""
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
        else:
            self._validate_download()
        if self.family and (self.auto_map or self.copies):
            raise BadRunInputError(
                "--family and --auto-map/--copy are exclusive: use a preset or custom mode"
            )
        if self.family and "patch" not in self.skip:
            self._validate_family()
        if self.fuse and "bench" in self.skip:
            raise BadRunInputError("--fuse measures in the bench step, which --skip bench skips")
        if self.tune:
            self._validate_tune()
        if "bench" not in self.skip:
            # Bench flags are checked before any step runs, so a typo in --arms does not
            # surface only after a long download.
            from pypto_bench import BadInputError

            try:
                bench = self.bench_config(model_path=None, report_file=None)
                # --nnodes N: each node runs this command with its own work dir (its own
                # download, pin and smoke); the bench step joins the nodes' ranks.
                bench.validate()
                if bench.history:  # a refused or unwritable history stops the run before
                    # any step (the bench step once ran and then could not record it)
                    from pypto_bench.history import check_writable

                    check_writable(bench.history)
            except BadInputError as err:
                raise BadRunInputError(
                    str(err), cause=cause_of("pypto-bench", "pypto_bench", err.exit_code)
                ) from err

    def _validate_download(self) -> None:
        from pypto_download import DownloadError, resolve_endpoint, validate_model_id

        assert self.model_id is not None
        try:
            validate_model_id(self.model_id)
            resolve_endpoint(self.endpoint)
        except DownloadError as err:
            raise BadRunInputError(
                str(err), cause=cause_of("pypto-download", "pypto_download", err.exit_code)
            ) from err

    def _validate_family(self) -> None:
        from pypto_patch import PatchError, get_preset

        assert self.family is not None
        try:
            get_preset(self.family)
        except PatchError as err:
            raise BadRunInputError(
                str(err), cause=cause_of("pypto-patch", "pypto_patch", err.exit_code)
            ) from err

    def _validate_tune(self) -> None:
        """The tune settings, checked before any step so a typo never costs a download.

        Whether pypto-tune is installed is checked first: without it no other tune
        setting means anything, and the fix is the install line.
        """
        if "tune" in self.skip:
            return
        if "bench" in self.skip:
            raise BadRunInputError(
                "--tune profiles the bench's step, which --skip bench skips: drop one of them"
            )
        nnodes, nproc = self.bench.nnodes, self.bench.nproc
        for flag, n in (("--nnodes", nnodes), ("--nproc", nproc)):
            if isinstance(n, int) and not isinstance(n, bool) and n > 1:
                # A bad count: the bench's checks name it. The tune step profiles one
                # process and advises on its profile; ranks get a profile each, from
                # pypto-tune itself (no advice: a summary of the ranks).
                raise BadRunInputError(
                    f"--tune with {flag} {n}: the tune step profiles one process; drop "
                    f"--tune, and keep a profile per rank with pypto-tune profile {flag} "
                    f"{n} ... --out DIR (docs/tuning.md, section 7)"
                )
        try:
            import pypto_tune
        except ImportError as err:
            raise E2EEnvironmentError(
                f"--tune needs pypto-tune, which is not installed: {TUNE_INSTALL}"
            ) from err
        from pypto_bench import ARMS

        if self.tune_arm not in ARMS:
            raise BadRunInputError(
                f"unknown --tune-arm {self.tune_arm!r}: choose from {', '.join(ARMS)}"
            )
        levels = tuple(pypto_tune.LEVELS)
        if self.tune_level not in levels:
            raise BadRunInputError(
                f"unknown --tune-level {self.tune_level!r}: choose from {', '.join(levels)}"
            )
        iters = self.tune_iters
        if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
            raise BadRunInputError(
                f"--tune-iters must be an integer >= 1 (got {iters!r}): e.g. --tune-iters 3"
            )
