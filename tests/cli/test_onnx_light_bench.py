"""benchmarks/onnx_light.py (whole models with random weights against onnxruntime and OpenVINO)
and kernel_ab.py --tile, on small models: the light models' ConstantOfShape weights become
random initializers, every output is checked, and the ratios come out."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import onnx_light  # noqa: E402


def _constant_weight_model() -> object:
    """conv -> batch norm -> relu -> flatten -> gemm, every weight a ConstantOfShape 0.02 (the
    light models' form)."""
    from onnx import TensorProto, helper, numpy_helper

    shapes = {"w": (4, 3, 3, 3), "scale": (4,), "bias": (4,), "mean": (4,), "var": (4,),
              "fc": (5, 4 * 6 * 6), "fc_b": (5,)}
    nodes, inits, inputs = [], [], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  [1, 3, 8, 8])]
    for name, shape in shapes.items():
        inits.append(numpy_helper.from_array(np.array(shape, np.int64), f"{name}_shape"))
        inputs.append(helper.make_tensor_value_info(f"{name}_shape", TensorProto.INT64,
                                                    [len(shape)]))
        nodes.append(helper.make_node("ConstantOfShape", [f"{name}_shape"], [name], value=(
            numpy_helper.from_array(np.array([0.02], np.float32)))))
    nodes += [helper.make_node("Conv", ["x", "w"], ["c"]),
              helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                               ["n"]),
              helper.make_node("Relu", ["n"], ["r"]),
              helper.make_node("Flatten", ["r"], ["f"]),
              helper.make_node("Gemm", ["f", "fc", "fc_b"], ["out"], transB=1)]
    graph = helper.make_graph(nodes, "light_like", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 5])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_constant_weights_are_materialised_and_redrawn():
    from onnx import numpy_helper

    proto = _constant_weight_model()
    out = onnx_light.randomize_weights(proto, seed=1)
    assert "ConstantOfShape" not in [n.op_type for n in out.graph.node]
    assert [v.name for v in out.graph.input] == ["x"]
    weights = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert set(weights) == {"w", "scale", "bias", "mean", "var", "fc", "fc_b"}
    assert weights["w"].shape == (4, 3, 3, 3) and weights["w"].std() > 0.1
    assert ((weights["var"] >= 0.5) & (weights["var"] <= 1.5)).all()
    # the He scale keeps a weight's spread near sqrt(2 / fan_in)
    assert 0.5 < weights["fc"].std() / math.sqrt(2 / 144) < 1.5
    again = onnx_light.randomize_weights(proto, seed=1)
    assert all(np.array_equal(numpy_helper.to_array(t), weights[t.name])
               for t in again.graph.initializer)


def test_run_case_checks_and_times_every_peer(tmp_path):
    import onnx

    pytest.importorskip("onnxruntime")
    path = tmp_path / "light_like.onnx"
    onnx.save(_constant_weight_model(), path)
    rec = onnx_light.run_case("light_like", path, rounds=3, threads=1, seed=0)
    assert rec["checks"]["tilefuse"] == "ok" and rec["checks"]["onnxruntime"] == "reference"
    if "openvino" in rec["median_s"]:
        assert rec["checks"]["openvino"] == "ok"
    for key in ("ratio_best", "ratio_ort", "ratio_best_min", "ratio_best_paired"):
        assert math.isfinite(rec[key]) and rec[key] > 0


def test_check_reports_a_wrong_output():
    ref = [np.array([1.0, -2.0, 3.0])]
    assert onnx_light.check(ref, [np.array([1.0, -2.0, 3.0001])]) == "ok"
    assert onnx_light.check(ref, [np.array([1.0, -2.0, 3.5])]).startswith("differs")


def test_kernel_ab_tries_another_register_tile(small_onnx, capsys):
    import kernel_ab

    assert kernel_ab.main([str(small_onnx), "--tile", "4x4", "--rounds", "1",
                           "--calls", "1"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("k")][1:]
    assert "micro(4x4)" in row   # NR within N = 5 (4-lane vectors)
