"""Batch-size policy: which switches to turn on for a batch, and why.

The default is the seed's rule set, kept as-is but labelled for what it is: a
rule nobody has measured (the seed's own numbers did not support its MRoPE
rule). Measured data replaces it through a JSON file:

    {"schema_version": 1,
     "rules": [{"max_batch": 4, "switches": {"swiglu_mlp": true, "mrope": true},
                "reason": "..."},
               {"max_batch": null, "switches": {"swiglu_mlp": true}, "reason": "..."}]}

Rules are tried in order; the first whose ``max_batch`` is null or >= the batch
wins. Ops a rule does not name are off.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .switches import OPS, SwitchError, _check, pto_switches

SCHEMA_VERSION = 1


class PolicyError(ValueError):
    """A policy file that cannot be used (message names the file and the problem)."""


@dataclass(frozen=True)
class Decision:
    batch: int
    switches: dict[str, bool]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "switches": dict(self.switches), "reason": self.reason}


@dataclass(frozen=True)
class Rule:
    max_batch: int | None
    switches: dict[str, bool]
    reason: str


SEED_RULES = (
    Rule(
        4,
        {"swiglu_mlp": True, "mrope": True, "rms_norm": False},
        "seed policy (unmeasured): SwiGLU for all batches, MRoPE for batch <= 4, RMSNorm off",
    ),
    Rule(
        None,
        {"swiglu_mlp": True, "mrope": False, "rms_norm": False},
        "seed policy (unmeasured): SwiGLU for all batches, MRoPE off above batch 4, RMSNorm off",
    ),
)


class DynamicPTOConfig:
    """Maps a batch size to a switch set with the reason for it."""

    def __init__(self, rules: tuple[Rule, ...] = SEED_RULES, source: str = "seed") -> None:
        if not rules or rules[-1].max_batch is not None:
            raise PolicyError(
                f"{source}: the last rule must have max_batch null (covers any batch)"
            )
        self.rules = rules
        self.source = source

    @classmethod
    def from_json(cls, path: str | Path) -> DynamicPTOConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise PolicyError(f"{path}: cannot read policy JSON ({err})") from err
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise PolicyError(f"{path}: expected an object with schema_version {SCHEMA_VERSION}")
        rules = []
        for i, raw in enumerate(data.get("rules") or []):
            try:
                mb = raw.get("max_batch")
                if mb is not None and (not isinstance(mb, int) or mb < 1):
                    raise PolicyError("max_batch must be a positive integer or null")
                sw = {_check(k): bool(v) for k, v in (raw.get("switches") or {}).items()}
                rules.append(Rule(mb, {op: sw.get(op, False) for op in OPS}, str(raw["reason"])))
            except (AttributeError, KeyError, SwitchError, PolicyError) as err:
                raise PolicyError(f"{path}: rule {i}: {err}") from err
        return cls(tuple(rules), source=str(path))

    def for_batch(self, batch: int) -> Decision:
        if batch < 1:
            raise PolicyError(f"batch must be >= 1, got {batch}")
        for rule in self.rules:
            if rule.max_batch is None or batch <= rule.max_batch:
                return Decision(
                    batch, {op: rule.switches.get(op, False) for op in OPS}, rule.reason
                )
        raise AssertionError("unreachable: last rule covers any batch")

    @contextlib.contextmanager
    def apply(self, batch: int) -> Iterator[Decision]:
        """Switches set for ``batch`` inside the block."""
        decision = self.for_batch(batch)
        with pto_switches(decision.switches):
            yield decision

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "rules": [
                {"max_batch": r.max_batch, "switches": dict(r.switches), "reason": r.reason}
                for r in self.rules
            ],
        }
