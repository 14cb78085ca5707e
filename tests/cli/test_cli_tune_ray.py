"""``tilefuse tune --ray ADDRESS``: the command line measures on a Ray cluster, here a local one
the test starts (and stops)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_cluster():
    """A one-CPU local Ray cluster started by this test; its workers run at niceness 0 (see
    tests/tune/test_tune_runner_ray.py) and import this checkout's tilefuse."""
    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    temp = tempfile.mkdtemp(prefix="tf-ray-")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_worker_niceness", "0")
        patch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                 _temp_dir=temp)  # removed after: Ray leaves its session folders
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def test_tune_measures_on_the_ray_cluster_at_an_address(local_cluster, small_onnx, x_file,
                                                         tmp_path):
    from tilefuse.codegen.target import host_target
    from tilefuse.tune.api import open_database
    from tilefuse.tune.roofline import PeakProbe
    from tilefuse.tune.tuner import target_string

    db_path = tmp_path / "tune.sqlite"
    db = open_database(db_path)   # known peaks: the test measures no machine peaks
    db.set_peak(target_string(host_target()), "flops", 100e9)
    db.set_peak(target_string(host_target()), "bytes", 20e9)
    db.close()
    path, _ = x_file
    argv = ["tune", str(small_onnx), "--input", f"x={path}", "--trials", "3", "--db",
            str(db_path), "--time-budget", "300", "--ray", local_cluster]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    small_probe = ("from tilefuse.tune.roofline import PeakProbe; PeakProbe.__init__.__defaults__"
                   f" = {PeakProbe.__init__.__defaults__!r}; ")   # tests/cli/conftest.py's
    done = subprocess.run([sys.executable, "-c", small_probe + "from tilefuse.cli import main; "
                           f"raise SystemExit(main({argv!r}))"], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trials in" in done.stdout, done.stdout
    assert "Connecting to existing Ray cluster" in done.stderr, done.stderr[-3000:]


def test_ray_and_in_process_exclude_each_other(small_onnx, capsys):
    from tilefuse.cli import main

    assert main(["tune", str(small_onnx), "--ray", "auto", "--in-process"]) == 2
    assert "--ray and --in-process" in capsys.readouterr().err
