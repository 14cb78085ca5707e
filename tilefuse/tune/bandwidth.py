"""Memory bandwidth per cache level: the memory roofs a kernel is bounded by.

One DRAM copy peak is the wrong roof for a kernel whose data sits in L1 or L2: such a kernel
runs 3-10x faster than DRAM allows, and showed 150-394 % of its bound. Here each level of the
hierarchy gets its own roof: a native read stream and a native copy stream (read + write) whose
working set is half the level's capacity, run on every usable core at once (the kernels run
on all of them, and L1/L2 are per core, so a level's capacity here is the sum over the cores
that share none of it), repeated inside one native call until it takes ~2 ms so that the call's
cost does not count. A level's bandwidth is the faster of the two streams (a kernel reading far
more than it writes moves bytes at the read rate), so it is a roof, not a typical rate.

:func:`cache_sizes` reads the capacities from sysfs (defaults when it cannot);
:class:`StreamProbe` compiles the two streams once and measures them.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tilefuse.codegen.target import host_target, target_machine, usable_cpus

DEFAULT_SIZES = {"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}
"""Per-core L1/L2 and shared L3 bytes used when sysfs does not say (x86-64 servers)."""


@dataclass(frozen=True)
class Level:
    """A level of the memory hierarchy: its name, the bytes of working set that fit in it
    (summed over the cores a kernel runs on) and its measured bandwidth (bytes/s, read +
    write). DRAM has an infinite capacity."""

    name: str
    capacity: float
    bandwidth: float


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cache_sizes(cores: int | None = None,
                root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, int]:
    """Bytes of data cache per level (``"L1"``, ``"L2"``, ``"L3"``) available to a kernel
    running on ``cores`` cores: a per-core cache counts once per core, a shared one once."""
    cores = cores or usable_cpus()
    sizes: dict[str, int] = {}
    try:
        for index in sorted(root.glob("index*")):
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = f"L{int((index / 'level').read_text())}"
            size = _parse_size((index / "size").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            private = "," not in shared and "-" not in shared
            sizes[level] = size * (cores if private else 1)
    except (OSError, ValueError):
        sizes = {}
    if not sizes:
        sizes = {k: v * (cores if k != "L3" else 1) for k, v in DEFAULT_SIZES.items()}
    return dict(sorted(sizes.items()))


_BLOCK = 128
"""Floats per iteration of a stream (8 vectors of 16 lanes: 512 bytes)."""


def _stream_ir(triple: str, layout: str) -> str:
    """Two functions: ``tf_bw_read(src, n, reps)`` adds up ``n`` i32 (a multiple of
    :data:`_BLOCK`) ``reps`` times into eight vector accumulators carried across the
    repetitions (so no pass can be hoisted or dropped), and ``tf_bw_copy(src, dst, n, reps)``
    copies them ``reps`` times (src and dst may alias, so no copy is dropped either)."""
    loads = "\n".join(
        f"  %p{j} = getelementptr <16 x i32>, ptr %base, i64 {j}\n"
        f"  %v{j} = load <16 x i32>, ptr %p{j}, align 4\n"
        f"  %a{j}n = add <16 x i32> %a{j}, %v{j}" for j in range(8))
    phis = "\n".join(f"  %a{j} = phi <16 x i32> [ %r{j}, %outer ], [ %a{j}n, %inner ]"
                     for j in range(8))
    rphis = "\n".join(f"  %r{j} = phi <16 x i32> [ zeroinitializer, %entry ], "
                      f"[ %a{j}n, %inner_end ]" for j in range(8))
    total = " ".join(f"%s{j} = add <16 x i32> %s{j - 1}, %a{j}n\n " for j in range(1, 8))
    copies = "\n".join(
        f"  %cs{j} = getelementptr <16 x i32>, ptr %sbase, i64 {j}\n"
        f"  %cv{j} = load <16 x i32>, ptr %cs{j}, align 4\n"
        f"  %cd{j} = getelementptr <16 x i32>, ptr %dbase, i64 {j}\n"
        f"  store <16 x i32> %cv{j}, ptr %cd{j}, align 4" for j in range(8))
    return f"""
target triple = "{triple}"
target datalayout = "{layout}"
declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)

define i32 @tf_bw_read(ptr %src, i64 %n, i64 %reps) {{
entry:
  br label %outer
outer:
  %rep = phi i64 [ 0, %entry ], [ %repn, %inner_end ]
{rphis}
  br label %inner
inner:
  %i = phi i64 [ 0, %outer ], [ %in, %inner ]
{phis}
  %base = getelementptr i32, ptr %src, i64 %i
{loads}
  %in = add i64 %i, {_BLOCK}
  %more = icmp ult i64 %in, %n
  br i1 %more, label %inner, label %inner_end
inner_end:
  %repn = add i64 %rep, 1
  %again = icmp ult i64 %repn, %reps
  br i1 %again, label %outer, label %done
done:
  %s0 = add <16 x i32> %a0n, zeroinitializer
 {total}
  %sum = call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> %s7)
  ret i32 %sum
}}

define void @tf_bw_copy(ptr %src, ptr %dst, i64 %n, i64 %reps) {{
entry:
  br label %outer
outer:
  %rep = phi i64 [ 0, %entry ], [ %repn, %inner_end ]
  br label %inner
inner:
  %i = phi i64 [ 0, %outer ], [ %in, %inner ]
  %sbase = getelementptr i32, ptr %src, i64 %i
  %dbase = getelementptr i32, ptr %dst, i64 %i
{copies}
  %in = add i64 %i, {_BLOCK}
  %more = icmp ult i64 %in, %n
  br i1 %more, label %inner, label %inner_end
inner_end:
  %repn = add i64 %rep, 1
  %again = icmp ult i64 %repn, %reps
  br i1 %again, label %outer, label %done
done:
  ret void
}}
"""


class StreamProbe:
    """The read and copy streams, compiled once for the host, and buffers per thread."""

    CALL_SECONDS = 2e-3
    """How long one timed native call runs (its repetitions amortise the call's cost)."""

    def __init__(self, threads: int | None = None):
        import llvmlite.binding as llvm

        target = host_target()
        tm = target_machine(target)
        module = llvm.parse_assembly(_stream_ir(target.triple, str(tm.target_data)))
        module.verify()
        self._engine = llvm.create_mcjit_compiler(module, tm)  # keeps the code alive
        self._engine.finalize_object()
        self._read = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64)(
            self._engine.get_function_address("tf_bw_read"))
        self._copy = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64)(
            self._engine.get_function_address("tf_bw_copy"))
        self.threads = threads or usable_cpus()

    @staticmethod
    def _buffer(nbytes: int) -> np.ndarray:
        raw = np.ones(nbytes // 4 + 16, np.int32)
        skip = (-raw.ctypes.data % 64) // 4
        return raw[skip:skip + nbytes // 4]

    def _run(self, bufs: list[tuple[np.ndarray, np.ndarray | None]], copy: bool,
             reps: int) -> float:
        """Seconds of all threads streaming their ``bufs`` ``reps`` times at once."""
        n = bufs[0][0].size

        def call(t: int, times: int) -> None:
            src, dst = bufs[t]
            if dst is not None:
                self._copy(src.ctypes.data, dst.ctypes.data, n, times)
            else:
                self._read(src.ctypes.data, n, times)

        return slowest_thread_seconds(self.threads, call, 1, reps)

    def bandwidth(self, working_set: int, repeats: int) -> float:
        """Bytes/s (read + write) of the faster stream over ``working_set`` bytes in all,
        split among the threads; the best of ``repeats`` timed calls each."""
        per_thread = max(4 * _BLOCK * 2, working_set // self.threads)
        best = 0.0
        for copy in (False, True):
            n = max(_BLOCK, per_thread // 4 // (2 if copy else 1) // _BLOCK * _BLOCK)
            bufs = [(self._buffer(4 * n), self._buffer(4 * n) if copy else None)
                    for _ in range(self.threads)]
            moved = 4 * n * (2 if copy else 1)
            seconds = self._run(bufs, copy, 1)
            reps = max(1, int(self.CALL_SECONDS / max(seconds, 1e-7)))
            for _ in range(repeats):
                seconds = self._run(bufs, copy, reps)
                best = max(best, self.threads * moved * reps / seconds)
        return best

    def read_bandwidth(self, array: np.ndarray, repeats: int) -> float:
        """Bytes/s of the read stream over ``array`` (a DRAM-sized buffer already touched,
        split among the threads), the best of ``repeats`` passes."""
        flat = array.reshape(-1).view(np.int32)
        n = flat.size // self.threads // _BLOCK * _BLOCK
        if n == 0:
            return 0.0
        bufs = [(flat[t * n:(t + 1) * n], None) for t in range(self.threads)]
        return max(self.threads * 4 * n / self._run(bufs, False, 1) for _ in range(repeats))

    def levels(self, sizes: dict[str, int], repeats: int) -> list[Level]:
        """A :class:`Level` per cache level of ``sizes``, streaming half its capacity."""
        return [Level(name, float(size), self.bandwidth(size // 2, repeats))
                for name, size in sizes.items()]


def slowest_thread_seconds(threads: int, call: Callable[[int, int], None], warm: int,
                           reps: int) -> float:
    """Seconds of the slowest of ``threads`` threads each running ``call(t, reps)`` at once,
    after ``call(t, warm)`` (code, stack and data warm) and a barrier: a whole-machine rate
    is work over this time (the peak probes of this module and :mod:`tilefuse.tune.fma_peak`)."""
    barrier = threading.Barrier(threads)
    spans = [0.0] * threads

    def work(t: int) -> None:
        call(t, warm)
        barrier.wait()
        start = time.perf_counter()
        call(t, reps)
        spans[t] = time.perf_counter() - start

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return max(spans)


__all__ = ["DEFAULT_SIZES", "Level", "StreamProbe", "cache_sizes", "slowest_thread_seconds"]

