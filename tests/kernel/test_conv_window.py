"""The implicit-GEMM A operand: a convolution's windows read in place from its NHWC source
(:mod:`tilefuse.kernel.conv_window`), checked against the graph interpreter for strides,
dilations, paddings, channel counts that are not a vector's multiple, batches and K blocks that
do and do not line up with the kernel rows."""

from __future__ import annotations

import numpy as np
import pytest
from contraction_runner import run_contraction

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret as interpret_graph
from tilefuse.graph.ir import Graph
from tilefuse.kernel.conv_window import window_operand
from tilefuse.kernel.fusion import KernelKind, form_kernels
from tilefuse.kernel.lower_matmul import matmul_node
from tilefuse.kernel.schedule import Schedule
from tilefuse.testing import assert_close, random_array

F32 = DType.f32


def window_graph(n: int, hw: tuple[int, int], c: int, o: int, kernel: tuple[int, int],
                 strides: tuple[int, int], dilations: tuple[int, int], pad: int,
                 source: str = "nhwc") -> Graph:
    """relu(windows(x) @ w + bias) as the convolution lowering writes it; ``source`` "nhwc":
    x arrives as NHWC, "matrix": as the [N·H·W, C] matrix a previous convolution leaves,
    "nchw": as NCHW (transposed first, as a network's first convolution)."""
    b = GraphBuilder("conv")
    h, w = hw
    if source == "nchw":
        x = b.add1("transpose", [b.input(((n, c, h, w), F32), "x")], {"perm": (0, 2, 3, 1)})
    elif source == "matrix":
        x = b.add1("reshape", [b.input(((n * h * w, c), F32), "x")], {"shape": (n, h, w, c)})
    else:
        x = b.input(((n, h, w, c), F32), "x")
    if pad:
        x = b.add1("pad", [x], {"mode": "constant", "value": 0.0,
                                "pads": (0, 0, pad, pad + 1, pad, pad, 0, 0)})
    patches = b.add1("window_patches", [x], {"kernel": kernel, "strides": strides,
                                             "dilations": dilations})
    _, oh, ow, kh, kw, _ = patches.shape
    a = b.add1("reshape", [patches], {"shape": (n * oh * ow, kh * kw * c)})
    y = b.add1("matmul", [a, b.input(((kh * kw * c, o), F32), "w")])
    y = b.add1("add", [y, b.input(((o,), F32), "bias")])
    return b.build([b.add1("relu", [y])])


def check(graph: Graph, seed: int, **kwargs: object) -> list[str]:
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    [expected] = interpret_graph(graph, *arrays)
    got, names = run_contraction(graph, arrays, **kwargs)
    assert_close(got, expected, reduction=True)
    return names


CASES = [  # n, hw, c, o, kernel, strides, dilations, pad, source
    (1, (9, 7), 3, 5, (3, 3), (1, 1), (1, 1), 1, "nhwc"),
    (2, (7, 9), 17, 33, (3, 3), (2, 2), (1, 1), 1, "matrix"),
    (1, (13, 11), 3, 64, (7, 7), (2, 2), (1, 1), 3, "nchw"),
    (1, (11, 9), 16, 7, (3, 1), (1, 2), (2, 1), 2, "nhwc"),
    (2, (9, 9), 5, 16, (1, 1), (2, 2), (1, 1), 0, "matrix"),
    (1, (1, 7), 7, 1, (1, 3), (1, 1), (1, 1), 0, "nhwc"),
]


@pytest.mark.parametrize("case", CASES)
def test_windows_read_in_place_match_the_reference(case):
    n, hw, c, o, kernel, strides, dilations, pad, source = case
    names = check(window_graph(n, hw, c, o, kernel, strides, dilations, pad, source),
                  seed=sum(hw) + c + o)
    assert not any("a_rows" in name for name in names)   # no im2col matrix was written
    # the source is copied only when the group computes it (a pad, a transpose)
    assert any("a_src" in name for name in names) == (pad > 0 or source == "nchw")


@pytest.mark.parametrize("kc", [5, 16, 27, 40])
def test_k_blocks_that_split_kernel_rows(kc):
    """K blocks shorter than, equal to and straddling a kernel row's run (3·9 = 27)."""
    graph = window_graph(1, (9, 8), 9, 19, (3, 3), (1, 1), (1, 1), 1, "matrix")
    schedule = Schedule(KernelKind.CONTRACTION, tiles=(("m", 24), ("n", 16), ("k", kc)),
                        order=("n", "k", "m"), vector_axis="n", vector_width=16,
                        parallel_axes=("m",), unroll=(("k", 3),), pack=("B",),
                        micro_tile=(6, 16))
    check(graph, seed=kc, schedule=schedule)


def test_interpreted_loop_ir_matches():
    check(window_graph(1, (5, 6), 3, 4, (3, 3), (2, 1), (1, 1), 1, "nhwc"), seed=3,
          interpreted=True)


def test_dilation_along_w_keeps_the_materialised_matrix():
    graph = window_graph(1, (9, 9), 4, 6, (3, 3), (1, 1), (1, 2), 1, "nhwc")
    [group] = form_kernels(graph).groups
    assert window_operand(group, matmul_node(group).inputs[0]) is None
    names = check(graph, seed=9)
    assert any("a_rows" in name for name in names)


@pytest.mark.parametrize("n, hw, strides, mr, kc", [
    (2, (6, 14), (1, 1), 7, 0),    # OW = 14: tiles of 7 pixels, two per output row
    (1, (5, 14), (1, 1), 14, 20),  # a whole row per tile; K blocks split kernel rows
    (1, (9, 15), (2, 2), 4, 0),    # OW = 8 after a stride of 2
    (1, (7, 7), (1, 1), 7, 0),     # OW = 7: one tile per output row
])
def test_tiles_within_one_output_row(n, hw, strides, mr, kc):
    """MR dividing OW: a tile's rows are adjacent pixels of one output row, addressed from
    one base (:meth:`WindowA.tiles_stay_in_row`)."""
    graph = window_graph(n, hw, 5, 40, (3, 3), strides, (1, 1), 1, "nhwc")
    [group] = form_kernels(graph).groups
    window = window_operand(group, matmul_node(group).inputs[0])
    assert window is not None and window.tiles_stay_in_row(mr)
    tiles = (("m", 4 * mr), ("n", 32)) + ((("k", kc),) if kc else ())
    schedule = Schedule(KernelKind.CONTRACTION, tiles=tiles, order=("n", "k", "m"),
                        vector_axis="n", vector_width=16, parallel_axes=("n",),
                        unroll=(("k", 4),), pack=("B",), micro_tile=(mr, 32))
    check(graph, seed=mr + kc, schedule=schedule)
    check(graph, seed=mr + kc, schedule=schedule, interpreted=True)
