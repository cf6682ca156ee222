"""--use_dynamic_config: implies the kernels, applies the policy's aclgraph, says why."""

import json

import pytest

from pypto_kernels_gutenocr import DynamicPTOConfig
from pypto_models_gutenocr import EXIT
from pypto_models_gutenocr.cli import main
from pypto_testing.gutenocr import cli_argv


def _ask(folder, *extra):
    return cli_argv(
        "ask", folder, "--json", *extra, warmup=0, runs=1, output_length=2, backend="eager"
    )


@pytest.fixture(autouse=True)
def _reference_path(monkeypatch):
    monkeypatch.setenv("PYPTO_GUTENOCR_CPU_SIM", "0")  # the kernels' CPU SIM is slow


def _policy(tmp_path, **rule):
    path = tmp_path / "policy.json"
    base = {"max_batch": None, "switches": {"swiglu_mlp": True}, "reason": "from my data"}
    path.write_text(json.dumps({"schema_version": 2, "rules": [{**base, **rule}]}))
    return path


def test_alone_it_implies_the_kernels_and_the_policys_aclgraph(tiny_gutenocr, capsys):
    """Without --use_pto it used to be silently ignored (switches off, eager)."""
    rc = main(_ask(tiny_gutenocr, "--use_dynamic_config", "--batch", "2"))
    out, err = capsys.readouterr()
    assert rc == EXIT.OK, err
    report = json.loads(out)
    expected = DynamicPTOConfig.default().for_batch(2)
    assert report["use_pto"] is True
    assert report["switch_policy"]["switches"] == expected.switches
    assert report["switch_policy"]["use_acl_graph"] == expected.use_acl_graph
    assert (report["graph"]["graph"] != "eager") == bool(expected.use_acl_graph)
    calls = report["kernels"]["calls"]
    for op, on in expected.switches.items():
        assert (calls[op]["reference"] > 0) == on, op  # on: counted fallback (SIM off)
    assert "implies --use_pto" in err
    line = next(x for x in err.splitlines() if "batch 2:" in x)
    for part in ("aclgraph", "expected change", "reason:"):
        assert part in line
    assert expected.expected_source in line


def test_the_expected_change_and_its_source_come_from_the_policy_file(
    tiny_gutenocr, tmp_path, capsys
):
    path = _policy(
        tmp_path, use_acl_graph=False, expected_change_pct=7.5, expected_source="my bench, b1"
    )
    rc = main(_ask(tiny_gutenocr, "--use_dynamic_config", "--policy-file", str(path)))
    out, err = capsys.readouterr()
    assert rc == EXIT.OK, err
    report = json.loads(out)
    assert report["graph"]["graph"] == "eager"
    assert report["switch_policy"]["expected_change_pct"] == 7.5
    assert "batch 1: rms_norm=off mrope=off swiglu_mlp=on; aclgraph off" in err
    assert "expected change +7.5% (my bench, b1); reason: from my data" in err


def test_explicit_graph_flags_win_and_say_so(tiny_gutenocr, tmp_path, capsys):
    on = _policy(tmp_path, use_acl_graph=True)
    rc = main(
        _ask(tiny_gutenocr, "--use_dynamic_config", "--policy-file", str(on), "--use_compile")
    )
    out, err = capsys.readouterr()
    assert rc == EXIT.OK, err
    assert json.loads(out)["graph"]["graph"] == "torch.compile"
    assert "--use_compile given: the policy's aclgraph (on for batch 1) is not used" in err

    off = _policy(tmp_path, use_acl_graph=False)
    rc = main(
        _ask(tiny_gutenocr, "--use_dynamic_config", "--policy-file", str(off), "--use_acl_graph")
    )
    out, err = capsys.readouterr()
    assert rc == EXIT.OK, err
    assert json.loads(out)["graph"]["graph"] in ("torch.compile", "torchair")
    assert "--use_acl_graph given: kept, although the policy says off at batch 1" in err


def test_bench_baseline_keeps_the_graph_mode_and_turns_switches_off(
    tiny_gutenocr, tmp_path, capsys
):
    path = _policy(tmp_path, use_acl_graph=True, expected_change_pct=-2.0)
    rc = main(
        [
            "bench",
            *_ask(tiny_gutenocr, "--use_dynamic_config", "--policy-file", str(path))[1:],
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    assert rc == EXIT.OK, capsys.readouterr().err
    base, pto = (
        json.loads((tmp_path / "out" / f).read_text()) for f in ("baseline.json", "pypto.json")
    )
    assert base["switch_policy"] == {"policy": "off"}
    assert pto["switch_policy"]["switches"]["swiglu_mlp"] is True
    assert base["graph"]["graph"] == pto["graph"]["graph"] != "eager"
