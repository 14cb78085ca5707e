"""tilefuse.jit: the cache and its guards, recompile logs, static and keyword arguments, output
structures, lower(), dumps, targets, and the executable interface."""

from __future__ import annotations

import dataclasses
import logging
from collections import namedtuple

import numpy as np
import pytest
from jitcheck import arr, check_jit, rng

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, TilefuseError, TraceError
from tilefuse.frontend import jit
from tilefuse.graph.interpreter import interpret
from tilefuse.runtime import Executable, InterpreterExecutable, build_executable
from tilefuse.testing import assert_close


def scale_add(x, y):
    return x * 2.0 + y


def counts(jitted):
    info = jitted.cache_info()
    return info.hits, info.misses, info.compiles, info.entries


# ---- cache and guards ------------------------------------------------------------------------


def test_same_shapes_hit_the_cache_and_new_shapes_dtypes_ranks_recompile():
    g = rng("cache")
    f = jit(scale_add, dynamic=False)  # static shapes: every new shape recompiles
    x, y = arr(g, (4, 8)), arr(g, (8,))
    assert_close(f(x, y), scale_add(x, y))
    assert counts(f) == (0, 1, 1, 1)
    x2, y2 = arr(g, (4, 8)), arr(g, (8,))       # fresh values, same key
    assert_close(f(x2, y2), scale_add(x2, y2))
    assert counts(f) == (1, 1, 1, 1)
    for args in [(arr(g, (4, 9)), arr(g, (9,))),                 # new shape
                 (arr(g, (4, 8), DType.f64), y),                   # new dtype
                 (arr(g, (2, 4, 8)), y)]:                          # new rank
        assert_close(f(*args), scale_add(*args))
    assert counts(f) == (1, 4, 4, 4)
    f(x, y)
    assert counts(f) == (2, 4, 4, 4)


def test_cache_info_is_a_frozen_record_and_clear_cache_resets_it():
    f = jit(scale_add)
    f(arr(rng("info"), (3,)), arr(rng("info2"), (3,)))
    info = f.cache_info()
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.hits = 5  # type: ignore[misc]
    f.clear_cache()
    assert counts(f) == (0, 0, 0, 0)


def test_recompile_log_names_the_argument_and_the_change(caplog):
    g = rng("log")
    f = jit(scale_add, dynamic=False)  # static shapes: every new shape recompiles
    caplog.set_level(logging.DEBUG, logger="tilefuse.recompiles")
    caplog.set_level(logging.DEBUG, logger="tilefuse.guards")
    f(arr(g, (4, 8)), arr(g, (8,)))
    assert not [r for r in caplog.records if r.name == "tilefuse.recompiles"]  # a first compile
    f(arr(g, (4, 9)), arr(g, (9,)))
    recompiles = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompiles"]
    assert len(recompiles) == 1
    assert "arg 0 (x): f32[4,8] -> f32[4,9]" in recompiles[0]
    assert "arg 1 (y): f32[8] -> f32[9]" in recompiles[0]
    guards = [r.getMessage() for r in caplog.records if r.name == "tilefuse.guards"]
    assert len(guards) == 1 and "arg 0 (x)" in guards[0]


def test_recompile_log_compares_with_the_nearest_entry(caplog):
    g = rng("nearest")
    f = jit(scale_add, dynamic=False)  # static shapes: every new shape recompiles
    f(arr(g, (2, 3)), arr(g, (3,)))
    f(arr(g, (5, 7)), arr(g, (7,)))
    caplog.set_level(logging.DEBUG, logger="tilefuse.recompiles")
    f(arr(g, (5, 7), DType.f64), arr(g, (7,)))
    (message,) = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompiles"]
    assert "arg 0 (x): f32[5,7] -> f64[5,7]" in message
    assert "arg 1" not in message


def test_static_arguments_are_part_of_the_key(caplog):
    g = rng("static")
    f = jit(lambda x, n, mode: x * n if mode == "mul" else x + n)
    x = arr(g, (5,))
    assert_close(f(x, 2, "mul"), x * 2)
    assert_close(f(x, 3, "mul"), x * 3)
    assert_close(f(x, 3, "add"), x + 3)
    assert_close(f(x, 3.0, "add"), x + 3.0)   # 3.0 is not 3: it may trace differently
    caplog.set_level(logging.DEBUG, logger="tilefuse.recompiles")
    assert_close(f(x, True, "add"), x + True)
    assert "arg 1 (n): static 3 -> static True" in caplog.records[-1].getMessage()
    f(x, 2, "mul")
    assert counts(f) == (1, 5, 5, 5)


def test_static_argnames_and_keyword_arguments():
    g = rng("kw")

    def fn(x, *, w, axes):
        return np.transpose(x, axes) @ w

    f = jit(fn, static_argnames=("axes",))
    x, w = arr(g, (3, 5)), arr(g, (3, 2))
    assert_close(f(x, w=w, axes=(1, 0)), fn(x, w=w, axes=(1, 0)), reduction=True)
    assert_close(f(w=w, axes=(1, 0), x=x), fn(x, w=w, axes=(1, 0)), reduction=True)
    assert counts(f)[1:] == (2, 2, 2)  # positional and keyword x are different keys
    graph = f.lower(x, w=w, axes=(1, 0)).captured
    assert [v.name for v in graph.inputs] == ["x", "w"]


def test_unhashable_static_argument_is_a_trace_error():
    f = jit(lambda x, n: x * len(n), static_argnames="n")
    with pytest.raises(TraceError, match=r"arg 1 \(n\).*not hashable"):
        f(arr(rng("unhashable"), (3,)), [1, 2])


def test_static_argnames_must_name_parameters():
    with pytest.raises(TraceError, match="nope"):
        jit(scale_add, static_argnames=("nope",))


@pytest.mark.parametrize("value,words", [([1.0, 2.0], "a list is not accepted"),
                                         ({"a": 1}, "cannot pass a dict"),
                                         ((np.ones(2),), "an array inside a tuple")])
def test_unsupported_argument_kinds_are_rejected_naming_the_argument(value, words):
    f = jit(scale_add)
    with pytest.raises(TraceError, match=r"arg 1 \(y\)") as info:
        f(arr(rng("bad-arg"), (2,)), value)
    assert words in str(info.value)


def test_noncontiguous_inputs_share_the_entry_of_contiguous_ones():
    g = rng("strides")
    f = jit(scale_add)
    wide, y = arr(g, (4, 10)), arr(g, (5,))
    assert_close(f(wide[:, ::2], y), scale_add(wide[:, ::2], y))
    assert_close(f(np.ascontiguousarray(wide[:, 1::2]), y), scale_add(wide[:, 1::2], y))
    square = arr(g, (5, 5))
    assert_close(f(square.T, y), scale_add(square.T, y))
    assert counts(f)[1:] == (2, 2, 2)


# ---- outputs ---------------------------------------------------------------------------------

Pair = namedtuple("Pair", "total rows")


@pytest.mark.parametrize("fn", [
    lambda x: (x + 1, x * 2),
    lambda x: [x + 1, (x.sum(), [x[0]])],
    lambda x: Pair(x.sum(), x.sum(axis=1)),
    lambda x: (x,),
    lambda x: np.arange(3.0),   # an output that does not depend on the input
], ids=["tuple", "nested", "namedtuple", "one-tuple", "constant"])
def test_output_structures_are_kept(fn):
    check_jit(fn, arr(rng("outputs"), (3, 4)), reduction=True)


def test_returning_an_input_returns_a_fresh_copy():
    x = arr(rng("identity"), (3, 4))
    f = jit(lambda x: (x, x.reshape(12), x.T))
    out = f(x)
    for o in out:
        assert not np.shares_memory(o, x) and o.flags.writeable
    out[0][0, 0] = 99.0
    assert x[0, 0] != 99.0


def test_outputs_are_never_shared_between_calls():
    f = jit(lambda x: (np.full_like(x, 3.0), x + 1))
    x = arr(rng("fresh"), (2, 2))
    first = f(x)
    first[0][...] = -1.0
    second = f(x)
    assert_close(second[0], np.full_like(x, 3.0))


@pytest.mark.parametrize("value", [None, 3, "text", {"a": 1}])
def test_returning_a_non_array_is_rejected(value):
    def fn(x):
        return value

    with pytest.raises(TraceError, match="must return an array") as info:
        jit(fn)(arr(rng("non-array"), (2,)))
    assert info.value.loc is not None and info.value.loc.file == __file__


# ---- lower, dumps, targets -------------------------------------------------------------------


def test_lower_gives_both_graphs_as_text_without_running():
    g = rng("lower")
    f = jit(scale_add)
    x, y = arr(g, (4, 8)), arr(g, (8,))
    lowered = f.lower(x, y)
    assert counts(f) == (0, 0, 0, 0)
    assert str(lowered.captured).startswith("graph @scale_add(%x: f32[4,8], %y: f32[8])")
    assert "mul(" in str(lowered.optimized) and "add(" in str(lowered.optimized)
    assert str(lowered.captured) in str(lowered) and str(lowered.optimized) in str(lowered)
    f(x, y)
    cached = f.lower(x, y)
    assert cached.optimized is f.lower(x, y).optimized  # from the cache entry


def test_dump_argument_writes_the_pipeline_stages(tmp_path):
    f = jit(scale_add, dump=tmp_path / "dumps")
    f(arr(rng("dump"), (3,)), arr(rng("dump2"), (3,)))
    captured = (tmp_path / "dumps" / "00-captured.graph").read_text()
    assert captured.startswith("graph @scale_add(")


def test_dump_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_DUMP", str(tmp_path))
    jit(scale_add)(arr(rng("env"), (3,)), arr(rng("env2"), (3,)))
    assert (tmp_path / "00-captured.graph").exists()


def test_debug_mode_and_the_reference_target():
    check_jit(scale_add, arr(rng("debug"), (7,)), arr(rng("debug2"), (7,)), debug=True,
              target="reference")


def test_unknown_target_is_rejected_when_jitting():
    with pytest.raises(CompileError, match="unknown target 'tpu'"):
        jit(scale_add, target="tpu")


# ---- tracing across jitted functions ---------------------------------------------------------


def test_a_jitted_function_called_while_tracing_is_inlined():
    inner = jit(lambda a: np.tanh(a) * 2.0)
    outer = jit(lambda x: inner(x) + inner(x * 3.0))
    check_jit(lambda x: outer(x), arr(rng("nested"), (7,)))
    assert counts(inner) == (0, 0, 0, 0)


def test_jit_as_a_method_decorator_with_static_self():
    class Scaler:
        def __init__(self, factor):
            self.factor = factor

        @jit(static_argnames=("self",))
        def __call__(self, x):
            return x * self.factor

    x = arr(rng("method"), (5,))
    assert_close(Scaler(2.0)(x), x * 2.0)
    assert_close(Scaler(3.0)(x), x * 3.0)


def test_closed_over_arrays_are_captured_when_traced():
    w = arr(rng("closure"), (3,))
    f = jit(lambda x: x * w)
    x = arr(rng("closure-x"), (3,))
    expected = x * w
    assert_close(f(x), expected)
    w += 1.0  # documented: a cached entry keeps the value seen at trace time
    assert_close(f(x), expected)


# ---- executable interface --------------------------------------------------------------------


def test_build_executable_picks_the_backend_and_returns_fresh_outputs():
    from tilefuse.runtime.native import NativeExecutable

    g = rng("executable")
    x, y = arr(g, (3, 4)), arr(g, (4,))
    graph = jit(lambda x, y: (x + y, x, y.reshape(2, 2))).lower(x, y).optimized
    for target, kind in (("cpu", NativeExecutable), ("reference", InterpreterExecutable)):
        exe = build_executable(graph, target)
        assert isinstance(exe, Executable) and isinstance(exe, kind)
        assert exe.graph is graph
        outs = exe(x, y)
        for out, ref in zip(outs, interpret(graph, x, y)):
            assert_close(out, ref)
            assert not np.shares_memory(out, x) and not np.shares_memory(out, y)


def test_build_executable_rejects_unknown_targets():
    g = rng("unknown-target")
    graph = jit(scale_add).lower(arr(g, (2,)), arr(g, (2,))).optimized
    with pytest.raises(TilefuseError, match="unknown target"):
        build_executable(graph, "gpu")
