"""--nproc / --placement pipeline requests refused before anything starts, with the
documented code (issue 27, items 11 and 12): an unusable --rank-timeout (2), a missing
accelerate (3), a tokenizer that ships code (40 in both placements), a config declaring
absurdly many layers (2) and planning that runs over --rank-timeout (48).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pypto_bench import BenchConfig
from pypto_bench.cli import main
from pypto_bench.config import MAX_RANK_TIMEOUT
from pypto_bench.errors import EXIT, BadInputError
from pypto_bench.multi import visible_devices
from pypto_bench.multi.pipeline import MAX_PIPELINE_LAYERS

pytestmark = pytest.mark.skipif(visible_devices("cpu") < 2, reason="needs 2 CPU cores")


def _argv(folder: Path, *extra: str) -> list[str]:
    return ["run", "--model-path", str(folder), "--device", "cpu", "--regime", "prefill",
            "--seq", "8", "--arms", "eager", "--warmup", "0", "--iters", "1", "--dtype",
            "float32", "--no-bandwidth", "--nproc", "2", *extra]  # fmt: skip


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("pypto-bench: error: ")
    return lines[0]


# --- item 12 (a): --rank-timeout ---------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "-5", "0", str(MAX_RANK_TIMEOUT * 2)])
@pytest.mark.parametrize("placement", ["tensor", "pipeline"])
def test_an_unusable_rank_timeout_is_a_usage_error_before_launch(
    tiny_llama, tmp_path, capsys, value, placement
):
    report = tmp_path / "r.json"
    code = main(
        _argv(tiny_llama, "--rank-timeout", value, "--placement", placement,
              "--report-file", str(report))
    )  # fmt: skip
    line = _one_error_line(capsys.readouterr().err)
    assert code == EXIT.USAGE
    assert "--rank-timeout" in line
    assert "finite" in line
    assert "--rank-timeout 600" in line  # the fix
    assert not report.exists()
    assert not list(tmp_path.iterdir())


def test_the_rank_timeout_is_checked_by_the_library_too():
    for bad in (float("inf"), float("nan"), 1e300, True, "600"):
        with pytest.raises(BadInputError, match="--rank-timeout"):
            BenchConfig(model_path="x", rank_timeout=bad).validate()  # type: ignore[arg-type]
    BenchConfig(model_path="x", nproc=2, arms=("eager",), regime="prefill",
                rank_timeout=MAX_RANK_TIMEOUT).validate()  # fmt: skip


# --- item 12 (b): accelerate -------------------------------------------------------------


@pytest.fixture(scope="module")
def no_accelerate(tmp_path_factory) -> dict[str, str]:
    """An environment without a usable accelerate, as transformers and Python see it: a
    package first on the path whose import raises ImportError, and metadata (found first
    too) naming a version below transformers' minimum, so transformers takes it for
    absent and never imports it itself (as with no accelerate installed)."""
    shadow = tmp_path_factory.mktemp("no-accelerate")
    (shadow / "accelerate").mkdir()
    (shadow / "accelerate" / "__init__.py").write_text(
        "raise ImportError('No module named accelerate (made unimportable by the test)')\n"
    )
    info = shadow / "accelerate-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate\nVersion: 0.0.1\n")
    path = os.pathsep.join(p for p in (str(shadow), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize("placement", ["tensor", "pipeline"])
def test_missing_accelerate_is_an_environment_error_before_anything_starts(
    tiny_llama, tmp_path, no_accelerate, placement
):
    report = tmp_path / "r.json"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_bench", "-v",
         *_argv(tiny_llama, "--placement", placement, "--report-file", str(report))],
        env={**no_accelerate, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == EXIT.ENVIRONMENT, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("pypto-bench: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "needs accelerate" in errors[0]
    assert "pip install 'pypto-bench[distributed]'" in errors[0]
    assert "launching" not in proc.stderr  # no rank started
    assert "baseline" not in proc.stderr.lower()  # nor the 1-rank run
    assert not report.exists()
    assert not list(tmp.iterdir())


# --- item 12 (c): a tokenizer that ships code --------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_with_code(tiny_llama, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model whose tokenizer_config.json names a class of its own code (auto_map)."""
    base = tmp_path_factory.mktemp("tokenizer-code")
    folder = base / "model"
    shutil.copytree(tiny_llama, folder)
    ran = base / "tokenizer-code-ran"
    (folder / "tokenization_evil.py").write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n"
    )
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc.update(
        tokenizer_class="EvilTokenizer",
        auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]},
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    return folder, ran


@pytest.mark.parametrize("placement", ["tensor", "pipeline"])
def test_a_tokenizer_with_its_own_code_is_the_same_load_error_in_both_placements(
    tokenizer_with_code, tmp_path, capsys, placement
):
    folder, ran = tokenizer_with_code
    report = tmp_path / "r.json"
    code = main(_argv(folder, "--placement", placement, "--report-file", str(report)))
    line = _one_error_line(capsys.readouterr().err)
    assert code == EXIT.LOAD_FAILED  # 40, as the single-process run: not 48 (rank failed)
    assert "needs its own code" in line
    assert "--trust-remote-code" in line
    assert "rank" not in line
    assert not ran.exists()
    assert not report.exists()


# --- item 11: the pipeline's planning is bounded ------------------------------------------


def _with_layers(tiny_llama: Path, dest: Path, layers: int) -> Path:
    shutil.copytree(tiny_llama, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_a_config_declaring_200000_layers_is_refused_before_planning(tiny_llama, tmp_path, capsys):
    folder = _with_layers(tiny_llama, tmp_path / "huge", 200_000)
    start = time.monotonic()
    code = main(_argv(folder, "--placement", "pipeline"))
    took = time.monotonic() - start
    line = _one_error_line(capsys.readouterr().err)
    assert code == EXIT.USAGE
    assert "200000 decoder layers" in line
    assert str(MAX_PIPELINE_LAYERS) in line
    assert took < 120  # not the minutes of building 200000 layers


def test_planning_that_runs_over_the_rank_timeout_ends_the_run(tiny_llama, tmp_path, capsys):
    """1000 layers (allowed) take far longer than 1 ms to build, on any machine."""
    folder = _with_layers(tiny_llama, tmp_path / "deep", 1000)
    code = main(_argv(folder, "--placement", "pipeline", "--rank-timeout", "0.001"))
    line = _one_error_line(capsys.readouterr().err)
    assert code == EXIT.RANK_FAILED
    assert "planning the 2 pipeline stages" in line
    assert "(1000 layers)" in line
    assert "--rank-timeout 0.001" in line
