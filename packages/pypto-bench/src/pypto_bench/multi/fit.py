"""Does the whole model fit one device? The rule that skips the 1-rank baseline of a
multi-device run (``--no-baseline``, the checkpoint's weights against the device's free
memory, an out-of-memory error), and freeing a device after the baseline."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import BenchConfig

__all__ = [
    "BASELINE_HEADROOM",
    "baseline_skip_reason",
    "checkpoint_bytes",
    "fit_reason",
    "out_of_memory",
    "release_memory",
]

log = logging.getLogger(__name__)

#: The 1-rank baseline runs when weights x this fit the device's free memory (the rest:
#: activations, the KV cache, the allocator's slack).
BASELINE_HEADROOM = 1.2
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def baseline_skip_reason(config: BenchConfig, device: Any) -> str | None:
    """Why the 1-rank baseline is not run (None: run it): ``--no-baseline``, or a model
    whose weights (at the run's dtype) x ``BASELINE_HEADROOM`` exceed one device's free
    memory. Unknown sizes run it (an out-of-memory error then skips it)."""
    if not config.nproc_baseline:
        return "skipped by --no-baseline"
    # Imported here: a launched rank imports this module before it binds its device, and
    # pypto_capture imports torch (the binding must come first: multi.rank).
    from pypto_capture.device import free_bytes

    from ..loading import check_model_folder

    need = checkpoint_bytes(check_model_folder(config.model_path), config.dtype)
    return fit_reason(need, free_bytes(device), device.type, config.dtype)


def fit_reason(need: int | None, free: int | None, device_type: str, dtype: str) -> str | None:
    """The rule of ``baseline_skip_reason``: None (run it) unless both sizes are known and
    the weights x ``BASELINE_HEADROOM`` exceed the free memory."""
    if need is None or free is None or need * BASELINE_HEADROOM <= free:
        return None
    return (
        f"the whole model does not fit one {device_type} device: {need / 2**30:.2f} GiB of "
        f"weights at {dtype} x {BASELINE_HEADROOM} > {free / 2**30:.2f} GiB free"
    )


def checkpoint_bytes(folder: Path, dtype: str) -> int | None:
    """Bytes of the folder's safetensors weights once loaded at ``dtype`` (floating tensors
    converted, others as stored), from the shard headers; None when unknown.

    The shards are exactly the ones the project's strict checkpoint reader
    (``pypto_common.checkpoint``) reads for the loaders: those ``model.safetensors.index.json``
    names (a stray file beside them is not counted), as regular files inside the folder or
    through the links a pypto-patch overlay records (``pypto_patch.overlay_links``: a pinned
    overlay's weights are links into the downloaded folder), never through any other link.
    A folder whose weights cannot be read that way (an indexed shard missing, unreadable
    or malformed, a link nobody recorded) has an unknown size, said in one warning line:
    the baseline then runs, and loading reports the problem itself.
    """
    from pypto_common.checkpoint import CheckpointError, read_checkpoint
    from pypto_patch import PatchError, overlay_links

    try:
        checkpoint = read_checkpoint(folder, links=overlay_links(folder))
    except (CheckpointError, PatchError, OSError) as err:
        log.warning("size of the weights unknown (the 1-rank baseline is not skipped): %s", err)
        return None
    want = _ELEMENT_BYTES.get(dtype)
    total = 0
    for entry in checkpoint.tensors.values():
        floating = entry.dtype.startswith(("F", "BF"))
        total += entry.numel * want if want and floating else entry.nbytes
    return total


def out_of_memory(err: BaseException) -> bool:
    """An allocator's out-of-memory error (CUDA/NPU/CPU), possibly wrapped by the loader."""
    seen: BaseException | None = err
    while seen is not None:
        if type(seen).__name__ == "OutOfMemoryError" or "out of memory" in str(seen).lower():
            return True
        seen = seen.__cause__
    return False


def release_memory(device: Any) -> None:
    """Give back what a dropped model held: a garbage collection, then the device cache."""
    import gc

    gc.collect()
    if device.type != "cpu":
        from pypto_capture.device import empty_cache

        empty_cache(device)
