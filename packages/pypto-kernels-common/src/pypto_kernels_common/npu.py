"""The PyPTO / torch_npu names the NPU path uses, declared once and reached through one resolver.

No machine here has an Ascend NPU, so the NPU path is never executed in CI. Declaring
every name it touches in :data:`NPU_API_TABLE` (pypto-common's table format, as
``pypto_tune.npu`` does) lets ``tools/npu_api_check.py`` verify them statically against
each released wheel, instead of grepping call sites; the code reaches them only through
:func:`api`, :func:`kwargs` and :func:`options`, which refuse undeclared names.

Row format: ``kind path [words] | where it was checked`` (see ``pypto_common.npu_api``):
``kwarg`` words are keyword arguments of the callable ``path``; ``key`` words
``kwarg.key`` are keys of the dict passed as that keyword argument.
"""

from __future__ import annotations

from typing import Any

from pypto_common.npu_api import NpuApi, NpuName, parse_table

__all__ = ["NPU_API", "NPU_API_TABLE", "api", "kwargs", "options"]

# E: pypto 0.2.0 pypto/frontend/parser/entry.py; I: pypto 0.2.0 pypto/__init__.py;
# T: Ascend/pytorch torch_npu/__init__.py and torch_npu/npu/__init__.py.
NPU_API_TABLE = """
module   pypto                                           | I
member   pypto.RunMode.NPU                               | E RunMode (re-exported by I)
function pypto.frontend.jit                              | E jit
kwarg    pypto.frontend.jit runtime_options              | E jit
key      pypto.frontend.jit runtime_options.run_mode     | E JitCallableWrapper._set_run_mode
member   pypto.DT_BF16                                   | I (pypto_impl.DataType)
member   pypto.DT_FP16                                   | I (pypto_impl.DataType)
member   pypto.DT_FP32                                   | I (pypto_impl.DataType)
module   torch_npu                                       | T torch_npu/__init__.py
function torch_npu.npu.is_available                      | T npu/__init__.py (also torch.npu)
"""

_PREFIX = {
    "E": "pypto 0.2.0 pypto/frontend/parser/entry.py ",
    "I": "pypto 0.2.0 pypto/__init__.py ",
    "T": "Ascend/pytorch ",
}


NPU_API: tuple[NpuName, ...] = parse_table(NPU_API_TABLE, _PREFIX)
_NPU = NpuApi(NPU_API, owner="pypto_kernels_common.npu")


def api(path: str) -> Any:
    """The object at dotted ``path``; only names declared in :data:`NPU_API` resolve.

    KeyError for an undeclared name (a bug in the caller); AttributeError or
    ImportError when this install lacks a required one.
    """
    return _NPU.resolve(path)


def kwargs(path: str, **given: Any) -> dict[str, Any]:
    """``given`` after checking each keyword is a declared ``kwarg`` row of ``path``."""
    return _NPU.kwargs(path, **given)


def options(path: str, kwarg: str, **given: Any) -> dict[str, Any]:
    """``given`` (the dict passed as ``path(kwarg=...)``) after checking its declared keys."""
    declared = {r.kwarg for r in NPU_API if r.kind == "key" and r.path == path}
    unknown = sorted(f"{kwarg}.{k}" for k in given if f"{kwarg}.{k}" not in declared)
    if unknown:
        raise KeyError(f"keys {unknown} of {path} are not declared in NPU_API_TABLE")
    return given
