"""Row kernels (softmax, log-softmax, layer norm, RMS norm) against their memory roof and
onnxruntime: each through ``tilefuse.jit``, the roof the bandwidth of the cache level that
holds the kernel's working set (input + output), measured here by
:class:`tilefuse.tune.bandwidth.StreamProbe` (L1, L2, L3 at half their capacity; DRAM at 4x
the L3). One process, interleaved rounds, best and median per call.

    PYTHONPATH=. python benchmarks/row_roofs.py [--rounds 11] [--only softmax]

Columns: bytes moved (input read once, output written once), the level and its roof time,
tilefuse's best time and its share of the roof (100 % = at the roof), onnxruntime's best
time and tilefuse / onnxruntime. The 64x512x512 shape's output is past half the L3: its
write pass uses streaming stores (:mod:`tilefuse.kernel.row_store`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import tilefuse
from tilefuse.tune.bandwidth import StreamProbe, cache_sizes

SHAPES = ((12, 512, 512), (2048, 768), (8192, 77), (64, 512, 512))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def rms_norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * g


KERNELS: dict[str, tuple[Callable[..., np.ndarray], int, str | None]] = {
    # name -> (function, parameter inputs after x, the ONNX op onnxruntime runs or None)
    "softmax": (softmax, 0, "Softmax"),
    "log_softmax": (log_softmax, 0, "LogSoftmax"),
    "layer_norm": (layer_norm, 2, "LayerNormalization"),
    "rms_norm": (rms_norm, 1, None),
}


def _ort(op: str, args: list[np.ndarray]) -> Callable[[], object]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    x, *params = args
    names = ["g", "b"][:len(params)]
    attrs = {"axis": -1, **({"epsilon": 1e-5} if op == "LayerNormalization" else {})}
    node = helper.make_node(op, ["x", *names], ["y"], **attrs)
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n in "xy"]
    graph = helper.make_graph([node], "r", info[:1], info[1:],
                              initializer=[numpy_helper.from_array(p, n)
                                           for n, p in zip(names, params)])
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), options,
        providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    args = parser.parse_args()
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    sizes = cache_sizes()
    probe = StreamProbe()
    roofs = {name: probe.bandwidth(size // 2, 3) for name, size in sizes.items()}
    roofs["DRAM"] = probe.bandwidth(4 * sizes.get("L3", 32 << 20), 2)
    print("roofs (GB/s): " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in roofs.items()))
    print(f"{'kernel':<12}{'shape':<14}{'MB':>6} {'level':<5}{'roof ms':>8}{'tilefuse ms':>12}"
          f"{'of roof':>8}{'ort ms':>8}{'tf/ort':>7}")
    rng = np.random.default_rng(0)
    for name, (fn, nparams, op) in KERNELS.items():
        if only and name not in only:
            continue
        for shape in SHAPES:
            x = rng.standard_normal(shape, dtype=np.float32)
            params = [rng.standard_normal(shape[-1], dtype=np.float32) for _ in range(nparams)]
            call_args = [x, *params]
            jitted = tilefuse.jit(fn)
            want = fn(*[a.astype(np.float64) for a in call_args])
            np.testing.assert_allclose(jitted(*call_args), want, rtol=1e-4, atol=1e-4)
            impls = {"tilefuse": lambda j=jitted, a=call_args: j(*a)}
            if op is not None:
                impls["ort"] = _ort(op, call_args)
            moved = 2 * x.nbytes
            level = next((k for k, v in sizes.items() if moved <= v), "DRAM")
            roof = moved / roofs[level]
            calls = max(1, int(2e7 // x.size))
            samples: dict[str, list[float]] = {k: [] for k in impls}
            for f in impls.values():
                f()
            for _ in range(args.rounds):
                for k, f in impls.items():
                    start = time.perf_counter()
                    for _ in range(calls):
                        f()
                    samples[k].append((time.perf_counter() - start) / calls)
            best = {k: min(v) for k, v in samples.items()}
            med = {k: statistics.median(v) for k, v in samples.items()}
            ort = f"{best['ort'] * 1e3:8.3f}{best['tilefuse'] / best['ort']:7.2f}" \
                if "ort" in best else f"{'–':>8}{'–':>7}"
            print(f"{name:<12}{'x'.join(map(str, shape)):<14}{moved / 1e6:6.1f} {level:<5}"
                  f"{roof * 1e3:8.3f}{best['tilefuse'] * 1e3:12.3f}"
                  f"{100 * roof / best['tilefuse']:7.0f}%{ort}"
                  f"   (medians {med['tilefuse'] * 1e3:.3f}"
                  + (f" / {med['ort'] * 1e3:.3f})" if "ort" in med else ")"), flush=True)


if __name__ == "__main__":
    main()
