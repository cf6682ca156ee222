"""Helpers the pypto-download test modules share (on sys.path through conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pypto_download.cli import main
from pypto_testing.hub import LocalHub

# ~300 KB of weights: big enough to cut mid-file, small enough to stay quick.
WEIGHTS = bytes((i * 7 + 3) % 251 for i in range(300_000))
SECRET = "hf_PyptoTestSecret0123456789abcdef"
FILES = {
    "config.json": json.dumps({"model_type": "llama", "hidden_size": 8}).encode(),
    "tokenizer.json": json.dumps({"version": "1.0", "vocab": list(range(50))}).encode(),
    "README.md": b"# tiny\n",
    "model.safetensors": WEIGHTS,
    "extra/notes.txt": b"notes\n",
}
REPO_BYTES = sum(len(v) for v in FILES.values())


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.relative_to(folder).parts[0] != ".cache"
    }


def gets(hub: LocalHub) -> list[str]:
    return sorted(r.file_path for r in hub.requests if r.method == "GET" and r.file_path)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def base_args(model_id: str, output_dir: object, endpoint: str) -> list[str]:
    """The three flags nearly every CLI test passes."""
    return ["--model-id", model_id, "--output-dir", str(output_dir), "--endpoint", endpoint]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("pypto-download: error:")]


def sub_env(hub: LocalHub | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env["HF_HOME"] = os.environ["HF_HOME"]
    env["HF_TOKEN_PATH"] = os.environ["HF_TOKEN_PATH"]
    if hub is not None:
        env["HF_ENDPOINT"] = hub.endpoint
    env.update(extra)
    return env


def run_module(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess:
    """``python -m pypto_download ARGS`` in a fresh process (real stdout/stderr, real exit)."""
    return subprocess.run(
        [sys.executable, "-m", "pypto_download", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
