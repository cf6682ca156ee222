"""pypto-e2e against hostile or unlucky input, through the real CLI and a real local hub:
a repo's own code, secrets in flags and URLs, chatty libraries, weights changed behind
the run's back, a report that cannot be written where asked."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pypto_e2e import EXIT, MANIFEST_NAME, RunConfig, StepFailedError, run
from pypto_e2e.demo import DEMO_PROMPT, demo_model_dir

TINY_REPO = "pypto-test/tiny-llama"  # as in conftest.py (importlib mode: no shared imports)
CPU = ["--device", "cpu", "--dtype", "float32"]
FAST = [*CPU, "--seq", "8", "--gen", "8", "--warmup", "0", "--iters", "1", "--no-bandwidth"]


@pytest.fixture
def cli_env(tmp_path) -> dict[str, str]:
    """Remote code, if any runs, is cached under the test's folder, never the user's."""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf-modules")}
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "MODEL_PATH"):
        env.pop(name, None)
    return env


def run_cli(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pypto_e2e", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _manifest(work: Path) -> dict:
    return json.loads((work / MANIFEST_NAME).read_text())


def _evil_module(marker: Path, cls_source: str) -> str:
    return (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('repo code ran')\n{cls_source}\n"
    )


def _demo_files(**changes: bytes | str) -> dict[str, bytes | str]:
    files: dict[str, bytes | str] = {
        p.name: p.read_bytes() for p in demo_model_dir().iterdir() if p.is_file()
    }
    files.update(changes)
    return files


def _with_auto_map(name: str, auto_map: dict) -> str:
    data = json.loads((demo_model_dir() / name).read_text())
    data["auto_map"] = auto_map
    return json.dumps(data, indent=2)


# --------------------------------------------------------------------------- remote code


def test_a_preset_run_never_imports_the_repo_s_own_code(hub, tmp_path, cli_env):
    """The repo's tokenizer_config.json and config.json name modules that write a marker
    on import; pinned to the demo preset, only the preset's shims may run."""
    marker = tmp_path / "marker"
    hub.add_repo(
        "evil/demo",
        _demo_files(
            **{
                "tokenizer_config.json": _with_auto_map(
                    "tokenizer_config.json",
                    {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]},
                ),
                "config.json": _with_auto_map(
                    "config.json", {"AutoModel": "modeling_evil.EvilModel"}
                ),
                "tokenization_evil.py": _evil_module(
                    marker,
                    "from transformers import PreTrainedTokenizerFast\n"
                    "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass",
                ),
                "modeling_evil.py": _evil_module(
                    marker,
                    "from transformers import LlamaModel\nclass EvilModel(LlamaModel):\n    pass",
                ),
            }
        ),
    )
    work = tmp_path / "run"
    proc = run_cli(
        cli_env,
        "run",
        "--model-id",
        "evil/demo",
        "--endpoint",
        hub.endpoint,
        "--work-dir",
        str(work),
        "--family",
        "pypto_demo",
        "--skip",
        "bench",
        "--prompt",
        DEMO_PROMPT,
        *CPU,
    )
    assert proc.returncode == EXIT.OK, proc.stderr
    assert not marker.exists(), "the repo's own code ran"
    smoke = _manifest(work)["steps"]["smoke"]["outputs"]["result"]
    assert smoke["passed"]
    assert smoke["model_class"] == "PyptoDemoForCausalLM"  # the pinned class ran
    removed = _manifest(work)["steps"]["patch"]["outputs"]["removed_auto_map"]
    assert {(e["file"], e["key"]) for e in removed} >= {
        ("tokenizer_config.json", "AutoTokenizer"),
        ("config.json", "AutoModel"),
    }
    assert "tokenizer_config.json:AutoTokenizer" in proc.stderr
    assert "config.json:AutoModel" in proc.stderr


@pytest.mark.parametrize(
    "file", ["config.json", "tokenizer_config.json"], ids=["model-code", "tokenizer-code"]
)
def test_unpinned_repo_code_runs_only_with_trust_remote_code(hub, tmp_path, cli_env, file):
    marker = tmp_path / "marker"
    if file == "config.json":
        auto_map = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
        module = (
            "modeling_evil.py",
            "from transformers import LlamaForCausalLM\n"
            "class EvilForCausalLM(LlamaForCausalLM):\n    pass",
        )
    else:
        auto_map = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        module = (
            "tokenization_evil.py",
            "from transformers import PreTrainedTokenizerFast\n"
            "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass",
        )
    hub.add_repo(
        "remote/code",
        _demo_files(
            **{file: _with_auto_map(file, auto_map), module[0]: _evil_module(marker, module[1])}
        ),
    )
    work = tmp_path / "run"
    base = [
        "run",
        "--model-id",
        "remote/code",
        "--endpoint",
        hub.endpoint,
        "--work-dir",
        str(work),
        "--skip",
        "bench",
        "--prompt",
        DEMO_PROMPT,
        *CPU,
    ]
    refused = run_cli(cli_env, *base)
    assert refused.returncode == EXIT.REMOTE_CODE_REFUSED, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert "--trust-remote-code" in last
    assert "--family" in last
    assert not marker.exists()
    trusted = run_cli(cli_env, *base, "--trust-remote-code")
    assert trusted.returncode == EXIT.OK, trusted.stderr
    assert marker.exists()  # the user asked for it: the folder's code ran


# --------------------------------------------------------------------------- secrets


def _files_containing(root: Path, secrets: list[str]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path}: {s}" for s in secrets if s.encode() in data]
    return hits


def test_no_secret_reaches_any_file_or_output(hub, tmp_path, cli_env):
    cli_token = "hf_CliSecretToken1234567"
    env_token = "hf_EnvSecretToken7654321"
    password = "pa55w0rd-zz9"
    secrets = [cli_token, env_token, password]
    env = {**cli_env, "HF_TOKEN": env_token}
    endpoint = hub.endpoint.replace("http://", f"http://alice:{password}@")
    work = tmp_path / "run"
    args = [
        "run",
        "--model-id",
        TINY_REPO,
        "--work-dir",
        str(work),
        "--endpoint",
        endpoint,
        "--token",
        cli_token,
        "--skip",
        "smoke",
        "--arms",
        "eager",
        *FAST,
    ]
    outputs = []
    first = run_cli(env, *args)
    assert first.returncode == EXIT.OK, first.stderr
    outputs.append(first)
    assert "HTTP Request" not in first.stderr  # third-party INFO stays behind -v
    verbose = run_cli(env, *args, "--from", "download", "-v", "--json")
    assert verbose.returncode == EXIT.OK, verbose.stderr
    assert "HTTP Request" in verbose.stderr  # -v shows the hub client's lines, redacted
    outputs.append(verbose)
    failing = run_cli(
        env, *[a if a != TINY_REPO else "nobody/missing" for a in args], "--json", "-v"
    )
    assert failing.returncode == EXIT.DOWNLOAD_FAILED, failing.stderr
    outputs.append(failing)
    assert (work / "report" / "bench.json").is_file()
    assert (work / "report" / "report.md").is_file()
    for proc in outputs:
        for secret in secrets:
            assert secret not in proc.stdout, (secret, proc.stdout)
            assert secret not in proc.stderr, (secret, proc.stderr)
    assert _files_containing(work, secrets) == []
    recorded = json.loads((work / "report" / "bench.json").read_text())["command_line"]
    assert "--token" in recorded
    assert "***" in recorded


def test_hub_requests_stay_off_stderr_unless_verbose(hub, tmp_path, cli_env):
    work = tmp_path / "run"
    args = ["run", "--model-id", TINY_REPO, "--endpoint", hub.endpoint, "--work-dir", str(work)]
    proc = run_cli(cli_env, *args, "--skip", "smoke,bench")
    assert proc.returncode == EXIT.OK, proc.stderr
    assert "HTTP Request" not in proc.stderr
    assert "[download] ok" in proc.stderr
    assert "[patch] not-needed" in proc.stderr


# --------------------------------------------------------------------------- weights


def test_deleted_or_swapped_weights_are_fetched_again_not_reused(hub, tmp_path, cli_env):
    work = tmp_path / "run"
    args = [
        "run",
        "--model-id",
        TINY_REPO,
        "--work-dir",
        str(work),
        "--endpoint",
        hub.endpoint,
        "--skip",
        "smoke",
        "--arms",
        "eager",
        *FAST,
    ]
    first = run_cli(cli_env, *args)
    assert first.returncode == EXIT.OK, first.stderr
    weights = next((work / "model").glob("*.safetensors"))
    original = weights.read_bytes()

    weights.unlink()
    hub.clear_requests()
    after_delete = run_cli(cli_env, *args)
    assert after_delete.returncode == EXIT.OK, after_delete.stderr
    assert "[download] ok" in after_delete.stderr  # not "reused": its folder changed
    assert weights.read_bytes() == original
    hub.wait_idle()
    assert hub.bytes_sent(file_path=weights.name, method="GET") > 0
    # the same bytes are back (pypto-download verified their sha256): nothing to re-measure
    assert "[bench] reused" in after_delete.stderr

    swapped = bytearray(original)
    swapped[-32:] = bytes(b ^ 0xFF for b in swapped[-32:])
    weights.write_bytes(bytes(swapped))
    after_swap = run_cli(cli_env, *args)
    assert after_swap.returncode == EXIT.OK, after_swap.stderr
    assert "[download] ok" in after_swap.stderr
    assert weights.read_bytes() == original


# --------------------------------------------------------------------------- report


def test_a_report_unwritable_after_the_run_goes_to_the_fallback_and_says_where(
    tmp_path, tiny_model_dir, monkeypatch
):
    """The report folder breaks while the bench runs: the measured results survive."""
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(fallback))
    monkeypatch.setenv("TMPDIR", str(fallback))  # the fallback takes $TMPDIR first
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    work = tmp_path / "run"
    target = work / "report" / "bench.json"
    said: list[str] = []

    def progress(msg: str) -> None:
        said.append(msg)
        if msg.startswith("[bench] arm eager:") and not target.exists():
            target.mkdir(parents=True)  # a folder where the file must go: every write fails

    config = RunConfig.from_flat(
        work_dir=work,
        model_path=str(tiny_model_dir),
        skip=("download", "smoke"),
        arms=("eager",),
        device="cpu",
        dtype="float32",
        seq=8,
        gen=8,
        warmup=0,
        iters=1,
        measure_bandwidth=False,
    )
    result = run(config, progress=progress)
    assert result.report_json is not None
    assert result.report_json.parent == fallback
    assert json.loads(result.report_json.read_text())["arms"][0]["ok"]
    assert any(f"saved to {result.report_json}" in m for m in said), said
    assert result.report_markdown == work / "report" / "report.md"
    assert str(result.report_json) in result.report_markdown.read_text()

    # e2e's own markdown cannot be written: the report step fails by name, data intact
    result.report_markdown.unlink()
    result.report_markdown.mkdir()
    with pytest.raises(StepFailedError, match="step 'report' failed") as info:
        run(dataclasses.replace(config, from_step="report"))
    assert info.value.exit_code == EXIT.REPORT_FAILED
    assert str(result.report_json) in str(info.value)
