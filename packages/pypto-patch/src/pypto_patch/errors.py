"""Typed errors, each carrying the CLI exit code it maps to.

Callers (the CLI, pypto-e2e) tell failures apart by class or by ``exit_code``, read by
name from :data:`EXIT` (``EXIT.NOT_PATCHED``), never as literal numbers; the message is
always one line that names the problem and the fix.
"""

from __future__ import annotations

from pypto_common import ExitCodeTable

__all__ = [
    "EXIT",
    "BadInputError",
    "ConfigError",
    "LockedError",
    "ModelFolderError",
    "ModifiedSincePatchError",
    "NotPatchedError",
    "NotPinnedError",
    "OutputDirError",
    "OverlayRefusedError",
    "PatchError",
    "PatchFailedError",
    "PresetInvalidError",
    "PresetMismatchError",
    "ReadOnlyFolderError",
    "UnknownFamilyError",
    "UnsafeBookkeepingError",
    "UnsafePathError",
]

#: pypto-patch's exit codes: the shared 0-3 plus its own range 30-39.
EXIT = ExitCodeTable(
    "pypto-patch",
    [
        (30, "NOT_PATCHED", "restore/status/verify: the folder carries no pypto-patch manifest"),
        (
            31,
            "MODIFIED",
            "patched files or their backups changed since the patch (restore needs --force, "
            "which keeps edits as <name>.pypto_edited; a damaged backup is never restored)",
        ),
        (32, "LOCKED", "another pypto-patch run holds the folder's lock (waited --lock-timeout)"),
        (33, "PRESET_INVALID", "an installed preset is malformed; the message names its package"),
        (34, "UNKNOWN_FAMILY", "no installed preset has this family name"),
        (
            35,
            "UNSAFE_BOOKKEEPING",
            "a manifest, journal or overlay marker in the folder was not written by pypto-patch "
            "for this very folder, or names paths outside it; nothing was touched",
        ),
        (
            36,
            "OVERLAY_REFUSED",
            "--output-dir is not empty and is not an overlay pypto-patch made there (never "
            "replaced), or replacing an earlier overlay needs --replace-overlay",
        ),
        (
            37,
            "NOT_PINNED",
            "verify: an auto_map entry (or other remote-code hook) does not resolve to code the "
            "preset placed, or a placed file's bytes changed",
        ),
        (39, "FAULT_INJECTED", "test-only: PYPTO_PATCH_FAULT stopped the run at a named step"),
    ],
)


class PatchError(Exception):
    """Base of every pypto-patch error; ``exit_code`` is what the CLI exits with."""

    exit_code = EXIT.FAILED

    def __init__(self, message: str) -> None:
        # One line, always: the CLI prints str(err) as-is.
        super().__init__(" ".join(str(message).split()))


class BadInputError(PatchError):
    """The folder, the flags or the files named do not allow a patch; nothing was changed."""

    exit_code = EXIT.USAGE


class PresetMismatchError(BadInputError):
    """The folder's config.json does not fit the chosen preset (the preset's own check)."""


class ModelFolderError(BadInputError):
    """The model folder is missing, has no usable config.json, or cannot be written."""


class ConfigError(ModelFolderError):
    """A JSON file pypto-patch must read (config.json, tokenizer_config.json, ...) is unusable."""


class ReadOnlyFolderError(ModelFolderError):
    """The folder (or a directory a file goes into) is not writable."""


class UnknownFamilyError(BadInputError):
    """No installed preset has this family name."""

    exit_code = EXIT.UNKNOWN_FAMILY


class UnsafePathError(BadInputError):
    """A destination escapes the model folder or would write through a symbolic link."""


class OutputDirError(BadInputError):
    """The overlay output folder is unusable (a file, a link, or overlapping the model folder)."""


class OverlayRefusedError(OutputDirError):
    """--output-dir holds something pypto-patch did not build there; it is never replaced."""

    exit_code = EXIT.OVERLAY_REFUSED


class PresetInvalidError(PatchError):
    """An installed preset (or one passed in) is malformed; the message names its package."""

    exit_code = EXIT.PRESET_INVALID


class NotPatchedError(PatchError):
    """restore/status/verify on a folder that carries no pypto-patch manifest."""

    exit_code = EXIT.NOT_PATCHED


class ModifiedSincePatchError(PatchError):
    """Patched files (or their backups) were changed after the patch; refusing to discard edits."""

    exit_code = EXIT.MODIFIED


class LockedError(PatchError):
    """Another pypto-patch run holds this folder's lock."""

    exit_code = EXIT.LOCKED


class UnsafeBookkeepingError(PatchError):
    """A manifest/journal/marker is not bound to this folder or names paths outside it.

    Why a class of its own: a model folder comes from a stranger's repo, and a record
    shipped in it must never steer a rename or unlink; callers (pypto-e2e) stop on it.
    """

    exit_code = EXIT.UNSAFE_BOOKKEEPING


class NotPinnedError(PatchError):
    """verify_pinned: the folder would let transformers import code the preset did not place."""

    exit_code = EXIT.NOT_PINNED


class PatchFailedError(PatchError):
    """An I/O error part way through; the folder was rolled back to its state before the run."""

    exit_code = EXIT.FAILED
