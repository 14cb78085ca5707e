"""The Ray runner on a local Ray instance: good, crashing, hanging and wrong candidates."""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile

import pytest
from helpers_tune import matmul_candidates

from tilefuse.tune.runner import CRASH, INVALID, OK, TIMEOUT, WRONG, MeasureOptions, PlantedFault

ray = pytest.importorskip("ray")

from tilefuse.tune.runner_ray import RayRunner  # noqa: E402 - after the skip


@pytest.fixture(scope="module")
def local_ray():
    """A one-CPU local Ray. Its workers run at niceness 0, not Ray's default 15: on a machine
    busy with other processes at 0 (another pytest-xdist worker, say) a niceness-15 worker got
    a few percent of a core, and good candidates ran past their 20 s timeout."""
    temp = tempfile.mkdtemp(prefix="tf-ray-")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_worker_niceness", "0")   # read by the raylet ray.init starts
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                 _temp_dir=temp)  # removed after: Ray leaves its session folders
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def test_ray_runner_measures_and_survives_planted_failures(local_ray):
    task, (good, aborts, hangs, corrupt) = matmul_candidates(4)
    options = MeasureOptions(warmup=0, repeats=2, min_repeat_seconds=0.0, timeout=20.0)
    invalid = dataclasses.replace(good, micro_tile=(good.micro_tile[0], 7))
    for kind, victim, status in (("abort", aborts, CRASH), ("hang", hangs, TIMEOUT),
                                 ("corrupt", corrupt, WRONG)):
        fault = PlantedFault(kind, frozenset({victim.to_json()}), hang_seconds=600)
        runner = RayRunner(options, fault)
        assert not runner._owns_ray  # the caller's session is used, not shut down
        first, bad, after, rejected = runner.measure(task, [good, victim, good, invalid])
        runner.close()
        assert first.status == OK and math.isfinite(first.seconds) and first.seconds > 0, first
        assert bad.status == status and bad.seconds == math.inf, (kind, bad)
        assert after.status == OK and math.isfinite(after.seconds), (kind, after)
        assert rejected.status == INVALID
    assert ray.is_initialized()
