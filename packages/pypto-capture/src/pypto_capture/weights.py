"""A checked checkpoint's tensors, refusing values no model should load.

:func:`pypto_common.checkpoint.read_checkpoint` checks a folder's layout without torch
(which shards, where, duplicates, scale/weight pairing, integer scales); what needs the
values themselves is here, at the lowest torch-level package every strict family loader
depends on, so each family reads its folder with one call and none repeats the checks:
a floating tensor holding NaN or inf (a damaged download; a NaN block scale poisons a
whole 128x128 block) is one :class:`~pypto_common.checkpoint.CheckpointError` line naming
the tensor and the shard. Needs ``safetensors`` (installed with transformers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from pypto_common.checkpoint import (
    REDOWNLOAD,
    Checkpoint,
    CheckpointError,
    TensorEntry,
    read_checkpoint,
)

__all__ = ["count_non_finite", "iter_tensors", "read_folder"]

# Elements checked at once: bounds the temporary (a float copy of an FP8 chunk) to 64 MiB.
_CHUNK = 1 << 24


def count_non_finite(tensor: torch.Tensor) -> int:
    """NaN and inf elements of a floating tensor (0 for other dtypes), in bounded chunks."""
    if not tensor.is_floating_point():
        return 0
    flat = tensor.reshape(-1)
    bad = 0
    for start in range(0, flat.numel(), _CHUNK):
        part = flat[start : start + _CHUNK]
        if part.element_size() == 1:  # FP8: isfinite is not implemented for every kind
            part = part.float()
        bad += int(part.numel() - int(torch.isfinite(part).sum()))
    return bad


def _check(entry: TensorEntry, tensor: torch.Tensor) -> None:
    bad = count_non_finite(tensor)
    if bad:
        raise CheckpointError(
            f"weight {entry.name} in {entry.shard} holds {bad} non-finite "
            f"value{'s' if bad > 1 else ''} (NaN or inf): the download is damaged; {REDOWNLOAD}"
        )


def iter_tensors(checkpoint: Checkpoint) -> Iterator[tuple[TensorEntry, torch.Tensor]]:
    """(entry, tensor) for every tensor of ``checkpoint``, shard by shard, lazily; each
    floating tensor checked for NaN / inf before it is handed out."""
    from safetensors import safe_open

    for shard, entries in checkpoint.by_shard().items():
        path = checkpoint.shards[shard]
        try:
            handle = safe_open(str(path), framework="pt")
        except Exception as err:  # safetensors raises its own types for damaged files
            raise CheckpointError(
                f"{shard} is not a readable safetensors file ({type(err).__name__}): {REDOWNLOAD}"
            ) from err
        with handle as fh:
            for entry in entries:
                try:
                    tensor = fh.get_tensor(entry.name)
                except Exception as err:
                    raise CheckpointError(
                        f"weight {entry.name} in {shard} is unreadable ({type(err).__name__}): "
                        f"{REDOWNLOAD}"
                    ) from err
                _check(entry, tensor)
                yield entry, tensor


def read_folder(
    folder: str | Path,
    *,
    links: Callable[[Path], Mapping[str, Path | str]] | None = None,
    error: Callable[[str], Exception] = CheckpointError,
    also: tuple[type[Exception], ...] = (),
) -> Iterator[tuple[TensorEntry, torch.Tensor]]:
    """:func:`iter_tensors` of ``read_checkpoint(folder, links=links(folder))``, lazily: what
    a strict family loader calls. ``links`` names the links that may be followed (pass
    ``pypto_patch.overlay_links``); every refusal (a ``CheckpointError``, or one of ``also``
    raised by ``links``) is re-raised as ``error(message)``, the family's own one-line type.
    """
    caught: tuple[type[Exception], ...] = (CheckpointError, *also)
    try:
        checkpoint = read_checkpoint(folder, links=links(Path(folder)) if links else None)
        yield from iter_tensors(checkpoint)
    except caught as err:
        raise error(str(err)) from err
