"""``pypto-precision dump`` and ``check`` (registered by pypto-bench through the
``pypto_precision.commands`` entry point) on a real tiny Llama folder: a correct port passes
against the noise floor, a planted wrong weight fails and is named at its module, bad
inputs are one line with the documented codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from pypto_precision import EXIT, read_dump
from pypto_precision.cli import main
from pypto_testing.models import make_tiny_model
from pypto_testing.planted import OnePercentMLP

CLI = shutil.which("pypto-precision", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("precision") / "tiny", num_hidden_layers=3)


@pytest.fixture(scope="module")
def planted(tiny, tmp_path_factory) -> Path:
    """The same folder with one weight loaded 1% wrong (layer 1's MLP down projection)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("planted") / "tiny"
    shutil.copytree(tiny, folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"] *= 1.01
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_the_commands_are_registered_in_the_real_console_script(tmp_path):
    assert CLI is not None
    done = subprocess.run([CLI, "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0
    assert "check" in done.stdout
    assert "dump" in done.stdout


def test_a_correct_port_passes_fp32_and_bf16(tiny, tmp_path, capsys):
    assert main(["check", "--model-path", str(tiny), "--out", str(tmp_path / "fp32")]) == EXIT.OK
    report = json.loads((tmp_path / "fp32" / "check.json").read_text())
    assert report["reference"]["dtype"] == "float64"  # a tiny model: the float64 reference
    assert report["logits"]["metrics"]["kl_max"] < 1e-9
    assert report["logits"]["metrics"]["top1_agreement"] == 1.0
    code = main(["check", "--model-path", str(tiny), "--dtype", "bfloat16", "--locate",
                 "--out", str(tmp_path / "bf16")])  # fmt: skip
    assert code == EXIT.OK
    report = json.loads((tmp_path / "bf16" / "check.json").read_text())
    assert report["logits"]["floor"] is not None  # judged against bf16's own error
    assert report["first_divergent"] is None  # every module within k x its floor
    assert (tmp_path / "bf16" / "modules" / "compare.html").is_file()
    capsys.readouterr()


def test_a_planted_wrong_weight_fails_and_names_its_module(tiny, planted, tmp_path, capsys):
    out = tmp_path / "check"
    code = main(["check", "--model-path", str(planted), "--reference-model-path", str(tiny),
                 "--out", str(out), "--json"])  # fmt: skip
    assert code == EXIT.DIVERGED
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["first_divergent"] == "model.layers.1.mlp.down_proj#0"
    assert (
        "first diverging module: model.layers.1.mlp.down_proj#0" in (out / "check.md").read_text()
    )


def test_dump_then_compare_names_the_module(tiny, planted, tmp_path, capsys):
    for name, folder in (("ref", tiny), ("bad", planted)):
        code = main(["dump", "--model-path", str(folder), "--mode", "tensor",
                     "--out", str(tmp_path / name)])  # fmt: skip
        assert code == EXIT.OK
    assert read_dump(tmp_path / "ref").meta["model"]["class"] == "LlamaForCausalLM"
    capsys.readouterr()
    code = main(["compare", str(tmp_path / "bad"), str(tmp_path / "ref"), "--json"])
    assert code == EXIT.DIVERGED
    result = json.loads(capsys.readouterr().out)
    assert result["first_divergent"]["module"] == "model.layers.1.mlp.down_proj#0"


def test_bad_inputs_are_one_line(tiny, tmp_path, capsys):
    (tmp_path / "exists").mkdir()
    cases = [
        (["dump", "--model-path", str(tiny), "--out", str(tmp_path / "exists")], EXIT.FAILED),
        (["dump", "--model-path", str(tmp_path / "nope"), "--out", str(tmp_path / "d")], EXIT.USAGE),
        (["check", "--model-path", str(tiny), "--dtype", "int3", "--out", str(tmp_path / "c")],
         EXIT.USAGE),
        (["check", "--model-path", str(tiny), "--k", "-1"], EXIT.USAGE),
    ]  # fmt: skip
    for argv, want in cases:
        capsys.readouterr()
        assert main(argv) == want, argv
        err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
        assert len(err) == 1, (argv, err)
    assert not (tmp_path / "d").exists()
    assert not (tmp_path / "c").exists()


def test_replay_inputs_tells_the_module_wrong_on_its_own(tiny, planted, tmp_path, capsys):
    """Accumulated, every module after the wrong weight fails too; replayed on the target's
    own inputs, only the wrong one does."""
    out = tmp_path / "replay"
    code = main(["check", "--model-path", str(planted), "--reference-model-path", str(tiny),
                 "--replay-inputs", "--out", str(out)])  # fmt: skip
    assert code == EXIT.DIVERGED
    report = json.loads((out / "check.json").read_text())
    assert report["first_wrong_on_its_own"] == "model.layers.1.mlp.down_proj#0"
    accumulated = json.loads((out / "modules" / "compare.json").read_text())
    local = json.loads((out / "local" / "compare.json").read_text())
    assert accumulated["failed"] > 1
    assert local["failed"] == 1
    assert "wrong on its own: model.layers.1.mlp.down_proj#0" in capsys.readouterr().err


def test_a_broken_kernel_plugin_is_caught_with_kernels(tiny, tmp_path, capsys):
    import pypto_bench

    plugin = OnePercentMLP()
    pypto_bench.register_plugin(plugin)  # the library hook: treated as an installed entry point
    try:
        code = main(["check", "--model-path", str(tiny), "--kernels", "--out", str(tmp_path / "k")])
        assert code == EXIT.DIVERGED
        report = json.loads((tmp_path / "k" / "check.json").read_text())
        assert report["target"]["kernels"] == ["broken_mlp"]
        assert report["first_divergent"] == "model.layers.1.mlp#0"
        # without --kernels the same folder passes: the plug-in is the culprit
        assert main(["check", "--model-path", str(tiny), "--out", str(tmp_path / "plain")]) == 0
    finally:
        pypto_bench.unregister_plugin(plugin)
    capsys.readouterr()


def test_the_reference_dtype_follows_the_weight_size(tiny, tmp_path):
    import torch
    from safetensors.torch import save_file

    from pypto_bench.reference import FLOAT64_REFERENCE_BELOW, reference_dtype

    assert reference_dtype(tiny) == "float64"
    big = tmp_path / "big"
    shutil.copytree(tiny, big)
    # bf16 weights of 0.6 GB: 1.2 GB at float64, over the 1 GB line (bf16 bytes alone are not)
    n = int(0.6 * FLOAT64_REFERENCE_BELOW) // 2
    save_file({"w": torch.zeros(n, dtype=torch.bfloat16)}, str(big / "model.safetensors"))
    assert reference_dtype(big) == "float32"


def test_a_folder_that_ships_its_own_code_is_not_run(tiny, tmp_path, capsys):
    """A stranger's modeling file is never imported unless --trust-remote-code: check and
    dump refuse in one line and the file's side effect never happens."""
    folder = tmp_path / "remote"
    shutil.copytree(tiny, folder)
    marker = tmp_path / "ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="evil_arch", auto_map={"AutoModelForCausalLM": "modeling_evil.Evil"})
    (folder / "config.json").write_text(json.dumps(cfg))
    for argv in (["check", "--model-path", str(folder), "--out", str(tmp_path / "c")],
                 ["dump", "--model-path", str(folder), "--out", str(tmp_path / "d")]):  # fmt: skip
        assert main(argv) == EXIT.FAILED
        err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
        assert len(err) == 1
        assert "--trust-remote-code" in err[0]
    assert not marker.exists()
    assert not (tmp_path / "d").exists()


@pytest.fixture(scope="module")
def rotary_pinned(tiny, tmp_path_factory) -> Path:
    """The tiny folder pinned by pypto-patch (custom mode, an overlay) to a modeling file
    whose layer 1 computes its rotary embedding with 4x the configured base, inline in its
    attention: same module names, same weights, a wrong constant in the code."""
    from pypto_patch import apply
    from pypto_testing.planted import write_rotary_planted_code

    root = tmp_path_factory.mktemp("rotary")
    code = root / "modeling_planted.py"
    auto_map = write_rotary_planted_code(code, layer=1, factor=4.0)
    overlay = root / "overlay"
    apply(tiny, auto_map={"AutoModelForCausalLM": auto_map},
          copies={"modeling_planted.py": code}, output_dir=overlay)  # fmt: skip
    return overlay


@pytest.mark.parametrize("replay", [False, True], ids=["accumulated", "replay-inputs"])
def test_a_pinned_file_with_a_wrong_rotary_base_in_one_layer_is_named(
    tiny, rotary_pinned, tmp_path, capsys, replay
):
    """Did pinning change the numbers? The pinned overlay against the original folder: the
    first diverging module is layer 1's attention, whose own code computed the rotary
    embedding, not its output projection that was merely fed the wrong numbers."""
    out = tmp_path / "check"
    argv = ["check", "--model-path", str(rotary_pinned), "--trust-remote-code",
            "--reference-model-path", str(tiny), "--out", str(out)]  # fmt: skip
    assert main(argv + (["--replay-inputs"] if replay else [])) == EXIT.DIVERGED
    report = json.loads((out / "check.json").read_text())
    assert report["first_divergent"] == "model.layers.1.self_attn#0"
    compared = json.loads((out / "modules" / "compare.json").read_text())
    passed = {r["module"] for r in compared["rows"] if r["verdict"]["ok"]}
    # layer 0 and layer 1's projections before the rotary embedding compute what they should
    assert {"model.layers.0#0", "model.layers.1.self_attn.q_proj#0"} <= passed
    err = capsys.readouterr().err
    assert "first diverging module: model.layers.1.self_attn#0" in err
    if replay:  # no leaf is wrong on its own: the attention's own code is
        assert report["first_wrong_on_its_own"] is None
        assert "look in model.layers.1.self_attn#0's own code" in err
