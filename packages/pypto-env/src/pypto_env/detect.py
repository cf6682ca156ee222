"""Find the CANN toolkit on this machine without importing torch or torch_npu.

Users run this before torch is installed (to learn which torch to install), so it reads
only the toolkit's own install metadata: the ``*_install.info`` key=value files and
``version.cfg``. Every unreadable or garbled file is logged at debug level and skipped.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

__all__ = [
    "ENV_VARS",
    "ROOTS_ENV",
    "CannInstall",
    "Detection",
    "default_roots",
    "detect_cann",
    "find_cann",
    "installed_versions",
    "read_install_info",
    "read_version_cfg",
]

log = logging.getLogger(__name__)

# Set by CANN's set_env.sh; the first wins.
ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
# os.pathsep-separated list replacing the default roots (custom install prefixes, tests).
ROOTS_ENV = "PYPTO_CANN_ROOTS"
TOOLKIT_INFO = "ascend_toolkit_install.info"
# Cap on what we read from a metadata file: real ones are a few hundred bytes.
_MAX_BYTES = 64 * 1024

Layout = Literal["ascend-toolkit", "cann"]


@dataclass(frozen=True)
class CannInstall:
    """One detected CANN toolkit."""

    version: str
    home: Path
    arch: str | None
    layout: Layout
    source: Path
    """The file the version was read from."""

    def as_dict(self) -> dict[str, str | None]:
        return {
            "version": self.version,
            "home": str(self.home),
            "arch": self.arch,
            "layout": self.layout,
            "source": str(self.source),
        }


@dataclass
class Detection:
    """The outcome of a search: the install found, and why each other candidate failed."""

    install: CannInstall | None
    tried: list[tuple[str, str]] = field(default_factory=list)
    """(candidate home or file, reason it gave no version), in search order."""


def default_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """Where CANN installs land when nobody sourced set_env.sh (system, then per-user)."""
    env = os.environ if env is None else env
    if ROOTS_ENV in env:
        return [Path(p) for p in env[ROOTS_ENV].split(os.pathsep) if p]
    roots = [Path("/usr/local/Ascend/ascend-toolkit/latest"), Path("/usr/local/Ascend/cann")]
    home = env.get("HOME")
    if home:
        roots += [Path(home, "Ascend", "ascend-toolkit", "latest"), Path(home, "Ascend", "cann")]
    return roots


def _read_text(path: Path) -> str | None:
    try:
        with path.open("rb") as fh:
            raw = fh.read(_MAX_BYTES)
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None
    if b"\x00" in raw:
        log.debug("%s looks binary, ignoring it", path)
        return None
    return raw.decode("utf-8", errors="replace")


def read_install_info(path: Path) -> dict[str, str]:
    """Parse a ``*_install.info`` file (``key=value`` lines); {} when unreadable."""
    text = _read_text(path)
    if text is None:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            info[key.strip().lower()] = value.strip().strip("\"'")
    return info


_CFG_RE = re.compile(r"^\s*(\w+)\s*=\s*\[([^\]:]*):([^\]]*)\]")


def read_version_cfg(path: Path) -> str | None:
    """The CANN version in ``version.cfg`` (``runtime_running_version=[7.6.0.1.220:8.0.0]``).

    The part before the colon is the runtime component's own version; the CANN version
    is after it. ``runtime_running_version`` wins over other ``*_version`` lines.
    """
    text = _read_text(path)
    if text is None:
        return None
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = _CFG_RE.match(line)
        if m and m.group(3).strip():
            found.setdefault(m.group(1).lower(), m.group(3).strip())
    if not found:
        log.debug("%s has no '<name>_version=[x:VERSION]' line", path)
        return None
    return found.get("runtime_running_version") or next(iter(found.values()))


def _valid_version(value: str) -> bool:
    return re.fullmatch(r"\d+\.\d+[\w.\-]*", value) is not None


def _arch_dirs(home: Path) -> list[Path]:
    """``<arch>-linux`` folders, the host's arch first."""
    try:
        dirs = sorted(p for p in home.glob("*-linux") if p.is_dir())
    except OSError as exc:
        log.debug("cannot list %s: %s", home, exc)
        return []
    host = f"{platform.machine()}-linux"
    return sorted(dirs, key=lambda p: p.name != host)


def _layout(home: Path) -> Layout:
    parts = set(home.parts)
    try:
        parts |= set(home.resolve().parts)
    except OSError:
        pass
    return "ascend-toolkit" if "ascend-toolkit" in parts else "cann"


def _probe(home: Path, tried: list[tuple[str, str]]) -> CannInstall | None:
    """Read the version of the toolkit rooted at ``home`` (the folder set_env.sh exports)."""
    if not home.is_dir():
        tried.append((str(home), "not a directory"))
        log.debug("CANN candidate %s: not a directory", home)
        return None
    arch_dirs = _arch_dirs(home)
    # Preferred: the toolkit's own info file; then version.cfg; then any *_install.info.
    candidates: list[tuple[Path, str | None]] = [
        (d / TOOLKIT_INFO, d.name[: -len("-linux")]) for d in arch_dirs
    ]
    candidates.append((home / TOOLKIT_INFO, None))
    candidates.append((home / "version.cfg", None))
    for folder, arch in [*((d, d.name[: -len("-linux")]) for d in arch_dirs), (home, None)]:
        try:
            extra = sorted(folder.glob("*_install.info"))
        except OSError:
            extra = []
        candidates += [(p, arch) for p in extra if p.name != TOOLKIT_INFO]

    default_arch = arch_dirs[0].name[: -len("-linux")] if arch_dirs else None
    saw_file = False
    for path, arch in candidates:
        if not path.is_file():
            continue
        saw_file = True
        if path.name == "version.cfg":
            version = read_version_cfg(path)
        else:
            info = read_install_info(path)
            version = info.get("version")
            arch = arch or info.get("arch") or None
        if version is None or not _valid_version(version):
            tried.append((str(path), f"no usable version (got {version!r})"))
            log.debug("CANN candidate %s: no usable version (got %r)", path, version)
            continue
        return CannInstall(version, home, arch or default_arch, _layout(home), path)
    if not saw_file:
        tried.append((str(home), f"no {TOOLKIT_INFO}, version.cfg or *_install.info in it"))
        log.debug("CANN candidate %s: no version file", home)
    return None


def find_cann(
    env: Mapping[str, str] | None = None, roots: Sequence[str | os.PathLike[str]] | None = None
) -> Detection:
    """Search ``ASCEND_HOME_PATH``, ``ASCEND_TOOLKIT_HOME``, then ``roots`` (default_roots())."""
    env = os.environ if env is None else env
    tried: list[tuple[str, str]] = []
    homes: list[Path] = []
    for var in ENV_VARS:
        value = env.get(var, "").strip()
        if value:
            homes.append(Path(value))
        else:
            tried.append((f"${var}", "not set"))
    homes += [Path(r) for r in (default_roots(env) if roots is None else roots)]
    seen: set[Path] = set()
    for home in homes:
        if home in seen:
            continue
        seen.add(home)
        found = _probe(home, tried)
        if found is not None:
            log.debug("CANN %s found at %s (%s)", found.version, found.home, found.source)
            return Detection(found, tried)
    return Detection(None, tried)


def detect_cann(
    env: Mapping[str, str] | None = None, roots: Sequence[str | os.PathLike[str]] | None = None
) -> CannInstall | None:
    """The CANN toolkit this machine would use, or None (never raises on bad files)."""
    return find_cann(env, roots).install


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_versions(
    env: Mapping[str, str] | None = None, roots: Sequence[str | os.PathLike[str]] | None = None
) -> dict[str, str | None]:
    """Versions for report metadata, read from package metadata: torch is never imported
    (importing torch_npu needs CANN and is slow), so this is cheap and cannot crash."""
    cann = detect_cann(env, roots)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": _dist_version("torch"),
        "torch_npu": _dist_version("torch-npu"),
        "transformers": _dist_version("transformers"),
        "huggingface_hub": _dist_version("huggingface-hub"),
        "pypto": _dist_version("pypto"),
        "cann": cann.version if cann else None,
        "cann_home": str(cann.home) if cann else None,
    }
