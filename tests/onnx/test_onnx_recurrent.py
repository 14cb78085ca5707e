"""RNN, GRU and LSTM against onnxruntime (batch-wise layout 1, which onnxruntime refuses,
against onnx's reference implementation) on fresh random inputs: each direction, both layouts,
initial states, biases, per-row sequence lengths (held state, zero outputs past the end),
peepholes, clip, linear_before_reset, non-default activations; odd sizes including a single
step and a single row."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnxcheck import F32, I32, arr, compare, init, make_model

import tilefuse.onnx
from tilefuse.onnx.tensors import OnnxError
from tilefuse.testing import assert_close

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
rng = np.random.default_rng(9)


def _model(op: str, seq: int, batch: int, inp: int, hidden: int, *, direction: str = "forward",
           layout: int = 0, lens: bool = False, states: bool = False, peepholes: bool = False,
           **attrs):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = [init("W", arr([dirs, g * hidden, inp], low=-0.5, high=0.5)),
             init("R", arr([dirs, g * hidden, hidden], low=-0.5, high=0.5)),
             init("B", arr([dirs, 2 * g * hidden], low=-0.5, high=0.5))]
    names = ["X", "W", "R", "B", "lens" if lens else ""]
    x_shape = [batch, seq, inp] if layout else [seq, batch, inp]
    state_shape = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    inputs = [("X", F32, x_shape)] + ([("lens", I32, [batch])] if lens else [])
    if states:
        names.append("h0")
        inputs.append(("h0", F32, state_shape))
        if op == "LSTM":
            names.append("c0")
            inputs.append(("c0", F32, state_shape))
    if peepholes:
        names += [""] * (7 - len(names)) + ["P"]
        inits.append(init("P", arr([dirs, 3 * hidden], low=-0.5, high=0.5)))
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction,
                            layout=layout, **attrs)
    model = make_model([node], inputs, [(o, F32) for o in outs], initializers=inits, opset=14)
    feeds = {"X": arr(x_shape)}
    if lens:
        feeds["lens"] = rng.integers(1, seq + 1, size=batch).astype(np.int32)
    if states:
        feeds["h0"] = arr(state_shape)
        if op == "LSTM":
            feeds["c0"] = arr(state_shape)
    return model, feeds


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(op: str, direction: str, layout: int) -> None:
    model, feeds = _model(op, 3, 3, 4, 7, direction=direction, layout=layout, states=True)
    if not layout:
        compare(model, feeds, reduction=True)
        return
    expected = ReferenceEvaluator(model).run(None, feeds)
    for got, want in zip(tilefuse.onnx.load(model).run(None, feeds), expected):
        assert_close(got, want, reduction=True)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lengths(op: str, direction: str) -> None:
    model, feeds = _model(op, 4, 5, 3, 5, direction=direction, lens=True)
    compare(model, feeds, reduction=True)


@pytest.mark.parametrize(("seq", "batch"), [(1, 1), (7, 1), (2, 9)])
def test_odd_sizes(seq: int, batch: int) -> None:
    for op in GATES:
        compare(*_model(op, seq, batch, 5, 3), reduction=True)


def test_lstm_peepholes_clip_and_activations() -> None:
    compare(*_model("LSTM", 4, 2, 3, 5, peepholes=True, clip=0.7), reduction=True)
    compare(*_model("LSTM", 4, 2, 3, 5, activations=["HardSigmoid", "Tanh", "Softsign"],
                    activation_alpha=[0.3], activation_beta=[0.4]), reduction=True)


def test_gru_linear_before_reset_and_rnn_relu() -> None:
    compare(*_model("GRU", 5, 2, 3, 4, linear_before_reset=1), reduction=True)
    compare(*_model("RNN", 5, 2, 3, 4, activations=["Relu"]), reduction=True)


def test_unknown_activation_is_named() -> None:
    model, feeds = _model("RNN", 2, 1, 2, 2, activations=["Swish"])
    with pytest.raises(OnnxError, match="activation 'Swish' is not one of"):
        tilefuse.onnx.load(model).run(None, feeds)
