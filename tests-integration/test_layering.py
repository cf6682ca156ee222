"""The layering rules are checked, not hoped (issue 28; docs/layering.md).

- import-linter's contracts (root pyproject) name every package, and each contract breaks
  on a real breach planted in a copy of the source: an upward import, a module cycle, a
  private module reached from another package;
- tools/check_private_imports.py fails (exit 1, file:line) on ``from .x import _y`` and
  ``m._y`` across modules, and passes internal modules, submodule imports and dunders;
- tools/layering_stats.py counts what it claims to count on a tree made for it;
- the repository itself keeps every contract and imports no private name across modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _contract(kind: str) -> dict:
    (found,) = [c for c in _config()["contracts"] if c["type"] == kind]
    return found


def _on_disk() -> set[str]:
    return {
        pkg.parent.name
        for pkg in ROOT.glob("packages/*/src/*/__init__.py")
        if not pkg.parent.name.startswith("_")
    }


def _lint_imports(src_roots: list[Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} missing: install import-linter (noxfile IMPORT_LINTER_PINS)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in src_roots)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def _run_tool(script: str, *args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOLS / script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


# -- the contracts ---------------------------------------------------------------------


def test_every_package_is_named_by_every_contract():
    """A new package left out of the config would be checked by nothing."""
    roots = set(_config()["root_packages"])
    assert roots == _on_disk(), "root_packages in the root pyproject must list every package"
    layered = {name.strip() for layer in _contract("layers")["layers"] for name in layer.split("|")}
    assert layered == roots, "every package needs its place in the layers contract"
    assert set(_contract("acyclic_siblings")["ancestors"]) == roots
    assert "packages_with_private_modules" not in _contract("private_modules"), (
        "the private_modules contract covers every root package"
    )


@pytest.fixture(scope="module")
def breached(tmp_path_factory) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of every package's source with three breaches planted."""
    copy = tmp_path_factory.mktemp("breached")
    roots = []
    for src in sorted(ROOT.glob("packages/*/src")):
        dest = copy / src.parent.name / "src"
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        roots.append(dest)
    by_name = {p.name: p for r in roots for p in r.iterdir() if p.is_dir()}
    _write(
        by_name["pypto_common"],
        {"upward.py": "from pypto_e2e import errors\n"},  # the lowest layer importing the top
    )
    _write(
        by_name["pypto_download"],
        {
            "ring_a.py": "from . import ring_b\n",
            "ring_b.py": "def late():\n    from .ring_a import late as again\n",
        },
    )
    _write(
        by_name["pypto_bench"],
        {
            "_internal_only.py": "VALUE = 1\n",
            "uses_own_internal.py": "from . import _internal_only\n",
        },
    )
    _write(by_name["pypto_tune"], {"reach_in.py": "from pypto_bench._internal_only import VALUE\n"})
    _write(
        by_name["pypto_models_gemma4"],
        {"sideways.py": "import pypto_models_kimi\n"},  # model families are independent
    )
    return _lint_imports(roots, copy)


def test_layers_contract_breaks_on_an_upward_import(breached):
    assert breached.returncode == 1, breached.stdout[-2000:]
    out = breached.stdout
    assert "pypto_common.upward -> pypto_e2e" in out
    assert "pypto_models_gemma4.sideways -> pypto_models_kimi" in out


def test_acyclic_contract_breaks_on_a_function_level_cycle(breached):
    assert "No cycles are allowed in pypto_download." in breached.stdout
    assert ".ring_b -> .ring_a" in breached.stdout or ".ring_a -> .ring_b" in breached.stdout


def test_private_modules_contract_breaks_across_packages_only(breached):
    out = breached.stdout
    assert "pypto_tune.reach_in -> pypto_bench._internal_only" in out
    assert "uses_own_internal" not in out  # inside its own package: allowed


def test_repository_keeps_every_contract(tmp_path):
    """The tree as it is: the same run as nox's lint session."""
    done = _lint_imports(sorted(ROOT.glob("packages/*/src")), tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout


# -- tools/check_private_imports.py ----------------------------------------------------

VIOLATING = {
    "pkg/__init__.py": "",
    "pkg/core.py": "_hidden = 1\ndef _helper():\n    return 1\n__version__ = '1'\n",
    "pkg/user.py": """\
        from .core import _helper
        from pkg.core import __version__
        def f():
            from pkg.core import _hidden
            return _hidden
    """,
    "pkg/attr.py": """\
        from . import core
        import pkg.core as c
        x = core._helper() + c._hidden
    """,
    "pkg/__main__.py": "_entry = 1\n",
    "pkg/runner.py": "from .__main__ import _entry\n",  # a dunder module is not internal
}

CLEAN = {
    "pkg/__init__.py": "",
    "pkg/_shared.py": "_token = 1\n",
    "pkg/core.py": "_mine = 2\ndef public():\n    return _mine\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/_impl.py": "_deep = 3\n",
    "pkg/user.py": """\
        from . import _shared
        from ._shared import _token
        from .sub import _impl
        from .sub._impl import _deep
        from .core import public, __doc__
        import os
        x = os._exit, _shared._token, _impl._deep
    """,
}


def test_private_name_from_another_module_fails_with_file_and_line(tmp_path):
    tree = _write(tmp_path, VIOLATING)
    done = _run_tool("check_private_imports.py", tree / "pkg", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 5, lines
    assert lines[0].startswith("pkg/attr.py:3: pkg.attr uses pkg.core._helper")
    assert lines[1].startswith("pkg/attr.py:3: pkg.attr uses pkg.core._hidden")
    assert lines[2].startswith("pkg/runner.py:1: pkg.runner imports _entry from pkg.__main__")
    assert lines[3].startswith("pkg/user.py:1: pkg.user imports _helper from pkg.core")
    assert lines[4].startswith("pkg/user.py:4: pkg.user imports _hidden from pkg.core")
    assert "internal module" in lines[0]  # the fix is named
    assert "5 private name(s)" in done.stderr
    as_json = json.loads(_run_tool("check_private_imports.py", "--json", tree, cwd=tmp_path).stdout)
    assert {(v["line"], v["name"]) for v in as_json["violations"]} == {
        (3, "_helper"),
        (3, "_hidden"),
        (1, "_entry"),
        (1, "_helper"),
        (4, "_hidden"),
    }


def test_internal_modules_submodules_and_dunders_pass(tmp_path):
    tree = _write(tmp_path, CLEAN)
    done = _run_tool("check_private_imports.py", tree, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_bad_paths_and_unparsable_files_exit_2(tmp_path):
    done = _run_tool("check_private_imports.py", tmp_path / "nowhere", cwd=tmp_path)
    assert done.returncode == 2
    assert "no such file or folder" in done.stderr
    assert len(done.stderr.splitlines()) == 1
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/broken.py": "def (:\n"})
    done = _run_tool("check_private_imports.py", tmp_path / "pkg", cwd=tmp_path)
    assert done.returncode == 2
    assert "broken.py: does not parse" in done.stderr


def test_repository_imports_no_private_name_across_modules():
    done = _run_tool("check_private_imports.py")
    assert done.returncode == 0, done.stdout


# -- tools/layering_stats.py -------------------------------------------------------------


def test_layering_stats_counts_a_tree_made_for_it(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(101))
    _write(
        tmp_path / "packages" / "demo" / "src",
        {
            "demo/__init__.py": "from . import a\n__all__ = ['a']\n",
            "demo/a.py": "__all__ = []\nfrom .b import _p\n",
            "demo/b.py": f"_p = 1\ndef long_one():\n{body}\n    from . import c\n",
            "demo/c.py": "def g():\n    from .a import __all__\n",
            "demo/d.py": "import demo.a\n",
        },
    )
    done = _run_tool("layering_stats.py", "--json", "--root", tmp_path, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (demo,) = json.loads(done.stdout)["packages"]
    assert demo["modules"] == 5
    assert demo["modules_with_all"] == 2
    assert demo["largest_modules"][0] == {"module": "demo.b", "lines": 104}
    assert demo["private_cross_module_imports"] == 1
    assert demo["private_imports"] == ["packages/demo/src/demo/a.py:2 demo.a <- demo.b._p"]
    assert demo["cycles"] == 1  # a -> b -> c -> a (function-level); __init__'s re-exports no
    assert demo["cycle_sets"][0]["modules"] == ["demo.a", "demo.b", "demo.c"]
    assert demo["functions_over_limit"] == 1
    assert demo["long_functions"][0]["function"] == "demo.b.long_one"
    assert demo["long_functions"][0]["lines"] == 103
    text = _run_tool("layering_stats.py", "--root", tmp_path, cwd=tmp_path)
    assert "cycle: demo.a <-> demo.b <-> demo.c" in text.stdout
    assert (
        "total: 1 private cross-module imports, 1 cycles, 1 functions over 100 lines" in text.stdout
    )


def test_layering_stats_refuses_a_missing_root(tmp_path):
    done = _run_tool("layering_stats.py", "--root", tmp_path / "nowhere", cwd=tmp_path)
    assert done.returncode == 2
    assert "no such folder" in done.stderr
