"""The native builtin behind ``tilefuse.jit``'s small calls (tilefuse/runtime/fastcall.py):
every guard path — the right arrays go native, anything else falls back to the Python step
with its results and errors; outputs are reused only when released; the lock is honoured."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import GuardError
from tilefuse.runtime import fastcall
from tilefuse.testing import assert_close

pytestmark = pytest.mark.skipif(not fastcall.supported(), reason="needs CPython 3.8-3.12")


def _jitted(fn, *args):
    """``fn`` jitted and called twice (the builtin is made on the first fast-path hit)."""
    jitted = tilefuse.jit(fn)
    jitted(*args)
    jitted(*args)
    return jitted


def _entry(jitted):
    return jitted._last_hit[1]


def _counting(monkeypatch, jitted):
    """Counts the calls that take the Python step (the builtin's fallback)."""
    executable = _entry(jitted).executable
    calls = []
    original = type(executable).run_args

    def run_args(self, args):
        calls.append(len(args))
        return original(self, args)

    monkeypatch.setattr(type(executable), "run_args", run_args)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("shape", [(7,), (8, 128), (3, 5, 17)])
def test_the_builtin_matches_numpy_on_fresh_inputs(shape, dtype, monkeypatch):
    rng = np.random.default_rng(sum(shape))

    def fn(x, y):
        return (x * 3 + y).sum(axis=-1)

    make = lambda: (rng.standard_normal(shape) * 10).astype(dtype)  # noqa: E731
    x, y = make(), make()
    jitted = _jitted(fn, x, y)
    assert _entry(jitted).fast, "a small one-output function gets the builtin"
    fallbacks = _counting(monkeypatch, jitted)
    for _ in range(3):
        x, y = make(), make()
        assert_close(jitted(x, y), fn(x, y), reduction=True)
    assert not fallbacks


def test_a_held_output_is_never_overwritten_and_a_released_one_is_reused():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    jitted = _jitted(lambda x: x * 2.0, x)
    first = jitted(x)
    second = jitted(x + 1)
    assert first is not second and np.shares_memory(first, second) is False
    np.testing.assert_array_equal(first, x * 2)
    np.testing.assert_array_equal(second, (x + 1) * 2)
    view = second[1:]
    del second
    third = jitted(x + 2)    # a view of the last output is alive: a fresh one
    np.testing.assert_array_equal(view, ((x + 1) * 2)[1:])
    address = third.ctypes.data
    del third, view
    fourth = jitted(x + 3)   # released: the same buffer again
    assert fourth.ctypes.data == address
    np.testing.assert_array_equal(fourth, (x + 3) * 2)


def test_arrays_it_does_not_take_go_to_the_python_step(monkeypatch):
    x = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    jitted = _jitted(lambda x: np.exp(x) + 1.0, x)
    fallbacks = _counting(monkeypatch, jitted)
    wide = np.random.default_rng(2).standard_normal((6, 16)).astype(np.float32)
    for arg in (wide[:, ::2],                                     # not contiguous
                np.asfortranarray(np.ones((6, 8), np.float32))):  # Fortran order
        assert_close(jitted(arg), np.exp(arg) + 1.0)
    assert len(fallbacks) == 2
    assert_close(jitted(x), np.exp(x) + 1.0)
    assert len(fallbacks) == 2   # native again


def test_a_misaligned_input_raises_the_python_steps_error(monkeypatch):
    x = np.ones((4, 16), np.float32)
    jitted = _jitted(lambda x: x + 1.0, x)
    executable = _entry(jitted).executable
    monkeypatch.setattr(executable, "_align", {0: 64})
    entry = _entry(jitted)
    entry.fast = entry.fast_call()      # rebuilt with the alignment check
    raw = np.zeros(4 * 16 + 32, np.float32)
    offset = (64 - raw.ctypes.data % 64) // 4 % 16
    aligned = raw[offset:offset + 64].reshape(4, 16)
    np.testing.assert_array_equal(jitted(aligned), aligned + 1.0)
    misaligned = raw[offset + 1:offset + 65].reshape(4, 16)
    with pytest.raises(GuardError, match="aligned"):
        jitted(misaligned)


def test_the_builtin_takes_the_lock_or_falls_back(monkeypatch):
    x = np.ones(10, np.float32)
    jitted = _jitted(lambda x: x * 5.0, x)
    executable = _entry(jitted).executable
    fallbacks = _counting(monkeypatch, jitted)
    results = []
    with executable._lock:   # another thread's call in its kernels
        thread = threading.Thread(target=lambda: results.append(jitted(x)))
        thread.start()
        for _ in range(2000):   # the builtin fell back: the Python step waits for the lock
            if fallbacks:
                break
            time.sleep(0.005)
        assert fallbacks == [1] and thread.is_alive() and not results
    thread.join()
    np.testing.assert_array_equal(results[0], x * 5.0)


def test_threads_calling_at_once_get_their_own_results():
    x = np.zeros((4, 33), np.float32)
    jitted = _jitted(lambda x: np.tanh(x) * 2.0 + x, x)
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            a = rng.standard_normal((4, 33)).astype(np.float32)
            got = jitted(a)
            if not np.allclose(got, np.tanh(a) * 2.0 + a, rtol=1e-5, atol=1e-6):
                errors.append(f"thread {seed}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_what_does_not_qualify_has_no_builtin(monkeypatch):
    x = np.ones((8, 4), np.float32)
    two = _jitted(lambda x: (x + 1.0, x * 2.0), x)        # two outputs
    assert _entry(two).fast is False
    big = np.ones((1024, 512), np.float32)                 # 4 MiB in and out
    assert _entry(_jitted(lambda x: x + 1.0, big)).fast is False
    monkeypatch.setenv(fastcall.ENABLE_VAR, "0")
    assert _entry(_jitted(lambda x: x - 1.0, x)).fast is False


def test_a_zero_dimensional_result_and_an_error_inside_the_fallback():
    x = np.arange(1000, dtype=np.float32)
    jitted = _jitted(lambda x: x.sum(), x)
    assert _entry(jitted).fast
    np.testing.assert_allclose(jitted(x + 1), (x + 1).sum(), rtol=1e-6)
    executable = _entry(jitted).executable

    def broken(args):
        raise GuardError("from the Python step")

    executable.run_args = broken   # an instance attribute: the fallback's lookup finds it
    held = jitted(x)               # noqa: F841  (holds the output: the next call falls back)
    with pytest.raises(GuardError, match="from the Python step"):
        jitted(x)


def test_a_gather_goes_native_and_a_bad_index_raises_the_reference_error(monkeypatch):
    from tilefuse.errors import ShapeError

    x = np.random.default_rng(3).standard_normal((16, 40)).astype(np.float32)
    good = np.array([3, 0, -1, 15, 7], np.int64)
    jitted = _jitted(lambda x, i: np.take(x, i, axis=0), x, good)
    assert _entry(jitted).fast
    fallbacks = _counting(monkeypatch, jitted)
    np.testing.assert_array_equal(jitted(x, good), np.take(x, good, axis=0))
    assert not fallbacks
    with pytest.raises(ShapeError, match="index 16 is out of range"):
        jitted(x, np.array([3, 16, 0, 1, 2], np.int64))
    assert fallbacks == [2]                      # the Python step ran it again and raised
    np.testing.assert_array_equal(jitted(x, good[::-1].copy()), np.take(x, good[::-1], axis=0))
    assert fallbacks == [2]                      # the flag was cleared: native again
