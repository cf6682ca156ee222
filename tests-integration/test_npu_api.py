"""tools/npu_api_check.py on small fake wheel trees, and on the cached real wheels if any.

The fake trees are real files (folders and a zipped .whl) laid out like torch_npu; the
checker runs as a subprocess exactly as ``nox -s npu_api`` runs it. This test never
downloads: the real-wheel part runs only where ``nox -s npu_api`` left its cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "npu_api_check.py"
CACHE = Path(
    os.environ.get("PYPTO_NPU_API_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pypto-npu-api-wheels"
)
MATRIX = ROOT / "packages" / "pypto-env" / "src" / "pypto_env" / "cann-matrix.toml"

FAKE = {
    "torch_npu/__init__.py": "from . import npu\nfrom .profiler import *\n",
    "torch_npu/npu/__init__.py": (
        "from .graphs import NPUGraph, graph, graph_pool_handle as pool_handle\n"
        "from .utils import *\n"
        "is_available = _is_available = lambda: False\n"
    ),
    "torch_npu/npu/graphs.py": (
        "import torch_npu._C\n"
        "class NPUGraph(torch_npu._C._NPUGraph):\n"
        "    def replay(self):\n        pass\n"
        "class graph:\n"
        "    def __init__(self, npu_graph, pool=None, stream=None):\n        pass\n"
        "def graph_pool_handle():\n    pass\n"
    ),
    "torch_npu/npu/utils.py": (
        "__all__ = ['synchronize']\n"
        "def synchronize(device=None):\n    pass\n"
        "def _private():\n    pass\n"
    ),
    "torch_npu/profiler/__init__.py": (
        "__all__ = ['profile', 'ExportType']\n"
        "from .profiler import profile\nfrom .config import ExportType\n"
    ),
    "torch_npu/profiler/profiler.py": (
        "class profile:\n    def __init__(self, activities=None, **kwargs):\n        pass\n"
        "    def start(self):\n        pass\n"
    ),
    "torch_npu/profiler/config.py": "import os\nclass ExportType:\n    Db = 'db'\n"
    "ALLOC = os.environ.get('FAKE_NPU_ALLOC_CONF')\n",
    "torch_npu/dynamo/torchair/__init__.py": "from .compiler import CompilerConfig\n",
    "torch_npu/dynamo/torchair/compiler.py": (
        "class CompilerConfig:\n    def __init__(self):\n        self.mode = 'max-autotune'\n"
    ),
    "torch_npu/_C.cpython-311-x86_64-linux-gnu.so": "\0ELF capture_begin\0_NPUGraph\0",
}

GOOD = """
module   torch_npu                             | fake
function torch_npu.npu.synchronize             | star import with __all__
function torch_npu.npu.pool_handle             | re-export under another name
function torch_npu.npu.is_available            | assignment
class    torch_npu.npu.graph                   | from-import
kwarg    torch_npu.npu.graph pool stream       | graph.__init__
class    torch.npu.NPUGraph                    | torch.npu is torch_npu.npu
method   torch_npu.npu.NPUGraph.replay         | python method
method   torch_npu.npu.NPUGraph.capture_begin  | inherited from the compiled base
kwarg    torch_npu.profiler.profile activities with_stack | explicit and **kwargs
method   torch_npu.profiler.profile.start      | python method
member   torch_npu.ExportType.Db               | two star imports deep
member?  torch_npu.profiler.ExportType.Text    | optional and absent
kwarg    torch_npu.npu.graph capture_error_mode @>=2.6.0 | not for 2.5.1
class    torchair.CompilerConfig               | torchair lives in torch_npu/dynamo
env      torch_npu.FAKE_NPU_ALLOC_CONF         | read in config.py
env      torch_npu._NPUGraph                   | only in the compiled file
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _check(*args: str, table: str | None = None, tmp: Path, env: dict | None = None):
    argv = [sys.executable, str(TOOL), "--offline", "--json", "--no-pypto", *args]
    if table is not None:
        (tmp / "table.txt").write_text(table)
        argv += ["--table-file", str(tmp / "table.txt")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})  # fmt: skip
    report = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, proc.stderr, report


@pytest.fixture(scope="module")
def fake_wheel(tmp_path_factory) -> Path:
    """The fake as torch_npu >= 2.6.0: graph() also takes capture_error_mode."""
    graphs = FAKE["torch_npu/npu/graphs.py"].replace(
        "stream=None)", "stream=None, capture_error_mode='global')"
    )
    return _tree(
        tmp_path_factory.mktemp("fake") / "tree", {**FAKE, "torch_npu/npu/graphs.py": graphs}
    )


def test_names_that_exist_resolve_in_a_folder_and_a_zipped_wheel(fake_wheel, tmp_path):
    whl = tmp_path / "torch_npu-2.5.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for rel, text in FAKE.items():
            zf.writestr(rel, text)
    rc, err, report = _check("--wheel", f"2.9.0={fake_wheel}", "--wheel", f"2.5.1={whl}",
                             table=GOOD, tmp=tmp_path)  # fmt: skip
    assert rc == 0, err
    new, old = report["targets"]
    assert new["counts"] == {"ok": 17, "opaque": 1, "optional-missing": 1, "missing": 0}
    assert old["skipped_other_versions"] == 1
    assert old["checked"] == 18
    status = {r["row"]: r for r in new["results"]}
    assert "'capture_begin' is in torch_npu/_C" in status[
        "method torch_npu.npu.NPUGraph.capture_begin"]["detail"]  # fmt: skip
    assert "via **kwargs" in status["kwarg torch_npu.profiler.profile(with_stack=)"]["detail"]
    assert "optional, absent" in err
    assert "ExportType.Text" in err


def test_a_renamed_name_fails_with_the_nearest_existing_name(fake_wheel, tmp_path):
    table = "function torch_npu.npu.pool_handel | renamed\n"
    table += "method torch_npu.npu.NPUGraph.capture_begn | typo, compiled base\n"
    rc, err, report = _check("--wheel", f"2.9.0={fake_wheel}", table=table, tmp=tmp_path)
    assert rc == 1
    assert "MISMATCH torch_npu 2.9.0: function torch_npu.npu.pool_handel" in err
    assert "nearest existing name: pool_handle" in err
    assert "no compiled file of the wheel holds 'capture_begn'" in err
    assert report["targets"][0]["counts"]["missing"] == 2


def test_a_removed_keyword_fails_with_the_signature(fake_wheel, tmp_path):
    rc, err, _ = _check("--wheel", f"2.9.0={fake_wheel}",
                        table="kwarg torch_npu.npu.graph pool auto_dispatch_capture | x\n",
                        tmp=tmp_path)  # fmt: skip
    assert rc == 1
    assert "graph(auto_dispatch_capture=)" in err
    assert (
        "__init__(npu_graph, pool, stream, capture_error_mode) in torch_npu.npu.graphs takes no"
        in err
    )


def test_instance_attributes_set_in_init_are_members(fake_wheel, tmp_path):
    """torchair's CompilerConfig defines its options (``mode``) only in ``__init__``."""
    table = "member torchair.CompilerConfig.mode | self.mode in __init__\n"
    rc, err, _ = _check("--wheel", f"2.9.0={fake_wheel}", table=table, tmp=tmp_path)
    assert rc == 0, err
    rc, err, _ = _check("--wheel", f"2.9.0={fake_wheel}",
                        table="member torchair.CompilerConfig.moed | typo\n", tmp=tmp_path)  # fmt: skip
    assert rc == 1
    assert "CompilerConfig.moed" in err


def test_private_names_are_not_star_exported(fake_wheel, tmp_path):
    rc, err, _ = _check("--wheel", f"2.9.0={fake_wheel}",
                        table="function torch_npu.npu._private | x\n", tmp=tmp_path)  # fmt: skip
    assert rc == 1
    assert "no '_private' in module torch_npu.npu" in err


def test_pypto_rows_are_checked_against_the_pypto_wheel(fake_wheel, tmp_path):
    pypto = _tree(tmp_path / "pypto", {"pypto/__init__.py": "from .frontend import jit\n",
                                       "pypto/frontend.py": "def jit(runtime_options=None):\n"
                                       "    pass\n"})  # fmt: skip
    table = "kwarg pypto.jit runtime_options | x\nenv pypto.TILE_FWK_DEVICE_ID | x\n"
    argv = ["--wheel", f"2.9.0={fake_wheel}", "--pypto-wheel", str(pypto)]
    (tmp_path / "t.txt").write_text(table)
    proc = subprocess.run([sys.executable, str(TOOL), "--offline", *argv, "--table-file",
                           str(tmp_path / "t.txt")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert "MISMATCH pypto 0.2.0: env pypto.TILE_FWK_DEVICE_ID" in proc.stderr
    assert "pypto 0.2.0: 2 names checked: 1 ok" in proc.stderr


def test_a_missing_wheel_is_reported_and_fails_only_when_strict(tmp_path):
    empty = tmp_path / "links"
    empty.mkdir()
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty)}
    table = "module torch_npu | x\n"
    argv = ["--torch-npu", "0.0.1", "--cache-dir", str(tmp_path / "cache")]
    (tmp_path / "t.txt").write_text(table)
    base = [sys.executable, str(TOOL), *argv, "--table-file", str(tmp_path / "t.txt")]
    proc = subprocess.run(base, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "torch_npu 0.0.1: not on the package index; NOT CHECKED" in proc.stderr
    strict = subprocess.run([*base, "--strict"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, **env})  # fmt: skip
    assert strict.returncode == 1


def test_bad_inputs_give_one_line_and_a_nonzero_status(tmp_path):
    rc, err, _ = _check("--wheel", "2.9.0", tmp=tmp_path)
    assert rc == 2
    assert "write VERSION=PATH" in err
    rc, err, _ = _check("--wheel", f"2.9.0={tmp_path}", table="widget x.y | s\n", tmp=tmp_path)
    assert rc == 1
    assert "bad table: unknown kind 'widget'" in err
    assert len(err.splitlines()) == 1


def test_the_registered_tables_parse_and_name_only_checked_wheels(tmp_path):
    sys.path.insert(0, str(TOOL.parent))
    try:
        import npu_api_check as tool
    finally:
        sys.path.pop(0)
    for module, attr in tool.TABLES:
        text = tool.load_table(module, attr)
        if text is None:
            continue  # a package not in this checkout
        for row in tool.parse_table(text):
            assert tool.wheel_of(row.path) in ("torch_npu", "pypto"), row


def _cached_versions() -> list[str]:
    """The recommended row of each CANN, where cached (nox -s npu_api checks every row)."""
    rows = tomllib.loads(MATRIX.read_text())["row"]
    wanted = dict.fromkeys(str(r["torch_npu"]) for r in rows if r.get("recommended"))
    return [v for v in wanted if list((CACHE / f"torch_npu-{v}").glob("*.whl"))]


@pytest.mark.skipif(not _cached_versions(), reason="no cached torch_npu wheels: run nox -s npu_api")
def test_the_registered_tables_hold_in_every_cached_real_wheel(tmp_path):
    args: list[str] = []
    for version in _cached_versions():
        args += ["--torch-npu", version]
    proc = subprocess.run([sys.executable, str(TOOL), "--offline", "--cache-dir", str(CACHE),
                           "--json", *args], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    checked = [t for t in report["targets"] if t["wheel"] == "torch_npu"]
    assert checked
    assert all(t["checked"] > 0 and t["counts"]["missing"] == 0 for t in checked)


def test_an_options_key_must_be_a_literal_the_wheel_reads(tmp_path):
    pypto = _tree(tmp_path / "pypto", {"pypto/__init__.py": "def jit(runtime_options=None):\n"
                                       "    return runtime_options.get('run_mode')\n"})  # fmt: skip
    table = (
        "function pypto.jit | x\nkey pypto.jit runtime_options.run_mode runtime_options.mode | x\n"
    )
    (tmp_path / "t.txt").write_text(table)
    proc = subprocess.run([sys.executable, str(TOOL), "--offline", "--wheel", f"2.9.0={tmp_path}",
                           "--pypto-wheel", str(pypto), "--table-file", str(tmp_path / "t.txt")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert "pypto.jit[runtime_options.mode]" in proc.stderr
    assert "run_mode]" not in proc.stderr.split("MISMATCH", 1)[1].splitlines()[0]
