"""The op table: every op the other components build against exists, with the agreed traits,
kinds and attribute schemas."""

from __future__ import annotations

import pytest

import tilefuse.ops as ops_pkg
from tilefuse.ops import OPS, OpKind, Trait, get_op

UNARY = {"neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "tanh",
         "sigmoid", "erf", "relu", "gelu", "silu", "softplus", "sin", "cos", "floor", "ceil",
         "round", "sign", "logical_not", "isnan"}
BINARY = {"add", "sub", "mul", "div", "floordiv", "mod", "pow", "maximum", "minimum", "eq", "ne",
          "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}
OTHER_ELEMENTWISE = {"where", "cast", "clip"}
REDUCTIONS = {"sum", "mean", "max", "min", "prod", "var", "argmax", "argmin"}
COMPOSITES = {"softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm"}
CONTRACTIONS = {"matmul", "einsum"}
MOVEMENT = {"reshape", "transpose", "broadcast_to", "expand_dims", "squeeze", "slice", "concat",
            "split", "stack", "pad", "take", "take_along_axis"}
SOURCES = {"constant", "arange", "full"}
NN = {"conv2d", "max_pool2d", "avg_pool2d"}
ALL = (UNARY | BINARY | OTHER_ELEMENTWISE | REDUCTIONS | COMPOSITES | CONTRACTIONS | MOVEMENT
       | SOURCES | NN)


def test_every_agreed_op_is_registered() -> None:
    missing = ALL - set(OPS)
    assert not missing, f"missing ops: {sorted(missing)}"
    for name in ALL:
        assert get_op(name).name == name


def test_kinds() -> None:
    expected = {**dict.fromkeys(UNARY | BINARY | OTHER_ELEMENTWISE, OpKind.ELEMENTWISE),
                **dict.fromkeys(REDUCTIONS | COMPOSITES | {"max_pool2d", "avg_pool2d"},
                                OpKind.REDUCTION),
                **dict.fromkeys(CONTRACTIONS | {"conv2d"}, OpKind.CONTRACTION),
                **dict.fromkeys(MOVEMENT, OpKind.MOVEMENT),
                **dict.fromkeys(SOURCES, OpKind.SOURCE)}
    wrong = {n: OPS[n].kind for n, k in expected.items() if OPS[n].kind is not k}
    assert not wrong


def test_traits() -> None:
    def having(trait: Trait) -> set[str]:
        return {n for n, op in OPS.items() if op.has(trait)}

    ca = {"add", "mul", "maximum", "minimum", "logical_and", "logical_or", "logical_xor"}
    assert having(Trait.ASSOCIATIVE) == ca
    assert having(Trait.COMMUTATIVE) == ca | {"eq", "ne"}
    assert having(Trait.IDEMPOTENT) == {"abs", "relu", "floor", "ceil", "round"}
    assert having(Trait.INVOLUTION) == {"neg", "logical_not"}
    assert having(Trait.COMPOSITE) == COMPOSITES | {"einsum"}  # einsum: matmuls (issue 28)
    assert having(Trait.MULTI_OUTPUT) == {"split", "topk", "onnx_node", "dynamic_quantize_u8"}
    assert all(OPS[n].decompose is not None for n in COMPOSITES | {"einsum"})


VARIADIC = {"concat", "stack", "einsum", "conv2d"}
TWO_INPUTS = BINARY | {"matmul", "rms_norm", "take", "take_along_axis"}
THREE_INPUTS = {"where", "layer_norm", "group_norm"}


@pytest.mark.parametrize("name", sorted(ALL))
def test_arity_and_schema(name: str) -> None:
    op = OPS[name]
    if name in VARIADIC:
        assert op.arity is None
    elif name in SOURCES:
        assert op.arity == 0
    else:
        expected = 2 if name in TWO_INPUTS else 3 if name in THREE_INPUTS else 1
        assert op.arity == expected
    assert op.accepts, name
    assert len({a.name for a in op.attrs}) == len(op.attrs)


def test_modules_are_listed_once() -> None:
    names = [m.__name__ for m in ops_pkg._MODULES]
    assert len(names) == len(set(names))
    assert sum(len(m.DEFINITIONS) for m in ops_pkg._MODULES) == len(OPS)
