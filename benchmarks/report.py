"""The benchmark's results: one record per workload (JSON), the table printed and written into
docs/PERFORMANCE.md between the ``generated`` markers.

A record: ``workload``, ``title``, ``group`` (compass, onnx-light, bert), ``status`` (ok, not
supported, error, not measured), ``note``, ``median_s`` (implementation -> median seconds),
``checks`` (implementation -> ok / reference / differs: ...), ``skipped`` (peer -> why).
Ratios are a peer's time over tilefuse's: above 1.00x tilefuse is faster. The "tilefuse / best
peer" column and the targets take the fastest peer whose output agreed with the reference.
"""

from __future__ import annotations

import contextlib
import json
import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tilefuse.cli.timing import format_seconds

PEERS = ("numpy", "torch", "inductor", "onnxruntime", "jax", "openvino")
BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"

Medians = dict[str, float]


def _agreeing(record: dict[str, Any]) -> Medians:
    """The record's medians without peers whose output differed from the reference (a wrong
    answer is no one's best time)."""
    checks = record.get("checks", {})
    return {k: v for k, v in record["median_s"].items()
            if checks.get(k, "ok") in ("ok", "reference")}


def _best_peer(m: Medians) -> float:
    return min((m[p] for p in PEERS if p in m), default=float("nan"))


# The compass targets of issue 28 (docs/PERFORMANCE.md): tilefuse's time over the best peer's.
TARGETS: dict[str, tuple[str, Callable[[Medians], bool]]] = {
    "W1": ("≤ 0.8x best peer", lambda m: m["tilefuse"] <= 0.8 * _best_peer(m)),
    "W2": ("≤ 0.7x best peer", lambda m: m["tilefuse"] <= 0.7 * _best_peer(m)),
    "W3": ("≤ 0.8x best peer", lambda m: m["tilefuse"] <= 0.8 * _best_peer(m)),
    "W5": ("≤ 10 µs and ≤ 0.8x best peer",
           lambda m: m["tilefuse"] <= min(10e-6, 0.8 * _best_peer(m))),
    "W7": ("≤ 0.3x best peer", lambda m: m["tilefuse"] <= 0.3 * _best_peer(m)),
}


def _target_cells(record: dict[str, Any]) -> tuple[str, str]:
    target = TARGETS.get(record["workload"])
    if target is None:
        return "", ""
    text, met = target
    try:
        return text, "**yes**" if met(_agreeing(record)) else "no"
    except KeyError:
        return text, "n/a"


def _cell(record: dict[str, Any], peer: str) -> str:
    m = record.get("median_s", {})
    if peer not in m:
        return "n/a" if peer in record.get("skipped", {}) else "–"
    ratio = m[peer] / m["tilefuse"]
    flag = "" if record.get("checks", {}).get(peer, "ok") in ("ok", "reference") else " ⚠"
    return f"{format_seconds(m[peer])} ({ratio:.2f}x){flag}"


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: one row per workload, each peer's time and its ratio to tilefuse's."""
    head = ("| workload | tilefuse | " + " | ".join(PEERS)
            + " | tilefuse / best peer | target | met? |")
    rows = [head, "|" + "---|" * (len(PEERS) + 5)]
    for r in records:
        label = f"{r['workload']} {r['title']}"
        if r["status"] != "ok":
            note = f": {r['note']}" if r.get("note") else ""
            rows.append(f"| {label} | **{r['status']}**{note} |" + " |" * (len(PEERS) + 3))
            continue
        m = r["median_s"]
        tilefuse = format_seconds(m["tilefuse"])
        if r.get("checks", {}).get("tilefuse", "ok") not in ("ok", "reference"):
            tilefuse += " ⚠ " + r["checks"]["tilefuse"]
        best = m["tilefuse"] / _best_peer(_agreeing(r))
        target, met = _target_cells(r)
        rows.append(f"| {label} | {tilefuse} | " + " | ".join(_cell(r, p) for p in PEERS)
                    + f" | {'–' if best != best else f'{best:.2f}x'} | {target} | {met} |")
    return "\n".join(rows)


def peer_versions() -> dict[str, str]:
    """The installed version of tilefuse's peers (and of the libraries under them); a peer
    that is not installed is left out."""
    from importlib import metadata

    versions = {}
    for dist in ("numpy", "scipy", "torch", "onnxruntime", "jax", "jaxlib", "openvino",
                 "llvmlite"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return versions


def machine() -> str:
    """The CPU's model name (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def docs_block(payload: dict[str, Any]) -> str:
    meta = payload["meta"]
    lines = [BEGIN,
             f"<!-- written by `python benchmarks/run.py --write-docs` from "
             f"{meta.get('source', 'a run')}; edit the prose outside the markers only -->",
             "",
             f"Run of {meta['date']}: {meta['machine']}, {meta['threads']} threads for every "
             f"implementation, {meta['rounds']} rounds, medians. Each peer's cell is its time "
             f"and, in parentheses, its time over tilefuse's (above 1.00x tilefuse is faster); "
             f"⚠ marks an output that differs from the reference.",
             *([f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}."]
               if meta.get("versions") else []),
             "", table(payload["results"]), ""]
    notes = [r for r in payload["results"] if r.get("skipped") or r["status"] != "ok"]
    for r in notes:
        for peer, why in r.get("skipped", {}).items():
            lines.append(f"- {r['workload']}: {peer} left out ({why})")
    lines.append(END)
    return "\n".join(lines)


def write_docs(payload: dict[str, Any], path: Path) -> None:
    """Replaces the text between the markers of ``path`` (appends a block when it has none)."""
    text = path.read_text() if path.exists() else "# Performance\n"
    block = docs_block(payload)
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else \
        text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def save_json(payload: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
