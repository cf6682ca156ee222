"""Typed errors of pypto-tune, each carrying its CLI exit code (read them by name)."""

from __future__ import annotations

from pypto_common import ExitCodeTable

__all__ = [
    "EXIT",
    "BadInputError",
    "EnvironmentMissingError",
    "NotComparableError",
    "OutputWriteError",
    "ProfileFailedError",
    "ProfileFormatError",
    "SearchFailedError",
    "TuneError",
    "from_bench_error",
]

#: pypto-tune's exit codes (shared 0-3 plus its own range 80-89).
EXIT = ExitCodeTable(
    "pypto-tune",
    [
        (0, "OK", "success"),
        (1, "FAILED", "the job failed for a reason not listed below (details on stderr)"),
        (2, "USAGE", "bad flags or input; nothing was profiled or written"),
        (3, "ENVIRONMENT", "the requested device, profiler or optional dependency is missing"),
        (
            80,
            "BAD_PROFILE",
            "a profile file is unreadable, not a pypto-tune profile, or of a newer schema",
        ),
        (81, "PROFILE_FAILED", "the profiled step raised; nothing was written"),
        (
            82,
            "NOT_COMPARABLE",
            "compare: the two profiles measure different models, regimes or shapes",
        ),
        (83, "SEARCH_FAILED", "tile-search: no candidate tiling ran in the cost model"),
        (
            84,
            "WRITE_FAILED",
            "an output (--out, advise --write) could not be written: disk full, read-only "
            "or not a folder; the path is named",
        ),
    ],
)


class TuneError(Exception):
    """Base of every pypto-tune error; ``str()`` is one line naming the problem and the fix."""

    exit_code = EXIT.FAILED


class BadInputError(TuneError, ValueError):
    """The request is wrong (flags, paths, shapes); nothing was run or written."""

    exit_code = EXIT.USAGE


class EnvironmentMissingError(TuneError):
    """A device, profiler backend or optional dependency is not available here."""

    exit_code = EXIT.ENVIRONMENT


class ProfileFormatError(TuneError):
    """A profile (or a vendor profiler's output folder) cannot be read."""

    exit_code = EXIT.BAD_PROFILE


class ProfileFailedError(TuneError):
    """The step being profiled raised."""

    exit_code = EXIT.PROFILE_FAILED


class NotComparableError(TuneError):
    """Two profiles that do not measure the same thing."""

    exit_code = EXIT.NOT_COMPARABLE


class OutputWriteError(TuneError):
    """An output file could not be written (full disk, read-only file system...)."""

    exit_code = EXIT.WRITE_FAILED


class SearchFailedError(TuneError):
    """No candidate of a tile search ran."""

    exit_code = EXIT.SEARCH_FAILED


def from_bench_error(err: Exception) -> TuneError:
    """A pypto-bench error as pypto-tune's own kind (exit codes stay in this tool's table):
    a bad request or a missing environment keeps its kind, a failed rank or step is a
    failed profile, anything else a plain failure."""
    import pypto_bench

    msg = str(err)
    if isinstance(err, pypto_bench.BadInputError):
        return BadInputError(msg)
    if isinstance(err, pypto_bench.EnvironmentMissingError):
        return EnvironmentMissingError(msg)
    if isinstance(err, pypto_bench.RankFailedError):
        return ProfileFailedError(msg)
    return TuneError(msg)
