"""Interop with the real msprobe (PyPI mindstudio-probe), both directions, on a tiny Llama.

Runs where msprobe is installed: `nox -s msprobe` installs it in a venv of its own and runs
this file; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

msprobe = pytest.importorskip(
    "msprobe", reason="msprobe (mindstudio-probe) is not installed: nox -s msprobe"
)
pytest.importorskip("transformers")

from pypto_precision import Recorder, compare_dumps, read_dump, write_msprobe  # noqa: E402
from pypto_testing.models import tiny_config  # noqa: E402

IDS = torch.tensor([[5, 9, 17, 33, 65, 129]])


def _model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config("llama", num_hidden_layers=2)).eval()


# msprobe's debugger is one per process (a second dump_path is ignored): each dump runs in
# a process of its own, as a user's script would.
SCRIPT = """
import sys, torch
from msprobe.pytorch import PrecisionDebugger
sys.path.insert(0, sys.argv[3])
from test_msprobe import _model, IDS
model = _model()
if sys.argv[2] == "planted":  # inside forward: msprobe records a module's own output
    mlp = model.model.layers[1].mlp
    mlp.forward = lambda x, forward=mlp.forward: forward(x) * 1.01
debugger = PrecisionDebugger(task="tensor", level="L0", dump_path=sys.argv[1])
with torch.no_grad():
    debugger.start(model=model)
    model(IDS)
    debugger.stop()
    debugger.step()
"""


def _msprobe_dump(folder: Path, planted: bool = False) -> Path:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), "planted" if planted else "clean",
         str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (step,) = sorted(folder.glob("step*"))
    return step


def _ours(model: torch.nn.Module, folder: Path) -> Path:
    with torch.no_grad(), Recorder(model, folder, mode="tensor", with_inputs=True):
        model(IDS)
    return folder


def test_an_msprobe_dump_is_either_side_of_our_compare(tmp_path):
    model = _model()
    theirs = _msprobe_dump(tmp_path / "msprobe")
    ours = _ours(model, tmp_path / "ours")
    read = read_dump(theirs)
    assert read.source == "msprobe"
    assert read.mode == "tensor"
    for target, reference in ((ours, theirs), (theirs, ours)):
        result = compare_dumps(read_dump(target), read_dump(reference))
        assert result.ok, result.first_divergent
        assert len(result.rows) >= 20  # every layer's modules aligned by name and call
    # a planted 1% error in msprobe's run is named by our compare at its module
    planted = _msprobe_dump(tmp_path / "planted", planted=True)
    result = compare_dumps(read_dump(planted), read_dump(ours))
    assert not result.ok
    assert result.first_divergent.module == "model.layers.1.mlp#0"


def test_msprobe_compare_reads_the_dump_we_write(tmp_path):
    model = _model()
    theirs = _msprobe_dump(tmp_path / "msprobe")
    proc = write_msprobe(read_dump(_ours(model, tmp_path / "ours")), tmp_path / "as-msprobe")
    cli = shutil.which("msprobe", path=str(Path(sys.executable).parent)) or "msprobe"
    out = tmp_path / "out"
    done = subprocess.run(
        [cli, "compare", "--target_path", str(proc.parent), "--golden_path", str(theirs),
         "--output_path", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (table,) = out.glob("compare_result_*.csv")
    rows = list(csv.DictReader(table.open()))
    # msprobe matched our outputs with its own by name (the top LlamaModel it does not
    # record: "N/A" there), and measured them equal
    outputs = [r for r in rows if ".output." in r["NPU Name"] and r["Bench Name"] != "N/A"]
    assert len(outputs) >= 10
    assert all(r["Bench Name"] == r["NPU Name"] for r in outputs)
    assert all(float(r["Cosine"]) > 0.999999 and float(r["MaxAbsErr"]) < 1e-6 for r in outputs)
    assert {r["Result"] for r in outputs} == {"pass"}, {r["Err_message"] for r in outputs}
