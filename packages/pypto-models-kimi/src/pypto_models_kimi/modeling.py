"""Kimi-Linear on transformers' native classes, loaded strictly from the published format.

Nothing is vendored: :class:`PyptoKimiLinearForCausalLM` *is* ``KimiLinearForCausalLM``
(same modules, same forward: KDA linear-attention layers with their short convolutions
and recurrent state, NoPE MLA full-attention layers caching the compressed latent, the
sigmoid top-k router with a shared expert), so everything transformers and pypto-capture
do with the native model (dynamic and static caches, the capture-safe cache, compile) it
does too. What differs:

* the config is read from the published config.json and checked
  (:mod:`pypto_models_kimi.configuration`);
* ``from_pretrained`` reads the published weight names strictly
  (:mod:`pypto_models_kimi.loading`) instead of transformers' lenient loader; it loads a
  local folder onto the CPU, the caller moves the model.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForCausalLM

from pypto_common.checkpoint import split_load_options

from .checks import FAMILY
from .configuration import PyptoKimiLinearConfig
from .errors import KimiConfigError, KimiWeightsError
from .loading import LoadReport, load_checkpoint

log = logging.getLogger(__name__)

__all__ = ["PyptoKimiLinearForCausalLM"]

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def _requested_dtype(wanted: dict[str, Any], config: Any) -> torch.dtype:
    value = wanted.get("dtype")
    value = value if value is not None else wanted.get("torch_dtype")
    if isinstance(value, torch.dtype):
        if value not in _DTYPES.values():
            raise KimiConfigError(
                f"dtype {value} is not one of {', '.join(_DTYPES)} or 'auto': pass one of them"
            )
        return value
    if value not in (None, "auto"):
        if value not in _DTYPES:
            raise KimiConfigError(
                f"dtype {value!r} is not one of {', '.join(_DTYPES)} or 'auto': pass one of them"
            )
        return _DTYPES[str(value)]
    # "auto": the checkpoint's own dtype (the release says bfloat16).
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, torch.dtype) and stored in _DTYPES.values():
        return stored
    if isinstance(stored, str) and stored in _DTYPES:
        return _DTYPES[stored]
    return torch.bfloat16


def _fp32_rule(model: Any, dtype: torch.dtype) -> Callable[[str], bool]:
    """Which parameters native transformers keeps in float32 at this dtype (its
    ``_keep_in_fp32_modules_strict`` for bf16/fp16, ``_keep_in_fp32_modules`` for fp16),
    matched against parameter names as its loader matches them."""
    names: set[str] = set()
    if dtype in (torch.bfloat16, torch.float16):
        names |= set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        names |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    if not names:
        return lambda key: False
    pattern = re.compile("|".join(re.escape(n) for n in sorted(names)))
    return lambda key: pattern.search(key) is not None


def _config_for(cls: Any, folder: Path, config: Any) -> Any:
    if config is None:
        return cls.config_class.from_pretrained(str(folder))
    if isinstance(config, cls.config_class):
        return config
    raw = config.to_dict() if hasattr(config, "to_dict") else config
    if not isinstance(raw, dict):
        raise KimiConfigError(
            f"config {type(config).__name__} is not a config object or dict: pass none "
            "(it is read from the folder)"
        )
    return cls.config_class.from_dict(raw)  # checks auto_map and the config, translates


def _load(cls: Any, path: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args:
        raise KimiConfigError(
            f"{cls.__name__}.from_pretrained takes the folder and keyword options only: "
            "pass the others by name"
        )
    folder = Path(os.fspath(path)).expanduser()
    if not folder.is_dir():
        raise KimiConfigError(
            f"{folder} is not a local model folder: download it first (pypto-download) and pin "
            f"it with the {FAMILY} preset"
        )
    opts = split_load_options(kwargs)
    if opts.unsupported:
        raise KimiConfigError(
            f"from_pretrained option(s) {', '.join(opts.unsupported)} are not supported by the "
            f"pinned {FAMILY} loader: drop them (it loads a local folder onto the CPU; move "
            "the model afterwards)"
        )
    config = opts.config
    config = _config_for(cls, folder, config)
    dtype = _requested_dtype(opts.dtype, config)
    if opts.attn_implementation is not None:
        config._attn_implementation = opts.attn_implementation
    if opts.experts_implementation is not None:
        config._experts_implementation = opts.experts_implementation
    with torch.device("meta"):
        model = cls(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    state, report = load_checkpoint(
        folder,
        expected,
        num_experts=int(config.num_local_experts),
        dtype=dtype,
        keep_fp32=_fp32_rule(model, dtype),
    )
    model.load_state_dict(state, strict=True, assign=True)
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise KimiWeightsError(
            f"{leftover[0]} was not loaded (and {len(leftover) - 1} more): report this to "
            "pypto-models-kimi with the checkpoint's config.json"
        )
    model.config.dtype = dtype
    _load_generation_config(model, folder)
    model.eval()
    log.info(
        "%s: %d checkpoint tensors from %d shard(s) loaded strictly as %s (%d renamed, "
        "%d convolutions and %d expert stacks merged)",
        FAMILY,
        report.tensors,
        report.shards,
        str(dtype).replace("torch.", ""),
        report.renamed,
        report.merged.get("conv1d", 0),
        report.merged.get("experts", 0),
    )
    model.pypto_load_report = report
    if opts.device_map not in (None, "cpu"):
        model.to(opts.device_map if isinstance(opts.device_map, (str, torch.device)) else "cpu")
    if opts.output_loading_info:
        return model, {
            "missing_keys": [],
            "unexpected_keys": [],
            "mismatched_keys": [],
            "error_msgs": [],
        }
    return model


def _load_generation_config(model: Any, folder: Path) -> None:
    if not (folder / "generation_config.json").is_file():
        return
    from transformers import GenerationConfig

    try:
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    except Exception as err:  # a broken generation config must not hide the model
        log.warning("generation_config.json not used: %s", " ".join(str(err).split())[:200])


# GenerationMixin is named directly in the bases: transformers otherwise wraps a
# remote-code class in a look-alike subclass, and the loaded model would not be an
# instance of the class auto_map names.
class PyptoKimiLinearForCausalLM(KimiLinearForCausalLM, GenerationMixin):
    """The native Kimi-Linear causal LM, loaded strictly from the published format."""

    config_class = PyptoKimiLinearConfig
    pypto_model_family = FAMILY  # kernel plug-ins look for this marker
    pypto_load_report: LoadReport | None = None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        return _load(cls, pretrained_model_name_or_path, args, kwargs)
