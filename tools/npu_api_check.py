"""Check every declared NPU name against the real torch_npu (and PyPTO) wheels, without an NPU.

Each package that touches the NPU declares the torch_npu / torch.npu / torchair / PyPTO
names it uses in a text table (pypto_common.npu_api). For every torch_npu version of the
CANN matrix this downloads the linux x86_64 cp311 wheel once (``pip download --no-deps``,
cached), reads its Python sources with ``zipfile`` + ``ast`` (importing needs CANN) and
checks that every row applying to that version resolves: modules exist, attributes are
defined or re-exported, methods and members are in the class, keywords are accepted by
the signature, env variables appear in the wheel. PyPTO rows are checked against the
pypto wheel the same way.

Exit status: 0 every row resolves; 1 a row does not (name, row, nearest existing name
printed) or a table is malformed, or --strict and a wheel is not on the index; 2 usage;
3 a download failed for another reason (network, pip). Human report on stderr; ``--json``
puts the machine-readable one on stdout.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages" / "pypto-common" / "src"))  # stdlib only

from pypto_common import known_secrets, redact  # noqa: E402
from pypto_common.npu_api import NpuName, parse_table, parse_version  # noqa: E402

#: Where each table lives: (module, attribute holding the text table). One line per table;
#: the module's source is read from packages/*/src (no import, so no torch needed).
TABLES: list[tuple[str, str]] = [
    ("pypto_tune.npu", "_TABLE"),
    ("pypto_capture.npu_names", "NPU_API_TABLE"),
    ("pypto_bench.environment", "NPU_API_TABLE"),
    ("pypto_kernels_common.npu", "NPU_API_TABLE"),  # PyPTO names, checked against pypto
    ("pypto_models_gutenocr.npu", "NPU_API_TABLE"),
]

CANN_MATRIX = ROOT / "packages" / "pypto-env" / "src" / "pypto_env" / "cann-matrix.toml"
# Outside the checkout, so fresh clones on one machine (CI) reuse the ~540 MB of wheels.
DEFAULT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pypto-npu-api-wheels"
)
PYPTO_VERSION = "0.2.0"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

#: Import names as the wheel stores them: torch.npu is torch_npu.npu at run time and
#: torchair ships inside the torch_npu wheel.
ALIASES = {"torch.npu": "torch_npu.npu", "torchair": "torch_npu.dynamo.torchair"}
WHEEL_OF_ROOT = {"torch_npu": "torch_npu", "torch": "torch_npu", "torchair": "torch_npu"}
WHEEL_OF_ROOT["pypto"] = "pypto"

OK, FAILED, USAGE, ENVIRONMENT = 0, 1, 2, 3


def _alias(module: str) -> str:
    for old, new in ALIASES.items():
        if module == old or module.startswith(old + "."):
            return new + module[len(old) :]
    return module


def wheel_of(path: str) -> str | None:
    """Which wheel checks ``path`` (None: a name of plain torch, not checked here)."""
    if path.startswith("torch.") and not _alias(path).startswith("torch_npu"):
        return None
    return WHEEL_OF_ROOT.get(path.split(".", 1)[0])


# ----------------------------------------------------------------------------- wheel model


@dataclass
class Found:
    """What a name resolved to: kind is module | class | function | value | compiled | external."""

    kind: str
    module: str
    node: Any = None
    note: str = ""


@dataclass
class Module:
    name: str
    is_package: bool
    tree: ast.Module | None
    bindings: dict[str, tuple[str, Any]] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)


class Wheel:
    """The Python side of one wheel (a .whl file or an unpacked folder), read statically."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self._sources: dict[str, tuple[str, bool]] = {}  # module -> (file, is_package)
        self.compiled: set[str] = set()
        self.binaries: list[str] = []
        self._zip = zipfile.ZipFile(location) if location.is_file() else None
        self._names_seen = set(self._names())
        for name in sorted(self._names_seen):
            if name.endswith((".py", ".pyi")):
                if name.endswith(".pyi") and name[:-1] in self._names_seen:
                    continue  # a stub only stands in for a compiled module
                parts = name.rsplit(".", 1)[0].split("/")
                pkg = parts[-1] == "__init__"
                mod = ".".join(parts[:-1] if pkg else parts)
                self._sources[mod] = (name, pkg)
            elif name.endswith((".so", ".pyd")) or ".so." in name:
                self.binaries.append(name)
                *dirs, filename = name.split("/")
                self.compiled.add(".".join([*dirs, filename.split(".", 1)[0]]))
        self._modules: dict[str, Module] = {}
        self._texts: dict[str, str] = {}
        self._blobs: dict[str, bytes] = {}

    def _names(self) -> Iterator[str]:
        if self._zip is not None:
            yield from self._zip.namelist()
            return
        for path in self.location.rglob("*"):
            if path.is_file():
                yield path.relative_to(self.location).as_posix()

    def read(self, name: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(name)
        return (self.location / name).read_bytes()

    def text(self, module: str) -> str:
        if module not in self._texts:
            self._texts[module] = self.read(self._sources[module][0]).decode("utf-8", "replace")
        return self._texts[module]

    def has_module(self, module: str) -> bool:
        module = _alias(module)
        return module in self._sources or module in self.compiled or self._namespace(module)

    def compiled_prefix(self, module: str) -> str | None:
        """The compiled module ``module`` is (or lives under), e.g. torch_npu._C."""
        parts = _alias(module).split(".")
        for cut in range(len(parts), 0, -1):
            if ".".join(parts[:cut]) in self.compiled:
                return ".".join(parts[:cut])
        return None

    def in_binaries(self, name: str) -> str | None:
        """The first compiled file whose strings hold the identifier ``name``.

        Bindings (pybind11) register every Python-visible name as a C string, so a name
        that no binary holds is not there; a name found is only known to exist somewhere.
        """
        word = re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9_])")
        for binary in self.binaries:
            if binary not in self._blobs:
                self._blobs[binary] = self.read(binary)
            if word.search(self._blobs[binary]):
                return binary
        return None

    def _namespace(self, module: str) -> bool:
        prefix = module + "."
        return any(m.startswith(prefix) for m in self._sources)

    def submodules(self, module: str) -> set[str]:
        prefix = _alias(module) + "."
        return {
            m[len(prefix) :].split(".")[0]
            for m in (*self._sources, *self.compiled)
            if m.startswith(prefix)
        }

    def module(self, name: str) -> Module | None:
        name = _alias(name)
        if name in self._modules:
            return self._modules[name]
        if name not in self._sources:
            mod = Module(name, self._namespace(name), None) if self._namespace(name) else None
        else:
            try:
                tree = ast.parse(self.text(name))
            except SyntaxError:
                tree = ast.Module(body=[], type_ignores=[])
            mod = Module(name, self._sources[name][1], tree)
            _bind(mod, tree.body)
        if mod is not None:
            self._modules[name] = mod
        return mod

    def py_texts(self) -> Iterator[tuple[str, str]]:
        for module, (name, _) in self._sources.items():
            yield name, self.text(module)


def _absolute(mod: Module, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([target] if target else [])])


def _bind(mod: Module, body: list[ast.stmt]) -> None:
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.bindings[stmt.name] = ("function", stmt)
        elif isinstance(stmt, ast.ClassDef):
            mod.bindings[stmt.name] = ("class", stmt)
        elif isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    mod.bindings[a.asname] = ("module", a.name)
                else:
                    root = a.name.split(".")[0]
                    mod.bindings.setdefault(root, ("module", root))
        elif isinstance(stmt, ast.ImportFrom):
            src = _absolute(mod, stmt.level, stmt.module)
            for a in stmt.names:
                if a.name == "*":
                    mod.stars.append(src)
                else:
                    mod.bindings[a.asname or a.name] = ("from", (src, a.name))
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        mod.bindings.setdefault(n.id, ("value", stmt))
                        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name):
                            mod.bindings[n.id] = ("alias", stmt.value.id)
        elif isinstance(stmt, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for part in ("body", "orelse", "finalbody"):
                _bind(mod, getattr(stmt, part, []))
            for handler in getattr(stmt, "handlers", []):
                _bind(mod, handler.body)


def _exports(wheel: Wheel, module: str) -> set[str] | None:
    mod = wheel.module(module)
    if mod is None or mod.tree is None:
        return None
    for stmt in mod.tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets
        ):
            try:
                return set(ast.literal_eval(stmt.value))
            except ValueError:
                break
    return {n for n in mod.bindings if not n.startswith("_")}


def lookup(wheel: Wheel, module: str, name: str, depth: int = 0) -> Found | None:
    """What ``module.name`` is in the wheel, following re-exports (None: not there)."""
    module = _alias(module)
    if depth > 30:
        return None
    opaque = wheel.compiled_prefix(module)
    if opaque is not None and module not in wheel._sources:
        return Found("compiled", opaque, note=f"defined in compiled {opaque}")
    if not wheel.has_module(module):
        return Found("external", module, note=f"{module} is outside the wheel")
    if module in wheel.compiled and module not in wheel._sources:
        return Found("compiled", module, note=f"defined in compiled {module}")
    mod = wheel.module(module)
    assert mod is not None
    bound = mod.bindings.get(name)
    if bound is not None:
        kind, what = bound
        if kind in ("function", "class"):
            return Found(kind, module, what)
        if kind == "module":
            return Found("module", _alias(what))
        if kind == "alias" and what != name:
            return lookup(wheel, module, what, depth + 1) or Found("value", module)
        if kind == "from":
            src, attr = what
            if wheel.has_module(f"{src}.{attr}") and _alias(f"{src}.{attr}") not in (
                wheel.compiled - set(wheel._sources)
            ):
                return Found("module", _alias(f"{src}.{attr}"))
            return lookup(wheel, src, attr, depth + 1)
        return Found("value", module, what)
    if wheel.has_module(f"{module}.{name}"):
        sub = _alias(f"{module}.{name}")
        return Found("compiled" if sub in wheel.compiled else "module", sub)
    for star in mod.stars:
        exports = _exports(wheel, star)
        if exports is None:
            if wheel.has_module(star):
                found = lookup(wheel, star, name, depth + 1)
                if found is not None:
                    return found
            continue
        if name in exports:
            return lookup(wheel, star, name, depth + 1)
    return None


def _scope_names(wheel: Wheel, module: str) -> set[str]:
    mod = wheel.module(module)
    names = set(mod.bindings) if mod else set()
    for star in mod.stars if mod else []:
        names |= _exports(wheel, star) or set()
    return names | wheel.submodules(module)


def _class_body(node: ast.ClassDef) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update({t.id: stmt for t in targets if isinstance(t, ast.Name)})
    init = names.get("__init__")
    if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # Instance attributes (``self.mode = ...`` in __init__) are members too: config
        # classes such as torchair's CompilerConfig define their options only there.
        for sub in ast.walk(init):
            if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                for t in targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        names.setdefault(t.attr, sub)
    return names


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return f"{head}.{expr.attr}" if head else None
    return None


def _resolve_expr(wheel: Wheel, module: str, dotted: str) -> Found | None:
    head, *rest = dotted.split(".")
    found = lookup(wheel, module, head)
    if found is None and wheel.has_module(head):
        found = Found("module", _alias(head))
    for part in rest:
        if found is None:
            return None
        found = attribute(wheel, found, part)
    return found


def class_member(wheel: Wheel, cls: Found, name: str, depth: int = 0) -> Found | None:
    """``name`` in the class body or a base class; compiled/external bases are opaque."""
    node = cls.node
    body = _class_body(node)
    if name in body:
        member = body[name]
        kind = (
            "function" if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) else "value"
        )
        return Found("class" if isinstance(member, ast.ClassDef) else kind, cls.module, member)
    for base in node.bases:
        dotted = _dotted(base)
        if dotted in (None, "object") or depth > 10:
            continue
        found = _resolve_expr(wheel, cls.module, dotted)
        if found is None:
            continue
        if found.kind == "class":
            inherited = class_member(wheel, found, name, depth + 1)
            if inherited is not None:
                return inherited
        elif found.kind in ("compiled", "external"):
            return Found("compiled", found.module, note=f"inherited from {dotted} ({found.note})")
    return None


def attribute(wheel: Wheel, found: Found, name: str) -> Found | None:
    if found.kind == "module":
        return lookup(wheel, found.module, name)
    if found.kind == "class":
        return class_member(wheel, found, name)
    if found.kind in ("compiled", "external"):
        return found  # opaque from here on
    return None


def _candidates(wheel: Wheel, found: Found | None) -> set[str]:
    if found is None:
        return set()
    if found.kind == "module":
        return _scope_names(wheel, found.module)
    if found.kind == "class":
        return set(_class_body(found.node))
    return set()


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], bool]:
    a = fn.args
    names = [p.arg for p in (*a.args, *a.kwonlyargs)]
    return names, a.kwarg is not None


# ----------------------------------------------------------------------------- checking


@dataclass
class Result:
    row: NpuName
    status: str  # ok | opaque | missing | optional-missing
    detail: str = ""
    nearest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row.label, "source": self.row.source, "status": self.status,
                "detail": self.detail, "nearest": self.nearest}  # fmt: skip


def _nearest(name: str, candidates: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.5)
    return close[0] if close else None


def resolve_path(wheel: Wheel, path: str) -> tuple[Found | None, str, Found | None]:
    """(what path is, the part that failed, the last thing that resolved)."""
    parts = _alias(path).split(".")
    for cut in range(len(parts), 0, -1):
        if wheel.has_module(".".join(parts[:cut])):
            mod = _alias(".".join(parts[:cut]))
            found: Found | None = Found(
                "compiled" if mod in wheel.compiled and mod not in wheel._sources else "module",
                mod,
                note=f"compiled {mod}" if mod in wheel.compiled else "",
            )
            break
    else:
        return None, parts[0], None
    for part in parts[cut:]:
        nxt = attribute(wheel, found, part) if found else None
        if nxt is None:
            return None, part, found
        found = nxt
    return found, "", None


def check_row(wheel: Wheel, row: NpuName) -> Result:
    if row.kind == "env":
        var = row.path.rsplit(".", 1)[1]
        for name, text in wheel.py_texts():
            if var in text:
                return Result(row, "ok", f"read in {name}")
        for name in wheel.binaries:
            if var.encode() in wheel.read(name):
                return Result(row, "ok", f"appears in compiled {name}")
        return Result(row, "optional-missing" if row.optional else "missing",
                      "the variable appears nowhere in the wheel")  # fmt: skip
    found, failed, last = resolve_path(wheel, row.path)
    if found is None:
        nearest = _nearest(failed, _candidates(wheel, last))
        where = f"{last.kind} {last.module}" if last else "the wheel"
        status = "optional-missing" if row.optional else "missing"
        return Result(row, status, f"no {failed!r} in {where}", nearest)
    if found.kind in ("compiled", "external"):
        return _check_compiled(wheel, row, found)
    if row.kind == "module" and found.kind != "module":
        return Result(row, "missing", f"{row.path} is a {found.kind}, not a module")
    if row.kind == "key":
        return _check_key(wheel, row)
    if row.kind != "kwarg":
        return Result(row, "ok", f"{found.kind} in {found.module}")
    return _check_kwarg(wheel, row, found)


def _check_compiled(wheel: Wheel, row: NpuName, found: Found) -> Result:
    """A name behind a compiled module: its identifier must be among the binaries' strings."""
    if found.kind == "external":
        return Result(row, "opaque", found.note)
    name = row.kwarg if row.kind == "kwarg" else row.path.rsplit(".", 1)[1]
    assert name is not None
    binary = wheel.in_binaries(name)
    if binary is not None:
        return Result(row, "opaque", f"{found.note}; {name!r} is in {binary}")
    status = "optional-missing" if row.optional else "missing"
    return Result(row, status, f"{found.note}, and no compiled file of the wheel holds {name!r}")


def _check_key(wheel: Wheel, row: NpuName) -> Result:
    """An options-dict key: the callable exists; the key must be a string literal the
    wheel's sources use (where the dict is read cannot be followed statically)."""
    assert row.kwarg is not None
    key = row.kwarg.rsplit(".", 1)[-1]
    literal = re.compile(r"""(['"])""" + re.escape(key) + r"\1")
    for name, text in wheel.py_texts():
        if literal.search(text):
            return Result(row, "ok", f"the key {key!r} is read in {name}")
    status = "optional-missing" if row.optional else "missing"
    return Result(row, status, f"no source of the wheel uses the key {key!r}")


def _check_kwarg(wheel: Wheel, row: NpuName, found: Found) -> Result:
    assert row.kwarg is not None
    fn = found.node
    where = found.module
    if found.kind == "class":
        init = class_member(wheel, found, "__new__") or class_member(wheel, found, "__init__")
        if init is None:
            return Result(row, "missing", f"{row.path} has no __init__; it takes no keywords")
        if init.kind == "compiled":
            return _check_compiled(wheel, row, init)
        fn, where = init.node, init.module
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Result(row, "opaque", f"{row.path} is a {found.kind}; signature not readable")
    names, var_kw = _params(fn)
    if row.kwarg in names:
        return Result(row, "ok", f"parameter of {fn.name} in {where}")
    if var_kw:
        return Result(row, "ok", f"via **kwargs of {fn.name} in {where}")
    status = "optional-missing" if row.optional else "missing"
    params = ", ".join(n for n in names if n not in ("self", "cls"))
    return Result(row, status, f"{fn.name}({params}) in {where} takes no {row.kwarg!r}",
                  _nearest(row.kwarg, names))  # fmt: skip


# ----------------------------------------------------------------------------- tables


def _module_file(module: str) -> Path | None:
    rel = Path(*module.split("."))
    for src in sorted((ROOT / "packages").glob("*/src")):
        for cand in (src / rel.with_suffix(".py"), src / rel / "__init__.py"):
            if cand.is_file():
                return cand
    return None


def load_table(module: str, attr: str) -> str | None:
    """The text table ``module.attr``, read from the repository's source (None: not there)."""
    path = _module_file(module)
    if path is None:
        return None
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
            value = getattr(stmt, "value", None)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    raise ValueError(f"{path}: no string constant {attr} (the table must be a literal)")


# ----------------------------------------------------------------------------- wheels


@dataclass
class Target:
    wheel: str  # torch_npu | pypto
    version: str
    label: str
    location: Path | None = None
    state: str = ""  # cached | downloaded | given | not-on-index | not-cached | failed
    error: str = ""


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return redact(lines[-1] if lines else "", known_secrets())[:300]


def fetch(target: Target, cache: Path, offline: bool) -> None:
    """Find the wheel in the cache or ``pip download`` it there; sets target.state."""
    folder = cache / f"{target.wheel}-{target.version}"
    found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if found:
        target.location, target.state = found[0], "cached"
        return
    if offline:
        target.state = "not-cached"
        return
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", "311", "--implementation", "cp", "--abi", "cp311", *platforms,
            "--disable-pip-version-check", "-q", "-d", str(folder),
            f"{target.wheel}=={target.version}"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if proc.returncode == 0 and found:
        target.location, target.state = found[0], "downloaded"
    elif re.search(r"no matching distribution|could not find a version", proc.stderr, re.I):
        target.state = "not-on-index"
    else:
        target.state, target.error = "failed", _one_line(proc.stderr or proc.stdout)


def matrix_targets(matrix: Path, recommended: bool) -> list[Target]:
    rows = tomllib.loads(matrix.read_text(encoding="utf-8")).get("row", [])
    by_version: dict[str, list[str]] = {}
    for r in rows:
        if recommended and not r.get("recommended"):
            continue
        by_version.setdefault(str(r["torch_npu"]), []).append(str(r["cann"]))
    return [Target("torch_npu", v, f"torch_npu {v} (CANN {', '.join(c)})")
            for v, c in by_version.items()]  # fmt: skip


# ----------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="npu_api_check.py",
        description="Check the declared NPU tables against the torch_npu wheels of the CANN matrix.",
    )
    p.add_argument("--cache-dir", type=Path,
                   default=Path(os.environ.get("PYPTO_NPU_API_CACHE") or DEFAULT_CACHE),
                   help="where wheels are kept between runs (default ~/.cache/pypto-npu-api-wheels)")  # fmt: skip
    p.add_argument("--matrix", type=Path, default=CANN_MATRIX, help="the CANN matrix TOML")
    p.add_argument("--torch-npu", action="append", default=[], metavar="VERSION",
                   help="check only these torch_npu versions (repeatable)")  # fmt: skip
    p.add_argument("--recommended", action="store_true",
                   help="only the recommended row of each CANN")  # fmt: skip
    p.add_argument("--wheel", action="append", default=[], metavar="VERSION=PATH",
                   help="use this .whl or unpacked folder for torch_npu VERSION")  # fmt: skip
    p.add_argument("--pypto-wheel", type=Path, help="use this pypto .whl or folder")
    p.add_argument("--no-pypto", action="store_true", help="skip the PyPTO wheel")
    p.add_argument("--table-file", action="append", default=[], type=Path,
                   help="check this text table instead of the registered ones (repeatable)")  # fmt: skip
    p.add_argument("--offline", action="store_true", help="never download; use the cache only")
    p.add_argument("--strict", action="store_true", help="fail when a wheel is not on the index")
    p.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    return p


def _tables(files: list[Path]) -> tuple[list[tuple[str, NpuName]], list[str]]:
    rows: list[tuple[str, NpuName]] = []
    notes: list[str] = []
    if files:
        for f in files:
            rows += [(str(f), r) for r in parse_table(f.read_text(encoding="utf-8"))]
        return rows, notes
    for module, attr in TABLES:
        text = load_table(module, attr)
        if text is None:
            notes.append(f"{module}.{attr}: module not in this checkout; not checked")
            continue
        rows += [(f"{module}.{attr}", r) for r in parse_table(text)]
    return rows, notes


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    given: dict[str, Path] = {}
    for item in args.wheel:
        version, eq, path = item.partition("=")
        if not eq or not Path(path).exists():
            say(
                f"npu_api_check: --wheel {item!r}: write VERSION=PATH to an existing .whl or folder"
            )
            return USAGE
        parse_version(version)
        given[version] = Path(path)
    try:
        rows, notes = _tables(args.table_file)
    except (OSError, ValueError) as exc:
        say(f"npu_api_check: bad table: {exc}")
        return FAILED
    if args.pypto_wheel is not None and not args.pypto_wheel.exists():
        say(f"npu_api_check: --pypto-wheel {args.pypto_wheel}: no such file or folder")
        return USAGE
    if given and not args.torch_npu:
        targets = [Target("torch_npu", v, f"torch_npu {v}") for v in given]
    else:
        try:
            targets = matrix_targets(args.matrix, args.recommended)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            say(f"npu_api_check: cannot read the CANN matrix {args.matrix}: {exc}")
            return USAGE
        if args.torch_npu:
            known = {t.version: t for t in targets}
            targets = [
                known.get(v) or Target("torch_npu", v, f"torch_npu {v}") for v in args.torch_npu
            ]
    if not args.no_pypto and any(wheel_of(r.path) == "pypto" for _, r in rows):
        targets.append(Target("pypto", PYPTO_VERSION, f"pypto {PYPTO_VERSION}"))
    report: dict[str, Any] = {"targets": [], "notes": notes, "unchecked": []}
    failed = env_failed = 0
    for table, row in rows:
        if wheel_of(row.path) is None:
            report["unchecked"].append(
                f"{table}: {row.label} (plain torch; not in a checked wheel)"
            )
    for target in targets:
        if target.wheel == "pypto" and args.pypto_wheel is not None:
            target.location, target.state = args.pypto_wheel, "given"
        elif target.version in given and target.wheel == "torch_npu":
            target.location, target.state = given[target.version], "given"
        else:
            fetch(target, args.cache_dir, args.offline)
        entry: dict[str, Any] = {"wheel": target.wheel, "version": target.version,
                                 "label": target.label, "state": target.state}  # fmt: skip
        report["targets"].append(entry)
        if target.location is None:
            why = {"not-on-index": "not on the package index", "not-cached": "not in the cache "
                   f"({args.cache_dir}); run without --offline",
                   "failed": f"download failed: {target.error}"}[target.state]  # fmt: skip
            say(f"{target.label}: {why}; NOT CHECKED")
            entry["error"] = why
            if target.state == "failed":
                env_failed += 1
            elif target.state == "not-on-index" and args.strict:
                failed += 1
            continue
        wheel = Wheel(target.location)
        results: list[Result] = []
        skipped = 0
        for table, row in rows:
            if wheel_of(row.path) != target.wheel:
                continue
            if not row.applies(target.version):
                skipped += 1
                continue
            res = check_row(wheel, row)
            results.append(res)
            if res.status == "missing":
                failed += 1
                hint = f"; nearest existing name: {res.nearest}" if res.nearest else ""
                say(f"MISMATCH {target.label}: {res.row.label} [{table}]: {res.detail}{hint}")
            elif res.status == "optional-missing":
                say(f"optional, absent {target.label}: {res.row.label}: {res.detail}")
        counts = {s: sum(r.status == s for r in results) for s in
                  ("ok", "opaque", "optional-missing", "missing")}  # fmt: skip
        say(f"{target.label}: {len(results)} names checked: {counts['ok']} ok, "
            f"{counts['opaque']} in compiled code (exists, not inspectable), "
            f"{counts['optional-missing']} optional absent, {counts['missing']} missing; "
            f"{skipped} rows for other versions")  # fmt: skip
        entry.update(checked=len(results), counts=counts, skipped_other_versions=skipped,
                     results=[r.to_dict() for r in results])  # fmt: skip
    for note in notes + report["unchecked"]:
        say(f"note: {note}")
    if args.json:
        print(json.dumps(report, indent=2))
    if failed:
        say(f"npu_api_check: {failed} mismatch(es); fix the table or the code (docs/npu-api.md)")
        return FAILED
    if env_failed:
        say("npu_api_check: a wheel could not be downloaded; check the network / index and rerun")
        return ENVIRONMENT
    return OK


if __name__ == "__main__":
    sys.exit(run())
