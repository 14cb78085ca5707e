"""``tilefuse dump``, ``explain``, ``bench``, ``tune`` and ``cache`` on a small model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers_cli import K, M, N, reference

from tilefuse.cli import main
from tilefuse.cli.bench import check
from tilefuse.testing import assert_close

PEAKS = ["--peak-gflops", "100", "--peak-gbps", "20"]


def test_dump_writes_every_stage(small_onnx, tmp_path, capsys):
    out = tmp_path / "dump"
    assert main(["dump", str(small_onnx), "-o", str(out)]) == 0
    assert (out / "00-captured.graph").read_text().startswith("graph @")
    plan = (out / "kernels.plan").read_text()
    assert "matmul" in plan
    for suffix in ("expr", "schedule.json", "loop", "ll", "s"):
        assert list((out / "kernels").glob(f"k*.{suffix}")), suffix
    listed = capsys.readouterr().out
    assert "kernels.plan" in listed and "files under" in listed


def test_dump_refuses_a_file_as_directory(small_onnx, tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["dump", str(small_onnx), "-o", str(blocker)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_explain_reports_work_time_and_bound(small_onnx, tmp_path, capsys):
    report, chart = tmp_path / "e.json", tmp_path / "roofline.png"
    assert main(["explain", str(small_onnx), *PEAKS, "--rounds", "2", "--json", str(report),
                 "--plot", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "peaks: 100.0 GFLOP/s, 20.0 GB/s" in out and "% bound" in out
    assert "graph passes" in out and "kernels " in out and "bytes moved" in out  # per pass
    data = json.loads(report.read_text())
    [kernel] = [k for k in data["kernels"] if k["kind"] == "contraction"]
    assert kernel["flops"] >= 2 * M * N * K
    assert kernel["bytes"] == 4 * (M * K + K * N + N + M * N)
    assert kernel["seconds"] > 0 and kernel["percent_of_bound"] > 0
    expected_bound = max(kernel["flops"] / 100e9, kernel["bytes"] / 20e9)
    assert kernel["bound_seconds"] == pytest.approx(expected_bound)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_needs_both_peaks(small_onnx, capsys):
    assert main(["explain", str(small_onnx), "--peak-gflops", "100"]) == 2
    assert "both" in capsys.readouterr().err


def test_bench_onnx_against_onnxruntime(small_onnx, x_file, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    path, _ = x_file
    report = tmp_path / "b.json"
    assert main(["bench", str(small_onnx), "--input", f"x={path}", "--rounds", "2",
                 "--vs", "onnxruntime,torch", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["checks"] == {"tilefuse": "ok", "onnxruntime": "reference"}
    assert set(data["median_s"]) == {"tilefuse", "onnxruntime"}
    assert all(t > 0 for t in data["median_s"].values())
    assert data["ratio_vs_tilefuse"]["onnxruntime"] == pytest.approx(
        data["median_s"]["onnxruntime"] / data["median_s"]["tilefuse"])
    assert "does not apply" in data["skipped"]["torch"]
    assert "vs tilefuse" in capsys.readouterr().out


def test_bench_numpy_function(numpy_module, capsys):
    assert main(["bench", numpy_module, "--input", "x=7x13", "--input", "w=13x5",
                 "--input", "b=5", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "reference" in out and " ok" in out


def test_bench_rejects_unknown_peer(small_onnx, capsys):
    assert main(["bench", str(small_onnx), "--vs", "tensorflow"]) == 2
    assert "unknown peer" in capsys.readouterr().err


def test_output_check_sees_a_difference():
    rng = np.random.default_rng(5)
    want = rng.standard_normal((3, 7)).astype(np.float32)
    assert check([want], [want.copy()]) == "ok"
    wrong = want.copy()
    wrong[1, 2] += 0.5
    assert check([want], [wrong]).startswith("differs: output 0 max abs error 0.5")
    assert check([want], [want, want]).startswith("differs: 2 outputs")


def test_tune_writes_the_database_builds_use(small_onnx, x_file, tmp_path, capsys):
    from tilefuse.codegen.target import host_target
    from tilefuse.tune.api import open_database
    from tilefuse.tune.tuner import target_string

    db_path = tmp_path / "tune.sqlite"
    db = open_database(db_path)   # known peaks: the test measures no machine peaks
    db.set_peak(target_string(host_target()), "flops", 100e9)
    db.set_peak(target_string(host_target()), "bytes", 20e9)
    db.close()
    path, _ = x_file
    assert main(["tune", str(small_onnx), "--input", f"x={path}", "--trials", "3",
                 "--db", str(db_path), "--in-process", "--time-budget", "120"]) == 0
    out = capsys.readouterr().out
    assert "trials in" in out and f"TILEFUSE_TUNE_DB={db_path}" in out
    db = open_database(db_path)
    try:
        assert db.peak(target_string(host_target()), "flops") == 100e9
    finally:
        db.close()


def test_cache_info_and_clear(small_onnx, private_cache, capsys):
    assert main(["run", str(small_onnx)]) == 0
    entries = list(private_cache.glob("*.tfc"))
    assert entries
    (private_cache / "tune.sqlite").write_bytes(b"")
    capsys.readouterr()
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"kernels: {len(entries)} entries" in out and str(private_cache) in out
    assert main(["cache", "clear"]) == 0
    assert not list(private_cache.glob("*.tfc"))
    assert (private_cache / "tune.sqlite").exists()   # kept without --tune
    assert main(["cache", "clear", "--tune"]) == 0
    assert not (private_cache / "tune.sqlite").exists()
    assert private_cache.is_dir()   # the directory itself stays


def test_cache_clear_refuses_a_foreign_directory(tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir(mode=0o700)
    (folder / "holiday.jpg").write_bytes(b"jpeg")
    entry = folder / ("ab" * 32 + ".tfc")
    entry.write_bytes(b"entry")
    assert main(["cache", "clear", "--dir", str(folder)]) == 2
    assert "does not look like a tilefuse cache" in capsys.readouterr().err
    assert (folder / "holiday.jpg").exists() and entry.exists()


def test_cache_clear_of_a_missing_directory(tmp_path, capsys):
    assert main(["cache", "clear", "--dir", str(tmp_path / "none")]) == 0
    assert "nothing to clear" in capsys.readouterr().out


def test_run_output_file_matches_reference_after_cache_hit(small_onnx, x_file, weights,
                                                           tmp_path, private_cache):
    """A second process-like run loads kernels from the disk cache and still agrees."""
    path, x = x_file
    for attempt in ("cold", "warm"):
        out = tmp_path / attempt
        assert main(["run", str(small_onnx), "--input", f"x={path}", "-o", str(out)]) == 0
        assert_close(np.load(out / "out.npy"), reference(x, *weights), reduction=True)


def test_dump_onnx_for_cuda_writes_ptx(small_onnx, tmp_path, capsys):
    out = tmp_path / "dump-cuda"
    assert main(["dump", str(small_onnx), "--target", "cuda", "-o", str(out)]) == 0
    assert "on nvptx64-nvidia-cuda" in (out / "partition.txt").read_text()
    assert list((out / "kernels").glob("*.ptx"))
