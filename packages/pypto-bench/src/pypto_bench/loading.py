"""Offline model loading shared by the smoke gate and the bench.

Everything loads with ``local_files_only=True``: a bench that silently downloads
measures the network, and a smoke gate that fetches code is not a gate. Remote code
runs only when the caller asked for it, and a model that needs it gets an error that
names the flag instead of transformers' multi-line prompt.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pypto_common import UntrustedFileError, loads_bounded, read_regular_file, redact

from .config import DTYPES
from .errors import (
    BadInputError,
    EnvironmentMissingError,
    ModelLoadError,
    ModelNotFoundError,
    RegimeNotSupportedError,
)

log = logging.getLogger(__name__)

#: config.json past this many bytes is refused (the largest real ones, VL models with
#: long preprocessor blocks, are under 200 KB).
MAX_CONFIG_BYTES = 16 << 20

__all__ = [
    "CAUSAL_LM",
    "DTYPES",
    "IMAGE_TEXT_TO_TEXT",
    "TOKEN_BY_TOKEN_REGIMES",
    "LoadedModel",
    "auto_class",
    "auto_class_name",
    "block_diffusion_class",
    "block_diffusion_refusal",
    "check_model_folder",
    "check_regime_fits_folder",
    "eos_token_ids",
    "is_block_diffusion_class",
    "load_model",
    "load_pretrained",
    "needs_remote_code",
    "pinned_code_ignored",
    "read_model_config",
    "ready_for_inference",
    "refuse_remote_code",
    "torch_dtype",
]


@dataclass
class LoadedModel:
    """A model ready to run, with what reports need to know about how it was loaded."""

    model: Any
    tokenizer: Any
    path: Path
    config: dict[str, Any]
    load_seconds: float
    #: The Auto class that loaded it (``AutoModelForCausalLM`` / ``AutoModelForImageTextToText``).
    auto_class: str = "AutoModelForCausalLM"
    #: A vision-language model loaded whole (its image-text-to-text class): the report says
    #: what of it the bench ran (``pypto_bench.vision.vl_info``).
    vision_language: bool = False


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
        # A regular file, bounded, and no NaN / Infinity: a config whose rms_norm_eps is NaN
        # computed NaN logits whose argmax still "matched" eager token for token.
        data = loads_bounded(read_regular_file(where, MAX_CONFIG_BYTES))
    except UntrustedFileError as err:
        why = " ".join(str(err).split())[:200]
        if "levels deep" in why:
            raise ModelNotFoundError(
                f"{where} is nested too deeply to be a model config: re-download the model"
            ) from err
        if "not UTF-8" in why or "not valid JSON" in why:
            raise ModelNotFoundError(
                f"{where} is unreadable ({why}): re-download the model"
            ) from err
        raise ModelNotFoundError(
            f"{where} {why}: a model config must be a plain file of finite JSON; fix the value "
            "or re-download the model"
        ) from err
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


def refuse_remote_code(config: dict[str, Any], path: Path, trust_remote_code: bool) -> None:
    """``ModelLoadError`` (exit 40) for a model whose config needs the folder's own code
    when the caller did not pass ``--trust-remote-code``: before anything loads or starts."""
    if needs_remote_code(config) and not trust_remote_code:
        raise ModelLoadError(
            f"model type {config.get('model_type')!r} at {path} ships its own code: "
            "rerun with --trust-remote-code if you trust that folder"
        )


def pinned_code_ignored(config: dict[str, Any], path: Path, trust_remote_code: bool) -> str | None:
    """What to tell the user when a folder pinned to code (``auto_map``, what pypto-patch
    writes) loads without ``--trust-remote-code``: transformers then builds its own class
    for the registered ``model_type`` and the pinned code, with its config checks, never
    runs. None when nothing falls back.

    Why say it: a Kimi config with ``linear_attn_config.num_heads: 0`` pinned by its preset
    loaded as the native class and failed deep in torch ("groups must be a positive
    integer"), and the native class ignores settings the pinned class reads.
    """
    auto_map = config.get("auto_map")
    if trust_remote_code or not isinstance(auto_map, dict) or not auto_map:
        return None
    if needs_remote_code(config):
        return None  # refused by refuse_remote_code instead
    pinned = next(
        (str(v)[:120] for k, v in auto_map.items() if k in (CAUSAL_LM, IMAGE_TEXT_TO_TEXT)),
        None,
    )
    if pinned is None:
        return None
    return (
        f"{path} is pinned to {pinned!r} (auto_map) but was loaded without "
        f"--trust-remote-code: transformers' own class for model type "
        f"{str(config.get('model_type'))[:60]!r} ran instead, so the pinned code and its "
        "config checks did not; rerun with --trust-remote-code to run the pin"
    )


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise BadInputError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}")
    return "auto" if name == "auto" else getattr(torch, name)


#: The Auto classes pypto-bench loads through (the names transformers and auto_map use).
CAUSAL_LM = "AutoModelForCausalLM"
IMAGE_TEXT_TO_TEXT = "AutoModelForImageTextToText"


def _mapped_class(auto_name: str, model_type: str) -> str | None:
    """The class ``auto_name`` maps ``model_type`` to in transformers, or None.

    Reads transformers' mapping names plus what packages registered at run time (the
    mapping's extra content, e.g. a family package's ``AutoModelForCausalLM.register``).
    """
    import transformers
    from transformers.models.auto import modeling_auto

    names = getattr(
        modeling_auto,
        "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
        if auto_name == CAUSAL_LM
        else "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
        {},
    )
    if model_type in names:
        value = names[model_type]
        return str(value[0] if isinstance(value, (list, tuple)) else value)
    mapping = getattr(getattr(transformers, auto_name, None), "_model_mapping", None)
    for config_class, model_class in (getattr(mapping, "_extra_content", None) or {}).items():
        if getattr(config_class, "model_type", None) == model_type:
            return str(getattr(model_class, "__name__", model_class))
    return None


def is_block_diffusion_class(name: str | None) -> bool:
    """transformers' block-diffusion classes (DiffusionGemma) sit in the image-text-to-text
    mapping without being vision-language models."""
    return bool(name) and str(name).endswith("ForBlockDiffusion")


#: Regimes that generate token by token, which a block-diffusion model does not do (it
#: denoises whole canvases; its forward has no next-token logits to decode from).
TOKEN_BY_TOKEN_REGIMES = ("decode",)


def block_diffusion_class(config: dict[str, Any]) -> str | None:
    """The transformers block-diffusion class a folder's config names, or None.

    Read from ``architectures`` (any ``*ForBlockDiffusion`` entry), else from what
    transformers maps the ``model_type`` to (DiffusionGemma's ``diffusion_gemma`` maps to
    ``DiffusionGemmaForBlockDiffusion`` in its image-text-to-text table), so the answer is
    known before any weight loads.
    """
    archs = config.get("architectures")
    if isinstance(archs, list):
        for name in archs:
            if isinstance(name, str) and is_block_diffusion_class(name):
                return name
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type:
        mapped = _mapped_class(IMAGE_TEXT_TO_TEXT, model_type)
        if is_block_diffusion_class(mapped):
            return mapped
    return None


def block_diffusion_refusal(class_name: str, regime: str, where: str = "") -> str:
    """The one line refusing a token-by-token regime for a block-diffusion model."""
    return (
        f"{class_name}{where} is a block-diffusion model: it generates by denoising whole "
        f"canvases, not token by token, so the {regime} regime cannot run it; use "
        "--regime diffusion-generate"
    )


def check_regime_fits_folder(model_path: str | Path | None, regime: str) -> None:
    """Refuse a token-by-token regime for a block-diffusion folder before anything loads.

    Raises ``RegimeNotSupportedError`` (exit 2) when the folder's config.json says the model
    is a block-diffusion class; a folder that cannot be read is left to the checks that name
    that problem.
    """
    if regime not in TOKEN_BY_TOKEN_REGIMES:
        return
    try:
        path = check_model_folder(model_path)
        config = read_model_config(path)
    except ModelNotFoundError:
        return
    name = block_diffusion_class(config)
    if name is not None:
        raise RegimeNotSupportedError(block_diffusion_refusal(name, regime, f" at {path}"))


def auto_class_name(
    config: dict[str, Any], *, image: bool = False, path: Path | str | None = None
) -> str:
    """Which Auto class loads this folder: :data:`CAUSAL_LM` or :data:`IMAGE_TEXT_TO_TEXT`.

    A folder pinned to code (``auto_map``) that names a causal-LM class keeps it (pypto-patch
    pins families that way); otherwise transformers' causal-LM mapping wins, then its
    image-text-to-text one: a VL checkpoint such as ``qwen3_vl`` maps only there, and so do
    transformers' block-diffusion classes. ``image`` (``--image``) asks for the whole VL
    model, so the image-text-to-text class wins when the folder has one.

    Raises ``BadInputError`` for ``--image`` on a model without an image-text-to-text
    class, and ``ModelLoadError`` naming the model type and the fix for a model neither
    class can load (instead of transformers' list of every configuration it knows).
    """
    model_type = str(config.get("model_type") or "")
    raw_map = config.get("auto_map")
    auto_map: dict[str, Any] = raw_map if isinstance(raw_map, dict) else {}
    causal = _mapped_class(CAUSAL_LM, model_type) if model_type else None
    itt = _mapped_class(IMAGE_TEXT_TO_TEXT, model_type) if model_type else None
    if is_block_diffusion_class(itt) and not image:
        return CAUSAL_LM if causal else IMAGE_TEXT_TO_TEXT
    has_itt = IMAGE_TEXT_TO_TEXT in auto_map or (
        itt is not None and not is_block_diffusion_class(itt)
    )
    where = f" at {path}" if path else ""
    if image:
        if has_itt:
            return IMAGE_TEXT_TO_TEXT
        raise BadInputError(
            f"--image needs a vision-language model: model type {model_type or '?'!r}{where} "
            "has no image-text-to-text class (drop --image to bench it on text prompts)"
        )
    if CAUSAL_LM in auto_map or causal:
        return CAUSAL_LM
    if has_itt:
        return IMAGE_TEXT_TO_TEXT
    import transformers
    from transformers import CONFIG_MAPPING

    version = transformers.__version__
    if not model_type:
        raise ModelLoadError(
            f"config.json{where} names no model_type, so no transformers class can be picked: "
            "re-download the model"
        )
    if model_type in CONFIG_MAPPING:
        config_class = CONFIG_MAPPING[model_type].__name__
        raise ModelLoadError(
            f"model type {model_type!r} ({config_class}){where} has no causal-LM or "
            f"image-text-to-text class in transformers {version}, so pypto-bench cannot "
            "generate with it: pin the folder to modeling code that provides one "
            "(pypto-patch apply, then --trust-remote-code) or bench a generative checkpoint"
        )
    if auto_map:
        raise ModelLoadError(
            f"the code model type {model_type!r}{where} ships names no {CAUSAL_LM} or "
            f"{IMAGE_TEXT_TO_TEXT} in its auto_map (it has {', '.join(sorted(auto_map))}): "
            "pin the folder to modeling code that provides one (pypto-patch apply)"
        )
    raise ModelLoadError(
        f"model type {model_type!r}{where} is unknown to transformers {version} and the folder "
        "ships no code for it (no auto_map): upgrade transformers (pip install -U "
        "'transformers<6') or pin the folder to modeling code (pypto-patch apply)"
    )


def auto_class(config: dict[str, Any], *, image: bool = False) -> Any:
    """The Auto class :func:`auto_class_name` picks (AutoModelForCausalLM by default)."""
    import transformers

    return getattr(transformers, auto_class_name(config, image=image))


def _short_transformers_error(msg: str) -> str:
    """transformers' unrecognized-configuration errors list every type it knows (300+):
    keep the sentence that names the problem."""
    for cut in ("Model type should be one of", "Should have a `model_type` key"):
        if cut in msg:
            return msg.split(cut, 1)[0].strip().rstrip(".")
    return msg


def load_model(
    model_path: str | Path | None,
    *,
    device: Any,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    image: bool = False,
) -> LoadedModel:
    """Load model + tokenizer offline onto ``device`` in eval mode.

    ``image`` (``--image``): load a vision-language checkpoint through its
    image-text-to-text class even where a causal-LM class exists, so the vision tower is
    there; a model without one is a ``BadInputError`` before anything loads.
    """
    import time

    path = check_model_folder(model_path)
    config = read_model_config(path)
    wanted_dtype = torch_dtype(dtype)
    refuse_remote_code(config, path, trust_remote_code)
    fallback = pinned_code_ignored(config, path, trust_remote_code)
    if fallback:
        log.warning("%s", fallback)
    auto_name = auto_class_name(config, image=image, path=path)
    start = time.perf_counter()
    model, tokenizer = load_pretrained(
        path,
        auto_name,
        trust_remote_code=trust_remote_code,
        dtype=wanted_dtype,
        attn_implementation=attn_implementation,
    )
    try:
        model.to(device)
    except Exception as err:
        raise ModelLoadError(
            f"moving the model to {device} failed: {redact(' '.join(str(err).split()))[:300]}"
        ) from err
    ready_for_inference(model, tokenizer)
    seconds = time.perf_counter() - start
    vision_language = auto_name == IMAGE_TEXT_TO_TEXT and not is_block_diffusion_class(
        type(model).__name__
    )
    log.info("loaded %s (%s via %s) in %.2fs", path, type(model).__name__, auto_name, seconds)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=path,
        config=config,
        load_seconds=seconds,
        auto_class=auto_name,
        vision_language=vision_language,
    )


def load_pretrained(
    path: Path,
    auto_name: str,
    *,
    trust_remote_code: bool,
    dtype: Any,
    attn_implementation: str | None = None,
    extra: dict[str, Any] | None = None,
    how: str | None = None,
    needs_accelerate: bool = False,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` offline through ``transformers.<auto_name>.from_pretrained``,
    every failure one line: ``ModelLoadError`` naming --trust-remote-code or the error.

    ``dtype``: a torch dtype or ``"auto"`` (:func:`torch_dtype`); ``extra``: more
    ``from_pretrained`` keywords (a ``distributed_config``, a ``device_map``); ``how``
    names the placement in errors (default ``with <auto_name>``). ``needs_accelerate``:
    ``extra`` is transformers' own placement, so a missing accelerate is an
    ``EnvironmentMissingError`` (exit 3) naming the install.
    """
    import transformers
    from transformers import AutoTokenizer

    how = how or f"with {auto_name}"
    kwargs: dict[str, Any] = {
        "local_files_only": True,
        "trust_remote_code": trust_remote_code,
        "dtype": dtype,
        **(extra or {}),
    }
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    need = f"loading {how} needs accelerate: pip install 'pypto-bench[distributed]'"
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
        model = getattr(transformers, auto_name).from_pretrained(str(path), **kwargs)
    except ImportError as err:
        if needs_accelerate:
            raise EnvironmentMissingError(f"{need} ({err})") from err
        raise _load_error(err, path, how, trust_remote_code) from err
    except Exception as err:  # transformers raises many unrelated types here
        if needs_accelerate and "requires `accelerate`" in str(err):
            raise EnvironmentMissingError(need) from err
        raise _load_error(err, path, how, trust_remote_code) from err
    return model, tokenizer


def _load_error(
    err: BaseException, path: Path, how: str, trust_remote_code: bool
) -> ModelLoadError:
    msg = _short_transformers_error(redact(" ".join(str(err).split())))
    if "trust_remote_code" in msg and not trust_remote_code:
        return ModelLoadError(
            f"{path} needs its own code to load: rerun with --trust-remote-code if you trust it"
        )
    return ModelLoadError(f"loading {path} {how} failed: {type(err).__name__}: {msg[:300]}")


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
