"""The bucket counts of a conformance run, as the text of docs/CONFORMANCE.md.

The pytest hooks in this folder's conftest.py collect one (directory, test, bucket, detail) row
per test and call :func:`render` when ``TILEFUSE_CONFORMANCE_REPORT`` names the file to write.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

COLUMNS = ("pass", "not_implemented", "excluded", "load_error", "run_error", "mismatch")
HEADERS = ("pass", "not implemented", "excluded", "load error", "run error", "result differs")

Row = tuple[str, str, str, str]   # directory, test name, bucket, detail

COMMAND = ("TILEFUSE_CONFORMANCE_REPORT=docs/CONFORMANCE.md "
           "python -m pytest tests/onnx_conformance -q")

INTRO = """\
# ONNX backend conformance

The ONNX backend test data that the installed `onnx` package ships (`onnx {version}`), run
through `tilefuse.onnx.load` by `tests/onnx_conformance/test_onnx_backend.py`. Every data set of
every test runs; each output is compared with rtol 1e-3, atol 1e-5 (floats; NaN in the same
places), exactly for ints and bools, and dtype and shape always exactly.

Sources: `simple`, `pytorch-converted` and `pytorch-operator` are shipped as files
(`model.onnx` + `test_data_set_*/*.pb`). `light` ships each model with its expected output only;
the input is onnx's dummy input (`arange(n) / n`), as onnx's own runner makes it. `real` holds
only download stubs (`data.json` with a URL) and is not run. `node` is **not** shipped in the
wheel: its cases are generated in memory from `onnx.backend.test.case.node` (about 5 s).

Buckets, one per test:

- **pass**: every output of every data set matches. An op without a tilefuse converter runs
  in onnx's reference implementation as a host step (`tilefuse/onnx/fallback.py`) where its
  output shapes follow from the input types; so does a node whose attribute values or
  outputs its converter does not compile (MaxPool's Indices, a dilated AveragePool, Pad's wrap
  mode, BatchNormalization in training mode, 3-D ConvTranspose: `NeedsReference`). Those tests
  count here too (about 200 node tests: BitShift, GridSample, DFT, STFT, the bitwise ops, ...).
- **not implemented**: `load` (or the first run, for models with symbolic dims) raised an
  `OnnxError` saying tilefuse does not support an op, element type, domain, opset, attribute value
  or non-tensor value. The test is *skipped with that reason* and counted here: visible, never a
  pass.
- **excluded**: listed in `tests/onnx_conformance/exclusions.txt` with a one-line reason; skipped
  with the reason. An excluded test that passes fails as a stale entry.
- **load error / run error / result differs**: fail the suite unless excluded.

Runtime: the whole suite (2,033 tests, every data set) took about 15 minutes on the shared
2-core dev machine at the last regeneration (2026-12-01, with other work loading it), most of it
compiling the kernels of the ~1,450 passing models, the nine light ones the longest; the
compile-free "not implemented" tests are fast. There is no subset rule and no environment
variable for a fuller run; `-k` picks directories while iterating.

Graph inputs that a converter needs as constants (Reshape's shape, Unsqueeze's axes, Pad's pads,
... fed as inputs, as most node tests do) are handled by compiling per value of those inputs
(`InputValueNeeded` in `tilefuse/onnx/context.py`), as a new input shape would be.

Regenerate this file with (all of it is written by the suite's hooks):

    {command}
"""


def _table(rows: Sequence[Row]) -> list[str]:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for directory, _, bucket, _ in rows:
        counts[directory][bucket] += 1
        counts["total"][bucket] += 1
    lines = ["| directory | tests | " + " | ".join(HEADERS) + " |",
             "|---|---:|" + "---:|" * len(COLUMNS)]
    for directory in [d for d in counts if d != "total"] + ["total"]:
        c = counts[directory]
        cells = [str(c[b]) for b in COLUMNS]
        name = f"**{directory}**" if directory == "total" else directory
        lines.append(f"| {name} | {sum(c.values())} | " + " | ".join(cells) + " |")
    return lines


def _reason_key(detail: str) -> str:
    match = re.search(r"unsupported ONNX op (\w+)", detail)
    if match:
        return f"op {match.group(1)}"
    match = re.search(r"element type (\w+), which tilefuse does not support", detail)
    if match:
        return f"element type {match.group(1)}"
    match = re.search(r"opset (\d+) is outside what tilefuse imports \((\d+) to (\d+)", detail)
    if match:
        return f"model opset outside what tilefuse imports ({match.group(2)} to {match.group(3)})"
    text = re.sub(r"\(inputs .*?\)", "", detail)
    text = re.sub(r"(?<!\w)'[^']*'", "…", text)
    return re.sub(r"\s+", " ", text).strip()[:110]


def _reasons(rows: Sequence[Row], bucket: str, title: str) -> list[str]:
    reasons = collections.Counter(_reason_key(d) for _, _, b, d in rows if b == bucket)
    if not reasons:
        return []
    lines = ["", f"## {title}", "", "| tests | reason |", "|---:|---|"]
    lines += [f"| {n} | {r.replace('|', '/')} |" for r, n in reasons.most_common()]
    return lines


def render(rows: Sequence[Row], version: str) -> str:
    lines = [INTRO.format(version=version, command=COMMAND), "## Counts", ""]
    lines += _table(rows)
    lines += _reasons(rows, "not_implemented", "Not implemented, by reason")
    lines += _reasons(rows, "excluded", "Excluded, by reason (exclusions.txt)")
    failed = [r for r in rows if r[2] in ("load_error", "run_error", "mismatch")]
    if failed:
        lines += ["", "## Failing", ""]
        lines += [f"- `{d}/{n}` ({b}): {detail[:200]}" for d, n, b, detail in failed]
    return "\n".join(lines) + "\n"
