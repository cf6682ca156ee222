"""Fail on a private name taken from another module: ``from .x import _y``.

A name starting with one underscore is private to the module that defines it. A module
that needs another's private name reaches into its internals, so the two can no longer
change independently (issue 28: ``distributed.py`` took 7 private names from ``bench.py``).
The fix is one of: make the name public (drop the underscore, add it to ``__all__``), or
move it into a module marked internal (its name, or a package above it, starts with an
underscore, e.g. ``pypto_bench/_shared.py``), from which any module may import ``_names``.

Checked, in first-party code only (the modules found under the given paths):

- ``from M import _y`` / ``from .M import _y`` where ``M`` is another module and ``_y`` is not a
  submodule of ``M`` (importing a private *module* is import-linter's ``private_modules``
  contract, not this check);
- ``m._y`` where ``m`` is a name bound by ``import M`` / ``import M as m`` / ``from P import m``
  to another first-party module.

Dunder names (``__version__``) are public. Third-party modules (``torch._dynamo``) are not
checked: that is their layering, not ours.

    python tools/check_private_imports.py                 # every packages/*/src
    python tools/check_private_imports.py PATH [PATH...]  # files or folders
    python tools/check_private_imports.py --json

Exit 0: none found; 1: violations (each printed as ``file:line: ...``); 2: bad usage (a
path that does not exist, a file that does not parse).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "EXIT",
    "Module",
    "Violation",
    "default_paths",
    "discover",
    "find_violations",
    "is_internal",
    "is_private_name",
    "main",
]

ROOT = Path(__file__).resolve().parent.parent

EXIT = {
    0: "no private name is imported across modules",
    1: "at least one private cross-module import (each listed as file:line)",
    2: "bad usage: a path that does not exist or a file that does not parse",
}


class UsageError(Exception):
    """A bad path or an unparsable file: exit 2 with one line."""


@dataclass(frozen=True)
class Module:
    """One first-party Python file and its dotted name."""

    name: str
    path: Path
    is_package: bool  # an __init__.py: relative imports resolve against the module itself


@dataclass(frozen=True)
class Violation:
    """One private name reached from another module."""

    path: str
    line: int
    importer: str
    source: str
    name: str
    how: str  # "from-import" or "attribute"

    def __str__(self) -> str:
        if self.how == "attribute":
            what = f"uses {self.source}.{self.name}"
        else:
            what = f"imports {self.name} from {self.source}"
        return (
            f"{self.path}:{self.line}: {self.importer} {what}: make it public (no underscore, "
            f"in __all__) or move it into an internal module (a name starting with '_')"
        )


def is_private_name(name: str) -> bool:
    """``_y`` yes, ``__version__`` and ``y`` no."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_internal(module: str) -> bool:
    """A module marked internal: a component after the top-level package starts with ``_``.

    ``__main__`` is not internal (a dunder, like ``__version__`` among names).
    """
    return any(is_private_name(part) for part in module.split(".")[1:])


def default_paths(root: Path = ROOT) -> list[Path]:
    """Every package's library code: ``packages/*/src``."""
    return sorted((root / "packages").glob("*/src"))


def _dotted(path: Path) -> tuple[str, bool]:
    """The module name of ``path``: the folders above it that hold an ``__init__.py``."""
    path = path.resolve()
    is_package = path.name == "__init__.py"
    parts = [] if is_package else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts), is_package


def _python_files(paths: Iterable[Path]) -> Iterator[Path]:
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p}: no such file or folder: pass existing paths (or none)")
        if p.is_file():
            if p.suffix == ".py":
                yield p
            continue
        for f in sorted(p.rglob("*.py")):
            # Hidden folders and caches *below* the given folder only: a checkout that lives
            # under a hidden folder (``~/.local/src``, a nox temp dir) is still checked.
            below = f.relative_to(p).parts
            if not any(part.startswith(".") or part == "__pycache__" for part in below):
                yield f


def discover(paths: Iterable[Path]) -> dict[str, Module]:
    """Every first-party module under ``paths``, by dotted name."""
    found: dict[str, Module] = {}
    for f in _python_files(paths):
        name, is_package = _dotted(f)
        if name:
            found[name] = Module(name, f, is_package)
    return found


def parse(module: Module) -> ast.Module:
    try:
        return ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise UsageError(f"{module.path}: does not parse ({exc}): fix the file") from exc


def resolve_from(module: Module, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from ... import`` reads from (None: above the top package)."""
    if not node.level:
        return node.module
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    up = node.level - 1
    if up > len(base) - 1:
        return None
    base = base[: len(base) - up] if up else base
    return ".".join([*base, node.module] if node.module else base)


def find_violations(paths: Iterable[Path]) -> list[Violation]:
    """Every private name taken from another first-party module, in file and line order."""
    modules = discover(paths)
    cwd = Path.cwd()
    out: list[Violation] = []
    for module in modules.values():
        tree = parse(module)
        try:
            shown = str(module.path.resolve().relative_to(cwd))
        except ValueError:
            shown = str(module.path)
        aliases: dict[str, str] = {}  # local name -> first-party module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        aliases[alias.asname] = alias.name
                    elif not alias.asname and alias.name.split(".")[0] in modules:
                        aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                source = resolve_from(module, node)
                if source is None or source not in modules:
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    if sub in modules:  # a submodule: a module import, not a name
                        aliases[alias.asname or alias.name] = sub
                        continue
                    if (
                        is_private_name(alias.name)
                        and source != module.name
                        and not is_internal(source)
                    ):
                        out.append(
                            Violation(
                                shown, node.lineno, module.name, source, alias.name, "from-import"
                            )
                        )
        if aliases:
            out += _attribute_uses(tree, module, aliases, modules, shown)
    return sorted(out, key=lambda v: (v.path, v.line, v.name))


def _attribute_uses(
    tree: ast.Module,
    module: Module,
    aliases: dict[str, str],
    modules: dict[str, Module],
    shown: str,
) -> list[Violation]:
    """``m._y`` (and ``pkg.mod._y``) where ``m`` is bound to another first-party module."""
    out: list[Violation] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private_name(node.attr):
            continue
        chain: list[str] = []
        value: ast.expr = node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in aliases:
            continue
        target = ".".join([aliases[value.id], *chain])
        if target not in modules:  # an attribute of an object, not of a module
            continue
        if target != module.name and not is_internal(target):
            out.append(Violation(shown, node.lineno, module.name, target, node.attr, "attribute"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fail on a private name (_y) imported from another first-party module.",
        epilog="Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT.items()),
    )
    parser.add_argument(
        "paths", nargs="*", type=Path, help="files or folders (default: every packages/*/src)"
    )
    parser.add_argument("--json", action="store_true", help="stdout is one JSON document")
    args = parser.parse_args(argv)
    try:
        found = find_violations(args.paths or default_paths())
    except UsageError as exc:
        print(f"check_private_imports: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"violations": [asdict(v) for v in found]}, indent=2))
    else:
        for v in found:
            print(v)
        print(
            f"{len(found)} private name(s) imported across modules"
            if found
            else "no private name is imported across modules",
            file=sys.stderr,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
