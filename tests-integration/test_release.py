"""The per-package release flow (tools/release.py, ``nox -s "release(<package>)"``).

Two parts. The fast one runs the tool in process on a two-package repo made in a temporary
git repository: every refusal (unknown package, dirty tree, unbumped version, missing
CHANGELOG entry, a sibling not released or not admitted, a URL that would leak the token,
no token) is one line with the code by name, and leaves tags, tree and temp folder as they
were.

The loopback part releases the real packages, copied from this checkout into a temporary
git repository (the real repo's tags and tree are never touched), to a real pypiserver on
127.0.0.1 that demands a token for uploads; then installs them in a fresh venv that has
only torch, with pypto packages coming from that index alone, and runs them. The token
must not appear in any output or file.
"""

from __future__ import annotations

import base64
import http.server
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote

import pytest

from pypto_common import ENVIRONMENT, FAILED, OK, USAGE

ROOT = Path(__file__).resolve().parent.parent
TORCH_PIN = "torch==2.13.0"  # an open range pulls a multi-GB CUDA build
TOKEN_ENV = "PYPTO_RELEASE_TOKEN"


def _load_tool():
    spec = importlib.util.spec_from_file_location(
        "pypto_release_tool", ROOT / "tools" / "release.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


rel = _load_tool()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def _init_repo(repo: Path) -> None:
    _git(repo, "init", "-q")
    for key, value in (
        ("user.name", "pypto release test"),
        ("user.email", "release-test@example.invalid"),
        ("commit.gpgsign", "false"),
        ("tag.gpgsign", "false"),
    ):
        _git(repo, "config", key, value)
    _commit(repo, "snapshot")


def _commit(repo: Path, message: str) -> None:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)


# --------------------------------------------------------------------------- fast: a tiny repo


def _write_package(
    root: Path, name: str, version: str, deps: tuple[str, ...] = (), changelog: str = ""
) -> Path:
    module = name.replace("-", "_")
    pkg = root / "packages" / name
    (pkg / "src" / module).mkdir(parents=True, exist_ok=True)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["hatchling>=1.25"]
            build-backend = "hatchling.build"

            [project]
            name = "{name}"
            dynamic = ["version"]
            description = "A package of the release tests."
            readme = "README.md"
            requires-python = ">=3.10"
            dependencies = {json.dumps(list(deps))}

            [tool.hatch.version]
            path = "src/{module}/__init__.py"
            """
        )
    )
    _set_version(root, name, version)
    (pkg / "README.md").write_text(f"# {name}\n")
    (pkg / "CHANGELOG.md").write_text(
        "# Changelog\n\n" + (changelog or f"## {version}\n- First release.\n")
    )
    return pkg


def _set_version(root: Path, name: str, version: str) -> None:
    module = name.replace("-", "_")
    (root / "packages" / name / "src" / module / "__init__.py").write_text(
        f'"""{name}."""\n\n__version__ = "{version}"\n'
    )


@pytest.fixture
def mini(tmp_path: Path) -> Path:
    """pypto-alpha 0.1.0 and pypto-beta 0.1.0 (needs pypto-alpha>=0.1,<0.2), committed."""
    repo = tmp_path / "repo"
    _write_package(repo, "pypto-alpha", "0.1.0")
    _write_package(repo, "pypto-beta", "0.1.0", deps=("pypto-alpha>=0.1,<0.2",))
    _init_repo(repo)
    return repo


def _state(repo: Path) -> tuple[object, ...]:
    """Everything a refused release must leave as it was."""
    files = sorted(
        (str(p.relative_to(repo)), p.stat().st_mtime_ns)
        for p in repo.rglob("*")
        if ".git" not in p.relative_to(repo).parts
    )
    temps = sorted(Path(tempfile.gettempdir()).glob("pypto-release-*"))
    return (
        _git(repo, "tag", "--list"),
        _git(repo, "status", "--porcelain", "--ignored", "--untracked-files=all"),
        _git(repo, "rev-parse", "HEAD"),
        files,
        temps,
    )


def _refused(capsys, repo: Path, argv: list[str], code: int) -> str:
    """Run the tool in process; assert the code, one stderr line, and nothing changed."""
    before = _state(repo)
    rc = rel.main([*argv, "--root", str(repo)])
    out, err = capsys.readouterr()
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("release: error: ")
    assert out == ""
    assert _state(repo) == before
    return lines[0]


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def test_unknown_package_is_refused_naming_the_known_ones(capsys, mini):
    line = _refused(capsys, mini, ["pypto-gamma", "--dry-run"], USAGE)
    assert "unknown package 'pypto-gamma'" in line
    assert "pypto-alpha, pypto-beta" in line


@pytest.mark.parametrize("change", ["modified", "untracked", "staged"])
def test_a_dirty_tree_is_refused(capsys, mini, change):
    target = mini / "packages" / "pypto-alpha" / "README.md"
    if change == "modified":
        target.write_text("# edited\n")
    elif change == "untracked":
        (mini / "packages" / "pypto-alpha" / "src" / "pypto_alpha" / "extra.py").write_text("")
    else:
        target.write_text("# staged\n")
        _git(mini, "add", str(target))
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run"], USAGE)
    assert "uncommitted changes (packages/pypto-alpha/" in line


def test_allow_dirty_is_for_dry_runs_only(capsys, mini, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "pypi-not-used-1234")
    line = _refused(capsys, mini, ["pypto-alpha", "--allow-dirty"], USAGE)
    assert "--dry-run only" in line


def test_an_already_released_version_is_refused(capsys, mini):
    _git(mini, "tag", "pypto-alpha-v0.1.0")
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run"], USAGE)
    assert "pypto-alpha 0.1.0 is already released (tag pypto-alpha-v0.1.0): bump" in line


def test_a_version_below_the_last_release_is_refused(capsys, mini):
    _git(mini, "tag", "pypto-alpha-v0.2.0")
    # A tag of another package sharing the prefix is not one of alpha's releases.
    _git(mini, "tag", "pypto-alpha-vision-v9.0.0")
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run"], USAGE)
    assert "lower than its last release 0.2.0" in line


def test_a_bump_without_a_changelog_entry_is_refused(capsys, mini):
    _git(mini, "tag", "pypto-alpha-v0.1.0")
    _set_version(mini, "pypto-alpha", "0.2.0")
    _commit(mini, "bump")
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run"], USAGE)
    assert "CHANGELOG.md has no entry for 0.2.0: add '## 0.2.0'" in line


def test_after_a_release_unreleased_entries_must_move_under_the_version(capsys, mini):
    _git(mini, "tag", "pypto-alpha-v0.1.0")
    _set_version(mini, "pypto-alpha", "0.2.0")
    changelog = mini / "packages" / "pypto-alpha" / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## Unreleased\n- New thing.\n\n## 0.1.0\n- First.\n")
    _commit(mini, "bump, entry left under Unreleased")
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run"], USAGE)
    assert "retitle '## Unreleased' to '## 0.2.0'" in line

    changelog.write_text(
        "# Changelog\n\n## Unreleased\n- Later.\n\n## 0.2.0\n- New.\n\n## 0.1.0\n- First.\n"
    )
    _commit(mini, "entry, but Unreleased still lists shipped changes")
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run"], USAGE)
    assert "'## Unreleased' still lists changes this release ships" in line


def test_a_sibling_that_is_not_released_must_go_first_and_the_tool_says_so(capsys, mini):
    line = _refused(capsys, mini, ["pypto-beta", "--dry-run"], USAGE)
    assert "pypto-beta needs pypto-alpha>=0.1,<0.2, which is not released yet" in line
    assert 'release pypto-alpha first (nox -s "release(pypto-alpha)")' in line
    assert "(--with pypto-alpha)" in line


def test_a_sibling_range_that_does_not_admit_the_tree_version_is_refused(capsys, mini):
    pyproject = mini / "packages" / "pypto-beta" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(">=0.1,<0.2", ">=0.2,<0.3"))
    _commit(mini, "range ahead of alpha")
    line = _refused(capsys, mini, ["pypto-beta", "--with", "pypto-alpha", "--dry-run"], USAGE)
    assert "requires pypto-alpha>=0.2,<0.3, which does not admit pypto-alpha 0.1.0" in line


def test_a_range_admitting_only_an_unreleased_sibling_version_is_refused(capsys, mini):
    _git(mini, "tag", "pypto-alpha-v0.1.0")
    _set_version(mini, "pypto-alpha", "0.2.0")
    changelog = mini / "packages" / "pypto-alpha" / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## 0.2.0\n- New.\n\n## 0.1.0\n- First.\n")
    pyproject = mini / "packages" / "pypto-beta" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(">=0.1,<0.2", ">=0.2,<0.3"))
    _commit(mini, "beta needs alpha 0.2")
    line = _refused(capsys, mini, ["pypto-beta", "--dry-run"], USAGE)
    assert "not released yet (released: 0.1.0): release pypto-alpha first" in line


@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_a_repository_url_with_credentials_is_refused_and_masked(capsys, mini, form):
    secret = "pypi-" + secrets.token_urlsafe(16)
    url = (
        f"http://__token__:{secret}@127.0.0.1:9/"
        if form == "userinfo"
        else f"https://index.example.com/legacy/?token={secret}"
    )
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run", "--repository-url", url], USAGE)
    assert "carries credentials" in line
    assert secret not in line


def test_plain_http_to_a_remote_index_is_refused(capsys, mini):
    url = "http://index.example.com/legacy/"
    line = _refused(capsys, mini, ["pypto-alpha", "--dry-run", "--repository-url", url], USAGE)
    assert "use https" in line


def test_a_release_without_a_token_is_an_environment_error(capsys, mini):
    line = _refused(capsys, mini, ["pypto-alpha"], ENVIRONMENT)
    assert f"no upload token: set ${TOKEN_ENV}" in line


def test_a_release_from_a_shallow_clone_is_refused(capsys, mini, tmp_path, monkeypatch):
    shallow = tmp_path / "shallow"
    _git(tmp_path, "clone", "-q", "--depth", "1", mini.as_uri(), str(shallow))
    _git(shallow, "config", "user.name", "pypto release test")
    _git(shallow, "config", "user.email", "release-test@example.invalid")
    monkeypatch.setenv(TOKEN_ENV, "pypi-not-used-1234")
    line = _refused(capsys, shallow, ["pypto-alpha"], USAGE)
    assert "git fetch --unshallow --tags" in line


def test_a_half_written_neighbour_blocks_only_runs_that_need_it(capsys, mini):
    broken = mini / "packages" / "pypto-broken"
    broken.mkdir()
    (broken / "pyproject.toml").write_text(
        '[project]\nname = "pypto-broken"\ndynamic = ["version"]\n'
        '[tool.hatch.version]\npath = "src/pypto_broken/__init__.py"\n'
    )
    _commit(mini, "a package without its version file yet")
    line = _refused(capsys, mini, ["pypto-broken", "--dry-run"], USAGE)
    assert "pypto_broken/__init__.py: no `__version__" in line
    rc = rel.main(["pypto-alpha", "--dry-run", "--root", str(mini)])
    _, err = capsys.readouterr()
    # Past every check: done, or stopped only because this environment lacks the build tools.
    assert rc in (OK, ENVIRONMENT), err
    assert "pypto-broken" not in err


def test_changelog_headings_in_use_are_accepted():
    pkg = rel.load_package(ROOT / "packages" / "pypto-capture")
    heading = rel.check_changelog(pkg, rel.Version(pkg.version), first_release=True)
    assert heading.split()[0] == pkg.version
    assert rel._heading_version("0.1.0 (unreleased)") == rel.Version("0.1.0")
    assert rel._heading_version("[0.2.0] - 2026-11-20") == rel.Version("0.2.0")
    assert rel._heading_version("Unreleased") is None


def test_first_release_may_ship_its_unreleased_section_but_not_an_empty_one(tmp_path):
    pkg_dir = _write_package(
        tmp_path, "pypto-alpha", "0.1.0", changelog="## Unreleased\n- First version.\n"
    )
    pkg = rel.load_package(pkg_dir)
    assert rel.check_changelog(pkg, rel.Version("0.1.0"), first_release=True) == "Unreleased"
    with pytest.raises(rel.ReleaseUsageError, match=r"no entry for 0\.1\.0"):
        rel.check_changelog(pkg, rel.Version("0.1.0"), first_release=False)
    (pkg_dir / "CHANGELOG.md").write_text("# Changelog\n\n## 0.1.0\n\n## 0.0.1\n- old\n")
    with pytest.raises(rel.ReleaseUsageError, match=r"'## 0.1.0' is empty"):
        rel.check_changelog(pkg, rel.Version("0.1.0"), first_release=True)


def test_every_package_of_this_repo_passes_the_checks_when_released_together():
    """The checks behind ``--dry-run`` for the real tree (the build runs in the loopback part)."""
    packages = rel.discover(ROOT)
    assert {"pypto-capture", "pypto-common", "pypto-download", "pypto-patch"} <= set(packages)
    order = rel.release_order(packages, packages)
    for key in order:
        pkg = rel.usable(packages[key])
        version = rel.check_version(pkg, [])
        rel.check_changelog(pkg, version, first_release=True)
        assert rel.check_siblings(pkg, packages, set(order), {}) == []
    # Siblings come before the packages that need them.
    assert order.index("pypto-common") < order.index("pypto-download")
    assert order.index("pypto-capture") < order.index("pypto-bench")
    need = rel.unreleased_runtime_deps(["pypto-e2e"], packages, {})
    assert {"pypto-common", "pypto-download", "pypto-patch", "pypto-bench", "pypto-capture"} <= need


# --------------------------------------------------------------------------- loopback index


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _copy_tree(dest: Path) -> None:
    """This checkout's tracked and unignored files (what would be committed), as a new repo."""
    listed = _git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for rel_path in sorted(set(filter(None, listed.split("\0")))):
        src = ROOT / rel_path
        if not src.is_file() and not src.is_symlink():
            continue  # deleted in the working tree
        target = dest / rel_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    _init_repo(dest)


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return path / "bin" / "python"


def _pip(python: Path, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@dataclass
class Loopback:
    """The released-into world: a repo copy, the release tools, an index, a target venv."""

    repo: Path
    tools_python: Path
    url: str
    index_dir: Path
    index_log: Path
    tmpdir: Path
    token: str
    work: Path
    outputs: list[str] = field(default_factory=list)

    @property
    def simple(self) -> str:
        return self.url + "simple/"

    def release(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        env["PYPTO_RELEASE_TOKEN"] = self.token if token is None else token
        env["TMPDIR"] = str(self.tmpdir)
        proc = subprocess.run(
            [
                str(self.tools_python),
                str(self.repo / "tools" / "release.py"),
                *args,
                "--repository-url",
                self.url,
            ],
            cwd=self.repo,
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        self.outputs.append(proc.stdout + proc.stderr)
        print(f"$ python tools/release.py {' '.join(args)}", proc.stdout, proc.stderr, sep="\n")
        assert list(self.tmpdir.iterdir()) == [], "the release left files in the temp folder"
        return proc

    def ensure_released(self, name: str) -> None:
        version = rel.load_package(self.repo / "packages" / name).version
        if f"{name}-v{version}" not in self.tags():
            proc = self.release(name, "--with-deps")  # and its unreleased siblings
            assert proc.returncode == OK, proc.stderr

    def tags(self) -> list[str]:
        return _git(self.repo, "tag", "--list").split()

    def index_files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.index_dir.iterdir())}


@pytest.fixture(scope="module")
def tools_python(tmp_path_factory) -> Path:
    """A venv with exactly what the release tool runs (build, hatchling, twine), the
    loopback index, and this checkout's pypto-common."""
    python = _venv(tmp_path_factory.mktemp("release-tools") / "venv")
    _pip(python, "-r", str(ROOT / "tools" / "release-test-requirements.txt"))
    _pip(python, str(ROOT / "packages" / "pypto-common"))
    return python


@pytest.fixture(scope="module")
def loopback(tmp_path_factory, tools_python):
    work = tmp_path_factory.mktemp("release")
    repo = work / "repo"
    _copy_tree(repo)

    token = "pypi-" + secrets.token_urlsafe(32)
    htpasswd = work / "htpasswd"
    subprocess.run(
        [
            str(tools_python),
            "-c",
            "import os, sys; from passlib.apache import HtpasswdFile; "
            "h = HtpasswdFile(sys.argv[1], new=True, default_scheme='apr_md5_crypt'); "
            "h.set_password('__token__', os.environ['TOKEN']); h.save()",
            str(htpasswd),
        ],
        check=True,
        env={**os.environ, "TOKEN": token},
        timeout=120,
    )
    index_dir = work / "index"
    index_dir.mkdir()
    port = _free_port()
    index_log = work / "pypiserver.log"
    server = subprocess.Popen(
        [
            str(tools_python.parent / "pypi-server"),
            "run",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--authenticate",
            "update",
            "--passwords",
            str(htpasswd),
            "--disable-fallback",  # never redirect a missing name to pypi.org
            "--hash-algo",
            "sha256",
            str(index_dir),
        ],
        stdout=index_log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, index_log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(url + "health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        tmpdir = work / "tmp"
        tmpdir.mkdir()
        yield Loopback(repo, tools_python, url, index_dir, index_log, tmpdir, token, work)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def target(loopback):
    """A fresh venv holding torch (pinned) and nothing else: where users install a package."""
    # Left to pytest's temp-folder rotation: deleting ~1 GB of torch costs a minute here.
    python = _venv(loopback.work / "target-venv")
    _pip(python, TORCH_PIN)
    return python


def _pip_from_local_index(python: Path, loopback: Loopback, *reqs: str) -> str:
    """Install from the loopback index alone: no config files, find-links or extra indexes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    out = _pip(
        python,
        "--no-cache-dir",
        "--only-binary=:all:",
        "--index-url",
        loopback.simple,
        *reqs,
        env=env,
    )
    print(out)
    # One index, no find-links: nothing else could have supplied a pypto package.
    assert f"Looking in indexes: {loopback.simple}" in out.splitlines()
    assert "Looking in links" not in out
    return out


def _installed(python: Path) -> dict[str, str]:
    proc = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    )
    return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(proc.stdout)}


def _third_party_runtime_deps(repo: Path, *names: str) -> list[str]:
    reqs: list[str] = []
    for name in names:
        project = tomllib.loads((repo / "packages" / name / "pyproject.toml").read_text())[
            "project"
        ]
        for req in project.get("dependencies", []):
            dep = rel.Req(req)
            if not dep.name.startswith("pypto-") and (dep.marker is None or dep.marker.evaluate()):
                reqs.append(TORCH_PIN if dep.name == "torch" else req)
    return reqs


@pytest.mark.slow
def test_every_package_builds_and_passes_twine_check_in_one_dry_run(loopback):
    names = sorted(rel.discover(loopback.repo))
    before = loopback.index_files()
    proc = loopback.release(*names, "--dry-run", "--json")
    assert proc.returncode == OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["dry_run"] is True
    assert sorted(p["name"] for p in doc["packages"]) == names
    for entry in doc["packages"]:
        assert [f["name"].endswith((".tar.gz", ".whl")) for f in entry["files"]] == [True, True]
        assert entry["uploaded"] is False
        assert entry["tagged"] is False
    assert "nothing uploaded, nothing tagged" in proc.stderr
    assert loopback.tags() == []
    assert loopback.index_files() == before
    assert _git(loopback.repo, "status", "--porcelain") == ""


@pytest.mark.slow
def test_capture_waits_for_common_then_installs_from_the_index_next_to_torch_and_captures(
    loopback, target
):
    # pypto-capture needs pypto-common (stdlib only): refused until it is on the index.
    proc = loopback.release("pypto-capture", "--dry-run")
    assert proc.returncode == USAGE
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "release pypto-common first" in proc.stderr
    assert loopback.index_files() == {}
    loopback.ensure_released("pypto-common")
    common_files = loopback.index_files()

    proc = loopback.release("pypto-capture", "--dry-run")
    assert proc.returncode == OK, proc.stderr
    assert loopback.index_files() == common_files

    proc = loopback.release("pypto-capture")
    assert proc.returncode == OK, proc.stderr
    assert proc.stdout == "pypto-capture-v0.1.0\n"
    assert "pypto-capture-v0.1.0" in loopback.tags()
    assert sorted(set(loopback.index_files()) - set(common_files)) == [
        "pypto_capture-0.1.0-py3-none-any.whl",
        "pypto_capture-0.1.0.tar.gz",
    ]

    out = _pip_from_local_index(target, loopback, "pypto-capture==0.1.0")
    assert f"{loopback.url}packages/pypto_capture-0.1.0-py3-none-any.whl" in out
    installed = _installed(target)
    assert installed["pypto-capture"] == "0.1.0"
    assert sorted(n for n in installed if n.startswith("pypto")) == [
        "pypto-capture",
        "pypto-common",
    ]
    assert "transformers" not in installed

    script = textwrap.dedent(
        """\
        import sys
        import torch
        import pypto_capture as pc

        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        x = torch.randn(2, 8)
        with torch.no_grad():
            result = pc.capture_and_replay(lambda: module(x), warmup=1, replays=3)
            # CPU compile freezes and pre-packs the weights: the GEMM's rounding may differ
            # from eager's in the last bits (fp32), not more.
            torch.testing.assert_close(result.output, module(x), rtol=1e-5, atol=1e-6)
        assert "transformers" not in sys.modules
        print(pc.__version__, result.backend, len(result.times_s), pc.__file__)
        """
    )
    run = subprocess.run(
        [str(target), "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stderr[-3000:]
    version, backend, replays, location = run.stdout.split()
    assert (version, backend, replays) == ("0.1.0", "compile", "3")
    assert Path(location).is_relative_to(target.parent.parent)


@pytest.mark.slow
def test_download_and_patch_wait_for_common_then_install_from_the_index_and_run(
    loopback, target, tmp_path
):
    from pypto_download import EXIT as DOWNLOAD_EXIT
    from pypto_patch import EXIT as PATCH_EXIT

    if "pypto-common-v0.1.0" not in loopback.tags():  # run alone: the capture test did not
        before = loopback.index_files()
        proc = loopback.release("pypto-download")
        assert proc.returncode == USAGE
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        assert "release pypto-common first" in proc.stderr
        assert loopback.index_files() == before
        assert "pypto-download-v0.1.0" not in loopback.tags()
    loopback.ensure_released("pypto-common")

    for name in ("pypto-download", "pypto-patch"):
        proc = loopback.release(name)
        assert proc.returncode == OK, proc.stderr
        assert proc.stdout == f"{name}-v0.1.0\n"

    # Third-party dependencies from the normal index; every pypto package from ours alone.
    _pip(target, *_third_party_runtime_deps(loopback.repo, "pypto-download", "pypto-patch"))
    _pip_from_local_index(target, loopback, "pypto-download==0.1.0", "pypto-patch==0.1.0")
    installed = _installed(target)
    ours = {n: installed[n] for n in installed if n.startswith("pypto")}
    # pypto-capture is there when the capture test ran first in this process (same target);
    # alone, or on another worker, it is not: either way nothing else and all at 0.1.0.
    assert set(ours) - {"pypto-capture"} == {"pypto-common", "pypto-download", "pypto-patch"}
    assert set(ours.values()) == {"0.1.0"}

    bindir = target.parent
    for tool in ("pypto-download", "pypto-patch"):
        helped = subprocess.run(
            [str(bindir / tool), "--help"], capture_output=True, text=True, timeout=120
        )
        assert helped.returncode == 0, helped.stderr
        assert "usage:" in helped.stdout

    out_dir = tmp_path / "model"
    bad = subprocess.run(
        [str(bindir / "pypto-download"), "--model-id", "bad//id", "--output-dir", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(bad.stderr)
    assert bad.returncode == DOWNLOAD_EXIT.INVALID_MODEL_ID
    assert "malformed model id" in bad.stderr
    assert not out_dir.exists()

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    bad = subprocess.run(
        [
            str(bindir / "pypto-patch"),
            "apply",
            "--model-family",
            "no_such_family",
            "--model-path",
            str(folder),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(bad.stderr)
    assert bad.returncode == PATCH_EXIT.UNKNOWN_FAMILY
    assert "unknown model family 'no_such_family'" in bad.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]


@pytest.mark.slow
def test_a_second_release_of_an_unchanged_version_is_refused_by_the_tag_and_the_index(
    loopback,
):
    loopback.ensure_released("pypto-capture")
    files = loopback.index_files()

    proc = loopback.release("pypto-capture")
    assert proc.returncode == USAGE
    assert "pypto-capture 0.1.0 is already released (tag pypto-capture-v0.1.0)" in proc.stderr
    assert loopback.index_files() == files

    # Without the tag (a clone that lost it) the index still refuses the same files.
    _git(loopback.repo, "tag", "-d", "pypto-capture-v0.1.0")
    try:
        proc = loopback.release("pypto-capture")
        assert proc.returncode == FAILED
        assert proc.stderr.strip().splitlines()[-1].startswith("release: error: ")
        assert f"pypto-capture 0.1.0 is already on {loopback.url}" in proc.stderr
        assert "pypto-capture-v0.1.0" not in loopback.tags()
        assert loopback.index_files() == files
    finally:
        _git(loopback.repo, "tag", "-a", "pypto-capture-v0.1.0", "-m", "pypto-capture 0.1.0")


@pytest.mark.slow
def test_a_wrong_token_uploads_nothing_tags_nothing_and_is_never_printed(loopback):
    loopback.ensure_released("pypto-common")
    files = loopback.index_files()
    wrong = "pypi-" + secrets.token_urlsafe(24)
    proc = loopback.release("pypto-env", token=wrong)
    assert proc.returncode == FAILED
    assert "refused the upload token for pypto-env 0.1.0" in proc.stderr
    assert wrong not in proc.stdout + proc.stderr
    assert "pypto-env-v0.1.0" not in loopback.tags()
    assert loopback.index_files() == files


@pytest.mark.slow
def test_the_token_appears_in_no_output_and_no_file(loopback):
    loopback.ensure_released("pypto-capture")
    assert loopback.outputs
    for text in loopback.outputs:
        assert loopback.token not in text
    history = _git(loopback.repo, "log", "--all", "-p") + _git(
        loopback.repo, "for-each-ref", "--format=%(refname) %(contents)"
    )
    assert loopback.token not in history
    needle = loopback.token.encode()
    # The repo copy (tags and objects included), the index, its log, the temp folder.
    for base in (loopback.repo, loopback.index_dir, loopback.index_log, loopback.tmpdir):
        paths = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for path in paths:
            assert needle not in path.read_bytes(), path


@pytest.mark.skipif(
    shutil.which("nox") is None, reason="nox is not on PATH (the README installs it)"
)
@pytest.mark.parametrize(
    "posargs",
    [
        ["--dry-run", "pypi-" + "AgEIcHlwaS5vcmcCJGE0ZDk3ZTk4LWExYjItNGM1ZC05ZTZmLTAwMTEy" * 2],
        ["--token", "s3cr3t-value-1"],
        ["--repository-url", "https://__token__:s3cr3t-value-2@upload.example/legacy/"],
    ],
    ids=["bare-pypi-token", "token-flag", "url-credentials"],
)
def test_nox_release_refuses_a_credential_on_its_command_line_without_printing_it(
    posargs, tmp_path
):
    """nox prints every command it runs: the release session must stop before running
    anything when its arguments carry a credential, and nothing it prints may hold it."""
    proc = subprocess.run(
        ["nox", "-f", str(ROOT / "noxfile.py"), "--no-venv", "-s", "release(pypto-common)",
         "--", *posargs],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYPTO_RELEASE_TOKEN": ""},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "a credential is on the command line" in out
    for secret in ("AgEIcHlwaS5vcmc", "s3cr3t-value"):
        assert secret not in out
    assert "Running command" not in out
    assert "tools/release.py" not in out


# --------------------------------------------------------------------------- an index that echoes


class _EchoingIndex(http.server.BaseHTTPRequestHandler):
    """Refuses every upload with 403 and echoes the credentials back in every form a real
    server or proxy might: the header in the status line and the body, the decoded
    ``user:password``, the password alone, URL-encoded, and wrapped over lines."""

    seen: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_error(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        header = self.headers.get("Authorization", "")
        self.seen.append(header)
        decoded = base64.b64decode(header.split()[-1]).decode() if " " in header else ""
        password = decoded.partition(":")[2]
        body = "\n".join(
            [
                "fake-index-says: forbidden",
                f"you sent Authorization: {header}",
                f"which decodes to {decoded}",
                f"password={password} url-encoded={quote(password, safe='')}",
                f"base64 of the password alone: {base64.b64encode(password.encode()).decode()}",
                "wrapped at 29, indented:",
                textwrap.indent("\n".join(_chunks(f"credentials {decoded}", 29)), "    "),
                "wrapped at 80, prefixed:",
                "\n".join("| " + ln for ln in _chunks(f"Authorization: {header} refused", 80)),
            ]
        ).encode()
        self.send_response(403, f"Forbidden: {header} is not allowed")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _chunks(text: str, width: int) -> list[str]:
    return [text[i : i + width] for i in range(0, len(text), width)]


@pytest.fixture
def echoing_index():
    _EchoingIndex.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoingIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/legacy/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _leaks(text: str, token: str) -> list[str]:
    """Every form of ``token`` found in ``text``: an 8-character piece of it, of its
    base64 (alone or after ``__token__:``, the part the token decides), of its
    URL-encoding."""
    basic = base64.b64encode(f"__token__:{token}".encode()).decode()
    decided = basic[16:]  # "__token__:" is 10 bytes: the groups from byte 12 on are the token's
    alone = base64.b64encode(token.encode()).decode()[:-4]
    forms = (token, quote(token, safe=""), alone, decided)
    return [f[i : i + 8] for f in forms for i in range(len(f) - 7) if f[i : i + 8] in text]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["-v"], ["-vv"], ["--json"], ["--json", "-vv"]])
def test_the_token_never_prints_when_the_index_echoes_it_back(
    tools_python, echoing_index, tmp_path, flags
):
    """Issue 27 item 2: twine with --verbose prints the index's answer wrapped at 80
    columns, and the Authorization header carries base64(__token__:<token>)."""
    repo = tmp_path / "repo"
    _write_package(repo, "pypto-alpha", "0.1.0")
    _init_repo(repo)
    token = "pypi-" + secrets.token_urlsafe(40) + "+/="
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env.update({TOKEN_ENV: token, "TMPDIR": str(tmp_path)})
    proc = subprocess.run(
        [str(tools_python), str(ROOT / "tools" / "release.py"), "pypto-alpha", "--root",
         str(repo), "--repository-url", echoing_index, *flags],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    print(proc.stdout, proc.stderr, sep="\n")
    # The upload reached the index with the token, and the index's answer was printed.
    assert [base64.b64decode(h.split()[-1]).decode() for h in _EchoingIndex.seen] == [
        f"__token__:{token}"
    ]
    assert proc.returncode == FAILED, proc.stderr
    assert "refused the upload token for pypto-alpha 0.1.0" in proc.stderr
    if "-vv" in flags or "-v" in flags:
        assert "fake-index-says: forbidden" in proc.stderr
    if "--json" in flags:
        assert "refused the upload token" in json.loads(proc.stdout)["error"]
    for name, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        assert _leaks(text, token) == [], name
    assert _git(repo, "tag", "--list") == ""
