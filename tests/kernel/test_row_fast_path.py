"""Row kernels' fast path on the shapes and spellings users write: softmax over rows of 77,
1000 and 4096, in f16/f32/f64, as the composite op and written by hand (exp(x - max) / sum):
one row kernel, exp computed once per element, the division by the row's sum taken as a
product with its reciprocal, results within the numerics contract."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilefuse
import tilefuse.loop  # loads the loop package before the kernel lowerings
from tilefuse.codegen import host_target
from tilefuse.kernel.fusion import KernelKind, form_kernels
from tilefuse.kernel.lower_rows import lower_rows
from tilefuse.kernel.schedule import default_schedule
from tilefuse.passes.decompose import decompose_composites
from tilefuse.testing import assert_close


def by_hand(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_norm(x):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5)


def _kernel_ir(fn, x) -> str:
    [group] = form_kernels(decompose_composites(tilefuse.jit(fn).lower(x).optimized)[0]).groups
    assert group.kind is KernelKind.ROW_REDUCTION
    return str(lower_rows(group, default_schedule(group, host_target())))


def _split_at_reciprocal(ir: str) -> tuple[str, list[str]]:
    """The kernel's text before the write pass (which starts with the row's reciprocal,
    ``let t = 1.0/...``), and the write pass's lines; asserts the write pass divides only in
    those per-row reciprocals (one per loop of the pass), never per element."""
    lines = ir.splitlines()
    first = next(i for i, line in enumerate(lines) if re.search(r"= (splat<\d+>\()?1\.0", line)
                 and "/" in line)
    write = lines[first:]
    divisions = [line for line in write if "/" in line]
    assert divisions and all(line.strip().startswith("let ") and "1.0" in line
                             for line in divisions), ir
    return "\n".join(lines[:first]), write


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5, 77), (3, 1000), (2, 4096), (2, 3, 513)])
def test_softmax_by_hand_is_one_row_kernel_and_matches_numpy(shape, dtype):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x.flat[0] = -200.0 if dtype != np.float16 else -60000.0   # exp underflows to 0 there
    got = tilefuse.jit(by_hand)(x)
    assert got.dtype == dtype
    assert_close(got, by_hand(x.astype(np.float64)).astype(dtype), reduction=True)
    head, write = _split_at_reciprocal(_kernel_ir(by_hand, x))
    # exp once per element, in the sum pass, as the exp of non-positive arguments
    assert "exp_nonpos(" in head and not any("exp" in line for line in write)


@pytest.mark.parametrize("shape", [(7, 77), (4, 1000), (2, 4096)])
def test_layer_norm_by_hand_divides_once_per_row(shape):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape, dtype=np.float32) * 3 + 1
    assert_close(tilefuse.jit(layer_norm)(x), layer_norm(x.astype(np.float64)).astype(x.dtype),
                 reduction=True)
    _split_at_reciprocal(_kernel_ir(layer_norm, x))
