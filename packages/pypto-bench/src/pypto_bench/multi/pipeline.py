"""``--placement pipeline --nproc N``: prefill of a model split by layers over N devices.

The fallback for a family without a tensor-parallel plan (and for anyone who wants it):
one process, the decoder layers cut into N contiguous stages of about equal weight bytes,
stage s on device s, loaded by transformers with an accelerate-style device map (the
same mechanism as ``device_map="auto"``, with the split stated rather than left to
free-memory heuristics). Activations move from stage to stage inside the forward, so a
single request runs its stages one after another: this placement is for measuring a
model that does not fit one device at all, not for speed, and the report says so (no
scaling efficiency). Measured with the single-process prefill protocol of
``pypto_bench.bench`` (the same warmup, iterations and timed spans); the 1-rank baseline
and its agreement check are those of ``--nproc`` (skipped when the model does not fit one
device).

On a CPU every stage is the one CPU: the mechanics (map, load, report) run, nothing is
placed anywhere else. (The request's rules, prefill and the eager arm only, are
``BenchConfig.validate``'s: :func:`pypto_bench.config.validate_placement`.)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pypto_common import redact

from ..errors import BadInputError, ModelLoadError, RankFailedError
from ._shared import NoBeat
from .aggregate import NO_BASELINE_FIGURES, add_arm, aggregate_arm
from .arms import Judge, make_ctx, measure_arm, measure_baseline
from .fit import baseline_skip_reason, out_of_memory
from .preflight import check_before_launch
from .tensor import load_placed

if TYPE_CHECKING:
    from ..config import BenchConfig
    from ..report import Report

__all__ = [
    "MAX_PIPELINE_LAYERS",
    "declared_layers",
    "decoder_layers",
    "run_pipeline",
    "stage_device_map",
]

log = logging.getLogger(__name__)


def decoder_layers(model: Any) -> tuple[str, Any]:
    """The path and module of the decoder-layer list: the ModuleList holding the most
    parameters (every causal LM of transformers keeps its layers in one)."""
    import torch

    best: tuple[int, str, Any] | None = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            size = sum(p.numel() for p in module.parameters())
            if best is None or size > best[0]:
                best = (size, name, module)
    if best is None:
        raise ModelLoadError(
            f"{type(model).__name__} has no list of decoder layers to split into stages: "
            "run it with --placement tensor or --nproc 1"
        )
    return best[1], best[2]


def stage_device_map(
    model: Any, nproc: int, device_type: str
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(device map for ``from_pretrained``, stages for the report).

    Layers are cut into ``nproc`` contiguous stages by cumulative parameter bytes (layer
    i goes to the stage its midpoint falls in). What is registered before the layers
    (embeddings) and what holds no weights (rotary tables) sits on the first stage, what
    comes after (final norm, head) on the last, except a head tied to the input
    embeddings, which stays with them.
    """
    path, layers = decoder_layers(model)
    if len(layers) < nproc:
        raise BadInputError(
            f"--placement pipeline --nproc {nproc} needs at least {nproc} decoder layers, "
            f"the model has {len(layers)}: pass --nproc {len(layers)} or fewer"
        )
    names = [f"{path}.{i}" if path else str(i) for i in range(len(layers))]
    sizes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in layers]
    total = sum(sizes) or 1
    stage_of: list[int] = []
    done = 0.0
    for size in sizes:
        stage_of.append(min(nproc - 1, int((done + size / 2) / total * nproc)))
        done += size
    # every stage gets at least one layer (tiny or uneven models)
    for s in range(nproc):
        if s not in stage_of:
            stage_of = [min(i * nproc // len(sizes), nproc - 1) for i in range(len(sizes))]
            break

    def device(s: int) -> str:
        return "cpu" if device_type == "cpu" else f"{device_type}:{s}"

    mapping: dict[str, str] = {}
    for name, s in zip(names, stage_of, strict=True):
        mapping[name] = device(s)
    tied_head = _tied_head(model)
    ancestors = path.split(".") if path else []
    prefix = ""
    for part in ancestors:
        parent = model.get_submodule(prefix) if prefix else model
        after = False
        for child_name, child in parent.named_children():
            full = f"{prefix}.{child_name}" if prefix else child_name
            if child_name == part:
                after = True
                continue
            # Weightless modules (rotary tables) feed the first layer: first stage.
            weighted = any(True for _ in child.parameters())
            last = after and weighted and full != tied_head
            mapping[full] = device(nproc - 1 if last else 0)
        prefix = f"{prefix}.{part}" if prefix else part
    stages = []
    for s in range(nproc):
        mine = [n for n, st in zip(names, stage_of, strict=True) if st == s]
        stages.append(
            {
                "stage": s,
                "device": device(s),
                "layers": [mine[0], mine[-1]] if mine else [],
                "layer_count": len(mine),
                "layer_bytes": sum(sz for sz, st in zip(sizes, stage_of, strict=True) if st == s),
            }
        )
    return mapping, stages


def _tied_head(model: Any) -> str | None:
    """The output embedding's path when it shares its weight with the input embedding."""
    try:
        head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    except Exception:
        return None
    if head is None or emb is None or head.weight is not emb.weight:
        return None
    return next((n for n, m in model.named_modules() if m is head), None)


def run_pipeline(config: BenchConfig, *, validated: bool = False) -> Report:
    """Measure ``config`` with the model split over ``config.nproc`` devices (see module).

    ``validated``: the caller has run ``config.validate()`` on this very config
    (``run_bench`` does); otherwise it runs here, once."""
    import torch

    from ..report import new_report

    if not validated:
        config.validate()
    checked = check_before_launch(config)
    path, raw, device_type = checked.path, checked.raw, checked.device_type
    first = torch.device(device_type) if device_type == "cpu" else torch.device(device_type, 0)
    mapping, stages = _plan(config, path, raw, device_type)

    skipped = baseline_skip_reason(config, first)
    baseline, ref, no_ref = None, None, None
    if skipped is None:
        try:
            baseline, ref, no_ref = measure_baseline(config, first, NoBeat())
        except Exception as err:
            if not out_of_memory(err):
                raise
            skipped = f"the whole model ran out of memory on one device ({str(err)[:160]})"
    if skipped:
        no_ref = f"no 1-rank run to judge the placed arm against ({skipped})"
    from ..measure import RssPeak

    load_rss = RssPeak()
    model, tokenizer, load_s = load_placed(
        config, path, raw, {"device_map": mapping}, "over a device map"
    )
    ctx = make_ctx(config, model, tokenizer, first, lambda *a: None)
    # The numerical gate: the placed eager arm against the 1-rank run's eager reference.
    run = measure_arm(ctx, "eager", with_comm=False, judge=Judge.alone(ref, no_ref))
    from ..report import model_section

    run.model_info = model_section(
        model,
        path=path,
        model_type=getattr(model.config, "model_type", None),
        load_s=load_s,
        load_memory={"peak_allocated": None, "peak_reserved": None, **load_rss.result()},
    )
    run.model_info["device"] = str(first)
    base = baseline["eager"] if baseline is not None else None
    arm, figures = aggregate_arm(config, "eager", run, base, [run.figures], skipped)
    arm.details["placement"] = "pipeline"
    figures["scaling_efficiency"] = None  # stages run one after another for one request
    from pypto_capture import device_name

    report = new_report(config, device=first, device_name=device_name(first))
    report.model = {k: v for k, v in run.model_info.items() if k != "device"}
    add_arm(report, arm, figures, f"eager over {config.nproc} pipeline stages")
    if skipped:
        report.warnings.append(f"1-rank baseline skipped ({skipped}): {NO_BASELINE_FIGURES}")
    if device_type == "cpu":
        report.warnings.append(
            "--placement pipeline on a CPU: every stage is the one CPU (the mechanics ran; "
            "nothing was placed elsewhere)"
        )
    report.distributed = {
        "nproc": config.nproc,
        "placement": "pipeline",
        "device_type": device_type,
        "backend": None,
        "threads_per_rank": torch.get_num_threads(),
        "launcher": "one process: transformers from_pretrained(device_map=...) (accelerate hooks)",
        "tp_plan": None,
        "device_map": mapping,
        **figures,
        "ranks": [_stage_entry(s, model, run.figures) for s in stages],
        "arms": {"eager": figures},
        "note": (
            "pipeline placement: a request's activations pass the stages one after another; "
            "it measures a model too large for one device, not a parallel speedup"
        ),
    }
    report.finish()
    for warning in report.warnings:
        log.warning("%s", warning)
    if config.report_file:
        report.write(config.report_file)
    return report


#: Most decoder layers a config may declare for ``--placement pipeline`` (the largest
#: published models have under 200): planning builds every layer (weightless), and a
#: config declaring 200000 would sit in planning for minutes.
MAX_PIPELINE_LAYERS = 1024
#: Config attributes that hold the decoder-layer count, by family naming.
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def declared_layers(cfg: Any) -> int | None:
    """The decoder-layer count a config declares (its text config's), None if it names none."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for source in (text, cfg):
        for key in _LAYER_COUNT_KEYS:
            value = getattr(source, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _plan(config: BenchConfig, path: Path, raw: dict[str, Any], device_type: str) -> Any:
    """The device map, computed on a weightless (meta) copy of the model.

    Bounded: a config declaring more than ``MAX_PIPELINE_LAYERS`` layers is refused
    before anything is built, and building the copy stops once it has taken
    ``--rank-timeout`` seconds (``RankFailedError``).
    """
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=config.trust_remote_code
        )
    except Exception as err:
        raise ModelLoadError(
            f"reading {path}/config.json to place its layers failed: "
            f"{type(err).__name__}: {redact(' '.join(str(err).split()))[:300]}"
        ) from err
    layers = declared_layers(cfg)
    if layers is not None and not 0 <= layers <= MAX_PIPELINE_LAYERS:
        raise BadInputError(
            f"{path}/config.json declares {layers} decoder layers, over the "
            f"{MAX_PIPELINE_LAYERS} --placement pipeline plans: fix the config (a corrupt "
            "or hostile folder) or re-download the model"
        )
    try:
        return _build_and_map(config, cfg, path, raw, device_type)
    except _PlanningTimeout as err:
        raise RankFailedError(
            f"planning the {config.nproc} pipeline stages of {path}"
            f"{f' ({layers} layers)' if layers is not None else ''} took "
            f"over --rank-timeout {config.rank_timeout:g} s: raise --rank-timeout if the "
            "model is that large"
        ) from err


class _PlanningTimeout(BaseException):
    """Raised from inside the model's construction (not an ``Exception``: nothing on the
    way may swallow it) when planning has run over ``--rank-timeout``."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Within the block, registering a submodule (what building a model does thousands of
    times) after ``seconds`` raises ``_PlanningTimeout``: the build stops where it is, in
    whatever thread runs it."""
    from torch.nn.modules.module import register_module_module_registration_hook

    end = time.monotonic() + seconds

    def check(module: Any, name: str, submodule: Any) -> None:
        if time.monotonic() > end:
            raise _PlanningTimeout()

    handle = register_module_module_registration_hook(check)
    try:
        yield
    finally:
        handle.remove()


def _build_and_map(
    config: BenchConfig, cfg: Any, path: Path, raw: dict[str, Any], device_type: str
) -> Any:
    import torch

    from ..loading import auto_class

    try:
        with _deadline(config.rank_timeout), torch.device("meta"):
            meta = auto_class(raw).from_config(cfg, trust_remote_code=config.trust_remote_code)
    except Exception as err:
        raise ModelLoadError(
            f"building {path}'s layers to place them failed: "
            f"{type(err).__name__}: {redact(' '.join(str(err).split()))[:300]}"
        ) from err
    return stage_device_map(meta, config.nproc, device_type)


def _stage_entry(stage: dict[str, Any], model: Any, figures: dict[str, Any]) -> dict[str, Any]:
    """One stage, shaped like a rank's entry (the step is the whole pipeline's)."""
    held = 0
    for p in model.parameters():
        if str(p.device) == stage["device"] or (
            stage["device"] == "cpu" and p.device.type == "cpu"
        ):
            held += p.numel() * p.element_size()
    return {
        "rank": stage["stage"],
        **stage,
        "step_s": figures["step_s"],
        "samples_s": figures["samples_s"],
        "memory": _device_memory(stage["device"], figures),
        "parameter_bytes_on_device": held,
        "communication": {
            "seconds": None,
            "share": None,
            "method": None,
            "unmeasured": "pipeline: activations move between stages inside the step",
        },
    }


def _device_memory(device: str, figures: dict[str, Any]) -> dict[str, Any]:
    if device.startswith("cuda"):
        import torch

        return {"peak_allocated": int(torch.cuda.max_memory_allocated(device))}
    return dict(figures.get("memory") or {})
