"""Model id -> local folder, resumable, verified and retried, with one-line errors.

Library first: :func:`download` returns the folder, :func:`fetch` the details
(what was fetched, the commit, the plan in dry-run mode). The ``pypto-download``
command is a thin layer over them.
"""

__version__ = "0.1.0"

from .core import (
    DEFAULT_ENDPOINT,
    DEFAULT_MAX_RETRY_WAIT,
    DEFAULT_READ_TIMEOUT,
    DownloadResult,
    RemoteFile,
    SkippedFile,
    download,
    fetch,
    resolve_endpoint,
    validate_model_id,
)
from .errors import (
    EXIT,
    AuthError,
    BadInputError,
    DiskFullError,
    DownloadError,
    FolderBusyError,
    HubServerError,
    HubTimeoutError,
    HubUnreachableError,
    IntegrityError,
    InvalidModelIdError,
    NoMatchingFilesError,
    OfflineIncompleteError,
    OutputPathError,
    RepoNotFoundError,
    RevisionNotFoundError,
    TruncatedTransferError,
    UnsafeListingError,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_MAX_RETRY_WAIT",
    "DEFAULT_READ_TIMEOUT",
    "EXIT",
    "AuthError",
    "BadInputError",
    "DiskFullError",
    "DownloadError",
    "DownloadResult",
    "FolderBusyError",
    "HubServerError",
    "HubTimeoutError",
    "HubUnreachableError",
    "IntegrityError",
    "InvalidModelIdError",
    "NoMatchingFilesError",
    "OfflineIncompleteError",
    "OutputPathError",
    "RemoteFile",
    "RepoNotFoundError",
    "RevisionNotFoundError",
    "SkippedFile",
    "TruncatedTransferError",
    "UnsafeListingError",
    "__version__",
    "download",
    "fetch",
    "resolve_endpoint",
    "validate_model_id",
]
