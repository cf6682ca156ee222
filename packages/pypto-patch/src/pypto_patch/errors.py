"""Typed errors, each carrying the CLI exit code it maps to.

Callers (the CLI, pypto-e2e) tell failures apart by class or by ``exit_code``; the
message is always one line that names the problem and the fix.
"""

from __future__ import annotations

#: Exit codes: 0 ok, 1 the job failed, 2 bad usage/input, 3 environment missing;
#: pypto-patch's own codes start at 10.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3
EXIT_NOT_PATCHED = 10
EXIT_MODIFIED = 11
EXIT_LOCKED = 12
EXIT_PRESET_INVALID = 13
EXIT_FAULT_INJECTED = 99


class PatchError(Exception):
    """Base of every pypto-patch error; ``exit_code`` is what the CLI exits with."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str) -> None:
        # One line, always: the CLI prints str(err) as-is.
        super().__init__(" ".join(str(message).split()))


class BadInputError(PatchError):
    """The folder, the flags or the files named do not allow a patch; nothing was changed."""

    exit_code = EXIT_BAD_INPUT


class ModelFolderError(BadInputError):
    """The model folder is missing, has no usable config.json, or cannot be written."""


class ConfigError(ModelFolderError):
    """config.json is not valid JSON or not a JSON object."""


class ReadOnlyFolderError(ModelFolderError):
    """The folder (or a directory a file goes into) is not writable."""


class UnknownFamilyError(BadInputError):
    """No installed preset has this family name."""


class UnsafePathError(BadInputError):
    """A destination escapes the model folder or would write through a symbolic link."""


class OutputDirError(BadInputError):
    """The overlay output folder is unusable (not empty without --force, or overlaps the model)."""


class PresetInvalidError(PatchError):
    """An installed preset (or one passed in) is malformed; the message names its package."""

    exit_code = EXIT_PRESET_INVALID


class NotPatchedError(PatchError):
    """restore/status on a folder that carries no pypto-patch manifest."""

    exit_code = EXIT_NOT_PATCHED


class ModifiedSincePatchError(PatchError):
    """Patched files (or their backups) were changed after the patch; refusing to discard edits."""

    exit_code = EXIT_MODIFIED


class LockedError(PatchError):
    """Another pypto-patch run holds this folder's lock."""

    exit_code = EXIT_LOCKED


class PatchFailedError(PatchError):
    """An I/O error part way through; the folder was rolled back to its state before the run."""

    exit_code = EXIT_FAILED
