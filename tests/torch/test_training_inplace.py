"""Optimizer-step write-backs done in place by the kernels (frontend/torch/inplace.py).

An update whose kernel reads the state only at the element it writes is written straight into
the state tensor (no ``copy_`` left in torch); one that reads other elements (a flip) or reads
the state in a later kernel keeps torch's copy, and both give eager's values."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import fx, nn

import tilefuse.torch as tt
from tilefuse.frontend.torch.backend import Options
from tilefuse.frontend.torch.inplace import StepGraph


def _run(fn, *shapes, dtype=torch.float32):
    g = torch.Generator().manual_seed(len(shapes))
    args = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    want = [a.clone() for a in args]
    want_out = fn(*want)
    step = StepGraph(fx.symbolic_trace(fn), {}, Options())
    pointers = [a.data_ptr() for a in args]
    for _ in range(2):   # the second call runs the rewritten graph
        got = [a.clone() for a in args]
        out = step(*got)
        for a, b in zip([*got, *out], [*want, *want_out]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    step(*args)
    assert [a.data_ptr() for a in args] == pointers
    return step.write_backs


def _elementwise(p, m, g):
    m.mul_(0.9).add_(g, alpha=0.1)
    p.add_(m * -0.01 + torch.tanh(p))
    return ()


def _flipped(p, g):
    p.mul_(0.5).add_(p.flip(0) + g)
    return ()


def _old_value_reduced(p, g):
    s = (p * p).sum(0)   # reads the old p: correct whichever order the kernels run in
    p.mul_(2.0).add_(g)
    return (s,)


def test_elementwise_update_written_in_place() -> None:
    assert _run(_elementwise, (37, 5), (37, 5), (37, 5)) == [(2, 0)]


def test_flip_keeps_the_copy() -> None:
    assert _run(_flipped, (11, 3), (11, 3)) == [(0, 1)]


def test_old_value_read_by_a_reduction() -> None:
    assert _run(_old_value_reduced, (23, 9), (23, 9))[0][0] in (0, 1)


def test_odd_sizes_and_f64() -> None:
    assert _run(_elementwise, (1001,), (1001,), (1001,), dtype=torch.float64) == [(2, 0)]


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-3)],
    ids=["adamw", "sgd-momentum"])
def test_compiled_optimizer_updates_in_place(make, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(13, 29), nn.Tanh(), nn.Linear(29, 7))
    twin = copy.deepcopy(model)
    opt, opt2 = make(model.parameters()), make(twin.parameters())
    made = []

    def backend(gm, example_inputs):
        made.append(tt.backend(gm, example_inputs))
        return made[-1]

    step2 = torch.compile(opt2.step, backend=backend)
    caplog.set_level(logging.WARNING, logger="tilefuse.fallback")
    pointers = [p.data_ptr() for p in twin.parameters()]
    for i in range(5):
        x = torch.randn(3, 13)
        for m, o in ((model, opt), (twin, opt2)):
            o.zero_grad()
            m(x).square().mean().backward()
        opt.step()
        step2()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=f"step {i}")
    assert [p.data_ptr() for p in twin.parameters()] == pointers
    state = [t for s in opt2.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    counts = [c.graph.write_backs for c in made if isinstance(getattr(c, "graph", None),
                                                             StepGraph)]
    # every parameter, moment and step count is written by the kernels; no copy is left
    assert counts and all(kept == 0 and done >= len(state) for c in counts
                          for done, kept in c), counts
    assert not [r for r in caplog.records if r.name.startswith("tilefuse")
                and r.levelno >= logging.WARNING]
