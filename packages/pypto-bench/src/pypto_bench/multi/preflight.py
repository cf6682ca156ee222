"""What a multi-device run checks against this machine and the model folder before it
starts anything: enough devices for the ranks, a tensor-parallel plan that splits the
model, the folder's own code allowed, accelerate importable, the tokenizer loadable.

The request's own rules (``--nproc`` an integer, the regimes and arms measured across
ranks, ``--rank-timeout`` bounds, the pipeline placement's prefill-only rule) are not
here: they are part of ``BenchConfig.validate`` (:func:`pypto_bench.config.
validate_placement`), run once, before these. :func:`check_before_launch` runs every check
of this module once, in the order each placement always ran them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pypto_common import redact

from ..config import Placement
from ..errors import (
    BadInputError,
    EnvironmentMissingError,
    ModelLoadError,
    NoTensorParallelPlanError,
    TooManyRanksError,
)
from .tensor import PYPTO_PLAN_PREFIX, check_plan, plan_of

if TYPE_CHECKING:
    from ..config import BenchConfig

__all__ = [
    "BACKEND_FOR",
    "Preflight",
    "check_before_launch",
    "check_model_code",
    "check_nproc",
    "check_tokenizer",
    "check_tp_plan",
    "require_accelerate",
    "visible_devices",
]

#: torch.distributed backend per device type (HCCL is registered by torch_npu).
BACKEND_FOR = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclass(frozen=True)
class Preflight:
    """What the checks found: the model folder, its config.json, the ranks' device type and
    (tensor placement) the plan that will shard the model, as the report names it."""

    path: Path
    raw: dict[str, Any]
    device_type: str
    plan: str | None


def check_before_launch(config: BenchConfig) -> Preflight:
    """Every check of a multi-device run, once (``config`` already validated): the folder,
    the report path, then per placement what could refuse it, cheapest first; raises the
    typed error of the first that fails, before any process starts or weight loads."""
    from ..loading import check_model_folder, read_model_config
    from ..report import check_report_path

    path = check_model_folder(config.model_path)
    if config.report_file:
        check_report_path(config.report_file)
    plan: str | None = None
    if config.placement == Placement.PIPELINE:
        raw = read_model_config(path)
        check_model_code(config, path, raw)
        device_type = check_nproc(config)  # resolves the device, refuses too many stages
        require_accelerate("--placement pipeline (a device map)")
    else:
        device_type = check_nproc(config)
        raw = read_model_config(path)
        plan = check_tp_plan(config, path=path, raw=raw)
        if not plan.startswith(PYPTO_PLAN_PREFIX):
            require_accelerate(f"--nproc {config.nproc} with transformers' tensor-parallel plan")
    check_tokenizer(config, path)
    return Preflight(path=path, raw=raw, device_type=device_type, plan=plan)


def visible_devices(device_type: str) -> int:
    """How many ranks of this device type fit here: one device per rank.

    CPU: the cores this process may run on (``os.sched_getaffinity``, else
    ``os.cpu_count()``), one core's share per rank.
    """
    if device_type == "cpu":
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return os.cpu_count() or 1
    if device_type == "cuda":
        import torch

        return int(torch.cuda.device_count())
    if device_type == "npu":
        from ..environment import NPU

        return int(NPU.resolve("torch_npu.npu.device_count")())
    raise EnvironmentMissingError(f"no distributed backend for device type {device_type!r}")


def _device_type(config: BenchConfig) -> str:
    from ..environment import open_device

    device = open_device(config.device)
    if device.type != "cpu" and (device.index or 0) != 0:
        raise BadInputError(
            f"--device {config.device} with --nproc: rank r uses {device.type}:r, so pass "
            f"--device {device.type} and choose cards with CUDA_VISIBLE_DEVICES / "
            "ASCEND_RT_VISIBLE_DEVICES"
        )
    if device.type not in BACKEND_FOR:
        raise EnvironmentMissingError(f"no distributed backend for device type {device.type!r}")
    return device.type


def check_nproc(config: BenchConfig) -> str:
    """The device type, after refusing more ranks than visible devices (before launching)."""
    device_type = _device_type(config)
    have = visible_devices(device_type)
    if config.nproc > have:
        what = "CPU cores" if device_type == "cpu" else f"{device_type} devices"
        raise TooManyRanksError(
            f"--nproc {config.nproc} needs {config.nproc} {what} (one per rank) but {have} "
            f"are visible here: pass --nproc {have} or fewer"
        )
    return device_type


def check_tp_plan(
    config: BenchConfig, *, path: Path | None = None, raw: dict[str, Any] | None = None
) -> str:
    """Name the plan transformers will use, or refuse a family without one (no launch).

    ``path`` / ``raw``: the checked folder and its config.json when the caller has them
    (read here otherwise)."""
    from ..loading import check_model_folder, read_model_config

    if path is None:
        path = check_model_folder(config.model_path)
    if raw is None:
        raw = read_model_config(path)
    check_model_code(config, path, raw)
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=config.trust_remote_code
        )
    except Exception as err:
        raise ModelLoadError(
            f"reading {path}/config.json failed: {redact(' '.join(str(err).split()))[:300]}"
        ) from err
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    model_type = getattr(cfg, "model_type", None) or raw.get("model_type")
    own = plan_of(cfg) or plan_of(text)
    if own:  # an in-repo family (a pinned folder): its plan, applied by pypto_bench
        check_plan(own, text, config.nproc)
        _check_heads(text, model_type, config.nproc)
        return f"{PYPTO_PLAN_PREFIX} of {type(cfg).__name__} ({len(own)} rules, in-repo family)"
    plan = getattr(cfg, "base_model_tp_plan", None) or getattr(text, "base_model_tp_plan", None)
    if not plan:
        raise NoTensorParallelPlanError(
            f"model type {model_type!r} has no tensor-parallel plan (its config's "
            f"base_model_tp_plan is empty), so --nproc {config.nproc} cannot shard it: run it "
            "with --nproc 1, or use the fallback for prefill, pipeline placement of its layers "
            "across the devices with an accelerate-style device map: --placement pipeline "
            "--regime prefill --arms eager"
        )
    _check_heads(text, model_type, config.nproc)
    return f"transformers base_model_tp_plan of {type(cfg).__name__} ({len(plan)} rules)"


def check_model_code(config: BenchConfig, path: Path, raw: dict[str, Any]) -> None:
    """Refuse a model whose config needs the folder's own code without
    ``--trust-remote-code`` (``ModelLoadError``, exit 40), before any placement starts."""
    from ..loading import refuse_remote_code

    refuse_remote_code(raw, path, config.trust_remote_code)


def check_tokenizer(config: BenchConfig, path: Path) -> None:
    """Load the folder's tokenizer as every placement will, before any starts: one that
    needs the folder's own code without ``--trust-remote-code`` (its ``auto_map``), or
    fails to load at all, is a ``ModelLoadError`` (exit 40, the single-process load's
    code) now, not a rank failure (48) inside rank 0 after the 1-rank baseline."""
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=config.trust_remote_code
        )
    except Exception as err:  # transformers raises many unrelated types here
        msg = redact(" ".join(str(err).split()))
        if "trust_remote_code" in msg and not config.trust_remote_code:
            raise ModelLoadError(
                f"{path} needs its own code to load (its tokenizer): rerun with "
                "--trust-remote-code if you trust it"
            ) from err
        raise ModelLoadError(
            f"loading the tokenizer of {path} failed: {type(err).__name__}: {msg[:300]}"
        ) from err


def require_accelerate(what: str) -> None:
    """``EnvironmentMissingError`` (exit 3) before anything starts when accelerate, which
    transformers' own placement (a TP plan, a device map) needs, cannot be imported."""
    try:
        import accelerate  # noqa: F401
    except ImportError as err:
        raise EnvironmentMissingError(
            f"{what} needs accelerate, which cannot be imported here "
            f"({type(err).__name__}: {' '.join(str(err).split())[:200]}): "
            "pip install 'pypto-bench[distributed]'"
        ) from err


def _check_heads(text: Any, model_type: Any, nproc: int) -> None:
    for name in ("num_attention_heads", "num_key_value_heads"):
        for heads in _head_counts(text, name):
            if heads % nproc == 0:
                continue
            raise BadInputError(
                f"{name} = {heads} of {model_type!r} is not divisible by --nproc "
                f"{nproc}: tensor parallelism splits heads evenly, pick an --nproc "
                "that divides it"
            )


def _head_counts(text: Any, name: str) -> set[int]:
    """Every value of a head count: one global value, or per layer where the config varies
    it (Gemma 4's configs refuse the global read of a per-layer attribute)."""
    try:
        heads = getattr(text, name, None)
    except Exception:  # a per-layer attribute read globally
        heads = None
    if isinstance(heads, int):
        return {heads}
    layers = getattr(text, "per_layer_config", None) or []
    return {h for c in layers if isinstance(h := getattr(c, name, None), int)}
