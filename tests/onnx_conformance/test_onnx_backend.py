"""The ONNX backend tests of the installed onnx package, run through ``tilefuse.onnx.load``.

One test per backend test directory (see conformance_cases.py for where each comes from). Each
lands in one bucket (conformance_runner.py): a pass passes; "not implemented" skips with the
OnnxError's reason; an entry of exclusions.txt skips with its reason (and fails if it passes,
so stale entries go); load errors, run errors and differing results fail. The counts go to
docs/CONFORMANCE.md (conftest.py says how).
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from conformance_cases import Case, all_cases
from conformance_runner import NOT_IMPLEMENTED, PASS, run_case
from conftest import exclusions

CASES = all_cases()


def test_exclusions_name_existing_tests() -> None:
    known = {c.id for c in CASES}
    assert sorted(set(exclusions()) - known) == []


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_backend(case: Case, request: pytest.FixtureRequest) -> None:
    outcome = run_case(case)
    reason = exclusions().get(case.id)
    bucket = outcome.bucket
    if reason is not None and bucket != PASS:
        bucket = "excluded"
    detail = reason if bucket == "excluded" else outcome.detail
    request.node.user_properties.append(
        ("conformance", (case.directory, case.name, bucket, detail or "")))
    if reason is not None:
        if outcome.bucket == PASS:
            pytest.fail(f"{case.id} passes: remove it from exclusions.txt ({reason})")
        pytest.skip(f"excluded: {reason}")
    if outcome.bucket == NOT_IMPLEMENTED:
        pytest.skip(f"not implemented: {outcome.detail}")
    if outcome.bucket != PASS:
        pytest.fail(f"{outcome.bucket}: {outcome.detail}", pytrace=False)
