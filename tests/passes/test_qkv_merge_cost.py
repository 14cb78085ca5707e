"""The Q/K/V merge decision (``merge_pays``) on the shapes it was measured on
(``benchmarks/qkv_merge.py``): BERT-base's projections stay separate, a merge of narrow
projections of a wide input (x read once saves more than the slices' passes) is offered."""

from __future__ import annotations

import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.types import Sym, TensorType
from tilefuse.passes.eqsat.encode import merge_pays


def t(*shape: int) -> TensorType:
    return TensorType(shape, DType.f32)


@pytest.mark.parametrize("rows", [128, 1024])
def test_bert_qkv_projections_are_not_merged(rows):
    # merged measured 1.03-1.76x slower than separate: same FLOPs, three extra slice kernels
    assert not merge_pays(t(rows, 768), [t(768, 768)] * 3)
    assert not merge_pays(t(8, 128, 768), [t(768, 768)] * 3)


def test_narrow_projections_of_a_wide_input_are_merged():
    # x [128, 4096] read 3 times (2 MiB each) against three [128, 16] slices (8 KiB each)
    assert merge_pays(t(128, 4096), [t(4096, 16)] * 3)


def test_symbolic_shapes_are_never_merged():
    x = TensorType((Sym("batch"), 768), DType.f32)
    assert not merge_pays(x, [t(768, 768)] * 3)
