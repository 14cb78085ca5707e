"""Timing the compass workloads (``workloads.py``): tilefuse and every peer in one process,
checked against NumPy, then interleaved round by round (:func:`tilefuse.cli.timing.
interleaved_medians`), NumPy alone in rounds of its own. See ``run.py`` for the thread settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from workloads import Workload, jax_fn

import tilefuse
from tilefuse.cli.timing import interleaved_medians

# Timed in rounds of their own, after the interleaved ones: NumPy's BLAS (OpenBLAS) keeps its
# threads busy-waiting after every call with no setting to stop it, which halved the speed of
# whatever ran next on 2 cores (tilefuse's W1 went from 8 to 18 ms interleaved with it).
SEPARATE = ("numpy",)


def compass_peers(w: Workload, inputs: list[np.ndarray], threads: int
                  ) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """tilefuse, NumPy, torch eager, torch.compile, onnxruntime, jax.jit and OpenVINO on
    ``inputs``; the peers that are not installed, with the reason. Weights are constants for
    tilefuse and jax (closed over), initializers for onnxruntime and OpenVINO."""
    dyn, weights = inputs[:w.dynamic], inputs[w.dynamic:]
    impls: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    jitted = tilefuse.jit(lambda *a: w.numpy_fn(*a, *weights))
    impls["tilefuse"] = lambda: jitted(*dyn)
    impls["numpy"] = lambda: w.numpy_fn(*inputs)
    try:
        import torch
        torch.set_num_threads(threads)
        targs = [torch.from_numpy(a) for a in inputs]
        impls["torch"] = lambda: w.torch_fn(*targs)
        compiled = torch.compile(w.torch_fn)
        impls["inductor"] = lambda: compiled(*targs)
    except ImportError:
        skipped["torch"] = skipped["inductor"] = "torch not installed"
    try:
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(w.onnx_model(inputs).SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        feed = {"x": dyn[0]}
        impls["onnxruntime"] = lambda: session.run(None, feed)[0]
    except ImportError:
        skipped["onnxruntime"] = "onnxruntime not installed"
    try:
        import jax

        fn = jax_fn(w)
        jitted_jax = jax.jit(lambda *a: fn(*a, *weights))
        impls["jax"] = lambda: jitted_jax(*dyn).block_until_ready()
    except ImportError:
        skipped["jax"] = "jax not installed"
    try:
        from tilefuse.cli.bench import openvino_runner

        impls["openvino"] = openvino_runner(w.onnx_model(inputs).SerializeToString(), dyn,
                                            threads)
    except ImportError:
        skipped["openvino"] = "openvino not installed"
    return impls, skipped


def _as_numpy(out: Any) -> np.ndarray:
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def _check(w: Workload, out: Any, expected: np.ndarray) -> str:
    from tilefuse.testing import assert_close

    try:
        assert_close(_as_numpy(out).reshape(expected.shape), expected.astype(np.float32),
                     reduction=w.reduction)
    except AssertionError as err:
        return f"differs: {str(err).strip().splitlines()[-1][:120]}"
    return "ok"


def run_workload(w: Workload, rounds: int, rng: np.random.Generator, threads: int,
                 on_round: Callable[[], None] | None = None) -> dict[str, Any]:
    """One compass workload's result record (see ``report.py``)."""
    inputs = w.make_inputs(rng)
    impls, skipped = compass_peers(w, inputs, threads)
    expected = w.numpy_fn(*inputs)
    checks = {name: _check(w, fn(), expected) for name, fn in impls.items()}  # + warm-up
    medians = interleaved_medians(impls, rounds, separate=SEPARATE, on_round=on_round)
    return {"workload": w.name, "title": w.title, "group": "compass", "status": "ok",
            "median_s": medians, "checks": checks, "skipped": skipped,
            "gflops": {k: w.flops(inputs) / v / 1e9 for k, v in medians.items()},
            "gbps": {k: w.bytes_moved(inputs) / v / 1e9 for k, v in medians.items()}}
