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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch

import pypto_kernels_gutenocr as kernels
from pypto_bench import RssPeak, count_tokens, summarize_seconds, timed
from pypto_bench import summarize as summarize_samples
from pypto_bench.intervals import unpaired_ratio
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
from .npu import EXPERIMENTAL_ON, NPU

log = logging.getLogger(__name__)
SCHEMA_VERSION = 2

#: The seed's protocol: warm up with short generations of this many new tokens (compiles
#: and caches every shape without paying for a full-length run), then time ``runs`` full
#: ones and report their mean.
WARMUP_NEW_TOKENS = 10
#: Timed runs per phase (the seed averages 5).
DEFAULT_RUNS = 5
#: ``ask``'s default output length; ``bench`` uses the seed script's 100.
ASK_OUTPUT_LENGTH = 50
BENCH_OUTPUT_LENGTH = 100
DEFAULT_WARMUP = 5

__all__ = [
    "ASK_OUTPUT_LENGTH",
    "BENCH_OUTPUT_LENGTH",
    "DEFAULT_RUNS",
    "DEFAULT_WARMUP",
    "SCHEMA_VERSION",
    "SEQUENTIAL_WHY",
    "WARMUP_NEW_TOKENS",
    "AskError",
    "AskOptions",
    "BadInputError",
    "EnvironmentMissingError",
    "ImageTextProcessor",
    "ModelLoadError",
    "Plan",
    "build_inputs",
    "compile_model",
    "device_for",
    "kernel_switches",
    "load_model",
    "load_policy",
    "load_processor",
    "model_path_or_error",
    "plan",
    "ratio_interval",
    "run",
    "summarize",
    "write_json",
]


@dataclass
class AskOptions:
    model_path: str | None
    prompt: str = "你好"
    device: str = "auto"
    warmup: int = DEFAULT_WARMUP
    use_pto: bool = False
    use_compile: bool = False
    use_acl_graph: bool = False
    use_dynamic_config: bool = False
    policy_file: str | None = None
    simple_prompt: bool = False
    backend: str | None = None
    mode: str | None = None
    batch: int = 1
    output_length: int = ASK_OUTPUT_LENGTH
    image: str | None = None
    runs: int = DEFAULT_RUNS
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


def _peak_memory(device: torch.device, rss: RssPeak | None) -> dict[str, Any]:
    """Peak memory of the timed runs: allocator peak on a device, resident-set peak on CPU.

    torch keeps no allocator counters for CPU tensors (they read 0, which looks like a
    measurement), so on the CPU the figure is the process's VmHWM, reset just before the
    timed runs (pypto-bench's :class:`RssPeak`), so it excludes the model load.
    """
    if device.type == "cpu":
        got = (rss or RssPeak()).result()
        return {
            "peak_allocated": got["rss_peak_bytes"],
            "kind": "process_peak_rss",
            "method": got["rss_method"],
            "unavailable": got["rss_unavailable"],
        }
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


def load_policy(opts: AskOptions) -> kernels.DynamicPTOConfig:
    """``--policy-file``, else the measured policy shipped with pypto-kernels-gutenocr."""
    if opts.policy_file:
        return kernels.DynamicPTOConfig.from_json(opts.policy_file)
    return kernels.DynamicPTOConfig.default()


@dataclass
class Plan:
    """What a run will do once flags and the batch policy are combined, and why."""

    opts: AskOptions
    decision: kernels.Decision | None = None
    policy_source: str | None = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The human lines the CLI prints on stderr before running."""
        out = []
        if self.decision is not None:
            out.append(f"policy {self.policy_source}: {self.decision.line()}")
        return out + self.notes


def plan(opts: AskOptions) -> Plan:
    """Combine ``--use_dynamic_config`` with the other flags; nothing is silently ignored.

    The policy implies the kernels (``--use_pto``) and, where it says so, aclgraph. An
    explicit ``--use_compile`` or ``--use_acl_graph`` wins over the policy's graph choice,
    and the note says so.
    """
    if not opts.use_dynamic_config:
        return Plan(opts, notes=_graph_notes(opts))
    if opts.batch < 1:
        raise BadInputError(f"--batch must be >= 1, got {opts.batch}")
    cfg = load_policy(opts)
    decision = cfg.for_batch(opts.batch)
    notes: list[str] = []
    if not opts.use_pto:
        opts = replace(opts, use_pto=True)
        notes.append("--use_dynamic_config implies --use_pto: the policy's switches apply")
    b = opts.batch
    if decision.use_acl_graph is True:
        if opts.use_compile:
            notes.append(
                f"--use_compile given: the policy's aclgraph (on for batch {b}) is not used"
            )
        elif not opts.use_acl_graph:
            opts = replace(opts, use_acl_graph=True)
            notes.append(
                f"--use_dynamic_config turns aclgraph on (the policy's choice at batch {b})"
            )
    elif decision.use_acl_graph is False and opts.use_acl_graph:
        notes.append(f"--use_acl_graph given: kept, although the policy says off at batch {b}")
    return Plan(opts, decision, cfg.source, notes + _graph_notes(opts))


def _graph_notes(opts: AskOptions) -> list[str]:
    """The aclgraph fallback, stated before the run (on stderr by the CLI)."""
    if not opts.use_acl_graph:
        return []
    missing = torchair_missing()
    if missing is None:
        return []
    return [
        acl_graph_fallback_note(missing, opts.backend or "inductor", opts.mode or ACL_GRAPH_MODE)
    ]


@contextlib.contextmanager
def kernel_switches(opts: AskOptions) -> Iterator[dict[str, Any]]:
    """Switches for the run (all on, the batch policy, or none) and why."""
    if opts.use_dynamic_config:
        cfg = load_policy(opts)
        with cfg.apply(opts.batch) as decision:
            yield {"policy": cfg.source, **decision.to_dict()}
        return
    if not opts.use_pto:
        with kernels.pto_switches(rms_norm=False, mrope=False, swiglu_mlp=False):
            yield {"policy": "off"}
        return
    with kernels.pto_switches(rms_norm=True, mrope=True, swiglu_mlp=True):
        yield {"policy": "all"}


ACL_GRAPH_MODE = "reduce-overhead"


def torchair_missing() -> str | None:
    """None when torchair (shipped inside torch_npu) imports here, else why not."""
    if (
        importlib.util.find_spec("torch_npu") is None
        and importlib.util.find_spec("torchair") is None
    ):
        return "torchair is not installed (it ships with torch_npu)"
    try:
        NPU.resolve("torchair")
    except ImportError as err:
        return f"torchair does not import ({err})"
    return None


def _torchair_backend(mode: str) -> Any:
    """The seed's torchair configuration; every name is declared in :mod:`.npu`."""
    cfg = NPU.resolve("torchair.CompilerConfig")()
    cfg.mode = mode  # instance attributes set in __init__ (declared members, checked)
    for name in EXPERIMENTAL_ON:
        setattr(cfg.experimental_config, name, True)
    get_backend = NPU.resolve("torchair.get_npu_backend")
    return get_backend(**NPU.kwargs("torchair.get_npu_backend", compiler_config=cfg))


def compile_model(model, opts: AskOptions) -> dict[str, Any]:
    """Apply --use_acl_graph / --use_compile; returns what actually ran.

    ``--use_acl_graph`` is the seed's recipe: torchair's NPU backend (mode reduce-overhead,
    frozen_parameter and tiling_schedule_optimize on) under
    ``torch.compile(dynamic=True, fullgraph=True)``; without torchair the same
    ``torch.compile`` call with the plain backend, and the report says so.
    """
    if opts.use_acl_graph or opts.use_compile:
        # Each run loads a fresh model whose forward is the same code object as the last
        # run's (bench runs two phases): without a reset their compiled entries pile up
        # against dynamo's recompile limit, which fullgraph=True turns into a hard failure.
        torch._dynamo.reset()
    if opts.use_acl_graph:
        mode = opts.mode or ACL_GRAPH_MODE
        compile_kw: dict[str, Any] = {"dynamic": True, "fullgraph": True}
        missing = torchair_missing()
        if missing is None:
            backend = _torchair_backend(mode)
            model.forward = torch.compile(model.forward, backend=backend, **compile_kw)
            return {
                "graph": "torchair",
                "mode": mode,
                **{name: True for name in EXPERIMENTAL_ON},
                **compile_kw,
            }
        name = opts.backend or "inductor"
        model.forward = torch.compile(model.forward, backend=name, mode=mode, **compile_kw)
        return {
            "graph": "torch.compile",
            "backend": name,
            "mode": mode,
            **compile_kw,
            "note": acl_graph_fallback_note(missing, name, mode),
        }
    if opts.use_compile:
        model.forward = torch.compile(
            model.forward, backend=opts.backend or "inductor", mode=opts.mode
        )
        return {"graph": "torch.compile", "backend": opts.backend or "inductor", "mode": opts.mode}
    return {"graph": "eager"}


def acl_graph_fallback_note(missing: str, backend: str, mode: str) -> str:
    return (
        f"--use_acl_graph: {missing}; falling back to plain torch.compile(backend={backend}, "
        f"mode={mode}, dynamic=True, fullgraph=True)"
    )


def run(opts: AskOptions | Plan) -> dict[str, Any]:
    """One phase: load, (compile), warmup, timed generate runs; returns a report dict.

    ``opts`` is combined with the batch policy by :func:`plan` unless it already is a plan.
    """
    the_plan = opts if isinstance(opts, Plan) else plan(opts)
    opts = the_plan.opts
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
    warm = {**gen, "max_new_tokens": WARMUP_NEW_TOKENS, "min_new_tokens": WARMUP_NEW_TOKENS}
    prompt_len = inputs["input_ids"].shape[1]
    eos_ids = _eos_ids(model.generation_config.eos_token_id)
    with kernel_switches(opts) as switch_info, torch.no_grad():
        warmup_tokens: list[int] = []
        for _ in range(opts.warmup):
            out = model.generate(**inputs, **warm)
            warmup_tokens.append(int(out.shape[1] - prompt_len))
        synchronize(device)
        kernels.stats.reset()
        reset_peak_memory(device)
        rss = RssPeak() if device.type == "cpu" else None
        times: list[float] = []
        tokens: list[int] = []
        for _ in range(opts.runs):
            # pypto-bench's one timed span (synchronized at both ends), as every arm's.
            out, seconds = timed(device, lambda: model.generate(**inputs, **gen))
            times.append(seconds)
            new = out[:, prompt_len:]
            # Summed over the batch, each row up to and including its EOS.
            tokens.append(sum(count_tokens(new, eos_ids)))
        peak = _peak_memory(device, rss)
        kernel_report = kernels.report()
    tok = getattr(proc, "tokenizer", proc)
    text = tok.batch_decode(new, skip_special_tokens=True)
    timing = summarize_seconds(times)
    # The headline is the mean of the timed runs (the seed's protocol); best, median and
    # stdev stand beside it in generate_s_stats so a noisy run is visible.
    gen_s = timing["mean"]
    n_tok = sum(tokens) / len(tokens)
    if n_tok == int(n_tok):
        n_tok = int(n_tok)
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
        "warmup_new_tokens": warmup_tokens,
        "runs": opts.runs,
        "load_s": load_s,
        "generate_s": gen_s,
        "generate_s_estimator": "mean",
        "generate_s_all": timing["samples"],
        "generate_s_stats": timing,
        "tokens": n_tok,
        "tokens_all": tokens,
        "tok_per_s": n_tok / gen_s if gen_s > 0 else None,
        "tok_per_s_stats": summarize_rates(tokens, times),
        "synchronized": True,
        "peak_memory": peak,
        "graph": graph,
        "use_pto": opts.use_pto,
        "switch_policy": switch_info,
        "plan_notes": list(the_plan.notes),
        "kernels": kernel_report,
        "text": text,
        "env": {
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "python": platform.python_version(),
            "pypto_kernels_gutenocr": kernels.__version__,
        },
    }


def summarize_rates(tokens: Sequence[int], times: Sequence[float]) -> dict[str, Any]:
    """tok/s per timed run: best (max), median, mean of the per-run rates, stdev."""
    return summarize_samples([n / t for n, t in zip(tokens, times, strict=True) if t > 0])


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
    # The mean is the headline; best / median / stdev of each phase stand beside it.
    for key, stats_key in (("generate_s", "generate_s_stats"), ("tok_per_s", "tok_per_s_stats")):
        rows[key]["estimator"] = "mean"
        for phase, rep in (("baseline", baseline), ("pypto", pypto)):
            st = rep.get(stats_key) or {}
            rows[key][f"{phase}_stats"] = {k: st.get(k) for k in ("best", "median", "stdev")}
    b, p = baseline["peak_memory"]["peak_allocated"], pypto["peak_memory"]["peak_allocated"]
    rows["peak_memory_bytes"] = {
        "baseline": b,
        "pypto": p,
        "delta_pct": _delta(b, p),
        "kind": pypto["peak_memory"]["kind"],
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "metrics": rows,
        "ratio": ratio_interval(baseline, pypto),
        "schedule": {"order": "sequential", "why": SEQUENTIAL_WHY},
        "pypto_kernels": pypto["kernels"],
    }


#: Why the two phases are not interleaved (pypto-bench's ``schedule.why``).
SEQUENTIAL_WHY = (
    "the baseline and pypto phases cannot share one model: each loads its own copy and "
    "compiles it with its kernel switches (process-wide, baked into a captured graph), so "
    "their timed runs are sequential, and the ratio's interval is unpaired"
)


def _run_rates(report: dict[str, Any]) -> list[float]:
    times = report.get("generate_s_all") or []
    tokens = report.get("tokens_all") or []
    return [n / t for n, t in zip(tokens, times, strict=False) if t and t > 0]


def ratio_interval(baseline: dict[str, Any], pypto: dict[str, Any]) -> dict[str, Any] | None:
    """pypto / baseline tok/s: the ratio of the phases' median per-run rates with
    pypto-bench's unpaired bootstrap interval (each phase resampled on its own: run i of
    one phase has nothing to do with run i of the other). None without timed runs."""
    got = unpaired_ratio(_run_rates(pypto), _run_rates(baseline))
    return got.to_dict() if got is not None else None


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    from pypto_common import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False))
