"""Sessions for the whole monorepo.

Packages are discovered from ``packages/*/pyproject.toml`` so adding a package never
means editing this file. Torch is always pinned exactly: an open range pulls a
multi-GB CUDA build from the index.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES_DIR = ROOT / "packages"
TORCH_PIN = "torch==2.13.0"
CANN_MATRIX = PACKAGES_DIR / "pypto-env" / "src" / "pypto_env" / "cann-matrix.toml"

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.default_venv_backend = "venv"


def _pyproject(pkg_dir: Path) -> dict:
    return tomllib.loads((pkg_dir / "pyproject.toml").read_text())


def _packages() -> dict[str, Path]:
    found = {}
    for pp in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        name = _pyproject(pp.parent)["project"]["name"]
        found[name] = pp.parent
    return found


def _req_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _local_closure(name: str, packages: dict[str, Path], extras: tuple[str, ...]) -> list[str]:
    """Local packages ``name`` needs (with the given extras), in install order."""
    seen: list[str] = []
    visiting: set[str] = set()

    def visit(pkg: str, pkg_extras: tuple[str, ...]) -> None:
        if pkg in seen or pkg in visiting:
            return
        visiting.add(pkg)
        proj = _pyproject(packages[pkg])["project"]
        reqs = list(proj.get("dependencies", []))
        for extra in pkg_extras:
            reqs += proj.get("optional-dependencies", {}).get(extra, [])
        for req in reqs:
            dep = _req_name(req)
            if dep in packages:
                dep_extras = re.search(r"\[([^\]]+)\]", req)
                visit(
                    dep,
                    tuple(e.strip() for e in dep_extras.group(1).split(",")) if dep_extras else (),
                )
        seen.append(pkg)

    visit(name, extras)
    return seen


def _needs_torch(names: list[str], packages: dict[str, Path]) -> bool:
    for n in names:
        proj = _pyproject(packages[n])["project"]
        reqs = list(proj.get("dependencies", []))
        for extra in proj.get("optional-dependencies", {}).values():
            reqs += extra
        if any(_req_name(r) == "torch" for r in reqs):
            return True
    return False


def _install_local(
    session: nox.Session, names: list[str], packages: dict[str, Path], extras: dict[str, str]
) -> None:
    """Every local package editable and plain, plus the outside requirements of the extras.

    Extras are not passed as ``-e pkg[extra]``: pip then cannot satisfy another local
    package's plain ``pkg>=...`` requirement from that editable ("from versions: none").
    Instead each requested extra (and each extra local packages ask of each other, e.g.
    ``pypto-testing[models]``) contributes its non-local requirements by name.
    """
    todo: list[tuple[str, str]] = list(extras.items())
    for n in names:
        for req in _pyproject(packages[n])["project"].get("dependencies", []):
            found = re.search(r"\[([^\]]+)\]", req)
            if _req_name(req) in packages and found:
                todo += [(_req_name(req), e.strip()) for e in found.group(1).split(",")]
    seen: set[tuple[str, str]] = set()
    outside: list[str] = []
    while todo:
        pkg, extra = todo.pop()
        if (pkg, extra) in seen or pkg not in packages:
            continue
        seen.add((pkg, extra))
        for req in (
            _pyproject(packages[pkg])["project"].get("optional-dependencies", {}).get(extra, [])
        ):
            dep = _req_name(req)
            if dep in packages:
                found = re.search(r"\[([^\]]+)\]", req)
                if found:
                    todo += [(dep, e.strip()) for e in found.group(1).split(",")]
            elif req not in outside:
                outside.append(req)
    args: list[str] = []
    for n in names:
        args += ["-e", str(packages[n])]
    session.install(*args, *outside)


def _pytest(session: nox.Session, *paths: str) -> None:
    """Run pytest; "no tests collected" (exit 5) is a failure, never a silent pass.

    Only exit 0 succeeds: nox returns True, not the exit status, for a non-silent command,
    so accepting 5 and inspecting the return value would let an empty collection pass.
    """
    session.log(f"pytest over {', '.join(paths)}: exit 5 here means no tests were collected")
    session.run("pytest", *paths, *session.posargs, success_codes=[0])


RUFF_PIN = "ruff==0.17.6"
MYPY_PIN = "mypy==2.4.1"
# import-linter's contracts live in the root pyproject (docs/layering.md); grimp builds
# its import graph, pinned too so a new grimp cannot change what the contracts see.
IMPORT_LINTER_PINS = ("import-linter==2.17", "grimp==3.20")
# The tests session's workers (docs/testing.md has the measurements behind the choice):
# two xdist workers, each with one OpenMP thread and no inductor compile pool, so each
# worker is one core's worth of work and neither spins on the other's core. One process
# used 1.27 of the 2 cores (the compile and dynamo work is one Python thread); two workers
# sized this way use 1.84 and took 0.76 of one process's wall time on the same tests.
# `nox -s tests -- -n 0` runs one process (the last -n wins).
XDIST_PIN = "pytest-xdist==3.8.0"
XDIST_ARGS = ("-n", "2", "--dist", "worksteal")
#: the environment each worker (and every child a test starts) runs with
WORKER_ENV = {"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def _src_path() -> str:
    """Every package's src folder, for PYTHONPATH: the packages importable, none installed."""
    return os.pathsep.join(
        str(path / "src") for path in _packages().values() if (path / "src").is_dir()
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format), the import contracts and the private-name check.

    import-linter reads the source statically (grimp parses it, nothing is imported), so
    the packages only need to be findable: every packages/*/src goes on PYTHONPATH and no
    package, torch included, is installed. tools/check_private_imports.py is standard
    library only.
    """
    session.install(RUFF_PIN, *IMPORT_LINTER_PINS)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": _src_path()})
    session.run("python", str(ROOT / "tools" / "check_private_imports.py"))


def _module(pkg_dir: Path) -> str:
    return _pyproject(pkg_dir)["project"]["name"].replace("-", "_")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every package's library code, with its real dependencies installed.

    Each package is checked as the installed module (``-p``), so imports resolve the way a
    user's do; tests and tools are left to ruff.
    """
    packages = _packages()
    session.install(TORCH_PIN, MYPY_PIN)
    names: list[str] = []
    for n in packages:
        names += [d for d in _local_closure(n, packages, ("test",)) if d not in names]
    # The test extras too: the same environment the tests run in (e.g. the optional pypto).
    _install_local(
        session, names, packages, {n: "test" for n in names if _has_extra(packages[n], "test")}
    )
    args: list[str] = []
    for path in packages.values():
        args += ["-p", _module(path)]
    session.run("mypy", "--config-file", str(ROOT / "pyproject.toml"), *args)


@nox.session
def tests(session: nox.Session) -> None:
    """Every package and tests-integration on CPU, torch pinned to 2.13.0."""
    packages = _packages()
    # import-linter: tests-integration/test_layering.py proves the contracts catch a breach.
    session.install(TORCH_PIN, XDIST_PIN, *IMPORT_LINTER_PINS)
    names: list[str] = []
    for n in packages:
        for dep in _local_closure(n, packages, ("test",)):
            if dep not in names:
                names.append(dep)
    _install_local(
        session, names, packages, {n: "test" for n in names if _has_extra(packages[n], "test")}
    )
    paths = [str(packages[n] / "tests") for n in packages if (packages[n] / "tests").is_dir()]
    paths.append("tests-integration")
    # The suite's budget (docs/testing.md): 25 minutes of pytest and 8 GB resident on 2
    # cores. The process and every child it starts compile into one per-run inductor
    # cache, so a graph compiled by one is a cache hit for the others, and the run starts
    # cold like CI's (a developer's cache does not flatter the figure).
    # Absolute: tests start children in folders of their own (a relative cache path names
    # another folder there).
    tmp = Path(session.create_tmp()).resolve()
    session.env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor-cache")
    for key, value in WORKER_ENV.items():
        session.env.setdefault(key, os.environ.get(key, value))
    shutil.rmtree(tmp / "inductor-cache", ignore_errors=True)
    profile = os.environ.get("PYPTO_TEST_PROFILE")
    if profile:
        profile = str(Path(profile).resolve())
    else:
        profile = str(tmp / "test-profile")
        shutil.rmtree(profile, ignore_errors=True)
    session.env["PYPTO_TEST_PROFILE"] = profile
    # PyPTO's calculator (a ~23 s cmake build, pypto-kernels-common) once per run, shared
    # by every worker and child behind its file lock.
    session.env["PYPTO_KERNELS_CACHE"] = str(
        Path(os.environ.get("PYPTO_KERNELS_CACHE") or tmp / "pypto-kernels-cache").resolve()
    )
    linker = _fast_linker(tmp)
    if linker:
        session.env["COMPILER_PATH"] = os.pathsep.join(
            p for p in (linker, os.environ.get("COMPILER_PATH", "")) if p
        )
        session.log(f"inductor's kernels link with gold ({linker}/ld)")
    session.log(f"pytest over {', '.join(paths)}: exit 5 here means no tests were collected")
    try:
        # tools/measure_tests.py samples the whole process tree's memory (the workers and
        # every child a test starts) and passes pytest's exit status through.
        session.run(
            "python", str(ROOT / "tools" / "measure_tests.py"), "--csv", f"{profile}/rss.csv",
            "--", "pytest", *XDIST_ARGS, "--durations=40", *paths, *session.posargs,
            success_codes=[0],
        )  # fmt: skip
    finally:
        # Where the time went, from the root conftest.py's per-test lines.
        session.run("python", str(ROOT / "tools" / "suite_profile.py"), profile, "--top", "15")


def _fast_linker(tmp: Path) -> str | None:
    """A folder whose ``ld`` is GNU gold, for gcc's ``COMPILER_PATH``; None without gold.

    Inductor builds every CPU kernel of a compiled graph as its own shared library against
    libtorch (the suite builds over a thousand): GNU ld took 0.68 s to link one here, gold
    0.19 s, with the same compile and the same code (docs/testing.md). gcc's driver looks
    for its linker in ``COMPILER_PATH`` before ``PATH``, so this changes the linker of the
    compiles the suite runs and nothing else on the machine.
    """
    gold = shutil.which("ld.gold")
    if not gold or not sys.platform.startswith("linux"):
        return None
    folder = tmp / "linker"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "ld"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(gold)
    return str(folder)


def _has_extra(pkg_dir: Path, extra: str) -> bool:
    return extra in _pyproject(pkg_dir)["project"].get("optional-dependencies", {})


@nox.session
@nox.parametrize("name", list(_packages()), ids=list(_packages()))
def package(session: nox.Session, name: str) -> None:
    """One package alone in a fresh venv: proves its dependencies are narrow."""
    packages = _packages()
    names = _local_closure(name, packages, ("test",))
    if _needs_torch(names, packages):
        session.install(TORCH_PIN)
    extras = {name: "test"} if _has_extra(packages[name], "test") else {}
    _install_local(session, names, packages, extras)
    session.run("python", "-m", "pip", "list", "--format=freeze", silent=False)
    _pytest(session, str(packages[name] / "tests"))


def _cann_rows() -> list[dict]:
    if not CANN_MATRIX.exists():
        return []
    return tomllib.loads(CANN_MATRIX.read_text()).get("row", [])


def _cann_ids() -> list[str]:
    return sorted({row["cann"] for row in _cann_rows()}, reverse=True) or ["none"]


@nox.session
@nox.parametrize("version", _cann_ids(), ids=_cann_ids())
def cann(session: nox.Session, version: str) -> None:
    """The tests on an Ascend NPU with the torch/torch_npu pinned for this CANN.

    Skips (with the reason) unless this CANN version is the one installed here.
    """
    session.install("-e", str(PACKAGES_DIR / "pypto-env"))
    detected = session.run(
        "python",
        "-c",
        "from pypto_env import detect_cann; c = detect_cann(); print(c.version if c else '')",
        silent=True,
    ).strip()
    if not detected:
        session.skip("no CANN toolkit found (set ASCEND_HOME_PATH by sourcing CANN's set_env.sh)")
    if detected != version:
        session.skip(f"CANN {detected} is installed here, not {version}")
    pins = session.run(
        "python",
        "-c",
        f"from pypto_env import pins_for; p = pins_for({version!r}); print(p.torch, p.torch_npu)",
        silent=True,
    ).split()
    session.install(f"torch=={pins[0]}", f"torch-npu=={pins[1]}")
    packages = _packages()
    names = [n for n in packages]
    _install_local(
        session, names, packages, {n: "test" for n in names if _has_extra(packages[n], "test")}
    )
    session.env["PYPTO_REQUIRE_NPU"] = "1"
    paths = [str(packages[n] / "tests") for n in packages if (packages[n] / "tests").is_dir()]
    _pytest(session, *paths, "tests-integration")


@nox.session
@nox.parametrize("hub", ["0.36.0", "2.4.0"], ids=["0.36.0", "2.4.0"])
def download_hub(session: nox.Session, hub: str) -> None:
    """pypto-download's tests at the oldest and newest supported huggingface_hub."""
    packages = _packages()
    names = _local_closure("pypto-download", packages, ("test",))
    _install_local(session, names, packages, {"pypto-download": "test"})
    session.install(f"huggingface_hub=={hub}")
    _pytest(session, str(packages["pypto-download"] / "tests"))


def _transformers_floor_ok(pkg_dir: Path, version: str) -> bool:
    """Whether ``version`` is inside the package's declared transformers range."""
    from packaging.specifiers import SpecifierSet

    for req in _pyproject(pkg_dir)["project"].get("dependencies", []):
        if _req_name(req) == "transformers":
            spec = re.sub(r"^[A-Za-z0-9_.-]+", "", req.split(";")[0]).strip()
            return SpecifierSet(spec).contains(version)
    return True


# The ends of the supported range, plus 5.12.0: the first release with MiniMax M3
# (pypto-models-minimax's floor).
TRANSFORMERS_ENDS = ["5.8.0", "5.12.0", "5.24.0"]


@nox.session
@nox.parametrize("transformers", TRANSFORMERS_ENDS, ids=TRANSFORMERS_ENDS)
def transformers_range(session: nox.Session, transformers: str) -> None:
    """Capture, bench and model-family tests at the ends of the supported transformers range.

    A package whose own floor is above ``transformers`` is left out of that run (and named).
    """
    packages = _packages()
    at_the_ends = (
        "pypto-capture",
        "pypto-bench",
        "pypto-models-gemma4",
        "pypto-models-minimax",
        "pypto-models-llada2",
        "pypto-kernels-linear-attention",
    )
    wanted = []
    for n in at_the_ends:
        if n not in packages:
            continue
        if _transformers_floor_ok(packages[n], transformers):
            wanted.append(n)
        else:
            session.log(f"{n}: transformers {transformers} is outside its range; not run here")
    names: list[str] = []
    for n in wanted:
        names += [d for d in _local_closure(n, packages, ("test", "test-hf")) if d not in names]
    session.install(TORCH_PIN)
    # "test-hf": transformers-dependent test needs, kept out of "test" so package(<name>) stays narrow.
    extras = {n: "test,test-hf" if _has_extra(packages[n], "test-hf") else "test" for n in wanted}
    _install_local(session, names, packages, extras)
    session.install(f"transformers=={transformers}")
    _pytest(session, *[str(packages[n] / "tests") for n in wanted])


@nox.session
def build(session: nox.Session) -> None:
    """sdist + wheel of every package into dist/, metadata checked with twine."""
    session.install("build", "twine")
    dist = ROOT / "dist"
    dist.mkdir(exist_ok=True)
    for name, path in _packages().items():
        session.log(f"building {name}")
        session.run("python", "-m", "build", "--outdir", str(dist), str(path))
    session.run("twine", "check", "--strict", *[str(p) for p in sorted(dist.iterdir())])


RELEASE_REQUIREMENTS = ROOT / "tools" / "release-requirements.txt"


def _carries_secret(args: list[str]) -> bool:
    """Whether a command line holds a credential, judged by pypto_common's one redactor.

    nox logs every command it runs (and again when it fails), so a token on the command
    line would be printed before the release tool could refuse it. pypto-common is
    standard library only, so its source imports here without installing anything.
    """
    sys.path.insert(0, str(PACKAGES_DIR / "pypto-common" / "src"))
    try:
        from pypto_common import redact_argv
    finally:
        sys.path.pop(0)
    return redact_argv(args) != list(args)


@nox.session
@nox.parametrize("name", list(_packages()), ids=list(_packages()))
def release(session: nox.Session, name: str) -> None:
    """Release one package: checks, sdist + wheel, twine check --strict, upload, tag.

    A thin layer over tools/release.py (docs/releasing.md); flags go after ``--``:
    ``--dry-run`` (everything but upload and tag), ``--repository-url URL``, ``--with
    SIBLING``, ``--with-deps``. The upload token comes from $PYPTO_RELEASE_TOKEN only.
    """
    if _carries_secret(session.posargs):
        session.error(
            "a credential is on the command line (nox would print it): remove it and put the "
            "token in $PYPTO_RELEASE_TOKEN"
        )
    session.install("-r", str(RELEASE_REQUIREMENTS), "-e", str(PACKAGES_DIR / "pypto-common"))
    session.run("python", str(ROOT / "tools" / "release.py"), name, *session.posargs)


MSPROBE_PIN = "mindstudio-probe==26.2.0"


@nox.session
def msprobe(session: nox.Session) -> None:
    """pypto-precision against the real msprobe (PyPI mindstudio-probe), in a venv of its own:
    msprobe's dump of a tiny Llama read as either side of our compare (a planted 1% error in
    its run named at its module), and ``msprobe compare`` reading the dump we write."""
    packages = _packages()
    session.install(TORCH_PIN, MSPROBE_PIN)
    names = _local_closure("pypto-precision", packages, ("test",))
    _install_local(session, names, packages, {"pypto-precision": "test"})
    _pytest(session, str(packages["pypto-precision"] / "tests" / "test_msprobe.py"))


HTA_PIN = "holistictraceanalysis==0.5.0"
MSPROF_ANALYZE_PIN = "msprof-analyze==26.2.0"


@nox.session
def interop(session: nox.Session) -> None:
    """The field's own tools on what we write, each the real package in this venv of its
    own: Holistic Trace Analysis on `pypto-tune profile --nproc 2`'s per-rank traces
    (ranks, steps, per-op collective time equal to ours; what it cannot compute on CPU),
    msprof-analyze's cluster analysis and advisor on the `*_ascend_pt` layout, and msprobe
    (mindstudio-probe) dumps compared with ours both ways."""
    packages = _packages()
    session.install(TORCH_PIN, HTA_PIN, MSPROF_ANALYZE_PIN, MSPROBE_PIN)
    names: list[str] = []
    for top in ("pypto-tune", "pypto-precision"):
        names += [d for d in _local_closure(top, packages, ("test",)) if d not in names]
    # pypto-bench[distributed]: `profile --nproc 2` loads through transformers' TP plan.
    extras = {"pypto-tune": "test", "pypto-precision": "test", "pypto-bench": "distributed"}
    _install_local(session, names, packages, extras)
    session.env.update(WORKER_ENV)
    _pytest(
        session,
        str(packages["pypto-tune"] / "tests" / "test_interop_hta.py"),
        str(packages["pypto-tune"] / "tests" / "test_interop_msprof.py"),
        str(packages["pypto-precision"] / "tests" / "test_msprobe.py"),
    )


@nox.session
def npu_api(session: nox.Session) -> None:
    """Every declared torch_npu / torchair / PyPTO name checked against the real wheels.

    For each torch_npu version of the CANN matrix (and pypto 0.2.0) the linux x86_64
    cp311 wheel is downloaded once into ~/.cache/pypto-npu-api-wheels (or $PYPTO_NPU_API_CACHE) and
    read statically: no NPU, no CANN, nothing installed. Flags after ``--`` go to
    tools/npu_api_check.py (``--recommended``, ``--strict``, ``--offline``, ``--json``).
    """
    session.run("python", str(ROOT / "tools" / "npu_api_check.py"), *session.posargs)


@nox.session
def zoo(session: nox.Session) -> None:
    """The support matrix over the zoo: every causal-LM type of the installed transformers
    built tiny from its own classes (pypto_testing.zoo), decode and prefill, eager and
    graph, each type in its own bounded process (tools/zoo.py). Flags after ``--`` go to
    tools/zoo.py: ``--shard 1/8`` (a CI-sized share), ``--types newest:20``, ``--backend
    compile``, ``--peer`` (hf-compile). A whole-zoo run (no flags) records its results as
    docs/zoo.json and regenerates docs/zoo.md and the counts in the support matrix from
    them (tools/gen_docs.py); a partial run writes .nox/zoo-out only."""
    packages = _packages()
    session.install(TORCH_PIN)
    names = _local_closure("pypto-bench", packages, ())
    names += [n for n in _local_closure("pypto-testing", packages, ("models",)) if n not in names]
    _install_local(session, names, packages, {"pypto-testing": "models"})
    out = ROOT / ".nox" / "zoo-out"
    session.run("python", str(ROOT / "tools" / "zoo.py"), "--out", str(out), *session.posargs)
    if not session.posargs:  # the whole zoo: its results are the documented ones
        session.run(
            "python",
            "-c",
            f"import shutil; shutil.copy({str(out / 'zoo.json')!r}, "
            f"{str(ROOT / 'docs' / 'zoo.json')!r})",
        )
        session.run("python", str(ROOT / "tools" / "gen_docs.py"))


@nox.session
def demo(session: nox.Session) -> None:
    """The README's main job on its embedded default: no network, no accelerator.

    Installs exactly what a user's ``pip install 'pypto-e2e[demo]'`` brings (the local hub
    is the ``demo`` extra), so the demo also proves that install is complete.
    """
    packages = _packages()
    session.install(TORCH_PIN)
    names = _local_closure("pypto-e2e", packages, ("demo",))
    _install_local(session, names, packages, {"pypto-e2e": "demo"})
    session.env.setdefault(
        "PYPTO_DEMO_WORKDIR", os.environ.get("PYPTO_DEMO_WORKDIR", str(ROOT / ".nox" / "demo-work"))
    )
    session.run("pypto-e2e", "demo", *session.posargs)
