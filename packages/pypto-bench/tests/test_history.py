"""The results history: records, concurrent writers, kill -9, hostile files, the CI gate."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from pypto_bench import EXIT
from pypto_bench.cli import main
from pypto_bench.errors import HistoryError
from pypto_bench.history import MAX_ROW_BYTES, SCHEMA_VERSION, check, record

sys.path.insert(0, str(Path(__file__).parent))
from _history_fixtures import make_report

FIXTURES = Path(__file__).parent / "_history_fixtures.py"
STEADY = [150.0, 151.0, 149.0, 150.5, 149.5]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*sys.path, env.get("PYTHONPATH", "")])
    return env


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pypto_bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        check=False,
    )


@contextmanager
def _db(path: Path | str) -> Iterator[sqlite3.Connection]:
    """A committed-on-exit and *closed* connection (sqlite3's own ``with`` only commits)."""
    con = sqlite3.connect(path)
    try:
        with con:
            yield con
    finally:
        con.close()


def _integrity(db: Path) -> str:
    with _db(db) as con:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])


def _series(db: Path, graphs: list[list[float]]) -> None:
    for day, graph in enumerate(graphs, start=1):
        record(db, make_report(graph=graph, created_at=f"2026-11-{day:02d}T00:00:00+00:00"))


def test_record_list_show_plot(tmp_path, capsys):
    db = tmp_path / "h.db"
    _series(db, [STEADY, [s * 1.01 for s in STEADY]])
    assert main(["history", "list", "--db", str(db), "--json"]) == EXIT.OK
    runs = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in runs] == [1, 2]
    assert runs[0]["regime"] == "decode"
    assert runs[0]["device"] == "cpu:x86_64 test cpu"
    assert runs[0]["torch"] == "2.13.0"
    assert runs[0]["batch"] == 1
    assert runs[0]["model_path_hash"]
    graph = next(a for a in runs[0]["arms"] if a["arm"] == "graph")
    assert graph["tok_s_low"] <= graph["tok_s_median"] == 150.0 <= graph["tok_s_high"]
    assert graph["x_eager_median"] == pytest.approx(1.5, rel=0.02)
    assert main(["history", "list", "--db", str(db)]) == EXIT.OK
    assert "graph 150" in capsys.readouterr().out
    assert main(["history", "show", "2", "--db", str(db), "--json"]) == EXIT.OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["report"]["regime"] == "decode"
    assert shown["arms"][1]["samples"][0] == 151.5
    assert main(["history", "show", "9", "--db", str(db)]) == EXIT.USAGE
    assert "has no run 9" in capsys.readouterr().err
    with _db(db) as con:
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    assert meta == {"tool": "pypto-bench-history", "schema_version": str(SCHEMA_VERSION)}
    png = tmp_path / "ratio.png"
    assert main(["history", "plot", "--db", str(db), "--out", str(png)]) == EXIT.OK
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_concurrent_writer_processes(tmp_path):
    db = tmp_path / "h.db"
    n = 12
    procs = [
        subprocess.Popen(
            [sys.executable, str(FIXTURES), str(db), str(n), tag],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for tag in ("w1", "w2")
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    ids = sorted(int(x) for out, _ in outs for x in out.split())
    assert ids == list(range(1, 2 * n + 1))  # every report got its own run id
    with _db(db) as con:
        hosts = {r[0] for r in con.execute("SELECT host FROM runs")}
        arm_rows = con.execute("SELECT count(*) FROM arms").fetchone()[0]
    assert hosts == {f"w{w}-{i}" for w in (1, 2) for i in range(n)}
    assert arm_rows == 2 * n * 2
    assert _integrity(db) == "ok"


def test_kill_9_mid_write_loses_no_committed_run(tmp_path):
    db = tmp_path / "h.db"
    proc = subprocess.Popen(
        [sys.executable, str(FIXTURES), str(db), "100000", "k"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    committed = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while len(committed) < 5 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        committed.append(int(line))
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream: most likely inside a transaction
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) == 5
    assert _integrity(db) == "ok"
    with _db(db) as con:
        present = {r[0] for r in con.execute("SELECT id FROM runs")}
        orphan_arms = con.execute(
            "SELECT count(*) FROM arms WHERE run_id NOT IN (SELECT id FROM runs)"
        ).fetchone()[0]
        per_run = {r[0] for r in con.execute("SELECT count(*) FROM arms GROUP BY run_id")}
    assert set(committed) <= present
    assert orphan_arms == 0
    assert per_run == {2}
    assert record(db, make_report(graph=STEADY)) == max(present) + 1  # still writable


def _hostile(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / "h.db"
    if kind == "text":
        path.write_text("id,tok_s\n1,150\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink":
        outside = tmp_path / "outside"
        outside.mkdir()
        record(outside / "real.db", make_report(graph=STEADY))
        path.symlink_to(outside / "real.db")
    elif kind == "wrong-schema":
        with _db(path) as con:
            con.execute("CREATE TABLE results (x INTEGER)")
    elif kind == "other-tool":
        with _db(path) as con:
            con.execute("CREATE TABLE meta (key TEXT, value TEXT)")
            con.execute("INSERT INTO meta VALUES ('tool', 'someone-else')")
    elif kind == "other-version":
        record(path, make_report(graph=STEADY))
        with _db(path) as con:
            con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    elif kind == "missing-column":
        record(path, make_report(graph=STEADY))
        with _db(path) as con:
            con.execute("ALTER TABLE arms DROP COLUMN tok_s_high")
    elif kind == "recursive-view":  # runs is an endless recursive query
        record(path, make_report(graph=STEADY))
        with _db(path) as con:
            con.execute("DROP TABLE runs")
            con.execute(
                "CREATE VIEW runs AS WITH RECURSIVE r(id) AS (SELECT 1 UNION ALL SELECT id + 1 "
                "FROM r) SELECT id, '' AS recorded_at, '' AS created_at, '' AS model, "
                "'' AS model_path_hash, '' AS model_class, '' AS regime, '' AS device, "
                "'' AS dtype, 1 AS batch, 1 AS seq, 1 AS gen, '' AS torch, '' AS transformers, "
                "'' AS host, 1 AS ok, 0 AS noisy, '' AS report FROM r"
            )
    elif kind == "trigger":  # each new record silently deleted every earlier run
        record(path, make_report(graph=STEADY))
        with _db(path) as con:
            con.execute(
                "CREATE TRIGGER wipe AFTER INSERT ON runs BEGIN DELETE FROM arms WHERE "
                "run_id < NEW.id; DELETE FROM runs WHERE id < NEW.id; END"
            )
    elif kind == "extra-table":
        record(path, make_report(graph=STEADY))
        with _db(path) as con:
            con.execute("CREATE TABLE notes (x TEXT)")
    elif kind == "huge-row":
        record(path, make_report(graph=STEADY))
        with _db(path) as con:
            con.execute("UPDATE runs SET report = ? WHERE id = 1", ("x" * (MAX_ROW_BYTES + 1),))
    return path


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        st = os.lstat(p)
        body = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
        out[str(p)] = (st.st_size, st.st_mtime_ns, hash(body))
    return out


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("text", "is not an SQLite database"),
        ("fifo", "is not a regular file"),
        ("folder", "is not a regular file"),
        ("symlink", "is a symbolic link"),
        ("wrong-schema", "not a pypto-bench history (no meta table)"),
        ("other-tool", "belongs to another tool"),
        ("other-version", "has schema version '99'"),
        ("missing-column", "lacks tok_s_high"),
        ("huge-row", "holds a row of"),
        ("recursive-view", "holds a view 'runs'"),
        ("trigger", "holds a trigger 'wipe'"),
        ("extra-table", "holds a table 'notes'"),
    ],
)
def test_hostile_history_file_one_line_nothing_changed(tmp_path, capsys, kind, needle):
    path = _hostile(kind, tmp_path)
    before = _snapshot(tmp_path)
    for argv in (
        ["history", "list", "--db", str(path)],
        ["history", "check", "--db", str(path)],
        # refused before the (missing) model is even looked at
        [
            "run",
            "--model-path",
            str(tmp_path / "no-model"),
            "--device",
            "cpu",
            "--history",
            str(path),
        ],
    ):
        assert main(argv) == EXIT.USAGE, argv
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1, err
        assert err[0].startswith("pypto-bench: error: history"), err
        assert needle in err[0]
    with pytest.raises(HistoryError, match="history"):
        record(path, make_report(graph=STEADY))
    assert _snapshot(tmp_path) == before


def test_check_gates_a_ci_job_through_the_real_cli(tmp_path):
    steady = tmp_path / "steady.db"
    _series(
        steady,
        [
            STEADY,
            [s * 1.01 for s in STEADY],
            [s * 0.99 for s in STEADY],
            STEADY,
            [s * 1.005 for s in STEADY],
        ],
    )
    ok = _cli("history", "check", "--db", str(steady), "--json")
    assert ok.returncode == EXIT.OK == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert not doc["regressed"]
    assert {g["verdict"] for g in doc["groups"]} == {"ok"}
    assert "rule: newest interval entirely below" in ok.stderr

    regressed = tmp_path / "regressed.db"
    _series(
        regressed,
        [
            STEADY,
            [s * 1.01 for s in STEADY],
            [s * 0.99 for s in STEADY],
            STEADY,
            [s * 0.7 for s in STEADY],
        ],
    )  # graph lost 30%
    bad = _cli("history", "check", "--db", str(regressed))
    assert bad.returncode == EXIT.REGRESSION == 49, bad.stderr
    assert "REGRESSION: run 5 graph decode" in bad.stderr
    assert "OK: run 5 eager decode" in bad.stderr

    short = tmp_path / "short.db"
    _series(short, [STEADY, [s * 0.5 for s in STEADY]])  # too little history to judge
    res = check(short)
    assert res.exit_code == EXIT.OK
    assert {g["verdict"] for g in res.groups} == {"insufficient history"}
    missing = _cli("history", "check", "--db", str(tmp_path / "none.db"))
    assert missing.returncode == EXIT.USAGE
    assert "does not exist" in missing.stderr
    assert not (tmp_path / "none.db").exists()


def test_run_records_into_history(tiny_llama, tmp_path, capsys):
    db = tmp_path / "h.db"
    argv = [
        "run",
        "--model-path",
        str(tiny_llama),
        "--device",
        "cpu",
        "--arms",
        "eager",
        "--warmup",
        "0",
        "--iters",
        "2",
        "--gen",
        "4",
        "--seq",
        "8",
        "--no-bandwidth",
        "--no-progress",
        "--history",
        str(db),
    ]
    assert main(argv) == EXIT.OK
    assert "recorded as run 1 in history" in capsys.readouterr().err
    assert main(["history", "list", "--db", str(db), "--json"]) == EXIT.OK
    runs = json.loads(capsys.readouterr().out)
    assert len(runs) == 1
    assert runs[0]["arms"][0]["arm"] == "eager"
    assert runs[0]["arms"][0]["tok_s_median"] > 0


def test_a_first_write_killed_mid_transaction_is_rolled_back_not_called_malformed(tmp_path, capsys):
    """The file switches to WAL after its first commit: a writer SIGKILLed inside the first
    transaction leaves a hot rollback journal over half-written pages. Read as immutable it
    was "database disk image is malformed ... pass a new path"; SQLite rolls it back."""
    import signal
    import subprocess
    import sys

    from pypto_bench import history

    path = tmp_path / "h.db"
    child = (
        "import os, signal, sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "con.execute('PRAGMA cache_size = 2')\n"  # spill pages to the file before commit
        "con.execute('BEGIN IMMEDIATE')\n"
        f"for statement in {history._SCHEMA!r}.split(';'):\n"
        "    if statement.strip():\n"
        "        con.execute(statement)\n"
        "for i in range(200):\n"
        "    con.execute('INSERT INTO meta VALUES (?, ?)', ('k%d' % i, 'x' * 4000))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", child, str(path)], timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL
    assert Path(f"{path}-journal").stat().st_size > 0  # a hot journal over written pages
    assert main(["history", "list", "--db", str(path)]) == EXIT.USAGE
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert "malformed" not in err[0]
    assert "first write was stopped before it committed" in err[0]
    # the writer starts it afresh, and the history then reads as usual
    record(path, make_report(graph=STEADY))
    assert main(["history", "list", "--db", str(path)]) == EXIT.OK
    capsys.readouterr()


def test_every_query_is_bounded(tmp_path, monkeypatch):
    from pypto_bench import history

    path = tmp_path / "h.db"
    record(path, make_report(graph=STEADY))
    monkeypatch.setattr(history, "QUERY_BUDGET_S", 0.5)
    import sqlite3
    import time

    # an endless recursive query (what a planted view ran) ends at the connection's budget
    start = time.monotonic()
    with (
        closing(history._connect(path, readonly=True)) as con,
        pytest.raises(sqlite3.OperationalError, match="interrupted"),
    ):
        con.execute(
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
        ).fetchone()
    assert time.monotonic() - start < 10


def _run_argv(model, db, *extra):
    return ["run", "--model-path", str(model), "--device", "cpu", "--arms", "eager",
            "--warmup", "0", "--iters", "2", "--gen", "4", "--seq", "8", "--no-bandwidth",
            "--no-progress", "--history", str(db), *extra]  # fmt: skip


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files and folders")
def test_an_unwritable_history_is_refused_before_the_run(tiny_llama, tmp_path, capsys):
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    os.chmod(db, 0o444)
    try:
        assert main(_run_argv(tiny_llama, db)) == EXIT.USAGE
    finally:
        os.chmod(db, 0o644)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1
    assert "is not writable" in err[0]


def test_an_unwritable_history_folder_is_refused_before_the_run(
    tiny_llama, tmp_path, monkeypatch, capsys
):
    """(As root the file modes do not bind: the check is the same call, os.access.)"""
    from pypto_bench import history

    db = tmp_path / "h.db"
    real = os.access
    monkeypatch.setattr(
        history.os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode)
    )
    assert main(_run_argv(tiny_llama, db, "--report-file", str(tmp_path / "r.json"))) == EXIT.USAGE
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1
    assert "is not writable" in err[0]
    assert not (tmp_path / "r.json").exists()  # nothing ran


def test_a_history_that_fails_at_the_end_keeps_the_report_and_add_records_it(
    tiny_llama, tmp_path, capsys
):
    """The history is locked past the busy timeout when the run ends: the report and the
    page are written first and kept, the run says how to add it, and `history add` does."""
    from pypto_bench import history

    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    report = tmp_path / "r.json"
    page = tmp_path / "r.html"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock for the whole run
    original = history.BUSY_TIMEOUT_S
    history.BUSY_TIMEOUT_S = 0.2
    try:
        code = main(_run_argv(tiny_llama, db, "--report-file", str(report), "--html", str(page)))
    finally:
        history.BUSY_TIMEOUT_S = original
        holder.execute("ROLLBACK")
        holder.close()
    assert code == EXIT.NOT_RECORDED  # its own code: a script tells it from a failed run
    err = capsys.readouterr().err
    assert f"pypto-bench history add {report} --db {db}" in err
    assert "let that writer finish" in err
    assert "new path" not in err  # a locked history is intact: never advise giving it up
    assert report.is_file()
    assert page.is_file()
    assert main(["history", "add", str(report), "--db", str(db)]) == EXIT.OK
    assert main(["history", "list", "--db", str(db), "--json"]) == EXIT.OK
    assert len(json.loads(capsys.readouterr().out)) == 2
    # what `add` refuses: not a report, not finite, not a file
    (tmp_path / "x.json").write_text('{"arms": [], "config": {"seq": NaN}}')
    for bad, needle in ((tmp_path / "x.json", "not a number"), (tmp_path, "folder")):
        assert main(["history", "add", str(bad), "--db", str(db)]) == EXIT.USAGE
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1
        assert needle in lines[0]


def test_readers_create_nothing_beside_the_history(tmp_path, capsys):
    """A read left "-wal"/"-shm" behind (and in a read-only folder could not even open)."""
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert before == ["h.db"]
    for argv in (["history", "list", "--db", str(db)], ["history", "show", "1", "--db", str(db)],
                 ["history", "check", "--db", str(db), "--min-runs", "1"]):  # fmt: skip
        main(argv)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, argv
    capsys.readouterr()


def test_stored_escapes_and_huge_values_print_safely(tmp_path, capsys):
    """ANSI / OSC escapes stored in a row were printed raw (a retitled, cleared terminal);
    a 20 MB arm name printed 42 MB."""
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    with _db(db) as con:
        con.execute(
            "UPDATE arms SET arm = ? WHERE arm = 'graph'",
            ("\x1b]0;pwned\x07\x1b[2J" + "g" * 5_000_000,),
        )
        con.execute("UPDATE runs SET device = ?", ("cpu\u202egnp.exe",))
    for argv in (["history", "list", "--db", str(db)], ["history", "show", "1", "--db", str(db)],
                 ["history", "check", "--db", str(db), "--min-runs", "0"]):  # fmt: skip
        main(argv)
        out = capsys.readouterr()
        text = out.out + out.err
        assert "\x1b" not in text, argv
        assert "\x07" not in text, argv
        assert "\u202e" not in text, argv
        assert len(text) < 20_000, (argv, len(text))


@pytest.mark.parametrize(
    ("corrupt", "needle"),
    [
        ("UPDATE arms SET tok_s_median = 'fast' WHERE arm = 'graph'", "tok_s_median"),
        ("UPDATE arms SET x_eager_low = 9e999 WHERE arm = 'graph'", "x_eager_low"),
        ("UPDATE runs SET batch = 'two'", "batch"),
        # past int64: SQLite stores a real
        ("UPDATE arms SET run_id = 1e30 WHERE arm = 'eager' AND run_id = 2", "run_id"),
        ("UPDATE arms SET run_id = 'one' WHERE arm = 'graph' AND run_id = 2", "run_id"),
        ("UPDATE runs SET model = x'00ff'", "model"),  # a blob where text belongs
        ("UPDATE arms SET samples = '[1, 2' WHERE arm = 'graph'", "not valid JSON"),
        ("UPDATE runs SET report = '{\"a\": ' ", "not valid JSON"),
        ("UPDATE arms SET shapes = 'nope'", "not valid JSON"),
        ("UPDATE arms SET created_at = 'yesterday-ish'", "not an ISO date"),
    ],
)
def test_wrong_typed_values_are_one_history_error(tmp_path, capsys, corrupt, needle):
    """Text where numbers belong, an id past int64, bad JSON, bad dates made list / show /
    check / plot fail "unexpected ... report it" (exit 1), `show` after partial output
    (issue #43, item 8): each command that reads the value refuses the file in one line,
    exit 2, nothing on stdout, the file unchanged."""
    pytest.importorskip("matplotlib")
    db = tmp_path / "h.db"
    for _ in range(2):
        record(db, make_report(graph=STEADY))
    with _db(db) as con:
        con.execute(corrupt)
    before = db.read_bytes()
    png = tmp_path / "p.png"
    refused = 0
    for argv in (["history", "list", "--db", str(db)], ["history", "show", "1", "--db", str(db)],
                 ["history", "check", "--db", str(db), "--min-runs", "1"],
                 ["history", "plot", "--db", str(db), "--out", str(png)]):  # fmt: skip
        code = main(argv)
        out = capsys.readouterr()
        assert code in (EXIT.OK, EXIT.USAGE), (argv, code, out.err)
        if code == EXIT.USAGE:
            refused += 1
            assert out.out == "", argv
            lines = out.err.strip().splitlines()
            assert len(lines) == 1, (argv, out.err)
            assert needle in lines[0], (argv, lines[0])
            assert "unexpected" not in lines[0]
    # a type error is caught by every reader; a JSON or date value by those that read it
    assert refused == (4 if "JSON" not in needle and "date" not in needle else refused)
    assert refused >= 1
    assert db.read_bytes() == before
    assert not png.exists() or refused < 4


def test_a_run_id_past_int64_is_a_usage_error(tmp_path, capsys):
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    code = main(["history", "show", str(2**70), "--db", str(db)])
    out = capsys.readouterr()
    assert code == EXIT.USAGE, out.err
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert "run id must be between 1 and 2**63-1" in lines[0]


# --- the second adversarial pass (issue #43) -------------------------------------------


@pytest.mark.parametrize("sidecar", ["-journal", "-wal", "-shm"])
def test_a_fifo_beside_the_history_is_refused_not_waited_on(tmp_path, capsys, sidecar):
    """A FIFO at DB-journal hung the writer forever (SIGTERM ignored): refused in one line
    by every command, before anything runs, and the FIFO is left as it was."""
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    fifo = Path(f"{db}{sidecar}")
    os.mkfifo(fifo)
    with pytest.raises(HistoryError, match="not a regular file"):
        record(db, make_report(graph=STEADY))
    report = tmp_path / "r.json"
    report.write_text(make_report(graph=STEADY).to_json())
    for argv in (["history", "list", "--db", str(db)],
                 ["history", "add", str(report), "--db", str(db)]):  # fmt: skip
        assert main(argv) == EXIT.USAGE
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1
        assert sidecar[1:] in err[0]
    assert fifo.exists()


def test_a_report_a_history_cannot_hold_is_not_recorded(tmp_path, capsys):
    """`history add` of a report whose batch is text once succeeded and then every read of
    the history refused it: now refused, nothing written, the history still reads."""
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    bad = make_report(graph=STEADY).to_dict()
    bad["config"]["batch"] = "abc"
    report = tmp_path / "bad.json"
    report.write_text(json.dumps(bad))
    assert main(["history", "add", str(report), "--db", str(db)]) == EXIT.USAGE
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1
    assert "nothing was recorded" in err[0]
    assert "batch" in err[0]
    assert main(["history", "list", "--db", str(db)]) == EXIT.OK


@pytest.mark.parametrize(
    "spoil",
    [
        lambda d: d["config"].update(batch=10**30),  # past int64: OverflowError at the bind
        lambda d: d.update(model="a model that is text"),  # AttributeError on .get
        lambda d: d.update(environment=["x"]),
        lambda d: d["arms"].append(7),  # an arm that is a number: TypeError
        lambda d: d["arms"][0].update(name=["eager"]),
        lambda d: d["arms"][0].update(tokens_per_s={"samples": {"a": 1}}),
    ],
    ids=["batch-past-int64", "model-text", "environment-list", "arm-number", "name-list",
         "samples-object"],
)  # fmt: skip
def test_a_report_of_the_wrong_shape_is_one_line_and_nothing_is_recorded(tmp_path, capsys, spoil):
    """Issue #43 second pass, L2: odd values in a handed-over report were an
    OverflowError / AttributeError / TypeError traceback (exit 1)."""
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    before = db.read_bytes()
    bad = make_report(graph=STEADY).to_dict()
    spoil(bad)
    report = tmp_path / "bad.json"
    report.write_text(json.dumps(bad))
    assert main(["history", "add", str(report), "--db", str(db)]) == EXIT.USAGE
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert "nothing was recorded" in err[0]
    assert "Traceback" not in err[0]
    assert main(["history", "list", "--db", str(db), "--json"]) == EXIT.OK
    assert len(json.loads(capsys.readouterr().out)) == 1  # the one run recorded before
    assert db.read_bytes() == before


def test_a_row_without_its_interval_is_judged_on_its_median(tmp_path, capsys):
    """Issue #43 second pass, L1: a NULL low/high (another tool's or an edited row) made
    `history check` a TypeError traceback."""
    db = tmp_path / "h.db"
    for _ in range(4):
        record(db, make_report(graph=STEADY))
    with closing(sqlite3.connect(db)) as con:
        con.execute("UPDATE arms SET tok_s_low = NULL, tok_s_high = NULL WHERE run_id = 4")
        con.commit()
    assert main(["history", "check", "--db", str(db), "--json"]) == EXIT.OK
    doc = json.loads(capsys.readouterr().out)
    measures = [m for g in doc["groups"] for m in g["measures"] if m["measure"] == "tok/s"]
    assert measures
    for m in measures:
        assert m["newest"]["low"] == m["newest"]["high"] == m["newest"]["median"]
        assert m["verdict"] == "no change"


def test_list_reads_the_newest_runs_only_and_says_so(tmp_path, capsys):
    """Issue #43 second pass, L7: a history of a million runs was listed whole (28 s,
    2.1 GB). 50,000 rows copied in SQL stand for it: the default list reads 100."""
    db = tmp_path / "h.db"
    record(db, make_report(graph=STEADY))
    with closing(sqlite3.connect(db)) as con:
        cols = [r[1] for r in con.execute("PRAGMA table_info(runs)") if r[1] != "id"]
        arm_cols = [r[1] for r in con.execute("PRAGMA table_info(arms)") if r[1] != "run_id"]
        for _ in range(16):  # doubling: 2**16 - 1 copies of run 1
            con.execute(f"INSERT INTO runs ({', '.join(cols)}) SELECT {', '.join(cols)} FROM runs")
        con.execute(
            f"INSERT INTO arms (run_id, {', '.join(arm_cols)}) SELECT r.id, "
            f"{', '.join('a.' + c for c in arm_cols)} FROM runs r, arms a "
            "WHERE a.run_id = 1 AND r.id > 1"
        )
        con.commit()
    total = 2**16
    started = time.monotonic()
    assert main(["history", "list", "--db", str(db), "--json"]) == EXIT.OK
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    runs = json.loads(out)
    assert [r["id"] for r in runs] == list(range(total - 99, total + 1))
    assert all(len(r["arms"]) == 2 for r in runs)
    assert f"the newest 100 of {total} runs; --last 0 lists every run" in err
    assert took < 10, took
    assert main(["history", "list", "--db", str(db), "--last", "3"]) == EXIT.OK
    table = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in table] == ["id", str(total - 2), str(total - 1), str(total)]
    assert main(["history", "list", "--db", str(db), "--last", "-1"]) == EXIT.USAGE
    assert "--last must be 0" in capsys.readouterr().err


@contextmanager
def _read_only_copy(files: list[Path], where: Path) -> Iterator[Path]:
    """``files`` copied onto a tmpfs mounted at ``where`` and remounted read-only (root
    only: a read-only folder is no obstacle to root otherwise); unmounted on the way out."""
    import shutil as _shutil

    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()[:120]}")
    try:
        for f in files:
            _shutil.copy(f, where / f.name)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, timeout=30)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False, timeout=30)


def test_a_log_without_its_index_on_a_read_only_mount_says_how_to_read_it(tmp_path, capsys):
    """Issue #43 second pass, L8: a history whose last runs are in its -wal, copied without
    its -shm onto a read-only mount, was "not a readable SQLite database ... pass a new
    path"; it is intact, so the line says how to read it, and the way it gives works."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    src = tmp_path / "src"
    src.mkdir()
    db = src / "h.db"
    record(db, make_report(graph=STEADY))
    with closing(sqlite3.connect(db)) as hold:  # keeps the log: not the last connection
        hold.execute("PRAGMA wal_autocheckpoint=0")
        hold.execute("SELECT count(*) FROM runs").fetchone()
        record(db, make_report(graph=STEADY))
        wal = Path(f"{db}-wal")
        assert wal.stat().st_size > 0
        with _read_only_copy([db, wal], tmp_path / "ro") as ro:
            assert main(["history", "list", "--db", str(ro / "h.db")]) == EXIT.USAGE
            err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
            assert len(err) == 1
            assert "keeps runs in its write-ahead log (h.db-wal) but has no h.db-shm" in err[0]
            assert "copy h.db and h.db-wal to a writable folder" in err[0]
            assert "new path" not in err[0]
            copy = tmp_path / "copy"
            copy.mkdir()
            for name in ("h.db", "h.db-wal"):
                (copy / name).write_bytes((ro / name).read_bytes())
    assert main(["history", "list", "--db", str(copy / "h.db"), "--json"]) == EXIT.OK
    assert len(json.loads(capsys.readouterr().out)) == 2  # both runs, the logged one too


def test_an_error_quoting_a_strangers_text_prints_no_escape_sequence(tmp_path, capsys):
    """A history that is a link whose target name holds terminal escapes: the one-line
    error names it with the controls replaced (they retitled and cleared the terminal)."""
    target = tmp_path / "x\x1b]0;PWNED\x07\x1b[2J\u202eevil"
    target.write_bytes(b"")
    link = tmp_path / "link.db"
    link.symlink_to(target)
    assert main(["history", "list", "--db", str(link)]) == EXIT.USAGE
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "\x07" not in err
    assert "\u202e" not in err
    assert "symbolic link" in err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1
