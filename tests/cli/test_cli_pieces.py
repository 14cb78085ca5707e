"""The command line's parts: the progress bar, interleaved timing, per-kernel profiling."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tilefuse.cli.progress import Bar
from tilefuse.cli.timing import format_seconds, interleaved_medians


def test_bar_is_silent_off_a_terminal_unless_asked():
    quiet = io.StringIO()
    with Bar("work", 3, stream=quiet) as bar:
        bar.step()
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    with Bar("work", 2, show=True, stream=loud) as bar:
        bar.step()
        bar.step()
    lines = loud.getvalue().splitlines()
    assert lines[-1].startswith("work [") and lines[-1].endswith("2/2")


def test_bar_rewrites_one_line_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    with Bar("x", 2, stream=stream) as bar:
        bar.step()
    assert stream.getvalue().count("\r") == 2 and stream.getvalue().endswith("\n")


def test_interleaved_medians_runs_every_implementation_each_round():
    calls = {"a": 0, "b": 0, "numpy": 0}

    def counter(name):
        def fn():
            calls[name] += 1
        return fn

    rounds = []
    medians = interleaved_medians({k: counter(k) for k in calls}, 3, separate=("numpy",),
                                  min_sample=0.0, on_round=lambda: rounds.append(1))
    assert set(medians) == set(calls) and all(m >= 0 for m in medians.values())
    assert len(rounds) == 6   # 3 interleaved rounds, then 3 for numpy alone
    assert all(c >= 4 for c in calls.values())  # a probe call, then one per round


@pytest.mark.parametrize(("seconds", "text"), [(4e-8, "40 ns"), (8.123e-4, "812 us"),
                                               (9.131e-3, "9.13 ms"), (1.2, "1.2 s"),
                                               (0.111, "111 ms"),
                                               (float("nan"), "n/a")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def test_profile_steps_times_every_kernel_of_a_build():
    from tilefuse.errors import GuardError
    from tilefuse.frontend.jit import jit
    from tilefuse.kernel.fusion import form_kernels
    from tilefuse.passes.decompose import decompose_composites
    from tilefuse.runtime.profile import group_work, profile_steps

    rng = np.random.default_rng(2)
    w = rng.standard_normal((13, 7)).astype(np.float32)

    def f(x):
        y = x @ w
        return np.exp(y - y.max(axis=-1, keepdims=True))

    x = rng.standard_normal((9, 13)).astype(np.float32)
    jitted = jit(f)
    jitted(x)
    lowered = jitted.lower(x)
    profile = profile_steps(lowered.executable, [x], rounds=2, min_sample=0.0)
    names = [s.name for s in lowered.executable.steps]
    assert [s.name for s in profile.steps] == names
    assert all(s.seconds > 0 for s in profile.steps) and profile.call_seconds > 0
    groups = form_kernels(decompose_composites(lowered.optimized)[0]).groups
    contraction = next(g for g in groups if any(n.op.name == "matmul" for n in g.nodes))
    flops, nbytes = group_work(contraction)
    assert flops >= 2 * 9 * 7 * 13
    assert nbytes >= 4 * (9 * 13 + 13 * 7 + 9 * 7)
    with pytest.raises(GuardError, match="input"):
        profile_steps(lowered.executable, [x[:, :5].copy()])  # the call's guard still checks
