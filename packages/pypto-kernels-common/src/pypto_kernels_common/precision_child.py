"""Run a package's precision cases in a child process and read back one JSON row per case.

Why a child: PyPTO 0.2.0 keeps the native memory a CPU SIM + verify run allocates (its
verify copies, compiled programs, cost-model state) for the life of the process; torch's
and glibc's allocators do not give it back either. A pytest worker that ran
pypto-kernels-attention's precision cases in-process grew by ~1.6 GB, GutenOCR's by
~1.1 GB, and carried that for the rest of the suite; one MoE case holds up to 11 GB. In a
child that memory ends with the child.

The child (``python -m pypto_kernels_common.precision_child <suite-module> [case-id ...]``)
prepares PyPTO's environment before anything imports pypto, imports ``<suite-module>``
(its ``SUITE`` is a :class:`~pypto_kernels_common.precision.PrecisionSuite`), and for each
case: builds the case's inputs, runs the op with its switch on, takes the op's call
counts, summarises every output, compares with the fp32 golden, and prints one JSON row
(:data:`ROW_FIELDS`). The parent (:func:`run_cases_in_child`) starts it in its own process
group, kills the whole group on timeout (and any process the child left behind), and
returns id -> row; the assertions stay in the tests.

Only rows go to the child's stdout: anything else written there (PyPTO's C stdio, a
``print``) is sent to stderr, whose tail the parent puts into its errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib import import_module
from typing import IO, Any

from pypto_common.parent import end_with_parent

__all__ = [
    "PARENT_PID_ENV",
    "ROW_FIELDS",
    "ROW_MARKER",
    "ROW_VERSION",
    "STDERR_TAIL",
    "STDOUT_CAP",
    "PrecisionChildError",
    "PrecisionChildTimeoutError",
    "check_row",
    "child_command",
    "find_package",
    "main",
    "parse_rows",
    "run_case",
    "run_cases_in_child",
    "run_child",
]

log = logging.getLogger(__name__)

#: The key every row carries (value :data:`ROW_VERSION`); lines without it are not rows.
ROW_MARKER = "precision_child"
ROW_VERSION = 2  # 2: peak_mib
#: Each row's fields and the types each may hold (``type(None)``: null allowed).
ROW_FIELDS: dict[str, tuple[type, ...]] = {
    ROW_MARKER: (int,),
    "id": (str,),
    "op": (str,),
    "ok": (bool,),
    # "Type: message" on one line, None when ok.
    "error": (str, type(None)),
    # The op's {"pypto": n, "reference": n} since the case started (counts reset before
    # each case); None when the op is not one of the package's ops.
    "calls": (dict, type(None)),
    # The package's fallback reasons recorded during the case, op -> reason.
    "fallback_reasons": (dict,),
    # compare()'s max abs error per output; None when the run or the comparison failed.
    "max_abs": (dict, type(None)),
    # Per output the op returned: {"all_zero": bool, "max_abs_value": float}.
    "outputs": (dict,),
    # Per output that is also an input of the same name (an in-place state): whether
    # the returned value differs from the input.
    "moved": (dict,),
    # PyPTO per-call output folders of this child's pid left in $TILE_FWK_OUTPUT_DIR.
    "leftover_outputs": (list,),
    "pid": (int,),
    "seconds": (float, int),
    # This child's resident high-water mark (MiB) when the row was written: what the case
    # needed, or an earlier case of the same child if that needed more. The parent cannot
    # see it per child (its RUSAGE_CHILDREN peak is the largest child so far), and a test
    # can hold a case to a memory budget with it. None where the platform does not say.
    "peak_mib": (float, int, type(None)),
}
#: The pid of the process that started the child (set by :func:`run_child`): the child
#: ends, with everything in its process group, once that process is no longer its parent,
#: however it ended (a pytest worker killed by SIGTERM runs no cleanup of its own).
PARENT_PID_ENV = "PYPTO_PRECISION_PARENT_PID"
#: At most this many bytes of the child's stdout are read (rows are ~1 KB each).
STDOUT_CAP = 10 * 1024 * 1024
#: The last this many bytes of the child's stderr go into an error's message.
STDERR_TAIL = 4000
_ERROR_CAP = 2000
_UNKNOWN_IDS_EXIT = 3


class PrecisionChildError(RuntimeError):
    """The child failed to deliver a valid row for every requested case.

    ``rows`` holds the valid rows it did deliver (id -> row), ``stderr_tail`` the end of
    its stderr.
    """

    def __init__(
        self, message: str, rows: Mapping[str, dict[str, Any]] | None = None, stderr_tail: str = ""
    ) -> None:
        super().__init__(message)
        self.rows = dict(rows or {})
        self.stderr_tail = stderr_tail


class PrecisionChildTimeoutError(PrecisionChildError):
    """The child ran past its timeout; its whole process group was killed."""


# --- the child's side -------------------------------------------------------------------


def find_package(suite_module: str) -> Any:
    """The :class:`~pypto_kernels_common.KernelPackage` whose stats and switches the cases use.

    Looked up as ``<suite-module>.PACKAGE``, then ``<suite package>.package.PACKAGE``,
    then ``<suite package>.PACKAGE`` (the suite package is ``SUITE.package``); None when
    there is none (the rows then have ``calls`` None).
    """
    from .dispatch import KernelPackage

    suite = import_module(suite_module)
    names = [suite_module, f"{suite.SUITE.package}.package", suite.SUITE.package]
    for name in names:
        try:
            mod = import_module(name)
        except ModuleNotFoundError:
            continue
        pkg = getattr(mod, "PACKAGE", None)
        if isinstance(pkg, KernelPackage):
            return pkg
    return None


def _one_line(err: BaseException) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text if len(text) <= _ERROR_CAP else text[: _ERROR_CAP - 3] + "..."


def _leftover_outputs() -> list[str]:
    from . import sim

    tag = f"_{os.getpid()}_"
    return sorted(n for n in sim.run_output_names() if tag in n)


def _peak_mib() -> float | None:
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def run_case(suite: Any, package: Any, case: Any, *, reduced: bool) -> dict[str, Any]:
    """Run one case in this process (the child's work) and return its row.

    The op's switch is on and its counters reset; every field of :data:`ROW_FIELDS` is
    present, those after a failure keep what was measured before it.
    """
    import contextlib

    import torch

    from .precision import compare, make_inputs

    start = time.monotonic()
    row: dict[str, Any] = {
        ROW_MARKER: ROW_VERSION,
        "id": case.id,
        "op": case.op,
        "ok": False,
        "error": None,
        "calls": None,
        "fallback_reasons": {},
        "max_abs": None,
        "outputs": {},
        "moved": {},
        "leftover_outputs": [],
        "pid": os.getpid(),
        "seconds": 0.0,
        "peak_mib": None,
    }
    on = package is not None and case.op in package.ops
    if package is not None:
        package.stats.reset()
    try:
        inputs = make_inputs(case, reduced=reduced)
        # The golden first: its fp32 copies are freed before the kernel runs, so the peak
        # is the larger of the two, not their sum on top of what PyPTO keeps (the
        # LLaDA2-mini prefill case: 10.9 GB with the golden after the kernel).
        want = suite.golden(case, inputs)
        switch = package.switches.pto_switches({case.op: True}) if on else contextlib.nullcontext()
        try:
            with switch:
                got = suite.run_kernel(case, inputs)
        finally:
            if on:
                row["calls"] = package.stats.calls().get(case.op)
            if package is not None:
                row["fallback_reasons"] = package.stats.fallback_reasons()
        for name in case.outputs:
            if name not in got:
                continue
            t = got[name].float()
            top = t.abs().max().item() if t.numel() else 0.0
            row["outputs"][name] = {"all_zero": not bool(t.any()), "max_abs_value": top}
            given = inputs.get(name)
            if isinstance(given, torch.Tensor):
                row["moved"][name] = not torch.equal(given, got[name])
        row["max_abs"] = compare(case, got, want)
        row["ok"] = True
    except Exception as err:
        row["error"] = _one_line(err)
    finally:
        row["leftover_outputs"] = _leftover_outputs()
        row["seconds"] = round(time.monotonic() - start, 3)
        row["peak_mib"] = _peak_mib()
    return row


def main(argv: Sequence[str] | None = None) -> int:
    """The child: run the cases, print one row per case to stdout (only rows go there).

    Exit status 0 when every case produced a row (a failing case is a row with ``ok``
    false), 3 for case ids the suite does not have (named on stderr), 2 for bad usage.
    """
    parser = argparse.ArgumentParser(
        prog="python -m pypto_kernels_common.precision_child",
        description="Run precision cases through the op; print one JSON row per case.",
    )
    parser.add_argument("suite_module", help="module with SUITE (a PrecisionSuite)")
    parser.add_argument("case_ids", nargs="*", help="cases to run (default: all, in order)")
    parser.add_argument(
        "--full-shapes",
        action="store_true",
        help="inputs at the cases' full shapes (default: the reduced shapes a case declares)",
    )
    args = parser.parse_args(argv)
    parent = os.environ.get(PARENT_PID_ENV, "")
    if parent.isdigit():  # before anything starts a thread (the group's watchdog forks)
        end_with_parent(int(parent))

    # Rows alone on stdout: fd 1 (PyPTO's C stdio, print) goes to stderr from here on.
    sys.stdout.flush()
    rows_out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    from . import sim

    sim.prepare_environment()  # before anything imports pypto
    suite = import_module(args.suite_module).SUITE
    package = find_package(args.suite_module)
    cases = suite.load_cases()
    if args.case_ids:
        by_id = {c.id: c for c in cases}
        unknown = [i for i in args.case_ids if i not in by_id]
        if unknown:
            print(
                f"unknown case ids for {args.suite_module}: {unknown}; known: {sorted(by_id)}",
                file=sys.stderr,
            )
            return _UNKNOWN_IDS_EXIT
        cases = [by_id[i] for i in args.case_ids]
    for case in cases:
        row = run_case(suite, package, case, reduced=not args.full_shapes)
        print(json.dumps(row), file=rows_out, flush=True)
    rows_out.close()
    return 0


# --- the parent's side ------------------------------------------------------------------


def check_row(row: Any) -> dict[str, Any]:
    """``row`` if it has exactly :data:`ROW_FIELDS` with their types, else PrecisionChildError."""
    if not isinstance(row, dict):
        raise PrecisionChildError(f"precision child row is not an object: {row!r:.300}")
    if row.get(ROW_MARKER) != ROW_VERSION:
        raise PrecisionChildError(
            f"precision child row has {ROW_MARKER}={row.get(ROW_MARKER)!r}, expected"
            f" {ROW_VERSION}: {row!r:.300}"
        )
    missing = sorted(set(ROW_FIELDS) - set(row))
    unknown = sorted(set(row) - set(ROW_FIELDS))
    if missing or unknown:
        raise PrecisionChildError(
            f"precision child row has missing fields {missing} / unknown fields {unknown}:"
            f" {row!r:.300}"
        )
    for name, types in ROW_FIELDS.items():
        value = row[name]
        # bool is an int in Python; a count or pid must not be true/false.
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if wrong:
            raise PrecisionChildError(
                f"precision child row field {name!r} is {type(value).__name__}"
                f" {value!r:.100}: {row!r:.300}"
            )
    return row


def parse_rows(text: str) -> list[dict[str, Any]]:
    """The rows in a child's stdout: lines that are JSON objects with :data:`ROW_MARKER`.

    Other lines are ignored; a marked line with the wrong shape raises PrecisionChildError.
    """
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and ROW_MARKER in obj:
            rows.append(check_row(obj))
    return rows


def child_command(
    suite_module: str, case_ids: Sequence[str] | None = None, *, reduced: bool = True
) -> list[str]:
    """The command line that runs the child with this interpreter."""
    cmd = [sys.executable, "-m", __name__, suite_module, *(case_ids or ())]
    return cmd if reduced else [*cmd, "--full-shapes"]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(f: IO[bytes], size: int) -> str:
    end = f.seek(0, os.SEEK_END)
    f.seek(max(0, end - size))
    return f.read().decode("utf-8", "replace")


def run_child(
    command: Sequence[str],
    *,
    timeout_s: float,
    expected_ids: Sequence[str] | None = None,
    what: str = "precision child",
    env: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``command`` (a child printing rows) and return its rows, id -> row.

    The child runs in a new session (its own process group); on timeout the whole group
    is killed, and once the child has exited whatever it left in its group is killed too.
    It is told this process's pid (:data:`PARENT_PID_ENV`): a child of this module ends
    with its group when this process ends without killing it (SIGKILL, or SIGTERM's
    default action).
    stdout and stderr go to temporary files; at most :data:`STDOUT_CAP` bytes of stdout
    are read. Raises PrecisionChildTimeoutError past ``timeout_s``, PrecisionChildError when
    the child exits non-zero, writes more than the cap, prints a malformed row, repeats an
    id, or leaves an id of ``expected_ids`` without a row (with ``expected_ids`` None: no
    row at all).
    """
    label = f"cases {list(expected_ids)}" if expected_ids else "all cases"
    child_env = dict(os.environ if env is None else env)
    child_env[PARENT_PID_ENV] = str(os.getpid())
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=child_env,
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # the child (on timeout) and anything it left behind
            proc.wait()
        seconds = time.monotonic() - start
        stderr_tail = _tail(err, STDERR_TAIL)
        size = out.seek(0, os.SEEK_END)
        out.seek(0)
        text = out.read(STDOUT_CAP).decode("utf-8", "replace")
    log.info("%s (%s) exited %s after %.1f s", what, label, proc.returncode, seconds)
    if size > STDOUT_CAP:
        raise PrecisionChildError(
            f"{what} ({label}) wrote {size} bytes to stdout, over the {STDOUT_CAP}-byte cap",
            stderr_tail=stderr_tail,
        )
    rows: dict[str, dict[str, Any]] = {}
    for row in parse_rows(text):
        if row["id"] in rows:
            raise PrecisionChildError(f"{what} printed case {row['id']!r} twice", rows, stderr_tail)
        rows[row["id"]] = row
    missing = [i for i in expected_ids or () if i not in rows]
    done = f"rows for {sorted(rows)}" if rows else "no rows"
    if timed_out:
        raise PrecisionChildTimeoutError(
            f"{what} ({label}) timed out after {timeout_s:g} s and was killed with its process"
            f" group; it gave {done}; stderr tail:\n{stderr_tail}",
            rows,
            stderr_tail,
        )
    if proc.returncode != 0:
        code = proc.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        raise PrecisionChildError(
            f"{what} ({label}) {how}; it gave {done}; stderr tail:\n{stderr_tail}",
            rows,
            stderr_tail,
        )
    if missing or not rows:
        raise PrecisionChildError(
            f"{what} ({label}) exited 0 but gave no row for {missing or 'any case'}; it gave"
            f" {done}; stderr tail:\n{stderr_tail}",
            rows,
            stderr_tail,
        )
    return rows


def run_cases_in_child(
    suite_module: str,
    case_ids: Sequence[str] | None = None,
    *,
    timeout_s: float = 900,
    reduced: bool = True,
    env: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``suite_module``'s cases (all, or ``case_ids`` in that order) in one child.

    Returns id -> row (fields :data:`ROW_FIELDS`); a case that failed is a row with
    ``ok`` false and its ``error``. ``reduced`` builds inputs at the reduced shapes a case
    declares (``make_inputs(case, reduced=True)``), else at full shapes. The child
    inherits this process's environment (``env`` replaces it): PyPTO's run folders set by
    a conftest are the child's too. Errors: see :func:`run_child`; unknown case ids make
    the child exit 3 naming them, which the PrecisionChildError message quotes.
    """
    return run_child(
        child_command(suite_module, case_ids, reduced=reduced),
        timeout_s=timeout_s,
        expected_ids=case_ids,
        what=f"precision child for {suite_module}",
        env=env,
    )


if __name__ == "__main__":
    sys.exit(main())
