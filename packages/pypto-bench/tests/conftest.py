"""Shared fixtures: tiny real model folders and bench runs reused across tests.

torch.compile on two shared cores is slow, so the expensive runs (graph arms) happen
once per session and several tests read the same report.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


def _shape_lm_head(path: Path, keep, *, scale: float = 4.0) -> Path:
    """Rewrite a tiny model's output layer so only tokens ``keep`` accepts can win."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    with torch.no_grad():
        w = model.lm_head.weight
        for i in range(w.shape[0]):
            if keep(i, tok.decode([i])):
                w[i] *= scale
            else:
                w[i] = 0
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(models_dir) -> Path:
    from pypto_testing.models import make_tiny_model

    return make_tiny_model(models_dir / "llama", "llama")


@pytest.fixture(scope="session")
def tiny_model_factory(models_dir):
    from pypto_testing.models import make_tiny_model

    made: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in made:
            made[arch] = make_tiny_model(models_dir / arch, arch)
        return made[arch]

    return make


@pytest.fixture(scope="session")
def letters_model(models_dir) -> Path:
    """Random weights whose output layer only emits lowercase letters and spaces."""
    from pypto_testing.models import make_tiny_model

    path = make_tiny_model(models_dir / "letters", "llama", seed=0)
    return _shape_lm_head(
        path, lambda i, s: len(s) == 1 and ((s.isalpha() and s.islower()) or s == " ")
    )


@pytest.fixture(scope="session")
def bytes_model(models_dir) -> Path:
    """Output layer that only emits UTF-8 continuation bytes (undecodable on their own)."""
    from pypto_testing.models import make_tiny_model

    path = make_tiny_model(models_dir / "bytes", "llama", seed=1)
    return _shape_lm_head(path, lambda i, s: s == "\ufffd")


@pytest.fixture(scope="session")
def zero_norm_model(models_dir) -> Path:
    """Final norm weight zero: every logit is 0, so greedy repeats token 0 forever
    (the signature of NaNs/zeros coming out of a broken kernel)."""
    from transformers import AutoModelForCausalLM

    from pypto_testing.models import make_tiny_model

    path = make_tiny_model(models_dir / "zeronorm", "llama", seed=2)
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def diffusion_model(models_dir) -> Path:
    from pypto_testing.diffusion import make_tiny_diffusion_model

    return make_tiny_diffusion_model(models_dir / "diffusion")


@pytest.fixture(scope="session")
def decode_report(tiny_llama, tmp_path_factory):
    """One real decode run, eager vs graph (torch.compile on CPU), reused by many tests."""
    from pypto_bench import BenchConfig, run_bench

    out = tmp_path_factory.mktemp("reports") / "decode.json"
    config = BenchConfig(
        model_path=str(tiny_llama),
        device="cpu",
        regime="decode",
        seq=8,
        gen=12,
        batch=2,
        arms=("eager", "graph"),
        warmup=1,
        iters=3,
        report_file=str(out),
    )
    report = run_bench(config)
    return report, out


@pytest.fixture
def plugin_dist():
    return write_plugin_dist


def write_plugin_dist(
    root: Path, module: str, source: str, entry_name: str = "testkernels"
) -> Path:
    """A real installed-looking distribution (dist-info + module) with a pypto.kernels entry point."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(source)
    dist = root / f"{module.replace('_', '-')}-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[pypto.kernels]\n{entry_name} = {module}:PLUGIN\n")
    return root
