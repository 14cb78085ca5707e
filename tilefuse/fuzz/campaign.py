"""A fuzzing campaign: many generated graphs, each checked with the default schedules and/or
random valid ones; every failure is shrunk and saved as a ``.graph`` repro whose header says how
to replay it (``python -m tilefuse.fuzz --replay FILE``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tilefuse.fuzz.check import Verdict, check_graph, random_inputs
from tilefuse.fuzz.generator import GeneratorConfig, generate_graph
from tilefuse.fuzz.shrink import shrink
from tilefuse.graph.ir import Graph
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph

SCHEDULE_MODES = ("default", "random", "both", "alternate")


@dataclass(frozen=True)
class Failure:
    """One failing check, after shrinking."""

    index: int
    input_seed: int
    schedule_seed: int | None
    specials: float
    verdict: Verdict
    original_nodes: int
    graph: Graph
    path: Path | None = None


@dataclass
class CampaignReport:
    graphs: int = 0
    checks: Counter = field(default_factory=Counter)   # verdict kind -> count
    failures: list[Failure] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.checks.items()))
        return f"{self.graphs} graphs, {sum(self.checks.values())} checks: {kinds}"


def _seeds(seed: int, index: int) -> tuple[int, int]:
    """The input seed and the schedule seed of graph ``index`` of a campaign."""
    mixed = np.random.default_rng([seed, index]).integers(0, 2**31, size=2)
    return int(mixed[0]), int(mixed[1])


def repro_text(failure: Failure) -> str:
    """The ``.graph`` file of a failure: header comments, then the shrunk graph."""
    verdict = failure.verdict
    first = verdict.detail.strip().splitlines()[0] if verdict.detail.strip() else ""
    schedule = "default" if failure.schedule_seed is None else str(failure.schedule_seed)
    return (f"# tilefuse fuzz repro: {verdict.kind} at {verdict.stage}\n"
            f"# {first[:300]}\n"
            f"# input-seed: {failure.input_seed}\n"
            f"# schedule-seed: {schedule}\n"
            f"# specials: {failure.specials}\n"
            f"# shrunk from {failure.original_nodes} nodes to {len(failure.graph.nodes)}\n"
            f"# replay: python -m tilefuse.fuzz --replay <this file>\n"
            + print_graph(failure.graph))


def replay(path: str | Path) -> Verdict:
    """Checks a saved repro again with the seeds its header names."""
    text = Path(path).read_text()
    inputs = re.search(r"^# input-seed: (\d+)$", text, re.M)
    schedule = re.search(r"^# schedule-seed: (\w+)$", text, re.M)
    specials = re.search(r"^# specials: ([0-9.e-]+)$", text, re.M)
    graph = parse_graph(text)
    input_seed = int(inputs.group(1)) if inputs else 0
    schedule_seed = None if not schedule or schedule.group(1) == "default" \
        else int(schedule.group(1))
    fraction = float(specials.group(1)) if specials else 0.0
    return check_graph(graph, random_inputs(graph, input_seed, fraction),
                       schedule_seed=schedule_seed)


def _shrunk(graph: Graph, verdict: Verdict, input_seed: int, schedule_seed: int | None,
            specials: float) -> Graph:
    def still_fails(candidate: Graph) -> bool:
        again = check_graph(candidate, random_inputs(candidate, input_seed, specials),
                            schedule_seed=schedule_seed)
        return again.signature() == verdict.signature()
    return shrink(graph, still_fails)


def run_campaign(graphs: int, seed: int, *, schedules: str = "both",
                 config: GeneratorConfig | None = None, out_dir: str | Path | None = None,
                 specials: float = 0.0,
                 max_failures: int = 20, log: Callable[[str], None] | None = None
                 ) -> CampaignReport:
    """Generates and checks ``graphs`` graphs; failures are shrunk (and written to
    ``out_dir`` as ``fail-<index>.graph``). Stops shrinking after ``max_failures``.
    ``specials`` > 0 puts that fraction of NaN/Inf into float inputs."""
    if schedules not in SCHEDULE_MODES:
        raise ValueError(f"schedules must be one of {SCHEDULE_MODES}, got {schedules!r}")
    report = CampaignReport()
    out = Path(out_dir) if out_dir is not None else None
    for index in range(graphs):
        graph = generate_graph(np.random.default_rng([seed, index]), config,
                               name=f"fuzz{index}")
        input_seed, schedule_seed = _seeds(seed, index)
        report.graphs += 1
        modes = {"default": [None], "random": [schedule_seed],
                 "both": [None, schedule_seed],
                 "alternate": [[None], [schedule_seed]][index % 2]}[schedules]
        for sched in modes:
            verdict = check_graph(graph, random_inputs(graph, input_seed, specials),
                                  schedule_seed=sched)
            report.checks[verdict.kind] += 1
            if not verdict.failed:
                continue
            small = _shrunk(graph, verdict, input_seed, sched, specials) \
                if len(report.failures) < max_failures else graph
            failure = Failure(index, input_seed, sched, specials, verdict, len(graph.nodes),
                              small)
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                path = out / f"fail-{index}-{'default' if sched is None else 'random'}.graph"
                path.write_text(repro_text(failure))
                failure = Failure(**{**failure.__dict__, "path": path})
            report.failures.append(failure)
            if log:
                log(f"graph {index}: {verdict.kind} at {verdict.stage}: "
                    f"{verdict.detail.splitlines()[0] if verdict.detail else ''}"
                    f"{f' -> {failure.path}' if failure.path else ''}")
            break
        if log and (index + 1) % 100 == 0:
            log(f"{index + 1} graphs: {report.summary()}")
    return report
