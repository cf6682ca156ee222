"""The ``pypto-capture`` command: ``bisect --model-path DIR`` and ``explain CODE|MESSAGE``.

pypto-tune recommends ``pypto-capture bisect`` and ``explain`` for graph breaks (issue 27,
item 8). The explain tests and bisect's refusals before a model loads need torch only (the
core install); bisect on real tiny model folders needs the test-hf extra (``needs_hf``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_capture import EXIT
from pypto_capture.cli import main


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _files(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pypto-capture: error: "), err
    return lines[0]


# --------------------------------------------------------------------------- explain


def test_explain_a_code_prints_cause_and_fix(capsys):
    code, out, err = _run(capsys, ["explain", "107030"])
    assert code == EXIT.OK
    assert out == ""
    assert "ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT" in err
    assert "fix:" in err
    assert "make_capture_safe_cache" in err


def test_explain_the_cuda_codes_its_help_names(capsys):
    """`explain 900`, the example in its own help, answered 95 "unrecognised"."""
    for bare, name in (("900", "cudaErrorStreamCaptureUnsupported"),
                       ("901", "cudaErrorStreamCaptureInvalidated")):  # fmt: skip
        code, _out, err = _run(capsys, ["explain", bare])
        assert code == EXIT.OK, err
        assert name in err
    # inside a message without an error context a bare 900 is still a size, not a code
    from pypto_capture import explain_capture_error

    assert explain_capture_error("allocated 900 bytes for the step").matched is False


def test_explain_a_pasted_message_as_json(capsys):
    code, out, _err = _run(
        capsys, ["explain", "CUDA", "error:", "operation not permitted when stream is capturing"]
    )
    assert code == EXIT.OK
    code, out, _ = _run(
        capsys, ["explain", "operation not permitted when stream is capturing", "--json"]
    )
    doc = json.loads(out)
    assert (doc["code"], doc["matched"]) == ("900", True)


def test_explain_with_moe_context_gives_the_moe_fix(capsys):
    code, out, _ = _run(capsys, ["explain", "107027", "--context", "moe", "--json"])
    assert code == EXIT.OK
    assert "apply_exact_moe" in json.loads(out)["fix"]


def test_explain_reads_a_long_message_from_stdin(capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("Traceback ...\nerror code is 107025\n"))
    code, out, _ = _run(capsys, ["explain", "-", "--json"])
    assert code == EXIT.OK
    assert json.loads(out)["code"] == "107025"


def test_explain_an_unknown_error_says_so_with_its_own_code(capsys):
    code, out, err = _run(capsys, ["explain", "the", "printer", "is", "on", "fire", "--json"])
    assert code == EXIT.UNRECOGNISED
    assert json.loads(out)["matched"] is False
    assert "bisect" in err


def test_explain_nothing_is_a_usage_error(capsys):
    code, out, err = _run(capsys, ["explain", "   "])
    assert code == EXIT.USAGE
    assert out == ""
    assert "nothing to explain" in _one_error_line(err)


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["explain"], ["bisect"], ["bisect", "--model-path", "x", "--nope"]],
    ids=["no-command", "unknown-command", "explain-no-text", "bisect-no-path", "unknown-flag"],
)
def test_bad_usage_exits_2(capsys, argv):
    code, out, _ = _run(capsys, argv)
    assert code == EXIT.USAGE
    assert out == ""


def test_the_console_script_and_module_entry_points_run():
    """The installed ``pypto-capture`` script (pyproject [project.scripts]) and ``-m``."""
    script = Path(sys.executable).with_name("pypto-capture")
    assert script.is_file(), "pypto-capture is not installed as a console script"
    proc = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "{bisect,explain}" in proc.stdout
    assert "90  STAGE_FAILED" in proc.stdout  # the exit codes are in the help
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_capture", "explain", "507015", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["code"] == "507015"


# --------------------------------------------------------------------------- bisect

# The bisect tests that load a model need transformers and pypto-testing (the test-hf
# extra); the refusals before any load run on the torch-only core install too.
needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("pypto_testing") is None,
    reason="needs transformers and pypto-testing (pip install 'pypto-capture[test-hf]')",
)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from pypto_testing import models

    return models.make_tiny_model(tmp_path_factory.mktemp("cli") / "llama", "llama")


@needs_hf
def test_bisect_a_local_folder_reports_every_stage(capsys, llama):
    before = _files(llama)
    code, out, err = _run(
        capsys,
        ["bisect", "--model-path", str(llama), "--backend", "eager", "--device", "cpu", "--json"],
    )
    assert code == EXIT.OK, err
    doc = json.loads(out)
    assert doc["failed_stage"] is None
    assert doc["model_path"] == str(llama)
    assert [s["stage"] for s in doc["stages"]] == ["embed_norm", "attention", "layer", "moe"]
    assert [s["ok"] for s in doc["stages"]] == [True, True, True, None]
    assert "every stage captured" in err
    assert _files(llama) == before


@needs_hf
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bisect_names_the_stage_a_host_sync_breaks_and_exits_90(capsys, llama, monkeypatch):
    """A real graph break (``.item()`` in attention) under the real compile backend."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaAttention.forward

    def host_synced(self, hidden_states, *args, **kwargs):
        if hidden_states.abs().sum().item() >= 0:  # a host read inside the region
            return original(self, hidden_states, *args, **kwargs)
        return original(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", host_synced)
    code, out, err = _run(
        capsys,
        ["bisect", "--model-path", str(llama), "--backend", "compile", "--device", "cpu", "--json"],
    )
    assert code == EXIT.STAGE_FAILED, err
    doc = json.loads(out)
    assert doc["failed_stage"] == "attention"
    assert doc["explanation"]["code"] == "graph_break"
    assert "first failing stage: attention" in err


def _folder(tmp_path: Path, config: object | str | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (folder / "config.json").write_text(text)
    return folder


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (None, "no config.json"),
        ("{not json", "not valid JSON"),
        ("[" * 5000 + "]" * 5000, "levels deep"),
        ([1, 2], "not an object"),
    ],
    ids=["no-config", "bad-json", "deep", "not-object"],
)
def test_bisect_refuses_a_folder_that_is_no_model(capsys, tmp_path, config, says):
    folder = _folder(tmp_path, config)
    before = _files(folder)
    code, out, err = _run(capsys, ["bisect", "--model-path", str(folder)])
    assert code == EXIT.MODEL_NOT_FOUND
    assert out == ""
    assert says in _one_error_line(err)
    assert _files(folder) == before


def test_bisect_refuses_a_missing_path_and_a_file(capsys, tmp_path):
    code, _, err = _run(capsys, ["bisect", "--model-path", str(tmp_path / "absent")])
    assert code == EXIT.MODEL_NOT_FOUND
    assert "does not exist" in _one_error_line(err)
    file = tmp_path / "config.json"
    file.write_text("{}")
    code, _, err = _run(capsys, ["bisect", "--model-path", str(file)])
    assert code == EXIT.MODEL_NOT_FOUND
    assert "is not a folder" in _one_error_line(err)


@needs_hf
def test_bisect_never_runs_a_folders_own_code(capsys, tmp_path):
    """A folder whose auto_map points at code it ships is refused before anything imports it."""
    marker = tmp_path / "the-folder-code-ran"
    folder = _folder(
        tmp_path,
        {
            "model_type": "not_a_registered_type",
            "architectures": ["EvilForCausalLM"],
            "auto_map": {
                "AutoConfig": "configuration_evil.EvilConfig",
                "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
            },
        },
    )
    payload = f"open({str(marker)!r}, 'w').write('ran')\n"
    (folder / "configuration_evil.py").write_text(payload)
    (folder / "modeling_evil.py").write_text(payload)
    before = _files(folder)
    code, out, err = _run(capsys, ["bisect", "--model-path", str(folder)])
    assert code == EXIT.REMOTE_CODE
    assert out == ""
    line = _one_error_line(err)
    assert "never runs a folder's code" in line
    assert not marker.exists()
    assert _files(folder) == before


@needs_hf
def test_bisect_of_a_pinned_folder_says_transformers_own_class_ran(capsys, tmp_path, llama):
    """Issue #43 second pass, L10: a folder pinned to code (auto_map) of a type transformers
    knows was bisected as transformers' own class without a word; the folder's code never
    runs, and stderr now says which class fell back in its place."""
    import shutil

    folder = tmp_path / "pinned"
    shutil.copytree(llama, folder)
    marker = tmp_path / "the-folder-code-ran"
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_pin.PinnedForCausalLM"}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "modeling_pin.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    code, out, err = _run(
        capsys,
        ["bisect", "--model-path", str(folder), "--backend", "eager", "--device", "cpu", "--json"],
    )
    assert code == EXIT.OK, err
    assert json.loads(out)["failed_stage"] is None
    assert "LlamaForCausalLM for model type 'llama' falls back in its place" in err
    assert "pypto_capture.bisect_capture(model)" in err
    assert not marker.exists()


@needs_hf
def test_bisect_of_a_folder_without_weights_is_a_load_failure(capsys, tmp_path, llama):
    folder = tmp_path / "noweights"
    folder.mkdir()
    (folder / "config.json").write_bytes((llama / "config.json").read_bytes())
    code, out, err = _run(capsys, ["bisect", "--model-path", str(folder), "--device", "cpu"])
    assert code == EXIT.LOAD_FAILED
    assert out == ""
    assert "loading" in _one_error_line(err)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]


@needs_hf
@pytest.mark.parametrize(
    ("flags", "exit_name"),
    [
        (["--device", "gpu"], "USAGE"),
        (["--device", "npu:7"], "ENVIRONMENT"),
        (["--layer-index", "99"], "UNSUPPORTED_MODEL"),
        (["--batch-size", "0"], "USAGE"),
        (["--backend", "magic"], "USAGE"),
        (["--dtype", "float8"], "USAGE"),
    ],
    ids=["bad-device-spec", "absent-device", "no-such-layer", "batch-0", "backend", "dtype"],
)
def test_bisect_bad_flags_exit_with_their_code(capsys, llama, flags, exit_name):
    before = _files(llama)
    code, out, err = _run(capsys, ["bisect", "--model-path", str(llama), *flags])
    assert code == getattr(EXIT, exit_name), err
    assert out == ""
    assert _files(llama) == before


def test_bisect_without_transformers_is_an_environment_error(tmp_path):
    """A torch-only install (pypto-capture without [hf]): one line naming the extra."""
    folder = _folder(tmp_path, {"model_type": "llama"})
    shadow = tmp_path / "shadow"
    (shadow / "transformers").mkdir(parents=True)
    (shadow / "transformers" / "__init__.py").write_text(
        "raise ImportError('no transformers here', name='transformers')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pypto_capture", "bisect", "--model-path", str(folder)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == EXIT.ENVIRONMENT, proc.stderr
    assert "pip install 'pypto-capture[hf]'" in _one_error_line(proc.stderr)


@needs_hf
def test_bisect_refuses_a_cache_past_free_memory_before_allocating(tmp_path, llama):
    """`bisect --max-cache-len 100000000` allocated ~21 GB and was OOM-killed (issue 43,
    item 14): the cache's bytes are estimated first and a size past the device's free
    memory is a usage error in one line, exit 2, in a real process whose peak memory
    stays far below the cache it was asked for."""
    from pypto_capture.device import free_bytes

    free = free_bytes("cpu")
    assert free is not None
    # The peak is this process's own (VmHWM of its memory map, new at exec): getrusage's
    # ru_maxrss keeps the high water of the forked parent's image across exec on Linux, so
    # beside a 4 GB pytest worker it read 4.37 GB for a child that used 0.35 GB.
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['pypto-capture'] + sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_module('pypto_capture', run_name='__main__')\n"
        "finally:\n"
        "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
        "    sys.stdout.write(f'PEAK_KIB={hwm[0].split()[1]}\\n')\n"
    )
    before = _files(llama)
    proc = subprocess.run(
        [sys.executable, "-c", probe, "bisect", "--model-path", str(llama), "--device", "cpu",
         "--backend", "eager", "--max-cache-len", "100000000"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == EXIT.USAGE, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("pypto-capture: error: ")]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert proc.stderr.rstrip().endswith(line)  # the last word, no traceback after it
    assert "max_cache_len=100000000" in line
    assert "GiB free" in line
    assert "--max-cache-len" in line
    peak_kib = int(proc.stdout.rsplit("PEAK_KIB=", 1)[1])
    assert peak_kib * 1024 < 4 * 2**30  # the model and torch, never the 20+ GB cache
    assert _files(llama) == before
    assert not list(tmp_path.iterdir())


@needs_hf
def test_the_cache_estimate_equals_the_allocated_rings(llama, tmp_path):
    """static_cache_bytes (config only) equals what the built cache holds after a prefill,
    on a full-attention Llama and on a sliding-window Gemma 3 (its rings are the window)."""
    from transformers import AutoModelForCausalLM

    from pypto_capture import DecodeStepRunner, static_cache_bytes
    from pypto_testing import models

    gemma3 = models.make_tiny_model(tmp_path / "gemma3", "gemma3")
    for folder, length in ((llama, 24), (gemma3, 40)):
        model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        runner = DecodeStepRunner(
            model, batch_size=2, max_cache_len=length, backend="eager", device="cpu"
        )
        import torch

        with torch.no_grad():
            runner.prefill(torch.zeros(2, 3, dtype=torch.long))
        held = runner.cache.describe()["kv_bytes"]
        assert static_cache_bytes(model, batch_size=2, max_cache_len=length) == held, folder


def test_a_hostile_layer_count_is_refused_before_any_list_is_built():
    from types import SimpleNamespace

    from pypto_capture import CacheDoesNotFitError, static_cache_bytes

    config = SimpleNamespace(
        num_hidden_layers=10**12, num_attention_heads=4, num_key_value_heads=2, head_dim=8
    )
    with pytest.raises(CacheDoesNotFitError, match="num_hidden_layers=1000000000000"):
        static_cache_bytes(config, batch_size=1, max_cache_len=16)
    # a config with nonsense types counts nothing rather than failing on them
    odd = SimpleNamespace(num_hidden_layers="3", num_attention_heads=None)
    assert static_cache_bytes(odd, batch_size=1, max_cache_len=16) == 0


@needs_hf
def test_an_all_sliding_model_counts_what_the_cache_keeps_per_slot(tmp_path):
    """Issue #43's second pass: an all-sliding Gemma 3's rings are its window, so a 1e10
    max_cache_len passed the estimate and then allocated its 10 GB of per-slot flags: the
    fit check counts them (and the mask and positions), refused before allocating."""
    from transformers import AutoModelForCausalLM

    from pypto_capture import CacheDoesNotFitError, check_cache_fits, static_cache_bytes
    from pypto_testing import models

    folder = models.make_tiny_model(
        tmp_path / "gemma3", "gemma3", layer_types=["sliding_attention"] * 2, num_hidden_layers=2
    )
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    small = static_cache_bytes(model, batch_size=1, max_cache_len=10**10)
    assert small < 2**20  # the rings alone: the window
    with pytest.raises(CacheDoesNotFitError, match="per-slot masks"):
        check_cache_fits(model, batch_size=1, max_cache_len=10**10, device="cpu")
    assert check_cache_fits(model, batch_size=1, max_cache_len=64, device="cpu") > small
