"""Register-row kernels unroll their constant loops, except loops longer than the verifier's
limit: those stay loops (GPT-2 small's training step failed to build with "unrolled loop has
4096 iterations")."""

from __future__ import annotations

from tilefuse.kernel.lower_gpu import unroll_constant_loops
from tilefuse.loop.ir import Block, LoopKind, loop
from tilefuse.loop.verify import MAX_UNROLL


def test_long_constant_loops_are_not_unrolled():
    short = loop("j", 0, 16, Block(()))
    long = loop("i", 0, 4 * MAX_UNROLL, Block((short,)))
    out = unroll_constant_loops(Block((long,)))
    (outer,) = out.stmts
    assert outer.kind is LoopKind.SERIAL
    (inner,) = outer.body.stmts
    assert inner.kind is LoopKind.UNROLLED
