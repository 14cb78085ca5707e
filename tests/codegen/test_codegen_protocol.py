"""The scalar-op protocol is the one list of value ops: every op has a method, and every
implementation defines every method."""

from __future__ import annotations

import pytest

from tilefuse.codegen.llvm_ops import LLVMOps
from tilefuse.codegen.scalar_ops import ScalarOps, protocol_methods
from tilefuse.loop.interp import NumpyOps
from tilefuse.loop.ir import VALUE_OPS, XOp


def test_every_value_op_has_a_protocol_method():
    methods = protocol_methods()
    assert {op.value for op in VALUE_OPS} <= methods
    assert methods - {op.value for op in VALUE_OPS} == set()


def test_structural_ops_are_not_value_ops():
    assert {XOp.VAR, XOp.THREAD_ID, XOp.LOAD, XOp.LOCAL_LOAD}.isdisjoint(VALUE_OPS)


@pytest.mark.parametrize("implementation", [NumpyOps, LLVMOps])
def test_implementation_defines_every_method(implementation):
    missing = [m for m in sorted(protocol_methods())
               if getattr(implementation, m, None) is getattr(ScalarOps, m, None)
               or not callable(getattr(implementation, m, None))]
    assert not missing, f"{implementation.__name__} lacks {missing}"
