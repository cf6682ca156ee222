"""Names pypto-patch owns or reads inside a model folder, in one place.

The bookkeeping names come from :mod:`pypto_common` because pypto-download must refuse
a repo that ships them (a forged journal would steer our renames); the rest list the
files through which transformers can be made to import a folder's own code.
"""

from __future__ import annotations

from pypto_common import PATCH_JOURNAL, PATCH_MANIFEST, PATCH_OVERLAY_MARKER, PATCH_SUFFIXES

__all__ = [
    "AUTO_MAP_FILES",
    "BACKUP_SUFFIX",
    "EDITED_SUFFIX",
    "JOURNAL_NAME",
    "MANIFEST_NAME",
    "OVERLAY_MARKER_NAME",
    "REMOTE_CODE_CONFIG_KEYS",
    "REMOTE_CODE_FILES",
    "TMP_SUFFIX",
]

MANIFEST_NAME = PATCH_MANIFEST
JOURNAL_NAME = PATCH_JOURNAL
OVERLAY_MARKER_NAME = PATCH_OVERLAY_MARKER
# pypto_common lists them in this order; tests/test_names.py pins the mapping.
BACKUP_SUFFIX, EDITED_SUFFIX, TMP_SUFFIX = PATCH_SUFFIXES

#: Top-level files transformers 5.x reads an ``auto_map`` from (processor_config.json
#: may also nest one per sub-processor: ``{"image_processor": {"auto_map": ...}}``).
AUTO_MAP_FILES = (
    "config.json",
    "tokenizer_config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "audio_tokenizer_config.json",
)

#: Files transformers imports from a local folder without any auto_map entry:
#: ``from_pretrained(..., trust_remote_code=True)`` replaces ``model.generate`` with the
#: ``generate`` function of this module whenever it exists.
REMOTE_CODE_FILES = ("custom_generate/generate.py",)

#: config.json keys (besides ``auto_map``) that name classes to import from the folder:
#: ``pipeline(model=folder, trust_remote_code=True)`` imports ``custom_pipelines[task]["impl"]``.
REMOTE_CODE_CONFIG_KEYS = ("custom_pipelines",)
