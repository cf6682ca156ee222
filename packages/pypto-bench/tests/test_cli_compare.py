"""CLI bad input, failure isolation, plug-ins, compare and plot."""

from __future__ import annotations

import json
import shutil
import sys
import types

import pytest

from pypto_bench import EXIT, BenchConfig, compare, plot, run_bench
from pypto_bench.cli import main
from pypto_bench.errors import CompareMismatchError


def _one_line_error(capsys) -> str:
    err = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("pypto-bench: error")
    ]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--arms", "eager,turbo"], "unknown arm 'turbo'"),
        (["--regime", "training"], "unknown regime"),
        (["--gen", "0"], "--gen must be >= 1"),
        (["--regime", "diffusion-generate", "--gen", "4"], "not supported by this model"),
    ],
)
def test_bad_input_one_line_nonzero_nothing_written(tiny_llama, tmp_path, capsys, extra, needle):
    report = tmp_path / "r.json"
    code = main(
        [
            "run",
            "--model-path",
            str(tiny_llama),
            "--device",
            "cpu",
            "--report-file",
            str(report),
            *extra,
        ]
    )
    assert code == EXIT.USAGE
    assert needle in _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_missing_model_folder(tmp_path, capsys):
    code = main(["run", "--model-path", str(tmp_path / "missing"), "--device", "cpu"])
    assert code == EXIT.USAGE
    assert "does not exist" in _one_line_error(capsys)


def test_device_that_does_not_exist(tiny_llama, capsys):
    code = main(["run", "--model-path", str(tiny_llama), "--device", "cuda:7", "--gen", "2"])
    assert code == EXIT.ENVIRONMENT
    assert "cuda:7" in _one_line_error(capsys)


def test_unwritable_report_path(tiny_llama, tmp_path, capsys):
    code = main(
        [
            "run",
            "--model-path",
            str(tiny_llama),
            "--device",
            "cpu",
            "--report-file",
            str(tmp_path / "no" / "such" / "r.json"),
        ]
    )
    assert code == EXIT.USAGE
    assert "does not exist" in _one_line_error(capsys)
    code = main(
        ["run", "--model-path", str(tiny_llama), "--device", "cpu", "--report-file", str(tmp_path)]
    )
    assert code == EXIT.USAGE
    assert not (tmp_path / "no").exists()


def test_pypto_arm_without_plugin_fails_alone(tiny_llama, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(
        [
            "run",
            "--model-path",
            str(tiny_llama),
            "--device",
            "cpu",
            "--gen",
            "4",
            "--seq",
            "4",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--arms",
            "eager,pypto+graph",
            "--graph-backend",
            "eager",
            "--no-bandwidth",
            "--report-file",
            str(out),
        ]
    )
    assert code == EXIT.ARM_FAILED
    data = json.loads(out.read_text())
    assert data["ok"] is False
    eager, pg = data["arms"]
    assert eager["ok"]
    assert eager["tokens_per_s"]["best"] > 0
    assert not pg["ok"]
    assert "no kernel plug-in applies to this model (install pypto-kernels-llama)" in pg["error"]
    assert pg["explanation"] is not None
    assert "pypto+graph" in _one_line_error(capsys)


_PLUGIN = """
import contextlib

class _Plugin:
    name = "test-kernels"

    def __init__(self):
        self.on = False
        self.calls = {"pypto": 0, "reference": 0}
        self.raise_on_enable = False

    def applies_to(self, model):
        return getattr(model.config, "model_type", None) == "llama"

    @contextlib.contextmanager
    def enable(self, model):
        if self.raise_on_enable:
            raise RuntimeError("kernel library failed to load")
        norm = model.model.norm

        def hook(module, args, output):
            self.calls["pypto"] += 1

        handle = norm.register_forward_hook(hook)
        self.on = True
        try:
            yield
        finally:
            self.on = False
            handle.remove()

    def report(self):
        return {"switches": {"USE_TEST_NORM": self.on}, "calls": {"rms_norm": dict(self.calls)},
                "fallback_reasons": {}}

PLUGIN = _Plugin()
"""


def test_pypto_arm_uses_entry_point_plugin(tiny_llama, tmp_path, monkeypatch, plugin_dist):
    root = plugin_dist(tmp_path / "site", "bench_test_kernels", _PLUGIN)
    monkeypatch.syspath_prepend(str(root))
    report = run_bench(
        BenchConfig(
            model_path=str(tiny_llama),
            device="cpu",
            seq=4,
            gen=4,
            warmup=0,
            iters=2,
            arms=("eager", "pypto+graph"),
            graph_backend="eager",
            measure_bandwidth=False,
        )
    )
    assert report.ok, [a.error for a in report.arms]
    arm = report.arm("pypto+graph")
    assert arm.details["plugins"] == ["test-kernels"]
    plug = arm.details["plugin_reports"]["test-kernels"]
    assert plug["switches"]["USE_TEST_NORM"] is True  # reported while enabled
    assert plug["calls"]["rms_norm"]["pypto"] > 0
    assert arm.token_match["rate"] == 1.0
    plugin = sys.modules["bench_test_kernels"].PLUGIN
    assert plugin.on is False  # switched off again after the arm

    # A plug-in that raises fails its arm only.
    plugin.raise_on_enable = True
    report = run_bench(
        BenchConfig(
            model_path=str(tiny_llama),
            device="cpu",
            seq=4,
            gen=4,
            warmup=0,
            iters=1,
            arms=("pypto+graph", "eager"),
            graph_backend="eager",
            measure_bandwidth=False,
        )
    )
    assert not report.ok
    assert report.failed_arms == ["pypto+graph"]
    assert "kernel library failed to load" in report.arm("pypto+graph").error
    assert report.arm("eager").ok


def test_compare_ratios_refusals_markdown_plot(decode_report, tmp_path, capsys):
    _, path = decode_report
    data = json.loads(path.read_text())
    same = tmp_path / "same.json"
    shutil.copy(path, same)
    comp = compare([path, same])
    graph_rows = [r for r in comp.rows if r["arm"] == "graph"]
    assert graph_rows[1]["ratio_to_first"] == pytest.approx(1.0)
    assert "| graph |" in comp.to_markdown()
    # Every ratio the table prints carries its interval: against the first report (the
    # two reports' rounds resampled apart) and against eager (the report's paired one).
    vs_first, vs_eager = graph_rows[1]["ratio_vs_first"], graph_rows[1]["ratio_vs_eager"]
    assert vs_first["median"] == pytest.approx(1.0)
    assert vs_first["low"] <= 1.0 <= vs_first["high"]
    assert "unpaired" in vs_first["method"]
    assert vs_eager == next(a for a in data["arms"] if a["name"] == "graph")["ratio_vs_eager"]
    row = [ln for ln in comp.to_text().splitlines()[1:] if " graph " in ln][1]
    assert f"1.00 [{vs_first['low']:.2f}, {vs_first['high']:.2f}]" in row
    assert f"{vs_eager['median']:.2f} [{vs_eager['low']:.2f}, {vs_eager['high']:.2f}]" in row

    other_regime = dict(data, regime="prefill")
    other_machine = json.loads(json.dumps(data))
    other_machine["environment"]["host"] = "another-host"
    (tmp_path / "prefill.json").write_text(json.dumps(other_regime))
    (tmp_path / "machine.json").write_text(json.dumps(other_machine))
    with pytest.raises(CompareMismatchError, match="mix regimes"):
        compare([path, tmp_path / "prefill.json"])
    with pytest.raises(CompareMismatchError, match="different machines"):
        compare([data, other_machine])
    assert compare([data, other_machine], force=True).forced

    code = main(["compare", str(path), str(tmp_path / "prefill.json")])
    assert code == EXIT.USAGE
    assert "--force" in _one_line_error(capsys)
    png = tmp_path / "chart.png"
    code = main(
        [
            "compare",
            str(path),
            str(tmp_path / "prefill.json"),
            "--force",
            "--markdown",
            "--plot",
            str(png),
        ]
    )
    out = capsys.readouterr().out
    assert code == EXIT.OK
    assert "| report | arm |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    single = plot(data, tmp_path / "one.png")
    assert single.stat().st_size > 1000


def test_compare_rejects_non_reports(tmp_path, decode_report, capsys):
    _, path = decode_report
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": "1.0", "arms": []}))
    code = main(["compare", str(path), str(bad)])
    assert code == EXIT.USAGE
    assert "invalid report" in _one_line_error(capsys)


_GRAPH_BREAK_MODEL = """
from transformers import LlamaConfig, LlamaForCausalLM


class GraphBreakConfig(LlamaConfig):
    model_type = "pypto_graph_break"


class GraphBreakLM(LlamaForCausalLM):
    config_class = GraphBreakConfig

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        # A host read of a device value: a real graph break / capture failure.
        if out.logits.abs().max().item() > 1e30:
            raise RuntimeError("unreachable")
        return out
"""


def test_graph_capture_failure_is_isolated_and_explained(tiny_llama, tmp_path, capsys):
    folder = tmp_path / "graphbreak"
    shutil.copytree(tiny_llama, folder)
    (folder / "modeling_graph_break.py").write_text(_GRAPH_BREAK_MODEL)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        model_type="pypto_graph_break",
        architectures=["GraphBreakLM"],
        auto_map={
            "AutoConfig": "modeling_graph_break.GraphBreakConfig",
            "AutoModelForCausalLM": "modeling_graph_break.GraphBreakLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "r.json"
    code = main(
        [
            "run",
            "--model-path",
            str(folder),
            "--device",
            "cpu",
            "--trust-remote-code",
            "--gen",
            "4",
            "--seq",
            "4",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--arms",
            "graph,eager",
            "--graph-backend",
            "compile",
            "--no-bandwidth",
            "--report-file",
            str(out),
        ]
    )
    assert code == EXIT.ARM_FAILED
    data = json.loads(out.read_text())
    graph, eager = data["arms"]
    assert not graph["ok"]
    assert graph["explanation"]["code"] is not None
    # bisect_capture ran (real pypto-capture): its per-stage verdicts are in the report.
    assert graph["bisect"]["stages"]
    assert "error" not in graph["bisect"]
    assert eager["ok"]
    assert eager["tokens_per_s"]["best"] > 0
    err = capsys.readouterr().err
    assert "graph" in err


_MASK_MAPPING_MODEL = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM


class MaskMappingConfig(LlamaConfig):
    model_type = "pypto_mask_mapping"


class MaskMappingLM(LlamaForCausalLM):
    config_class = MaskMappingConfig

    def forward(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            # Like Falcon-H1 reading its {layer_type: mask} mapping: this model's mapping
            # lacks the key it reads, a KeyError raised by its own code while traced.
            masks = {"hybrid": kwargs.get("attention_mask")}
            kwargs["attention_mask"] = masks["full_attention"]
        return super().forward(*args, **kwargs)
"""


def test_a_models_own_exception_in_the_graph_arm_is_named_not_called_a_host_sync(
    tiny_llama, tmp_path, capsys
):
    folder = tmp_path / "maskmapping"
    shutil.copytree(tiny_llama, folder)
    (folder / "modeling_mask_mapping.py").write_text(_MASK_MAPPING_MODEL)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        model_type="pypto_mask_mapping",
        architectures=["MaskMappingLM"],
        auto_map={
            "AutoConfig": "modeling_mask_mapping.MaskMappingConfig",
            "AutoModelForCausalLM": "modeling_mask_mapping.MaskMappingLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "r.json"
    code = main(
        [
            "run", "--model-path", str(folder), "--device", "cpu", "--trust-remote-code",
            "--gen", "2", "--seq", "4", "--warmup", "0", "--iters", "1",
            "--arms", "eager,graph", "--graph-backend", "compile", "--no-bandwidth",
            "--report-file", str(out),
        ]
    )  # fmt: skip
    assert code == EXIT.ARM_FAILED
    graph = json.loads(out.read_text())["arms"][1]
    assert not graph["ok"]
    assert graph["error"].startswith("CaptureFailedError [KeyError: 'full_attention']: ")
    expl = graph["explanation"]
    assert expl["code"] == "model_error"
    assert (expl["cause_type"], expl["cause_message"]) == ("KeyError", "'full_attention'")
    assert "host sync" not in expl["cause"]
    assert "host sync" not in graph["error"]
    err = capsys.readouterr().err
    assert "graph: CaptureFailedError [KeyError: 'full_attention']" in err  # the arm's line
    assert "arm(s) failed: graph (KeyError: 'full_attention')" in err  # the last line


def test_no_plugin_message_names_the_family_kernel_package():
    """A hybrid whose layers no installed plug-in can run is pointed at the one package
    that holds the Gated DeltaNet / KDA step kernels, not at a made-up name."""
    import torch

    from pypto_bench.errors import PluginError
    from pypto_bench.plugins import applicable_plugins

    class Bare(torch.nn.Module):
        config = types.SimpleNamespace(model_type="qwen3_5_text")

    with pytest.raises(PluginError, match=r"\(install pypto-kernels-linear-attention\)"):
        applicable_plugins(Bare())
