"""pypto-patch: pin a HuggingFace model folder's remote code to reviewed, installed code.

Library first: :func:`apply`, :func:`restore`, :func:`status`, :func:`list_presets`;
the ``pypto-patch`` CLI is a thin layer over them.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .core import (
    FAULT_POINTS,
    MANIFEST_SCHEMA_VERSION,
    FileChange,
    PatchResult,
    RestoreResult,
    StatusResult,
    apply,
    read_manifest,
    restore,
    status,
)
from .errors import (
    BadInputError,
    ConfigError,
    LockedError,
    ModelFolderError,
    ModifiedSincePatchError,
    NotPatchedError,
    OutputDirError,
    PatchError,
    PatchFailedError,
    PresetInvalidError,
    ReadOnlyFolderError,
    UnknownFamilyError,
    UnsafePathError,
)
from .modcache import folder_cache_keys, local_module_hash, modules_cache_dir
from .presets import (
    BACKUP_SUFFIX,
    ENTRY_POINT_GROUP,
    JOURNAL_NAME,
    MANIFEST_NAME,
    Preset,
    discover_presets,
    get_preset,
    list_presets,
)

__all__ = [
    "BACKUP_SUFFIX",
    "ENTRY_POINT_GROUP",
    "FAULT_POINTS",
    "JOURNAL_NAME",
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA_VERSION",
    "BadInputError",
    "ConfigError",
    "FileChange",
    "LockedError",
    "ModelFolderError",
    "ModifiedSincePatchError",
    "NotPatchedError",
    "OutputDirError",
    "PatchError",
    "PatchFailedError",
    "PatchResult",
    "Preset",
    "PresetInvalidError",
    "ReadOnlyFolderError",
    "RestoreResult",
    "StatusResult",
    "UnknownFamilyError",
    "UnsafePathError",
    "__version__",
    "apply",
    "discover_presets",
    "folder_cache_keys",
    "get_preset",
    "list_presets",
    "local_module_hash",
    "modules_cache_dir",
    "read_manifest",
    "restore",
    "status",
]
