"""``python -m tilefuse.tune``: argument specs, loading a function, a short run."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tilefuse.tune.__main__ import load_function, main, parse_arg_spec
from tilefuse.tune.task import TuneError


def test_arg_specs_give_random_arrays_of_the_shape_and_dtype():
    rng = np.random.default_rng(0)
    a = parse_arg_spec("3x4", rng)
    b = parse_arg_spec("5:f16", rng)
    assert a.shape == (3, 4) and a.dtype == np.float32
    assert b.shape == (5,) and b.dtype == np.float16
    with pytest.raises(TuneError, match="AxBxC"):
        parse_arg_spec("3xq", rng)


def test_load_function_names_what_is_missing():
    assert load_function("helpers_tune:tiny_function").__name__ == "tiny_function"
    with pytest.raises(TuneError, match="module:function"):
        load_function("helpers_tune")
    with pytest.raises(TuneError, match="cannot load"):
        load_function("helpers_tune:nothing_here")


def test_cli_tunes_a_function_into_the_database(tmp_path, capsys):
    db = tmp_path / "cli.sqlite"
    assert main(["helpers_tune:tiny_function", "--arg", "64x64", "--arg", "64x64",
                 "--trials", "3", "--db", str(db), "--in-process", "--margin", "0.1"]) == 0
    out = capsys.readouterr()
    assert "elementwise" in out.out and f"TILEFUSE_TUNE_DB={db}" in out.out
    assert "round 0" in out.err  # plain progress lines when stderr is not a terminal
    assert db.exists()


def test_cli_needs_demo_or_a_function():
    with pytest.raises(SystemExit):
        main([])


def test_cli_recall_reports_held_out_recall_from_the_database(tmp_path, capsys, monkeypatch):
    """Measurements already in the database are used; random W1 candidates top them up (a
    small W1 here, so the run stays short)."""
    from tilefuse.tune import __main__ as cli
    from tilefuse.tune.tuner import w1_graph

    monkeypatch.setattr(cli, "w1_graph", lambda: w1_graph(24, 16, 40))
    db = tmp_path / "recall.sqlite"
    assert main(["--recall", "--trials", "30", "--db", str(db), "--in-process"]) == 0
    out = capsys.readouterr().out
    assert "top-5 recall on held-out candidates" in out and "30 measured" in out
    assert "LightGBM (lambdarank)" in out and "random ranking" in out
    assert "5-fold x 10 shuffles" in out
    low, high = (float(x) for x in re.search(r"shuffles (\d\.\d+)-(\d\.\d+)\)", out).groups())
    mean = float(re.search(r"\(lambdarank\) (\d\.\d+)", out).group(1))
    assert 0.0 <= low <= mean <= high <= 1.0


def test_cli_rejects_an_unknown_demo(capsys):
    with pytest.raises(SystemExit):
        main(["--demo", "resnet", "--trials", "1"])
    assert "unknown demo" in capsys.readouterr().err
