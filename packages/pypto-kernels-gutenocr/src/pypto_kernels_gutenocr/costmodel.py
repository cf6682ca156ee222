"""The PyPTO cost model as a tile-shape signal: simulate one kernel build, read its cycles.

PyPTO's SIM run mode compiles a kernel for an Ascend 910B-class core array and
simulates it; ``CostModelSimulationOutput/_simulate.stat.report.txt`` in the call's
output folder holds "Total Cycles" (cycles / :data:`CYCLES_PER_US` = simulated us).
That number is deterministic, so it ranks tilings of one kernel at one shape; it is
a relative signal, not a validated NPU time.

Two layers:

* :func:`measure` runs one kernel call in *this* process, in a fresh temporary
  output folder that is deleted afterwards (each call writes 1-170 MB), and returns
  the cycles. It is the one implementation of "run in SIM, read Total Cycles";
  ``tools/bench_gutenocr_costmodel.py`` uses it for calls known to compile.
* :func:`simulate` / :class:`Simulator` run candidate tilings in a child process.
  That is not a luxury: in pypto 0.2.0 a tiling that fails to compile (a buffer
  overflow, say) leaves the process's PyPTO state broken (the next compile raises
  "function nested is not allowed", or hangs once that flag is reset), and a poor
  tiling can simulate for minutes. A worker that is replaced after every failure,
  and killed on a timeout, keeps one bad candidate from sinking a search. The worker
  also keeps PyPTO's stdout chatter away from a caller's ``--json`` stdout.

Only the cost model runs (no precision tool): cycles do not depend on data, so no
calculator build (cmake) is needed, only ``g++``.

The buffer limits the candidates respect are the 910B figures PyPTO's own platform
file declares (``lib/configs/A2A3.ini``); the vector (UB) estimate is calibrated
against the simulator, which is the final judge (an over-estimate there just
costs one failed candidate, reported with PyPTO's own reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
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

import torch

from . import sim_shim
from .kernels import Tiles, rms_tiles, swiglu_tiles
from .ops import ENVELOPES

log = logging.getLogger(__name__)

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

#: Both kernels compute in fp32, and PyPTO places a vector op's input and output tiles
#: in UB together: vec_rows x vec_cols x 4 bytes x 2 must fit (calibrated against the
#: simulator: bf16 RMSNorm at hidden 2048 fits 8 rows, not 16; SwiGLU 16 x 1024 fits,
#: 16 x 2048 does not, whatever the io dtype).
UB_LIVE_TILES = 2

#: Rows beyond this are refused by the search (cost and memory grow with rows, the
#: ranking of tilings does not change past a few loop steps).
MAX_ROWS = 65_536

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}

SHAPE_NAMES: dict[str, tuple[str, ...]] = {
    "rms_norm": ("rows", "hidden"),
    "swiglu_mlp": ("rows", "hidden", "inter"),
}

INSTALL_HINT = "pip install 'pypto-kernels-gutenocr[pypto]'"

_CYCLES = re.compile(r"Total Cycles\.*:\s*(\d+)")
# "[ERROR] PYPTO(13065):2026-11-30 17:06:55.437 [file.h:347][PASS]:[Scope.Op]:message"
_LOG_ERROR = re.compile(r"^\[ERROR\]\s+\S+\s+\S+\s+(?:\[[^\]]*\]:?)+\s*(?P<msg>.*)$")
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./+-]+")
_RMS_EPS = 1e-6


class CostModelError(ValueError):
    """A request the cost model cannot take (kernel, dtype, shape); one line with the fix."""


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
    tiles: Tiles
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


# --------------------------------------------------------------------------- tiles


def tiles_to_dict(tiles: Tiles) -> dict[str, Any]:
    """JSON-ready tiles (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(tiles).items()}


def tiles_from_dict(data: Mapping[str, Any]) -> Tiles:
    """The inverse of :func:`tiles_to_dict`; unknown keys are refused."""
    names = {f.name for f in dataclasses.fields(Tiles)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise CostModelError(f"unknown tile fields {unknown}; known: {sorted(names)}")
    kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return Tiles(**kwargs)


def tiles_label(tiles: Tiles, kernel: str = "swiglu_mlp") -> str:
    """A compact one-line label for tables (RMSNorm has no cube tiles)."""
    vec = f"rows={tiles.rows} vec={tiles.vec_rows}x{tiles.vec_cols}"
    if kernel == "rms_norm":
        return vec
    return (
        f"{vec} m={tiles.cube_m[0]}/{tiles.cube_m[1]} k={tiles.cube_k[0]}/{tiles.cube_k[1]}"
        f" n={tiles.cube_n[0]}/{tiles.cube_n[1]}"
    )


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise CostModelError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _check_kernel(kernel: str) -> None:
    if kernel not in SHAPE_NAMES:
        raise CostModelError(
            f"kernel {kernel!r} has no tile search; tunable kernels: {sorted(SHAPE_NAMES)}"
        )


def check_shape(kernel: str, shape: Mapping[str, int], dtype: str = "bf16") -> dict[str, int]:
    """The shape as a plain dict, or CostModelError saying what is wrong and what fits.

    The envelope is the kernel's own (:data:`.ops.ENVELOPES`), so the search accepts
    exactly the shapes the model's calls would run through PyPTO.
    """
    _check_kernel(kernel)
    tdt = _torch_dtype(dtype)
    names = SHAPE_NAMES[kernel]
    missing = [n for n in names if n not in shape]
    extra = sorted(set(shape) - set(names))
    if missing or extra:
        want = ",".join(f"{n}=N" for n in names)
        raise CostModelError(
            f"{kernel} shape needs exactly {', '.join(names)}"
            f" (missing {missing}, unknown {extra}); pass --shape {want}"
        )
    out: dict[str, int] = {}
    for n in names:
        v = shape[n]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise CostModelError(f"{kernel} shape {n}={v!r} must be a positive integer")
        out[n] = v
    if out["rows"] > MAX_ROWS:
        raise CostModelError(
            f"{kernel} rows={out['rows']} is above the search's limit {MAX_ROWS}; use fewer rows"
        )
    env = ENVELOPES[kernel]
    if tdt not in env.dtypes:
        raise CostModelError(f"{kernel} does not take dtype {dtype}")

    def meta(*size: int) -> torch.Tensor:  # shapes only: nothing is allocated
        return torch.empty(size, device="meta", dtype=tdt)

    if kernel == "rms_norm":
        tensors = [meta(out["rows"], out["hidden"]), meta(out["hidden"])]
    else:
        h, i = out["hidden"], out["inter"]
        tensors = [meta(out["rows"], h), meta(h, i), meta(h, i), meta(i, h)]
    for rule in env.rules:
        reason = rule(*tensors)
        if reason:
            raise CostModelError(f"{kernel} shape outside the kernel's envelope: {reason}")
    return out


def default_tiles(kernel: str, dtype: str = "bf16") -> Tiles:
    """The tiles the model's calls use today (``kernels.rms_tiles`` / ``swiglu_tiles``)."""
    _check_kernel(kernel)
    tdt = _torch_dtype(dtype)
    return rms_tiles(tdt) if kernel == "rms_norm" else swiglu_tiles(tdt)


def _pow2_upto(lo: int, hi: int) -> list[int]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


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


def _cols(options: list[int], dim: int, default_cols: int) -> list[int]:
    """Vector-column choices for a dimension, spelled like the default where equivalent.

    The kernels tile ``min(dim, vec_cols)`` columns, so 2048 and 512 are the same tiling
    of a 512-wide row; using the default's spelling keeps the default a neighbour of
    every other candidate in the search.
    """
    out: list[int] = []
    for c in options:
        v = default_cols if min(c, dim) == min(default_cols, dim) else c
        if v not in out:
            out.append(v)
    return out


def candidate_tiles(kernel: str, shape: Mapping[str, int], dtype: str = "bf16") -> list[Tiles]:
    """Every tiling worth simulating for this shape, the default first.

    Respects the buffer limits (UB for vector tiles, L0A/L0B/L0C/L1 for cube tiles,
    in bytes of ``dtype``) and the shape (no tile wider than the dimension it
    tiles, vector rows dividing the loop step). The default is always included, even
    where these rules would drop it, so a search can report against it.
    """
    s = check_shape(kernel, shape, dtype)
    elem = torch.empty((), dtype=_torch_dtype(dtype)).element_size()
    default = default_tiles(kernel, dtype)
    cands: list[Tiles] = [default]
    seen = {default}

    def add(t: Tiles) -> None:
        if t not in seen:
            seen.add(t)
            cands.append(t)

    row_cap = max(8, _next_pow2(s["rows"]))
    if kernel == "rms_norm":
        h = s["hidden"]
        cols = _cols(
            sorted({c for c in (h, h // 2, h // 4) if c >= 64 and c % 64 == 0 and h % c == 0}),
            h,
            default.vec_cols,
        )
        for rows in sorted({*_pow2_upto(1, min(64, row_cap)), default.rows}):
            for vr in sorted(
                {*_pow2_upto(1, rows), *([default.vec_rows] if default.vec_rows <= rows else [])}
            ):
                for vc in cols:
                    if ub_fits(vr, min(vc, h)):
                        add(Tiles(rows=rows, vec_rows=vr, vec_cols=vc))
        return cands

    h, i = s["hidden"], s["inter"]
    cap = max(min(h, i), 64)  # no cube k/n tile wider than both matmuls' k and n
    vcols = _cols(
        sorted({c for c in (512, 1024, 2048, 4096) if c <= i} or {i}), i, default.vec_cols
    )
    # Each axis also offers the default's own value, so the default has neighbours on
    # every axis (coordinate descent starts there).
    k_opts = [(k0, k1) for k0 in (64, 128, 256) for k1 in (k0, 2 * k0, 4 * k0) if k1 <= cap]
    k_opts += [default.cube_k] if default.cube_k not in k_opts else []
    n_opts = sorted({n for n in (64, 128, 256, 512) if n <= cap} | {default.cube_n[0]})
    for rows in sorted({*_pow2_upto(16, min(128, max(16, row_cap))), default.rows}):
        m_opts = sorted({*_pow2_upto(CUBE_ALIGN, 128), default.cube_m[0]})
        vr_opts = sorted({*_pow2_upto(4, 32), default.vec_rows})
        for m in (m for m in m_opts if m <= rows):
            for k0, k1 in k_opts:
                for n in n_opts:
                    if not cube_fits(m, k0, k1, n, elem):
                        continue
                    for vr in (v for v in vr_opts if v <= rows and rows % v == 0):
                        for vc in vcols:
                            if ub_fits(vr, min(vc, i)):
                                add(
                                    Tiles(
                                        rows=rows,
                                        vec_rows=vr,
                                        vec_cols=vc,
                                        cube_m=(m, m),
                                        cube_k=(k0, k1),
                                        cube_n=(n, n),
                                    )
                                )
    return cands


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


def check_compiler() -> None:
    """SIM compiles every call with g++ (the cost model alone needs no cmake)."""
    if shutil.which("g++") is None:
        raise sim_shim.SimUnavailableError(
            "g++ is not on PATH; PyPTO's SIM mode compiles every kernel call with it (install g++)"
        )


def _temp_root() -> Path:
    """A temp folder PyPTO can use (it passes the path through a shell)."""
    root = tempfile.gettempdir()
    if not _SHELL_SAFE.fullmatch(root):
        raise sim_shim.SimUnavailableError(
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
    tmp = Path(tempfile.mkdtemp(prefix="pypto-sim-", dir=_temp_root()))
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


class _CostBackend:
    """A kernels.Backend look-alike with the cost model only (no precision tool)."""

    mode = "sim"

    def __init__(self, pypto: Any) -> None:
        self.pypto = pypto

    def jit_options(self) -> dict[str, Any]:
        return {"runtime_options": {"run_mode": self.pypto.RunMode.SIM}}

    def dtype(self, torch_dtype: torch.dtype) -> Any:
        p = self.pypto
        return {torch.bfloat16: p.DT_BF16, torch.float16: p.DT_FP16, torch.float32: p.DT_FP32}[
            torch_dtype
        ]


_COST_BACKEND: _CostBackend | None = None


def cost_backend() -> _CostBackend:
    """A backend for ``kernels.*_kernel`` factories that runs the cost model only.

    For in-process measurements of calls known to compile (the benchmark tool);
    searches go through :class:`Simulator`. Raises SimUnavailableError without pypto.
    """
    global _COST_BACKEND
    if _COST_BACKEND is None:
        check_compiler()
        _COST_BACKEND = _CostBackend(sim_shim.import_pypto())
    return _COST_BACKEND


def _build_call(
    bk: Any, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Tiles
) -> tuple[Callable[..., Any], tuple[torch.Tensor, ...]]:
    """The kernel built for these tiles and zero inputs (cycles do not depend on data)."""
    from . import kernels

    tdt = DTYPES[dtype]
    n, h = shape["rows"], shape["hidden"]
    x = torch.zeros(n, h, dtype=tdt)
    # __wrapped__: a search builds each tiling once; do not evict the model's cached kernels.
    if kernel == "rms_norm":
        fn = kernels.rms_norm_kernel.__wrapped__(bk, h, tdt, _RMS_EPS, tiles)
        return fn, (x, torch.ones(h, dtype=tdt), torch.empty_like(x))
    i = shape["inter"]
    fn = kernels.swiglu_mlp_kernel.__wrapped__(bk, h, i, tdt, tiles)
    w = torch.zeros(h, i, dtype=tdt)
    return fn, (x, w, w, torch.zeros(i, h, dtype=tdt), torch.empty_like(x))


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


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    head = text[0] if text else type(err).__name__
    return re.sub(r"\x1b\[[0-9;]*m", "", head).strip() or type(err).__name__


def _worker_main() -> int:
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
        bk = cost_backend()
    except (sim_shim.SimUnavailableError, ImportError) as err:
        results.write(json.dumps({"fatal": _one_line(err)}) + "\n")
        return 0
    results.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        tiles = tiles_from_dict(req["tiles"])
        try:
            fn, args = _build_call(bk, req["kernel"], req["shape"], req["dtype"], tiles)
            cycles, wall = measure(fn, *args)
        except Exception as err:  # any compile/simulate failure is this candidate's result
            reasons = _new_log_errors(log_dir, offsets)
            msg = reasons[0] if reasons else _one_line(err)
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
    "from pypto_kernels_gutenocr.costmodel import _worker_main; raise SystemExit(_worker_main())"
)


class Simulator:
    """Runs tilings in a child process, replaced after each failure (see the module doc).

    Use as a context manager (or call :meth:`close`): the worker's temporary folder
    (PyPTO's logs and home) is deleted on close. ``timeout_s`` bounds one candidate;
    a candidate over it is killed and reported as timed out.
    """

    def __init__(self, timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="pypto-costmodel-", dir=_temp_root()))
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
                [sys.executable, "-c", _WORKER],
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
            raise sim_shim.SimUnavailableError(reason)

    def simulate(
        self, kernel: str, shape: Mapping[str, int], dtype: str, tiles: Tiles
    ) -> CostResult:
        """One tiling's simulated time; failures come back as ``ok=False`` with a reason.

        Raises CostModelError for a bad request and SimUnavailableError when PyPTO
        cannot run here at all.
        """
        s = check_shape(kernel, shape, dtype)
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


def availability() -> str | None:
    """None when the cost model can run here, else one line saying why and the fix."""
    version = sim_shim.installed_version()
    if version is None:
        return f"pypto is not installed ({INSTALL_HINT})"
    if version != sim_shim.SUPPORTED_VERSION:
        return (
            f"the cost model path supports pypto=={sim_shim.SUPPORTED_VERSION} only, found"
            f" {version} ({INSTALL_HINT})"
        )
    try:
        check_compiler()
    except sim_shim.SimUnavailableError as err:
        return str(err)
    return None


def simulate(
    kernel: str,
    shape: Mapping[str, int],
    dtype: str = "bf16",
    tiles: Tiles | None = None,
    timeout_s: float = 600.0,
) -> CostResult:
    """Simulate one tiling (the default when ``tiles`` is None) in a one-off worker."""
    check_shape(kernel, shape, dtype)
    reason = availability()
    if reason:
        raise sim_shim.SimUnavailableError(reason)
    with Simulator(timeout_s=timeout_s) as sim:
        return sim.simulate(kernel, shape, dtype, tiles or default_tiles(kernel, dtype))


# --------------------------------------------------------------------------- plug-in face


class TunableKernel:
    """What the plug-in's ``tunables()`` hands pypto-tune for one kernel.

    pypto-tune only sees this duck type: ``name``, ``shape_names``, ``dtypes``,
    ``availability()``, ``check_shape``, ``default_tiles``, ``candidate_tiles``,
    ``simulate`` and ``session()`` (a :class:`Simulator` for many candidates), plus
    ``tiles_to_dict`` / ``tiles_label`` for reports.
    """

    dtypes = tuple(DTYPES)
    install_hint = INSTALL_HINT

    def __init__(self, name: str) -> None:
        _check_kernel(name)
        self.name = name
        self.shape_names = SHAPE_NAMES[name]

    def __repr__(self) -> str:
        return f"TunableKernel({self.name!r})"

    def availability(self) -> str | None:
        return availability()

    def check_shape(self, shape: Mapping[str, int], dtype: str = "bf16") -> dict[str, int]:
        return check_shape(self.name, shape, dtype)

    def default_tiles(self, dtype: str = "bf16") -> Tiles:
        return default_tiles(self.name, dtype)

    def candidate_tiles(self, shape: Mapping[str, int], dtype: str = "bf16") -> list[Tiles]:
        return candidate_tiles(self.name, shape, dtype)

    def simulate(
        self, shape: Mapping[str, int], dtype: str = "bf16", tiles: Tiles | None = None
    ) -> CostResult:
        return simulate(self.name, shape, dtype, tiles)

    def session(self, timeout_s: float = 600.0) -> Simulator:
        return Simulator(timeout_s=timeout_s)

    @staticmethod
    def tiles_to_dict(tiles: Tiles) -> dict[str, Any]:
        return tiles_to_dict(tiles)

    def tiles_label(self, tiles: Tiles) -> str:
        return tiles_label(tiles, self.name)


TUNABLES: dict[str, TunableKernel] = {name: TunableKernel(name) for name in SHAPE_NAMES}
