"""``pypto-e2e run --nnodes 2``: two real runs on loopback, each node with its own work dir
and its own copy of the model (gloo on the CPU), the re-run that reuses every step, and the
misconfigurations refused in one line before any download."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_e2e import EXIT, MANIFEST_NAME
from pypto_e2e.demo import demo_model_dir

PYPTO_E2E = str(Path(sys.executable).parent / "pypto-e2e")
#: Smallest honest run: the demo model's smoke gate, then one eager arm, 2 timed rounds.
RUN = ["run", "--skip", "download", "--device", "cpu", "--arms", "eager", "--seq", "8",
       "--iters", "2", "--warmup", "1", "--no-bandwidth", "--nproc-per-node", "1",
       "--rank-timeout", "60"]  # fmt: skip
# A launcher's variables in the test's own environment would make a rank of it.
_CLEAN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
          "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
          "SLURM_STEP_NODELIST", "SLURM_NODELIST", "OMPI_COMM_WORLD_RANK",
          "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")  # fmt: skip


def _free_port() -> int:
    from pypto_bench.multi.launch import free_port

    return free_port()


def _env(node: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN}
    env.update(
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        TMPDIR=str(node / "tmp"),  # where the launcher's run folder goes (removed after)
        HF_MODULES_CACHE=str(node / "hf-modules"),
    )
    return env


def _node_dir(tmp: Path, n: int) -> Path:
    """``tmp/nodeN``: this "node"'s own model copy, work dir and temporary folder."""
    node = tmp / f"node{n}"
    if not (node / "model").is_dir():
        (node / "tmp").mkdir(parents=True)
        shutil.copytree(demo_model_dir(), node / "model")
    return node


def _run_nodes(tmp: Path, *flags: str) -> list[tuple[int, str, str]]:
    """Both nodes' ``pypto-e2e run`` at once: (exit code, stdout, stderr) each. Each leads
    its own process group, killed on the way out whatever happened (no process left)."""
    port = _free_port()
    procs: list[subprocess.Popen[str]] = []
    try:
        for n in (0, 1):
            node = _node_dir(tmp, n)
            args = [PYPTO_E2E, *RUN, "--work-dir", str(node / "work"), "--model-path",
                    str(node / "model"), "--nnodes", "2", "--node-rank", str(n),
                    "--rdzv-endpoint", f"127.0.0.1:{port}", *flags]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    args,
                    env=_env(node),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        results = []
        for p in procs:
            out, err = p.communicate(timeout=240)
            results.append((p.returncode, out, err))
        return results
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _steps(work: Path) -> dict[str, dict[str, object]]:
    steps: dict[str, dict[str, object]] = json.loads((work / MANIFEST_NAME).read_text())["steps"]
    return steps


@pytest.mark.slow(
    reason="two real pypto-e2e runs at once, one per node, each with its launcher and rank "
    "and a bench across both: 89.4 s (prefill) beside a second worker in the 2026-12-04 "
    "clean-clone run"
)
@pytest.mark.parametrize("regime", ["prefill", "decode"])
def test_two_nodes_each_run_the_flow_and_the_node_with_rank_0_reports(
    tmp_path: Path, regime: str
) -> None:
    extra = ["--regime", regime, *(["--gen", "4"] if regime == "decode" else [])]
    results = _run_nodes(tmp_path, *extra, "--json")
    assert [c for c, _, _ in results] == [EXIT.OK, EXIT.OK], [e[-2000:] for _, _, e in results]
    docs = [json.loads(out) for _, out, _ in results]
    # The rendezvous assigns rank 0 (whatever --node-rank says): exactly one node reports.
    assert sorted(d["remote_report"] for d in docs) == [False, True]
    reporter = next(n for n, d in enumerate(docs) if not d["remote_report"])
    other = 1 - reporter
    work = [tmp_path / f"node{n}" / "work" for n in (0, 1)]

    bench = json.loads((work[reporter] / "report" / "bench.json").read_text())
    dist = bench["distributed"]
    assert (dist["nnodes"], dist["nproc_per_node"], dist["nproc"]) == (2, 1, 2)
    assert bench["regime"] == regime
    assert docs[reporter]["report_json"] == str(work[reporter] / "report" / "bench.json")
    assert "2 nodes x 1 ranks" in (work[reporter] / "report" / "report.md").read_text()
    # The page beside it, named in --json; the other node has none (no figures there).
    assert docs[reporter]["report_html"] == str(work[reporter] / "report" / "report.html")
    assert "2 nodes x 1 ranks" in (work[reporter] / "report" / "report.html").read_text()
    assert docs[other]["report_html"] is None

    # The other node: its own download/pin/smoke, no figures, a report.md saying where.
    assert docs[other]["report_json"] is None
    assert not (work[other] / "report" / "bench.json").exists()
    note = (work[other] / "report" / "report.md").read_text()
    assert "## Where the report is" in note
    assert "the node that ran rank 0" in note
    assert "tok/s" not in note
    assert docs[other]["report_markdown"] == str(work[other] / "report" / "report.md")
    steps = _steps(work[other])
    assert steps["smoke"]["status"] == "ok"
    kept = work[other] / "report" / f"bench.node{other}.json"  # its own ranks' figures
    assert steps["bench"]["outputs"] == {
        "remote_report": True,
        "nnodes": 2,
        "node_rank": other,
        "failed_arms": [],
        "node_figures": str(kept),
    }
    assert [r["rank"] for r in json.loads(kept.read_text())["ranks"]] == [1]
    assert f"bench.node{other}.json" in note
    assert "its ranks are done" in str(steps["bench"]["note"])
    assert "this node's ranks are done" in results[other][2]
    for n in (0, 1):  # the launcher's run folder is gone on both nodes (caches may stay)
        assert not list((tmp_path / f"node{n}" / "tmp").glob("pypto-dist-*"))

    if regime != "prefill":
        return
    # The same commands again (another port: where the nodes meet is not an input): every
    # step is reused on both nodes, the remote node's record read back as it was written.
    again = _run_nodes(tmp_path, *extra, "--json")
    assert [c for c, _, _ in again] == [EXIT.OK, EXIT.OK], [e[-2000:] for _, _, e in again]
    for n in (0, 1):
        doc = json.loads(again[n][1])
        assert {s["status"] for s in doc["steps"]} == {"reused", "skipped"}, doc["steps"]
        assert doc["remote_report"] is docs[n]["remote_report"]
        assert doc["report_markdown"] == docs[n]["report_markdown"]

    # Only the reporting node lost its bench report: it runs the bench again, alone, and
    # fails in one line saying every node must join; --from bench on both recovers.
    (work[reporter] / "report" / "bench.json").unlink()
    alone = _run_nodes(tmp_path, *extra, "--rank-timeout", "5")
    assert alone[reporter][0] == EXIT.BENCH_FAILED, alone[reporter][2][-2000:]
    assert alone[other][0] == EXIT.OK, alone[other][2][-2000:]
    errors = [ln for ln in alone[reporter][2].splitlines() if ln.startswith("pypto-e2e: error:")]
    assert len(errors) == 1, errors
    assert "with --from bench on a node whose bench step would be reused" in errors[0]
    recovered = _run_nodes(tmp_path, *extra, "--from", "bench")
    assert [c for c, _, _ in recovered] == [EXIT.OK, EXIT.OK]
    assert (work[0] / "report" / "bench.json").is_file() != (
        work[1] / "report" / "bench.json"
    ).is_file()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500", "--node-rank", "2"], "0..1"),
        (["--nnodes", "2"], "needs --rdzv-endpoint"),
        (["--nnodes", "2", "--rdzv-endpoint", "node0"], "is not HOST:PORT"),
        (["--node-rank", "1"], "pass --nnodes N > 1"),
        (
            ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500", "--tune"],
            "keep a profile per rank with pypto-tune profile --nnodes 2",
        ),
        (["--nproc", "2", "--tune"], "keep a profile per rank with pypto-tune profile --nproc 2"),
    ],
)
def test_a_bad_multi_node_request_is_one_line_before_any_download(
    tmp_path: Path, e2e_cli, flags: list[str], needle: str
) -> None:
    work = tmp_path / "work"
    # An endpoint nothing listens on: a download that started would fail, not hang.
    rc, out, err = e2e_cli(
        "run", "--model-id", "org/tiny", "--endpoint", "http://127.0.0.1:9",
        "--work-dir", str(work), "--device", "cpu", "--arms", "eager", *flags,
    )  # fmt: skip
    assert rc == EXIT.USAGE, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("pypto-e2e: error: ")
    assert needle in lines[0], lines
    assert out == ""
    assert not work.exists()
