"""Typed errors of pypto-bench.

Each error carries the CLI exit code it maps to, so the CLI stays a thin layer that
prints ``str(err)`` as one line and exits with ``err.exit_code``: callers (pypto-e2e,
scripts) can tell "bad input" from "the environment lacks a device" from "the job
failed" without parsing messages.
"""

from __future__ import annotations

from pypto_common import ExitCodeTable

__all__ = [
    "EXIT",
    "BadInputError",
    "BenchError",
    "CompareMismatchError",
    "DegenerateOutputError",
    "EnvironmentMissingError",
    "GenerationError",
    "HistoryError",
    "ModelLoadError",
    "ModelNotFoundError",
    "NoTensorParallelPlanError",
    "NonFiniteLogitsError",
    "PluginError",
    "RankFailedError",
    "RegimeNotSupportedError",
    "ReportPathError",
    "ReportWriteError",
    "TooManyRanksError",
]

#: pypto-bench's exit codes (shared 0-3 plus its own ranges 40-49 and 110-119); read them by name.
EXIT = ExitCodeTable(
    "pypto-bench",
    [
        (0, "OK", "success: the smoke gate passed / every arm ran"),
        (1, "FAILED", "the job failed for a reason not listed below (details on stderr)"),
        (2, "USAGE", "bad flags or input (path, regime the model cannot run); nothing was run"),
        (3, "ENVIRONMENT", "the requested device or an optional dependency is missing"),
        (40, "LOAD_FAILED", "the model did not load (e.g. it needs --trust-remote-code)"),
        (41, "GENERATION_FAILED", "generation raised or produced non-finite logits"),
        (42, "DEGENERATE", "generated output is empty, one repeated token or undecodable"),
        (43, "LOW_COHERENCE", "smoke --strict: the coherence score is below --min-coherence"),
        (44, "ARM_FAILED", "run: at least one arm failed; the report records why"),
        (
            45,
            "REPORT_FALLBACK",
            "run: the report could not be written to --report-file (or the page to --html); "
            "it was saved to the fallback path named on stderr",
        ),
        (
            46,
            "REPORT_UNWRITTEN",
            "run: the report could be written nowhere (its JSON was printed on stdout), or the "
            "--html page could be written nowhere (the error names it)",
        ),
        (
            47,
            "TOO_MANY_RANKS",
            "run --nproc N: N is larger than the visible devices (CPU: cores); nothing was launched",
        ),
        (
            48,
            "RANK_FAILED",
            "run --nproc N: a rank failed or hung; every rank was ended, the error names it",
        ),
        (
            49,
            "REGRESSION",
            "history check: the newest run of a (model, regime, arm, device) is slower than "
            "its history (the rule is in the README); the lines on stderr name it",
        ),
        (
            110,
            "INACCURATE",
            "run: an arm failed the numerical gate (its logits differ from eager's beyond the "
            "dtype's allowance: it computes something else); it is marked 'numerics: fail' and "
            "its ratios 'not comparable'; or, with --reference DEVICE, the eager arm's logits "
            "differ from the reference device's beyond the noise floor (the first diverging "
            "module is named); --allow-inaccurate exits 0 instead",
        ),
        (
            111,
            "NOT_RECORDED",
            "run --history: the run finished and its report was written, but the history "
            "could not record it (locked by another writer, made read-only during the run); "
            "the error gives the `history add` command that records it later",
        ),
    ],
)


class BenchError(Exception):
    """Base of every pypto-bench error; ``str()`` is one line naming problem and fix."""

    exit_code = EXIT.FAILED


class BadInputError(BenchError, ValueError):
    """The request itself is wrong (flags, paths, a regime the model cannot run)."""

    exit_code = EXIT.USAGE


class ModelNotFoundError(BadInputError):
    """The model path is missing or is not a model folder."""


class RegimeNotSupportedError(BadInputError):
    """The model cannot run the requested regime (e.g. diffusion on an autoregressive LM)."""


class ReportPathError(BadInputError):
    """The report cannot be written where asked; checked before any work starts."""


class EnvironmentMissingError(BenchError):
    """Something the run needs is absent here (a device, an optional dependency)."""

    exit_code = EXIT.ENVIRONMENT


class TooManyRanksError(EnvironmentMissingError):
    """``--nproc`` asks for more ranks than there are devices to give one each."""

    exit_code = EXIT.TOO_MANY_RANKS


class NoTensorParallelPlanError(BadInputError):
    """``--nproc > 1`` on a model family that has no tensor-parallel plan to shard it by."""


class RankFailedError(BenchError):
    """A rank of a ``--nproc`` run failed or hung; the message names it and its cause."""

    exit_code = EXIT.RANK_FAILED


class ModelLoadError(BenchError):
    """from_pretrained failed (including a model that needs --trust-remote-code)."""

    exit_code = EXIT.LOAD_FAILED


class GenerationError(BenchError):
    """Generation raised or produced non-finite logits."""

    exit_code = EXIT.GENERATION_FAILED


class NonFiniteLogitsError(GenerationError):
    """The model's logits hold NaN or +inf: no arm of it computes a comparable answer."""


class DegenerateOutputError(BenchError):
    """Generation ran but its output is empty, one repeated token or undecodable."""

    exit_code = EXIT.DEGENERATE


class CompareMismatchError(BadInputError):
    """Reports of different regimes or machines were compared without --force."""


class HistoryError(BadInputError):
    """A results-history database that cannot be used as one (missing, not SQLite, another
    schema or version, a link, a FIFO, a huge row); nothing was changed in it."""


class PluginError(BenchError):
    """No kernel plug-in applies, or a plug-in misbehaved."""


class ReportWriteError(BenchError):
    """The finished report could not be written (neither where asked nor to a fallback).

    ``text`` is the report's JSON so the caller can still hand it to the user.
    """

    exit_code = EXIT.REPORT_UNWRITTEN

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        self.text = text
