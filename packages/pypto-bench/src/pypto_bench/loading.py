"""Offline model loading shared by the smoke gate and the bench.

Everything loads with ``local_files_only=True``: a bench that silently downloads
measures the network, and a smoke gate that fetches code is not a gate. Remote code
runs only when the caller asked for it, and a model that needs it gets an error that
names the flag instead of transformers' multi-line prompt.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pypto_common import redact

from .errors import BadInputError, ModelLoadError, ModelNotFoundError

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class LoadedModel:
    """A model ready to run, with what reports need to know about how it was loaded."""

    model: Any
    tokenizer: Any
    path: Path
    config: dict[str, Any]
    load_seconds: float


def check_model_folder(model_path: str | Path | None) -> Path:
    """Reject a missing path or a folder that is not a model before anything heavy runs."""
    if model_path is None or str(model_path) == "":
        raise ModelNotFoundError("no model path given: pass --model-path DIR or set MODEL_PATH")
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(
            f"model path {path} does not exist: pass a downloaded model folder"
        )
    if not path.is_dir():
        raise ModelNotFoundError(f"model path {path} is not a folder: pass the model's folder")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} is not a model folder (no config.json): pass the folder a download produced"
        )
    return path.resolve()


def read_model_config(path: Path) -> dict[str, Any]:
    """The folder's config.json as a dict, or one-line ``ModelNotFoundError``.

    A hostile or corrupt file must not crash with a traceback: nesting deeper than the
    interpreter's recursion limit makes ``json`` raise ``RecursionError``, undecodable
    bytes raise ``UnicodeDecodeError``, and valid JSON that is not an object would fail
    later at ``config.get``.
    """
    where = path / "config.json"
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except RecursionError as err:
        raise ModelNotFoundError(
            f"{where} is nested too deeply to be a model config: re-download the model"
        ) from err
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        detail = " ".join(str(err).split())[:200]
        raise ModelNotFoundError(
            f"{where} is unreadable ({detail}): re-download the model"
        ) from err
    if not isinstance(data, dict):
        raise ModelNotFoundError(
            f"{where} holds a JSON {type(data).__name__}, not an object: re-download the model"
        )
    return data


def needs_remote_code(config: dict[str, Any]) -> bool:
    """True when transformers cannot build this model from its own classes.

    A config with ``auto_map`` whose ``model_type`` is not registered locally can only
    be built from the folder's Python files. A registered type wins over auto_map in
    transformers 5.x, so such a model loads without remote code.
    """
    if not config.get("auto_map"):
        return False
    from transformers import CONFIG_MAPPING

    return config.get("model_type") not in CONFIG_MAPPING


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise BadInputError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}")
    return "auto" if name == "auto" else getattr(torch, name)


def _auto_class(config: dict[str, Any]) -> Any:
    """AutoModelForCausalLM, or the image-text-to-text Auto class for a native type that
    has no causal-LM mapping (transformers' block-diffusion classes, e.g. DiffusionGemma)."""
    from transformers import AutoModelForCausalLM

    model_type = str(config.get("model_type") or "")
    try:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        )
    except ImportError:  # pragma: no cover - every supported transformers has them
        return AutoModelForCausalLM
    if (
        model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
        and str(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]).endswith(
            "ForBlockDiffusion"
        )
    ):
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def load_model(
    model_path: str | Path | None,
    *,
    device: Any,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load model + tokenizer offline onto ``device`` in eval mode."""
    import time

    path = check_model_folder(model_path)
    config = read_model_config(path)
    wanted_dtype = torch_dtype(dtype)
    if needs_remote_code(config) and not trust_remote_code:
        raise ModelLoadError(
            f"model type {config.get('model_type')!r} at {path} ships its own code: "
            "rerun with --trust-remote-code if you trust that folder"
        )
    from transformers import AutoTokenizer

    auto_class = _auto_class(config)
    kwargs: dict[str, Any] = {
        "local_files_only": True,
        "trust_remote_code": trust_remote_code,
        "dtype": wanted_dtype,
    }
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
        model = auto_class.from_pretrained(str(path), **kwargs)
    except Exception as err:  # transformers raises many unrelated types here
        msg = redact(" ".join(str(err).split()))
        if "trust_remote_code" in msg and not trust_remote_code:
            raise ModelLoadError(
                f"{path} needs its own code to load: rerun with --trust-remote-code if you trust it"
            ) from err
        raise ModelLoadError(f"loading {path} failed: {type(err).__name__}: {msg[:300]}") from err
    try:
        model.to(device)
    except Exception as err:
        raise ModelLoadError(
            f"moving the model to {device} failed: {redact(' '.join(str(err).split()))[:300]}"
        ) from err
    ready_for_inference(model, tokenizer)
    seconds = time.perf_counter() - start
    log.info("loaded %s (%s) in %.2fs", path, type(model).__name__, seconds)
    return LoadedModel(
        model=model, tokenizer=tokenizer, path=path, config=config, load_seconds=seconds
    )


def ready_for_inference(model: Any, tokenizer: Any) -> None:
    """Eval mode, and a pad token (the EOS one) where the tokenizer has none: batched
    prompts are padded."""
    model.eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token


def eos_token_ids(model: Any, tokenizer: Any = None) -> list[int]:
    """Every id that ends a sequence for this model (generation config first)."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if int(v) not in ids:
                ids.append(int(v))
        if ids:
            return ids
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids
