"""Precision cases: one JSON schema for every kernels package, goldens in fp32 on the CPU.

A case names its op, a seed, its inputs (shape + dtype + how to fill, or a plain
value), its outputs and tolerances. ``cpu_path`` says whether the PyPTO CPU (SIM +
verify) run uses the full model shapes or reduced ones, and why, so the test report
states which was exercised. A package ships its cases as a resource and describes how
to run each op with a :class:`PrecisionSuite`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

__all__ = [
    "CASES_RESOURCE",
    "DTYPES",
    "SCHEMA_RESOURCE",
    "Case",
    "PrecisionSuite",
    "Runner",
    "cases_from_document",
    "compare",
    "load_schema",
    "make_inputs",
]

SCHEMA_RESOURCE = "precision_schema.json"
CASES_RESOURCE = "precision_cases.json"

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "int32": torch.int32,
    "int64": torch.int64,
}

#: ``runner(kernel)`` -> a function of the case's inputs returning {output name: tensor};
#: ``kernel=False`` is the torch reference (used for the golden), True the op under test.
Runner = Callable[[bool], Callable[..., dict[str, torch.Tensor]]]


def load_schema() -> dict[str, Any]:
    """The one schema (draft 2020-12) every package's cases document follows."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_RESOURCE).read_text())


@dataclass(frozen=True)
class Case:
    id: str
    op: str
    description: str
    seed: int
    inputs: dict[str, Any]
    outputs: list[str]
    rtol: float
    atol: float
    cpu_path: dict[str, Any]

    @property
    def reduced(self) -> bool:
        return self.cpu_path.get("shapes") == "reduced"

    def input_specs(self, *, reduced: bool) -> dict[str, Any]:
        if not reduced or not self.reduced:
            return self.inputs
        return {**self.inputs, **self.cpu_path.get("inputs", {})}


def cases_from_document(doc: Mapping[str, Any]) -> list[Case]:
    return [
        Case(
            c["id"],
            c["op"],
            c["description"],
            int(c["seed"]),
            c["inputs"],
            list(c["outputs"]),
            float(c["rtol"]),
            float(c["atol"]),
            c.get("cpu_path", {"shapes": "full"}),
        )
        for c in doc["cases"]
    ]


def make_inputs(
    case: Case, *, reduced: bool = False, names: Collection[str] | None = None
) -> dict[str, Any]:
    """Deterministic inputs for a case (fresh generator seeded by the case).

    ``names``: only these inputs, each equal to its value in the full set. The inputs
    before the last named one are still drawn (the generator's stream fixes every value),
    the ones after it are not: a check of the routing logits need not build 256 experts.
    """
    gen = torch.Generator().manual_seed(case.seed)
    specs = case.input_specs(reduced=reduced)
    if names is not None:
        unknown = sorted(set(names) - set(specs))
        if unknown:
            raise KeyError(f"{case.id}: no inputs named {unknown}; it has {sorted(specs)}")
    out: dict[str, Any] = {}
    left = set(specs if names is None else names)
    for name, spec in specs.items():
        if not left:
            break
        left.discard(name)
        if "value" in spec:
            out[name] = spec["value"]
            continue
        shape = tuple(spec["shape"])
        init = spec.get("init", "normal")
        if init == "normal":
            t = torch.randn(shape, generator=gen) * spec.get("std", 1.0) + spec.get("mean", 0.0)
        elif init == "uniform":
            lo, hi = spec.get("low", -1.0), spec.get("high", 1.0)
            t = torch.rand(shape, generator=gen) * (hi - lo) + lo
        elif init == "randint":
            t = torch.randint(int(spec.get("low", 0)), int(spec["high"]), shape, generator=gen)
        else:
            raise ValueError(f"{case.id}: unknown init {init!r}")
        out[name] = t.to(DTYPES[spec["dtype"]])
    return out if names is None else {n: out[n] for n in specs if n in names}


def compare(
    case: Case, got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]
) -> dict[str, float]:
    """Max abs error per output; raises AssertionError outside rtol/atol."""
    errs = {}
    for name in case.outputs:
        g, w = got[name].float(), want[name].float()
        errs[name] = (g - w).abs().max().item() if g.numel() else 0.0

        def message(m: str, n: str = name) -> str:
            return f"{case.id}/{n}: {m}"

        torch.testing.assert_close(g, w, rtol=case.rtol, atol=case.atol, msg=message)
    return errs


class PrecisionSuite:
    """One package's cases (a resource of ``package``) and how to run each op."""

    def __init__(
        self,
        package: str,
        runners: Mapping[str, Runner],
        resource: str = CASES_RESOURCE,
    ) -> None:
        self.package = package
        self.runners = dict(runners)
        self.resource = resource

    def load_document(self) -> dict[str, Any]:
        return json.loads(resources.files(self.package).joinpath(self.resource).read_text())

    def load_cases(self) -> list[Case]:
        cases = cases_from_document(self.load_document())
        unknown = sorted({c.op for c in cases} - set(self.runners))
        if unknown:
            raise ValueError(f"{self.package}/{self.resource}: no runner for ops {unknown}")
        return cases

    def golden(self, case: Case, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """fp32 golden on the CPU: the reference on fp32 copies of the floating inputs."""
        f32 = {
            k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in inputs.items()
        }
        with torch.no_grad():
            return self.runners[case.op](False)(**f32)

    def run_kernel(self, case: Case, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The op under test through its wrapper (PyPTO when on and in envelope)."""
        with torch.no_grad():
            return self.runners[case.op](True)(**inputs)
