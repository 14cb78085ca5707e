"""Graph breaks in tilefuse.jit: held-out NumPy functions with data-dependent branches, loops,
prints, conversions and NumPy functions without a rule give NumPy's results and NumPy's printed
output over calls that take different paths, and compile each region once."""

from __future__ import annotations

import contextlib
import io
import logging

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import TraceError
from tilefuse.frontend.graph_breaks import Program
from tilefuse.frontend.jit import RecompileLimitError
from tilefuse.testing import assert_close


def branchy(x, w):
    y = x @ w
    s = y.sum()
    print("sum", s)
    if s > 0:
        z = np.tanh(y) * 2.0
    else:
        z = y - 1.0
    print("done")
    return z + x.mean()


def halve_until_small(x):
    while x.max() > 4.0:
        x = x / 2.0
    return x + 1.0


def loop_count(x, k):
    n = int(k.sum())
    for _ in range(n):
        x = x * 1.5
    return x, x + n


def item_and_tolist(x):
    top = x.max(axis=0)
    first = top[0].item()
    values = top.tolist()
    print(f"first={first} all={values}")
    return x * (len(values) + 1.0) - first


def host_function(x):
    y = x * 2.0 + 1.0
    c = np.sort(y, axis=1)        # no tilefuse rule: NumPy runs it
    print("last", c[:, -1])
    return np.exp(c / (np.abs(c[:, -1:]) + 1.0)) + y


def nested(x):
    total = x.sum()
    if total > 10:
        if x.max() > 5:
            return x * 3.0
        return x * 2.0
    return -x


HELD_OUT = {
    "branchy": (branchy, lambda rng, sign: (
        (rng.integers(0, 3, (4, 5)) * sign).astype(np.float32),
        rng.integers(1, 3, (5, 3)).astype(np.float32))),
    "halve_until_small": (halve_until_small, lambda rng, sign: (
        rng.integers(0, 40 if sign > 0 else 4, (3, 7)).astype(np.float32),)),
    "loop_count": (loop_count, lambda rng, sign: (
        rng.integers(0, 3, (2, 3)).astype(np.float32),
        np.array([1 if sign > 0 else 2, 1], np.int32))),
    "item_and_tolist": (item_and_tolist, lambda rng, sign: (
        (rng.integers(0, 4, (3, 2)) * sign).astype(np.float32),)),
    "host_function": (host_function, lambda rng, sign: (
        (rng.integers(0, 3, (2, 4)) * sign * 0.5).astype(np.float32),)),
    "nested": (nested, lambda rng, sign: (
        rng.integers(0, 7 if sign > 0 else 2, (3, 4)).astype(np.float32),)),
}


def _run(fn, args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = fn(*args)
    return result, out.getvalue()


def _compare(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _compare(g, w)
        return
    want = np.asarray(want)
    got = np.asarray(got)
    if got.dtype != want.dtype and want.ndim == 0:   # a Python float result comes back 0-d
        want = want.astype(got.dtype)
    assert_close(got, want, reduction=True)


@pytest.mark.parametrize("name", sorted(HELD_OUT))
def test_held_out_functions_match_numpy_over_paths(name):
    fn, make = HELD_OUT[name]
    jitted = tilefuse.jit(fn)
    rng = np.random.default_rng(sorted(HELD_OUT).index(name))
    signs = [1, -1, 1, -1, -1, 1]
    for sign in signs:
        args = make(rng, sign)
        want, want_printed = _run(fn, args)
        got, got_printed = _run(jitted, args)
        _compare(got, want)
        assert got_printed == want_printed
    (program,) = jitted._cache.values()
    assert isinstance(program, Program), "the function should have graph breaks"
    # each region compiled once: a second round over the same inputs compiles nothing
    built = len(program.built)
    regions = program.regions
    rng = np.random.default_rng(sorted(HELD_OUT).index(name))
    for sign in signs:
        args = make(rng, sign)
        _compare(_run(jitted, args)[0], _run(fn, args)[0])
    assert (len(program.built), program.regions) == (built, regions)
    texts = {str(r.captured) for _, _, r in program.walk() if r.executable is not None}
    assert len(texts) == len(program.built)


@pytest.mark.parametrize("name", ["to_int", "to_float", "to_item", "to_numpy", "loop_bound",
                                  "while_loop", "branchy", "svd", "sort", "arccos",
                                  "accumulate"])
def test_what_fullgraph_refuses_runs_with_breaks(name):
    """test_errors.py's functions that fullgraph=True refuses give NumPy's results without it."""
    import test_errors

    fn = getattr(test_errors, name)
    jitted = tilefuse.jit(fn)
    rng = np.random.default_rng(5)
    for _ in range(3):
        shape = (3, 4) if name == "branchy" else (3, 3) if name in (
            "svd", "sort", "arccos", "accumulate") else (4,)
        x = rng.uniform(-0.9, 0.9 if name == "arccos" else 6, shape).astype(np.float32)
        if name == "loop_bound":
            x = rng.integers(0, 4, shape).astype(np.int64)
        want = fn(x)
        got = jitted(x)
        if isinstance(want, list):   # loop_bound returns a list of 0-d arrays
            assert len(got) == len(want)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        elif name == "svd":   # signs of singular vectors may differ: compare the product
            u, s, vh = got
            assert_close(u @ np.diag(s) @ vh, x, reduction=True)
        else:
            _compare(got, want)


def test_regions_are_replayed_without_python_and_guards_checked():
    calls = []

    def f(x):
        calls.append(1)
        if x.sum() > 0:
            return x + 1.0
        return x - 1.0

    jitted = tilefuse.jit(f)
    pos, neg = np.ones(3, np.float32), -np.ones(3, np.float32)
    np.testing.assert_array_equal(jitted(pos), pos + 1)
    traced = len(calls)
    for _ in range(3):
        np.testing.assert_array_equal(jitted(pos), pos + 1)
    assert len(calls) == traced                      # replayed: the Python body did not run
    np.testing.assert_array_equal(jitted(neg), neg - 1)   # failed guard: traced again
    assert len(calls) == traced + 1
    np.testing.assert_array_equal(jitted(neg), neg - 1)
    np.testing.assert_array_equal(jitted(pos), pos + 1)
    assert len(calls) == traced + 1
    text = jitted.explain()
    assert "3 regions, 1 graph breaks, 1 guards" in text
    assert "bool()" in text and "traced for: np.True_, np.False_" in text.replace(
        "True, False", "np.True_, np.False_")
    assert "test_graph_breaks.py" in text


def test_breaks_are_logged_with_the_users_line(caplog):
    def g(x):
        if x.max() > 1:
            return x
        return x * 2.0

    with caplog.at_level(logging.DEBUG, logger="tilefuse.graph_breaks"):
        tilefuse.jit(g)(np.arange(4, dtype=np.float32))
    lines = [r.getMessage() for r in caplog.records if r.name == "tilefuse.graph_breaks"]
    assert any("test_graph_breaks.py" in m and "bool()" in m for m in lines), lines


def test_host_call_warns_once(caplog):
    def h(x):
        return np.sort(x) * 2.0

    jitted = tilefuse.jit(h)
    x = np.arange(5, dtype=np.float32)
    with caplog.at_level(logging.WARNING, logger="tilefuse.graph_breaks"):
        for _ in range(3):
            np.testing.assert_allclose(jitted(x), np.sort(x) * 2.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "np.sort" in r.getMessage()]
    assert len(warnings) == 1


def test_fullgraph_keeps_the_error():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(TraceError, match="data-dependent Python control flow"):
        tilefuse.jit(f, fullgraph=True)(np.ones(3, np.float32))

    def p(x):
        print(x)
        return x

    with pytest.raises(TraceError, match="print of a traced array"):
        tilefuse.jit(p, fullgraph=True)(np.ones(3, np.float32))

    def c(x):
        return np.sort(x)

    with pytest.raises(TraceError, match=r"np\.sort is not supported"):
        tilefuse.jit(c, fullgraph=True)(np.ones(3, np.float32))


def test_a_function_without_breaks_is_one_region():
    jitted = tilefuse.jit(lambda x: x * 2.0)
    jitted(np.ones(3, np.float32))
    assert "one region, no graph breaks" in jitted.explain()


def test_print_of_a_plain_value_happens_at_every_call():
    def f(x):
        print("called")
        return x + 1.0

    jitted = tilefuse.jit(f)
    x = np.ones(2, np.float32)
    printed = [_run(jitted, (x,))[1] for _ in range(3)]
    assert printed == ["called\n"] * 3


def test_str_and_repr_guard_on_the_value():
    def f(x):
        label = str(x.sum()) + "/" + repr(x.max())
        print(label)
        return x * 2.0

    jitted = tilefuse.jit(f)
    for values in ([1, 2], [3, 4], [1, 2]):
        x = np.array(values, np.float32)
        got, printed = _run(jitted, (x,))
        want, want_printed = _run(f, (x,))
        np.testing.assert_array_equal(got, want)
        assert printed == want_printed


def test_dump_has_a_folder_per_region_and_the_breaks(tmp_path):
    def f(x):
        y = x * 2.0
        print("y", y)
        return y + 1.0

    x = np.arange(3, dtype=np.float32)
    got, printed = _run(tilefuse.jit(f, dump=tmp_path), (x,))
    np.testing.assert_array_equal(got, x * 2 + 1)
    assert printed == _run(f, (x,))[1]
    assert (tmp_path / "region-00" / "00-captured.graph").exists()
    assert (tmp_path / "region-01" / "kernels.plan").exists()
    text = (tmp_path / "graph_breaks.txt").read_text()
    assert "break: print at" in text and "test_graph_breaks.py" in text


def test_exceptions_propagate_and_new_guard_values_are_limited():
    def f(x):
        if x.sum() > 100:
            raise ValueError("too big")
        return x * 2.0

    jitted = tilefuse.jit(f, max_recompiles=2)
    big, small = np.full(3, 100, np.float32), np.ones(3, np.float32)
    for _ in range(5):       # raising again and again is the function's answer, not a retrace
        with pytest.raises(ValueError, match="too big"):
            jitted(big)
        np.testing.assert_array_equal(jitted(small), small * 2)

    def g(x):
        return x * float(x.max())   # a guard per new value

    limited = tilefuse.jit(g, max_recompiles=2)
    for v in (1.0, 2.0, 3.0):
        x = np.full(2, v, np.float32)
        np.testing.assert_array_equal(limited(x), x * v)
    with pytest.raises(RecompileLimitError, match="guard"):
        limited(np.full(2, 4.0, np.float32))


def test_inputs_returned_as_they_are_and_keyword_arrays():
    def f(x, *, w):
        y = x @ w
        if y[0, 0] > 0:
            return y, x
        return y * 2.0, x

    jitted = tilefuse.jit(f)
    w = np.ones((3, 2), np.float32)
    for sign in (1, -1, 1):
        x = np.full((2, 3), sign, np.float32)
        for g, want in zip(jitted(x, w=w), f(x, w=w)):
            np.testing.assert_array_equal(g, want)
