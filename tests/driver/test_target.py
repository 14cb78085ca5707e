"""The one Target type: parse/print round trip, hashing, bad strings, and the code generators'
descriptions derived from it (x86-64-v3 code has no zmm registers)."""

from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, TilefuseError
from tilefuse.target import HOST, Target, TargetError
from tilefuse.testing import assert_close, random_array

CANONICAL = ["cpu", "x86-64-v3", "x86-64-v4", "cuda", "cuda:sm_90", "cuda:sm_80", "reference"]


@pytest.mark.parametrize("text", CANONICAL)
def test_parse_print_round_trip(text: str) -> None:
    target = Target.parse(text)
    assert str(target) == text
    assert Target.parse(str(target)) == target
    assert Target.parse(target) is target
    assert repr(target) == f"Target({text!r})"


def test_targets_are_hashable_and_distinct() -> None:
    targets = [Target.parse(t) for t in CANONICAL]
    assert len(set(targets)) == len(CANONICAL)
    assert {Target.parse("cpu"): 1}[HOST] == 1
    assert Target.parse(" CPU ") == HOST
    assert Target.parse("cuda").gpu("sm_80").arch == "sm_80"     # the device's, when unnamed
    assert Target.parse("cuda:sm_90").gpu("sm_80").arch == "sm_90"  # the named one wins


@pytest.mark.parametrize("text", ["tpu", "", "cuda:sm_7", "cuda:sm_75", "x86-64-v9", "cpu:avx",
                                  "cuda:", "gpu"])
def test_bad_strings_name_the_string(text: str) -> None:
    with pytest.raises(TargetError, match=f"unknown target {text!r}") as info:
        Target.parse(text)
    assert isinstance(info.value, TilefuseError) and isinstance(info.value, CompileError)
    assert "x86-64-v3" in str(info.value)   # and the known spellings


def test_not_a_string() -> None:
    with pytest.raises(TargetError, match="got int 3"):
        Target.parse(3)  # type: ignore[arg-type]


def test_wrong_kind() -> None:
    with pytest.raises(TargetError, match="cuda:sm_90 is not a cpu target"):
        Target.parse("cuda:sm_90").llvm_cpu()
    with pytest.raises(TargetError, match="x86-64-v3 is not a cuda target"):
        Target.parse("x86-64-v3").gpu()


def test_levels_describe_their_features() -> None:
    v3, v4 = Target.parse("x86-64-v3"), Target.parse("x86-64-v4")
    assert {"avx2", "fma"} <= v3.features() and "avx512f" not in v3.features()
    assert {"avx2", "avx512f", "avx512bw"} <= v4.features()
    assert v3.llvm_cpu().vector_bits == 256 and v4.llvm_cpu().vector_bits == 512
    assert v3.llvm_cpu().cpu == "x86-64-v3"
    assert v3.schedule_cpu().vector_bits == 256
    assert v4.missing_features(v3) == ["avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"]
    assert v3.missing_features(v4) == []
    assert Target.parse("cuda").features() == frozenset()


def _host_has(*features: str) -> bool:
    return set(features) <= HOST.features()


@pytest.mark.skipif(not _host_has("avx2", "fma", "bmi2"), reason="host lacks AVX2")
@pytest.mark.parametrize("level,zmm", [("x86-64-v3", False), ("x86-64-v4", True)])
def test_jit_builds_for_a_level(tmp_path, level: str, zmm: bool) -> None:
    if zmm and not _host_has("avx512f", "avx512bw", "avx512vl"):
        pytest.skip("host lacks AVX-512")

    def f(x, y):
        return np.tanh(x * y + 1.5) - x

    fn = tilefuse.jit(f, target=level, dump=tmp_path)
    rng = np.random.default_rng()
    x, y = (random_array(rng, (37, 61), DType.f32) for _ in range(2))
    assert_close(fn(x, y), f(x, y))
    assembly = "".join(p.read_text() for p in tmp_path.rglob("*.s"))
    assert assembly, "no assembly dumped"
    assert ("zmm" in assembly) is zmm
    assert level in repr(fn)
