"""The three on/off switches, their context manager and their environment variable.

The switch values live in :data:`.package.PACKAGE` (a pypto-kernels-common
``SwitchRegistry``); ``pypto_kernels_gutenocr.USE_PTO_*`` are properties that read and
write them, so the seed's ``module.USE_PTO_RMS_NORM = True`` keeps working while the
model hooks read one source of truth.

Environment: ``PYPTO_GUTENOCR_SWITCHES`` is a comma list of op names
(``rms_norm``, ``mrope``, ``swiglu_mlp``), or ``all`` / ``none``; read at import
and by :func:`load_from_env`. One variable (not three) so a bench arm can be
described by a single string.
"""

from __future__ import annotations

from pypto_kernels_common import SwitchError

from .package import ENV_VAR, FLAG_NAMES, OPS, PACKAGE

REGISTRY = PACKAGE.switches

is_on = REGISTRY.is_on
set_switch = REGISTRY.set_switch
snapshot = REGISTRY.snapshot
parse = REGISTRY.parse
load_from_env = REGISTRY.load_from_env
pto_switches = REGISTRY.pto_switches
_check = REGISTRY.check

__all__ = [
    "ENV_VAR",
    "FLAG_NAMES",
    "OPS",
    "REGISTRY",
    "SwitchError",
    "is_on",
    "load_from_env",
    "parse",
    "pto_switches",
    "set_switch",
    "snapshot",
]
