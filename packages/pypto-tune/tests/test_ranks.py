"""``pypto-tune profile --nproc 2``: real ranks (gloo on the CPU) keep one profile each
under one folder; the summary names the straggler. Plus the summary read from an edited
(hostile) report, and the requests a per-rank profile refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_tune.errors import EXIT, ProfileFormatError
from pypto_tune.ranks import RANKS_SCHEMA, rank_summary, ranks_markdown

TUNE = str(Path(sys.executable).parent / "pypto-tune")
PROFILE = ["profile", "--device", "cpu", "--seq", "8", "--iters", "2", "--warmup", "1",
           "-q"]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return env


@pytest.fixture(scope="module")
def ranks_run(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("ranks") / "out"
    got = subprocess.run(
        [
            TUNE,
            *PROFILE,
            "--model-path",
            str(tiny_llama),
            "--nproc",
            "2",
            "--regime",
            "prefill",
            "--out",
            str(out),
            "--json",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    return out, got.stdout


def test_every_rank_keeps_its_profile_under_one_folder(ranks_run: tuple[Path, str]) -> None:
    out, stdout = ranks_run
    summary = json.loads(stdout)
    assert summary == json.loads((out / "ranks.json").read_text())
    assert summary["schema"] == RANKS_SCHEMA
    assert summary["arm"] == "eager"
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    for r in summary["ranks"]:
        trace = out / r["profile"]
        assert trace == out / "ranks" / "eager" / f"rank{r['rank']}.trace.json"
        data = json.loads(trace.read_text())
        # What per-rank trace tools key on: the rank and the world in the trace itself.
        assert data["distributedInfo"]["rank"] == r["rank"]
        assert data["distributedInfo"]["world_size"] == 2
        names = {e.get("name", "") for e in data["traceEvents"]}
        assert any(n.startswith(("c10d::", "_c10d_functional::")) for n in names)
        # torch's own step mark, which Holistic Trace Analysis finds steps by (issue #45)
        assert "ProfilerStep#0" in names
        # The profiled step splits into time in collectives and the rest.
        assert 0 < r["collectives_s"] < r["profiled_step_s"]
        assert r["outside_collectives_s"] == pytest.approx(
            r["profiled_step_s"] - r["collectives_s"]
        )
        assert r["step_s"] > 0
        assert r["top_collective"]
    worst = max(summary["ranks"], key=lambda r: r["outside_collectives_s"])
    assert summary["straggler_rank"] == worst["rank"]
    assert summary["compute_imbalance"] >= 1.0
    report = json.loads((out / "report.json").read_text())
    assert report["distributed"]["nproc"] == 2
    md = (out / "ranks.md").read_text()
    assert f"Straggler: rank {worst['rank']}" in md
    assert "rank1.trace.json" in md


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--nproc", "2"], "name a folder with --out DIR"),
        (["--nproc", "2", "--out", "{tmp}/o", "--level", "detail"], "drop --level detail"),
        (["--nproc", "2", "--out", "{tmp}/o", "--threshold", "norm_share=0.2"], "drop --threshold"),
        (
            ["--nproc", "2", "--out", "{tmp}/o", "--regime", "diffusion-generate"],
            "--nproc 2 runs the",
        ),
        # it exited 0 and named ranks/graph/, a folder never made (issue #45, item 5)
        (["--nproc", "2", "--out", "{tmp}/o", "--arm", "graph"], "keeps no per-rank profile"),
    ],
)
def test_a_request_a_rank_profile_cannot_take_is_one_line(
    tiny_llama: Path, tmp_path: Path, flags: list[str], needle: str
) -> None:
    args = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    got = subprocess.run(
        [TUNE, *PROFILE, "--model-path", str(tiny_llama), *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == EXIT.USAGE, got.stderr[-2000:]
    errors = [ln for ln in got.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, got.stderr[-2000:]
    assert needle in errors[0], got.stderr[-2000:]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("planted", ["ranks", "ranks/eager"])
def test_a_link_planted_at_the_ranks_folder_is_not_followed(
    tiny_llama: Path, tmp_path: Path, planted: str
) -> None:
    """Per-rank traces went through a pre-existing DIR/ranks link, over a file outside
    (and, the second adversarial pass, through DIR/ranks/eager, where the ranks write)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    out = tmp_path / "o"
    (out / planted).parent.mkdir(parents=True)
    (out / planted).symlink_to(outside)
    got = subprocess.run(
        [TUNE, *PROFILE, "--model-path", str(tiny_llama), "--nproc", "2", "--out", str(out)],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == EXIT.USAGE, got.stderr[-2000:]
    errors = [ln for ln in got.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1
    assert "is a symbolic link" in errors[0]
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def _report(ranks: list[object], device_type: str = "cpu") -> dict[str, object]:
    return {
        "arms": [{"name": "eager"}],
        "config": {"regime": "prefill"},
        "distributed": {"device_type": device_type, "backend": "gloo", "ranks": ranks},
    }


def test_an_edited_report_is_read_defensively(tmp_path: Path) -> None:
    (tmp_path / "ranks" / "eager").mkdir(parents=True)
    (tmp_path / "ranks" / "eager" / "rank0.trace.json").write_text("{}")
    (tmp_path / "secret").write_text("x")
    (tmp_path / "ranks" / "eager" / "link.json").symlink_to(tmp_path / "secret")
    good = {
        "rank": 0,
        "host": "a|b\n<script>",
        "step_s": {"median": 0.02},
        "communication": {
            "seconds": 0.005,
            "step_seconds": 0.025,
            "by_op_s": {"c10d::allreduce_": 0.005, "bad": "x"},
            "profile": "rank0.trace.json",
        },
    }
    hostile = [
        good,
        {"rank": 1, "step_s": {"median": "fast"}, "communication": {"profile": "../../secret"}},
        {"rank": 2, "step_s": {"median": float("nan")}, "communication": {"profile": "link.json"}},
        {"rank": 3, "step_s": {"median": -1.0}, "communication": "not a dict"},
        "not a rank",
        {"rank": True, "communication": {"seconds": 1e308, "step_seconds": None}},
    ]
    summary = rank_summary(_report(hostile), tmp_path / "ranks")
    rows = {r["rank"]: r for r in summary["ranks"]}
    assert rows[0]["profile"] == "ranks/eager/rank0.trace.json"
    assert rows[0]["top_collective"] == "c10d::allreduce_"
    assert rows[0]["collectives_share"] == pytest.approx(0.2)
    assert rows[1]["profile"] is None
    assert rows[1]["step_s"] is None
    assert rows[2]["profile"] is None
    assert rows[2]["step_s"] is None
    assert rows[3]["step_s"] is None
    assert None in rows
    assert rows[None]["outside_collectives_s"] is None
    assert summary["straggler_rank"] == 0
    assert summary["slowest_rank"] == 0
    md = ranks_markdown(summary)
    table_row = next(ln for ln in md.splitlines() if ln.startswith("| 0 |"))
    assert "a\\|b <script>" in table_row
    assert table_row.count(" | ") == 8


def test_a_report_without_ranks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileFormatError, match="rerun pypto-tune profile with --nproc"):
        rank_summary({"arms": [], "distributed": None}, tmp_path)


def test_an_npu_run_points_at_its_ascend_folders(tmp_path: Path) -> None:
    """On NPU the kept profile is torch_npu's own folder (found by host and pid)."""
    folder = tmp_path / "ranks" / "eager" / "node0_4242_20261202_ascend_pt"
    folder.mkdir(parents=True)
    entry = {
        "rank": 0,
        "step_s": {"median": 0.01},
        "communication": {"seconds": 0.001, "step_seconds": 0.01, "profile": folder.name},
    }
    summary = rank_summary(_report([entry], "npu"), tmp_path / "ranks")
    assert summary["ranks"][0]["profile"] == f"ranks/eager/{folder.name}"
    assert "msprof-analyze" in summary["layout"]
