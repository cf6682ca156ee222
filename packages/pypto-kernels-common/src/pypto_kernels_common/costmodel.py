"""The PyPTO cost model as a tile-shape signal: simulate one kernel build, read its cycles.

PyPTO's SIM run mode compiles a kernel for an Ascend 910B-class core array and
simulates it; ``CostModelSimulationOutput/_simulate.stat.report.txt`` in the call's
output folder holds "Total Cycles" (cycles / :data:`CYCLES_PER_US` = simulated us).
That number is deterministic, so it ranks tilings of one kernel at one shape; it is
a relative signal, not a validated NPU time.

Two layers, both kernel-agnostic (a package supplies what to build):

* :func:`measure` runs one kernel call in *this* process, in a fresh temporary
  output folder that is deleted afterwards (each call writes 1-170 MB), and returns
  the cycles. It is the one implementation of "run in SIM, read Total Cycles".
* :class:`Simulator` runs candidate tilings in a child process. That is not a
  luxury: in pypto 0.2.0 a tiling that fails to compile (a buffer overflow, say)
  leaves the process's PyPTO state broken (the next compile raises "function nested
  is not allowed", or hangs once that flag is reset), and a poor tiling can simulate
  for minutes. A worker that is replaced after every failure, and killed on a
  timeout, keeps one bad candidate from sinking a search. The worker also keeps
  PyPTO's stdout chatter away from a caller's ``--json`` stdout. The worker builds
  each call through the package's *builder*, named ``"module:function"`` so the
  child can import it: ``builder(bk, kernel, shape, dtype, tiles_dict) -> (fn, args)``.

Only the cost model runs (no precision tool): cycles do not depend on data, so no
calculator build (cmake) is needed, only ``g++``.

The buffer limits are the 910B figures PyPTO's own platform file declares
(``lib/configs/A2A3.ini``); the vector (UB) estimate is calibrated against the
simulator, which is the final judge (an over-estimate there just costs one failed
candidate, reported with PyPTO's own reason).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import sim
from .backend import cost_backend
from .sim import SimUnavailableError
from .tiles import CostModelError as CostModelError  # re-exported: the cost model's error
from .tiles import tiles_to_dict

__all__ = [
    "CUBE_ALIGN",
    "CYCLES_PER_US",
    "L0A_BYTES",
    "L0B_BYTES",
    "L0C_BYTES",
    "L1_BYTES",
    "UB_BYTES",
    "UB_LIVE_TILES",
    "Builder",
    "CostResult",
    "Simulator",
    "cube_fits",
    "measure",
    "next_pow2",
    "one_line",
    "pow2_upto",
    "read_cycles",
    "resolve_builder",
    "temp_root",
    "to_us",
    "ub_fits",
    "worker_main",
]

#: Simulated core clock used to turn cycles into microseconds (the project's convention).
CYCLES_PER_US = 1800.0

#: Buffer sizes of one 910B core in bytes (PyPTO 0.2.0 ``lib/configs/A2A3.ini``).
UB_BYTES = 196_608
L1_BYTES = 524_288
L0A_BYTES = 65_536
L0B_BYTES = 65_536
L0C_BYTES = 131_072
#: The cube unit works on 16 x 16 fractals: cube tile sides are multiples of this.
CUBE_ALIGN = 16

#: Kernels compute in fp32, and PyPTO places a vector op's input and output tiles in
#: UB together: vec_rows x vec_cols x 4 bytes x 2 must fit (calibrated against the
#: simulator: bf16 RMSNorm at hidden 2048 fits 8 rows, not 16; SwiGLU 16 x 1024 fits,
#: 16 x 2048 does not, whatever the io dtype).
UB_LIVE_TILES = 2

_CYCLES = re.compile(r"Total Cycles\.*:\s*(\d+)")
# "[ERROR] PYPTO(13065):2026-11-30 17:06:55.437 [file.h:347][PASS]:[Scope.Op]:message"
_LOG_ERROR = re.compile(r"^\[ERROR\]\s+\S+\s+\S+\s+(?:\[[^\]]*\]:?)+\s*(?P<msg>.*)$")
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./+-]+")
_BUILDER = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")

Builder = Callable[..., tuple[Callable[..., Any], tuple[Any, ...]]]


@dataclass
class CostResult:
    """One tiling of one kernel at one shape, as the cost model saw it.

    ``sim_us`` is None when ``ok`` is false; ``error`` is then one line (PyPTO's own
    reason where its log gave one). ``wall_s`` is the simulator's wall time for the
    call (compile + simulate), not a kernel time.
    """

    kernel: str
    shape: dict[str, int]
    dtype: str
    tiles: Any
    ok: bool
    sim_us: float | None = None
    cycles: int | None = None
    wall_s: float = 0.0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "shape": dict(self.shape),
            "dtype": self.dtype,
            "tiles": tiles_to_dict(self.tiles),
            "ok": self.ok,
            "sim_us": self.sim_us,
            "cycles": self.cycles,
            "wall_s": round(self.wall_s, 3),
            "error": self.error,
        }


def ub_fits(vec_rows: int, vec_cols: int) -> bool:
    """Whether an fp32 vector op's input and output tiles fit UB (:data:`UB_LIVE_TILES`)."""
    return vec_rows * vec_cols * 4 * UB_LIVE_TILES <= UB_BYTES


def cube_fits(m: int, k0: int, k1: int, n: int, elem_bytes: int) -> bool:
    """L0A (m x k0), L0B (k0 x n), L0C (m x n fp32) and L1 (m x k1 + k1 x n) limits."""
    return (
        m * k0 * elem_bytes <= L0A_BYTES
        and k0 * n * elem_bytes <= L0B_BYTES
        and m * n * 4 <= L0C_BYTES
        and (m * k1 + k1 * n) * elem_bytes <= L1_BYTES
    )


def pow2_upto(lo: int, hi: int) -> list[int]:
    """lo, 2 lo, 4 lo, ... up to hi (candidate tile sides)."""
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# --------------------------------------------------------------------------- one call


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def temp_root() -> Path:
    """A temp folder PyPTO can use (it passes the path through a shell)."""
    root = tempfile.gettempdir()
    if not _SHELL_SAFE.fullmatch(root):
        raise SimUnavailableError(
            f"temp folder {root!r} has characters PyPTO cannot use; set TMPDIR to a plain path"
        )
    return Path(root)


def read_cycles(folder: Path) -> int | None:
    """Largest "Total Cycles" in the cost-model reports under ``folder`` (None: none)."""
    best: int | None = None
    for report in folder.glob("**/_simulate.stat.report.txt"):
        for m in _CYCLES.finditer(report.read_text(errors="replace")):
            best = max(best or 0, int(m.group(1)))
    return best


def measure(fn: Callable[..., Any], *args: Any) -> tuple[int | None, float]:
    """Call a SIM-mode kernel once; return (total cycles or None, wall seconds).

    PyPTO reads ``TILE_FWK_OUTPUT_DIR`` on each call, so the call gets a fresh
    temporary one that is deleted afterwards, whatever happens. The kernel's
    exceptions propagate. Not thread-safe (it sets an environment variable).
    """
    tmp = Path(tempfile.mkdtemp(prefix="pypto-sim-", dir=temp_root()))
    try:
        with _env("TILE_FWK_OUTPUT_DIR", str(tmp)):
            t = time.perf_counter()
            fn(*args)
            wall = time.perf_counter() - t
        return read_cycles(tmp), wall
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def to_us(cycles: int | None) -> float | None:
    return None if cycles is None else cycles / CYCLES_PER_US


# --------------------------------------------------------------------------- the worker


def _new_log_errors(log_dir: Path, offsets: dict[Path, int]) -> list[str]:
    """PyPTO's ERROR lines written since ``offsets`` (its real reasons are only there)."""
    lines: list[str] = []
    for f in sorted(log_dir.glob("**/*.log")):
        start = offsets.get(f, 0)
        try:
            with open(f, "rb") as fh:
                fh.seek(start)
                text = fh.read().decode(errors="replace")
        except OSError:
            continue
        offsets[f] = start + len(text.encode(errors="replace"))
        for line in text.splitlines():
            m = _LOG_ERROR.match(line.strip())
            if m and m.group("msg"):
                lines.append(m.group("msg").strip())
    return lines


def one_line(err: BaseException) -> str:
    """The first line of an error, without terminal colour codes."""
    text = str(err).strip().splitlines()
    head = text[0] if text else type(err).__name__
    return re.sub(r"\x1b\[[0-9;]*m", "", head).strip() or type(err).__name__


def resolve_builder(spec: str) -> Builder:
    """The function a ``"module:function"`` builder spec names."""
    if not _BUILDER.fullmatch(spec):
        raise ValueError(f"builder {spec!r} must be 'module:function'")
    module, _, name = spec.partition(":")
    fn: Builder = getattr(importlib.import_module(module), name)
    return fn


def worker_main(builder: str, install_hint: str = sim.INSTALL_HINT) -> int:
    """Serve simulate requests (JSON lines on stdin) until EOF or the first failure.

    Results go to the original stdout; fd 1 is pointed at stderr first so PyPTO's own
    prints cannot corrupt them. After a failed call the worker exits: PyPTO's state
    is broken from then on, and the parent starts a fresh worker.
    """
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    log_dir = Path(os.environ["ASCEND_PROCESS_LOG_PATH"])
    offsets: dict[Path, int] = {}
    try:
        # Before the builder's module runs: one that imports pypto at import time would
        # otherwise load it without the quiet config (swim-lane PNGs on every call).
        sim.prepare_environment()
        build = resolve_builder(builder)
        bk = cost_backend(install_hint)
    except (SimUnavailableError, ImportError, AttributeError, ValueError) as err:
        results.write(json.dumps({"fatal": one_line(err)}) + "\n")
        return 0
    results.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        try:
            fn, args = build(bk, req["kernel"], req["shape"], req["dtype"], req["tiles"])
            cycles, wall = measure(fn, *args)
        except Exception as err:  # any compile/simulate failure is this candidate's result
            reasons = _new_log_errors(log_dir, offsets)
            msg = reasons[0] if reasons else one_line(err)
            results.write(json.dumps({"ok": False, "error": msg}) + "\n")
            return 0
        if cycles is None:
            results.write(
                json.dumps({"ok": False, "error": "the cost model wrote no Total Cycles"}) + "\n"
            )
            return 0
        results.write(json.dumps({"ok": True, "cycles": cycles, "wall_s": wall}) + "\n")
    return 0


_WORKER = (
    "import sys; from pypto_kernels_common.costmodel import worker_main;"
    " raise SystemExit(worker_main(sys.argv[1], sys.argv[2]))"
)


class Simulator:
    """Runs tilings in a child process, replaced after each failure (see the module doc).

    ``builder`` is the ``"module:function"`` that builds one call in the worker. Use as
    a context manager (or call :meth:`close`): the worker's temporary folder (PyPTO's
    logs and home) is deleted on close. ``timeout_s`` bounds one candidate; a
    candidate over it is killed and reported as timed out.
    """

    def __init__(
        self, builder: str, timeout_s: float = 600.0, install_hint: str = sim.INSTALL_HINT
    ) -> None:
        if not _BUILDER.fullmatch(builder):
            raise ValueError(f"builder {builder!r} must be 'module:function'")
        self.builder = builder
        self.install_hint = install_hint
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="pypto-costmodel-", dir=temp_root()))
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmp, True)
        self.started = 0  # workers started (one per failure, plus the first)
        self._wdir: Path | None = None

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop()
        self._finalizer()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin:
                proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if self._wdir is not None:
            shutil.rmtree(self._wdir, ignore_errors=True)
            self._wdir = None

    def _stderr_tail(self) -> str:
        path = self._tmp / "worker.err"
        try:
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def _read(self, timeout: float) -> dict[str, Any] | None:
        """One JSON line from the worker, or None on timeout / exit."""
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return None
        line = proc.stdout.readline()
        return json.loads(line) if line else None

    def _start(self) -> None:
        # Each worker gets its own folder (PyPTO's logs, home, stray outputs, and TMPDIR,
        # so measure()'s per-call folders of a killed worker are removed with it).
        self._wdir = self._tmp / f"worker{self.started}"
        env = dict(os.environ)
        for var, sub in (
            ("ASCEND_PROCESS_LOG_PATH", "log"),
            ("PYPTO_HOME", "home"),
            ("TILE_FWK_OUTPUT_DIR", "output"),
            ("TMPDIR", "tmp"),
        ):
            (self._wdir / sub).mkdir(parents=True, exist_ok=True)
            env[var] = str(self._wdir / sub)
        err = open(self._tmp / "worker.err", "a")  # noqa: SIM115 (owned by the child)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, self.builder, self.install_hint],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
                cwd=self._wdir,
            )
        finally:
            err.close()
        self.started += 1
        hello = self._read(max(self.timeout_s, 120.0))
        if not hello or "fatal" in hello:
            reason = (hello or {}).get("fatal") or self._stderr_tail() or "worker did not start"
            self._stop()
            raise SimUnavailableError(reason)

    def simulate(self, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Any) -> CostResult:
        """One tiling's simulated time; failures come back as ``ok=False`` with a reason.

        ``shape`` must already be checked by the package (this layer knows no kernel).
        Raises SimUnavailableError when PyPTO cannot run here at all.
        """
        s = dict(shape)
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._start()
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        req = {"kernel": kernel, "shape": s, "dtype": dtype, "tiles": tiles_to_dict(tiles)}
        t = time.perf_counter()
        try:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self._stop()
            return CostResult(
                kernel, s, dtype, tiles, ok=False, error="the simulator worker exited"
            )
        reply = self._read(self.timeout_s)
        wall = time.perf_counter() - t
        if reply is None:
            timed_out = proc.poll() is None
            if timed_out:
                proc.kill()
            tail = self._stderr_tail()
            self._stop()
            error = (
                f"timed out after {self.timeout_s:.0f} s in the simulator"
                if timed_out
                else f"the simulator worker died (exit {proc.returncode}): {tail or 'no message'}"
            )
            return CostResult(kernel, s, dtype, tiles, ok=False, wall_s=wall, error=error)
        if not reply.get("ok"):
            self._stop()  # the worker exits after a failure: PyPTO's state is broken
            return CostResult(
                kernel, s, dtype, tiles, ok=False, wall_s=wall, error=str(reply.get("error"))
            )
        cycles = int(reply["cycles"])
        return CostResult(
            kernel,
            s,
            dtype,
            tiles,
            ok=True,
            sim_us=to_us(cycles),
            cycles=cycles,
            wall_s=float(reply["wall_s"]),
        )
