"""Hostile inputs and failing environments: secrets, lost reports, deep JSON, logging, codes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pypto_bench
from pypto_bench import (
    EXIT,
    BenchConfig,
    BenchError,
    ReportWriteError,
    run_bench,
    write_report,
)
from pypto_bench.cli import main
from pypto_bench.errors import (
    DegenerateOutputError,
    EnvironmentMissingError,
    GenerationError,
    ModelLoadError,
    ModelNotFoundError,
    RegimeNotSupportedError,
)
from pypto_bench.loading import read_model_config

ENV_TOKEN = "hf_EnvTokenValue0123456789"
FLAG_TOKEN = "hf_FlagTokenValue0123456789"
URL_PASSWORD = "s3cr3t-Passw0rd"
SECRETS = (ENV_TOKEN, FLAG_TOKEN, URL_PASSWORD)

_RAISING_PLUGIN = f"""
import contextlib, os

class _Plugin:
    name = "leaky-kernels"

    def applies_to(self, model):
        return True

    @contextlib.contextmanager
    def enable(self, model):
        raise RuntimeError(
            "fetching https://bob:{URL_PASSWORD}@kernels.example/lib.so failed; "
            "header Authorization: Bearer " + os.environ["HF_TOKEN"]
        )
        yield

    def report(self):
        return {{}}

PLUGIN = _Plugin()
"""


def _quick(model: Path, **kw) -> BenchConfig:
    values = dict(
        model_path=str(model),
        device="cpu",
        seq=4,
        gen=2,
        warmup=0,
        iters=1,
        arms=("eager",),
        graph_backend="eager",
        measure_bandwidth=False,
    )
    values.update(kw)
    return BenchConfig(**values)


# --- item 3: secrets never reach a report, stdout or stderr ---------------------------


def test_report_file_never_holds_a_secret(tiny_llama, tmp_path, monkeypatch, plugin_dist, capfd):
    monkeypatch.setenv("HF_TOKEN", ENV_TOKEN)
    root = plugin_dist(tmp_path / "site", "bench_leaky_kernels", _RAISING_PLUGIN)
    monkeypatch.syspath_prepend(str(root))
    out = tmp_path / "r.json"
    argv = [
        "pypto-e2e",
        "run",
        "--token",
        FLAG_TOKEN,
        f"--hf-token={FLAG_TOKEN}",
        "--endpoint",
        f"https://alice:{URL_PASSWORD}@hub.example",
        f"--note={ENV_TOKEN}",
    ]
    report = run_bench(
        _quick(tiny_llama, arms=("eager", "pypto+graph"), report_file=str(out), command_line=argv)
    )
    assert report.failed_arms == ["pypto+graph"]  # the leaky error really happened
    text = out.read_text()
    for secret in SECRETS:
        assert secret not in text
    data = json.loads(text)
    assert data["command_line"][:4] == ["pypto-e2e", "run", "--token", "***"]
    assert "hub.example" in text  # redaction keeps the host
    assert "kernels.example" in data["arms"][1]["error"]
    for secret in SECRETS:
        assert secret not in report.to_json()
    # The CLI's stdout (--json), table and log lines on stderr are redacted too.
    code = main(
        [
            "run",
            "--model-path",
            str(tiny_llama),
            "--device",
            "cpu",
            "--seq",
            "4",
            "--gen",
            "2",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--arms",
            "eager,pypto+graph",
            "--graph-backend",
            "eager",
            "--no-bandwidth",
            "--json",
        ]
    )
    captured = capfd.readouterr()
    assert code == EXIT.ARM_FAILED
    assert "kernels.example" in captured.err
    for secret in SECRETS:
        assert secret not in captured.out
        assert secret not in captured.err


def test_write_report_redacts_a_plain_dict(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", ENV_TOKEN)
    doc = {
        "command_line": ["x", "--token", FLAG_TOKEN],
        "warnings": [f"GET https://u:{URL_PASSWORD}@h/x", ENV_TOKEN],
    }
    path = write_report(doc, tmp_path / "d.json")
    text = path.read_text()
    for secret in SECRETS:
        assert secret not in text


# --- item 4: a failing report write keeps the results ---------------------------------


def _report_doc() -> dict:
    return {"schema_version": "1.0", "arms": [{"name": "eager", "ok": True}], "command_line": []}


def test_write_falls_back_when_the_folder_vanished(tmp_path, caplog):
    gone = tmp_path / "gone"
    gone.mkdir()
    target = gone / "r.json"
    gone.rmdir()  # e.g. a cleanup job removed it during a long run
    keep = tmp_path / "fallback"
    keep.mkdir()
    with caplog.at_level(logging.WARNING, logger="pypto_bench"):
        written = write_report(_report_doc(), target, fallback_dir=[keep])
    assert written.parent == keep
    assert re.fullmatch(r"pypto-bench-report-\d{8}-\d{6}-.+\.json", written.name)
    assert json.loads(written.read_text())["arms"][0]["name"] == "eager"
    assert str(written) in caplog.text
    assert not target.exists()


def test_write_nowhere_raises_with_the_json(tmp_path):
    target = tmp_path / "missing" / "r.json"
    with pytest.raises(ReportWriteError) as info:
        write_report(_report_doc(), target, fallback_dir=[tmp_path / "also-missing"])
    err = info.value
    assert err.exit_code == EXIT.REPORT_UNWRITTEN
    assert len(str(err).splitlines()) == 1
    assert "--report-file" in str(err)
    assert json.loads(err.text)["arms"][0]["name"] == "eager"
    assert list(tmp_path.iterdir()) == []


def _sandbox_ok(tmp_path: Path) -> bool:
    """Unprivileged user + mount namespaces: a real tmpfs / read-only mount for one command."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    cmd = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0"', str(probe)]
    try:
        ok = subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    probe.rmdir()
    return ok


def _in_sandbox(script: str, *args: str, env: dict[str, str], cwd: Path):
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sandbox", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


# Mount a 64 KiB tmpfs on $1 and fill it: a real full disk (ENOSPC), not a mock.
_FULL_DISK = 'mount -t tmpfs -o size=64k tmpfs "$1" && (head -c 1048576 /dev/zero > "$1/fill" 2>/dev/null; true) && shift && exec "$@"'


def test_cli_report_on_a_full_disk_goes_to_the_fallback(tiny_llama, tmp_path):
    if not _sandbox_ok(tmp_path):
        pytest.skip("needs unshare -rm with mount (Linux user namespaces) for a real full disk")
    disk = tmp_path / "disk"
    disk.mkdir()
    fallback = tmp_path / "tmp"
    fallback.mkdir()
    env = {**os.environ, "TMPDIR": str(fallback)}
    argv = [
        sys.executable,
        "-m",
        "pypto_bench",
        "run",
        "--model-path",
        str(tiny_llama),
        "--device",
        "cpu",
        "--seq",
        "4",
        "--gen",
        "2",
        "--warmup",
        "0",
        "--iters",
        "1",
        "--arms",
        "eager",
        "--no-bandwidth",
        "--no-progress",
        "--report-file",
        str(disk / "r.json"),
    ]
    res = _in_sandbox(_FULL_DISK, str(disk), *argv, env=env, cwd=tmp_path)
    assert res.returncode == EXIT.REPORT_FALLBACK, res.stderr
    assert "Traceback" not in res.stderr
    saved = list(fallback.glob("pypto-bench-report-*.json"))
    assert len(saved) == 1
    assert str(saved[0]) in res.stderr
    data = json.loads(saved[0].read_text())
    assert data["ok"] is True
    assert data["arms"][0]["tokens_per_s"]["best"] > 0

    # Nowhere to write at all (temp folder and cwd on the full disk too): the JSON goes
    # to stdout and the code says so.
    env["TMPDIR"] = str(disk)
    script = _FULL_DISK.replace("&& shift", '&& cd "$1" && shift')
    res = _in_sandbox(script, str(disk), *argv, env=env, cwd=tmp_path)
    assert res.returncode == EXIT.REPORT_UNWRITTEN, res.stderr
    assert "Traceback" not in res.stderr
    assert json.loads(res.stdout)["arms"][0]["name"] == "eager"
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("pypto-bench: error")]
    assert len(errors) == 1
    assert "--report-file" in errors[0]


def test_write_report_into_a_read_only_folder_falls_back(tmp_path):
    if not _sandbox_ok(tmp_path):
        pytest.skip("needs unshare -rm with mount (Linux user namespaces) for a read-only mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    keep = tmp_path / "keep"
    keep.mkdir()
    code = (
        "import sys; from pypto_bench import write_report; "
        "print(write_report({'arms': [], 'command_line': []}, sys.argv[1], "
        "fallback_dir=[sys.argv[2]]))"
    )
    script = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    res = _in_sandbox(
        script,
        str(ro),
        sys.executable,
        "-c",
        code,
        str(ro / "r.json"),
        str(keep),
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    written = Path(res.stdout.strip())
    assert written.parent == keep
    assert json.loads(written.read_text())["arms"] == []
    assert list(ro.iterdir()) == []


# --- item 5: hostile config.json ------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        (b"\xff\xfe{", "unreadable"),
        ("[1, 2]", "not an object"),
        # NaN / Infinity (Python's json reads them; a NaN rms_norm_eps gave NaN logits whose
        # argmax "matched" eager) and a number past a float's range
        ('{"model_type": "llama", "rms_norm_eps": NaN}', "holds NaN, not a number"),
        ('{"model_type": "llama", "rope_theta": Infinity}', "holds Infinity, not a number"),
        ('{"model_type": "llama", "rope_theta": 1e999}', "beyond a float's range"),
    ],
)
def test_hostile_config_json_is_one_line_bad_input(tiny_llama, tmp_path, capsys, content, needle):
    folder = tmp_path / "m"
    shutil.copytree(tiny_llama, folder)
    cfg = folder / "config.json"
    if isinstance(content, bytes):
        cfg.write_bytes(content)
    else:
        cfg.write_text(content)
    with pytest.raises(ModelNotFoundError, match=needle):
        read_model_config(folder)
    code = main(["smoke", "--model-path", str(folder), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT.USAGE
    assert len(err) == 1, err
    assert needle in err[0]
    code = main(["run", "--model-path", str(folder), "--device", "cpu", "--gen", "2"])
    assert code == EXIT.USAGE
    assert needle in capsys.readouterr().err


# --- item 8: CLI logging --------------------------------------------------------------


class _ChattyPlugin:
    """A kernel plug-in that logs like a hub client would (httpx's real logger)."""

    name = "chatty-kernels"

    def applies_to(self, model):
        return True

    @contextlib.contextmanager
    def enable(self, model):
        lib = logging.getLogger("httpx")
        lib.info("HTTP Request: GET http://hub/resolve")
        lib.warning("retrying https://u:%s@hub/x with %s", URL_PASSWORD, os.environ["HF_TOKEN"])
        yield

    def report(self):
        return {}


@pytest.fixture
def chatty(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", ENV_TOKEN)
    plugin = _ChattyPlugin()
    pypto_bench.register_plugin(plugin)
    yield
    pypto_bench.unregister_plugin(plugin)


def _run_cli(model: Path, *flags: str) -> int:
    return main(
        [
            "run",
            *flags,
            "--model-path",
            str(model),
            "--device",
            "cpu",
            "--seq",
            "4",
            "--gen",
            "2",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--arms",
            "eager,pypto+graph",
            "--graph-backend",
            "eager",
            "--no-bandwidth",
            "--no-progress",
        ]
    )


def test_cli_logging_keeps_third_party_quiet_unless_verbose(tiny_llama, chatty, capfd):
    root_handlers = list(logging.getLogger().handlers)
    assert _run_cli(tiny_llama) == EXIT.OK
    err = capfd.readouterr().err
    assert "HTTP Request" not in err  # third-party INFO hidden by default
    assert "retrying https://***@hub/x with ***" in err  # its WARNING shown, redacted
    assert "INFO pypto_bench.loading: loaded" in err  # own INFO lines shown
    for secret in SECRETS:
        assert secret not in err
    # main() leaves the caller's logging as it found it.
    assert logging.getLogger().handlers == root_handlers

    assert _run_cli(tiny_llama, "-v") == EXIT.OK
    assert "HTTP Request: GET http://hub/resolve" in capfd.readouterr().err

    assert _run_cli(tiny_llama, "-q") == EXIT.OK
    err = capfd.readouterr().err
    assert "loaded" not in err
    assert "retrying" not in err


# --- item 9: exit codes ---------------------------------------------------------------


def test_exit_table_is_in_range_and_errors_use_it():
    assert pypto_bench.EXIT is EXIT
    assert EXIT.tool == "pypto-bench"
    for entry in EXIT:
        # the shared codes, the own range, and the second range the numerical gate took
        assert (
            entry.code in range(0, 4)
            or entry.code in range(40, 50)
            or entry.code in range(110, 120)
        ), entry
    names = {e.name for e in EXIT}
    assert {
        "LOAD_FAILED",
        "GENERATION_FAILED",
        "DEGENERATE",
        "LOW_COHERENCE",
        "ARM_FAILED",
        "REPORT_FALLBACK",
        "REPORT_UNWRITTEN",
    } <= names
    assert ModelLoadError.exit_code == EXIT.LOAD_FAILED
    assert GenerationError.exit_code == EXIT.GENERATION_FAILED
    assert DegenerateOutputError.exit_code == EXIT.DEGENERATE
    assert EnvironmentMissingError.exit_code == EXIT.ENVIRONMENT
    assert RegimeNotSupportedError.exit_code == EXIT.USAGE
    assert BenchError.exit_code == EXIT.FAILED
    assert ReportWriteError.exit_code == EXIT.REPORT_UNWRITTEN


def test_readme_exit_code_table_matches_exit():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    rows = dict(re.findall(r"^\| `?(\d+)`? \| `([A-Z_]+)` \|", readme, flags=re.M))
    assert {int(c): n for c, n in rows.items()} == {e.code: e.name for e in EXIT}


# --- item 7: the library ships no test helpers ----------------------------------------


def test_library_does_not_ship_test_helpers():
    assert not hasattr(pypto_bench, "make_tiny_diffusion_model")
    src = Path(pypto_bench.__file__).parent
    for module in src.glob("*.py"):
        text = module.read_text()
        assert "import pypto_testing" not in text, module.name
        assert "from pypto_testing" not in text, module.name


def test_diffusion_generate_normalises_the_protocol_answer(diffusion_model):
    from transformers import AutoModelForCausalLM

    from pypto_bench import DiffusionOutput, diffusion_generate, supports_diffusion

    model = AutoModelForCausalLM.from_pretrained(
        str(diffusion_model), local_files_only=True, trust_remote_code=True
    )
    assert supports_diffusion(model)
    ids = torch.tensor([[10, 11, 12]])
    out = diffusion_generate(model, ids, gen_length=4, steps=2)
    assert isinstance(out, DiffusionOutput)
    assert out.sequences.shape == (1, 7)
    assert out.num_denoising_steps == 2

    class DictModel:
        def diffusion_generate(self, input_ids, *, gen_length, steps, block_length=None):
            return {"sequences": input_ids, "num_denoising_steps": steps}

    out = diffusion_generate(DictModel(), ids, gen_length=4, steps=3)  # no forward kwarg sent
    assert out.num_denoising_steps == 3
    assert out.sequences is ids
