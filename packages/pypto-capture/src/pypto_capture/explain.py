"""Turn a capture failure into a structured cause and fix.

Capture errors surface as opaque runtime codes (ACL ``107025``, CUDA ``900``) or as
long dynamo messages. The table below maps them to the usual cause in LLM decode
capture and the mitigation this package offers. Matching is by numeric code first (the
most specific signal), then by message pattern.

Before either, the underlying exception is dug out of the chain (dynamo wraps what the
traced code raised: ``Unsupported("Observed exception")`` around an ``ObservedKeyError``
whose debug context names the real ``KeyError('full_attention')``). When that is an
ordinary Python exception raised by the model's own code, the failure is ``model_error``,
not a graph break: calling it a host sync would send the reader hunting for an ``.item()``
that is not there. Every explanation carries the underlying exception's type and message
(``cause_type``, ``cause_message``) whatever its code.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ACL_RT_NAMES",
    "KNOWN_CAUSES",
    "CaptureExplanation",
    "exception_chain",
    "explain_capture_error",
    "traced_exception",
]


@dataclass(frozen=True)
class CaptureExplanation:
    """Why a capture failed and what to do. ``matched`` is False for unknown errors.

    ``cause_type`` / ``cause_message`` are the underlying exception's (``KeyError`` /
    ``'full_attention'``), dug out of dynamo's and this package's wrappers: what a reader
    greps the model's code for. None when only log text without it was given.
    """

    code: str | None
    name: str
    cause: str
    fix: str
    matched: bool
    message: str = ""
    cause_type: str | None = None
    cause_message: str | None = None

    @property
    def underlying(self) -> str | None:
        """``"KeyError: 'full_attention'"``, or None when the underlying error is unknown."""
        if not self.cause_type:
            return None
        return f"{self.cause_type}: {self.cause_message}" if self.cause_message else self.cause_type

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def __str__(self) -> str:
        head = f"[{self.code}] {self.name}" if self.code else self.name
        return f"{head}: {self.cause} -> fix: {self.fix}"


@dataclass(frozen=True)
class _Rule:
    code: str
    name: str
    cause: str
    fix: str
    patterns: tuple[str, ...] = ()


_BISECT = "run pypto_capture.bisect_capture(model) to find the first failing stage"
_MODEL_FIX = (
    "check the inputs the step hands the model (attention_mask mapping keys per layer type, "
    "the cache object, position ids, kwargs) against what its forward reads; run the same "
    f"call eagerly (backend='eager') to see the full traceback; {_BISECT}"
)
_EXACT_MOE = (
    "pypto_capture.apply_exact_moe(model): the router's top-k stays on the device, decode "
    "gathers the k selected experts (fixed shapes, no sort, no counts, no cumsum), outputs "
    "unchanged"
)

# The names of the Ascend runtime codes, exactly as CANN publishes them in
# include/external/acl/error_codes/rt_error_codes.h of the hicann/runtime repository
# (checked at commit d8beaaf0955bc307cdda0ae971275fb48f652a26; the same values are in
# the "aclError" return-code table of CANN's AscendCL API reference). A rule's ``name``
# is this published name and nothing else: what we have seen the code mean in LLM
# capture goes into its ``cause``. tests/test_explain.py pins every entry.
ACL_RT_NAMES: dict[str, str] = {
    "107024": "ACL_ERROR_RT_CAPTURE_DEPENDENCY",  # capture dependency failure
    "107025": "ACL_ERROR_RT_STREAM_UNJOINED",  # invalid capture model
    "107027": "ACL_ERROR_RT_STREAM_CAPTURED",  # stream is captured
    "107029": "ACL_ERROR_RT_STREAM_NOT_CAPTURED",  # stream is not in capture status
    "107030": "ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT",  # captured, not support current oper
    "107031": "ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT",  # implicit dependency on default stream
    "107038": "ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD",  # end and begin on different threads
    "507011": "ACL_ERROR_RT_MODEL_EXECUTE",  # model execute failed
    "507014": "ACL_ERROR_RT_AICORE_TIMEOUT",  # aicore timeout
    "507015": "ACL_ERROR_RT_AICORE_EXCEPTION",  # aicore exception
    "507903": "ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED",  # capture status is invalidated
}

KNOWN_CAUSES: tuple[_Rule, ...] = (
    # --- Ascend ACL runtime codes (names: ACL_RT_NAMES above) ------------------------
    _Rule(
        "107025",
        ACL_RT_NAMES["107025"],
        "a side stream forked during capture was not joined before capture end: the default SDPA "
        "fused NPU kernel runs on a side stream; host sync in mask or rotary preparation also does it",
        'load with attn_implementation="eager"; apply_capture_mitigations(model) for a prebuilt '
        "additive mask and precomputed cos/sin",
        ("stream_unjoined", "unjoined"),
    ),
    _Rule(
        "107027",
        ACL_RT_NAMES["107027"],
        "an op needing a copy/side stream or a host sync ran during capture: MoE routing's "
        "argsort(int64)/bincount on AICPU or a side stream, .item() in mask code, a "
        "sliding-window mask build, a qk-norm path",
        f"for MoE: {_EXACT_MOE}; otherwise {_BISECT}",
        ("stream_captured",),
    ),
    _Rule(
        "107030",
        ACL_RT_NAMES["107030"],
        "a host-to-device copy during capture (DynamicCache host bookkeeping, advancing the cache "
        "length from Python)",
        "use the capture-safe KV cache (pypto_capture.make_capture_safe_cache(model), class "
        "pypto_capture.CaptureSafeCache; pypto_capture.DecodeStepRunner decodes with it): fixed "
        "slots, index_copy_, a device-side position advanced in place between replays",
        ("capture_mode_not_support", "capture mode not support"),
    ),
    _Rule(
        "507015",
        ACL_RT_NAMES["507015"],
        "a kernel (e.g. a PyPTO grouped GEMM) was fed a growing or dynamic shape, e.g. per-expert "
        "token counts that change from step to step",
        "fix every shape before capture; bucket-pad the token count N to a few sizes; for MoE: "
        f"{_EXACT_MOE}",
        ("aicore_exception", "aicore exception"),
    ),
    _Rule(
        "507011",
        ACL_RT_NAMES["507011"],
        "the captured graph (a model to the runtime) failed when replayed; seen with MoE when "
        "expert routing tables (cumsum of per-expert counts) are rebuilt inside the captured region",
        f"keep MoE routing tables out of the captured region: {_EXACT_MOE}; otherwise {_BISECT}",
        ("model_execute", "model execute failed"),
    ),
    _Rule(
        "507014",
        ACL_RT_NAMES["507014"],
        "an AI Core kernel did not finish within the runtime's timeout: a kernel fed a shape or "
        "index it was not built for loops or stalls, or waits on work that never comes",
        "fix every shape and index before capture; run the step eagerly to find the kernel "
        f"(ASCEND_LAUNCH_BLOCKING=1); {_BISECT}",
        ("aicore_timeout", "aicore timeout"),
    ),
    _Rule(
        "107024",
        ACL_RT_NAMES["107024"],
        "captured work depends on work outside the capture (an event or stream dependency that "
        "crosses the capture boundary)",
        f"record/wait events only on the capture stream; warm up before capture; {_BISECT}",
        ("capture_dependency",),
    ),
    _Rule(
        "107029",
        ACL_RT_NAMES["107029"],
        "an operation expected a capturing stream but ran on one that is not being captured",
        "issue all captured work on the capture stream (one side stream entered for the whole region)",
        ("stream_not_captured",),
    ),
    _Rule(
        "107031",
        ACL_RT_NAMES["107031"],
        "work was issued on the implicit default stream while another stream was capturing",
        "never capture on the default stream; keep every op of the region on the side stream",
        ("capture_implicit",),
    ),
    _Rule(
        "107038",
        ACL_RT_NAMES["107038"],
        "capture was ended (or work issued) from a different thread than the one that began it",
        "begin and end capture on the same thread; avoid thread pools in the captured step",
        ("wrong_thread", "wrong thread"),
    ),
    _Rule(
        "507903",
        ACL_RT_NAMES["507903"],
        "the capture was invalidated by an earlier unsupported operation in the same region",
        f"look for the first error in the log (often 107027/107030); {_BISECT}",
        ("capture_invalidated",),
    ),
    # --- CUDA ---------------------------------------------------------------------
    _Rule(
        "900",
        "cudaErrorStreamCaptureUnsupported",
        "an operation not permitted while a stream is capturing ran in the region: a host sync "
        "(.item(), .cpu(), data-dependent Python if), pinned-memory allocation, or a side stream",
        "remove host syncs from the step (device-side position, prebuilt mask, no .item()); "
        f"apply_capture_mitigations(model); {_BISECT}",
        ("operation not permitted when stream is capturing", "streamcaptureunsupported"),
    ),
    _Rule(
        "901",
        "cudaErrorStreamCaptureInvalidated",
        "the capture was invalidated by an earlier unsupported operation (see the first error)",
        f"fix the first failing op (often a host sync); {_BISECT}",
        (
            "capture sequence has been invalidated",
            "streamcaptureinvalidated",
            "capture invalidated",
        ),
    ),
    # --- the model's own code ------------------------------------------------------
    # Matched structurally (see _underlying), never by message: no patterns.
    _Rule(
        "model_error",
        "the model's code raised an exception",
        "the model's own code raised an ordinary Python exception (KeyError, AttributeError, "
        "TypeError, ValueError, a failed assert, a torch op rejecting its inputs) while being "
        "traced or run: not a capture limitation; the same call fails eagerly",
        _MODEL_FIX,
    ),
    # --- torch.compile / dynamo / inductor ----------------------------------------
    _Rule(
        "graph_break",
        "host sync in the captured region (torch.compile graph break)",
        "a value was read back to the host inside the region (.item(), .tolist(), .cpu()) and "
        "used in Python, e.g. a data-dependent if: the graph cannot be one piece",
        "keep the value on the device (torch.where instead of if; a device-side position "
        "advanced in place; prebuilt masks via apply_capture_mitigations)",
        (
            ".item()",
            "tensor.item",
            ".tolist()",
            "could not guard on data-dependent expression",
            "data-dependent branching",
            "data dependent branching",
            "guardondatadependentsymnode",
        ),
    ),
    _Rule(
        "dynamic_shape",
        "data-dependent or dynamic shape",
        "an op whose output shape depends on data (nonzero, masked_select, unique, boolean "
        "indexing) or an input whose shape changes between calls",
        "keep shapes fixed: pad to a static size, replace data-dependent selects by masks; for "
        f"MoE: {_EXACT_MOE}",
        (
            "dynamic shape operator",
            "data-dependent output shape",
            "data dependent output shape",
            "dynamic shapes",
            "recompil",
        ),
    ),
    _Rule(
        "graph_break",
        "torch.compile graph break",
        "the region cannot be traced as one graph: a host sync (.item(), .tolist(), .cpu()), a "
        "data-dependent Python branch, print/logging, or an untraceable call",
        "move host work out of the step (device-side position, prebuilt mask, precomputed cos/sin "
        "via apply_capture_mitigations); the message names the op",
        (
            "graph break",
            "unsupported:",
            "generic_jump",
            "call_function",
            "torch._dynamo.exc",
        ),
    ),
    _Rule(
        "skipping_cudagraphs",
        "inductor skipped cudagraphs",
        "inductor ran the compiled graph without CUDA graphs (mutated inputs, CPU tensors, "
        "dynamic shapes or incompatible ops in the region)",
        "mark cache buffers static (torch._dynamo.mark_static_address), keep all inputs on the "
        "device with fixed shapes; the reason follows 'skipping cudagraphs due to'",
        ("skipping cudagraphs",),
    ),
    _Rule(
        "multinomial",
        "sampling inside the captured region",
        "torch.multinomial / random sampling syncs or changes shape in the region",
        "capture greedy argmax, or sample outside the graph with a pre-generated noise buffer",
        ("multinomial",),
    ),
)

# When the failing op is visibly MoE routing, the same code has a more specific cause.
_MOE_HINT = re.compile(
    r"(?<![a-z])(moe|experts?|argsort|bincount|histc|one_hot|grouped_?(?:mm|gemm|matmul)|"
    r"top_k_index|router)(?![a-z])",
    re.IGNORECASE,
)
_STATIC_PROXY = (
    "pypto_capture.apply_static_moe (fixed experts) captures too but is a throughput proxy "
    "only: its outputs differ by design"
)
_MOE_CAUSES: dict[str, tuple[str, str]] = {
    "107027": (
        "MoE routing ran an op that needs AICPU or a side stream inside the captured region: "
        "argsort(int64)/bincount of the routed expert ids (sort-based token dispatch)",
        f"{_EXACT_MOE}; {_STATIC_PROXY}",
    ),
    "507011": (
        "MoE routing tables (per-expert token counts and their cumsum) were rebuilt inside the "
        "captured region; the replay ran on tables frozen at capture time",
        f"no routing tables in the captured region: {_EXACT_MOE}; {_STATIC_PROXY}",
    ),
    "507015": (
        "a grouped-GEMM kernel was fed per-expert token counts that change between steps (a "
        "growing or data-dependent shape)",
        f"{_EXACT_MOE}; or bucket-pad the per-expert token counts to fixed sizes",
    ),
    "dynamic_shape": (
        "the experts loop selects each expert's tokens with nonzero/where (a data-dependent "
        "shape) and loops over the experts that were hit (a host read)",
        _EXACT_MOE,
    ),
    "graph_break": (
        "the experts loop reads routing results on the host (which experts were hit) to "
        "drive a Python loop",
        _EXACT_MOE,
    ),
}

_DATA_DEPENDENT_OP = re.compile(r"nonzero|one_hot|argsort|bincount", re.IGNORECASE)


def _moe_related(code: str, text: str) -> bool:
    """Whether the message shows MoE routing as the failing op.

    A runtime code with an MoE word anywhere (the op, the module, the stack) is taken as
    MoE; a dynamo break needs the data-dependent op itself next to MoE words, since any
    break in an MoE model's step has "experts" somewhere in its stack.
    """
    if not _MOE_HINT.search(text):
        return False
    return code.isdigit() or bool(_DATA_DEPENDENT_OP.search(text))


_CODE_RE = re.compile(r"(?<![\d.])(10\d{4}|50\d{4}|90[01])(?!\d|\.\d)")  # "107027." ends a sentence
_BY_CODE = {r.code: r for r in KNOWN_CAUSES if r.code.isdigit()}


def exception_chain(err: BaseException) -> list[BaseException]:
    """``err`` and what it was raised from (``__cause__``, else ``__context__``), outermost
    first, each once (a cycle ends the walk)."""
    out = [err]
    seen = {id(err)}
    cur: BaseException | None = err.__cause__ or err.__context__
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _message_of(err: BaseException | str) -> str:
    if isinstance(err, str):
        return err
    # chained causes carry the runtime code
    return "\n".join(f"{type(e).__module__}.{type(e).__name__}: {e}" for e in exception_chain(err))


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --- the underlying exception -----------------------------------------------------------

# Exceptions that, raised by the model's code when it runs eagerly, are its own bugs or a
# mismatch with its inputs. RuntimeError is left out: device runtimes and torch report
# capture failures with it. NotImplementedError too: the dispatcher raises it for an op a
# backend lacks.
_ORDINARY = (LookupError, AttributeError, TypeError, ValueError, AssertionError, NameError)
# dynamo's debug context of an "Observed exception": the traced code's exception, as repr.
_RAISED_RE = re.compile(r"raised exception ([A-Za-z_][\w.]*)\((.*)\)\s*$", re.MULTILINE)
_CONSTANT_RE = re.compile(r"^ConstantVariable\(\w+: (.*)\)$", re.DOTALL)
# Where a raise is not the model's: torch itself and the pypto tools driving the step.
_OWN_CODE = tuple(
    f"{os.sep}{pkg}{os.sep}" for pkg in ("torch", "pypto_capture", "pypto_bench", "pypto_tune")
)


@dataclass(frozen=True)
class _Underlying:
    type_name: str
    message: str
    model: bool  # an ordinary exception raised by the model's code (-> model_error)
    how: str = "traced"  # "traced" (dynamo), "op" (a torch op under fake tensors), "eager"
    where: str | None = None


def _args_message(type_name: str, args_repr: str) -> str:
    """``str(exc)`` from the repr of its arguments: ``'full_attention'`` for a KeyError
    (whose str is the key's repr), the text itself for the others."""
    try:
        args: tuple[Any, ...] = ast.literal_eval(f"({args_repr},)") if args_repr.strip() else ()
    except (ValueError, SyntaxError):
        return args_repr
    if len(args) == 1:
        return repr(args[0]) if type_name.endswith("KeyError") else str(args[0])
    return str(args) if args else ""


def _frame_where(frames: Any) -> str | None:
    """``modeling_x.py:123 in forward``: the innermost model frame (``modeling_*.py``) of a
    stack, else its innermost frame. dynamo's stack can stop at a ``finally`` that re-raised,
    so this is near the raise, not always at it."""
    frames = list(frames or [])
    if not frames:
        return None
    model = [f for f in frames if os.path.basename(str(f.filename)).startswith("modeling_")]
    f = (model or frames)[-1]
    return f"{os.path.basename(str(f.filename))}:{f.lineno} in {f.name}"


def _tb_frames(exc: BaseException) -> list[Any]:
    import traceback

    return list(traceback.extract_tb(exc.__traceback__)) if exc.__traceback__ else []


def _is_dynamo(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("torch._dynamo")


def _observed(chain: list[BaseException]) -> _Underlying | None:
    """What the traced code raised, when dynamo observed an exception it could not handle."""
    observed = [
        e
        for e in chain
        if _is_dynamo(e)
        and (
            getattr(e, "gb_type", None) == "Observed exception"
            or type(e).__name__.startswith("Observed")
        )
    ]
    if not observed:
        return None
    where = _frame_where(getattr(observed[0], "real_stack", None))
    for e in observed:  # the debug context names the real exception with its arguments
        m = _RAISED_RE.search(str(e))
        if m:
            name = m.group(1).rsplit(".", 1)[-1]
            message = _one_line(_args_message(name, m.group(2)))
            return _Underlying(name, message, True, "traced", where)
    for e in chain[chain.index(observed[-1]) + 1 :]:  # sometimes the real one is chained
        if not type(e).__module__.startswith("torch"):
            return _Underlying(type(e).__name__, _one_line(str(e)), True, "traced", where)
    last = observed[-1]
    name = type(last).__name__.removeprefix("Observed")
    name = name[: -len("Error")] if name.endswith("ErrorError") else name
    text = str(last.args[0]) if last.args else ""
    m2 = _CONSTANT_RE.match(text)
    message = _args_message(name, m2.group(1)) if m2 else text
    return _Underlying(name or "Exception", _one_line(message), True, "traced", where)


def traced_exception(err: BaseException) -> tuple[str, str] | None:
    """``(type name, message)`` of the exception that traced code raised, as dynamo's debug
    context names it, unclipped; None when dynamo observed none.

    dynamo does not keep the exception object of code it traced (it wraps an "Observed
    exception" around a repr of it), so a caller that must tell which exception it was (a
    refusal of this package's own, raised inside a compiled step) reads it from here.
    """
    for e in exception_chain(err):
        if _is_dynamo(e):
            m = _RAISED_RE.search(str(e))
            if m:
                name = m.group(1).rsplit(".", 1)[-1]
                return name, _args_message(name, m.group(2))
    return None


def _underlying(err: BaseException | str) -> _Underlying | None:
    """The exception under the wrappers, and whether the model's own code raised it."""
    if isinstance(err, str):  # recorded log text: only dynamo's debug context says it
        m = _RAISED_RE.search(err)
        if m and "observed exception" in err.lower():
            name = m.group(1).rsplit(".", 1)[-1]
            return _Underlying(name, _one_line(_args_message(name, m.group(2))), True)
        return None
    chain = exception_chain(err)
    found = _observed(chain)
    if found is not None:
        return found
    for e in chain:
        gb_type = str(getattr(e, "gb_type", "") or "") if _is_dynamo(e) else ""
        if gb_type.startswith("Data-dependent assertion failed") and (
            "ConstantVariable(bool: False)" in str(e)
        ):
            # ``assert`` on a Python value that is False while tracing: the model's own
            # check failed (a data-dependent assert would carry a symbolic value).
            summary = getattr(e, "innermost_user_frame_summary", None)
            line = (getattr(summary, "line", None) or "").strip() or "assert failed"
            where = _frame_where(getattr(e, "real_stack", None))
            return _Underlying("AssertionError", line, True, "traced", where)
        if gb_type == "RuntimeError when making fake tensor call":
            # A torch op rejected the shapes or dtypes the model's code gave it; the op's
            # own error is chained below (eager would raise it too).
            inner = next((x for x in chain if type(x) is RuntimeError), None)
            where = _frame_where(getattr(e, "real_stack", None))
            text = _one_line(str(inner)) if inner is not None else _one_line(str(e), 200)
            return _Underlying("RuntimeError", text, True, "op", where)
    deepest = chain[-1]
    if type(deepest).__name__ == "CaptureFailedError" and len(chain) == 1:
        return None  # nothing under it (a CaptureFailedError built by hand)
    frames = _tb_frames(deepest)
    model = (
        type(deepest).__module__ == "builtins"
        and isinstance(deepest, _ORDINARY)
        and bool(frames)
        and not any(part in str(frames[-1].filename) for part in _OWN_CODE)
    )
    message = str(deepest.args[0]) if _is_dynamo(deepest) and deepest.args else str(deepest)
    return _Underlying(
        type(deepest).__name__,
        _one_line(message.split("\n", 1)[0] if _is_dynamo(deepest) else message),
        model,
        "eager",
        _frame_where(frames) if model else None,
    )


def _model_error(under: _Underlying, text: str) -> CaptureExplanation:
    rule = next(r for r in KNOWN_CAUSES if r.code == "model_error")
    raised = f"{under.type_name}: {under.message}" if under.message else under.type_name
    if under.how == "op":
        cause = (
            f"a torch op in the model's own code rejected its inputs while being traced: {raised}"
        )
    elif under.how == "eager":
        cause = f"the model's own code raised {raised} when run eagerly"
    else:
        cause = f"the model's own code raised {raised} while being traced"
    if under.where:
        cause += f" (near {under.where})"
    fix = rule.fix
    if under.type_name == "KeyError":
        fix = (
            f"a mapping the model indexes lacks the key {under.message} (e.g. an attention_mask "
            f"dict without a layer type the model reads): {fix}"
        )
    return CaptureExplanation(
        code=rule.code,
        name=rule.name,
        cause=cause,
        fix=fix,
        matched=True,
        message=_one_line(text),
        cause_type=under.type_name,
        cause_message=under.message,
    )


def explain_capture_error(
    err: BaseException | str, *, context: str | None = None
) -> CaptureExplanation:
    """Structured cause and fix for a capture failure (exception or recorded log text).

    ``context="moe"`` says the failing region is an MoE block (bisect's MoE stage knows
    it even when the message does not name experts): codes with an MoE-specific cause
    get that cause and fix. An ordinary exception raised by the model's own code (dynamo
    observed it while tracing, or the step raised it eagerly) is ``model_error`` whatever
    else the message says: no runtime ran, so no runtime code or host sync is to blame.
    Unknown errors come back with ``matched=False`` and advice to bisect, never raise.
    """
    text = _message_of(err)
    under = _underlying(err)
    if under is not None and under.model:
        return _model_error(under, text)
    extra: dict[str, Any] = {}
    if under is not None:
        extra = {"cause_type": under.type_name, "cause_message": under.message}
    low = text.lower()
    rule: _Rule | None = None
    # 1. explicit runtime codes: the most specific signal. Prefer codes we know, in text order.
    for m in _CODE_RE.finditer(text):
        if m.group(1) in _BY_CODE:
            # "900"/"901" are short: require an error-ish context to avoid matching e.g.
            # sizes, unless the code is all that was given (`pypto-capture explain 900`, the
            # example its own help names).
            bare = text.strip() == m.group(1)
            if m.group(1) in ("900", "901") and not bare and not re.search(r"cuda|error|code", low):
                continue
            rule = _BY_CODE[m.group(1)]
            break
    # 2. message patterns, in table order (specific before generic).
    if rule is None:
        for r in KNOWN_CAUSES:
            if any(p in low for p in r.patterns):
                rule = r
                break
    if rule is None:
        return CaptureExplanation(
            code="unknown",
            name="unrecognised capture error",
            cause="this error is not in pypto-capture's table of known capture failures",
            fix=f"{_BISECT}; then report the message with the failing stage",
            matched=False,
            message=_one_line(text),
            **extra,
        )
    cause, fix = rule.cause, rule.fix
    if rule.code in _MOE_CAUSES and (context == "moe" or _moe_related(rule.code, text)):
        cause, fix = _MOE_CAUSES[rule.code]
    return CaptureExplanation(
        code=rule.code,
        name=rule.name,
        cause=cause,
        fix=fix,
        matched=True,
        message=_one_line(text),
        **extra,
    )
