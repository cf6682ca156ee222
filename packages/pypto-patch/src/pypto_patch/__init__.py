"""pypto-patch: pin a HuggingFace model folder's remote code to reviewed, installed code.

Library first: :func:`apply`, :func:`restore`, :func:`status`, :func:`verify_pinned`,
:func:`list_presets`; the ``pypto-patch`` CLI is a thin layer over them. Exit codes are
read by name from :data:`EXIT`.
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
    EXIT,
    BadInputError,
    ConfigError,
    LockedError,
    ModelFolderError,
    ModifiedSincePatchError,
    NotPatchedError,
    NotPinnedError,
    OutputDirError,
    OverlayRefusedError,
    PatchError,
    PatchFailedError,
    PresetInvalidError,
    PresetMismatchError,
    ReadOnlyFolderError,
    UnknownFamilyError,
    UnsafeBookkeepingError,
    UnsafePathError,
)
from .modcache import folder_cache_keys, local_module_hash, modules_cache_dir
from .names import (
    AUTO_MAP_FILES,
    BACKUP_SUFFIX,
    JOURNAL_NAME,
    MANIFEST_NAME,
    OVERLAY_MARKER_NAME,
    REMOTE_CODE_FILES,
)
from .overlay import overlay_links
from .presets import (
    ENTRY_POINT_GROUP,
    Preset,
    discover_presets,
    get_preset,
    list_presets,
)
from .verify import PinVerification, verify_pinned

__all__ = [
    "AUTO_MAP_FILES",
    "BACKUP_SUFFIX",
    "ENTRY_POINT_GROUP",
    "EXIT",
    "FAULT_POINTS",
    "JOURNAL_NAME",
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA_VERSION",
    "OVERLAY_MARKER_NAME",
    "REMOTE_CODE_FILES",
    "BadInputError",
    "ConfigError",
    "FileChange",
    "LockedError",
    "ModelFolderError",
    "ModifiedSincePatchError",
    "NotPatchedError",
    "NotPinnedError",
    "OutputDirError",
    "OverlayRefusedError",
    "PatchError",
    "PatchFailedError",
    "PatchResult",
    "PinVerification",
    "Preset",
    "PresetInvalidError",
    "PresetMismatchError",
    "ReadOnlyFolderError",
    "RestoreResult",
    "StatusResult",
    "UnknownFamilyError",
    "UnsafeBookkeepingError",
    "UnsafePathError",
    "__version__",
    "apply",
    "discover_presets",
    "folder_cache_keys",
    "get_preset",
    "list_presets",
    "local_module_hash",
    "modules_cache_dir",
    "overlay_links",
    "read_manifest",
    "restore",
    "status",
    "verify_pinned",
]
