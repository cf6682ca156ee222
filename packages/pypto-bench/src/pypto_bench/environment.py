"""Device environment setup and the report's environment metadata.

The NPU allocator reads ``PYTORCH_NPU_ALLOC_CONF`` once, when the device initialises;
setting it afterwards (as the seed harness did) silently does nothing. So the variables
are set here, from the device *spec*, before anything touches the device: the CLI calls
``prepare_device_env`` before importing torch, the library calls it again (harmless)
before resolving the device.

Every torch_npu name used here (the variable included) is declared in
:data:`NPU_API_TABLE` and checked against each torch_npu wheel by ``nox -s npu_api``.
That check found that PyPTO 0.2.0 never reads ``TILE_FWK_DEVICE_ID`` (it switches to
the input tensors' device itself), so the bench no longer sets it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import platform
import socket
import sys
from typing import Any

from pypto_common.npu_api import NpuApi, parse_table

__all__ = [
    "ALLOC_CONF",
    "NPU",
    "NPU_ALLOC_CONF_DEFAULT",
    "NPU_API_TABLE",
    "cpu_model",
    "environment_metadata",
    "open_device",
    "prepare_device_env",
    "torch_npu_installed",
]

log = logging.getLogger(__name__)

# kind path [keywords] | where it was checked (torch_npu wheels 2.5.1 .. 2.12.0).
NPU_API_TABLE = """
env      torch_npu.PYTORCH_NPU_ALLOC_CONF            | torch_npu/npu/memory.py docs; read by libtorch_npu.so
function torch_npu.npu.is_initialized                | torch_npu/npu/__init__.py
module   torch_npu.npu.utils                         | torch_npu/npu/utils.py
function torch_npu.npu.utils.get_cann_version        | torch_npu/npu/utils.py
kwarg    torch_npu.npu.utils.get_cann_version module | torch_npu/npu/utils.py get_cann_version(module=)
module   torchair                                    | torch_npu/dynamo/torchair/__init__.py (hf-compile arm on NPU)
class    torchair.CompilerConfig                     | torchair/configs/compiler_config.py
member   torchair.CompilerConfig.mode                | set in CompilerConfig.__init__ (max-autotune | reduce-overhead)
function torchair.get_npu_backend                    | torchair/npu_fx_compiler.py, re-exported
kwarg    torchair.get_npu_backend compiler_config    | get_npu_backend(*, compiler_config=None, ...)
function torch_npu.npu.device_count                  | torch_npu/npu/__init__.py (--nproc: ranks <= NPUs)
function torch_npu.npu.set_device                    | torch_npu/npu/utils.py (--nproc: rank r on npu:r)
module   torch_npu.distributed                       | torch_npu/distributed/__init__.py (registers hccl)
function torch_npu.distributed.is_hccl_available     | torch_npu/distributed/distributed_c10d.py, re-exported
module   torch_npu.profiler                          | torch_npu/profiler/__init__.py (--nproc: HCCL share)
class    torch_npu.profiler.profile                  | torch_npu/profiler/profiler.py class profile
kwarg    torch_npu.profiler.profile activities on_trace_ready | profile.__init__(activities=, on_trace_ready=)
class    torch_npu.profiler.ProfilerActivity         | torch_npu/profiler/__init__.py (torch_npu._C._profiler)
member   torch_npu.profiler.ProfilerActivity.CPU     | compiled enum (torch_npu._C._profiler)
member   torch_npu.profiler.ProfilerActivity.NPU     | compiled enum (torch_npu._C._profiler)
function torch_npu.profiler.tensorboard_trace_handler | torch_npu/profiler/profiler.py
kwarg    torch_npu.profiler.tensorboard_trace_handler dir_name | tensorboard_trace_handler(dir_name=...)
"""

NPU = NpuApi(parse_table(NPU_API_TABLE), owner="pypto_bench.environment")
ALLOC_CONF = NPU.env_name("torch_npu.PYTORCH_NPU_ALLOC_CONF")

NPU_ALLOC_CONF_DEFAULT = "expandable_segments:True"


def open_device(spec: str | int | None) -> Any:
    """``spec`` as a torch device, or one ``EnvironmentMissingError`` line naming why not."""
    from pypto_capture import resolve_device
    from pypto_common import redact

    from .errors import EnvironmentMissingError

    try:
        return resolve_device(spec)
    except Exception as err:
        raise EnvironmentMissingError(
            f"device {spec!r} is not available: {redact(' '.join(str(err).split()))}"
        ) from err


def _spec_may_be_npu(spec: str | int | None) -> bool:
    text = "auto" if spec is None else str(spec).strip().lower()
    return text == "auto" or (text.isascii() and text.isdigit()) or text.startswith("npu")


def torch_npu_installed() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


def prepare_device_env(spec: str | int | None) -> list[str]:
    """Set NPU env vars for ``spec`` before device init; returns warnings for the report."""
    warnings: list[str] = []
    if not (_spec_may_be_npu(spec) and torch_npu_installed()):
        return warnings
    os.environ.setdefault(ALLOC_CONF, NPU_ALLOC_CONF_DEFAULT)
    if "torch_npu" in sys.modules:  # only then can the device have been initialised
        try:
            is_init = NPU.resolve("torch_npu.npu.is_initialized")
        except (ImportError, AttributeError):
            is_init = None
        if callable(is_init) and is_init():
            msg = "the NPU was initialised before the bench set PYTORCH_NPU_ALLOC_CONF: it may not apply"
            log.warning(msg)
            warnings.append(msg)
    return warnings


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cann_version() -> str | None:
    detect_cann: Any = None
    try:
        from pypto_env import detect_cann  # optional: richer detection when installed
    except ImportError:
        pass
    if detect_cann is not None:
        try:
            found = detect_cann()
            return getattr(found, "version", None) if found else None
        except Exception as err:  # detection must never break a bench run
            log.debug("pypto_env.detect_cann failed: %s", err)
    if "torch_npu" in sys.modules:
        try:
            path = "torch_npu.npu.utils.get_cann_version"
            return str(NPU.resolve(path)(**NPU.kwargs(path, module="CANN")))
        except Exception as err:
            log.debug("torch_npu CANN query failed: %s", err)
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_metadata(device: Any = None, device_name: str | None = None) -> dict[str, Any]:
    """Versions and machine identity recorded in every report."""
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "torch_npu": _version("torch_npu") or _version("torch-npu"),
            "cann": _cann_version(),
            "transformers": _version("transformers"),
            "pypto": _version("pypto"),
            "pypto_bench": _version("pypto-bench"),
            "pypto_capture": _version("pypto-capture"),
            "pypto_env": _version("pypto-env"),
        },
        "device": {
            "spec": str(device) if device is not None else None,
            "type": getattr(device, "type", None),
            "name": device_name,
        },
        "env": {
            key: os.environ.get(key)
            for key in ("PYTORCH_NPU_ALLOC_CONF", "TILE_FWK_DEVICE_ID", "CUDA_VISIBLE_DEVICES")
        },
    }
