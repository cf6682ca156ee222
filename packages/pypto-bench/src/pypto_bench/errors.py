"""Typed errors of pypto-bench.

Each error carries the CLI exit code it maps to, so the CLI stays a thin layer that
prints ``str(err)`` as one line and exits with ``err.exit_code``: callers (pypto-e2e,
scripts) can tell "bad input" from "the environment lacks a device" from "the job
failed" without parsing messages.
"""

from __future__ import annotations

# Exit codes (shared convention + the smoke gate's own, documented in the README).
EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3
EXIT_LOAD_FAILED = 10
EXIT_GENERATION_FAILED = 11
EXIT_DEGENERATE = 12
EXIT_LOW_COHERENCE = 13


class BenchError(Exception):
    """Base of every pypto-bench error; ``str()`` is one line naming problem and fix."""

    exit_code = EXIT_JOB_FAILED


class BadInputError(BenchError, ValueError):
    """The request itself is wrong (flags, paths, a regime the model cannot run)."""

    exit_code = EXIT_BAD_INPUT


class ModelNotFoundError(BadInputError):
    """The model path is missing or is not a model folder."""


class RegimeNotSupportedError(BadInputError):
    """The model cannot run the requested regime (e.g. diffusion on an autoregressive LM)."""


class ReportPathError(BadInputError):
    """The report cannot be written where asked; checked before any work starts."""


class EnvironmentMissingError(BenchError):
    """Something the run needs is absent here (a device, an optional dependency)."""

    exit_code = EXIT_ENVIRONMENT


class ModelLoadError(BenchError):
    """from_pretrained failed (including a model that needs --trust-remote-code)."""

    exit_code = EXIT_LOAD_FAILED


class GenerationError(BenchError):
    """Generation raised or produced non-finite logits."""

    exit_code = EXIT_GENERATION_FAILED


class DegenerateOutputError(BenchError):
    """Generation ran but its output is empty, one repeated token or undecodable."""

    exit_code = EXIT_DEGENERATE


class CompareMismatchError(BadInputError):
    """Reports of different regimes or machines were compared without --force."""


class PluginError(BenchError):
    """No kernel plug-in applies, or a plug-in misbehaved."""
