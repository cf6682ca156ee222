"""The CANN <-> torch <-> torch_npu matrix shipped as ``cann-matrix.toml``.

The matrix is data, not code, so the noxfile (which cannot import this package before it
installs it) and this reader agree by construction on one file.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):  # noqa: UP036 - this package supports 3.10; ruff targets 3.11
    import tomllib
else:  # pragma: no cover - Python 3.10, where pyproject pulls in tomli
    import tomli as tomllib

__all__ = [
    "MatrixError",
    "MatrixRow",
    "Pins",
    "UnknownCannVersionError",
    "UnpairedRelease",
    "cann_for_torch",
    "cann_release",
    "cann_sort_key",
    "known_cann_versions",
    "load_matrix",
    "load_unpaired",
    "pins_for",
    "rows_for",
    "torch_base_version",
    "torch_versions_for",
]

MATRIX_FILE = "cann-matrix.toml"

# "8.3.RC1", "9.1.0" and builds of them: "8.3.RC1.alpha002", "9.1.0.1", "8.3.rc1-beta".
_CANN_RE = re.compile(r"^\s*(\d+)\.(\d+)\.(RC\d+|\d+)(?:[.\-_+].*)?\s*$", re.IGNORECASE)


class MatrixError(ValueError):
    """The matrix file itself is malformed (a packaging bug, not a user error)."""


class UnknownCannVersionError(LookupError):
    """A CANN version the matrix has no row for; ``known`` lists the ones it has."""

    def __init__(self, version: str, known: list[str]) -> None:
        self.version = version
        self.known = known
        super().__init__(
            f"CANN {version!r} is not in the pypto-env matrix; known versions: {', '.join(known)}"
        )


@dataclass(frozen=True)
class Pins:
    """The exact torch / torch_npu pair to install for one CANN release."""

    cann: str
    torch: str
    torch_npu: str

    def requirements(self) -> list[str]:
        """Pip requirement strings, pinned exactly (an open torch range pulls a CUDA build)."""
        return [f"torch=={self.torch}", f"torch-npu=={self.torch_npu}"]

    def pip_command(self) -> str:
        return "pip install " + " ".join(self.requirements())


@dataclass(frozen=True)
class MatrixRow:
    """One documented (CANN, torch, torch_npu) pairing."""

    cann: str
    torch: str
    torch_npu: str
    recommended: bool = False

    @property
    def pins(self) -> Pins:
        return Pins(self.cann, self.torch, self.torch_npu)


@dataclass(frozen=True)
class UnpairedRelease:
    """A torch_npu release on the index whose CANN pairing is not documented."""

    torch: str
    torch_npu: str
    note: str


def cann_release(version: str) -> str | None:
    """The release a CANN version string belongs to, or None if it is not CANN-shaped.

    Installed toolkits report build versions ("8.3.RC1.alpha002", "9.1.0.1") while the
    torch_npu pairing is documented per release ("8.3.RC1", "9.1.0"): the first three
    components name the release. "RC" is upper-cased; "8.3.RC2" stays its own release.
    """
    m = _CANN_RE.match(version)
    if not m:
        return None
    major, minor, patch = m.groups()
    return f"{int(major)}.{int(minor)}.{patch.upper()}"


def cann_sort_key(version: str) -> tuple[int, int, int, int]:
    """Sort key putting newer CANN releases last; "8.3.RC1" sorts before "8.3.0"."""
    release = cann_release(version)
    if release is None:
        return (-1, -1, -1, -1)
    major, minor, patch = release.split(".")
    if patch.startswith("RC"):
        return (int(major), int(minor), 0, int(patch[2:]))
    return (int(major), int(minor), 1, int(patch))


def torch_base_version(version: str) -> str:
    """``2.7.1+cpu`` -> ``2.7.1``: local build tags do not change the pairing."""
    return version.strip().split("+", 1)[0]


def _read_matrix_text(path: Path | None) -> str:
    if path is not None:
        return Path(path).read_text(encoding="utf-8")
    return resources.files("pypto_env").joinpath(MATRIX_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=8)
def _parse(path: Path | None) -> tuple[tuple[MatrixRow, ...], tuple[UnpairedRelease, ...]]:
    try:
        data = tomllib.loads(_read_matrix_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"{path or MATRIX_FILE}: not valid TOML: {exc}") from exc
    rows = []
    for i, raw in enumerate(data.get("row", [])):
        fields = {k: raw.get(k) for k in ("cann", "torch", "torch_npu")}
        bad = [k for k, v in fields.items() if not isinstance(v, str) or not v]
        if bad:
            raise MatrixError(f"{path or MATRIX_FILE}: row {i} lacks string field(s) {bad}")
        rows.append(MatrixRow(**fields, recommended=bool(raw.get("recommended", False))))
    if not rows:
        raise MatrixError(f"{path or MATRIX_FILE}: no [[row]] entries")
    unpaired = tuple(
        UnpairedRelease(str(u["torch"]), str(u["torch_npu"]), str(u.get("note", "")))
        for u in data.get("undocumented", [])
    )
    return tuple(rows), unpaired


def load_matrix(path: Path | None = None) -> list[MatrixRow]:
    """Every documented pairing, in file order (newest CANN first)."""
    return list(_parse(path)[0])


def load_unpaired(path: Path | None = None) -> list[UnpairedRelease]:
    """torch_npu releases whose CANN pairing is undocumented (never used for pins)."""
    return list(_parse(path)[1])


def known_cann_versions(path: Path | None = None) -> list[str]:
    """CANN releases in the matrix, newest first."""
    return sorted({r.cann for r in load_matrix(path)}, key=cann_sort_key, reverse=True)


def _rows_for(cann_version: str, path: Path | None) -> tuple[str, list[MatrixRow]]:
    rows = load_matrix(path)
    exact = [r for r in rows if r.cann == cann_version.strip()]
    if exact:
        return cann_version.strip(), exact
    release = cann_release(cann_version)
    matched = [r for r in rows if release is not None and r.cann == release]
    if not matched:
        raise UnknownCannVersionError(cann_version, known_cann_versions(path))
    return matched[0].cann, matched


def pins_for(cann_version: str, path: Path | None = None) -> Pins:
    """The recommended (newest torch) pins for a CANN version.

    Accepts a release ("8.3.RC1") or a build of one ("8.3.RC1.alpha002", "9.1.0.1"), which
    maps to its release row; ``Pins.cann`` names the release that matched.
    Raises UnknownCannVersionError for versions the matrix does not document.
    """
    _, rows = _rows_for(cann_version, path)
    recommended = [r for r in rows if r.recommended] or rows
    return recommended[0].pins


def rows_for(cann_version: str, path: Path | None = None) -> list[MatrixRow]:
    """Every pairing documented for a CANN version (release or build), newest torch first."""
    return _rows_for(cann_version, path)[1]


def torch_versions_for(cann_version: str, path: Path | None = None) -> list[str]:
    """torch versions documented for a CANN version, newest first."""
    return [r.torch for r in rows_for(cann_version, path)]


def cann_for_torch(torch_version: str, path: Path | None = None) -> list[str]:
    """CANN releases documented for a torch version, newest first.

    Empty for torch versions without a documented pairing (e.g. 2.13.0, whose torch_npu
    exists but whose CANN is undocumented: see ``load_unpaired``).
    """
    base = torch_base_version(torch_version)
    found = {r.cann for r in load_matrix(path) if r.torch == base}
    return sorted(found, key=cann_sort_key, reverse=True)
