"""Differential fuzzing of the cuda target: the fuzzer's random graphs
(:func:`tilefuse.fuzz.generator.generate_graph`, the CPU campaign's seeds) optimised by the
graph pipeline, built for cuda and run, against the reference interpreter on fresh random
inputs, with the CPU campaign's numerics contract (:func:`tilefuse.fuzz.check._compare`).

    python benchmarks/gpu_fuzz.py [--graphs N] [--seed S] [--budget SECONDS] [--out DIR]
                                  [--simulate]

On a GPU each graph runs through :func:`tilefuse.runtime.gpu.build_cuda` (PTX through the
driver, cuBLAS, CUDA graph replay: called twice, the second call replays); with
``--simulate`` (no GPU) the same program runs on the host (kernels through the loop-IR
interpreter, :mod:`tilefuse.runtime.gpu_simulate`), which checks the lowerings but not the
PTX. Verdicts: ok, mismatch, crash (at build or run), host-step (right, but a step ran on the
host) or skipped (the reference cannot run it). Each failing graph is written to
``DIR/gpu-fail-<index>.graph`` with its verdict in the header. A kernel fault (misaligned or
illegal address) loses the CUDA context, so the campaign stops at the first one. (The first
device run, before the fixes, lost it at one misaligned pad kernel and reported the 262 graphs
after it as crashes.)
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilefuse.errors import TilefuseError
from tilefuse.fuzz.campaign import _seeds
from tilefuse.fuzz.check import (
    Verdict,
    _compare,
    accumulates,
    loosest_float,
    random_inputs,
)
from tilefuse.fuzz.generator import GeneratorConfig, generate_graph
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.graph.printer import print_graph


def _crash(stage: str, err: BaseException) -> Verdict:
    where = traceback.extract_tb(err.__traceback__)[-1:]
    at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
    return Verdict("crash", stage, f"{type(err).__name__}: {err}{at}"[:2000])


def check_cuda(graph: Graph, inputs: list[np.ndarray], simulate_only: bool) -> Verdict:
    """One graph built for cuda and run (or simulated) against the reference."""
    from tilefuse.driver import optimize
    from tilefuse.runtime.gpu import HostGroup, build_cuda, build_gpu_program
    from tilefuse.runtime.gpu_simulate import simulate

    with np.errstate(all="ignore"):
        try:
            expected = interpret(graph, *inputs)
        except TilefuseError as err:
            return Verdict("skipped", "reference", str(err))
        try:
            optimised, _ = optimize(graph)
            if simulate_only:
                program = build_gpu_program(optimised)
                run = lambda: simulate(program, inputs)  # noqa: E731
            else:
                executable = build_cuda(optimised)
                program = executable.program
                run = lambda: executable(*inputs)  # noqa: E731
        except Exception as err:
            return _crash("build", err)
        calls = 1 if simulate_only else 2   # the second call replays the CUDA graph
        for call in range(calls):
            try:
                actual = [np.asarray(a) for a in run()]
            except Exception as err:
                return _crash(f"run{call}", err)
            verdict = _compare(actual, expected, accumulates(graph), f"compare{call}",
                               loosest_float(graph))
            if verdict.failed:
                return verdict
    hosted = [f"{s.group.name}: {s.reason}" for s in program.steps if isinstance(s, HostGroup)]
    return Verdict("host-step", "build", "; ".join(hosted)) if hosted else verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--simulate", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    kinds: Counter = Counter()
    details: Counter = Counter()
    for index in range(args.graphs):
        if time.perf_counter() - start > args.budget:
            break
        graph = generate_graph(np.random.default_rng([args.seed, index]), GeneratorConfig(),
                               name=f"fuzz{index}")
        input_seed, _ = _seeds(args.seed, index)
        verdict = check_cuda(graph, random_inputs(graph, input_seed), args.simulate)
        kinds[verdict.kind] += 1
        if verdict.failed:
            first = verdict.detail.strip().splitlines()[0][:200] if verdict.detail else ""
            details[f"{verdict.kind} at {verdict.stage}: {first}"] += 1
            print(f"graph {index}: {verdict.kind} at {verdict.stage}: {first}", flush=True)
            if "CUDA_ERROR_MISALIGNED_ADDRESS" in verdict.detail or \
                    "CUDA_ERROR_ILLEGAL_ADDRESS" in verdict.detail:
                # a kernel fault loses the CUDA context: every later check would fail with it
                print(f"graph {index}: the CUDA context is lost; stopping", flush=True)
                break
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"gpu-fail-{index}.graph").write_text(
                    f"# gpu fuzz: {verdict.kind} at {verdict.stage}\n# input-seed: "
                    f"{input_seed}\n# {verdict.detail[:1500]}\n" + print_graph(graph))
    total = sum(kinds.values())
    print(f"gpu fuzz ({'simulated' if args.simulate else 'device'}): {total} graphs in "
          f"{time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())), flush=True)
    for line, n in details.most_common(10):
        print(f"  {n}x {line}")
    return 1 if any(kinds[k] for k in ("mismatch", "crash", "host-step")) else 0


if __name__ == "__main__":
    sys.exit(main())
