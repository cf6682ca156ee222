"""Declared tables of the torch_npu / torchair / PyPTO names a package relies on.

No machine that builds this project has an Ascend NPU, so NPU code paths never run in
CI. Instead each package declares every NPU name it touches in one text table and reaches
those names only through :class:`NpuApi`; ``tools/npu_api_check.py`` reads the same
tables and checks them statically against every torch_npu wheel of the CANN matrix. A
name that differs between torch_npu releases gets one row per spelling with version
bounds, and :meth:`NpuApi.pick` chooses by the installed version, so the code and the
checker agree on which spelling applies where.

Table format, one row a line (an indented line continues the previous one)::

    kind path [keyword ...] [@>=2.6.0,<2.9.0] | where it was checked

``kind`` is module | class | function | method | member | kwarg | key | env; a trailing
``?`` on the kind (or on a keyword) marks it optional: missing from some wheels and the
code works without it. ``kwarg`` rows name keywords of the callable at ``path``; ``key``
rows name keys of an options dict it reads (``runtime_options.run_mode``); ``env`` rows
are ``<package>.<VARIABLE>``: the variable that package reads. ``@`` bounds are the
torch_npu (or PyPTO, for ``pypto.*`` rows) versions the row applies to: lower bound
inclusive, upper exclusive. Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KINDS",
    "NpuApi",
    "NpuName",
    "distribution_of",
    "parse_table",
    "parse_version",
]

KINDS = ("module", "class", "function", "method", "member", "kwarg", "key", "env")

#: Import roots that are not distributions of their own: torch.npu is torch_npu.npu once
#: torch_npu is imported, and torchair ships inside the torch_npu wheel.
_DIST_OF_ROOT = {"torch_npu": "torch-npu", "torch": "torch-npu", "torchair": "torch-npu"}

_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:\.?(a|b|rc)(\d+))?(?:\.?post(\d+))?(?:\+.*)?$")


def parse_version(text: str) -> tuple[int, ...]:
    """A sortable key for versions like ``2.9.0``, ``2.7.1.post8``, ``2.10.0rc1``.

    Pre-releases sort before their release and post releases after it, as pip orders
    them; the local part (``+cpu``) is ignored. Stdlib only, so no ``packaging``.
    """
    m = _VERSION.match(text.strip().lower().lstrip("v"))
    if m is None:
        raise ValueError(f"{text!r} is not a version; write it like 2.9.0 or 2.7.1.post8")
    release = [int(p) for p in m.group(1).split(".")]
    release += [0] * (4 - len(release))
    pre = {"a": -3, "b": -2, "rc": -1}.get(m.group(2) or "", 0)
    return (*release[:4], pre, int(m.group(3) or 0), int(m.group(4) or 0))


def distribution_of(path: str) -> str:
    """The distribution whose version a row's ``@`` bounds refer to."""
    root = path.split(".", 1)[0]
    return _DIST_OF_ROOT.get(root, root.replace("_", "-"))


@dataclass(frozen=True)
class NpuName:
    """One NPU name a package relies on: a row of its declared table.

    ``since`` is the first version with the name (inclusive), ``until`` the first
    without it (exclusive); both refer to :func:`distribution_of` ``path``.
    """

    path: str
    kind: str
    source: str
    kwarg: str | None = None
    optional: bool = False
    since: str | None = None
    until: str | None = None

    def applies(self, version: str | None) -> bool:
        """Whether the row holds for ``version`` (an unknown version: every row holds)."""
        if version is None:
            return True
        key = parse_version(version)
        if self.since is not None and key < parse_version(self.since):
            return False
        return not (self.until is not None and key >= parse_version(self.until))

    @property
    def label(self) -> str:
        """The row as one short line for reports."""
        name = {"kwarg": f"{self.path}({self.kwarg}=)", "key": f"{self.path}[{self.kwarg}]"}.get(
            self.kind, self.path
        )
        bounds = ",".join(
            b for b in (self.since and f">={self.since}", self.until and f"<{self.until}") if b
        )
        return f"{self.kind}{'?' if self.optional else ''} {name}" + (
            f" @{bounds}" if bounds else ""
        )


def _bounds(token: str, line: str) -> tuple[str | None, str | None]:
    since = until = None
    for part in token[1:].split(","):
        part = part.strip()
        if part.startswith(">="):
            since = part[2:]
        elif part.startswith("<"):
            until = part[1:]
        else:
            raise ValueError(f"bad version bound {part!r} in {line!r}; write @>=2.6.0,<2.9.0")
        parse_version(part.lstrip("<>="))
    return since, until


def parse_table(text: str, prefixes: Mapping[str, str] | None = None) -> tuple[NpuName, ...]:
    """The rows of a table in the module docstring's format.

    ``prefixes`` expands a source's first word (``P`` -> a repository path) so tables stay
    narrow. A malformed line raises ValueError naming it, at import of the declaring module.
    """
    rows: list[NpuName] = []
    for line in re.sub(r"\n[ \t]+", " ", text).strip().splitlines():  # indented = continued
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        head, bar, source = (part.strip() for part in line.partition("|"))
        if not bar or not source:
            raise ValueError(f"table line {line!r} has no '| source'; say where it was checked")
        abbr, _, rest = source.partition(" ")
        if prefixes and abbr in prefixes:
            source = prefixes[abbr] + rest
        words = head.split()
        since = until = None
        for word in [w for w in words if w.startswith("@")]:
            since, until = _bounds(word, line)
        words = [w for w in words if not w.startswith("@")]
        if len(words) < 2:
            raise ValueError(f"table line {line!r} needs a kind and a dotted path")
        kind, path, *rest_words = words
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r} in {line!r}; use one of {', '.join(KINDS)}")
        if kind in ("kwarg", "key"):
            if not rest_words:
                raise ValueError(f"kwarg line {line!r} names no keyword")
            rows += [
                NpuName(
                    path, kind, source, w.rstrip("?"), optional or w.endswith("?"), since, until
                )
                for w in rest_words
            ]
            continue
        if rest_words:
            raise ValueError(f"only kwarg lines take words after the path: {line!r}")
        if kind == "env" and "." not in path:
            raise ValueError(f"env line {line!r}: write <package>.<VARIABLE>")
        rows.append(NpuName(path, kind, source, None, optional, since, until))
    return tuple(rows)


def _installed_version(dist: str) -> str | None:
    for name in (dist, dist.replace("-", "_")):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class NpuApi:
    """A package's declared table, and the only way its code reaches those names.

    ``versions`` pins the version per distribution (tests use it to exercise each
    torch_npu spelling without torch_npu installed); otherwise the installed version is
    read from the distribution metadata, never by importing torch_npu.
    """

    def __init__(
        self,
        rows: Iterable[NpuName],
        *,
        owner: str = "this package",
        versions: Mapping[str, str | None] | None = None,
    ) -> None:
        self.rows = tuple(rows)
        self.owner = owner
        self._versions: dict[str, str | None] = dict(versions or {})

    def version(self, path: str) -> str | None:
        """The installed version of the distribution ``path`` belongs to (None: absent)."""
        dist = distribution_of(path)
        if dist not in self._versions:
            self._versions[dist] = _installed_version(dist)
        return self._versions[dist]

    def _rows_for(self, path: str, kind: str | None = None) -> list[NpuName]:
        found = [r for r in self.rows if r.path == path and r.kind not in ("kwarg", "key")]
        if kind is not None:
            found = [r for r in found if r.kind == kind]
        return found

    def row(self, path: str) -> NpuName:
        """The row for ``path`` that applies to the installed version."""
        rows = self._rows_for(path)
        if not rows:
            raise KeyError(f"{path} is not declared in {self.owner}'s NPU table")
        version = self.version(path)
        for r in rows:
            if r.applies(version):
                return r
        raise AttributeError(f"{path} does not exist in {distribution_of(path)} {version}")

    def declared(self, path: str) -> bool:
        return bool(self._rows_for(path))

    def applies(self, path: str) -> bool:
        """Whether ``path`` is declared for the installed version."""
        version = self.version(path)
        return any(r.applies(version) for r in self._rows_for(path))

    def pick(self, *paths: str) -> str:
        """The first of ``paths`` whose row applies to the installed version.

        This is how a name that was renamed between releases is chosen: one row per
        spelling with ``@`` bounds, and the code asks for all of them in order.
        """
        for path in paths:
            if not self.declared(path):
                raise KeyError(f"{path} is not declared in {self.owner}'s NPU table")
        for path in paths:
            if self.applies(path):
                return path
        raise AttributeError(
            f"none of {', '.join(paths)} applies to {distribution_of(paths[0])} "
            f"{self.version(paths[0])}"
        )

    def env_name(self, path: str) -> str:
        """The variable name of a declared ``env`` row ``<package>.<VARIABLE>``."""
        if not self._rows_for(path, "env"):
            raise KeyError(f"{path} is not an env row of {self.owner}'s NPU table")
        return path.rsplit(".", 1)[1]

    def resolve(self, path: str) -> Any:
        """The object at dotted ``path``, importing modules lazily as the walk needs them.

        Returns None for an optional row that this installation lacks (or that does not
        apply to its version); raises AttributeError for anything else missing.
        """
        if not self.declared(path):
            raise KeyError(f"{path} is not declared in {self.owner}'s NPU table")
        if not self.applies(path) and self._all_optional(path):
            return None
        row = self.row(path)
        if row.kind == "env":
            raise TypeError(f"{path} is an env row; use env_name()")
        parts = path.split(".")
        obj: Any = importlib.import_module(parts[0])
        for i, part in enumerate(parts[1:], start=1):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                try:
                    obj = importlib.import_module(".".join(parts[: i + 1]))
                except ImportError:
                    if row.optional:
                        return None
                    raise AttributeError(f"this {parts[0]} has no {path}") from None
        return obj

    def _all_optional(self, path: str) -> bool:
        return all(r.optional for r in self._rows_for(path))

    def accepts(self, path: str, kwarg: str) -> bool:
        """Whether keyword ``kwarg`` of ``path`` is declared for the installed version."""
        version = self.version(path)
        return any(
            r.kind == "kwarg" and r.path == path and r.kwarg == kwarg and r.applies(version)
            for r in self.rows
        )

    def kwargs(self, path: str, **given: Any) -> dict[str, Any]:
        """``given`` after checking every keyword is declared for ``path`` at this version."""
        declared = {r.kwarg for r in self.rows if r.kind == "kwarg" and r.path == path}
        unknown = set(given) - declared
        if unknown:
            raise KeyError(
                f"keywords {sorted(unknown)} of {path} are not declared in {self.owner}'s NPU table"
            )
        absent = sorted(k for k in given if not self.accepts(path, k))
        if absent:
            raise TypeError(
                f"{path} takes no {absent} in {distribution_of(path)} {self.version(path)}"
            )
        return given

    def env(self, path: str) -> str | None:
        """The current value of a declared env row's variable."""
        return os.environ.get(self.env_name(path))
