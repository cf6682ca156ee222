"""Every ``pypto_capture.X`` an explanation tells the reader to use exists (issue 27,
item 16: the 107030 fix named ``pypto_capture.CaptureSafeCache``, which was not exported).

The texts are every explanation the table can give: each rule's own cause and fix, each
code again with MoE context (MoE-specific causes), the model-error fix, and the
unrecognised-error advice.
"""

from __future__ import annotations

import importlib
import re

import pytest

import pypto_capture
from pypto_capture import KNOWN_CAUSES, explain_capture_error

NAME = re.compile(r"\bpypto_capture((?:\.[A-Za-z_]\w*)+)")


def _texts() -> list[str]:
    texts = []
    for rule in KNOWN_CAUSES:
        texts += [rule.cause, rule.fix]
        for context in (None, "moe"):
            ex = explain_capture_error(f"error code {rule.code}: {rule.code}", context=context)
            texts += [ex.cause, ex.fix]
    unknown = explain_capture_error("something no table knows about")
    texts += [unknown.cause, unknown.fix]
    return texts


def _resolve(dotted: str) -> object:
    """``pypto_capture.a.b``: an attribute chain from the package, importing submodules."""
    obj: object = pypto_capture
    path = "pypto_capture"
    for part in dotted.strip(".").split("."):
        path += f".{part}"
        obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(path)
    return obj


MENTIONED = sorted({m.group(1) for text in _texts() for m in NAME.finditer(text)})


def test_explanations_name_pypto_capture_objects():
    # The 107030 fix and the MoE fixes name several; an empty list would test nothing.
    assert {".CaptureSafeCache", ".apply_exact_moe", ".bisect_capture"} <= set(MENTIONED)


@pytest.mark.parametrize("dotted", MENTIONED)
def test_every_name_an_explanation_mentions_is_importable(dotted):
    pytest.importorskip("transformers")  # CaptureSafeCache subclasses transformers' Cache
    obj = _resolve(dotted)
    assert obj is not None
    top = dotted.strip(".").split(".")[0]
    namespace: dict[str, object] = {}
    exec(f"from pypto_capture import {top}", namespace)  # the form a reader types
    assert namespace[top] is getattr(pypto_capture, top)


def test_the_107030_fix_names_the_public_cache_api():
    pytest.importorskip("transformers")
    fix = explain_capture_error("error code is 107030").fix
    assert "pypto_capture.make_capture_safe_cache" in fix
    assert pypto_capture.CaptureSafeCache is pypto_capture.capture_safe_cache_class()
    assert (
        "CaptureSafeCache" not in pypto_capture.__all__
    )  # would make `import *` need transformers
