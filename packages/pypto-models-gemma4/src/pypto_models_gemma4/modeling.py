"""Gemma 4 on transformers' native classes, loaded strictly.

Nothing is vendored: :class:`PyptoGemma4ForConditionalGeneration` *is*
``Gemma4ForConditionalGeneration`` (same modules, same weight names, the checkpoint's
config.json read unchanged), with two differences that matter to a porting workflow:

* loading is strict. transformers fills a weight the checkpoint lacks with random
  values and only logs it, so a truncated download or a config that does not match its
  weights yields a model that runs and produces noise. Here a missing or unexpected
  weight, or one of the wrong shape, is a one-line :class:`Gemma4WeightsError` naming the
  layer.
* the towers are accounted for. The vision and audio towers of the conditional-generation
  wrapper are loaded exactly as the checkpoint has them (a folder whose config declares a
  tower but whose weights lack it fails the strict check: never half-loaded); the text
  decode path does not use them, and ``pypto_towers`` plus one log line say so.

Decoding with a captured graph does not need anything else from the model: pypto-capture's
``DecodeStepRunner`` gives every layer type its own ring buffer (sliding layers ``window``
slots, full layers ``max_cache_len``) sized from the real per-layer head shapes, passes the
per-type masks as a ``{layer_type: mask}`` dict, which the Gemma 4 decoder accepts as is,
and leaves KV-sharing layers without a buffer (they read their producer's ring).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any, cast

import torch
from transformers import GenerationMixin
from transformers.models.gemma4.configuration_gemma4 import Gemma4Config
from transformers.models.gemma4.modeling_gemma4 import Gemma4ForConditionalGeneration

from .configuration import (
    PyptoGemma4Config,
    PyptoGemma4Config26BA4B,
    PyptoGemma4Config31B,
    PyptoGemma4ConfigE2B,
    PyptoGemma4ConfigE4B,
)
from .variants import check_config_dict

log = logging.getLogger(__name__)

__all__ = [
    "MODEL_CLASSES",
    "Gemma4WeightsError",
    "PyptoGemma4ForConditionalGeneration",
    "PyptoGemma4ForConditionalGeneration26BA4B",
    "PyptoGemma4ForConditionalGeneration31B",
    "PyptoGemma4ForConditionalGenerationE2B",
    "PyptoGemma4ForConditionalGenerationE4B",
    "loading_problem",
]

FAMILY = "gemma4"
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class Gemma4WeightsError(RuntimeError):
    """The folder's weights do not match its config; ``str()`` is one line with the fix."""


def _first_and_count(names: Iterable[str]) -> tuple[str, int]:
    ordered = sorted(names)
    return ordered[0], len(ordered)


_PARTS = (
    ("language_model", "text decoder"),
    ("vision_tower", "vision tower"),
    ("embed_vision", "vision embedder"),
    ("audio_tower", "audio tower"),
    ("embed_audio", "audio embedder"),
)


def _where(names: Iterable[str]) -> str:
    """'the text decoder's layer 3' / 'the vision tower's layers 0, 1' for a report line."""
    names = sorted(names)
    first = names[0]
    part = next((label for key, label in _PARTS if f".{key}." in f".{first}"), None)
    same = [
        n
        for n in names
        if part is None or any(f".{k}." in f".{n}" for k, lbl in _PARTS if lbl == part)
    ]
    layers = sorted({int(m.group(1)) for n in same if (m := _LAYER_RE.search(n))})
    owner = f"the {part}'s" if part else "the model's"
    if layers:
        shown = ", ".join(str(i) for i in layers[:6]) + (", ..." if len(layers) > 6 else "")
        return f"{owner} layer{'s' if len(layers) > 1 else ''} {shown}"
    return f"the {part}" if part else ".".join(first.split(".")[:-1]) or first


def loading_problem(info: dict[str, Any]) -> str | None:
    """One line describing what ``from_pretrained(output_loading_info=True)`` left wrong."""
    missing = set(info.get("missing_keys") or ())
    unexpected = set(info.get("unexpected_keys") or ())
    mismatched = list(info.get("mismatched_keys") or ())
    if missing:
        first, n = _first_and_count(missing)
        more = f" and {n - 1} more" if n > 1 else ""
        return (
            f"the checkpoint lacks weights for {_where(missing)} ({first}{more}): the download is "
            "incomplete or config.json does not match the weights; re-download the model"
        )
    if mismatched:
        entry = mismatched[0]
        name = entry[0] if isinstance(entry, (tuple, list)) else str(entry)
        shapes = (
            f" (checkpoint {list(entry[1])} vs config {list(entry[2])})"
            if isinstance(entry, (tuple, list)) and len(entry) >= 3
            else ""
        )
        return (
            f"weight {name}{shapes} has the wrong shape for config.json: the folder mixes two "
            "checkpoints; re-download the model"
        )
    if unexpected:
        first, n = _first_and_count(unexpected)
        more = f" and {n - 1} more" if n > 1 else ""
        return (
            f"the checkpoint has weights config.json does not describe, for {_where(unexpected)} "
            f"({first}{more}): the folder mixes two checkpoints; re-download the model"
        )
    return None


def _towers(model: torch.nn.Module) -> dict[str, int | None]:
    inner = getattr(model, "model", None)
    out: dict[str, int | None] = {}
    for name in ("vision_tower", "audio_tower"):
        tower = getattr(inner, name, None)
        out[name.split("_")[0]] = (
            sum(p.numel() for p in tower.parameters())
            if isinstance(tower, torch.nn.Module)
            else None
        )
    return out


# GenerationMixin is named directly in every class's bases: transformers otherwise wraps a
# remote-code class that overrides ``prepare_inputs_for_generation`` in a look-alike
# subclass, and the loaded model would not be an instance of the class auto_map names.
class PyptoGemma4ForConditionalGeneration(Gemma4ForConditionalGeneration, GenerationMixin):
    """The native Gemma 4 model, loaded strictly (see the module docstring)."""

    config_class = PyptoGemma4Config
    pypto_model_family = FAMILY  # kernel plug-ins look for this marker

    def __init__(self, config: Gemma4Config) -> None:
        super().__init__(config)
        self.pypto_towers = _towers(self)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        wants_info = bool(kwargs.pop("output_loading_info", False))
        config = kwargs.get("config")
        if config is not None and not isinstance(config, Gemma4Config):
            # A config object built elsewhere (e.g. AutoConfig without this preset).
            check_config_dict(config.to_dict() if hasattr(config, "to_dict") else config)
        catcher = _LoadReportCatcher()
        with catcher:
            try:
                loaded: Any = super().from_pretrained(
                    pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
                )
            except RuntimeError as err:
                text = " ".join(str(err).split())
                if "size mismatch" in text or "ignore_mismatched_sizes" in text:
                    raise Gemma4WeightsError(catcher.mismatch() or _MISMATCH) from err
                raise
        model, info = cast("tuple[Any, dict[str, Any]]", loaded)
        problem = loading_problem(info)
        if problem is not None:
            raise Gemma4WeightsError(problem)
        for report in catcher.reports:  # nothing we refuse, so pass it on unchanged
            log.warning("%s", report)
        towers = getattr(model, "pypto_towers", {})
        loaded = [f"{k} ({v:,} parameters)" for k, v in towers.items() if v]
        if loaded:
            log.info(
                "Gemma 4 %s tower%s loaded from the checkpoint; text decoding does not use %s",
                " and ".join(loaded),
                "s" if len(loaded) > 1 else "",
                "them" if len(loaded) > 1 else "it",
            )
        return (model, info) if wants_info else model


_MISMATCH = (
    "a weight has the wrong shape for config.json: the folder mixes two checkpoints; "
    "re-download the model"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MISMATCH_ROW = re.compile(
    r"([\w.]+)\s*\|\s*MISMATCH\s*\|.*?ckpt:\s*torch\.Size\(\[([\d, ]*)\]\)\s*vs\s*"
    r"model:\s*torch\.Size\(\[([\d, ]*)\]\)"
)


class _LoadReportCatcher(logging.Filter):
    """Holds back transformers' multi-line load report while a strict load runs.

    The report is a table logged as one WARNING; when the load is refused, the one-line
    ``Gemma4WeightsError`` says the same thing, and the table would only bury it.
    """

    _LOGGERS = ("transformers.modeling_utils", "transformers.utils.loading_report")

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "LOAD REPORT" in msg:
            self.reports.append(_ANSI.sub("", msg))
            return False
        return True

    def __enter__(self) -> _LoadReportCatcher:
        for name in self._LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self._LOGGERS:
            logging.getLogger(name).removeFilter(self)

    def mismatch(self) -> str | None:
        for report in self.reports:
            m = _MISMATCH_ROW.search(report)
            if m:
                return (
                    f"weight {m.group(1)} is [{m.group(2)}] in the checkpoint but config.json "
                    f"makes it [{m.group(3)}]: the folder mixes two checkpoints; re-download the model"
                )
        return None


# transformers' Auto classes insist that a model class's ``config_class`` is exactly the
# config class the folder's AutoConfig produced, so each preset's config class (which
# carries the variant its folder must be) gets its own model class.
class PyptoGemma4ForConditionalGeneration31B(PyptoGemma4ForConditionalGeneration, GenerationMixin):
    config_class = PyptoGemma4Config31B


class PyptoGemma4ForConditionalGeneration26BA4B(
    PyptoGemma4ForConditionalGeneration, GenerationMixin
):
    config_class = PyptoGemma4Config26BA4B


class PyptoGemma4ForConditionalGenerationE4B(PyptoGemma4ForConditionalGeneration, GenerationMixin):
    config_class = PyptoGemma4ConfigE4B


class PyptoGemma4ForConditionalGenerationE2B(PyptoGemma4ForConditionalGeneration, GenerationMixin):
    config_class = PyptoGemma4ConfigE2B


#: preset name -> the model class its placed modeling file exposes.
MODEL_CLASSES: dict[str, type[PyptoGemma4ForConditionalGeneration]] = {
    "gemma4_31b_it": PyptoGemma4ForConditionalGeneration31B,
    "gemma4_26b_a4b_it": PyptoGemma4ForConditionalGeneration26BA4B,
    "gemma4_e4b_it": PyptoGemma4ForConditionalGenerationE4B,
    "gemma4_e2b_it": PyptoGemma4ForConditionalGenerationE2B,
}


def _register_weight_layout() -> None:
    """Give the subclass the native class's checkpoint key mapping, where one exists.

    transformers 5.x renames checkpoint keys by class name; Gemma 4 needs no renaming
    today, but a future mapping registered for the native class must reach this one too.
    """
    try:
        from transformers import conversion_mapping as cm
    except ImportError:  # pragma: no cover - every supported 5.x has it
        return
    get = getattr(cm, "get_checkpoint_conversion_mapping", None)
    register = getattr(cm, "register_checkpoint_conversion_mapping", None)
    if get is None or register is None:
        return
    mapping = get(Gemma4ForConditionalGeneration.__name__)
    if mapping is None:
        return
    classes: list[type] = [PyptoGemma4ForConditionalGeneration, *MODEL_CLASSES.values()]
    for cls in classes:
        if get(cls.__name__) is None:
            register(cls.__name__, mapping)


_register_weight_layout()
