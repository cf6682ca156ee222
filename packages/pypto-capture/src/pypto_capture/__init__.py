"""pypto-capture: graph capture for LLM decode on Ascend NPU, CUDA and CPU.

The core (device layer, backends, explanations, exact and static MoE routing) needs
only torch; the pieces that drive transformers models import transformers lazily.
"""

from __future__ import annotations

from .backends import (
    BACKENDS,
    CapturedStep,
    CompileBackend,
    DeviceGraphBackend,
    EagerBackend,
    FusedBackend,
    GraphBackend,
    ReplayResult,
    auto_backend_name,
    capture_and_replay,
    make_backend,
    resolve_backend_name,
)
from .bisect import MIXER_STAGE, STAGES, BisectResult, bisect_capture
from .cache import (
    capture_safe_cache_class,
    check_cache_fits,
    indexer_layers,
    make_capture_safe_cache,
    static_cache_bytes,
)
from .codes import EXIT
from .decode import AUTOTUNE_MIN_WEIGHT_BYTES, STEP_MARKER, DecodeStepRunner, default_compile_mode
from .device import (
    MemoryStats,
    device_name,
    memory_stats,
    npu_available,
    reset_peak_memory,
    resolve_device,
    synchronize,
)
from .errors import (
    CacheApiNotSupportedError,
    CacheDoesNotFitError,
    CaptureFailedError,
    CaptureUnsafeConfigError,
    DeviceNotAvailableError,
    InvalidDeviceSpecError,
    PyptoCaptureError,
    UnsupportedModelError,
)
from .explain import KNOWN_CAUSES, CaptureExplanation, explain_capture_error
from .layout import layer_pattern
from .loading import (
    ModelFolderError,
    ModelLoadError,
    RemoteCodeRefusedError,
    load_local_model,
    read_folder_config,
)
from .mitigations import MitigationHandle, apply_capture_mitigations, needs_capture_mitigations
from .moe import StaticMoERouting, round_robin_assignment
from .moe_exact import (
    MOE_ROUTINGS,
    ExpertsInfo,
    MoEHandle,
    apply_exact_moe,
    apply_moe_routing,
    apply_static_moe,
    exact_experts_forward,
    find_experts,
    moe_weight_bytes,
    swap_forward,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``pypto_capture.CaptureSafeCache``: the capture-safe cache class, built on first use.

    It subclasses transformers' ``Cache``, so it exists only once transformers is
    imported; the core of this package stays importable without transformers. Not in
    ``__all__`` for the same reason (``from pypto_capture import *`` must not need it).
    """
    if name == "CaptureSafeCache":
        return capture_safe_cache_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTOTUNE_MIN_WEIGHT_BYTES",
    "BACKENDS",
    "EXIT",
    "KNOWN_CAUSES",
    "MIXER_STAGE",
    "MOE_ROUTINGS",
    "STAGES",
    "STEP_MARKER",
    "BisectResult",
    "CacheApiNotSupportedError",
    "CacheDoesNotFitError",
    "CaptureExplanation",
    "CaptureFailedError",
    "CaptureUnsafeConfigError",
    "CapturedStep",
    "CompileBackend",
    "DecodeStepRunner",
    "DeviceGraphBackend",
    "DeviceNotAvailableError",
    "EagerBackend",
    "ExpertsInfo",
    "FusedBackend",
    "GraphBackend",
    "InvalidDeviceSpecError",
    "MemoryStats",
    "MitigationHandle",
    "MoEHandle",
    "ModelFolderError",
    "ModelLoadError",
    "PyptoCaptureError",
    "RemoteCodeRefusedError",
    "ReplayResult",
    "StaticMoERouting",
    "UnsupportedModelError",
    "__version__",
    "apply_capture_mitigations",
    "apply_exact_moe",
    "apply_moe_routing",
    "apply_static_moe",
    "auto_backend_name",
    "bisect_capture",
    "capture_and_replay",
    "capture_safe_cache_class",
    "check_cache_fits",
    "default_compile_mode",
    "device_name",
    "exact_experts_forward",
    "explain_capture_error",
    "find_experts",
    "indexer_layers",
    "layer_pattern",
    "load_local_model",
    "make_backend",
    "make_capture_safe_cache",
    "memory_stats",
    "moe_weight_bytes",
    "needs_capture_mitigations",
    "npu_available",
    "read_folder_config",
    "reset_peak_memory",
    "resolve_backend_name",
    "resolve_device",
    "round_robin_assignment",
    "static_cache_bytes",
    "swap_forward",
    "synchronize",
]
