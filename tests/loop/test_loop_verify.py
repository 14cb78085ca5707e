"""The loop-IR verifier: every invariant it guards raises a VerifyError naming the problem."""

from __future__ import annotations

import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import VerifyError
from tilefuse.loop import (
    BufferParam,
    Expr,
    If,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    LType,
    Prefetch,
    XOp,
    binary,
    block,
    broadcast,
    cast,
    const,
    loop,
    reduce,
    select,
    unary,
    var,
    verify,
)

F32 = DType.f32
X = BufferParam("X", F32, readonly=True)
Y = BufferParam("Y", F32)
i, n = var("i"), var("n")


def kernel(*body, buffers=(X, Y), scalars=("n",)) -> LoopFunction:
    return LoopFunction("k", tuple(buffers), tuple(scalars), block(*body))


def test_a_well_formed_kernel_passes():
    acc = Local("acc", LType(F32, 8))
    verify(kernel(loop("i", 0, n, [acc, Prefetch("X", i + 64), acc.store(0, X.load(i, 8)),
                                   Y.store(i, reduce(XOp.REDUCE_ADD, acc.load(0)))],
                       kind=LoopKind.PARALLEL)))


BAD = {
    "used before it is defined": kernel(Y.store(0, X.load(var("j")))),
    "outside its scope": kernel(loop("i", 0, n, [Let("t", X.load(i))]), Y.store(0, var(
        "t", LType(F32)))),
    "readonly buffer X": kernel(X.store(0, const(1.0, F32))),
    "unknown buffer": kernel(Y.store(0, Expr(XOp.LOAD, LType(F32), (const(0),), "Z"))),
    "prefetch of unknown buffer Z": kernel(Prefetch("Z", const(0))),
    "prefetch index must be i64": kernel(Prefetch("X", const(0, DType.i32))),
    "prefetch locality 4 is not in 0..3": kernel(Prefetch("X", const(0), locality=4)),
    "defined more than once": kernel(loop("i", 0, n, [loop("i", 0, n, [])])),
    "do not match result": kernel(Y.store(0, X.load(0, 8) + X.load(0))),
    "stores f32x8 into local": kernel(Local("a", LType(F32, 4)),
                                      Local("a", LType(F32, 4)).store(0, X.load(0, 8))),
    "stores i64 into f32 buffer": kernel(Y.store(0, const(1))),
    "index must be i64": kernel(Y.store(0, X.load(const(1, DType.i32)))),
    "store index must be i64": kernel(Y.store(const(0, DType.i32), X.load(0))),
    "needs a float type": kernel(Let("e", unary(XOp.EXP, const(1)))),
    "needs an integer type": kernel(Let("m", X.load(0) % X.load(1))),
    "not defined on bool": kernel(Let("b", const(True, DType.bool) + const(True, DType.bool))),
    "nested parallel": kernel(loop("i", 0, n, [loop("j", 0, n, [], kind=LoopKind.PARALLEL)],
                                   kind=LoopKind.PARALLEL)),
    "declared outside the parallel loop": kernel(
        Local("acc", LType(F32)),
        loop("i", 0, n, [Local("acc", LType(F32)).store(0, X.load(i))],
             kind=LoopKind.PARALLEL)),
    "constant bounds": kernel(loop("i", 0, n, [], kind=LoopKind.UNROLLED)),
    "max 1024": kernel(loop("i", 0, 5000, [], kind=LoopKind.UNROLLED)),
    "steps by its vector width": kernel(loop("i", 0, n, [], kind=LoopKind.VECTORIZED)),
    "positive int": kernel(loop("i", 0, n, [], step=0)),
    "loop stop must be i64": kernel(loop("i", 0, X.load(0), [])),
    "if condition must be bool": kernel(If(const(1), Y.store(0, X.load(0)))),
    "out of range for local": kernel(Local("a", LType(F32), 2),
                                     Local("a", LType(F32), 2).store(2, X.load(0))),
    "condition is bool, values are f32x4": kernel(Let("s", select(
        binary(XOp.LT, X.load(0), X.load(1)), X.load(0, 4), X.load(4, 4)))),
    "broadcasts f32x4": kernel(Let("b", Expr(XOp.BROADCAST, LType(F32, 8), (X.load(0, 4),)))),
    "changes lanes": kernel(Let("c", Expr(XOp.CAST, LType(DType.f64, 8), (X.load(0, 4),)))),
    "reduces f32x8 to f32x2": kernel(Let("r", Expr(XOp.REDUCE_MAX, LType(F32, 2),
                                                   (X.load(0, 8),)))),
    "takes 2 operands": kernel(Let("a", Expr(XOp.ADD, LType(F32), (X.load(0),)))),
    "does not fit i8": kernel(Let("c", const(300, DType.i8))),
    "not an identifier": kernel(Let("not a name", const(1))),
    "needs an integer or bool type": kernel(Let("x", Expr(XOp.AND, LType(F32),
                                                          (X.load(0), X.load(1))))),
    "i is i64, used as f32": kernel(loop("i", 0, n, [Y.store(0, var("i", LType(F32)))])),
    "must be a power of two": kernel(buffers=(BufferParam("X", F32, align=6), Y)),
}


@pytest.mark.parametrize("message", list(BAD))
def test_invalid_ir_is_rejected(message):
    with pytest.raises(VerifyError, match=message.replace("(", r"\(")):
        verify(BAD[message])


def test_errors_name_the_statement():
    with pytest.raises(VerifyError, match=r"in `X\[0\] = 1.0`"):
        verify(kernel(X.store(0, const(1.0, F32))))


def test_locals_are_scoped_to_their_block():
    acc = Local("acc", LType(F32))
    fn = kernel(loop("i", 0, n, [acc, acc.store(0, X.load(i))]), Y.store(0, acc.load(0)))
    with pytest.raises(VerifyError, match="outside its scope"):
        verify(fn)


def test_non_expressions_are_rejected():
    with pytest.raises(VerifyError, match="not an expression"):
        verify(kernel(Y.store(0, 1.0)))  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="bad type"):
        verify(kernel(Let("t", Expr(XOp.CONST, LType(F32, 0), (), 1.0))))


def test_casts_and_broadcasts_that_fit_pass():
    verify(kernel(Let("c", cast(X.load(0, 4), DType.i8)),
                  Let("b", broadcast(X.load(0), 16)),
                  Let("u", cast(const(3), DType.u8))))
