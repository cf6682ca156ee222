#!/usr/bin/env python3
"""Release one package of the monorepo (or a few that go out together) to a package index.

Why a tool rather than a checklist: every package is published on its own, so each
release has to prove by itself that its version moved past its last tag, that its
CHANGELOG says what the version holds, that the sibling versions its dependency ranges
ask for exist on the index (or go out in the same run), and that the files it uploads are
the ones the tag names. Every check runs before anything is built, uploaded or tagged, so
a bad input is one line on stderr and changes nothing.

    nox -s "release(pypto-capture)" -- --dry-run          # everything but upload and tag
    PYPTO_RELEASE_TOKEN=pypi-... nox -s "release(pypto-capture)"
    python tools/release.py pypto-download --with pypto-common --repository-url URL

The token is read from the environment only (``--token-env``, default
``$PYPTO_RELEASE_TOKEN``), handed to twine through its environment, and masked with
``pypto_common.redact`` in everything this tool prints. Tags (``<dist-name>-v<version>``)
are created locally; pushing them is the maintainer's step. docs/releasing.md has the
order of dependent packages and what a version bump means.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import ipaddress
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    from pypto_common import ENVIRONMENT, FAILED, OK, USAGE, cli_logging, redact, redact_url
except ImportError as exc:  # pragma: no cover - exercised only in a bare interpreter
    sys.stderr.write(
        f'release: error: {exc.name} is not installed: run `nox -s "release(<package>)"` or '
        "pip install -r tools/release-requirements.txt -e packages/pypto-common\n"
    )
    raise SystemExit(3) from None

LOGGER = "pypto_release"
log = logging.getLogger(LOGGER)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REPOSITORY_URL = "https://upload.pypi.org/legacy/"
DEFAULT_TOKEN_ENV = "PYPTO_RELEASE_TOKEN"
#: PyPI (and most indexes that take API tokens) expect this user name with a token.
DEFAULT_USERNAME = "__token__"
SCHEMA_VERSION = 1

EXIT_CODES = (
    (OK, "OK", "released (or, with --dry-run, everything but upload and tag passed)"),
    (FAILED, "FAILED", "a build, the metadata check, the upload or the tag failed"),
    (
        USAGE,
        "USAGE",
        "bad input: unknown package, dirty tree, version not bumped, no CHANGELOG entry, "
        "a sibling range that admits no released version; nothing was changed",
    ),
    (
        ENVIRONMENT,
        "ENVIRONMENT",
        "git, build or twine missing, no upload token, or no git identity for the tag",
    ),
)

_UNRELEASED = "unreleased"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_VERSION_LINE = re.compile(
    r"^__version__\s*(?::\s*str\s*)?=\s*[\"']([^\"']+)[\"']", flags=re.MULTILINE
)


class Req(Requirement):
    """A requirement that prints the way pyproject.toml wrote it (packaging reorders it)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text.strip()

    def __str__(self) -> str:
        return self.text


class ReleaseError(Exception):
    """A release that cannot go on; the message is the one line the CLI prints."""

    exit_code = FAILED


class ReleaseUsageError(ReleaseError):
    exit_code = USAGE


class ReleaseEnvironmentError(ReleaseError):
    exit_code = ENVIRONMENT


@dataclass(frozen=True)
class Package:
    """One distributable as its pyproject.toml and version file describe it."""

    name: str
    path: Path
    version: str
    dependencies: tuple[Requirement, ...]
    extras: dict[str, tuple[Requirement, ...]]
    #: Why this package cannot be released (no version, a bad requirement). Raised only
    #: when a run needs the package, so a half-written neighbour blocks nobody else.
    problem: str | None = None

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)

    @property
    def tag(self) -> str:
        return tag_name(self.name, self.version)

    @property
    def changelog(self) -> Path:
        return self.path / "CHANGELOG.md"


@dataclass
class PackageResult:
    """What happened to one package in a run (the ``--json`` entry)."""

    name: str
    version: str
    tag: str
    previous_release: str | None
    changelog: str
    files: list[dict[str, object]] = field(default_factory=list)
    uploaded: bool = False
    tagged: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "tag": self.tag,
            "previous_release": self.previous_release,
            "changelog": self.changelog,
            "files": self.files,
            "uploaded": self.uploaded,
            "tagged": self.tagged,
        }


def tag_name(name: str, version: str) -> str:
    return f"{name}-v{version}"


# --------------------------------------------------------------------------- discovery


def _requirements(raw: Iterable[str], where: Path) -> tuple[Requirement, ...]:
    out = []
    for text in raw:
        try:
            out.append(Req(text))
        except InvalidRequirement as exc:
            raise ReleaseUsageError(f"{where}: invalid requirement {text!r}: {exc}") from None
    return tuple(out)


def _read_version(pkg_dir: Path, project: dict[str, Any], pyproject: dict[str, Any]) -> str:
    if "version" in project:
        return str(project["version"])
    rel = pyproject.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
    if not rel:
        raise ReleaseUsageError(
            f"{pkg_dir / 'pyproject.toml'}: no version: set [tool.hatch.version] path to the "
            "file holding __version__"
        )
    source = pkg_dir / rel
    match = _VERSION_LINE.search(source.read_text()) if source.is_file() else None
    if not match:
        raise ReleaseUsageError(f'{source}: no `__version__ = "X.Y.Z"` line')
    return match.group(1)


def load_package(pkg_dir: Path) -> Package:
    pyproject_path = pkg_dir / "pyproject.toml"
    try:
        pyproject = tomllib.loads(pyproject_path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ReleaseUsageError(f"{pyproject_path}: unreadable: {exc}") from None
    project = pyproject.get("project", {})
    if not isinstance(project.get("name"), str):
        raise ReleaseUsageError(f"{pyproject_path}: no [project] name")
    try:
        extras = {
            extra: _requirements(reqs, pyproject_path)
            for extra, reqs in project.get("optional-dependencies", {}).items()
        }
        return Package(
            name=project["name"],
            path=pkg_dir,
            version=_read_version(pkg_dir, project, pyproject),
            dependencies=_requirements(project.get("dependencies", []), pyproject_path),
            extras=extras,
        )
    except ReleaseUsageError as exc:
        return Package(project["name"], pkg_dir, "", (), {}, problem=str(exc))


def usable(pkg: Package) -> Package:
    """``pkg`` if it can take part in a release; else its problem as the one-line error."""
    if pkg.problem:
        raise ReleaseUsageError(pkg.problem)
    return pkg


def discover(root: Path) -> dict[str, Package]:
    """Every package under ``packages/*/pyproject.toml``, keyed by canonical name.

    Discovered like the noxfile does, so a new package is releasable without edits here.
    """
    found: dict[str, Package] = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        pkg = load_package(pyproject.parent)
        found[pkg.key] = pkg
    return found


# --------------------------------------------------------------------------- git


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=120
        )
    except FileNotFoundError:
        raise ReleaseEnvironmentError("git is not installed: install it and retry") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReleaseError(f"git {' '.join(args)} failed: {detail}")
    return proc


def check_git_repo(root: Path) -> None:
    if _git(root, "rev-parse", "--is-inside-work-tree", check=False).returncode != 0:
        raise ReleaseUsageError(f"{root} is not a git checkout: release from a clone of the repo")
    if _git(root, "rev-parse", "--verify", "--quiet", "HEAD", check=False).returncode != 0:
        raise ReleaseUsageError(f"{root} has no commit yet: commit the release first")


def dirty_paths(root: Path) -> list[str]:
    """Changed, staged and untracked paths (ignored ones excluded): what a build would ship
    but the tag would not record."""
    out = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all").stdout
    return [entry[3:] for entry in out.split("\0") if len(entry) > 3]


def released_versions(root: Path, pkg: Package) -> list[Version]:
    """Versions with a ``<name>-v<version>`` tag, oldest first.

    A tag of another package that merely shares the prefix (``pypto-models-v*`` also
    matches ``pypto-models-vision-v1``) does not parse as a version and is skipped.
    """
    prefix = f"{pkg.name}-v"
    versions = []
    for tag in _git(root, "tag", "--list", f"{prefix}*").stdout.split():
        try:
            versions.append(Version(tag[len(prefix) :]))
        except InvalidVersion:
            continue
    return sorted(versions)


# --------------------------------------------------------------------------- checks


def check_version(pkg: Package, released: Sequence[Version]) -> Version:
    try:
        version = Version(pkg.version)
    except InvalidVersion:
        raise ReleaseUsageError(
            f"{pkg.name}: __version__ {pkg.version!r} is not a PEP 440 version"
        ) from None
    if str(version) != pkg.version:
        raise ReleaseUsageError(
            f"{pkg.name}: write __version__ as {str(version)!r}, not {pkg.version!r} "
            "(the tag and the file names must agree)"
        )
    if version in released:
        raise ReleaseUsageError(
            f"{pkg.name} {version} is already released (tag {pkg.tag}): bump __version__ and "
            "add its CHANGELOG entry"
        )
    if released and version < released[-1]:
        raise ReleaseUsageError(
            f"{pkg.name} {version} is lower than its last release {released[-1]} "
            f"(tag {tag_name(pkg.name, str(released[-1]))}): bump __version__ above it"
        )
    return version


def _changelog_sections(text: str) -> list[tuple[str, list[str]]]:
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        elif line.startswith("# "):
            continue
        elif sections and line.strip():
            sections[-1][1].append(line)
    return sections


def _heading_version(heading: str) -> Version | None:
    """``0.1.0``, ``[0.1.0]``, ``v0.1.0``, ``0.1.0 (unreleased)``, ``0.1.0 - 2026-11-20``."""
    first = heading.split()[0].strip("[]") if heading.split() else ""
    try:
        return Version(first.removeprefix("v"))
    except InvalidVersion:
        return None


def check_changelog(pkg: Package, version: Version, first_release: bool) -> str:
    """The heading that documents ``version``.

    Accepted: a ``## <version>`` section (any suffix, e.g. the current ``(unreleased)``)
    with content. A first release may instead ship its ``## Unreleased`` section: before
    any release, everything in the file is that release. After one, changes still under
    ``## Unreleased`` would ship under the new version while claiming not to, so they
    must be moved under its heading.
    """
    rel = pkg.changelog.relative_to(pkg.path.parent.parent)
    if not pkg.changelog.is_file():
        raise ReleaseUsageError(f"{rel} is missing: add it with a '## {version}' section")
    sections = _changelog_sections(pkg.changelog.read_text())
    unreleased = [
        lines
        for heading, lines in sections
        if heading.strip("[]").lower() in (_UNRELEASED, f"{_UNRELEASED}:")
    ]
    pending = any(unreleased)
    for heading, lines in sections:
        if _heading_version(heading) == version:
            if not lines:
                raise ReleaseUsageError(
                    f"{rel}: '## {heading}' is empty: list what {version} changes"
                )
            if pending and not first_release:
                raise ReleaseUsageError(
                    f"{rel}: '## Unreleased' still lists changes this release ships: move "
                    f"them under '## {heading}'"
                )
            return heading
    if first_release and pending:
        return "Unreleased"
    hint = "retitle '## Unreleased' to" if pending else "add"
    raise ReleaseUsageError(
        f"{rel} has no entry for {version}: {hint} '## {version}' listing its changes"
    )


def _admits(req: Requirement, version: Version) -> bool:
    return req.specifier.contains(version, prereleases=True)


def check_siblings(
    pkg: Package,
    packages: dict[str, Package],
    in_run: set[str],
    released: dict[str, list[Version]],
) -> list[str]:
    """Refuse a release whose sibling ranges admit nothing installable; return warnings.

    Runtime dependencies must be satisfiable from the index once this run is done: by a
    sibling released with it, or by one already released. The tree's own sibling version
    must be admitted too (it is what the package was tested against). Extras are
    optional, so an extra whose sibling is not released yet is a warning.
    """
    warnings: list[str] = []
    groups: list[tuple[str | None, tuple[Requirement, ...]]] = [(None, pkg.dependencies)]
    groups += sorted(pkg.extras.items())
    for extra, reqs in groups:
        for req in reqs:
            dep = packages.get(canonicalize_name(req.name))
            if dep is None:
                continue
            usable(dep)
            where = f"{pkg.name}[{extra}]" if extra else pkg.name
            for wanted in req.extras:
                if wanted not in dep.extras:
                    raise ReleaseUsageError(
                        f"{where} requires {req}, but {dep.name} has no extra {wanted!r}: "
                        f"fix packages/{pkg.path.name}/pyproject.toml"
                    )
            tree = Version(dep.version)
            if not _admits(req, tree):
                raise ReleaseUsageError(
                    f"{where} requires {req}, which does not admit {dep.name} {tree} in this "
                    f"tree: widen the range in packages/{pkg.path.name}/pyproject.toml"
                )
            if dep.key in in_run:
                continue
            ok = [v for v in released.get(dep.key, []) if _admits(req, v)]
            if ok:
                continue
            have = ", ".join(str(v) for v in released.get(dep.key, [])) or "none"
            if extra:
                warnings.append(
                    f"{where} needs {req}, which is not on the index (released: {have}): "
                    f"`pip install '{pkg.name}[{extra}]'` fails until {dep.name} is released"
                )
                continue
            raise ReleaseUsageError(
                f"{pkg.name} needs {req}, which is not released yet (released: {have}): "
                f'release {dep.name} first (nox -s "release({dep.name})") or with it '
                f"(--with {dep.name})"
            )
    return warnings


def release_order(names: Iterable[str], packages: dict[str, Package]) -> list[str]:
    """The run's packages with every sibling dependency before its dependents."""
    run = set(names)
    order: list[str] = []
    visiting: set[str] = set()

    def visit(key: str) -> None:
        if key in order or key in visiting:
            return
        visiting.add(key)
        pkg = packages[key]
        for req in pkg.dependencies + tuple(r for rs in pkg.extras.values() for r in rs):
            dep = canonicalize_name(req.name)
            if dep in run and dep != key:
                visit(dep)
        visiting.discard(key)
        order.append(key)

    for key in sorted(run):
        visit(key)
    return order


def unreleased_runtime_deps(
    start: Iterable[str], packages: dict[str, Package], released: dict[str, list[Version]]
) -> set[str]:
    """Siblings reached through runtime dependencies whose tree version has no tag yet."""
    found: set[str] = set()
    todo = list(start)
    while todo:
        pkg = packages[todo.pop()]
        for req in pkg.dependencies:
            dep = packages.get(canonicalize_name(req.name))
            if dep is None or dep.key in found:
                continue
            if Version(usable(dep).version) not in released.get(dep.key, []):
                found.add(dep.key)
                todo.append(dep.key)
    return found


def check_repository_url(url: str) -> str:
    """Refuse URLs that would leak: credentials in them, or a token over plain http."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ReleaseUsageError(
            f"--repository-url {redact_url(url)!r} is not an http(s) URL, e.g. {DEFAULT_REPOSITORY_URL}"
        )
    # Userinfo or a credential query parameter (judged by the one redactor): either would
    # be printed by every tool that echoes the URL.
    if parts.username is not None or parts.password is not None or redact_url(url) != url:
        raise ReleaseUsageError(
            f"--repository-url {redact_url(url)} carries credentials: remove them and put the "
            f"token in ${DEFAULT_TOKEN_ENV}"
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise ReleaseUsageError(
            f"--repository-url {redact_url(url)} is plain http to {parts.hostname}: the token "
            "would travel unencrypted; use https"
        )
    return url


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_names(names: Iterable[str], packages: dict[str, Package]) -> list[str]:
    keys: list[str] = []
    for name in names:
        key = canonicalize_name(name)
        if key not in packages:
            known = ", ".join(p.name for p in packages.values())
            raise ReleaseUsageError(f"unknown package {name!r}: choose one of {known}")
        if key not in keys:
            keys.append(key)
    return keys


def _need_module(module: str, why: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ReleaseEnvironmentError(
            f"{module} is not installed ({why}): run the nox session or "
            "pip install -r tools/release-requirements.txt"
        )


# --------------------------------------------------------------------------- build, upload, tag


def _run_tool(
    args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    # Wide and plain: twine's rich output wraps at 80 columns, splitting the index's answer.
    full_env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "400", **(env or {})}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=1800,
        check=False,
    )


def _tail(proc: subprocess.CompletedProcess[str], secrets: Sequence[str]) -> str:
    """The line of a tool's output that says what went wrong, redacted.

    The whole output is redacted before a line is picked: a secret the tool wrapped over
    several lines is only recognisable as a whole, never from one of its lines alone.
    """
    text = redact(_ANSI.sub("", f"{proc.stdout}\n{proc.stderr}"), secrets)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    marked = [ln for ln in lines if re.search(r"\b(ERROR|FAILED|Error|error)\b", ln)]
    pick = (marked or lines or [f"exit code {proc.returncode}"])[-1]
    return redact(re.sub(r"^(ERROR|WARNING)\s+", "", pick), secrets)


def build(pkg: Package, outdir: Path) -> list[Path]:
    """sdist, then the wheel built from that sdist (what pip on a user's machine gets)."""
    # No isolation: the backend is the one pinned in tools/release-requirements.txt, not
    # whatever `hatchling>=1.25` resolves to on release day (and 4x faster).
    proc = _run_tool(["-m", "build", "--no-isolation", "--outdir", str(outdir), str(pkg.path)])
    log.debug("%s", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        missing = re.search(
            r"Missing dependencies:\s*(.+)", _ANSI.sub("", proc.stdout + proc.stderr)
        )
        if missing:
            raise ReleaseEnvironmentError(
                f"packages/{pkg.path.name} needs the build requirement {missing.group(1).strip()}"
                ", which is not installed: pin it in tools/release-requirements.txt"
            )
        raise ReleaseError(f"building {pkg.name} {pkg.version} failed: {_tail(proc, [])}")
    stem = f"{canonicalize_name(pkg.name).replace('-', '_')}-{pkg.version}"
    files = sorted(outdir.iterdir())
    sdists = [f for f in files if f.name == f"{stem}.tar.gz"]
    wheels = [f for f in files if f.name.startswith(f"{stem}-") and f.name.endswith(".whl")]
    if len(sdists) != 1 or len(wheels) != 1 or len(files) != 2:
        raise ReleaseError(
            f"building {pkg.name} made {', '.join(f.name for f in files) or 'nothing'}; expected "
            f"{stem}.tar.gz and one {stem}-*.whl (does the build read __version__?)"
        )
    return [sdists[0], wheels[0]]


def twine_check(pkg: Package, files: Sequence[Path]) -> None:
    proc = _run_tool(["-m", "twine", "check", "--strict", *map(str, files)])
    if proc.returncode != 0:
        raise ReleaseError(
            f"twine check --strict refused {pkg.name} {pkg.version}: {_tail(proc, [])}"
        )


def upload(pkg: Package, files: Sequence[Path], url: str, username: str, token: str) -> None:
    # Credentials go through twine's environment, never its argv (which ps shows).
    env = {
        "TWINE_USERNAME": username,
        "TWINE_PASSWORD": token,
        "TWINE_NON_INTERACTIVE": "1",
        "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring",
    }
    # --verbose: the index's answer (e.g. "already exists") is only printed then; twine
    # shows the password as <hidden>, and everything is redacted anyway.
    proc = _run_tool(
        [
            "-m",
            "twine",
            "upload",
            "--verbose",
            "--non-interactive",
            "--disable-progress-bar",
            "--repository-url",
            url,
            *map(str, files),
        ],
        env=env,
    )
    output = _ANSI.sub("", proc.stdout + proc.stderr)
    log.debug("%s", redact(output, [token]))
    if proc.returncode == 0:
        return
    reason = _tail(proc, [token])
    where = redact_url(url, [token])
    if re.search(r"already\s+exists", output, re.IGNORECASE):
        raise ReleaseError(
            f"{pkg.name} {pkg.version} is already on {where}: an index takes a version once; "
            "bump __version__"
        )
    if re.search(r"\b(401|403)\b", reason):
        raise ReleaseError(
            f"{where} refused the upload token for {pkg.name} {pkg.version} ({reason}): "
            f"check the token in the environment and its scope"
        )
    raise ReleaseError(f"uploading {pkg.name} {pkg.version} to {where} failed: {reason}")


def create_tag(root: Path, pkg: Package, commit: str) -> None:
    message = f"{pkg.name} {pkg.version}"
    proc = _git(root, "tag", "-a", pkg.tag, "-m", message, commit, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReleaseError(
            f"{pkg.name} {pkg.version} was uploaded but tagging failed ({detail}): create it "
            f"with git tag -a {pkg.tag} -m '{message}' {commit[:12]}"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- the flow


def release(
    names: Sequence[str],
    *,
    root: Path = ROOT,
    dry_run: bool = False,
    repository_url: str = DEFAULT_REPOSITORY_URL,
    token: str | None = None,
    username: str = DEFAULT_USERNAME,
    with_deps: bool = False,
    allow_dirty: bool = False,
    token_env: str = DEFAULT_TOKEN_ENV,
) -> tuple[list[PackageResult], list[str]]:
    """Check, build, check metadata, upload and tag ``names`` (in dependency order).

    Every refusal comes before the first build; build output lives in a temporary folder
    that is removed whatever happens; each package is tagged right after its upload, so
    what is on the index and what is tagged agree even when a later package fails.
    """
    if allow_dirty and not dry_run:
        raise ReleaseUsageError("--allow-dirty is for --dry-run only: a release tags a clean tree")
    if not names:
        raise ReleaseUsageError("name at least one package to release")
    check_repository_url(repository_url)
    check_git_repo(root)
    packages = discover(root)
    keys = resolve_names(names, packages)
    dirty = dirty_paths(root)
    if dirty and not allow_dirty:
        shown = ", ".join(dirty[:3]) + (f" and {len(dirty) - 3} more" if len(dirty) > 3 else "")
        raise ReleaseUsageError(
            f"the working tree has uncommitted changes ({shown}): commit or stash them; a "
            "release builds exactly what its tag records"
        )
    if not dry_run:
        if not token:
            raise ReleaseEnvironmentError(
                f"no upload token: set ${token_env} (an API token for the index) or use --dry-run"
            )
        if _git(root, "var", "GIT_COMMITTER_IDENT", check=False).returncode != 0:
            raise ReleaseEnvironmentError(
                "git has no identity for the release tag: set user.name and user.email"
            )
        if _git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
            raise ReleaseUsageError(
                "this clone is shallow, so earlier release tags may be missing: run "
                "git fetch --unshallow --tags first"
            )
    # The commit that was checked is the one tagged, even if HEAD moves meanwhile.
    head = _git(root, "rev-parse", "HEAD").stdout.strip()
    for key in keys:
        usable(packages[key])
    released = {key: released_versions(root, pkg) for key, pkg in packages.items()}
    if with_deps:
        keys += sorted(unreleased_runtime_deps(keys, packages, released) - set(keys))
    order = release_order(keys, packages)
    in_run = set(order)

    results: list[PackageResult] = []
    warnings: list[str] = []
    for key in order:
        pkg = packages[key]
        version = check_version(pkg, released[key])
        heading = check_changelog(pkg, version, first_release=not released[key])
        warnings += check_siblings(pkg, packages, in_run, released)
        previous = str(released[key][-1]) if released[key] else None
        results.append(PackageResult(pkg.name, pkg.version, pkg.tag, previous, heading))
    _need_module("build", "it builds the sdist and wheel")
    _need_module("hatchling", "the packages' build backend")
    _need_module("twine", "it checks the metadata and uploads")

    for warning in warnings:
        log.warning("warning: %s", warning)
    if dirty:
        log.warning(
            "warning: --allow-dirty: the files below include %d uncommitted change(s)", len(dirty)
        )
    for res in results:
        since = f"after {res.previous_release}" if res.previous_release else "first release"
        log.info("%s %s: %s; CHANGELOG '## %s'", res.name, res.version, since, res.changelog)

    with tempfile.TemporaryDirectory(prefix="pypto-release-") as tmp:
        built: dict[str, list[Path]] = {}
        for key, res in zip(order, results, strict=True):
            pkg = packages[key]
            files = build(pkg, Path(tmp) / key)
            twine_check(pkg, files)
            built[key] = files
            res.files = [
                {"name": f.name, "sha256": _sha256(f), "size": f.stat().st_size} for f in files
            ]
            log.info(
                "%s %s: built %s; twine check --strict passed",
                pkg.name,
                pkg.version,
                ", ".join(f.name for f in files),
            )
        new = sorted(set(dirty_paths(root)) - set(dirty))
        if new:
            raise ReleaseError(
                f"the tree changed during the build ({', '.join(new[:3])}): nothing was "
                "uploaded; clean it and run again"
            )
        where = redact_url(repository_url, [token])
        if dry_run:
            log.info(
                "dry run: would upload %d file(s) to %s and create %s; nothing uploaded, "
                "nothing tagged",
                sum(len(f) for f in built.values()),
                where,
                ", ".join(r.tag for r in results),
            )
            return results, warnings
        assert token is not None
        for key, res in zip(order, results, strict=True):
            pkg = packages[key]
            try:
                upload(pkg, built[key], repository_url, username, token)
                res.uploaded = True
                log.info("%s %s: uploaded to %s", pkg.name, pkg.version, where)
                create_tag(root, pkg, head)
            except ReleaseError as exc:
                done = [f"{r.name} {r.version}" for r in results if r.tagged]
                if done:
                    raise ReleaseError(
                        f"{exc} (released and tagged before it: {', '.join(done)})"
                    ) from None
                raise
            res.tagged = True
            log.info(
                "%s %s: tagged %s (push it: git push origin %s)",
                pkg.name,
                pkg.version,
                pkg.tag,
                pkg.tag,
            )
    return results, warnings


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code}  {name}: {meaning}" for code, name, meaning in EXIT_CODES)
    p = argparse.ArgumentParser(
        prog="release",
        description=(
            "Release packages of this repo: check version, CHANGELOG and sibling ranges, build "
            "sdist+wheel, twine check --strict, upload, tag <dist-name>-v<version>."
        ),
        epilog=(
            f"The upload token is read from ${DEFAULT_TOKEN_ENV} (or --token-env), never from "
            "the command line. stdout: the created tags, one a line (--json: one JSON "
            "document); progress and errors on stderr.\n\nexit codes:\n" + codes
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("packages", nargs="+", metavar="PACKAGE", help="dist name, e.g. pypto-capture")
    p.add_argument(
        "--with",
        dest="with_",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="release this sibling in the same run (repeatable); siblings go first",
    )
    p.add_argument(
        "--with-deps",
        action="store_true",
        help="also release every sibling runtime dependency whose tree version has no tag yet",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="every check and the build, but no upload or tag"
    )
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="with --dry-run only: check a tree with uncommitted changes",
    )
    p.add_argument(
        "--repository-url",
        default=DEFAULT_REPOSITORY_URL,
        help=f"upload endpoint (default {DEFAULT_REPOSITORY_URL}); no credentials in it",
    )
    p.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        metavar="NAME",
        help=f"environment variable holding the upload token (default {DEFAULT_TOKEN_ENV})",
    )
    p.add_argument(
        "--username",
        default=DEFAULT_USERNAME,
        help=f"user name sent with the token (default {DEFAULT_USERNAME}, what PyPI expects)",
    )
    p.add_argument("--root", type=Path, default=ROOT, help="repo checkout (default: this one)")
    p.add_argument("--json", action="store_true", help="stdout: one JSON document")
    p.add_argument("-v", "--verbose", action="count", default=0, help="tool output too")
    p.add_argument("-q", "--quiet", action="store_true", help="errors only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    token = os.environ.get(args.token_env) or None
    secrets = [token] if token else []
    verbosity = -1 if args.quiet else args.verbose
    with cli_logging([LOGGER], verbosity, secrets=secrets):
        try:
            results, warnings = release(
                [*args.packages, *args.with_],
                root=args.root.resolve(),
                dry_run=args.dry_run,
                repository_url=args.repository_url,
                token=token,
                username=args.username,
                with_deps=args.with_deps,
                allow_dirty=args.allow_dirty,
                token_env=args.token_env,
            )
        except ReleaseError as exc:
            sys.stderr.write(f"release: error: {redact(str(exc), secrets)}\n")
            if args.json:
                doc = {"schema_version": SCHEMA_VERSION, "error": redact(str(exc), secrets)}
                sys.stdout.write(json.dumps({**doc, "exit_code": exc.exit_code}) + "\n")
            return exc.exit_code
        except subprocess.TimeoutExpired as exc:
            step = " ".join(str(a) for a in exc.cmd[1:4])
            sys.stderr.write(f"release: error: {step} timed out after {exc.timeout:.0f} s\n")
            return FAILED
    if args.json:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "dry_run": args.dry_run,
            "repository_url": redact_url(args.repository_url, secrets),
            "packages": [r.to_dict() for r in results],
            "warnings": [redact(w, secrets) for w in warnings],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        for res in results:
            if res.tagged:
                sys.stdout.write(res.tag + "\n")
    return OK


if __name__ == "__main__":
    sys.exit(main())
