"""Tile-shape search over the PyPTO cost model (``pypto-tune tile-search``).

Kernel packages expose tunable kernels through their ``pypto.kernels`` plug-in: an
optional ``tunables()`` method returns ``{kernel name: object}`` where each object has
``shape_names``, ``dtypes``, ``availability()``, ``check_shape(shape, dtype)``,
``default_tiles(dtype)``, ``candidate_tiles(shape, dtype)`` (the default first),
``session(timeout_s)`` (a context manager whose ``simulate(kernel, shape, dtype,
tiles)`` returns a result with ``ok``, ``sim_us``, ``cycles``, ``wall_s``, ``error``),
``tiles_to_dict`` and ``tiles_label``. pypto-tune names no kernel package: it finds
them with :func:`pypto_bench.plugins.discover_plugins`.

The search: when the candidate space fits the budget every candidate is simulated
(``exhaustive``); otherwise ``coordinate-descent`` starts at the kernel's default
tiling and, one tile field at a time (loop rows, vector rows, vector columns, cube m,
k, n), simulates every legal value of that field with the others fixed, moves to the
best, and repeats passes until a pass improves nothing or the budget is spent. Why not
brute force: the SwiGLU space at GutenOCR's shape has ~1000 legal tilings at 5-15 s
of simulation each (hours), while the large effects seen in the cost model (the cube
m and k tiles: 1.3-3.4x at 16 x 2048 x 11008) show up one field at a time, so 24
descent steps from the default take minutes. Descent can miss a gain that needs two
fields changed together; raise ``budget`` for more passes.

The cost model is a relative signal: it ranks tilings of one kernel at one shape; it
is not an NPU time, and it says nothing about numerics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import BadInputError, EnvironmentMissingError, SearchFailedError

log = logging.getLogger(__name__)

SCHEMA_NAME = "pypto-tune.tile-search"
SCHEMA_VERSION = "1.0"
#: Candidates simulated when the caller sets no budget.
DEFAULT_BUDGET = 24
#: A candidate may run this many times the default's simulator wall time (at least
#: :data:`MIN_TIMEOUT_S`) before it is stopped: poor tilings simulate for minutes.
TIMEOUT_FACTOR = 10.0
MIN_TIMEOUT_S = 60.0
#: The default itself gets this long.
DEFAULT_TIMEOUT_S = 600.0
NOTE = (
    "cost model: a relative signal (PyPTO SIM, simulated 910B-class cycles / 1800 = us) that"
    " ranks tilings at this shape; not a measured NPU time and no numerics check; confirm the"
    " winner on hardware"
)
INSTALL_KERNELS = "pip install 'pypto-tune[kernels]'"

#: progress(done, total, entry): called after each simulated candidate.
Progress = Callable[[int, int, dict[str, Any]], None]


@dataclass
class TileSearchResult:
    """Every simulated candidate, the default, the best, and how the search went."""

    kernel: str
    shape: dict[str, int]
    dtype: str
    method: str
    space_size: int
    budget: int
    candidates: list[dict[str, Any]]
    default: dict[str, Any] | None
    best: dict[str, Any] | None
    wall_s: float
    note: str = NOTE
    warnings: list[str] = field(default_factory=list)

    @property
    def default_us(self) -> float | None:
        return self.default["sim_us"] if self.default and self.default["ok"] else None

    @property
    def best_us(self) -> float | None:
        return self.best["sim_us"] if self.best else None

    @property
    def speedup(self) -> float | None:
        """Default time over best time (>1: the best is faster); None without a default."""
        d, b = self.default_us, self.best_us
        return d / b if d and b else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "kernel": self.kernel,
            "shape": dict(self.shape),
            "dtype": self.dtype,
            "method": self.method,
            "space_size": self.space_size,
            "budget": self.budget,
            "evaluated": len(self.candidates),
            "default": self.default,
            "default_us": self.default_us,
            "best": self.best,
            "best_us": self.best_us,
            "speedup": self.speedup,
            "wall_s": round(self.wall_s, 3),
            "note": self.note,
            "warnings": list(self.warnings),
            "candidates": list(self.candidates),
        }


def discover_tunables() -> dict[str, Any]:
    """``{kernel: tunable}`` from every installed ``pypto.kernels`` plug-in with ``tunables()``."""
    from pypto_bench import PluginError, discover_plugins

    try:
        plugins = discover_plugins()
    except PluginError as err:
        raise EnvironmentMissingError(f"{err} (reinstall or remove that kernel package)") from err
    found: dict[str, Any] = {}
    for plugin in plugins:
        get = getattr(plugin, "tunables", None)
        if not callable(get):
            continue
        for name, tunable in get().items():
            if name in found:
                log.warning(
                    "kernel %s is tunable in two plug-ins; using the first (%s)",
                    name,
                    getattr(plugin, "name", plugin),
                )
                continue
            found[name] = tunable
    return found


def _entry(tunable: Any, res: Any, is_default: bool) -> dict[str, Any]:
    return {
        "tiles": tunable.tiles_to_dict(res.tiles),
        "label": tunable.tiles_label(res.tiles),
        "ok": bool(res.ok),
        "sim_us": res.sim_us,
        "cycles": res.cycles,
        "wall_s": round(float(res.wall_s), 3),
        "error": res.error,
        "is_default": is_default,
    }


def _check_budget(budget: int | None) -> int:
    if budget is None:
        return DEFAULT_BUDGET
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise BadInputError(
            f"budget {budget!r} must be a positive integer (candidates to simulate)"
        )
    return budget


def _axes(tunable: Any, candidates: list[Any]) -> list[str]:
    """Tile fields that vary across the candidates, in the tiles' field order."""
    dicts = [tunable.tiles_to_dict(c) for c in candidates]
    names = list(dicts[0]) if dicts else []
    return [n for n in names if len({repr(d[n]) for d in dicts}) > 1]


def _neighbours(tunable: Any, candidates: list[Any], current: Any, axis: str) -> list[Any]:
    """Candidates equal to ``current`` except in ``axis``."""
    cur = tunable.tiles_to_dict(current)
    out = []
    for c in candidates:
        d = tunable.tiles_to_dict(c)
        if d[axis] != cur[axis] and all(d[k] == cur[k] for k in cur if k != axis):
            out.append(c)
    return out


def tile_search(
    kernel: str,
    shape: dict[str, int],
    dtype: str = "bf16",
    budget: int | None = None,
    progress: Progress | None = None,
    *,
    timeout_s: float | None = None,
    tunables: dict[str, Any] | None = None,
) -> TileSearchResult:
    """Search tile shapes of ``kernel`` at ``shape`` over the PyPTO cost model.

    ``budget`` caps the candidates simulated (default :data:`DEFAULT_BUDGET`, the
    default tiling included); ``timeout_s`` bounds one candidate (default: the
    default's wall time x :data:`TIMEOUT_FACTOR`, at least :data:`MIN_TIMEOUT_S`).
    ``tunables`` replaces plug-in discovery (tests, notebooks). Raises BadInputError
    (unknown kernel, bad shape/dtype/budget), EnvironmentMissingError (no PyPTO, no
    compiler, no tunable kernels installed) and SearchFailedError (nothing ran).
    """
    t0 = time.perf_counter()
    n_budget = _check_budget(budget)
    if timeout_s is not None and not timeout_s > 0:
        raise BadInputError(f"timeout {timeout_s!r} must be a positive number of seconds")
    found = discover_tunables() if tunables is None else tunables
    if not found:
        raise EnvironmentMissingError(f"no tunable kernels are installed ({INSTALL_KERNELS})")
    if kernel not in found:
        raise BadInputError(
            f"unknown kernel {kernel!r}; tunable kernels: {', '.join(sorted(found))}"
        )
    tunable = found[kernel]
    dtypes = tuple(getattr(tunable, "dtypes", ()))
    if dtypes and dtype not in dtypes:
        raise BadInputError(
            f"dtype {dtype!r} is not tunable for {kernel}; use one of {list(dtypes)}"
        )
    try:
        clean = tunable.check_shape(shape, dtype)
        candidates = list(tunable.candidate_tiles(clean, dtype))
    except ValueError as err:
        raise BadInputError(str(err)) from err
    reason = tunable.availability()
    if reason:
        raise EnvironmentMissingError(f"the PyPTO cost model cannot run here: {reason}")
    default = tunable.default_tiles(dtype)
    if default not in candidates:
        candidates.insert(0, default)
    exhaustive = len(candidates) <= n_budget
    total = len(candidates) if exhaustive else n_budget
    results: dict[Any, dict[str, Any]] = {}
    order: list[Any] = []
    warnings: list[str] = []

    try:
        with tunable.session(timeout_s=timeout_s or DEFAULT_TIMEOUT_S) as sim:

            def run(tiles: Any) -> dict[str, Any]:
                if tiles in results:
                    return results[tiles]
                res = sim.simulate(kernel, clean, dtype, tiles)
                entry = _entry(tunable, res, tiles == default)
                results[tiles] = entry
                order.append(tiles)
                if entry["ok"]:
                    log.debug("%s %s: %.1f us", kernel, entry["label"], entry["sim_us"])
                else:
                    log.debug("%s %s: failed: %s", kernel, entry["label"], entry["error"])
                if progress is not None:
                    progress(len(order), total, entry)
                return entry

            first = run(default)
            if timeout_s is None and first["ok"]:
                sim.timeout_s = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * first["wall_s"])
            if not first["ok"]:
                warnings.append(f"the default tiling failed in the cost model: {first['error']}")
            if exhaustive:
                for tiles in candidates:
                    run(tiles)
            else:
                _descend(tunable, candidates, default, run, results, n_budget)
    except RuntimeError as err:  # the simulator itself could not start
        raise EnvironmentMissingError(f"the PyPTO cost model cannot run here: {err}") from err

    entries = [results[t] for t in order]
    ok = [e for e in entries if e["ok"]]
    if not ok:
        raise SearchFailedError(
            f"no candidate tiling of {kernel} ran in the cost model ({len(entries)} tried;"
            f" first error: {entries[0]['error']}); raise --timeout if they timed out,"
            " else try another shape"
        )
    best = min(ok, key=lambda e: e["sim_us"])
    return TileSearchResult(
        kernel=kernel,
        shape=clean,
        dtype=dtype,
        method="exhaustive" if exhaustive else "coordinate-descent",
        space_size=len(candidates),
        budget=n_budget,
        candidates=entries,
        default=results.get(default),
        best=best,
        wall_s=time.perf_counter() - t0,
        warnings=warnings,
    )


def _descend(
    tunable: Any,
    candidates: list[Any],
    start: Any,
    run: Callable[[Any], dict[str, Any]],
    results: dict[Any, dict[str, Any]],
    budget: int,
) -> None:
    """Coordinate descent from ``start`` (see the module doc) until converged or out of budget."""

    def left() -> int:
        return budget - len(results)

    current = start
    if not results[start]["ok"]:
        # Start from the first candidate that runs instead.
        for c in candidates:
            if left() <= 0:
                return
            if run(c)["ok"]:
                current = c
                break
        else:
            return
    axes = _axes(tunable, candidates)
    improved = True
    while improved and left() > 0:
        improved = False
        if not any(_neighbours(tunable, candidates, current, a) for a in axes):
            # An isolated start (no candidate differs from it in one field only): try the
            # candidates closest to it, then descend from the best of them.
            cur = tunable.tiles_to_dict(current)
            near = sorted(
                (c for c in candidates if c not in results),
                key=lambda c: sum(v != cur[k] for k, v in tunable.tiles_to_dict(c).items()),
            )
            for c in near[: max(0, min(left(), len(axes)))]:
                run(c)
            ok = [c for c in results if results[c]["ok"]]
            best_c = min(ok, key=lambda c: results[c]["sim_us"])
            if best_c == current:
                return
            current = best_c
            improved = True
            continue
        for axis in axes:
            for c in _neighbours(tunable, candidates, current, axis):
                if left() <= 0:
                    break
                run(c)
            tried = [
                current,
                *[c for c in _neighbours(tunable, candidates, current, axis) if c in results],
            ]
            ok = [c for c in tried if results[c]["ok"]]
            best = min(ok, key=lambda c: results[c]["sim_us"])
            if results[best]["sim_us"] < results[current]["sim_us"]:
                current = best
                improved = True
            if left() <= 0:
                return


def tiles_as_kwargs(entry: dict[str, Any]) -> dict[str, Any]:
    """A result entry's tiles as keyword arguments (``Tiles(**kwargs)``) for the kernel package."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in entry["tiles"].items()}


__all__ = [
    "DEFAULT_BUDGET",
    "NOTE",
    "TileSearchResult",
    "discover_tunables",
    "tile_search",
    "tiles_as_kwargs",
]
