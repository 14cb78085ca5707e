"""Each converted ONNX op, in a one-node model, against onnxruntime on random inputs; opset
variants of Softmax, ReduceSum, Split, Clip, Squeeze, Unsqueeze, Slice and Pad."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnxcheck import F32, I64, arr, compare, init, make_model, single

import tilefuse.onnx

# ---- elementwise -----------------------------------------------------------------------------

UNARY = ["Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Relu", "Erf", "Softplus", "Floor", "Ceil",
         "Round", "Sign", "Sin", "Cos", "Softsign", "HardSigmoid", "HardSwish", "Selu", "Elu",
         "LeakyRelu"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op: str) -> None:
    single(op, {"x": arr([3, 5])})


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Reciprocal"])
def test_unary_positive(op: str) -> None:
    single(op, {"x": arr([4, 3], low=0.25, high=3.0)})


def test_activation_attrs() -> None:
    single("LeakyRelu", {"x": arr([7])}, alpha=0.3)
    single("Elu", {"x": arr([7])}, alpha=0.5)


@pytest.mark.parametrize(("op", "opset", "attrs"), [
    ("Celu", 12, {"alpha": 0.7}), ("Celu", 12, {}), ("ThresholdedRelu", 10, {"alpha": 0.4}),
    ("Mish", 18, {}), ("Sinh", 9, {}), ("Cosh", 9, {}), ("Tan", 7, {})])
def test_composed_activations(op: str, opset: int, attrs: dict) -> None:
    single(op, {"x": arr([1, 7, 3], low=-1.5, high=1.5)}, opset=opset, **attrs)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset20(approximate: str) -> None:
    single("Gelu", {"x": arr([2, 8])}, opset=20, approximate=approximate)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Equal", "Less", "LessOrEqual",
                                "Greater", "GreaterOrEqual"])
def test_binary_broadcast(op: str) -> None:
    single(op, {"a": arr([2, 3, 4]), "b": arr([3, 1])})


def test_pow_and_prelu() -> None:
    single("Pow", {"a": arr([3, 4], low=0.5, high=2.0), "b": arr([4])})
    single("PRelu", {"x": arr([2, 3, 4])}, consts={"slope": arr([3, 1])})


def test_integer_div_truncates_and_mod() -> None:
    a = arr([5, 6], np.int32)
    b = arr([5, 6], np.int32)
    b[b == 0] = 3
    single("Div", {"a": a, "b": b})
    single("Mod", {"a": a, "b": b})
    single("Mod", {"a": arr([4, 4]), "b": arr([4, 4], low=0.5, high=2.0)}, fmod=1)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op: str) -> None:
    single(op, {"a": arr([3, 4], bool), "b": arr([4], bool)})


def test_not_where_and_int_equal() -> None:
    single("Not", {"x": arr([3, 4], bool)})
    single("Where", {"c": arr([3, 4], bool), "a": arr([3, 4]), "b": arr([4])})
    single("Equal", {"a": arr([6], np.int64), "b": arr([6], np.int64)})


@pytest.mark.parametrize("op", ["Sum", "Mean", "Min", "Max"])
def test_variadic(op: str) -> None:
    single(op, {"a": arr([2, 3]), "b": arr([3]), "c": arr([2, 1])})


def test_cast() -> None:
    from onnx import TensorProto
    single("Cast", {"x": arr([3, 4])}, to=TensorProto.INT32)
    single("Cast", {"x": arr([3, 4], np.int64)}, to=TensorProto.FLOAT)
    single("Cast", {"x": arr([3, 4])}, to=TensorProto.BOOL)


def test_clip_opset_variants() -> None:
    single("Clip", {"x": arr([4, 5])}, opset=10, min=-0.5, max=0.75)
    single("Clip", {"x": arr([4, 5])}, opset=13,
           consts={"lo": np.float32(-0.5), "hi": np.float32(1.0)})
    single("Clip", {"x": arr([4, 5]), "lo": arr([])}, opset=13)  # run-time bound


# ---- contractions and reductions -------------------------------------------------------------


def test_matmul() -> None:
    single("MatMul", {"a": arr([2, 3, 4]), "b": arr([4, 5])}, reduction=True)


def test_gemm_attributes() -> None:
    single("Gemm", {"a": arr([4, 3]), "b": arr([5, 4])}, consts={"c": arr([5])},
           transA=1, transB=1, alpha=0.5, beta=2.0, reduction=True)
    single("Gemm", {"a": arr([3, 4]), "b": arr([4, 5])}, reduction=True)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                "ReduceProd"])
def test_reduce_axes_attribute(op: str) -> None:
    single(op, {"x": arr([2, 3, 4])}, opset=11, axes=[0, -1], keepdims=1, reduction=True)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_reduce_axes_input_opset18(op: str) -> None:
    single(op, {"x": arr([2, 3, 4])}, opset=18, consts={"axes": np.array([1], np.int64)},
           keepdims=0, reduction=True)


def test_reduce_sum_opset_variants() -> None:
    x = {"x": arr([2, 3, 4])}
    single("ReduceSum", x, opset=11, axes=[1], keepdims=0, reduction=True)
    single("ReduceSum", x, opset=13, consts={"axes": np.array([-1, 0], np.int64)},
           reduction=True)
    single("ReduceSum", x, opset=13, keepdims=0, reduction=True)  # no axes: all
    single("ReduceSum", x, opset=13, consts={"axes": np.zeros([0], np.int64)},
           noop_with_empty_axes=1)
    single("ReduceSum", {"x": arr([3, 4], np.int32)}, opset=13, keepdims=0)  # stays i32


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions(op: str) -> None:
    single(op, {"x": arr([3, 5])}, axis=1, keepdims=0)
    ties = (arr([4, 6], np.int32) % 3).astype(np.int32)
    single(op, {"x": ties}, axis=-1, select_last_index=1)


def test_softmax_opset_variants() -> None:
    x = {"x": arr([2, 3, 4])}
    single("Softmax", x, opset=11, axis=1)     # coerced to 2-D: [2, 12]
    single("Softmax", x, opset=13, axis=1)     # along axis 1 only
    single("Softmax", x, opset=11)
    single("LogSoftmax", x, opset=11, axis=1)
    single("LogSoftmax", x, opset=13)


def test_layer_normalization() -> None:
    single("LayerNormalization", {"x": arr([2, 3, 8])},
           consts={"s": arr([8]), "b": arr([8])}, reduction=True)
    single("LayerNormalization", {"x": arr([2, 3, 4])}, consts={"s": arr([3, 4])}, axis=1,
           epsilon=1e-3, reduction=True)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(opset: int) -> None:
    """Scale and bias per group at opset 18, per channel from opset 21."""
    for shape, groups in [((2, 6, 7, 5), 3), ((1, 4, 513), 2), ((3, 8, 1), 8)]:
        params = [groups if opset == 18 else shape[1]]
        single("GroupNormalization", {"x": arr(list(shape))},
               consts={"s": arr(params), "b": arr(params)}, opset=opset, num_groups=groups,
               epsilon=1e-3, reduction=True, out_type=F32)


@pytest.mark.parametrize(("shape", "axes"), [((3, 4, 5, 7), None), ((2, 513), [1]),
                                             ((2, 3, 7), [0, -1])])
def test_mean_variance_normalization(shape: tuple[int, ...], axes: list[int] | None) -> None:
    attrs = {} if axes is None else {"axes": axes}
    single("MeanVarianceNormalization", {"x": arr(list(shape))}, opset=13, reduction=True,
           out_type=F32, **attrs)


def test_group_normalization_errors() -> None:
    model = make_model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"],
                                         num_groups=4)],
                       [("x", F32, [2, 6, 3])], [("y", F32)],
                       initializers=[init("s", arr([6])), init("b", arr([6]))], opset=21)
    with pytest.raises(tilefuse.onnx.OnnxError, match="groups=4 must divide the 6 channels"):
        tilefuse.onnx.load(model)


# ---- movement and shapes ---------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "axis", "scale"), [
    ((3, 7), -1, (7,)), ((2, 3, 5), 1, (3, 5)), ((1, 4, 513), -1, (1, 513))])
def test_rms_normalization(shape: tuple[int, ...], axis: int, scale: tuple[int, ...]) -> None:
    single("RMSNormalization", {"x": arr(list(shape))}, consts={"s": arr(list(scale))},
           opset=23, axis=axis, epsilon=1e-4, reduction=True)


def test_reshape_zero_and_minus_one() -> None:
    single("Reshape", {"x": arr([2, 3, 4])}, consts={"s": np.array([0, -1], np.int64)})
    single("Reshape", {"x": arr([2, 3, 4])}, opset=14, allowzero=1,
           consts={"s": np.array([4, 6], np.int64)})


def test_transpose_flatten() -> None:
    single("Transpose", {"x": arr([2, 3, 4])}, perm=[2, 0, 1])
    single("Transpose", {"x": arr([2, 3, 4])})
    single("Flatten", {"x": arr([2, 3, 4, 5])}, axis=2)
    single("Flatten", {"x": arr([2, 3, 4])}, axis=-1)


def test_squeeze_unsqueeze_opset_variants() -> None:
    x = {"x": arr([3, 1, 4, 1])}
    single("Squeeze", x, opset=11, axes=[1])
    single("Squeeze", x, opset=13, consts={"axes": np.array([-1], np.int64)})
    single("Squeeze", x, opset=13)
    single("Unsqueeze", {"x": arr([3, 4])}, opset=11, axes=[0, 3])
    single("Unsqueeze", {"x": arr([3, 4])}, opset=13, consts={"axes": np.array([-1, 1])})


def test_concat_and_split_opset_variants() -> None:
    single("Concat", {"a": arr([2, 3]), "b": arr([2, 5])}, axis=-1)
    x = {"x": arr([7, 4])}
    single("Split", x, 2, opset=11, axis=0, split=[3, 4])
    single("Split", x, 2, opset=13, consts={"split": np.array([5, 2], np.int64)})
    single("Split", {"x": arr([6, 4])}, 3, opset=13, axis=0)     # equal parts
    single("Split", x, 3, opset=18, num_outputs=3)               # uneven: 3, 3, 1


def test_slice_steps_negative_and_clamping() -> None:
    x = {"x": arr([6, 7, 5])}
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    single("Slice", x, consts={"s": i64(1, -1), "e": i64(100, -6), "a": i64(0, 1),
                               "st": i64(2, -2)})
    single("Slice", x, consts={"s": i64(-100, 4), "e": i64(3, -1000), "a": i64(2, 1),
                               "st": i64(1, -1)})
    single("Slice", x, opset=9, starts=[1], ends=[-1], axes=[1])


def test_gather_expand_tile() -> None:
    single("Gather", {"x": arr([5, 3])}, consts={"i": np.array([[0, -1], [4, 2]], np.int64)})
    single("Gather", {"x": arr([5, 3])}, consts={"i": np.array(1, np.int64)}, axis=1)
    single("Gather", {"x": arr([5, 3]), "i": np.array([3, 0, -2], np.int64)})
    single("Expand", {"x": arr([3, 1])}, consts={"s": np.array([2, 1, 4], np.int64)})
    single("Tile", {"x": arr([2, 3])}, consts={"r": np.array([2, 3], np.int64)})


def test_gather_elements() -> None:
    rng = np.random.default_rng(3)
    x = arr([5, 7, 3])
    for axis in (0, 1, -1):
        n = x.shape[axis]
        idx_shape = [4, 7, 2]
        idx_shape[axis] = 6
        idx = rng.integers(-n, n, size=idx_shape).astype(np.int64)
        single("GatherElements", {"x": x}, consts={"i": idx}, axis=axis)
    single("GatherElements", {"x": x, "i": rng.integers(0, 5, size=(1, 7, 3)).astype(np.int64)})


@pytest.mark.parametrize(("shape", "k", "upper"), [
    ((4, 6), 0, 1), ((7, 5), -2, 1), ((2, 3, 5), 1, 0), ((1, 1), 0, 0), ((3, 513), 300, 1)])
def test_trilu(shape: tuple[int, ...], k: int, upper: int) -> None:
    single("Trilu", {"x": arr(list(shape))}, consts={"k": np.array(k, np.int64)}, opset=14,
           upper=upper)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_modes(mode: str) -> None:
    single("Pad", {"x": arr([3, 4])}, mode=mode,
           consts={"p": np.array([1, 2, 2, 0], np.int64), "v": np.float32(1.5)})


def test_pad_opset_variants() -> None:
    single("Pad", {"x": arr([3, 4])}, opset=10, pads=[0, 1, 1, 0], value=-2.0)
    single("Pad", {"x": arr([3, 4, 5])}, opset=18,
           consts={"p": np.array([1, -1, 2, 1], np.int64), "": np.float32(0),
                   "a": np.array([0, 2], np.int64)})


def test_identity_dropout_constants() -> None:
    single("Identity", {"x": arr([3])})
    single("Dropout", {"x": arr([2, 3])}, opset=13, consts={"r": np.float32(0.5)})
    const = helper.make_node("Constant", [], ["c"], value=init("v", arr([2, 3])))
    cos = helper.make_node("ConstantOfShape", ["shape"], ["z"],
                           value=init("w", np.array([2.5], np.float32)))
    shape = helper.make_node("Shape", ["x"], ["shape"])
    add = helper.make_node("Add", ["c", "x"], ["s"])
    add2 = helper.make_node("Add", ["s", "z"], ["y"])
    start, limit, delta = (helper.make_node("Constant", [], [n], value_int=v)
                           for n, v in (("r0", 1), ("r1", 9), ("r2", 3)))
    rng_node = helper.make_node("Range", ["r0", "r1", "r2"], ["r"])
    size = helper.make_node("Size", ["x"], ["n"])
    model = make_model([const, shape, cos, add, add2, start, limit, delta, rng_node, size],
                       [("x", F32, [2, 3])], [("y", F32), ("r", I64), ("n", I64)])
    compare(model, {"x": arr([2, 3])})


# ---- convolution and pooling -----------------------------------------------------------------


@pytest.mark.parametrize("attrs", [
    {"group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"auto_pad": "VALID"},
], ids=["explicit", "same_upper", "same_lower", "valid"])
def test_conv(attrs: dict) -> None:
    single("Conv", {"x": arr([2, 4, 8, 7])}, consts={"w": arr([6, 4 // attrs.get("group", 1),
                                                               3, 3]), "b": arr([6])},
           reduction=True, **attrs)


def test_conv_1d() -> None:
    single("Conv", {"x": arr([2, 3, 9])}, consts={"w": arr([4, 3, 3])}, pads=[1, 1],
           reduction=True)


def test_pooling() -> None:
    x = {"x": arr([2, 3, 7, 6])}
    single("MaxPool", x, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])
    single("MaxPool", x, kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2])
    single("AveragePool", x, kernel_shape=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1])
    single("AveragePool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)
    single("GlobalAveragePool", x, reduction=True)
    single("GlobalMaxPool", x)


def test_batch_normalization() -> None:
    var = arr([3], low=0.5, high=2.0)
    single("BatchNormalization", {"x": arr([2, 3, 4, 5])}, epsilon=1e-3,
           consts={"s": arr([3]), "b": arr([3]), "m": arr([3]), "v": var})
    single("BatchNormalization", {"x": arr([2, 3, 4, 5])}, opset=9,
           consts={"s": arr([3]), "b": arr([3]), "m": arr([3]), "v": var})


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("include", [0, 1])
def test_pools_with_pads_wider_than_half_the_window(op: str, include: int) -> None:
    attrs = {"count_include_pad": include} if op == "AveragePool" else {}
    single(op, {"x": arr([1, 2, 7, 6])}, kernel_shape=[3, 2], pads=[2, 1, 2, 1],
           strides=[2, 1], **attrs)
