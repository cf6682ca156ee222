"""Each capture of a bound method gets its own dynamo cache (the decode runner captures
``self._step``): many runners in one process must not exhaust one code object's limit."""

from __future__ import annotations

import torch

from pypto_capture import make_backend


class _Stepper:
    def __init__(self, k: float) -> None:
        self.state = torch.zeros(4)
        self.k = k

    def step(self) -> torch.Tensor:
        self.state.add_(self.k)
        return self.state * 2.0


def test_bound_methods_of_many_objects_each_compile_their_own_graph():
    backend = make_backend("compile", "cpu", freezing=False)
    objs = [_Stepper(float(k + 1)) for k in range(4)]
    # Shared code object: the third capture would be a recompile over the limit and fail
    # (fullgraph); a fresh code object per capture compiles each once.
    with torch._dynamo.config.patch(recompile_limit=2):
        steps = [backend.capture(o.step, warmup=1) for o in objs]
        for o, s in zip(objs, steps, strict=True):
            before = o.state.clone()
            out = s.replay()  # replays raise on any recompile
            assert torch.equal(o.state, before + o.k)
            assert torch.equal(out, o.state * 2.0)
