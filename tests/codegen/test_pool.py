"""The thread pool parallel loops run on (tilefuse.codegen.pool): thread counts, every
iteration exactly once under callers that race each other, forked children, and a caller that
does not wait for a worker that never comes."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tilefuse.codegen.jit import compile_kernel
from tilefuse.codegen.pool import pool_ir, pool_threads, thread_pool
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.loop import loop, thread_id, var
from tilefuse.loop.ir import BufferParam, LoopFunction, LoopKind


def counting_kernel():
    """``hits[i] += 1`` for i in 0..n, in a parallel loop."""
    out = BufferParam("T", DType.i64)
    fn = LoopFunction("count", (out,), ("n",),
                      loop("i", 0, var("n"), [out.store(var("i"), out.load(var("i")) + 1)],
                           kind=LoopKind.PARALLEL))
    return compile_kernel(fn)


def thread_ids_kernel():
    """``ids[i] = the id of the thread that ran iteration i``."""
    out = BufferParam("T", DType.i64)
    fn = LoopFunction("tid", (out,), ("n",),
                      loop("i", 0, var("n"), [out.store(var("i"), thread_id())],
                           kind=LoopKind.PARALLEL))
    return compile_kernel(fn)


def test_thread_count_comes_from_the_environment():
    assert pool_threads({"TILEFUSE_NUM_THREADS": "3", "OMP_NUM_THREADS": "5"}) == 3
    assert pool_threads({"OMP_NUM_THREADS": "4,2"}) == 4
    assert pool_threads({}) == len(os.sched_getaffinity(0))
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(CompileError, match="positive thread count"):
            pool_threads({"TILEFUSE_NUM_THREADS": bad})


def test_pool_ir_parks_idle_workers_in_the_kernel():
    text = pool_ir()
    assert "define void @\"tilefuse_parallel\"(ptr" in text
    assert "@\"syscall\"(i64 202" in text          # futex: idle workers sleep, not spin forever
    assert "@\"pthread_create\"" in text
    assert "cmpxchg" in text and "seq_cst" in text
    assert "define i64 @\"tilefuse_pool_wake\"()" in text


def test_wake_brings_every_worker():
    """A wake after the workers fell asleep returns once every thread checked in (a worker the
    OS is slow to schedule may miss one wake's bounded wait, not fifty in a row)."""
    pool = thread_pool()
    came = []
    while len(came) < 50 and pool.threads not in came:
        time.sleep(0.005)   # longer than SPIN_CYCLES: the workers sleep
        came.append(pool.wake())
    assert came[-1] == pool.threads and all(1 <= n <= pool.threads for n in came)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 513])
def test_many_short_loops_run_each_iteration_once(n):
    """Thousands of loops too short for a worker to arrive in time: a worker that sees a job
    already closed must not touch it, and no iteration may run twice or never."""
    kernel = counting_kernel()
    hits = np.zeros(n, np.int64)
    calls = 3000
    for _ in range(calls):
        kernel(hits, n)
    np.testing.assert_array_equal(hits, np.full(n, calls))


def test_callers_in_several_threads_share_the_pool_safely():
    """A caller that finds the pool taken by another runs its loop on its own thread."""
    kernel = counting_kernel()
    n, calls = 4099, 300
    results = [np.zeros(n, np.int64) for _ in range(4)]
    errors: list[BaseException] = []

    def run(hits: np.ndarray) -> None:
        try:
            for _ in range(calls):
                kernel(hits, n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for hits in results:
        np.testing.assert_array_equal(hits, np.full(n, calls))


def _forked_child(queue) -> None:
    """Runs the loop until a worker took a grain, for up to 20 s: the caller steals every grain
    a worker is too late for, and on a loaded machine a freshly started worker may not be
    scheduled for a while (200 calls, ~60 ms, were once not enough under a concurrent build).
    The calls follow each other closely (a sample of the ids is checked, not all 1 Mi of
    them, which took ~10 ms between calls): a worker that wakes late for one call is then
    still polling when the next one opens (a full ``np.unique`` between calls let a woken
    worker miss every call under a concurrent test run)."""
    kernel = thread_ids_kernel()
    ids = np.full(1 << 20, -1, np.int64)
    seen: set[int] = set()
    deadline = time.monotonic() + 20.0
    pool = thread_pool()
    # first until the child's own worker checks in (it polls afterwards, ready for a grain):
    # under a full test run a new thread was once not scheduled into a loop for 20 s
    while pool.wake() < 2 and time.monotonic() < deadline:
        pass
    while len(seen) < 2 and time.monotonic() < deadline:
        kernel(ids, ids.size)
        seen |= set(ids[::1024].tolist())
    queue.put(sorted(seen))


@pytest.mark.skipif(pool_threads() < 2, reason="one CPU: the pool has no worker")
def test_a_forked_child_gets_workers_of_its_own():
    thread_pool()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(queue,))
    child.start()
    seen = queue.get(timeout=120)
    child.join(30)
    assert child.exitcode == 0
    assert seen == [0, 1]


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_child(script: str, threads: int) -> list[str]:
    """The words ``script`` (formatted with the repository root) prints in a fresh process
    with ``threads`` pool threads; the process must exit cleanly."""
    env = {**os.environ, "TILEFUSE_NUM_THREADS": str(threads), "TILEFUSE_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", script.format(root=_ROOT)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=_ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


_CALLER_RUNS = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from tests.codegen.test_pool import thread_ids_kernel
from tilefuse.codegen.pool import thread_pool
import ctypes
kernel = thread_ids_kernel()
ids = np.full(100_003, -1, np.int64)
kernel(ids, ids.size)
print(thread_pool().threads, sorted(set(np.unique(ids).tolist())))
# a pool that believes it has a worker which never comes: the caller takes every grain
pool = thread_pool()
ctypes.CFUNCTYPE(None, ctypes.c_int64)(
    pool.engine.get_function_address("tilefuse_pool_set_workers"))(1)
ids[:] = -1
kernel(ids, ids.size)
print(sorted(set(np.unique(ids).tolist())))
print(pool.wake())   # waits for a worker that never comes only WAKE_CYCLES long
"""


def test_one_thread_runs_every_iteration_on_the_caller():
    """TILEFUSE_NUM_THREADS=1: no worker; the caller runs the whole loop. Then the pool is told
    it has a worker that never starts (a descheduled one, forever): the caller publishes the
    loop, takes every grain itself and returns without waiting for it; a wake waits for it
    only a bounded time."""
    assert _run_child(_CALLER_RUNS, threads=1) == ["1", "[0]", "[0]", "1"]


_STOP = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from tests.codegen.test_pool import counting_kernel
from tilefuse.codegen.pool import thread_pool
kernel = counting_kernel()
hits = np.zeros(4099, np.int64)
kernel(hits, hits.size)
print(thread_pool().stop())
kernel(hits, hits.size)      # after the workers left, the caller runs every loop alone
print(int(hits.min()), int(hits.max()))
"""


def test_workers_stop_and_loops_still_run_after():
    """What runs at interpreter exit: the workers are told to stop and all of them exit (their
    machine code is freed after); a loop called later still runs, on the caller."""
    assert _run_child(_STOP, threads=3) == ["True", "2", "2"]


_PIN = """
import os, threading
from tilefuse.codegen.pool import thread_pool
pool = thread_pool()
tids = pool.worker_tids
print(len(tids), all(os.path.isdir(f"/proc/self/task/{{t}}") for t in tids))
cpus = sorted(os.sched_getaffinity(0))
pinned = pool.pin(1)
me = threading.get_native_id()
print(pinned, os.sched_getaffinity(me) == {{cpus[1 % len(cpus)]}},
      [sorted(os.sched_getaffinity(t)) == [cpus[(1 + i) % len(cpus)]]
       for i, t in enumerate(tids, start=1)] == [True] * len(tids))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
@pytest.mark.parametrize("threads", [1, 3])
def test_pin_puts_the_caller_and_each_worker_on_its_own_cpu(threads):
    """The pool knows its workers' thread ids; pin(1) puts the calling thread on the second
    CPU of the mask and worker i on the CPU i after it, wrapping (a fresh process: pinning
    the test's own would outlast the test). One CPU or one thread: nothing to pin apart."""
    words = _run_child(_PIN, threads=threads)
    assert words[:2] == [str(threads - 1), "True"]
    can = len(os.sched_getaffinity(0)) >= 2
    assert words[2:] == [str(can), "True", "True"]   # one CPU: already where pin would put it
