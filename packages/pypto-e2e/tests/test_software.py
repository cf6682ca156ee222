"""Results are reused only with the software that produced them (issue 27 item 14):
every step but the download records python, torch, transformers and every installed
pypto / pypto-* version among its inputs, and an upgrade re-runs the step, saying why."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import pytest

from pypto_e2e import MANIFEST_NAME, RunConfig, run
from pypto_e2e.manifest import fingerprint
from pypto_e2e.software import software_versions
from pypto_e2e.state import RunState


def test_the_versions_are_those_installed():
    versions = software_versions()
    assert versions["python"] == platform.python_version()
    for dist in ("torch", "transformers", "pypto-e2e", "pypto-bench", "pypto-patch"):
        assert versions[dist] == metadata.version(dist), dist
    assert all(
        name in ("python", "torch", "transformers", "torch-npu")
        or name == "pypto"
        or name.startswith("pypto-")
        for name in versions
    )


def test_every_step_but_the_download_depends_on_the_versions(tmp_path, demo_model):
    config = RunConfig.from_flat(
        work_dir=tmp_path / "w", model_id="org/m", model_path=str(demo_model), tune=True
    )
    state = RunState(config, None)
    state.outputs["patch"] = {"not_needed": True}
    versions = software_versions()
    assert "software" not in state.inputs("download")
    for step in ("patch", "smoke", "bench", "tune", "report"):
        assert state.inputs(step)["software"] == versions, step
    assert not (tmp_path / "w").exists()


def test_a_step_measured_with_other_versions_runs_again_and_says_why(tmp_path, demo_model):
    """A real smoke gate: reused while the versions match; after a manifest written with
    another torch (what an older install would have recorded), measured again."""
    pytest.importorskip("transformers")
    work = tmp_path / "work"
    config = RunConfig.from_flat(
        work_dir=work,
        model_path=str(demo_model),
        skip=("download", "bench"),
        device="cpu",
        dtype="float32",
        prompt="And it came to pass",
    )
    said: list[str] = []
    first = run(config, progress=said.append)
    assert {s.name: s.status for s in first.steps}["smoke"] == "ok"

    said.clear()
    again = run(config, progress=said.append)
    assert {s.name: s.status for s in again.steps}["smoke"] == "reused"

    # The manifest an install with torch 2.12.0 would have written: its recorded inputs
    # and their fingerprint both name that version.
    path = work / MANIFEST_NAME
    doc = json.loads(path.read_text())
    smoke = doc["steps"]["smoke"]
    installed = smoke["inputs"]["software"]["torch"]
    smoke["inputs"]["software"]["torch"] = "2.12.0"
    smoke["fingerprint"] = fingerprint(smoke["inputs"])
    path.write_text(json.dumps(doc))

    said.clear()
    upgraded = run(config, progress=said.append)
    statuses = {s.name: s.status for s in upgraded.steps}
    assert statuses["patch"] == "reused"
    assert statuses["smoke"] == "ok"  # measured again, not reused
    assert (
        f"[smoke] running again: its inputs changed: software.torch 2.12.0 -> {installed}" in said
    )
    recorded = json.loads(path.read_text())["steps"]["smoke"]["inputs"]["software"]
    assert recorded == software_versions()
