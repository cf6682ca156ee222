"""Precision cases: one JSON schema for every op, goldens in fp32 on the CPU.

A case names its op, a seed, its inputs (shape + dtype + how to fill, or a
plain value), its outputs and tolerances. ``cpu_path`` says whether the PyPTO
CPU (SIM + verify) run uses the full model shapes or reduced ones, and why, so
the test report states which was exercised.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from . import reference
from .ops import PACKED

CASES_RESOURCE = "precision_cases.json"
SCHEMA_RESOURCE = "precision_schema.json"

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_document() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(CASES_RESOURCE).read_text())


def load_schema() -> dict[str, Any]:
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


def load_cases() -> list[Case]:
    doc = load_document()
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


def make_inputs(case: Case, *, reduced: bool = False) -> dict[str, Any]:
    """Deterministic inputs for a case (fresh generator seeded by the case)."""
    gen = torch.Generator().manual_seed(case.seed)
    out: dict[str, Any] = {}
    for name, spec in case.input_specs(reduced=reduced).items():
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
        else:
            raise ValueError(f"{case.id}: unknown init {init!r}")
        out[name] = t.to(_DTYPES[spec["dtype"]])
    return out


def _rms(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    from .ops import rms_norm_wrapper

    def run(hidden_states, weight, eps):
        if kernel:
            return {"y": rms_norm_wrapper(hidden_states, weight, eps)}
        return {"y": reference.rms_norm_reference(hidden_states, weight, eps)}

    return run


def _mrope(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    from .ops import mrope_pto_correct

    def run(q, k, cos, sin, mrope_section):
        fn = mrope_pto_correct if kernel else reference.mrope_reference
        q_out, k_out = fn(q, k, cos, sin, mrope_section)
        return {"q_out": q_out, "k_out": k_out}

    return run


class _MLP(torch.nn.Module):
    """An HF-shaped gated MLP around case weights (nn.Linear stores [out, in])."""

    def __init__(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> None:
        super().__init__()
        h, i = w_gate.shape
        self.gate_proj = torch.nn.Linear(h, i, bias=False, dtype=w_gate.dtype)
        self.up_proj = torch.nn.Linear(h, i, bias=False, dtype=w_gate.dtype)
        self.down_proj = torch.nn.Linear(i, h, bias=False, dtype=w_gate.dtype)
        with torch.no_grad():
            self.gate_proj.weight.copy_(w_gate.t())
            self.up_proj.weight.copy_(w_up.t())
            self.down_proj.weight.copy_(w_down.t())
        self.act_fn = torch.nn.SiLU()


def _swiglu(kernel: bool) -> Callable[..., dict[str, torch.Tensor]]:
    from .ops import swiglu_mlp_wrapper

    def run(x, w_gate, w_up, w_down):
        if kernel:
            mlp = _MLP(w_gate, w_up, w_down)
            try:
                return {"y": swiglu_mlp_wrapper(mlp, x)}
            finally:
                PACKED.clear()
        return {"y": reference.swiglu_mlp_reference(x, w_gate, w_up, w_down)}

    return run


_RUNNERS = {"rms_norm": _rms, "mrope": _mrope, "swiglu_mlp": _swiglu}


def golden(case: Case, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """fp32 golden on the CPU: the reference on fp32 copies of the inputs."""
    f32 = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with torch.no_grad():
        return _RUNNERS[case.op](False)(**f32)


def run_kernel(case: Case, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The op under test through its wrapper (PyPTO when on and in envelope)."""
    with torch.no_grad():
        return _RUNNERS[case.op](True)(**inputs)


def compare(
    case: Case, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Max abs error per output; raises AssertionError outside rtol/atol."""
    errs = {}
    for name in case.outputs:
        g, w = got[name].float(), want[name].float()
        errs[name] = (g - w).abs().max().item()

        def message(m: str, n: str = name) -> str:
            return f"{case.id}/{n}: {m}"

        torch.testing.assert_close(g, w, rtol=case.rtol, atol=case.atol, msg=message)
    return errs
