"""Softmax and its siblings, the row kernel as built now against the same kernel built the old
way (a vector division per element, two-step exp scaling), the kernel without
:mod:`tilefuse.kernel.row_softmax` ("plain": a NaN-propagating max pass and the full exp), and
onnxruntime; one process, interleaved rounds, medians and bests (ms). Rows of 512 (W3), 77,
1000 and 4096.

    PYTHONPATH=. python benchmarks/row_kernels_ab.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import w3_numpy

import tilefuse
import tilefuse.codegen.math_lib as math_lib
import tilefuse.kernel.lower_rows as lower_rows
import tilefuse.loop
from tilefuse.codegen import compile_kernel, host_target
from tilefuse.codegen.jit import aligned_empty
from tilefuse.kernel.fusion import form_kernels
from tilefuse.kernel.schedule import default_schedule
from tilefuse.passes.decompose import decompose_composites

SHAPES = ((12, 512, 512), (8192, 77), (2048, 1000), (256, 4096))


def _kernel(x: np.ndarray, old: bool, plain: bool = False
            ) -> Callable[[np.ndarray, np.ndarray], None]:
    """The softmax row kernel for ``x``; ``old``: built as before the row-tail work (per-element
    division, scalar tails, two-step exp scaling); ``plain``: without row_softmax."""
    [group] = form_kernels(decompose_composites(
        tilefuse.jit(w3_numpy).lower(x).optimized)[0]).groups
    saved, saved_rows = math_lib.MathLib.__init__, lower_rows.softmax_rows
    if plain:
        lower_rows.softmax_rows = lambda g, k, make: (g, frozenset())
    if old:
        def plain(self, module, *, scalef=False):
            saved(self, module, scalef=False)
        math_lib.MathLib.__init__ = plain
    try:
        return compile_kernel(lower_rows.lower_rows(
            group, default_schedule(group, host_target()), cpu_tails=not old))
    finally:
        math_lib.MathLib.__init__ = saved
        lower_rows.softmax_rows = saved_rows


def _ort(x: np.ndarray) -> Callable[[], object]:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n in "xy"]
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "s",
                              info[:1], info[1:])
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), options,
        providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print("shape                new (median/best)  plain            old              "
          "onnxruntime       new/plain new/old new/ort")
    for shape in SHAPES:
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        xa = aligned_empty(shape, np.float32)
        xa[...] = x
        outs = [aligned_empty(shape, np.float32) for _ in range(3)]
        new, old = _kernel(x, old=False), _kernel(x, old=True)
        plain = _kernel(x, old=False, plain=True)
        impls = {"new": lambda k=new, a=xa, o=outs[0]: k(a, o),
                 "plain": lambda k=plain, a=xa, o=outs[2]: k(a, o),
                 "old": lambda k=old, a=xa, o=outs[1]: k(a, o), "ort": _ort(x)}
        for fn in impls.values():
            fn()
        reference = w3_numpy(x.astype(np.float64))
        for out in outs:
            np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6)
        calls = max(1, int(2e6 // x.size))
        times: dict[str, list[float]] = {k: [] for k in impls}
        for _ in range(args.rounds):
            for name, fn in impls.items():
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[name].append((time.perf_counter() - start) / calls * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        print(f"{'x'.join(map(str, shape)):<20} " + "  ".join(
            f"{med[k]:6.3f}/{best[k]:6.3f}" for k in impls)
            + f"   {med['new'] / med['plain']:5.2f}     {med['new'] / med['old']:5.2f}"
            f"   {med['new'] / med['ort']:5.2f}")


if __name__ == "__main__":
    main()
