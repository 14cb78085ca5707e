"""Schedules: exact JSON round trips, rejection of malformed JSON and records, validation against
a kernel's axes, and the default rules on the compass shapes and on tiny ones."""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plancheck import random_fusion_graph

from tilefuse.errors import TilefuseError
from tilefuse.graph.parser import parse_graph
from tilefuse.kernel import (
    CpuTarget,
    KernelGroup,
    KernelKind,
    Schedule,
    ScheduleError,
    default_schedule,
    form_kernels,
    iteration_axes,
    validate,
)
from tilefuse.kernel.schedule import as_cpu_target, pick_tile
from tilefuse.passes.decompose import decompose_composites
from tilefuse.target import Target

AVX512_2 = CpuTarget(vector_bits=512, cores=2)


def only_group(src: str, *, decompose: bool = False) -> KernelGroup:
    graph = parse_graph(textwrap.dedent(src).lstrip("\n"))
    if decompose:
        graph, _ = decompose_composites(graph)
    (group,) = form_kernels(graph).groups
    return group


# ---- the record and its JSON -----------------------------------------------------------------

axis_names = st.text("bikmnr_.0123456789", min_size=1, max_size=4)
pairs = st.lists(st.tuples(axis_names, st.integers(1, 1 << 40)), max_size=4).map(tuple)
names = st.lists(axis_names, max_size=4).map(tuple)
schedules = st.builds(
    Schedule, kind=st.sampled_from(KernelKind), tiles=pairs, order=names,
    vector_axis=st.none() | axis_names, vector_width=st.integers(1, 1 << 20),
    parallel_axes=names, unroll=pairs, pack=st.lists(st.sampled_from("AB"), max_size=2).map(tuple),
    micro_tile=st.none() | st.tuples(st.integers(1, 64), st.integers(1, 64)),
    prefetch=st.lists(st.tuples(st.sampled_from("AB"), st.integers(1, 256)),
                      max_size=2).map(tuple))


@settings(max_examples=200, deadline=None)
@given(schedules)
def test_json_round_trip_is_exact(schedule):
    text = schedule.to_json()
    back = Schedule.from_json(text)
    assert back == schedule and back.to_json() == text
    assert Schedule.from_json(schedule.to_json(indent=2)) == schedule
    assert "\n" not in str(schedule) and str(schedule).startswith(schedule.kind.value)


def _w1_json() -> dict:
    return json.loads(Schedule(KernelKind.CONTRACTION, (("m", 96),), ("n", "k", "m"), "n", 16,
                               ("n",), (("k", 4),), ("B",), (12, 32)).to_json())


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, "unknown schedule keys: colour"),
    ({"tiles": None}, "tiles must be a JSON list"),
    ({"tiles": [["m", True]]}, "tiles size for 'm' must be a positive int, got True"),
    ({"tiles": [["m", 0]]}, "tiles size for 'm' must be a positive int"),
    ({"tiles": [["m", 96, 1]]}, "tiles entries must be"),
    ({"tiles": [[7, 96]]}, "tiles axis must be a non-empty axis name"),
    ({"order": "nkm"}, "order must be a JSON list"),
    ({"order": ["n", 1]}, "order must be a non-empty axis name"),
    ({"vector_width": 16.0}, "vector_width must be a positive int"),
    ({"vector_width": "16"}, "vector_width must be a positive int"),
    ({"vector_axis": 3}, "vector_axis must be a non-empty axis name"),
    ({"micro_tile": [12]}, "micro_tile must be None or two positive ints"),
    ({"micro_tile": [12, -32]}, "micro_tile must be None or two positive ints"),
    ({"prefetch": [["B"]]}, "prefetch entries must be"),
    ({"prefetch": "B"}, "prefetch must be a JSON list"),
    ({"kind": "gemm"}, "unknown kernel kind 'gemm'"),
    ({"kind": ["contraction"]}, "unknown kernel kind"),
])
def test_from_json_rejects_unknown_keys_and_bad_types(change, message):
    data = {**_w1_json(), **change}
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_json(json.dumps(data))


def test_json_without_prefetch_reads_as_none():
    """Schedules stored before the field existed (tuning databases) still load."""
    data = _w1_json()
    assert data["prefetch"] == []
    del data["prefetch"]
    assert Schedule.from_json(json.dumps(data)).prefetch == ()
    with_b = Schedule.from_dict({**data, "prefetch": [["B", 16]]})
    assert with_b.prefetch == (("B", 16),) and str(with_b).endswith("prefetch(B+16)")
    both = Schedule.from_dict({**data, "prefetch": [["B", 16], ["B_next", 1]]})
    assert str(both).endswith("prefetch(B+16,B_next+1)")


def test_from_json_rejects_missing_keys_and_non_objects():
    data = _w1_json()
    del data["pack"]
    with pytest.raises(ScheduleError, match="missing schedule keys: pack"):
        Schedule.from_json(json.dumps(data))
    for text in ("[1, 2]", "not json", '{"kind": '):
        with pytest.raises(ScheduleError):
            Schedule.from_json(text)
    assert issubclass(ScheduleError, TilefuseError)


def test_the_record_checks_its_own_types():
    with pytest.raises(ScheduleError, match="kind must be a KernelKind"):
        Schedule("elementwise")  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="tiles must be a tuple"):
        Schedule(KernelKind.ELEMENTWISE, tiles=[("i", 4)])  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="unroll size"):
        Schedule(KernelKind.ELEMENTWISE, unroll=(("i", 1.5),))  # type: ignore[arg-type]


def test_str_is_one_readable_line():
    s = Schedule.from_dict(_w1_json())
    assert str(s) == ("contraction tile(m=96) order(n,k,m) vec(nx16) par(n) unroll(k=4) "
                      "pack(B) micro(12x32)")
    assert str(Schedule(KernelKind.ELEMENTWISE, order=("i",))) == "elementwise order(i) serial"


# ---- validation ------------------------------------------------------------------------------

MNK = {"m": 512, "n": 3072, "k": 768}


def _mm(**changes) -> Schedule:
    base = dict(kind=KernelKind.CONTRACTION, tiles=(("m", 96), ("n", 1536), ("k", 384)),
                order=("n", "k", "m"), vector_axis="n", vector_width=16, parallel_axes=("n",),
                unroll=(("k", 4),), pack=("B",), micro_tile=(12, 32))
    return Schedule(**{**base, **changes})


def test_a_valid_schedule_passes():
    validate(_mm(), MNK)
    validate(_mm(), {"m": None, "n": None, "k": None})  # symbolic extents: bounds unknown


@pytest.mark.parametrize("schedule, extents, message", [
    (_mm(order=("n", "k")), MNK, "is not a permutation of the axes"),
    (_mm(order=("n", "k", "k")), MNK, "order names an axis twice"),
    (_mm(order=("n", "k", "m", "b")), MNK, "not a permutation"),
    (_mm(tiles=(("x", 4),)), MNK, "tiles names 'x', which is not an axis"),
    (_mm(tiles=(("m", 1024),)), MNK, "tiles 1024 for axis 'm' exceeds its extent 512"),
    (_mm(tiles=(("m", 96), ("m", 48))), MNK, "tiles names an axis twice"),
    (_mm(unroll=(("k", 1000),)), MNK, "unroll 1000 for axis 'k' exceeds its extent 768"),
    (_mm(vector_width=12), MNK, "power of two up to 64"),
    (_mm(vector_width=128, micro_tile=(12, 128)), MNK, "power of two up to 64"),
    (_mm(vector_axis=None), MNK, "a vector axis needs a vector width"),
    (_mm(vector_axis="q"), MNK, "vector_axis names 'q'"),
    (_mm(parallel_axes=("n", "n")), MNK, "parallel_axes names an axis twice"),
    (_mm(parallel_axes=("b",)), MNK, "parallel_axes names 'b'"),
    (_mm(pack=("C",)), MNK, "operands A and B"),
    (_mm(micro_tile=None), MNK, "a contraction needs a micro_tile"),
    (_mm(micro_tile=(12, 24)), MNK, "NR=24 is not a multiple of the vector width 16"),
    (_mm(micro_tile=(128, 32)), MNK, "micro tile 128 along 'm' exceeds its block 96"),
    (_mm(prefetch=(("A", 16),)), MNK, "only its packed B"),
    (_mm(pack=(), prefetch=(("B", 16),)), MNK, "only its packed B"),
    (_mm(prefetch=(("B", 300),)), MNK, "prefetch B distance 300 is not in 1..256"),
    (_mm(prefetch=(("B_next", 3),)), MNK, "prefetch B_next distance 3 is not in 1..2"),
    (_mm(pack=(), prefetch=(("B_next", 1),)), MNK, "only its packed B"),
    (_mm(prefetch=(("B", 8), ("B", 16))), MNK, "prefetch"),
    (_mm(), {"m": 512, "n": 3072, "q": 768}, "needs the axes"),
    (Schedule(KernelKind.ELEMENTWISE, order=("i",), pack=("B",)), {"i": 8}, "only a contraction"),
    (Schedule(KernelKind.ELEMENTWISE, order=("i",), micro_tile=(1, 1)), {"i": 8},
     "other kernels have none"),
])
def test_validation_errors(schedule, extents, message):
    with pytest.raises(ScheduleError, match=message):
        validate(schedule, extents)


# ---- default rules ---------------------------------------------------------------------------

W1 = """
    graph @w1(%x: f32[512,768], %w: f32[768,3072], %b: f32[3072]) -> f32[512,3072] {
      %0 = matmul(%x, %w) : f32[512,3072]
      %1 = add(%0, %b) : f32[512,3072]
      %2 = gelu(%1) {approximate="none"} : f32[512,3072]
      return %2
    }
    """


def test_default_for_w1_matmul_bias_gelu():
    group = only_group(W1)
    assert iteration_axes(group) == {"m": 512, "n": 3072, "k": 768}
    # NC: B's 768 x 384 block stays in L2 for every MC block (CACHE_TILES)
    # a 6x64 register tile: 4 B vectors and 6 A broadcasts per k step (_tile_vectors);
    # B's next panel hinted into L2 while a panel's 16 tiles of an M block run
    assert default_schedule(group, AVX512_2) == _mm(tiles=(("m", 96), ("n", 384), ("k", 768)),
                                                    micro_tile=(6, 64),
                                                    prefetch=(("B_next", 1),))
    serial = default_schedule(group, CpuTarget(512, cores=1))
    assert serial.parallel_axes == () and serial.tile("n") == 384
    avx2 = default_schedule(group, CpuTarget(256, cores=2))
    assert (avx2.micro_tile, avx2.vector_width) == ((6, 16), 8)
    assert avx2.tile("m") == 96 and avx2.tile("m") % 6 == 0


def test_default_contraction_threads_over_m_or_batch_when_n_is_narrow():
    narrow = only_group("""
        graph @g(%x: f32[4096,256], %w: f32[256,16]) -> f32[4096,16] {
          %0 = matmul(%x, %w) : f32[4096,16]
          return %0
        }
        """)
    s = default_schedule(narrow, AVX512_2)
    assert s.parallel_axes == ("m",) and s.micro_tile == (16, 16)
    conv = only_group("""
        graph @g(%x: f32[3136,576], %w: f32[576,64]) -> f32[3136,64] {
          %0 = matmul(%x, %w) : f32[3136,64]
          return %0
        }
        """)  # a 3x3 conv's im2col matrix: one 32-wide panel per thread if threads went over N
    s = default_schedule(conv, AVX512_2)
    assert s.parallel_axes == ("m",) and s.tile("n") == 64 and s.tile("m") == 96
    two_panels = only_group("""
        graph @g(%x: f32[3136,64], %w: f32[64,128]) -> f32[3136,128] {
          %0 = matmul(%x, %w) : f32[3136,128]
          return %0
        }
        """)  # N = 128: one 64-wide panel per thread
    assert default_schedule(two_panels, AVX512_2).parallel_axes == ("m",)
    tall = only_group("""
        graph @g(%x: f32[3136,64], %w: f32[64,256]) -> f32[3136,256] {
          %0 = matmul(%x, %w) : f32[3136,256]
          return %0
        }
        """)  # A (3136 x 64) is larger than B (64 x 256): each thread reads half of it
    assert default_schedule(tall, AVX512_2).parallel_axes == ("m",)
    wide = only_group("""
        graph @g(%x: f32[196,256], %w: f32[256,1024]) -> f32[196,1024] {
          %0 = matmul(%x, %w) : f32[196,1024]
          return %0
        }
        """)
    assert default_schedule(wide, AVX512_2).parallel_axes == ("n",)
    batched = only_group("""
        graph @g(%q: f32[12,512,64], %k: f32[12,64,512]) -> f32[12,512,512] {
          %0 = matmul(%q, %k) : f32[12,512,512]
          return %0
        }
        """)
    s = default_schedule(batched, AVX512_2)
    assert iteration_axes(batched) == {"b": 12, "m": 512, "n": 512, "k": 64}
    assert s.order == ("b", "n", "k", "m") and s.parallel_axes == ("b",)


def test_default_for_layer_norm_2048x768():
    group = only_group("""
        graph @ln(%x: f32[2048,768], %w: f32[768], %b: f32[768]) -> f32[2048,768] {
          %0 = layer_norm(%x, %w, %b) {eps=1e-05} : f32[2048,768]
          return %0
        }
        """, decompose=True)
    assert iteration_axes(group) == {"r": 2048, "n": 768}
    assert default_schedule(group, AVX512_2) == Schedule(
        KernelKind.ROW_REDUCTION, tiles=(("r", 128),), order=("r", "n"), vector_axis="n",
        vector_width=16, parallel_axes=("r",), unroll=(("n", 4),))   # 8 tiles per thread


def test_default_for_softmax_12x512x512():
    group = only_group("""
        graph @sm(%x: f32[12,512,512]) -> f32[12,512,512] {
          %0 = softmax(%x) {axis=-1} : f32[12,512,512]
          return %0
        }
        """, decompose=True)
    assert iteration_axes(group) == {"r": 6144, "n": 512}
    s = default_schedule(group, AVX512_2)
    # every core busy: ROW_SPLIT tiles per thread, so that the pool's grains can be stolen
    assert (s.tiles, s.parallel_axes, s.vector_width) == ((("r", 384),), ("r",), 16)
    wide = default_schedule(group, CpuTarget(512, cores=16))
    assert wide.tiles == (("r", 48),)
    # fewer threads than cores (64 Ki elements each): one tile per thread
    small = only_group("""
        graph @sm(%x: f32[3,512,128]) -> f32[3,512,128] {
          %0 = softmax(%x) {axis=-1} : f32[3,512,128]
          return %0
        }
        """, decompose=True)
    assert default_schedule(small, CpuTarget(512, cores=16)).tiles == (("r", 512),)


@pytest.mark.parametrize("src, expected", [
    ("""graph @e(%x: f32[1,7]) -> f32[1,7] {
          %0 = exp(%x) : f32[1,7]
          return %0
        }""", Schedule(KernelKind.ELEMENTWISE, order=("i",), vector_axis="i", vector_width=4)),
    ("""graph @r(%x: f32[1,7]) -> f32[1,1] {
          %0 = sum(%x) {axes=[1], keepdims=true} : f32[1,1]
          return %0
        }""", Schedule(KernelKind.ROW_REDUCTION, order=("r", "n"), vector_axis="n",
                       vector_width=4)),
    ("""graph @m(%x: f32[1,7], %w: f32[7,7]) -> f32[1,7] {
          %0 = matmul(%x, %w) : f32[1,7]
          return %0
        }""", Schedule(KernelKind.CONTRACTION, tiles=(("m", 1), ("n", 7), ("k", 7)),
                       order=("n", "k", "m"), vector_axis="n", vector_width=4,
                       unroll=(("k", 4),), pack=("B",), micro_tile=(1, 4))),
    ("""graph @s(%x: f32[1]) -> f32[1] {
          %0 = neg(%x) : f32[1]
          return %0
        }""", Schedule(KernelKind.ELEMENTWISE, order=("i",))),
])
def test_defaults_for_tiny_shapes(src, expected):
    assert default_schedule(only_group(src), AVX512_2) == expected


def test_default_elementwise_threads_only_with_64ki_elements_per_thread():
    big = only_group("""
        graph @w7(%x: f32[16777216]) -> f32[16777216] {
          %0 = sigmoid(%x) : f32[16777216]
          return %0
        }
        """)
    s = default_schedule(big, AVX512_2)
    assert (s.tiles, s.parallel_axes, s.vector_width) == ((("i", 8388608),), ("i",), 16)
    small = only_group("""
        graph @g(%x: f64[2,65536]) -> f64[2,65536] {
          %0 = exp(%x) : f64[2,65536]
          return %0
        }
        """)
    s = default_schedule(small, CpuTarget(512, cores=8))
    assert s.parallel_axes == ("i",) and s.tile("i") == 65536 and s.vector_width == 8
    assert default_schedule(small, CpuTarget(512, cores=1)).parallel_axes == ()


SHUFFLE = """
    graph @shuffle(%x: f32[784,4,34]) -> {shape} {{
      %0 = relu(%x) : f32[784,4,34]
      %1 = transpose(%0) {{perm={perm}}} : {shape}
      return %1
    }}
    """


def test_default_elementwise_through_a_lane_moving_transpose_threads_sooner():
    """Its elements are loaded one at a time, so 64 Ki / 16 of them make a thread worth it;
    the same 106 624 elements through a transpose that keeps the last axis stay serial."""
    moved = only_group(SHUFFLE.format(perm="[0,2,1]", shape="f32[784,34,4]"))
    s = default_schedule(moved, AVX512_2)
    assert s.parallel_axes == ("i",) and s.tile("i") == 784 * 136 // 2
    kept = only_group(SHUFFLE.format(perm="[1,0,2]", shape="f32[4,784,34]"))
    assert default_schedule(kept, AVX512_2).parallel_axes == ()


def test_default_reduction_vectorises_the_contiguous_axis():
    columns = only_group("""
        graph @g(%x: f32[4096,1024]) -> f32[1,1024] {
          %0 = sum(%x) {axes=[0], keepdims=true} : f32[1,1024]
          return %0
        }
        """)
    assert iteration_axes(columns) == {"i": 1024, "r": 4096}
    assert default_schedule(columns, AVX512_2) == Schedule(
        KernelKind.REDUCTION, tiles=(("i", 512),), order=("r", "i"), vector_axis="i",
        vector_width=16, parallel_axes=("i",))
    arg = only_group("""
        graph @g(%x: f32[3,7]) -> i64[3] {
          %0 = argmax(%x) {axis=1, keepdims=false} : i64[3]
          return %0
        }
        """)
    s = default_schedule(arg, AVX512_2)
    assert s.order == ("i", "r") and s.parallel_axes == () and s.vector_width == 4


def test_defaults_with_symbolic_extents_and_low_precision():
    group = only_group("""
        graph @sm(%x: f16[batch,512]) -> f16[batch,512] {
          %0 = softmax(%x) {axis=-1} : f16[batch,512]
          return %0
        }
        """, decompose=True)
    assert iteration_axes(group) == {"r": None, "n": 512}
    assert iteration_axes(group, hint=4) == {"r": 4, "n": 512}
    s = default_schedule(group, AVX512_2)
    assert s.vector_width == 16 and s.parallel_axes == ("r",)
    elementwise = only_group("""
        graph @g(%x: f32[batch,seq,768]) -> f32[batch,seq,768] {
          %0 = tanh(%x) : f32[batch,seq,768]
          return %0
        }
        """)
    s = default_schedule(elementwise, AVX512_2)   # batch and seq taken as 256 each
    assert iteration_axes(elementwise) == {"i": None}
    assert s.parallel_axes == ("i",) and s.tile("i") == 256 * 256 * 768 // 2


def test_targets_from_the_code_generator_and_their_checks():
    assert as_cpu_target(Target.parse("x86-64-v3")).lanes(
        only_group(W1).nodes[0].output.dtype) == 8
    assert as_cpu_target("x86-64-v4").vector_bits == 512
    assert as_cpu_target(Target.parse("x86-64-v3").llvm_cpu()).vector_bits == 256
    assert as_cpu_target(AVX512_2) is AVX512_2
    assert as_cpu_target(None).cores >= 1
    with pytest.raises(ScheduleError, match=r"not a tilefuse\.target\.Target"):
        as_cpu_target(SimpleNamespace(vector_bits=256))
    with pytest.raises(ScheduleError, match="unknown target 'tpu'"):
        as_cpu_target("tpu")
    with pytest.raises(ScheduleError, match="vector_bits must be 128, 256 or 512"):
        CpuTarget(vector_bits=100)
    with pytest.raises(ScheduleError, match="cores must be a positive int"):
        CpuTarget(cores=0)


def test_pick_tile():
    assert pick_tile(512, 96, 12) == 96      # no multiple of 12 in [48, 96] divides 512
    assert pick_tile(768, 384) == 384
    assert pick_tile(3072, 1536, 32) == 1536
    assert pick_tile(1200, 96, 8) == 80      # the largest multiple of 8 in [48, 96] dividing it
    assert pick_tile(1000, 96, 8) == 96      # none does: the target
    assert pick_tile(7, 96, 12) == 7
    assert pick_tile(None, 100, 12) == 96


@pytest.mark.parametrize("seed", range(8))
def test_every_default_on_random_plans_validates_and_round_trips(seed):
    rng = np.random.default_rng(seed)
    plan = form_kernels(random_fusion_graph(rng, n_nodes=20))
    for group in plan.groups:
        for target in (AVX512_2, CpuTarget(256, cores=1)):
            s = default_schedule(group, target)
            validate(s, iteration_axes(group))
            assert s.kind is group.kind
            assert Schedule.from_json(s.to_json()) == s


def test_a_kernel_without_the_anchor_its_kind_needs_is_refused():
    group = only_group(W1)
    for kind, anchor in ((KernelKind.CONTRACTION, None), (KernelKind.ROW_REDUCTION, group.anchor),
                         (KernelKind.REDUCTION, group.nodes[1])):
        odd = KernelGroup("odd", kind, group.nodes, group.inputs, group.outputs, anchor,
                          group.domain)
        with pytest.raises(ScheduleError, match=r"kernel odd: a .* kernel needs a"):
            default_schedule(odd, AVX512_2)
