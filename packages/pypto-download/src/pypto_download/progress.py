"""Progress on stderr and the hub library's module-level knobs we turn during a download.

The hub library reads the network in 10 MiB chunks and only writes whole chunks, so a
killed process loses up to 10 MiB per file in flight; we lower that chunk to 1 MiB for
the duration of a download (no measurable cost in tools/bench_download.py). Its body
read timeout is a module constant too (``HF_HUB_DOWNLOAD_TIMEOUT``, read once from the
environment at import), so ``--read-timeout`` is applied the same way.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

from huggingface_hub import constants as hf_constants
from huggingface_hub.utils import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
)

__all__ = ["TotalBar", "hub_progress", "hub_settings", "supports"]


def supports(func: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def hub_progress(enabled: bool) -> Iterator[None]:
    """Turn the hub library's own bars off for the duration (quiet mode)."""
    was_disabled = are_progress_bars_disabled()
    if not enabled and not was_disabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            enable_progress_bars()


_settings_lock = threading.Lock()
_settings_users = 0
_saved: dict[str, Any] = {}


@contextlib.contextmanager
def hub_settings(*, chunk_size: int | None, read_timeout: float) -> Iterator[None]:
    """Lower the read chunk and set the body read timeout while we download.

    Process-wide (they are module constants): concurrent downloads in one process share
    the first one's values, and the originals come back when the last one ends.
    """
    global _settings_users
    with _settings_lock:
        if _settings_users == 0:
            _saved.clear()
            current = getattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", None)
            if chunk_size and isinstance(current, int) and current > chunk_size:
                _saved["DOWNLOAD_CHUNK_SIZE"] = current
                hf_constants.DOWNLOAD_CHUNK_SIZE = chunk_size
            if hasattr(hf_constants, "HF_HUB_DOWNLOAD_TIMEOUT"):
                _saved["HF_HUB_DOWNLOAD_TIMEOUT"] = hf_constants.HF_HUB_DOWNLOAD_TIMEOUT
                hf_constants.HF_HUB_DOWNLOAD_TIMEOUT = read_timeout  # type: ignore[assignment]
        _settings_users += 1
    try:
        yield
    finally:
        with _settings_lock:
            _settings_users -= 1
            if _settings_users == 0:
                for name, value in _saved.items():
                    setattr(hf_constants, name, value)
                _saved.clear()


class TotalBar:
    """One bar for the whole download on stderr, fed by the per-file bars."""

    def __init__(self, total: int, initial: int, enabled: bool, nfiles: int) -> None:
        self._bar: Any = None
        self._lock = threading.Lock()
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"total ({nfiles} files)",
                position=0,
                leave=True,
            )

    def update(self, n: float) -> None:
        if self._bar is not None and n:
            with self._lock:
                self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def file_bar_class(self) -> type | None:
        """A tqdm subclass for hf_hub_download (2.x) that also advances the total."""
        if self._bar is None:
            return None
        from huggingface_hub.utils import tqdm as hf_tqdm

        total = self

        class _FileBar(hf_tqdm):
            def update(self, n: float | None = 1) -> bool | None:
                total.update(n or 0)
                return super().update(n)

        return _FileBar
