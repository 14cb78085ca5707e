"""``import tilefuse`` stays light: the heavy dependencies load on first use (issue 27 item 8).
Each check runs in a fresh interpreter, since this test process has imported them already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tilefuse

HEAVY = ("egglog", "scipy", "llvmlite", "onnx", "onnxruntime", "torch", "ml_dtypes", "sqlite3",
         "lightgbm", "ray", "transformers")
ROOT = Path(tilefuse.__file__).parent.parent


def _fresh(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_tilefuse_loads_no_heavy_module() -> None:
    seen = _fresh(f"""
import json, sys, tilefuse
print(json.dumps({{"file": tilefuse.__file__,
                  "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))""")
    assert Path(seen["file"]).parent == ROOT / "tilefuse"   # this checkout's tilefuse
    assert seen["loaded"] == []


def test_first_use_loads_them() -> None:
    """The check above can fail: a trace (scipy.special.erf) and a CPU build load what they
    need."""
    seen = _fresh("""
import json, sys
import numpy as np, scipy.special, tilefuse
f = tilefuse.jit(lambda x: scipy.special.erf(x) + 1.0)
x = np.linspace(-2, 2, 7, dtype=np.float32)
assert np.allclose(f(x), scipy.special.erf(x) + 1.0, atol=1e-6)
print(json.dumps([m for m in ("egglog", "llvmlite") if m in sys.modules]))""")
    assert seen == ["egglog", "llvmlite"]


def test_lazy_names_resolve() -> None:
    from tilefuse.passes import GRAPH_PIPELINE, run_pipeline

    assert GRAPH_PIPELINE and callable(run_pipeline)
    assert tilefuse.Target.parse("cpu") == tilefuse.target.HOST
    assert callable(tilefuse.compile)
