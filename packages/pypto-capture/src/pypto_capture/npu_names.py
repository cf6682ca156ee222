"""Every torch_npu name the device layer uses, declared once and checked against the wheels.

No CI machine has an Ascend NPU, so these calls never run there. ``tools/npu_api_check.py``
(``nox -s npu_api``) reads :data:`NPU_API_TABLE` and checks each row statically against the
torch_npu wheel of every CANN matrix row; the device layer reaches torch.npu only through
:data:`NPU` (``torch.npu`` *is* ``torch_npu.npu`` once torch_npu is imported), so a name
that is not in the table cannot be called by accident.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
from typing import Any

__all__ = ["NPU", "NPU_API_TABLE", "NpuModule", "NpuNames"]

# kind path [keywords; "?" = optional] [@version bounds] | where it was checked.
# G: torch_npu/npu/graphs.py, S: streams.py, U: utils.py, M: memory.py, I: npu/__init__.py
# (all in the torch_npu wheels 2.5.1 .. 2.12.0; checked by nox -s npu_api).
NPU_API_TABLE = """
module   torch_npu                                      | torch_npu/__init__.py
module   torch_npu.npu                                  | I
function torch_npu.npu.is_available                     | I
function torch_npu.npu.is_initialized                   | I
function torch_npu.npu.device_count                     | I
function torch_npu.npu.current_device                   | U
function torch_npu.npu.synchronize                      | U
function torch_npu.npu.empty_cache                      | M
function torch_npu.npu.mem_get_info                     | M
function torch_npu.npu.reset_peak_memory_stats          | M
function torch_npu.npu.max_memory_allocated             | M
function torch_npu.npu.max_memory_reserved              | M
function torch_npu.npu.memory_reserved                  | M
function torch_npu.npu.memory_allocated                 | M
function torch_npu.npu.get_device_name                  | I (2.12) / U (2.5)
class    torch_npu.npu.Stream                           | S class Stream.__new__
kwarg    torch_npu.npu.Stream device                    | S Stream.__new__(device=None, priority=0)
method   torch_npu.npu.Stream.wait_stream               | S
function torch_npu.npu.stream                           | U
function torch_npu.npu.current_stream                   | U
class    torch_npu.npu.NPUGraph                         | G
method   torch_npu.npu.NPUGraph.replay                  | G
function torch_npu.npu.graph_pool_handle                | G
class    torch_npu.npu.graph                            | G (a context manager class)
kwarg    torch_npu.npu.graph pool stream                | G graph.__init__
kwarg    torch_npu.npu.graph auto_dispatch_capture @>=2.5.1.post1
                                                        | G graph.__init__; absent in 2.5.1
module   torchair                                       | torch_npu/dynamo/torchair (fused backend)
class    torchair.CompilerConfig                        | torchair/configs/compiler_config.py
member   torchair.CompilerConfig.mode                   | set in CompilerConfig.__init__
function torchair.get_npu_backend                       | torchair/npu_fx_compiler.py, re-exported
kwarg    torchair.get_npu_backend compiler_config       | get_npu_backend(*, compiler_config=None)
"""

_ROW = re.compile(r"^(module|class|function|method|member|kwarg)\s+(\S+)([^|@]*)")


class NpuNames:
    """The declared names, resolved lazily; pypto-capture depends on torch only, so this
    reads its own table (the version-bounded rows are for the checker: at run time
    :meth:`accepts` asks the installed callable's signature)."""

    def __init__(self, table: str) -> None:
        self.paths: set[str] = set()
        self.keywords: dict[str, set[str]] = {}
        for line in table.splitlines():
            m = _ROW.match(line)  # continuation lines start with blanks: no match
            if m is None:
                continue
            kind, path, words = m.group(1), m.group(2), m.group(3).split()
            if kind == "kwarg":
                self.keywords.setdefault(path, set()).update(words)
            else:
                self.paths.add(path)

    def declared(self, path: str) -> bool:
        return path in self.paths

    def resolve(self, path: str) -> Any:
        """The object at ``path`` (None when this torch_npu lacks it); ImportError without
        torch_npu. Undeclared paths raise KeyError."""
        if path not in self.paths:
            raise KeyError(f"{path} is not declared in pypto_capture.npu_names")
        parts = path.split(".")
        obj: Any = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj

    def kwargs(self, path: str, **given: Any) -> dict[str, Any]:
        """``given``, after checking every keyword is declared for ``path``."""
        unknown = set(given) - self.keywords.get(path, set())
        if unknown:
            raise TypeError(f"keywords {sorted(unknown)} of {path} are not declared")
        return given

    def accepts(self, path: str, keyword: str) -> bool:
        """Whether the installed callable at ``path`` takes ``keyword`` (declared ones only)."""
        if keyword not in self.keywords.get(path, set()):
            return False
        try:
            target = self.resolve(path)
        except ImportError:
            return False
        if target is None:
            return False
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            return False
        return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    @staticmethod
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None


#: The declared names of the device layer.
NPU = NpuNames(NPU_API_TABLE)

_PREFIX = "torch_npu.npu."


class NpuModule:
    """``torch.npu`` as the device layer sees it: only declared names resolve.

    ``hasattr`` and ``getattr(..., default)`` keep working (a missing or undeclared
    name is an AttributeError), so feature detection reads the same as for torch.cuda.
    """

    def __init__(self, api: NpuNames = NPU) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        path = _PREFIX + name
        if name.startswith("__") or not self._api.declared(path):
            raise AttributeError(f"{path} is not declared in pypto_capture.npu_names")
        try:
            obj = self._api.resolve(path)
        except ImportError as exc:  # torch_npu missing, or CANN libraries missing
            raise AttributeError(f"{path}: torch_npu is not importable ({exc})") from None
        if obj is None:
            raise AttributeError(f"this torch_npu has no {path}")
        return obj
