"""The ``hf-compile`` arm: the fast path a user would pick instead of this project.

transformers documents one recipe for fast decoding: a static KV cache and a
``torch.compile``'d forward, driven by ``generate`` (``cache_implementation="static"``
plus a ``CompileConfig``). Comparing the graph arm only with eager would hide whether
this project beats that recipe, so the arm runs it under the bench's own protocol:

* decode: one greedy ``generate`` per iteration, timed exactly as the eager arm (the
  first-logits stamp splits prefill from decode, same warmup/iters, same token count
  rule). transformers compiles only the decode forward (prefill runs uncompiled), so the
  compile happens in an untimed first call, recorded as ``compile_s``;
* prefill: the model's forward compiled the way ``generate`` compiles it
  (``get_compiled_call`` with the same ``CompileConfig``), timed like the eager forward.

Per device: CUDA/XPU use transformers' defaults (``mode="reduce-overhead"``, i.e. inductor
plus CUDA graphs). transformers only auto-compiles on those devices; elsewhere its
``CompileConfig`` has a flag (``_compile_all_devices``, what its own CPU tests set) that
this arm sets, with inductor's default mode on CPU (``reduce-overhead`` only adds CUDA
graphs, which do not exist there). On Ascend the backend is torchair's NPU backend in
``reduce-overhead`` mode (NPU graphs), the path torch_npu documents for
``torch.compile``; it is written here and untested (no NPU). ``--compile-mode``, when
given, applies to this arm as to the graph arm, so both are measured with one mode.

The arm uses the model's own MoE forward and no kernel plug-ins: it is the user's
alternative, not this project's.
"""

from __future__ import annotations

import logging
from typing import Any

from .config import PEER_ARM  # the arm's name in ``--arms`` and in reports

__all__ = [
    "PEER_ARM",
    "PEER_RECIPE",
    "PeerUnavailableError",
    "compile_config",
    "compiled_prefill",
    "forget_compiled_call",
    "generate_kwargs",
    "used_compiled_call",
]

log = logging.getLogger(__name__)


#: What the report says the arm is (one line, in the arm's details).
PEER_RECIPE = (
    "transformers' static cache + torch.compile'd forward through generate "
    "(cache_implementation='static', CompileConfig)"
)


class PeerUnavailableError(RuntimeError):
    """The installed transformers lacks the static-cache + compile recipe."""


def compile_config(device: Any, mode: str | None) -> tuple[Any, dict[str, Any]]:
    """transformers' ``CompileConfig`` for ``device`` and what it says, for the report."""
    try:
        from transformers import CompileConfig
    except ImportError as err:  # transformers < 4.48 had no CompileConfig
        raise PeerUnavailableError(
            "this transformers has no CompileConfig: the hf-compile arm needs transformers >= 5.8"
        ) from err

    kind = getattr(device, "type", str(device))
    described: dict[str, Any] = {"recipe": PEER_RECIPE}
    if kind == "npu":
        backend, npu_mode = _torchair_backend(mode or "reduce-overhead")
        config = CompileConfig(backend=backend)
        described.update(backend="torchair", mode=npu_mode)
    elif kind in ("cuda", "xpu"):
        config = CompileConfig(mode=mode) if mode else CompileConfig()
        described.update(backend=config.backend, mode=config.mode)
    else:
        # CPU: no CUDA graphs, so inductor's default mode unless one was asked for.
        config = CompileConfig(mode=mode or "default")
        described.update(backend=config.backend, mode=config.mode)
    if kind not in ("cuda", "xpu"):
        # generate compiles only on CUDA/XPU-like devices unless this flag is set.
        if not hasattr(config, "_compile_all_devices"):
            raise PeerUnavailableError(
                f"this transformers compiles generate's forward only on CUDA/XPU, not on "
                f"{kind}: run the hf-compile arm on CUDA or upgrade transformers"
            )
        config._compile_all_devices = True  # type: ignore[assignment]  # typed None upstream
    return config, described


def _torchair_backend(mode: str) -> tuple[Any, str]:
    """torchair's NPU backend (names declared in pypto_bench.environment's NPU table)."""
    from .environment import NPU

    compiler_config_cls = NPU.resolve("torchair.CompilerConfig")
    get_backend = NPU.resolve("torchair.get_npu_backend")
    cfg = compiler_config_cls()
    cfg.mode = mode  # an instance attribute set in CompilerConfig.__init__ (checked)
    return get_backend(**NPU.kwargs("torchair.get_npu_backend", compiler_config=cfg)), mode


def generate_kwargs(config: Any) -> dict[str, Any]:
    """The extra ``generate`` keywords that turn the eager call into the peer recipe."""
    return {"cache_implementation": "static", "compile_config": config}


def used_compiled_call(model: Any) -> bool:
    """Whether ``generate`` took its compiled path (it keeps the compiled call on the model)."""
    return getattr(model, "_compiled_call", None) is not None


def forget_compiled_call(model: Any) -> None:
    """Drop what the recipe left on the model so later arms see the model as loaded.

    ``generate`` keeps its compiled call (and, by version, its static cache or the cache
    length it last used) on the model between calls; a later arm would not use them, but
    the compiled graphs' memory would stay held.
    """
    for name in ("_compiled_call", "_last_compile_config", "_previous_max_cache_length", "_cache"):
        if name in vars(model):
            delattr(model, name)


def compiled_prefill(model: Any, config: Any) -> Any:
    """The model's call compiled as ``generate`` compiles it (one forward per call)."""
    get = getattr(model, "get_compiled_call", None)
    if get is None:
        raise PeerUnavailableError(
            "this transformers has no get_compiled_call: the hf-compile arm needs transformers >= 5.8"
        )
    return get(config)
