"""Model id -> local folder, resumable, verified and retried, with one-line errors.

Library first: :func:`download` returns the folder, :func:`fetch` the details
(what was fetched, the commit, the plan in dry-run mode). The ``pypto-download``
command is a thin layer over them.
"""

__version__ = "0.1.0"

from .core import (
    DEFAULT_ENDPOINT,
    DownloadResult,
    RemoteFile,
    download,
    fetch,
    resolve_endpoint,
    validate_model_id,
)
from .errors import (
    AuthError,
    BadInputError,
    DiskFullError,
    DownloadError,
    HubServerError,
    HubUnreachableError,
    IntegrityError,
    InvalidModelIdError,
    NoMatchingFilesError,
    OfflineIncompleteError,
    OutputPathError,
    RepoNotFoundError,
    RevisionNotFoundError,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "AuthError",
    "BadInputError",
    "DiskFullError",
    "DownloadError",
    "DownloadResult",
    "HubServerError",
    "HubUnreachableError",
    "IntegrityError",
    "InvalidModelIdError",
    "NoMatchingFilesError",
    "OfflineIncompleteError",
    "OutputPathError",
    "RemoteFile",
    "RepoNotFoundError",
    "RevisionNotFoundError",
    "__version__",
    "download",
    "fetch",
    "resolve_endpoint",
    "validate_model_id",
]
