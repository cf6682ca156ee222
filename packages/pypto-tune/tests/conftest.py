"""Shared fixtures: one tiny Llama folder and its eager / graph profiles per session
(profiling and compiling are the slow parts; every test reads the same profiles)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

try:  # the tile-search tests run PyPTO's cost model (pypto-kernels-common, test extra)
    from pypto_kernels_common import sim
except ImportError:  # pragma: no cover - installed without the test extra
    sim = None
if sim is not None:
    # Before anything imports pypto: PyPTO reads TILEFWK_CONFIG_PATH once, when its
    # libraries load; without the quiet config small SIM calls draw swim-lane PNGs.
    sim.prepare_environment()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pypto_testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _config(path: Path):
    from pypto_bench import BenchConfig

    return BenchConfig(model_path=str(path), device="cpu", regime="decode", seq=8, gen=16)


@pytest.fixture(scope="session")
def eager_profile(tiny_llama: Path):
    from pypto_tune import advise, profile_model

    return advise(profile_model(_config(tiny_llama), arm="eager", level="light", iters=3))


@pytest.fixture(scope="session")
def eager_detail_profile(tiny_llama: Path):
    from pypto_tune import advise, profile_model

    return advise(profile_model(_config(tiny_llama), arm="eager", level="detail", iters=2))


@pytest.fixture(scope="session")
def graph_profile(tiny_llama: Path):
    from pypto_tune import advise, profile_model

    return advise(profile_model(_config(tiny_llama), arm="graph", level="light", iters=3))
