"""The offline demo: the whole workflow on an embedded model, no network, no accelerator.

A newcomer's first run must show every step doing real work, so nothing is skipped or
faked: a real HTTP hub on 127.0.0.1 serves the embedded repository, pypto-download
fetches it, pypto-patch pins it to the demo preset, the smoke gate checks a greedy
continuation of a trained model reads as text, and the bench measures eager vs graph
decode on the CPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from .chain import RunResult, run
from .config import RunConfig
from .errors import E2EEnvironmentError

__all__ = [
    "DEFAULT_WORK_DIR",
    "DEMO_PROMPT",
    "DEMO_REPO_ID",
    "demo_config",
    "demo_model_dir",
    "run_demo",
]

log = logging.getLogger(__name__)

DEMO_REPO_ID = "pypto-demo/tiny-llama"
DEMO_PROMPT = "And it came to pass"
DEFAULT_WORK_DIR = "pypto-demo-work"


def demo_model_dir() -> Path:
    """The embedded model folder shipped inside the package."""
    path = Path(str(resources.files("pypto_e2e") / "demo_model"))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"embedded demo model missing at {path}: reinstall pypto-e2e")
    return path


def demo_config(work_dir: str | os.PathLike[str], endpoint: str, **overrides: object) -> RunConfig:
    """The demo's run: small enough for a few minutes on 2 CPU cores."""
    values: dict[str, object] = {
        "work_dir": work_dir,
        "model_id": DEMO_REPO_ID,
        "endpoint": endpoint,
        "family": "pypto_demo",
        "device": "cpu",
        "prompt": DEMO_PROMPT,
        "regime": "decode",
        "arms": ("eager", "graph"),
        "seq": 16,
        "gen": 64,
        "batch": 1,
        "warmup": 1,
        "iters": 3,
        "dtype": "float32",
    }
    values.update(overrides)
    return RunConfig.from_flat(**values)


def run_demo(
    work_dir: str | os.PathLike[str] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    **overrides: object,
) -> RunResult:
    """Serve the embedded model from a local hub and run the workflow against it.

    The hub is pypto-testing's, an optional extra (``pypto-e2e[demo]``): library code
    does not depend on test helpers, so without it the demo says what to install.
    """
    try:
        from pypto_testing.hub import LocalHub
    except ImportError as err:
        raise E2EEnvironmentError(
            "the demo serves its model from pypto-testing's local hub, which is not "
            "installed: pip install 'pypto-e2e[demo]'"
        ) from err

    work_dir = work_dir or os.environ.get("PYPTO_DEMO_WORKDIR") or DEFAULT_WORK_DIR
    with LocalHub() as hub:
        hub.add_repo(DEMO_REPO_ID, demo_model_dir())
        log.info("local hub serving %s at %s", DEMO_REPO_ID, hub.endpoint)
        return run(demo_config(work_dir, hub.endpoint, **overrides), progress=progress)
