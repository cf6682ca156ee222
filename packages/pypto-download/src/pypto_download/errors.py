"""Typed failures, each with its own exit code, raised deep and printed once at the CLI edge.

Callers (shell scripts, the e2e pipeline) need to tell "fix your token" from "the
server is down" without parsing messages, hence one class and one code per cause.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BadInputError",
    "DiskFullError",
    "DownloadError",
    "HubServerError",
    "HubUnreachableError",
    "IntegrityError",
    "InvalidModelIdError",
    "NoMatchingFilesError",
    "OfflineIncompleteError",
    "OutputPathError",
    "RepoNotFoundError",
    "RevisionNotFoundError",
]


class DownloadError(Exception):
    """Base class: ``str(err)`` is one line naming the problem and the fix."""

    exit_code = 1
    kind = "failed"

    def __init__(self, message: str) -> None:
        # One line, always: multi-line hub messages are flattened by the raiser.
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "exit_code": self.exit_code}


class BadInputError(DownloadError):
    """Bad arguments other than the model id (e.g. an endpoint that is not a URL)."""

    exit_code = 2
    kind = "bad_input"


class InvalidModelIdError(DownloadError):
    exit_code = 10
    kind = "invalid_model_id"


class RepoNotFoundError(DownloadError):
    exit_code = 11
    kind = "repo_not_found"


class RevisionNotFoundError(DownloadError):
    exit_code = 12
    kind = "revision_not_found"


class AuthError(DownloadError):
    """Gated or private repo without (valid) credentials."""

    exit_code = 13
    kind = "unauthorized"


class HubUnreachableError(DownloadError):
    exit_code = 14
    kind = "unreachable"


class OutputPathError(DownloadError):
    exit_code = 15
    kind = "output_path"


class DiskFullError(DownloadError):
    exit_code = 16
    kind = "disk_full"


class IntegrityError(DownloadError):
    exit_code = 17
    kind = "integrity"


class OfflineIncompleteError(DownloadError):
    """Offline mode asked for, but the folder does not hold a complete verified copy."""

    exit_code = 18
    kind = "offline_incomplete"


class NoMatchingFilesError(DownloadError):
    exit_code = 19
    kind = "no_matching_files"


class HubServerError(DownloadError):
    """The hub kept answering 5xx/429 after every retry."""

    exit_code = 20
    kind = "server_error"
