"""Tile shapes of one kernel build, and their JSON form (search records, reports).

Every PyPTO kernel here loops over rows and sets vector and cube tile shapes, so one
dataclass serves them all; a kernel ignores the fields it has no use for (RMSNorm has
no cube tiles).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CostModelError", "Tiles", "TilesError", "tiles_from_dict", "tiles_to_dict"]


class CostModelError(ValueError):
    """A request the cost model cannot take (kernel, dtype, shape, tiles); one line with the fix."""


class TilesError(CostModelError):
    """Tile fields that do not exist (one line naming them and the known ones)."""


@dataclass(frozen=True)
class Tiles:
    """Tile shapes for one kernel build (rows per loop step, vector and cube tiles)."""

    rows: int = 8
    vec_rows: int = 4
    vec_cols: int = 2048
    cube_m: tuple[int, int] = (64, 64)
    cube_k: tuple[int, int] = (256, 256)
    cube_n: tuple[int, int] = (256, 256)


def tiles_to_dict(tiles: Any) -> dict[str, Any]:
    """JSON-ready tiles of any tiles dataclass (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(tiles).items()}


def tiles_from_dict(data: Mapping[str, Any], cls: type = Tiles) -> Any:
    """The inverse of :func:`tiles_to_dict`; unknown keys are refused."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise TilesError(f"unknown tile fields {unknown}; known: {sorted(names)}")
    kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return cls(**kwargs)
