"""conv2d, max_pool2d and avg_pool2d against direct float64 loops over output pixels (tiny
shapes), written here independently of the vectorised references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from opcheck import FLOATS, array, noncontiguous, rng, run1

from tilefuse.dtypes import DType
from tilefuse.testing import assert_close

# ---- loop oracles ----------------------------------------------------------------------------


def conv2d_loops(x, w, bias, stride, padding, dilation, groups):
    """Direct 2-D cross-correlation in f64, one output element at a time."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = padding
    ho = (h + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    per_group = o // groups
    for b in range(n):
        for oc in range(o):
            g = oc // per_group
            for i in range(ho):
                for j in range(wo):
                    acc = 0.0 if bias is None else float(bias[oc])
                    for ci in range(cg):
                        for p in range(kh):
                            for q in range(kw):
                                r = i * stride[0] + p * dilation[0] - top
                                s = j * stride[1] + q * dilation[1] - left
                                if 0 <= r < h and 0 <= s < wd:
                                    acc += x[b, g * cg + ci, r, s] * w[oc, ci, p, q]
                    out[b, oc, i, j] = acc
    return out


def _pool_extent(size, k, s, d, before, after, ceil_mode):
    room = size + before + after - d * (k - 1) - 1
    out = (math.ceil(room / s) if ceil_mode else room // s) + 1
    if ceil_mode and (out - 1) * s >= size + before:
        out -= 1
    return out


def pool_loops(x, kind, kernel, stride, padding, dilation=(1, 1), ceil_mode=False,
               count_include_pad=True):
    """PyTorch's pooling semantics in f64 loops (asymmetric padding generalised)."""
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    top, left, bottom, right = padding
    ho = _pool_extent(h, kernel[0], stride[0], dilation[0], top, bottom, ceil_mode)
    wo = _pool_extent(w, kernel[1], stride[1], dilation[1], left, right, ceil_mode)
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            r0, s0 = i * stride[0] - top, j * stride[1] - left
            rows = [r0 + p * dilation[0] for p in range(kernel[0])]
            cols = [s0 + q * dilation[1] for q in range(kernel[1])]
            inside = [(r, s) for r in rows for s in cols if 0 <= r < h and 0 <= s < w]
            vals = np.stack([x[:, :, r, s] for r, s in inside], axis=-1)
            if kind == "max":
                out[:, :, i, j] = vals.max(axis=-1)
                continue
            if count_include_pad:  # padding counts, the overhang past it does not
                rr = [r for r in rows if r < h + bottom]
                cc = [s for s in cols if s < w + right]
                count = len(rr) * len(cc)
            else:
                count = len(inside)
            out[:, :, i, j] = vals.sum(axis=-1) / count
    return out


# ---- conv2d ----------------------------------------------------------------------------------

CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups, bias
    ((1, 3, 7, 7), (4, 3, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    ((2, 4, 9, 8), (6, 2, 3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 2, False),
    ((1, 1, 5, 5), (1, 1, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    ((2, 6, 7, 6), (6, 1, 3, 3), (1, 2), (1, 1, 1, 1), (2, 1), 6, True),
    ((1, 2, 4, 4), (3, 2, 4, 4), (1, 1), (2, 2, 2, 2), (1, 1), 1, True),
    ((1, 3, 11, 1), (2, 3, 3, 1), (3, 1), (0, 0, 1, 0), (1, 1), 1, True),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_matches_loops(case, dtype: DType) -> None:
    xs, ws, stride, padding, dilation, groups, with_bias = case
    r = rng("conv", case, dtype.value)
    x, w = array(r, xs, dtype), array(r, ws, dtype)
    inputs = [noncontiguous(x), w]
    bias = None
    if with_bias:
        bias = array(r, (ws[0],), dtype)
        inputs.append(bias)
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    got = run1("conv2d", inputs, attrs)
    expect = conv2d_loops(x, w, bias, stride, padding, dilation, groups).astype(dtype.np)
    assert_close(got, expect, reduction=True)


def test_conv2d_defaults_and_odd_sizes() -> None:
    r = rng("conv-odd")
    x, w = array(r, (1, 1, 1, 513), DType.f32), array(r, (7, 1, 1, 3), DType.f32)
    expect = conv2d_loops(x, w, None, (1, 1), (0, 0, 0, 0), (1, 1), 1).astype(np.float32)
    assert_close(run1("conv2d", [x, w]), expect, reduction=True)


# ---- pooling ---------------------------------------------------------------------------------

POOL_CASES = [
    # x shape, kernel, stride, padding, dilation (max only), ceil_mode
    ((1, 2, 7, 7), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False),
    ((1, 2, 7, 7), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), True),
    ((2, 3, 9, 8), (3, 3), (2, 3), (1, 1, 1, 0), (1, 1), True),
    ((1, 1, 8, 10), (3, 2), (1, 2), (1, 0, 0, 1), (2, 1), False),
    ((1, 1, 5, 5), (3, 3), (3, 3), (1, 1, 1, 1), (1, 1), True),
    ((1, 3, 1, 513), (1, 7), (1, 4), (0, 3, 0, 2), (1, 1), True),
]


@pytest.mark.parametrize("dtype", [*FLOATS, DType.i32])
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool2d(case, dtype: DType) -> None:
    xs, kernel, stride, padding, dilation, ceil_mode = case
    x = array(rng("maxpool", case, dtype.value), xs, dtype)
    attrs = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation,
             "ceil_mode": ceil_mode}
    got = run1("max_pool2d", [noncontiguous(x)], attrs)
    expect = pool_loops(x, "max", kernel, stride, padding, dilation, ceil_mode)
    assert_close(got, expect.astype(dtype.np))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_CASES)
def test_avg_pool2d(case, count_include_pad: bool, dtype: DType) -> None:
    xs, kernel, stride, padding, _, ceil_mode = case
    x = array(rng("avgpool", case, dtype.value), xs, dtype)
    attrs = {"kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": ceil_mode,
             "count_include_pad": count_include_pad}
    got = run1("avg_pool2d", [noncontiguous(x)], attrs)
    expect = pool_loops(x, "avg", kernel, stride, padding, ceil_mode=ceil_mode,
                        count_include_pad=count_include_pad)
    assert_close(got, expect.astype(dtype.np), reduction=True)


def test_max_pool_propagates_nan() -> None:
    x = array(rng("nan-pool"), (1, 1, 4, 4), DType.f32)
    x[0, 0, 1, 1] = np.nan
    got = run1("max_pool2d", [x], {"kernel": (2, 2), "stride": (2, 2)})
    assert np.isnan(got[0, 0, 0, 0]) and not np.isnan(got[0, 0, 1, 1])
    expect = pool_loops(x, "max", (2, 2), (2, 2), (0, 0, 0, 0)).astype(np.float32)
    assert_close(got, expect)
