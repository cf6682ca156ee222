"""The support matrix over the zoo, newest types first (issue #44): each of transformers'
newest causal-LM types built tiny from its own classes (pypto_testing.zoo) runs decode and
prefill, eager and graph, in its own bounded process (tools/zoo.py, as `nox -s zoo` runs the
whole mapping). Every cell is ok, refused in one line, "eager fails" (the model's own code
at the tiny shape) or "not built" with why; none computes something else, crashes or hangs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
NEWEST = 12


@pytest.mark.slow(reason="12 model types, each built and run in its own process (~60 s alone)")
def test_the_newest_types_are_ok_or_refused_in_one_line(tmp_path):
    out = tmp_path / "zoo"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "zoo.py"), "--types", f"newest:{NEWEST}",
         "--jobs", "1", "--timeout", "240", "--out", str(out)],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    data = json.loads((out / "zoo.json").read_text())
    cells = data["cells"]
    types = {c["type"] for c in cells}
    assert len(types) == NEWEST
    bad = [c for c in cells if c["class"] in ("WRONG", "crash", "hang")]
    assert not bad, json.dumps(bad, indent=1)
    assert done.returncode == 0, done.stderr[-2000:]
    for c in cells:
        assert c["class"] in ("ok", "refused", "eager fails", "not built"), c
        if c["class"] != "ok":
            assert c["why"], c  # saying why
            assert "\n" not in c["why"], c  # in one line
    assert any(c["class"] == "ok" for c in cells)
    matrix = (out / "zoo.md").read_text()
    assert "| class | types (worst cell) | cells |" in matrix
    assert all(f"| {t} |" in matrix for t in types)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process parents from /proc")
def test_sigterm_ends_the_matrix_and_every_cell_process(tmp_path):
    """Each cell runs in its own process group (so a hung one is killed whole); a SIGTERM of
    the matrix kills the running cell's group too before it exits, so nothing it started
    outlives it."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "zoo.py"), "--types", "llama,olmo2,qwen2",
         "--jobs", "1", "--out", str(tmp_path / "zoo")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        cells: list[int] = []
        while not cells and time.monotonic() < deadline:
            cells = _children(proc.pid)
            time.sleep(0.1)
        assert cells, "no cell process started within 60 s"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while any(_alive(c) for c in cells) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in cells if _alive(c)]
        assert not (tmp_path / "zoo" / "zoo.json").exists()  # ended, not finished
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_the_class_of_a_cell_is_decided_by_our_arms_and_the_peer_is_said_apart():
    """classify_report over real pypto-bench arm results: a failing or differing hf-compile
    arm (transformers' own recipe) is "peer fails" when our arms are ok, never "crash" or
    "WRONG" charged to us; our own refusal beside it stays "refused"; our arm computing
    something else is WRONG whatever the peer does."""
    sys.path.insert(0, str(ROOT / "tools"))
    from zoo import classify_report

    from pypto_bench.report import ArmResult, Report

    def report(*arms):
        r = Report.__new__(Report)
        r.arms = list(arms)
        return r

    ok = ArmResult("eager")
    graph = ArmResult("graph", numerics={"verdict": "pass"})
    peer_crash = ArmResult("hf-compile", ok=False, error="KeyError: 'heavily_compressed_attention'")
    peer_wrong = ArmResult("hf-compile", numerics={"verdict": "fail", "why": "KL max 0.2"})
    refused = ArmResult("graph", ok=False, error="UnsupportedModelError: no ring for it")
    wrong = ArmResult("graph", numerics={"verdict": "fail", "why": "KL max 0.1"})
    assert classify_report(report(ok, graph)) == ("ok", "")
    cls, why = classify_report(report(ok, graph, peer_crash))
    assert cls == "peer fails"
    assert why.startswith("hf-compile (transformers' recipe): KeyError")
    cls, why = classify_report(report(ok, graph, peer_wrong))
    assert cls == "peer fails"
    assert "computes otherwise: KL max 0.2" in why
    assert classify_report(report(ok, refused, peer_crash))[0] == "refused"
    assert classify_report(report(ok, wrong, peer_crash)) == ("WRONG", "graph: KL max 0.1")
