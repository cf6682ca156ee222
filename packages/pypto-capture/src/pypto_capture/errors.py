"""Typed errors of pypto-capture.

Every error carries a one-line message that names the problem and the fix, so a CLI
can print ``str(err)`` as is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .explain import CaptureExplanation

__all__ = [
    "CacheApiNotSupportedError",
    "CacheDoesNotFitError",
    "CaptureFailedError",
    "CaptureUnsafeConfigError",
    "DeviceNotAvailableError",
    "InvalidDeviceSpecError",
    "PyptoCaptureError",
    "UnsupportedModelError",
]


class PyptoCaptureError(Exception):
    """Base of every error this package raises on purpose."""


class DeviceNotAvailableError(PyptoCaptureError):
    """The requested device (or any accelerator for ``"auto"`` with ``require``) is absent."""


class InvalidDeviceSpecError(DeviceNotAvailableError):
    """The device spec itself is malformed (``"gpu"``, ``"cuda:x"``), whatever the machine has.

    A subclass of :class:`DeviceNotAvailableError` so existing handlers still catch it,
    while a CLI can answer "bad usage" here and "environment missing" for an absent device.
    """


class CaptureFailedError(PyptoCaptureError):
    """Capturing (or compiling with fullgraph) a region failed.

    ``explanation`` says why in structured form; ``__cause__`` is the original error.
    ``cause_type`` / ``cause_message`` name the exception under every wrapper (dynamo's
    ``Unsupported`` around the model's ``KeyError: 'full_attention'``), so a caller can
    report the real error without walking the chain; None when it is unknown.
    """

    def __init__(self, message: str, explanation: CaptureExplanation, stage: str | None = None):
        super().__init__(message)
        self.explanation = explanation
        self.stage = stage
        self.cause_type: str | None = explanation.cause_type
        self.cause_message: str | None = explanation.cause_message


class UnsupportedModelError(PyptoCaptureError):
    """The model lacks something the capture path needs (e.g. a KV cache interface)."""


class CacheApiNotSupportedError(UnsupportedModelError, AttributeError):
    """The model calls a cache-layer method the capture-safe cache does not implement (a
    cache kind newer than this pypto-capture). An ``AttributeError`` too, so a model that
    only asks ``hasattr(layer, name)`` takes its other path as it would on any layer."""


class CaptureUnsafeConfigError(PyptoCaptureError):
    """The model's configuration is known to break capture (e.g. SDPA on an NPU)."""


class CacheDoesNotFitError(PyptoCaptureError):
    """The static cache asked for is larger than the device's free memory.

    Raised before anything is allocated: a static cache is one allocation per layer, and
    one past the machine's memory is an OOM kill with no message on a CPU.
    """
