"""Small calls: a matmul whose weight is a runtime argument reads it in place when M is one
register block (no packing kernel per call), and a call looks its arguments' addresses up once
per array object, without mistaking a new array for an old one."""

from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.runtime.addresses import AddressCache
from tilefuse.testing import assert_close


def _launch_count(fn, *args) -> int:
    return sum(len(step.launches) for step in fn.lower(*args).executable.steps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(1, 256, 256), (1, 37, 77), (3, 129, 10), (5, 64, 300)])
def test_a_small_m_matmul_reads_a_runtime_b_in_place(m, k, n, dtype):
    rng = np.random.default_rng(m * 1000 + k + n)
    fn = tilefuse.jit(lambda x, w, b: np.maximum(x @ w + b, 0.0))
    x = rng.standard_normal((m, k)).astype(dtype)
    for _ in range(2):   # fresh weights each call: every call reads the new ones
        w = rng.standard_normal((k, n)).astype(dtype)
        b = rng.standard_normal(n).astype(dtype)
        assert_close(fn(x, w, b), np.maximum(x @ w + b, 0.0), reduction=True)
    assert _launch_count(fn, x, w, b) == 1   # the matmul alone: no kernel packs B


def test_a_large_m_matmul_still_packs_a_runtime_b():
    rng = np.random.default_rng(1)
    fn = tilefuse.jit(lambda x, w: x @ w)
    x = rng.standard_normal((96, 64), dtype=np.float32)
    w = rng.standard_normal((64, 80), dtype=np.float32)
    assert_close(fn(x, w), x @ w, reduction=True)
    assert _launch_count(fn, x, w) == 2   # pack B, then the matmul


def test_w5_with_weights_as_arguments_matches_numpy_and_packs_nothing():
    rng = np.random.default_rng(5)
    shapes = ((1, 256), (256, 256), (256,), (256, 256), (256,), (256, 10), (10,))
    args = [rng.standard_normal(s, dtype=np.float32) / (16 if len(s) == 2 and s[0] == 256
                                                        else 1) for s in shapes]

    def w5(x, w1, b1, w2, b2, w3, b3):
        h = np.maximum(x @ w1 + b1, 0.0)
        h = np.maximum(h @ w2 + b2, 0.0)
        return h @ w3 + b3

    fn = tilefuse.jit(w5)
    assert_close(fn(*args), w5(*args), reduction=True)
    assert _launch_count(fn, *args) == 3


def test_addresses_follow_the_arrays_not_their_ids():
    cache = AddressCache(2)
    a, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    assert cache.addresses([a, b]) == [a.ctypes.data, b.ctypes.data]
    assert cache.addresses([a, b]) == [a.ctypes.data, b.ctypes.data]   # remembered
    assert cache.addresses([b, a]) == [b.ctypes.data, a.ctypes.data]   # slots swapped
    for _ in range(20):   # new arrays, often at a dead one's id
        del a   # freed here (no cycle holds an array; the cache's weak reference dies with it):
        # no gc.collect(), which took ~4 s a call in a suite worker's grown heap
        a = np.full(8, 2.0, np.float32)
        assert cache.addresses([a, b])[0] == a.ctypes.data
    c = np.ones(8, np.float32)
    c.resize(4096, refcheck=False)   # the buffer moves: the size says so
    assert cache.addresses([c, b])[0] == c.ctypes.data
    assert cache.addresses([c, b, a]) == [c.ctypes.data, b.ctypes.data, a.ctypes.data]
    assert cache.addresses([a]) == [a.ctypes.data]   # another count: looked up afresh


def test_a_call_reads_the_arrays_it_is_given_each_time():
    fn = tilefuse.jit(lambda x, y: x * 2.0 + y)
    rng = np.random.default_rng(3)
    for _ in range(30):   # arrays dropped and made again: addresses and ids are reused
        x = rng.standard_normal(33, dtype=np.float32)
        y = rng.standard_normal(33, dtype=np.float32)
        assert_close(fn(x, y), x * 2.0 + y)
        del x, y


def test_contiguous_addresses_copy_what_is_not_contiguous_and_remember_only_originals():
    cache = AddressCache(3)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = a.T                                    # not C-contiguous: copied, never remembered
    arrays, addresses = cache.contiguous([a, t, [1.0, 2.0]])
    assert arrays[0] is a and addresses[0] == a.ctypes.data
    assert arrays[1] is not t and arrays[1].flags.c_contiguous
    assert np.array_equal(arrays[1], t) and addresses[1] == arrays[1].ctypes.data
    assert isinstance(arrays[2], np.ndarray) and addresses[2] == arrays[2].ctypes.data
    again, addresses = cache.contiguous([a, t, arrays[2]])
    assert again[1] is not arrays[1] and addresses[1] == again[1].ctypes.data
    same = [a, a.copy(), a.copy()]
    assert cache.contiguous(same)[0] is same   # nothing copied: the caller's own list


def _seven(a, b, c, d, e, f, g):
    return (a - b) * c + d * e - f / (np.abs(g) + 1.0)


def test_the_fast_call_path_matches_the_general_one():
    """Calls on arrays alone take the fast path (one loop: key, lookup, contiguity,
    addresses); it must give what the general path gives on the same arguments: fresh data
    in the same arrays, new arrays, non-contiguous views, another shape, keyword calls."""
    rng = np.random.default_rng(7)
    fn = tilefuse.jit(_seven)
    args = [rng.standard_normal((5, 7), dtype=np.float32) for _ in range(7)]
    for _ in range(3):
        assert_close(fn(*args), _seven(*args))
        for a in args:   # new values in the same buffers
            a[...] = rng.standard_normal(a.shape, dtype=np.float32)
    assert fn._last_hit[1] is not None and fn._last_hit[1].direct is not None
    views = [rng.standard_normal((7, 5), dtype=np.float32).T for _ in range(7)]
    assert_close(fn(*views), _seven(*views))
    assert_close(fn(*args[:6], g=args[6]), _seven(*args))   # a keyword: the general path
    wide = [rng.standard_normal((2, 9), dtype=np.float32) for _ in range(7)]
    assert_close(fn(*wide), _seven(*wide))
    assert_close(fn(*args), _seven(*args))
    info = fn.cache_info()
    assert info.misses == 3 and info.hits == 4   # (5,7) f32 with g by keyword keys apart
    f64 = [a.astype(np.float64) for a in args]
    assert fn(*f64).dtype == np.float64
    fn.clear_cache()
    assert fn._last_hit == (None, None)
    assert_close(fn(*args), _seven(*args))


def test_outputs_stay_the_callers_on_the_fast_path():
    """A returned output is reused only once the caller dropped it: kept results are never
    overwritten by later calls."""
    fn = tilefuse.jit(lambda x, y: x * y + 1.0)
    rng = np.random.default_rng(8)
    kept = []
    for _ in range(4):
        x = rng.standard_normal(64, dtype=np.float32)
        y = rng.standard_normal(64, dtype=np.float32)
        kept.append((fn(x, y), x * y + 1.0))
        fn(x, y)   # dropped at once: its buffer may be reused
    for got, want in kept:
        assert_close(got, want)


def test_a_function_with_graph_breaks_takes_the_general_path(capsys):
    """A cache entry that is a program of regions (graph breaks) has no direct call: arrays
    alone still run it, every call, through the general path."""
    def branchy(x):
        s = float(x.sum())
        print("sum", round(s, 3))
        return x * 2.0 if s > 0 else x - 1.0

    fn = tilefuse.jit(branchy)
    rng = np.random.default_rng(9)
    for _ in range(3):
        x = rng.standard_normal(40, dtype=np.float32)
        assert_close(fn(x), x * 2.0 if x.sum() > 0 else x - 1.0)
    assert fn._last_hit == (None, None)
    assert capsys.readouterr().out.count("sum") == 3
