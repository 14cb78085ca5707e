"""Runs every workload with tilefuse and its peers, prints a table of ratios, writes JSON, and
regenerates the tables of docs/PERFORMANCE.md.

    python benchmarks/run.py                         # everything: compass, light ONNX models, BERT
    python benchmarks/run.py --only W1,bert --rounds 21 --json bench.json
    python benchmarks/run.py --write-docs            # measure, then rewrite docs/PERFORMANCE.md
    python benchmarks/run.py --from-json bench.json --write-docs   # rewrite from a saved run
    python benchmarks/run.py --quick                 # a smoke run: few rounds, a small subset

Workloads: the compass set W1, W2, W3, W5, W7 (``workloads.py``; NumPy, torch eager,
torch.compile with Inductor, onnxruntime, jax.jit (the same NumPy function through jax.numpy)
and OpenVINO (the same ONNX graph, f32) as peers), the light ONNX models shipped with the onnx
package (onnxruntime and OpenVINO as peers; one tilefuse cannot import yet is reported as not
supported) and a BERT-base encoder layer (``model_workloads.py``). The peers' versions are
recorded in the JSON's ``meta`` and under the generated table.

Every implementation's output is checked before timing. Times are medians over rounds; in each
round every implementation runs once (or a batch of calls for microsecond workloads), in turn,
so that noise from the shared machine hits all of them alike. NumPy alone is timed in rounds
of its own (``harness.SEPARATE``).

Thread pools: tilefuse (its own, ``tilefuse.codegen.pool``: idle workers poll ~0.1 ms, then
sleep), torch (its OpenMP runtime) and onnxruntime (its own pool) live in one process here. By
default the last two keep their idle threads spinning for a while after a parallel region, so
on 2 cores whichever runs next in a round finds its cores taken by another runtime's spinning
threads. The harness therefore shortens the spin: GOMP_SPINCOUNT is set to
``tilefuse.codegen.target.SPIN_COUNT`` (3000) before any runtime loads, so torch's OpenMP
runtime reads it: threads stay hot between back-to-back calls but sleep within microseconds;
and onnxruntime's
`session.intra_op.allow_spinning=0`. Sleeping pools (OMP_WAIT_POLICY=PASSIVE) were tried and
rejected: they cost torch eager ~1 ms per call on W5. (Until 2026-12-01 the spin was 20,000:
on a 128×768×768 matmul, onnxruntime's call after tilefuse's then took 1.2 ms instead of 0.8,
so figures before that date may favour tilefuse on small workloads.)
"""

from __future__ import annotations

import os

from tilefuse.codegen.target import SPIN_COUNT

os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))  # before any OpenMP runtime loads

import argparse
import datetime
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report
from harness import run_workload
from model_workloads import model_workloads, run_model_workload
from workloads import WORKLOADS

from tilefuse.cli.progress import Bar

DOCS = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"
QUICK = ("W5", "light_squeezenet")  # small, fast to compile; the --quick subset


def _selected(only: set[str], quick: bool) -> tuple[list[Any], list[Any]]:
    wanted = set(QUICK) if quick and not only else only
    compass = [w for w in WORKLOADS if not wanted or w.name in wanted]
    models = [w for w in model_workloads() if not wanted or w.name in wanted]
    unknown = wanted - {w.name for w in WORKLOADS} - {w.name for w in model_workloads()}
    if unknown:
        raise SystemExit(f"unknown workloads: {', '.join(sorted(unknown))}")
    return compass, models


def measure(args: argparse.Namespace) -> dict[str, Any]:
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    compass, models = _selected(only, args.quick)
    rounds = 2 if args.quick and args.rounds is None else (args.rounds or 15)
    threads = args.threads or os.cpu_count() or 1
    show = True if args.progress else None
    rng = np.random.default_rng(0)
    results = []
    for w in compass:
        print(f"{w.name}: {w.title}", flush=True)
        with Bar(f"  {w.name}", rounds + rounds, show=show) as bar:  # interleaved + NumPy alone
            results.append(run_workload(w, rounds, rng, threads, on_round=bar.step))
    for m in models:
        print(f"{m.name}: {m.title}", flush=True)
        record = run_model_workload(m, rounds, threads, progress=show)
        if record["status"] != "ok":
            print(f"  {record['status']}: {record.get('note', '')}", flush=True)
        results.append(record)
    meta = {"date": datetime.date.today().isoformat(), "machine": report.machine(),
            "threads": threads, "rounds": rounds, "quick": bool(args.quick),
            "versions": report.peer_versions(),
            "source": "a run of benchmarks/run.py"}
    return {"meta": meta, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated workload names "
                        "(W1, light_resnet50, bert, ...)")
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (15; quick: 2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of every implementation (default: all cores)")
    parser.add_argument("--quick", action="store_true",
                        help=f"few rounds on a small subset ({', '.join(QUICK)})")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="measure nothing: use the results saved in this file")
    parser.add_argument("--write-docs", nargs="?", const=DOCS, default=None, type=Path,
                        metavar="PATH", help="rewrite the generated part of docs/PERFORMANCE.md")
    parser.add_argument("--progress", action="store_true", help="progress bars off a terminal")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    if args.from_json is not None:
        payload = report.load_json(args.from_json)
        payload["meta"]["source"] = args.from_json.name
    else:
        payload = measure(args)
    print()
    print(report.table(payload["results"]))
    if args.json:
        report.save_json(payload, args.json)
    if args.write_docs:
        report.write_docs(payload, args.write_docs)
        print(f"\nwrote the generated tables of {args.write_docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
