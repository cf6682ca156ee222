"""Per package: where the code is heavy and where it is tangled, read statically with ast.

For each package under ``packages/*/src`` (or the folders given):

- the largest modules and their line counts;
- private names imported across modules (the ``tools/check_private_imports.py`` rule);
- module import cycles: each strongly connected set of modules, with the imports that
  close it (function-level and ``TYPE_CHECKING`` imports count: they are still arrows);
- functions (and methods) over ``--long`` lines (default 100);
- how many modules declare ``__all__``.

Issue 28 records these numbers before and after a layering change; nothing is imported
or run, so the tool needs no package installed.

    python tools/layering_stats.py            # a readable summary
    python tools/layering_stats.py --json     # stdout is one JSON document
    python tools/layering_stats.py --root /tmp/wt-before   # another checkout

Cycles: an import of ``pkg.a.b`` is an arrow to ``pkg.a.b`` (as in grimp, which
import-linter uses); arrows out of a package's ``__init__`` are left out, since a package
re-exporting its modules is a facade, not a cycle (import-linter's ``acyclic_siblings``
treats the package as the parent, not a sibling, for the same reason).

Exit 0; 2: bad usage (a path that does not exist, a file that does not parse).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_private_imports import (
    Module,
    UsageError,
    discover,
    find_violations,
    parse,
    resolve_from,
)

__all__ = ["EXIT", "PackageStats", "collect", "cycles", "import_edges", "main"]

ROOT = Path(__file__).resolve().parent.parent

EXIT = {0: "the numbers were printed", 2: "bad usage: a missing path or an unparsable file"}


@dataclass
class PackageStats:
    """The numbers of one top-level package."""

    package: str
    modules: int = 0
    lines: int = 0
    largest: list[dict[str, Any]] = field(default_factory=list)
    private_imports: list[str] = field(default_factory=list)
    cycles: list[dict[str, Any]] = field(default_factory=list)
    long_functions: list[dict[str, Any]] = field(default_factory=list)
    modules_with_all: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "modules": self.modules,
            "lines": self.lines,
            "largest_modules": self.largest,
            "private_cross_module_imports": len(self.private_imports),
            "private_imports": self.private_imports,
            "cycles": len(self.cycles),
            "cycle_sets": self.cycles,
            "functions_over_limit": len(self.long_functions),
            "long_functions": self.long_functions,
            "modules_with_all": self.modules_with_all,
        }


def import_edges(module: Module, tree: ast.Module, modules: dict[str, Module]) -> dict[str, int]:
    """First-party modules ``module`` imports (anywhere in the file), with the first line."""
    edges: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        # The deepest first-party module named (``import a.b.c`` of a function c: a.b).
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module.name:
            edges.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = resolve_from(module, node)
            if source is None:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in modules else source, node.lineno)
    return edges


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _functions(tree: ast.Module) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function and method."""
    out: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                out.append(
                    (name, child.lineno, (child.end_lineno or child.lineno) - child.lineno + 1)
                )
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _declares_all(tree: ast.Module) -> bool:
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign | ast.AugAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return False


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def collect(
    paths: list[Path], *, top: int = 5, long: int = 100, root: Path = ROOT
) -> list[PackageStats]:
    """The numbers of every top-level package found under ``paths``."""
    modules = discover(paths)
    trees = {name: parse(m) for name, m in modules.items()}
    stats: dict[str, PackageStats] = {}
    sizes: dict[str, list[tuple[int, str]]] = {}
    graphs: dict[str, dict[str, dict[str, int]]] = {}
    for name, module in sorted(modules.items()):
        package = name.split(".")[0]
        s = stats.setdefault(package, PackageStats(package))
        text = module.path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        s.modules += 1
        s.lines += n
        s.modules_with_all += _declares_all(trees[name])
        sizes.setdefault(package, []).append((n, name))
        for fname, line, length in _functions(trees[name]):
            if length > long:
                s.long_functions.append(
                    {
                        "function": f"{name}.{fname}",
                        "where": f"{_shown(module.path, root)}:{line}",
                        "lines": length,
                    }
                )
        edges = {} if module.is_package else import_edges(module, trees[name], modules)
        graphs.setdefault(package, {})[name] = {
            t: line for t, line in edges.items() if t.split(".")[0] == package
        }
    for v in find_violations(paths):
        stats[v.importer.split(".")[0]].private_imports.append(
            f"{_shown(Path(v.path), root)}:{v.line} {v.importer} <- {v.source}.{v.name}"
        )
    for package, s in stats.items():
        s.largest = [
            {"module": name, "lines": n}
            for n, name in sorted(sizes[package], key=lambda t: (-t[0], t[1]))[:top]
        ]
        s.long_functions.sort(key=lambda f: (-f["lines"], f["function"]))
        graph = graphs[package]
        for component in cycles(graph):
            members = set(component)
            s.cycles.append(
                {
                    "modules": component,
                    "imports": [
                        f"{a} -> {b} ({_shown(modules[a].path, root)}:{line})"
                        for a in component
                        for b, line in sorted(graph[a].items())
                        if b in members
                    ],
                }
            )
    return [stats[p] for p in sorted(stats)]


def _text(all_stats: list[PackageStats], long: int) -> str:
    lines: list[str] = []
    totals = {"private": 0, "cycles": 0, "long": 0}
    for s in all_stats:
        totals["private"] += len(s.private_imports)
        totals["cycles"] += len(s.cycles)
        totals["long"] += len(s.long_functions)
        lines.append(
            f"{s.package}: {s.modules} modules, {s.lines} lines, __all__ in "
            f"{s.modules_with_all}/{s.modules}, {len(s.private_imports)} private cross-module "
            f"imports, {len(s.cycles)} cycles, {len(s.long_functions)} functions over {long} lines"
        )
        lines.append("  largest: " + ", ".join(f"{m['module']} {m['lines']}" for m in s.largest))
        lines += [f"  private: {p}" for p in s.private_imports]
        for c in s.cycles:
            lines.append(f"  cycle: {' <-> '.join(c['modules'])}")
            lines += [f"    {i}" for i in c["imports"]]
        lines += [
            f"  long: {f['function']} {f['lines']} lines ({f['where']})" for f in s.long_functions
        ]
    lines.append(
        f"total: {totals['private']} private cross-module imports, {totals['cycles']} cycles, "
        f"{totals['long']} functions over {long} lines"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Per-package module sizes, private cross-module imports, cycles, long functions.",
        epilog="Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT.items()),
    )
    parser.add_argument(
        "paths", nargs="*", type=Path, help="folders (default: ROOT/packages/*/src)"
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the checkout to read (default: this one)"
    )
    parser.add_argument("--top", type=int, default=5, help="largest modules listed per package")
    parser.add_argument(
        "--long", type=int, default=100, help="a function over this many lines is listed"
    )
    parser.add_argument("--json", action="store_true", help="stdout is one JSON document")
    args = parser.parse_args(argv)
    if args.top < 1 or args.long < 1:
        parser.error("--top and --long take a positive number of lines: e.g. --top 5 --long 100")
    root: Path = args.root
    if not root.is_dir():
        print(
            f"layering_stats: {root}: no such folder: pass a checkout with --root", file=sys.stderr
        )
        return 2
    paths = args.paths or sorted((root / "packages").glob("*/src"))
    if not paths:
        print(
            f"layering_stats: {root}: no packages/*/src here: pass --root or paths", file=sys.stderr
        )
        return 2
    try:
        found = collect(paths, top=args.top, long=args.long, root=root)
    except UsageError as exc:
        print(f"layering_stats: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"long": args.long, "packages": [s.to_dict() for s in found]}, indent=2))
    else:
        print(_text(found, args.long))
    return 0


if __name__ == "__main__":
    sys.exit(main())
