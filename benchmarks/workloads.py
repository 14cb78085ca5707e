"""The compass workloads, each written once as a NumPy function (what tilefuse.jit compiles), as a
torch function (eager and torch.compile) and as an ONNX graph (onnxruntime and OpenVINO).

The NumPy functions take the array module and ``scipy.special`` as keyword arguments
(``np=``, ``special=``): the same function runs through ``jax.numpy`` and ``jax.scipy.special``
under ``jax.jit`` (see :func:`jax_fn`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.special


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
    numpy_fn: Callable[..., np.ndarray]
    torch_fn: Callable[..., Any]
    onnx_model: Callable[[list[np.ndarray]], Any]   # inputs -> onnx.ModelProto
    flops: Callable[[list[np.ndarray]], float]
    bytes_moved: Callable[[list[np.ndarray]], float]
    reduction: bool = True   # compare with the looser tolerance
    dynamic: int = 1         # leading inputs that vary per call; the rest are weights (constants)


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def _nbytes(arrays: list[np.ndarray]) -> float:
    return float(sum(a.nbytes for a in arrays))


# ---- W1: gelu(x @ w + b) -------------------------------------------------------------------

def w1_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray, np: Any = np,
             special: Any = scipy.special) -> np.ndarray:
    y = x @ w + b
    return 0.5 * y * (1.0 + special.erf(y / math.sqrt(2.0)))


def w1_torch(x: Any, w: Any, b: Any) -> Any:
    import torch
    return torch.nn.functional.gelu(x @ w + b)


def w1_onnx(inputs: list[np.ndarray]) -> Any:
    from onnx import helper
    x, w, b = inputs
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Gelu", ["z"], ["out"])]
    return _model(nodes, {"x": x}, {"w": w, "b": b}, (x.shape[0], w.shape[1]))


# ---- W2: layer norm ------------------------------------------------------------------------

def w2_numpy(x: np.ndarray, g: np.ndarray, b: np.ndarray, np: Any = np,
             special: Any = scipy.special) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def w2_torch(x: Any, g: Any, b: Any) -> Any:
    import torch
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, 1e-5)


def w2_onnx(inputs: list[np.ndarray]) -> Any:
    from onnx import helper
    x, g, b = inputs
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["out"], axis=-1,
                              epsilon=1e-5)]
    return _model(nodes, {"x": x}, {"g": g, "b": b}, x.shape)


# ---- W3: softmax ---------------------------------------------------------------------------

def w3_numpy(x: np.ndarray, np: Any = np, special: Any = scipy.special) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def w3_torch(x: Any) -> Any:
    import torch
    return torch.softmax(x, dim=-1)


def w3_onnx(inputs: list[np.ndarray]) -> Any:
    from onnx import helper
    (x,) = inputs
    return _model([helper.make_node("Softmax", ["x"], ["out"], axis=-1)], {"x": x}, {}, x.shape)


# ---- W5: MLP 256-256-256-10, batch 1 -------------------------------------------------------

def w5_numpy(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray,
             w3: np.ndarray, b3: np.ndarray, np: Any = np, special: Any = scipy.special
             ) -> np.ndarray:
    h = np.maximum(x @ w1 + b1, 0.0)
    h = np.maximum(h @ w2 + b2, 0.0)
    return h @ w3 + b3


def w5_torch(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, w3: Any, b3: Any) -> Any:
    import torch
    h = torch.relu(x @ w1 + b1)
    h = torch.relu(h @ w2 + b2)
    return h @ w3 + b3


def w5_onnx(inputs: list[np.ndarray]) -> Any:
    from onnx import helper
    x, *params = inputs
    names = ["w1", "b1", "w2", "b2", "w3", "b3"]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["h1"]),
             helper.make_node("MatMul", ["h1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w3"], ["m3"]),
             helper.make_node("Add", ["m3", "b3"], ["out"])]
    return _model(nodes, {"x": x}, dict(zip(names, params)), (x.shape[0], params[-1].shape[0]))


# ---- W7: relu(2x+1) * sigmoid(x) -----------------------------------------------------------

def w7_numpy(x: np.ndarray, np: Any = np, special: Any = scipy.special) -> np.ndarray:
    return np.maximum(2.0 * x + 1.0, 0.0) * special.expit(x)


def w7_torch(x: Any) -> Any:
    import torch
    return torch.relu(2.0 * x + 1.0) * torch.sigmoid(x)


def w7_onnx(inputs: list[np.ndarray]) -> Any:
    from onnx import helper, numpy_helper
    (x,) = inputs
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["u"]),
             helper.make_node("Relu", ["u"], ["r"]),
             helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Mul", ["r", "s"], ["out"])]
    return _model(nodes, {"x": x}, {}, x.shape, extra=[two, one])


def jax_fn(w: Workload) -> Callable[..., Any]:
    """``w``'s NumPy function written through ``jax.numpy`` (not jitted)."""
    import jax.numpy as jnp
    import jax.scipy.special as jspecial

    def fn(*arrays: Any) -> Any:
        return w.numpy_fn(*arrays, np=jnp, special=jspecial)
    return fn


def _model(nodes: list[Any], inputs: dict[str, np.ndarray], weights: dict[str, np.ndarray],
           out_shape: tuple[int, ...], extra: list[Any] | None = None) -> Any:
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        nodes, "w",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
         for k, v in inputs.items()],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, list(out_shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()] + (extra or []))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


WORKLOADS: tuple[Workload, ...] = (
    Workload("W1", "gelu(x @ w + b), x[512,768] w[768,3072]",
             lambda r: [_f32(r, 512, 768), _f32(r, 768, 3072, scale=1 / 28), _f32(r, 3072)],
             w1_numpy, w1_torch, w1_onnx,
             lambda a: 2.0 * 512 * 768 * 3072, lambda a: _nbytes(a) + 512 * 3072 * 4),
    Workload("W2", "layer_norm x[2048,768]",
             lambda r: [_f32(r, 2048, 768), _f32(r, 768), _f32(r, 768)],
             w2_numpy, w2_torch, w2_onnx,
             lambda a: 8.0 * a[0].size, lambda a: 2.0 * a[0].nbytes),
    Workload("W3", "softmax over the last axis, x[12,512,512]",
             lambda r: [_f32(r, 12, 512, 512)],
             w3_numpy, w3_torch, w3_onnx,
             lambda a: 5.0 * a[0].size, lambda a: 2.0 * a[0].nbytes),
    Workload("W5", "MLP 256-256-256-10 with ReLU, batch 1",
             lambda r: [_f32(r, 1, 256), _f32(r, 256, 256, scale=1 / 16), _f32(r, 256),
                        _f32(r, 256, 256, scale=1 / 16), _f32(r, 256),
                        _f32(r, 256, 10, scale=1 / 16), _f32(r, 10)],
             w5_numpy, w5_torch, w5_onnx,
             lambda a: 2.0 * (256 * 256 * 2 + 256 * 10), _nbytes),
    Workload("W7", "relu(2x+1) * sigmoid(x) over 16M f32",
             lambda r: [_f32(r, 16 * 1024 * 1024)],
             w7_numpy, w7_torch, w7_onnx,
             lambda a: 6.0 * a[0].size, lambda a: 2.0 * a[0].nbytes, reduction=False),

)
