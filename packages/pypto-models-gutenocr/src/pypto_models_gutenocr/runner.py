"""Load, prompt, generate and measure: the library behind ``pypto-gutenocr``.

Errors are typed (:class:`AskError` subclasses, in :mod:`.errors`); the CLI turns them
into one line and an exit code. Devices, synchronisation and memory counters come from
pypto-capture's device layer and the timing statistics and token counting from
pypto-bench, so ``pypto-gutenocr`` measures exactly the way ``pypto-bench`` does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import platform
import resource
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

import pypto_kernels_gutenocr as kernels
from pypto_bench.measure import count_tokens, summarize_seconds
from pypto_capture import (
    DeviceNotAvailableError,
    InvalidDeviceSpecError,
    memory_stats,
    reset_peak_memory,
    resolve_device,
    synchronize,
)

from .configuration import MRopeSectionError
from .errors import AskError, BadInputError, EnvironmentMissingError, ModelLoadError
from .modeling import GutenOCRForConditionalGeneration

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1

__all__ = [
    "SCHEMA_VERSION",
    "AskError",
    "AskOptions",
    "BadInputError",
    "EnvironmentMissingError",
    "ImageTextProcessor",
    "ModelLoadError",
    "build_inputs",
    "compile_model",
    "device_for",
    "kernel_switches",
    "load_model",
    "load_processor",
    "model_path_or_error",
    "run",
    "summarize",
    "write_json",
]


@dataclass
class AskOptions:
    model_path: str | None
    prompt: str = "你好"
    device: str = "auto"
    warmup: int = 5
    use_pto: bool = False
    use_compile: bool = False
    use_acl_graph: bool = False
    use_dynamic_config: bool = False
    policy_file: str | None = None
    simple_prompt: bool = False
    backend: str | None = None
    mode: str | None = None
    batch: int = 1
    output_length: int = 50
    image: str | None = None
    runs: int = 1
    dtype: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)


def device_for(spec: str | None) -> torch.device:
    """``--device`` as pypto-capture reads it (``auto``, a bare card number, ``cpu``,
    ``cuda:N``, ``npu:N``), with its errors mapped to this tool's exit codes."""
    try:
        return resolve_device(spec)
    except InvalidDeviceSpecError as err:
        raise BadInputError(f"bad --device: {err}") from err
    except DeviceNotAvailableError as err:
        raise EnvironmentMissingError(f"--device {spec}: {err}") from err


def _peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory of the timed runs: allocator peak on a device, process peak RSS on CPU.

    torch keeps no allocator counters for CPU tensors; the peak RSS is the closest
    figure there, but it cannot be reset, so it includes the model load.
    """
    if device.type == "cpu":
        # ru_maxrss is KiB on Linux.
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"peak_allocated": rss, "kind": "process_peak_rss"}
    stats = memory_stats(device)
    return {
        "peak_allocated": stats.peak_allocated,
        "peak_reserved": stats.peak_reserved,
        "kind": "device",
    }


def _eos_ids(eos: int | Sequence[int] | None) -> list[int]:
    if eos is None:
        return []
    if isinstance(eos, int):
        return [eos]
    return [int(e) for e in eos]


def model_path_or_error(path: str | None) -> Path:
    path = path or os.environ.get("GUTENOCR_MODEL_PATH")
    if not path:
        raise BadInputError("no model folder: pass --model-path or set GUTENOCR_MODEL_PATH")
    p = Path(path)
    if not (p / "config.json").is_file():
        raise BadInputError(f"{p} is not a model folder (no config.json); pass --model-path")
    return p


def load_model(
    path: Path, device: torch.device, dtype: str = "auto"
) -> GutenOCRForConditionalGeneration:
    """The folder's model on ``device``; a folder that does not load is one ModelLoadError."""
    if dtype != "auto" and not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise BadInputError(f"--dtype {dtype!r}: use auto, bfloat16, float16 or float32")
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    try:
        model = GutenOCRForConditionalGeneration.from_pretrained(
            str(path), dtype=torch_dtype, local_files_only=True
        )
    except MRopeSectionError:
        raise
    except Exception as err:  # safetensors, OSError, config ValueErrors: all "did not load"
        first = " ".join(str(err).split())[:300]
        raise ModelLoadError(
            f"{path}: the model did not load ({type(err).__name__}: {first}); check that the "
            "folder is a complete GutenOCR / Qwen2.5-VL checkpoint (re-download it)"
        ) from err
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers types .to's self


class ImageTextProcessor:
    """Image processor + tokenizer, expanding each image placeholder to its patch count.

    Used when the folder's full processor cannot be built here (Qwen2_5_VLProcessor
    also wants a video processor, which needs torchvision); does what it does for images.
    """

    def __init__(self, image_processor, tokenizer, image_token: str) -> None:
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = image_token
        self.chat_template = getattr(tokenizer, "chat_template", None)

    def apply_chat_template(self, *args, **kwargs):
        return self.tokenizer.apply_chat_template(*args, **kwargs)

    def __call__(self, *, text, images, return_tensors="pt", padding=True):
        pix = self.image_processor(images=images, return_tensors=return_tensors)
        merge = getattr(self.image_processor, "merge_size", 2) ** 2
        counts = iter([int(g.prod()) // merge for g in pix["image_grid_thw"]])
        expanded = []
        for t in text:
            parts = t.split(self.image_token)
            out = parts[0]
            for rest in parts[1:]:
                out += self.image_token * next(counts) + rest
            expanded.append(out)
        enc = self.tokenizer(expanded, return_tensors=return_tensors, padding=padding)
        return {**enc, **pix}


def load_processor(path: Path, with_image: bool, config=None):
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not with_image:
        return tok
    try:
        return AutoProcessor.from_pretrained(str(path), local_files_only=True, use_fast=False)
    except (OSError, ValueError, TypeError, AttributeError, ImportError) as err:
        log.info("full processor unavailable (%s); pairing image processor and tokenizer", err)
    try:
        image_processor = AutoImageProcessor.from_pretrained(
            str(path), local_files_only=True, use_fast=False
        )
    except (OSError, ValueError) as err:
        raise BadInputError(f"{path}: no image processor for --image ({err})") from err
    # One id in, one token out (the list form is for a list of ids).
    image_token = (
        cast(str, tok.convert_ids_to_tokens(config.image_token_id))
        if config is not None
        else "<|image_pad|>"
    )
    return ImageTextProcessor(image_processor, tok, image_token)


def build_inputs(proc, opts: AskOptions, config) -> dict[str, torch.Tensor]:
    """Tokenize the prompt (and image) for a batch of identical requests."""
    tok = getattr(proc, "tokenizer", proc)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    images = None
    if opts.image:
        from PIL import Image, UnidentifiedImageError

        try:
            images = [Image.open(opts.image).convert("RGB")] * opts.batch
        except (OSError, UnidentifiedImageError) as err:
            raise BadInputError(f"cannot read --image {opts.image}: {err}") from err
    template = getattr(proc, "chat_template", None) or getattr(tok, "chat_template", None)
    if not opts.simple_prompt and template:
        content: list[dict[str, Any]] = [{"type": "text", "text": opts.prompt}]
        if images:
            content.insert(0, {"type": "image"})
        text = proc.apply_chat_template(
            [{"role": "user", "content": content if images else opts.prompt}],
            tokenize=False,
            add_generation_prompt=True,
        )
    else:
        text = opts.prompt
        if images:
            vs, pad, ve = (
                tok.convert_ids_to_tokens(i)
                for i in (
                    config.vision_start_token_id,
                    config.image_token_id,
                    config.vision_end_token_id,
                )
            )
            text = f"{vs}{pad}{ve}{opts.prompt}"
    if images:
        return dict(
            proc(text=[text] * opts.batch, images=images, return_tensors="pt", padding=True)
        )
    return dict(tok([text] * opts.batch, return_tensors="pt", padding=True))


@contextlib.contextmanager
def kernel_switches(opts: AskOptions) -> Iterator[dict[str, Any]]:
    """Switches for the run (all on, the batch policy, or none) and why."""
    if not opts.use_pto:
        with kernels.pto_switches(rms_norm=False, mrope=False, swiglu_mlp=False):
            yield {"policy": "off"}
        return
    if opts.use_dynamic_config:
        cfg = (
            kernels.DynamicPTOConfig.from_json(opts.policy_file)
            if opts.policy_file
            else kernels.DynamicPTOConfig()
        )
        with cfg.apply(opts.batch) as decision:
            yield {"policy": cfg.source, **decision.to_dict()}
        return
    with kernels.pto_switches(rms_norm=True, mrope=True, swiglu_mlp=True):
        yield {"policy": "all"}


def compile_model(model, opts: AskOptions) -> dict[str, Any]:
    """Apply --use_acl_graph / --use_compile; returns what actually ran."""
    if opts.use_acl_graph:
        if importlib.util.find_spec("torchair") is not None:
            import torchair

            cfg = torchair.CompilerConfig()
            cfg.mode = opts.mode or "reduce-overhead"
            backend = torchair.get_npu_backend(compiler_config=cfg)
            model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
            return {"graph": "torchair", "mode": cfg.mode}
        mode = opts.mode or "reduce-overhead"
        model.forward = torch.compile(model.forward, backend=opts.backend or "inductor", mode=mode)
        return {
            "graph": "torch.compile",
            "backend": opts.backend or "inductor",
            "mode": mode,
            "note": "torchair not installed: --use_acl_graph used torch.compile",
        }
    if opts.use_compile:
        model.forward = torch.compile(
            model.forward, backend=opts.backend or "inductor", mode=opts.mode
        )
        return {"graph": "torch.compile", "backend": opts.backend or "inductor", "mode": opts.mode}
    return {"graph": "eager"}


def run(opts: AskOptions) -> dict[str, Any]:
    """One phase: load, (compile), warmup, timed generate runs; returns a report dict."""
    if opts.batch < 1 or opts.output_length < 1 or opts.warmup < 0 or opts.runs < 1:
        raise BadInputError("--batch, --output_length and runs must be >= 1, --warmup >= 0")
    if opts.image and not Path(opts.image).is_file():
        raise BadInputError(f"--image {opts.image}: no such file")
    path = model_path_or_error(opts.model_path)
    device = device_for(opts.device)
    kernels.stats.reset()
    t0 = time.perf_counter()
    model = load_model(path, device, opts.dtype)
    synchronize(device)
    load_s = time.perf_counter() - t0
    proc = load_processor(path, bool(opts.image), model.config)
    inputs = {k: v.to(device) for k, v in build_inputs(proc, opts, model.config).items()}
    graph = compile_model(model, opts)
    gen = {
        "max_new_tokens": opts.output_length,
        "min_new_tokens": opts.output_length,
        "do_sample": False,
        "pad_token_id": getattr(proc, "tokenizer", proc).pad_token_id,
    }
    with kernel_switches(opts) as switch_info, torch.no_grad():
        for _ in range(opts.warmup):
            model.generate(**inputs, **gen)
        kernels.stats.reset()
        reset_peak_memory(device)
        eos_ids = _eos_ids(model.generation_config.eos_token_id)
        times: list[float] = []
        tokens: list[int] = []
        for _ in range(opts.runs):
            synchronize(device)
            t = time.perf_counter()
            out = model.generate(**inputs, **gen)
            synchronize(device)
            times.append(time.perf_counter() - t)
            new = out[:, inputs["input_ids"].shape[1] :]
            # Summed over the batch, each row up to and including its EOS.
            tokens.append(sum(count_tokens(new, eos_ids)))
        kernel_report = kernels.report()
    tok = getattr(proc, "tokenizer", proc)
    text = tok.batch_decode(new, skip_special_tokens=True)
    timing = summarize_seconds(times)
    gen_s = timing["best"]
    n_tok = tokens[times.index(gen_s)]
    return {
        "schema_version": SCHEMA_VERSION,
        "model_path": str(path),
        "device": str(device),
        "dtype": str(next(model.parameters()).dtype),
        "prompt": opts.prompt,
        "image": opts.image,
        "batch": opts.batch,
        "output_length": opts.output_length,
        "warmup": opts.warmup,
        "runs": opts.runs,
        "load_s": load_s,
        "generate_s": gen_s,
        "generate_s_all": timing["samples"],
        "generate_s_stats": timing,
        "tokens": n_tok,
        "tok_per_s": n_tok / gen_s if gen_s > 0 else None,
        "peak_memory": _peak_memory(device),
        "graph": graph,
        "use_pto": opts.use_pto,
        "switch_policy": switch_info,
        "kernels": kernel_report,
        "text": text,
        "env": {
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "python": platform.python_version(),
            "pypto_kernels_gutenocr": kernels.__version__,
        },
    }


def _delta(base: float | None, new: float | None) -> float | None:
    if not base or new is None:
        return None
    return 100.0 * (new - base) / base


def summarize(baseline: dict[str, Any], pypto: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    for key in ("load_s", "generate_s", "tokens", "tok_per_s"):
        rows[key] = {
            "baseline": baseline[key],
            "pypto": pypto[key],
            "delta_pct": _delta(baseline[key], pypto[key]),
        }
    b, p = baseline["peak_memory"]["peak_allocated"], pypto["peak_memory"]["peak_allocated"]
    rows["peak_memory_bytes"] = {
        "baseline": b,
        "pypto": p,
        "delta_pct": _delta(b, p),
        "kind": pypto["peak_memory"]["kind"],
    }
    return {"schema_version": SCHEMA_VERSION, "metrics": rows, "pypto_kernels": pypto["kernels"]}


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    tmp.replace(path)
