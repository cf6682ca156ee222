"""Keep the user's hub settings (token, endpoint, cache, offline flag) out of every test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The test modules share dltest.py; --import-mode=importlib does not put this folder on
# sys.path by itself.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path_factory):
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_TOKEN_PATH", str(home / "token"))
