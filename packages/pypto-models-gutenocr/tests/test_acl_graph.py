"""--use_acl_graph: the seed's torchair recipe on an NPU, the stated fallback elsewhere."""

import json
import re
import sys
from pathlib import Path

import pytest

from pypto_models_gutenocr import EXIT
from pypto_models_gutenocr.cli import main
from pypto_models_gutenocr.npu import EXPERIMENTAL_ON, NPU, NPU_API_TABLE
from pypto_models_gutenocr.runner import torchair_missing
from pypto_testing.gutenocr import cli_argv

ROOT = Path(__file__).resolve().parents[3]


def _ask(folder):
    return cli_argv(
        "ask", folder, "--use_acl_graph", "--json", warmup=1, runs=1, output_length=3,
        backend="eager",
    )  # fmt: skip


def test_without_torchair_it_is_plain_compile_dynamic_fullgraph_and_says_so(tiny_gutenocr, capsys):
    missing = torchair_missing()
    if missing is None:
        pytest.skip("torchair is installed here: the fallback does not run")
    rc = main(_ask(tiny_gutenocr))
    out, err = capsys.readouterr()
    assert rc == EXIT.OK, err
    graph = json.loads(out)["graph"]
    assert graph["graph"] == "torch.compile"
    assert (graph["dynamic"], graph["fullgraph"], graph["mode"]) == (True, True, "reduce-overhead")
    note = (
        f"pypto-gutenocr: --use_acl_graph: {missing}; falling back to plain "
        "torch.compile(backend=eager, mode=reduce-overhead, dynamic=True, fullgraph=True)"
    )
    assert note in err.splitlines()
    assert graph["note"] in note


def test_on_an_npu_it_compiles_through_torchair_with_the_seeds_options(tiny_gutenocr, capsys):
    if torchair_missing() is not None:
        pytest.skip(f"NPU path: {torchair_missing()} (no Ascend NPU on this machine)")
    rc = main([*_ask(tiny_gutenocr)[:4], "--device", "npu:0", *_ask(tiny_gutenocr)[6:]])
    assert rc == EXIT.OK
    graph = json.loads(capsys.readouterr().out)["graph"]
    assert graph["graph"] == "torchair"
    assert graph["mode"] == "reduce-overhead"
    assert all(graph[name] is True for name in EXPERIMENTAL_ON)
    assert (graph["dynamic"], graph["fullgraph"]) == (True, True)


def test_every_torchair_name_is_declared_and_the_table_is_checked():
    """The names the recipe touches are rows of the table npu_api_check reads."""
    config_cls = "torchair.configs.experimental_config._ExperimentalConfig"
    for path in (
        "torchair",
        "torchair.CompilerConfig",
        "torchair.CompilerConfig.mode",
        "torchair.CompilerConfig.experimental_config",
        "torchair.get_npu_backend",
        *(f"{config_cls}.{name}" for name in EXPERIMENTAL_ON),
    ):
        assert NPU.declared(path), path
    assert NPU.accepts("torchair.get_npu_backend", "compiler_config")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import npu_api_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert ("pypto_models_gutenocr.npu", "NPU_API_TABLE") in npu_api_check.TABLES
    assert npu_api_check.load_table("pypto_models_gutenocr.npu", "NPU_API_TABLE") == NPU_API_TABLE
    runner = (
        ROOT / "packages/pypto-models-gutenocr/src/pypto_models_gutenocr/runner.py"
    ).read_text()
    # No torchair name reached around the table (a plain import would bypass the check).
    assert not re.search(r"^\s*(import|from)\s+torchair", runner, re.M)
