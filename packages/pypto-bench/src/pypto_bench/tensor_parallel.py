"""Old home of the in-repo families' tensor parallelism (kept so every existing import keeps
working): the code lives in :mod:`pypto_bench.multi.tensor`."""

from __future__ import annotations

from .multi.tensor import (
    STYLES,
    Rule,
    ShardReport,
    check_plan,
    parse_plan,
    plan_of,
    shard_model,
)

__all__ = ["STYLES", "Rule", "ShardReport", "check_plan", "parse_plan", "plan_of", "shard_model"]
