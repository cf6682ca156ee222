"""Typed failures, each with its own exit code, raised deep and printed once at the CLI edge.

Callers (shell scripts, the e2e pipeline) need to tell "fix your token" from "the
server is down" without parsing messages, hence one class and one code per cause. The
codes live in :data:`EXIT`, checked against the project's ranges (pypto-download owns
10-29), and docs/exit-codes.md is generated from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from pypto_common import FAILED, USAGE, ExitCodeTable, redact

__all__ = [
    "EXIT",
    "INTERRUPTED_EXIT",
    "AuthError",
    "BadInputError",
    "DiskFullError",
    "DownloadError",
    "FolderBusyError",
    "HubServerError",
    "HubTimeoutError",
    "HubUnreachableError",
    "IntegrityError",
    "InvalidModelIdError",
    "NoMatchingFilesError",
    "OfflineIncompleteError",
    "OutputPathError",
    "RepoNotFoundError",
    "RevisionNotFoundError",
    "TruncatedTransferError",
    "UnsafeListingError",
]

EXIT = ExitCodeTable(
    "pypto-download",
    [
        (FAILED, "FAILED", "unexpected failure (one line; -v for details)"),
        (
            USAGE,
            "USAGE",
            "bad usage: unknown flag, a numeric flag out of range, endpoint not http(s); nothing was changed",
        ),
        (10, "INVALID_MODEL_ID", "malformed model id (checked before any network or disk access)"),
        (11, "REPO_NOT_FOUND", "repository not found (or private without access)"),
        (12, "REVISION_NOT_FOUND", "branch / tag / commit not found"),
        (13, "UNAUTHORIZED", "gated or unauthorized: pass --token or set HF_TOKEN"),
        (14, "UNREACHABLE", "the hub cannot be reached after all retries"),
        (15, "OUTPUT_PATH", "output path unusable: a file, not writable, or a pypto-patch overlay"),
        (16, "DISK_FULL", "no space left on the device"),
        (17, "INTEGRITY", "a file failed its size/hash check twice (the bad copy is removed)"),
        (
            18,
            "OFFLINE_INCOMPLETE",
            "HF_HUB_OFFLINE=1 and the folder holds no complete verified copy",
        ),
        (19, "NO_MATCHING_FILES", "the patterns match no file of the repo"),
        (20, "SERVER_ERROR", "the hub kept answering 5xx/429 after all retries"),
        (21, "FOLDER_BUSY", "another pypto-download is writing to the output folder"),
        (22, "TRUNCATED", "transfers kept ending early (truncated body) after all retries"),
        (
            23,
            "READ_TIMEOUT",
            "the hub kept sending nothing for --read-timeout seconds after all retries",
        ),
        (
            24,
            "UNSAFE_LISTING",
            "the hub listed an unsafe or malformed file path; nothing was written",
        ),
    ],
)

#: Ctrl-C: the shell's 128 + SIGINT, outside the table because it is not ours to choose.
INTERRUPTED_EXIT = 130


class DownloadError(Exception):
    """Base class: ``str(err)`` is one line naming the problem and the fix."""

    exit_code = EXIT.FAILED
    kind = "failed"

    def __init__(self, message: str) -> None:
        # One line, always: multi-line hub messages are flattened by the raiser.
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)

    def redacted(self, secrets: Iterable[str | None]) -> DownloadError:
        """Mask secrets in the message in place (a server may echo them); returns self."""
        self.args = (redact(self.message, secrets),)
        return self

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "exit_code": self.exit_code}


class BadInputError(DownloadError):
    """Bad arguments other than the model id (e.g. an endpoint that is not a URL)."""

    exit_code = EXIT.USAGE
    kind = "bad_input"


class InvalidModelIdError(DownloadError):
    exit_code = EXIT.INVALID_MODEL_ID
    kind = "invalid_model_id"


class RepoNotFoundError(DownloadError):
    exit_code = EXIT.REPO_NOT_FOUND
    kind = "repo_not_found"


class RevisionNotFoundError(DownloadError):
    exit_code = EXIT.REVISION_NOT_FOUND
    kind = "revision_not_found"


class AuthError(DownloadError):
    """Gated or private repo without (valid) credentials."""

    exit_code = EXIT.UNAUTHORIZED
    kind = "unauthorized"


class HubUnreachableError(DownloadError):
    exit_code = EXIT.UNREACHABLE
    kind = "unreachable"


class OutputPathError(DownloadError):
    exit_code = EXIT.OUTPUT_PATH
    kind = "output_path"


class DiskFullError(DownloadError):
    exit_code = EXIT.DISK_FULL
    kind = "disk_full"


class IntegrityError(DownloadError):
    exit_code = EXIT.INTEGRITY
    kind = "integrity"


class OfflineIncompleteError(DownloadError):
    """Offline mode asked for, but the folder does not hold a complete verified copy."""

    exit_code = EXIT.OFFLINE_INCOMPLETE
    kind = "offline_incomplete"


class NoMatchingFilesError(DownloadError):
    exit_code = EXIT.NO_MATCHING_FILES
    kind = "no_matching_files"


class HubServerError(DownloadError):
    """The hub kept answering 5xx/429 after every retry."""

    exit_code = EXIT.SERVER_ERROR
    kind = "server_error"


class FolderBusyError(DownloadError):
    """Another process holds the output folder's lock: two writers would take each
    other's partial files."""

    exit_code = EXIT.FOLDER_BUSY
    kind = "folder_busy"


class TruncatedTransferError(DownloadError):
    """Bodies kept ending before their announced or listed size: not "unreachable",
    since the server answered, but something on the way cuts transfers."""

    exit_code = EXIT.TRUNCATED
    kind = "truncated"


class HubTimeoutError(DownloadError):
    """The server accepted requests and then went quiet for longer than --read-timeout."""

    exit_code = EXIT.READ_TIMEOUT
    kind = "read_timeout"


class UnsafeListingError(DownloadError):
    """The listing named a path outside the folder (``../x``, ``/etc/x``) or was
    malformed: a hostile or broken server; the whole download is refused."""

    exit_code = EXIT.UNSAFE_LISTING
    kind = "unsafe_listing"
