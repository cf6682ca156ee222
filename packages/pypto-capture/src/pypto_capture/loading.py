"""Load a model for bisection from a local folder, never running the folder's own code.

Why here: ``pypto-capture bisect --model-path DIR`` (what pypto-tune recommends for
graph breaks) needs a model object, and a folder is untrusted input: its config may be
corrupt or hostile, and a folder whose ``auto_map`` names Python files it ships can only
be built by running them. Bisection never does that (``trust_remote_code=False``); such a
folder is refused in one line before transformers is asked, and a model you trust can
still be bisected from Python (``bisect_capture(model)``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pypto_common import UntrustedFileError, loads_bounded, read_regular_file, redact

from .errors import PyptoCaptureError

__all__ = [
    "CONFIG_LIMIT",
    "DTYPES",
    "ModelFolderError",
    "ModelLoadError",
    "RemoteCodeRefusedError",
    "load_local_model",
    "read_folder_config",
]

log = logging.getLogger(__name__)

#: dtype names ``load_local_model`` takes (``auto``: what the checkpoint stores).
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: A model's config.json is kilobytes; anything over this is not one.
CONFIG_LIMIT = 16 * 1024 * 1024


class ModelFolderError(PyptoCaptureError):
    """The path is not a readable model folder (missing, not a folder, bad config.json)."""


class RemoteCodeRefusedError(ModelFolderError):
    """The folder's model can only be built by running Python files the folder ships."""


class ModelLoadError(PyptoCaptureError):
    """transformers could not build or load the model from the folder."""


def read_folder_config(model_path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The resolved folder and its config.json as a dict; :class:`ModelFolderError`
    (one line naming the fix) for a missing path, a file, or an unreadable config."""
    path = Path(model_path).expanduser()
    if not str(model_path):
        raise ModelFolderError("no model path given: pass --model-path DIR (a model folder)")
    if not path.exists():
        raise ModelFolderError(f"model path {path} does not exist: pass a downloaded model folder")
    if not path.is_dir():
        raise ModelFolderError(f"model path {path} is not a folder: pass the model's folder")
    where = path / "config.json"
    try:
        config = loads_bounded(read_regular_file(where, CONFIG_LIMIT))
    except FileNotFoundError:
        raise ModelFolderError(
            f"{path} is not a model folder (no config.json): pass the folder a download produced"
        ) from None
    except (OSError, UntrustedFileError) as err:
        detail = getattr(err, "strerror", None) or str(err)
        raise ModelFolderError(f"{where} {detail}: re-download the model") from None
    if not isinstance(config, dict):
        raise ModelFolderError(
            f"{where} holds a JSON {type(config).__name__}, not an object: re-download the model"
        )
    return path.resolve(), config


def _needs_remote_code(config: dict[str, Any]) -> bool:
    """An ``auto_map`` whose ``model_type`` transformers does not know (a registered type
    wins over ``auto_map`` in transformers 5.x, so that one loads without the folder's code)."""
    if not config.get("auto_map"):
        return False
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    return not isinstance(model_type, str) or model_type not in CONFIG_MAPPING


def load_local_model(
    model_path: str | Path,
    *,
    dtype: str = "auto",
    attn_implementation: str | None = None,
) -> Any:
    """The causal LM in ``model_path`` (offline, eval mode, on the CPU), built only from
    transformers' own classes.

    Raises :class:`ModelFolderError` for a path that is no model folder,
    :class:`RemoteCodeRefusedError` when the model needs the folder's own code,
    :class:`ModelLoadError` when transformers cannot load it, ``ValueError`` for an
    unknown ``dtype``, and ``ImportError`` when transformers is not installed.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    path, config = read_folder_config(model_path)
    import torch
    import transformers  # noqa: F401 - ImportError here names the missing extra

    if _needs_remote_code(config):
        raise RemoteCodeRefusedError(
            f"{path} needs its own Python code to build model type "
            f"{config.get('model_type')!r} (auto_map in config.json); pypto-capture never runs "
            "a folder's code: pin it to maintained code (pypto-patch apply) or bisect a model "
            "you loaded yourself with pypto_capture.bisect_capture(model)"
        )
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {
        "local_files_only": True,
        "trust_remote_code": False,
        "dtype": "auto" if dtype == "auto" else getattr(torch, dtype),
    }
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except Exception as err:  # transformers raises many unrelated types here
        text = " ".join(redact(str(err)).split())
        if "trust_remote_code" in text:
            raise RemoteCodeRefusedError(
                f"{path} needs its own Python code to load; pypto-capture never runs a "
                "folder's code: bisect a model you loaded yourself with "
                "pypto_capture.bisect_capture(model)"
            ) from err
        raise ModelLoadError(
            f"loading {path} failed: {type(err).__name__}: {text[:300]}: check that the "
            "folder holds a complete causal-LM checkpoint"
        ) from err
    log.info("loaded %s (%s)", path, type(model).__name__)
    pinned = config.get("auto_map")
    if isinstance(pinned, dict) and pinned:
        # Issue #43 (L10): a folder pinned to code (pypto-patch writes auto_map) whose
        # model_type transformers knows loads as transformers' own class; bisecting it then
        # says nothing about the pinned code, so say which model was bisected.
        log.warning(
            "%s names its own code in auto_map, which pypto-capture never runs: transformers' "
            "own %s for model type %r falls back in its place; to bisect the pinned code, "
            "load the model yourself and call pypto_capture.bisect_capture(model)",
            path,
            type(model).__name__,
            str(config.get("model_type"))[:60],
        )
    return model.eval()
