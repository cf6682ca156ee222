"""A results history in an SQLite file (standard library ``sqlite3``).

Why a database and not a folder of JSON files: CI jobs on one runner write at the same
time, and a gate needs "the earlier runs of this model, regime, arm and device" in one
query. Every report is one transaction (``BEGIN IMMEDIATE``: a second writer waits up
to :data:`BUSY_TIMEOUT_S` for the first, never interleaves with it), the journal is
WAL, so a writer killed mid-transaction leaves every committed run intact.

Schema (version :data:`SCHEMA_VERSION`, in the ``meta`` table): ``runs`` (one row per
report: its environment fingerprint, timestamp and the report JSON) and ``arms`` (one
row per arm of a run: its fingerprint columns repeated, tok/s samples and interval, the
x eager interval). A file that is not such a database (not SQLite, another schema or
version, a symlink, a FIFO, a row over :data:`MAX_ROW_BYTES`) is refused with
:class:`~pypto_bench.errors.HistoryError` before anything is written to it.

The check rule (:func:`check`): for each (model, regime, arm, device, dtype, shapes)
with at least ``min_runs`` earlier runs, the baseline is the median of the earlier
runs' medians and the band is ``max(3 * 1.4826 * MAD, tolerance * baseline)``; the
newest run regresses when its whole interval lies below ``baseline - band`` (tok/s, and
the x eager ratio where there is one), improves when it lies above ``baseline + band``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import sqlite3
import stat
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import EXIT, HistoryError
from .report import Report
from .verdicts import arm_intervals, fingerprint

__all__ = [
    "BUSY_TIMEOUT_S",
    "MAX_ROW_BYTES",
    "SCHEMA_VERSION",
    "CheckResult",
    "check",
    "check_db_path",
    "check_writable",
    "count_runs",
    "list_runs",
    "plot_history",
    "read_report_file",
    "record",
    "show_run",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_TOOL = "pypto-bench-history"
#: How long a writer waits for another writer's transaction (seconds).
BUSY_TIMEOUT_S = 60.0
#: A stored report or sample list larger than this is not something this tool wrote.
MAX_ROW_BYTES = 16 * 2**20
#: Every connection's statements together may run this long; past it SQLite interrupts
#: them (a recursive view or a trigger planted in a history cannot spin forever).
QUERY_BUDGET_S = 120.0
# The schema objects this tool creates (sqlite_sequence comes with AUTOINCREMENT, the
# autoindexes with the PRIMARY KEYs): anything else in a history file was put there by
# someone else.
_OBJECTS = {
    ("table", "meta"), ("table", "runs"), ("table", "arms"), ("table", "sqlite_sequence"),
    ("index", "arms_group"), ("index", "sqlite_autoindex_meta_1"),
    ("index", "sqlite_autoindex_arms_1"),
}  # fmt: skip
_SQLITE_MAGIC = b"SQLite format 3\x00"

_RUN_COLUMNS = (
    "id",
    "recorded_at",
    "created_at",
    "model",
    "model_path_hash",
    "model_class",
    "regime",
    "device",
    "dtype",
    "batch",
    "seq",
    "gen",
    "torch",
    "transformers",
    "host",
    "ok",
    "noisy",
)
_ARM_COLUMNS = (
    "run_id",
    "arm",
    "ok",
    "model",
    "regime",
    "device",
    "dtype",
    "shapes",
    "created_at",
    "samples",
    "tok_s_median",
    "tok_s_low",
    "tok_s_high",
    "x_eager_median",
    "x_eager_low",
    "x_eager_high",
    "method",
)
# What each column may hold ("i" integer, "t" text, "r" a finite number; "?" or NULL):
# a history is a file anyone can edit, so every value is checked before it is used.
_RUN_TYPES = {
    "id": "i", "recorded_at": "t", "created_at": "t?", "model": "t", "model_path_hash": "t?",
    "model_class": "t?", "regime": "t", "device": "t", "dtype": "t?", "batch": "i?",
    "seq": "i?", "gen": "i?", "torch": "t?", "transformers": "t?", "host": "t?", "ok": "i",
    "noisy": "i?", "report": "t",
}  # fmt: skip
_ARM_TYPES = {
    "run_id": "i", "arm": "t", "ok": "i", "model": "t", "regime": "t", "device": "t",
    "dtype": "t?", "shapes": "t", "created_at": "t?", "samples": "t", "tok_s_median": "r?",
    "tok_s_low": "r?", "tok_s_high": "r?", "x_eager_median": "r?", "x_eager_low": "r?",
    "x_eager_high": "r?", "method": "t?",
}  # fmt: skip
_TYPE_NAMES = {"i": "an integer", "t": "text", "r": "a finite number"}


def _bad_value(column: str, kind: str) -> str:
    """SQL that is true when ``column`` breaks its declared kind (9e999 is SQLite's inf)."""
    allowed = {"i": ("integer",), "t": ("text",), "r": ("integer", "real")}[kind[0]]
    if kind.endswith("?"):
        allowed += ("null",)
    names = ", ".join(f"'{a}'" for a in allowed)
    cond = f"typeof({column}) NOT IN ({names})"
    if kind[0] == "r":
        cond += f" OR {column} IN (9e999, -9e999)"
    return cond


def _check_values(con: sqlite3.Connection, path: Path) -> None:
    """Refuse the first stored value of the wrong type (text where a number belongs, an id
    past int64 stored as a real, an infinite tok/s): one HistoryError instead of an
    "unexpected" error, or half a table printed, when the value is used."""
    bad = _first_bad_value(con)
    if bad is not None:
        raise HistoryError(f"history {path}: {bad} (a damaged or edited file): {_fix(path)}")


def _first_bad_value(con: sqlite3.Connection) -> str | None:
    """The first stored value of the wrong type, said in words ("runs row 3 holds text in
    batch where an integer belongs"), or None."""
    for table, types in (("runs", _RUN_TYPES), ("arms", _ARM_TYPES)):
        cases = " ".join(f"WHEN {_bad_value(c, k)} THEN '{c}'" for c, k in types.items())
        row = con.execute(
            f"SELECT r, bad FROM (SELECT rowid AS r, CASE {cases} END AS bad FROM {table}) "
            "WHERE bad IS NOT NULL LIMIT 1"
        ).fetchone()
        if row is None:
            continue
        rowid, column = int(row[0]), str(row[1])
        held = con.execute(f"SELECT typeof({column}) FROM {table} WHERE rowid = ?", (rowid,))
        kind = types[column]
        want = _TYPE_NAMES[kind[0]] + (" or null" if kind.endswith("?") else "")
        return f"{table} row {rowid} holds {held.fetchone()[0]} in {column} where {want} belongs"
    return None


def _date(text: str, path: str | os.PathLike[str]) -> _dt.datetime:
    try:
        return _dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise HistoryError(
            f"history {path}: created_at {str(text)[:40]!r} is not an ISO date (a damaged or "
            f"edited file): {_fix(Path(path))}"
        ) from None


def _json(text: str, what: str, path: str | os.PathLike[str]) -> Any:
    """A stored JSON value, or one HistoryError naming it (never a JSONDecodeError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise HistoryError(
            f"history {path}: {what} is not valid JSON (a damaged or edited file): "
            f"{_fix(Path(path))}"
        ) from None


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, recorded_at TEXT NOT NULL, created_at TEXT,
    model TEXT NOT NULL, model_path_hash TEXT, model_class TEXT, regime TEXT NOT NULL,
    device TEXT NOT NULL, dtype TEXT, batch INTEGER, seq INTEGER, gen INTEGER, torch TEXT,
    transformers TEXT, host TEXT, ok INTEGER NOT NULL, noisy INTEGER, report TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS arms (
    run_id INTEGER NOT NULL REFERENCES runs(id), arm TEXT NOT NULL, ok INTEGER NOT NULL,
    model TEXT NOT NULL, regime TEXT NOT NULL, device TEXT NOT NULL, dtype TEXT,
    shapes TEXT NOT NULL, created_at TEXT, samples TEXT NOT NULL, tok_s_median REAL,
    tok_s_low REAL, tok_s_high REAL, x_eager_median REAL, x_eager_low REAL,
    x_eager_high REAL, method TEXT, PRIMARY KEY (run_id, arm)
);
CREATE INDEX IF NOT EXISTS arms_group ON arms (model, regime, arm, device);
INSERT OR IGNORE INTO meta (key, value) VALUES ('tool', '{_TOOL}');
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');
"""


def _fix(path: Path) -> str:
    return f"pass --history/--db a pypto-bench history file or a new path (not {path})"


def _write_fix(path: Path, err: sqlite3.DatabaseError) -> str:
    """The fix for a write that failed: a lock or a read-only file is not a reason to give
    the history up (its runs are intact), so only a damaged file gets :func:`_fix`."""
    text = str(err).lower()
    if "locked" in text or "busy" in text:
        return (
            f"another process held it locked past the {BUSY_TIMEOUT_S:g} s busy timeout; "
            "let that writer finish (its runs and this file are intact)"
        )
    if "readonly" in text or "read-only" in text:
        return "it is read-only: make it (and its folder) writable"
    return _fix(path)


def check_db_path(path: str | os.PathLike[str], *, create: bool, tables: bool = True) -> Path:
    """Refuse what is not a usable history file at ``path``; return it (not resolved).

    ``create``: a missing file is fine (a writer creates it); otherwise it must exist.
    Refused: a symlink, anything but a regular file, a non-empty file without SQLite's
    header, a database without this tool's ``meta`` / another schema version / missing
    tables or columns, a row over :data:`MAX_ROW_BYTES`. Nothing is written.

    ``tables=False`` (the writer, :func:`record`): the file's kind is checked but not its
    tables, which the writer validates inside its own transaction: read from outside, a
    database another writer is creating right now has no tables yet.
    """
    p = Path(path).expanduser()
    _check_sidecars(p)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        if not create:
            raise HistoryError(
                f"history {p} does not exist: run `pypto-bench run "
                f"--history {p}` first or name another file"
            ) from None
        if not p.parent.is_dir():
            raise HistoryError(
                f"history folder {p.parent} does not exist: create it or pick another path"
            ) from None
        return p
    except OSError as err:
        raise HistoryError(f"history {p} cannot be read ({err.strerror}): {_fix(p)}") from None
    if stat.S_ISLNK(st.st_mode):
        raise HistoryError(
            f"history {p} is a symbolic link (to {os.readlink(p)}); it is not "
            f"followed: name the real file"
        )
    if not stat.S_ISREG(st.st_mode):
        raise HistoryError(
            f"history {p} is not a regular file (a FIFO, folder or device): {_fix(p)}"
        )
    journal = Path(f"{p}-journal")
    if journal.is_file() and not journal.is_symlink() and journal.stat().st_size > 0:
        _roll_back(p, journal, create=create)  # before the header: it may be half-written
        st = os.lstat(p)
    if st.st_size == 0:
        if create:
            return p
        raise HistoryError(f"history {p} is empty: it holds no runs yet")
    try:
        with open(p, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as err:
        raise HistoryError(f"history {p} cannot be read ({err.strerror}): {_fix(p)}") from None
    if head != _SQLITE_MAGIC:
        raise HistoryError(f"history {p} is not an SQLite database: {_fix(p)}")
    if not tables:
        return p
    # No "-wal" beside it: nothing uncommitted to see, so read it as immutable (no lock,
    # no "-wal"/"-shm" created beside a file that may not even be ours).
    quiet = not Path(f"{p}-wal").exists()
    try:
        with closing(_connect(p, readonly=True, immutable=quiet)) as con:
            _validate(con, p)
    except sqlite3.DatabaseError as err:
        wal, shm = Path(f"{p}-wal"), Path(f"{p}-shm")
        if not quiet and not shm.exists() and not os.access(p.parent, os.W_OK):
            # Issue #43 (L8): runs committed to the log are readable only with its
            # shared-memory index, which SQLite cannot create in a read-only folder; the
            # file is intact (never advise giving it up), it must be read elsewhere.
            raise HistoryError(
                f"history {p} keeps runs in its write-ahead log ({wal.name}) but has no "
                f"{shm.name}, and its folder is read-only, so SQLite cannot read them there: "
                f"copy {p.name} and {wal.name} to a writable folder and pass the copy "
                "(nothing was changed)"
            ) from None
        raise HistoryError(
            f"history {p} is not a readable SQLite database ({err}): {_fix(p)}"
        ) from None
    return p


def _roll_back(path: Path, journal: Path, *, create: bool) -> None:
    """A hot rollback journal beside ``path``: a writer was stopped inside its transaction
    (the file switches to WAL only after its first commit). SQLite rolls it back on the
    first read of a connection that may write, restoring the last committed state exactly
    as the sqlite3 shell would; read as ``immutable`` instead, the half-written pages read
    as "database disk image is malformed". A file left with no tables held no committed
    run: a writer starts it afresh, a reader is told so."""
    try:
        with closing(_connect(path, readonly=False)) as con:
            count = con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as err:
        raise HistoryError(
            f"history {path} has an unfinished write ({journal.name}: a writer was stopped "
            f"mid-transaction) that SQLite must roll back, and it could not here ({err}): "
            "make the file and its folder writable and rerun; its committed runs are intact"
        ) from None
    if count == 0 and not create:
        raise HistoryError(
            f"history {path} holds no runs yet: its first write was stopped before it "
            f"committed (rolled back now): `pypto-bench run ... --history {path}` starts it"
        )
    log.warning("history %s: rolled back a write that was stopped before it committed", path)


#: The files SQLite keeps beside a database (rollback journal, write-ahead log, its index).
_SIDECARS = ("-journal", "-wal", "-shm")


def _check_sidecars(p: Path) -> None:
    """Refuse a journal, WAL or shared-memory file beside ``p`` that is not a regular file:
    SQLite would follow a link, and block forever opening a FIFO (SIGTERM could not end it)."""
    for suffix in _SIDECARS:
        side = Path(f"{p}{suffix}")
        try:
            st = os.lstat(side)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise HistoryError(f"{side} cannot be read ({err.strerror}): {_fix(p)}") from None
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise HistoryError(
                f"history {p}: its SQLite {suffix[1:]} file {side} is {kind} (a FIFO, folder, "
                f"device or link: SQLite would block on it or follow it): remove it or "
                "pass another path"
            )


def check_writable(path: str | os.PathLike[str]) -> Path:
    """Refuse, before a run, a history the run could not write at its end: the file (or,
    for a new one, its folder) and the folder (SQLite's ``-wal`` / ``-journal`` go beside
    it) must be writable. The whole benchmark once ran and then lost its record."""
    p = check_db_path(path, create=True)
    folder = p.parent if str(p.parent) else Path(".")
    if p.exists() and not os.access(p, os.W_OK):
        raise HistoryError(f"history {p} is not writable: make it writable or pass another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HistoryError(
            f"history folder {folder} is not writable (SQLite writes its journal beside the "
            "file): make it writable or pass another path"
        )
    return p


#: The largest report ``history add`` reads (what ``record`` stores fits in a row).
_MAX_REPORT_FILE = MAX_ROW_BYTES


def read_report_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A report file for ``history add``: a regular file, bounded, finite JSON, a
    pypto-bench run report (its ``arms`` and ``config``); :class:`HistoryError` otherwise."""
    from pypto_common import UntrustedFileError, loads_bounded, read_regular_file

    p = Path(path)
    try:
        data = loads_bounded(read_regular_file(p, _MAX_REPORT_FILE))
    except (UntrustedFileError, OSError) as err:
        raise HistoryError(
            f"report {p} {' '.join(str(err).split())[:160]}: pass the report.json of a run"
        ) from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("arms"), list)
        or not isinstance(data.get("config"), dict)
    ):
        raise HistoryError(
            f"report {p} is not a pypto-bench run report: pass the report.json of a run"
        )
    return data


def _connect(path: Path, *, readonly: bool, immutable: bool = False) -> sqlite3.Connection:
    uri = f"{path.absolute().as_uri()}?mode={'ro' if readonly else 'rwc'}"
    if immutable:
        uri += "&immutable=1"
    con = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    deadline = time.monotonic() + QUERY_BUDGET_S
    # Called every 10000 VM steps: a non-zero answer interrupts the statement, and the
    # interpreter gets control back (so a SIGTERM handler runs) while a query works.
    con.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    return con


def _validate(con: sqlite3.Connection, path: Path) -> None:
    objects = {(str(r[0]), str(r[1])) for r in con.execute("SELECT type, name FROM sqlite_master")}
    tables = {name for kind, name in objects if kind == "table"}
    if "meta" not in tables:
        raise HistoryError(
            f"history {path} is an SQLite file but not a pypto-bench history "
            f"(no meta table): {_fix(path)}"
        )
    meta = dict(
        con.execute(
            "SELECT key, value FROM meta WHERE key IN ('tool', 'schema_version')"
        ).fetchall()
    )
    if meta.get("tool") != _TOOL:
        raise HistoryError(
            f"history {path} belongs to another tool ({meta.get('tool')!r}): {_fix(path)}"
        )
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise HistoryError(
            f"history {path} has schema version {meta.get('schema_version')!r}, this "
            f"pypto-bench reads version {SCHEMA_VERSION}: use the pypto-bench that wrote it "
            "or start a new history file"
        )
    foreign = sorted(objects - _OBJECTS)
    if foreign:
        kind, name = foreign[0]
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise HistoryError(
            f"history {path} holds a {kind} {name[:60]!r}{more} that pypto-bench never "
            f"creates (a view or trigger can rewrite or hide runs): {_fix(path)}"
        )
    for table, columns in (("runs", _RUN_COLUMNS), ("arms", _ARM_COLUMNS)):
        have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        missing = [c for c in columns if c not in have]
        if missing:
            raise HistoryError(
                f"history {path}: table {table} lacks {', '.join(missing)} "
                f"(a damaged or foreign schema): {_fix(path)}"
            )
    big = con.execute(
        "SELECT max((SELECT max(length(report)) FROM runs), "
        "(SELECT max(length(samples)) FROM arms))"
    ).fetchone()[0]
    if big is not None and big > MAX_ROW_BYTES:
        raise HistoryError(
            f"history {path} holds a row of {big} bytes (more than "
            f"{MAX_ROW_BYTES} this tool ever writes): {_fix(path)}"
        )
    _check_values(con, path)


@contextmanager
def _reader(path: str | os.PathLike[str]) -> Iterator[sqlite3.Connection]:
    p = check_db_path(path, create=False)
    # Readers read only: with no "-wal" beside it nothing uncommitted is to be seen, so the
    # file is read as immutable, which needs no lock and creates no "-wal"/"-shm" (a WAL
    # history in a read-only folder failed "attempt to write a readonly database", and a
    # read left those files behind).
    quiet = not Path(f"{p}-wal").exists()
    try:
        with closing(_connect(p, readonly=True, immutable=quiet)) as con:
            con.row_factory = sqlite3.Row
            yield con
    except sqlite3.DatabaseError as err:
        raise HistoryError(f"history {p} could not be read ({err}): {_fix(p)}") from None


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")


def record(path: str | os.PathLike[str], report: Report | dict[str, Any]) -> int:
    """Append ``report`` (every arm) to the history at ``path`` in one transaction; its id.

    Creates the file (schema + ``meta``) when missing. ``HistoryError`` (nothing
    written) when ``path`` is not a usable history file.
    """
    data = report.to_dict() if isinstance(report, Report) else report
    try:
        return _record(path, data)
    except HistoryError:
        raise
    except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as err:
        # A report file is written by whoever handed it over (``history add``): a value of
        # the wrong kind anywhere (a model that is text, an arm that is a number, a batch
        # past int64, a NaN) is one line, and the transaction was rolled back.
        why = " ".join(f"{type(err).__name__}: {err}".split())[:160]
        raise HistoryError(
            f"the report does not hold what a history row stores ({why}), nothing was "
            "recorded: pass the report.json of a pypto-bench run, unedited"
        ) from None


def _record(path: str | os.PathLike[str], data: dict[str, Any]) -> int:
    text = json.dumps(data, sort_keys=True, allow_nan=False)
    if len(text) > MAX_ROW_BYTES:
        raise HistoryError(
            f"report of {len(text)} bytes is larger than a history row may be ({MAX_ROW_BYTES})"
        )
    p = check_db_path(path, create=True, tables=False)
    fp = fingerprint(data)
    model = data.get("model") or {}
    env = data.get("environment") or {}
    raw_path = model.get("path") or (data.get("config") or {}).get("model_path") or ""
    path_hash = hashlib.sha256(str(raw_path).encode()).hexdigest()[:16]
    shapes = json.dumps(fp["shapes"], sort_keys=True)
    intervals = arm_intervals(data)
    recorded_at = _now()
    try:
        with closing(_connect(p, readonly=False)) as con:
            # The write lock first (a second writer waits here while the first creates or
            # appends); the file's tables are validated inside the transaction, so a file
            # that is not this tool's history is rolled back, left exactly as it was.
            con.execute("BEGIN IMMEDIATE")
            try:
                fresh = con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
                if not fresh:  # an existing file: this tool's history, or refused as is
                    _validate(con, p)
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        con.execute(statement)
                _validate(con, p)
                cur = con.execute(
                    "INSERT INTO runs (recorded_at, created_at, model, model_path_hash, "
                    "model_class, regime, device, dtype, batch, seq, gen, torch, transformers, "
                    "host, ok, noisy, report) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        recorded_at,
                        data.get("created_at"),
                        fp["model"],
                        path_hash,
                        model.get("class"),
                        fp["regime"],
                        fp["device"],
                        fp["dtype"],
                        fp["shapes"]["batch"],
                        fp["shapes"]["seq"],
                        fp["shapes"]["gen"],
                        fp["versions"]["torch"],
                        fp["versions"]["transformers"],
                        env.get("host"),
                        int(bool(data.get("ok"))),
                        int(bool((data.get("noise") or {}).get("noisy"))),
                        text,
                    ),
                )
                run_id = int(cur.lastrowid or 0)
                for arm in data.get("arms") or []:
                    got = intervals.get(arm["name"], {})
                    tps, xe = got.get("tok/s"), got.get("x eager")
                    samples = (arm.get("tokens_per_s") or {}).get("samples") or []
                    con.execute(
                        "INSERT INTO arms (run_id, arm, ok, model, regime, device, dtype, "
                        "shapes, created_at, samples, tok_s_median, tok_s_low, tok_s_high, "
                        "x_eager_median, x_eager_low, x_eager_high, method) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (
                            run_id,
                            arm["name"],
                            int(bool(arm.get("ok"))),
                            fp["model"],
                            fp["regime"],
                            fp["device"],
                            fp["dtype"],
                            shapes,
                            data.get("created_at") or recorded_at,
                            json.dumps(samples),
                            tps.median if tps else None,
                            tps.low if tps else None,
                            tps.high if tps else None,
                            xe.median if xe else None,
                            xe.low if xe else None,
                            xe.high if xe else None,
                            tps.method if tps else None,
                        ),
                    )
                bad = _first_bad_value(con)  # what readers refuse is never written
                if bad is not None:
                    raise HistoryError(
                        "the report does not hold what a history row stores, nothing was "
                        f"recorded: {bad}"
                    )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            try:  # readers then never wait for a writer (once per file; kept after)
                con.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as err:  # busy: the next writer sets it
                log.debug("history %s stays in rollback-journal mode for now: %s", p, err)
    except sqlite3.DatabaseError as err:
        raise HistoryError(
            f"history {p} could not be written ({err}): {_write_fix(p, err)}"
        ) from None
    log.info("recorded run %d in history %s", run_id, p)
    return run_id


def _without_run_id(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)  # a Row iterates its values; dict() reads it as a mapping
    out.pop("run_id", None)
    return out


def list_runs(path: str | os.PathLike[str], last: int | None = None) -> list[dict[str, Any]]:
    """The newest ``last`` runs (every run when None), oldest first, without their report
    JSON, each with its arms' tok/s.

    Why a bound: a history grows by a run per CI job; listing a million rows whole took
    28 s and 2.1 GB, so the reads are limited in SQL, not after loading.
    """
    if last is not None and last < 1:
        raise HistoryError(f"--last must be >= 1 (0 on the command line lists all), got {last}")
    with _reader(path) as con:
        picked = con.execute(  # LIMIT -1: no limit
            f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs ORDER BY id DESC LIMIT ?",
            (-1 if last is None else last,),
        )
        runs = [dict(r) for r in picked][::-1]
        first = runs[0]["id"] if runs else 0
        arms: dict[int, list[dict[str, Any]]] = {}
        for r in con.execute(
            "SELECT run_id, arm, ok, tok_s_median, tok_s_low, tok_s_high, "
            "x_eager_median, x_eager_low, x_eager_high FROM arms WHERE run_id >= ? "
            "ORDER BY run_id, rowid",
            (first,),
        ):
            arms.setdefault(r["run_id"], []).append(_without_run_id(r))
    for run in runs:
        run["arms"] = arms.get(run["id"], [])
    return runs


def count_runs(path: str | os.PathLike[str]) -> int:
    """How many runs the history holds."""
    with _reader(path) as con:
        return int(con.execute("SELECT count(*) FROM runs").fetchone()[0])


def show_run(path: str | os.PathLike[str], run_id: int) -> dict[str, Any]:
    """One run: its columns, arms and the stored report (``report``)."""
    with _reader(path) as con:
        row = con.execute(
            f"SELECT {', '.join(_RUN_COLUMNS)}, report FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        if row is None:
            raise HistoryError(
                f"history {path} has no run {run_id}: `pypto-bench history "
                f"list --db {path}` lists the ids"
            )
        out = dict(row)
        out["report"] = _json(out["report"], f"run {run_id}'s report", path)
        out["arms"] = [
            _without_run_id(r)
            | {"samples": _json(r["samples"], f"run {run_id} arm {r['arm']!r}'s samples", path)}
            for r in con.execute(
                f"SELECT {', '.join(_ARM_COLUMNS)} FROM arms WHERE run_id = ? ORDER BY rowid",
                (run_id,),
            )
        ]
    return out


@dataclass
class CheckResult:
    """One line per group judged; ``regressed`` decides the exit code."""

    rule: str
    groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return any(g["verdict"] == "regression" for g in self.groups)

    @property
    def exit_code(self) -> int:
        return EXIT.REGRESSION if self.regressed else EXIT.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "regressed": self.regressed,
            "exit_code": self.exit_code,
            "groups": self.groups,
        }


def _band(medians: Sequence[float], tolerance: float) -> tuple[float, float]:
    base = statistics.median(medians)
    mad = statistics.median(abs(m - base) for m in medians)
    return base, max(3 * 1.4826 * mad, tolerance * abs(base))


def check(
    path: str | os.PathLike[str], *, min_runs: int = 3, tolerance: float = 0.05
) -> CheckResult:
    """Judge the newest run of every group against the earlier runs (module docstring)."""
    if min_runs < 1:
        raise HistoryError(f"--min-runs must be >= 1, got {min_runs}")
    if not 0 <= tolerance < 1:
        raise HistoryError(f"--tolerance must be in [0, 1), got {tolerance}")
    rule = (
        f"newest interval entirely below median(earlier medians) - max(3*1.4826*MAD, "
        f"{tolerance:.0%} of it) = regression (needs >= {min_runs} earlier runs)"
    )
    result = CheckResult(rule=rule)
    with _reader(path) as con:
        rows = [
            dict(r)
            for r in con.execute(
                "SELECT run_id, arm, model, regime, device, dtype, shapes, created_at, "
                "tok_s_median, tok_s_low, tok_s_high, x_eager_median, x_eager_low, x_eager_high "
                "FROM arms WHERE ok = 1 ORDER BY run_id"
            )
        ]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        group = (r["model"], r["regime"], r["arm"], r["device"], r["dtype"] or "", r["shapes"])
        groups.setdefault(group, []).append(r)
    for key, runs in groups.items():
        newest, earlier = runs[-1], runs[:-1]
        entry: dict[str, Any] = {
            "model": key[0],
            "regime": key[1],
            "arm": key[2],
            "device": key[3],
            "dtype": key[4],
            "shapes": _json(key[5], f"run {runs[-1]['run_id']}'s shapes", path),
            "run_id": newest["run_id"],
            "earlier_runs": len(earlier),
            "measures": [],
        }
        verdict = "ok"
        if len(earlier) < min_runs:
            verdict = "insufficient history"
        for name, col in (("tok/s", "tok_s"), ("x eager", "x_eager")):
            meds = [e[f"{col}_median"] for e in earlier if e[f"{col}_median"] is not None]
            if newest[f"{col}_median"] is None or len(meds) < min_runs:
                continue
            base, band = _band(meds, tolerance)
            # A row without its interval (a file another tool wrote, or edited) is judged on
            # its median alone: a point interval, never a TypeError.
            median = newest[f"{col}_median"]
            low = median if newest[f"{col}_low"] is None else newest[f"{col}_low"]
            high = median if newest[f"{col}_high"] is None else newest[f"{col}_high"]
            m_verdict = (
                "regression"
                if high < base - band
                else "improvement"
                if low > base + band
                else "no change"
            )
            entry["measures"].append(
                {
                    "measure": name,
                    "verdict": m_verdict,
                    "baseline": base,
                    "band": band,
                    "newest": {"median": median, "low": low, "high": high},
                }
            )
            if m_verdict == "regression":
                verdict = "regression"
            elif m_verdict == "improvement" and verdict == "ok":
                verdict = "improvement"
        entry["verdict"] = verdict
        result.groups.append(entry)
    return result


def plot_history(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    measure: str = "x eager",
    arm: str | None = None,
) -> Path:
    """PNG of ``measure`` ("x eager" or "tok/s") over time, one line per group, interval bars."""
    from .errors import BadInputError, EnvironmentMissingError

    col = {"x eager": "x_eager", "tok/s": "tok_s"}.get(measure)
    if col is None:
        raise BadInputError(f"--measure {measure!r}: pick 'x eager' or 'tok/s'")
    target = Path(out)
    if target.suffix.lower() != ".png":
        raise BadInputError(f"--out {target}: the plot is a PNG, name the file *.png")
    if not target.parent.is_dir():
        raise BadInputError(f"plot folder {target.parent} does not exist: create it first")
    with _reader(path) as con:
        rows = [
            dict(r)
            for r in con.execute(
                f"SELECT arm, model, regime, device, created_at, {col}_median AS m, {col}_low AS lo,"
                f" {col}_high AS hi FROM arms WHERE ok = 1 AND {col}_median IS NOT NULL "
                "ORDER BY run_id"
            )
        ]
    if arm is not None:
        rows = [r for r in rows if r["arm"] == arm]
    if not rows:
        raise HistoryError(
            f"history {path} has no {measure} values{f' for arm {arm}' if arm else ''} to plot"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise EnvironmentMissingError(
            "plotting needs matplotlib: pip install 'pypto-bench[plot]'"
        ) from err
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(f"{r['arm']} {r['regime']} {r['device']} {r['model'][:8]}", []).append(r)
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, pts in series.items():
        xs: Any = [_date(p["created_at"], path) for p in pts]
        ys = [p["m"] for p in pts]
        bars = [
            [p["m"] - (p["lo"] if p["lo"] is not None else p["m"]) for p in pts],
            [(p["hi"] if p["hi"] is not None else p["m"]) - p["m"] for p in pts],
        ]
        ax.errorbar(xs, ys, yerr=bars, marker="o", capsize=3, label=label)
    ax.set_ylabel(measure + " (median, 95% interval)")
    ax.set_title(f"pypto-bench history: {measure} over time")
    ax.legend(fontsize=7)
    fig.autofmt_xdate()
    fig.tight_layout()
    from pypto_common.files import atomic_write

    try:
        atomic_write(target, lambda fh: fig.savefig(fh, format="png", dpi=100))
    finally:
        plt.close(fig)
    return target
