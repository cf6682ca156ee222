"""explain_capture_error on recorded NPU/CUDA/inductor messages and on real exceptions."""

from __future__ import annotations

import json

import pytest

from pypto_capture import KNOWN_CAUSES, CaptureExplanation, explain_capture_error
from pypto_capture.explain import ACL_RT_NAMES

# Every Ascend runtime code the table knows, with its name as CANN publishes it in
# include/external/acl/error_codes/rt_error_codes.h (hicann/runtime, commit
# d8beaaf0955bc307cdda0ae971275fb48f652a26). Copied here by hand, not imported, so a
# wrong name in explain.py cannot agree with itself.
PUBLISHED_ACL_RT_NAMES = {
    "107024": "ACL_ERROR_RT_CAPTURE_DEPENDENCY",
    "107025": "ACL_ERROR_RT_STREAM_UNJOINED",
    "107026": "ACL_ERROR_RT_MODEL_CAPTURED",
    "107027": "ACL_ERROR_RT_STREAM_CAPTURED",
    "107028": "ACL_ERROR_RT_EVENT_CAPTURED",
    "107029": "ACL_ERROR_RT_STREAM_NOT_CAPTURED",
    "107030": "ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT",
    "107031": "ACL_ERROR_RT_STREAM_CAPTURE_IMPLICIT",
    "107036": "ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED",
    "107038": "ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD",
    "507011": "ACL_ERROR_RT_MODEL_EXECUTE",
    "507014": "ACL_ERROR_RT_AICORE_TIMEOUT",
    "507015": "ACL_ERROR_RT_AICORE_EXCEPTION",
    "507903": "ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED",
}

# Messages as torch_npu / CUDA / inductor print them (shapes of real logs, trimmed).
RECORDED = [
    (
        "RuntimeError: rtStreamEndCapture execute failed, reason=[stream is unjoined]. "
        "ERROR CODE: 107025. [ERROR] RUNTIME(1234,python):2026-10-01 ... EE9999: Inner Error!",
        "107025",
    ),
    ("RuntimeError: NPU function error: aclmdlRICaptureEnd, error code is 107027", "107027"),
    (
        "EL0004: aclrtMemcpy failed during capture, error code is 107030 (capture mode not support)",
        "107030",
    ),
    ("The aicore execution is abnormal. error code is 507015 [ERROR] AICORE_EXCEPTION", "507015"),
    ("rtStreamSynchronize failed, error code is 507011", "507011"),
    ("aclmdlRIExecuteAsync failed: model execute failed", "507011"),
    ("EZ9999: The aicore execution timed out. error code is 507014", "507014"),
    ("[ERROR] RUNTIME: aicore timeout on stream 3", "507014"),
    ("[ERROR] RUNTIME: capture dependency error code 107024", "107024"),
    ("error code is 107029", "107029"),
    ("error code is 107031", "107031"),
    ("error code is 107038", "107038"),
    ("error code is 507903", "507903"),
    (
        "RuntimeError: CUDA error: operation not permitted when stream is capturing\n"
        "CUDA kernel errors might be asynchronously reported at some other API call",
        "900",
    ),
    (
        "CUDA error: operation failed due to a previous error during capture (cudaErrorStreamCaptureInvalidated)",
        "901",
    ),
    ("RuntimeError: CUDA error 900 at graph capture", "900"),
    ("skipping cudagraphs due to mutated inputs (2 instances)", "skipping_cudagraphs"),
    ("torch._dynamo.exc.Unsupported: Graph break due to unsupported builtin print", "graph_break"),
    ("Unsupported: Tensor.item() with capture_scalar_outputs=False", "graph_break"),
    (
        "torch._dynamo.exc.Unsupported: dynamic shape operator: aten.nonzero.default",
        "dynamic_shape",
    ),
    ("RuntimeError: torch.multinomial inside cuda graph capture", "multinomial"),
]


@pytest.mark.parametrize(("text", "code"), RECORDED)
def test_recorded_messages_map_to_codes(text, code):
    expl = explain_capture_error(text)
    assert expl.matched, expl
    assert expl.code == code, expl
    assert expl.cause
    assert expl.fix
    assert "\n" not in str(expl)
    assert code in str(expl)


def test_code_in_chained_exception_is_found():
    try:
        try:
            raise RuntimeError("NPU error, error code is 107030")
        except RuntimeError as inner:
            raise ValueError("model forward failed") from inner
    except ValueError as err:
        expl = explain_capture_error(err)
    assert expl.code == "107030"
    assert "index_copy_" in expl.fix


def test_numbers_that_are_not_codes_do_not_match():
    expl = explain_capture_error("tensor of shape [1, 900, 107025.5] is fine")
    assert not expl.matched or expl.code not in ("900", "107025")


def test_unknown_error_says_so_and_suggests_bisect():
    expl = explain_capture_error(KeyError("no such weight"))
    assert isinstance(expl, CaptureExplanation)
    assert expl.matched is False
    assert expl.code == "unknown"
    assert "bisect" in expl.fix
    json.dumps(expl.to_dict())


def test_every_rule_has_cause_and_fix():
    codes = {r.code for r in KNOWN_CAUSES}
    for needed in ("107025", "107027", "107030", "507015", "507011", "900", "901", "graph_break"):
        assert needed in codes
    assert all(r.cause and r.fix for r in KNOWN_CAUSES)


ACL_RULES = [r for r in KNOWN_CAUSES if r.code.isdigit() and len(r.code) == 6]


@pytest.mark.parametrize("rule", ACL_RULES, ids=[r.code for r in ACL_RULES])
def test_every_acl_code_carries_its_published_name(rule):
    """507011 was once called AICORE_TIMEOUT (that is 507014): names come from CANN's header."""
    assert rule.code in PUBLISHED_ACL_RT_NAMES, f"{rule.code}: check it against rt_error_codes.h"
    assert rule.name == PUBLISHED_ACL_RT_NAMES[rule.code]
    assert explain_capture_error(f"error code is {rule.code}").name == rule.name


def test_name_table_matches_the_header():
    for code, name in ACL_RT_NAMES.items():
        assert PUBLISHED_ACL_RT_NAMES[code] == name, code


def test_507011_and_507014_are_told_apart():
    execute = explain_capture_error("aclmdlRIExecute failed, error code is 507011")
    timeout = explain_capture_error("error code is 507014")
    assert (execute.code, execute.name) == ("507011", "ACL_ERROR_RT_MODEL_EXECUTE")
    assert (timeout.code, timeout.name) == ("507014", "ACL_ERROR_RT_AICORE_TIMEOUT")
    assert "routing tables" in execute.fix


# --- MoE: the same runtime codes, with the failing op named -----------------------------

MOE_RECORDED = [
    # The seed's sort-based dispatch on an Ascend NPU (argsort(int64) runs on AICPU).
    (
        "RuntimeError: aclmdlRICaptureEnd failed, error code is 107027. [ERROR] op "
        "ArgSort(int64) of block_sparse_moe.experts launched on AICPU during capture",
        "107027",
        "argsort",
    ),
    ("bincount on the expert ids: error code is 107027", "107027", "bincount"),
    (
        "aclmdlRIExecuteAsync failed, error code is 507011 (moe routing cumsum in graph)",
        "507011",
        "cumsum",
    ),
    (
        "The aicore execution is abnormal. error code is 507015: grouped_matmul of the MoE "
        "experts got group_list [3, 0, 5]",
        "507015",
        "per-expert token counts",
    ),
]


@pytest.mark.parametrize(("text", "code", "words"), MOE_RECORDED)
def test_moe_failures_get_the_moe_cause_and_the_exact_fix(text, code, words):
    expl = explain_capture_error(text)
    assert expl.code == code
    assert expl.name == PUBLISHED_ACL_RT_NAMES[code]  # the published name stays
    assert words in expl.cause
    assert "apply_exact_moe" in expl.fix
    assert "\n" not in str(expl)


def test_the_same_codes_without_moe_keep_their_general_cause():
    expl = explain_capture_error("RuntimeError: error code is 107027 (.item() in mask code)")
    assert "MoE routing ran" not in expl.cause
    assert ".item()" in expl.cause


def test_bisect_context_marks_a_failure_as_moe():
    """bisect's MoE stage knows the region is an MoE block even when dynamo's message
    only names the op."""
    text = "torch._dynamo.exc.Unsupported: dynamic shape operator: aten.nonzero.default"
    assert "experts" not in explain_capture_error(text).cause
    moe = explain_capture_error(text, context="moe")
    assert moe.code == "dynamic_shape"
    assert "experts loop" in moe.cause
    assert "apply_exact_moe" in moe.fix


def test_a_graph_break_merely_inside_an_moe_model_is_not_blamed_on_routing():
    text = (
        "torch._dynamo.exc.Unsupported: Graph break due to unsupported builtin print\n"
        '  File "modeling_minimax_m2.py", line 120, in forward\n    self.experts(hidden)'
    )
    expl = explain_capture_error(text)
    assert expl.code == "graph_break"
    assert "experts loop" not in expl.cause


# --- the underlying exception: model errors are not graph breaks -----------------------

# dynamo's text for a KeyError raised by the traced code (torch 2.13, trimmed): its
# "graph break" wording is dynamo's, the cause is the model's own KeyError.
OBSERVED_KEYERROR = """torch._dynamo.exc.Unsupported: Observed exception
  Explanation: Dynamo found no exception handler at the top-level compiled function when encountering an exception. Exception will propagate outside the compiled region.
  Hint: Your code may result in an error when running in eager.
  Hint: Please report an issue to PyTorch if you encounter this graph break often.

  Developer debug context: raised exception KeyError('full_attention')

from user code:
   File "modeling_falcon_h1.py", line 1094, in forward
"""


def test_recorded_observed_exception_is_a_model_error():
    expl = explain_capture_error(OBSERVED_KEYERROR)
    assert expl.code == "model_error", expl
    assert expl.matched
    assert (expl.cause_type, expl.cause_message) == ("KeyError", "'full_attention'")
    assert expl.cause.startswith(
        "the model's own code raised KeyError: 'full_attention' while being traced"
    )
    assert "host sync" not in str(expl)
    assert "inputs the step hands the model" in expl.fix
    assert "bisect" in expl.fix
    assert expl.to_dict()["cause_type"] == "KeyError"
    json.dumps(expl.to_dict())


def _compile_error(fn):
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    with pytest.raises(Exception) as exc:
        torch.compile(fn, fullgraph=True)()
    return exc.value


def test_exceptions_the_traced_code_raises_keep_their_type_and_message():
    import torch

    x = torch.ones(2)

    class Config:
        pass

    def missing_attribute():
        return x * Config().sliding_window

    def bad_value():
        raise ValueError("cache of 3 layers, model has 4")

    def failed_assert():
        assert x.shape[0] == 3, "need three"
        return x

    def bad_shapes():
        return x @ torch.ones(3, 3)

    cases = [
        (missing_attribute, "AttributeError", "has no attribute 'sliding_window'"),
        (bad_value, "ValueError", "cache of 3 layers, model has 4"),
        (failed_assert, "AssertionError", "need three"),  # the source line or the message
        (bad_shapes, "RuntimeError", "a and b must have same reduction dim"),
    ]
    for fn, kind, words in cases:
        expl = explain_capture_error(_compile_error(fn))
        assert expl.code == "model_error", (fn.__name__, expl)
        assert expl.cause_type == kind, (fn.__name__, expl)
        assert words in expl.cause_message, (fn.__name__, expl)
        assert words in expl.cause
        assert "host sync" not in expl.cause
        assert "test_explain.py" in expl.cause  # where dynamo saw it raised


def test_a_real_graph_break_stays_one_and_names_what_is_under_it():
    import torch

    x = torch.ones(2)

    def host_sync():
        return x * 2 if x.sum().item() > 0 else x

    expl = explain_capture_error(_compile_error(host_sync))
    assert expl.code == "graph_break"
    assert expl.cause_type == "GuardOnDataDependentSymNode"
    assert "data-dependent" in expl.cause_message


def test_an_eagerly_raised_model_exception_is_a_model_error():
    masks = {"hybrid": 0}
    try:
        masks["full_attention"]  # what a warmup step of a device-graph capture runs into
    except KeyError as err:
        expl = explain_capture_error(err)
    assert expl.code == "model_error"
    assert expl.cause.startswith("the model's own code raised KeyError: 'full_attention' when")
    # A runtime error is still the runtime's: its code wins.
    expl = explain_capture_error(
        RuntimeError("CUDA error: operation not permitted when stream is capturing")
    )
    assert expl.code == "900"
    assert expl.cause_type == "RuntimeError"
