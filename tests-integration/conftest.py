"""Fixtures for cross-package flows: a local hub serving real model folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from pypto_testing.hub import LocalHub

TINY_REPO = "pypto-test/tiny-llama"  # also in test_e2e.py (importlib mode: no shared imports)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from pypto_testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", "llama", seed=0)


@pytest.fixture
def hub(tiny_model_dir):
    with LocalHub() as server:
        server.add_repo(TINY_REPO, tiny_model_dir)
        yield server
