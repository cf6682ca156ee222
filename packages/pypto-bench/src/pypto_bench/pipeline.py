"""Old home of ``--placement pipeline`` (kept so every existing import keeps working): the
code lives in :mod:`pypto_bench.multi.pipeline`, the request's rules in
:mod:`pypto_bench.config` (``validate_placement``)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .config import PLACEMENTS, Placement, validate_placement
from .multi.pipeline import (
    MAX_PIPELINE_LAYERS,
    declared_layers,
    decoder_layers,
    run_pipeline,
    stage_device_map,
)

if TYPE_CHECKING:
    from .config import BenchConfig

__all__ = [
    "MAX_PIPELINE_LAYERS",
    "PLACEMENTS",
    "declared_layers",
    "decoder_layers",
    "run_pipeline",
    "stage_device_map",
    "validate_pipeline",
]


def validate_pipeline(config: BenchConfig) -> None:
    """What ``--placement pipeline`` measures (prefill, the eager arm, one batch, N >= 2):
    ``validate_placement``'s rules for ``config`` placed by pipeline (kept for old callers;
    ``BenchConfig.validate`` runs them)."""
    validate_placement(replace(config, placement=Placement.PIPELINE.value))
