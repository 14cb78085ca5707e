"""The equality-saturation pass: encode, run the rule sets under limits, extract, decode.

egglog has no node or time limit of its own, so the rules run one iteration at a time (every
rule set once per iteration) and the loop stops at saturation (an iteration that changed nothing)
or when a limit is reached: :attr:`Limits.max_nodes` e-nodes, :attr:`Limits.max_seconds` of
wall time, :attr:`Limits.max_iterations`. Whatever the e-graph holds when it stops is a correct
set of equalities, so extraction is valid at any stopping point; the result records why it
stopped.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from egglog import EGraph

from tilefuse.graph.ir import Graph, Literal
from tilefuse.passes.eqsat.decode import decode
from tilefuse.passes.eqsat.encode import encode, is_modelled
from tilefuse.passes.eqsat.extract import choose, read_serialized
from tilefuse.passes.eqsat.rules_identity import identity_rules
from tilefuse.passes.eqsat.rules_layout import layout_rules
from tilefuse.passes.eqsat.rules_matmul import matmul_rules, reassociation_rules

ITERATION = identity_rules | layout_rules | matmul_rules
"""One iteration: every rule once. (Saturating the identity rules inside each iteration was
tried: on ResNet-50 it multiplies the transposes by every permutation of the closure.) These
rules keep NaN/Inf semantics."""

ALL_RULES = ITERATION | reassociation_rules
"""One iteration with re-association too, which can turn a NaN into an inf (see
``rules_matmul``): only under the explicit ``reassociate=True``."""


def rule_names() -> frozenset[str]:
    """The names of every rewrite rule (each rule is named; tests have one case per name)."""
    return frozenset(decl.name for rules in (identity_rules, layout_rules, matmul_rules,
                                             reassociation_rules)
                     for decl in rules.__egg_ruleset__.rules)



@dataclass(frozen=True)
class Limits:
    """Bounds on one saturation; the defaults keep a 12-layer BERT-base graph well within 2 s."""

    max_nodes: int = 200_000
    max_seconds: float = 1.5
    max_iterations: int = 40


@dataclass(frozen=True)
class SaturationResult:
    graph: Graph
    changed: bool
    rules_fired: dict[str, int] = field(default_factory=dict)
    iterations: int = 0
    enodes: int = 0
    stopped: str = "saturated"   # saturated | node/time/iteration limit | nothing to rewrite
    seconds: float = 0.0

    def notes(self) -> dict[str, object]:
        """What the pass manager prints for this pass."""
        fired = {k: v for k, v in sorted(self.rules_fired.items()) if v}
        return {"stopped": self.stopped, "iterations": self.iterations, "enodes": self.enodes,
                "rules_fired": fired}


def same_computation(a: Graph, b: Graph) -> bool:
    """Whether ``b`` computes what ``a`` does with the same nodes, in any order: the decoder emits
    nodes in the order their readers reach them, so an extraction that chose every original
    e-node can still list them differently.

    Values of both graphs are numbered in one shared table by structure (op, attributes, the
    numbers of their inputs), so equal structures get equal numbers whatever the node order; the
    graphs must have the same multiset of nodes and the same outputs. Constants kept by the
    decoder are the same Literal objects, compared by identity (no hashing of their contents)."""
    if len(a.nodes) != len(b.nodes) or len(a.inputs) != len(b.inputs):
        return False
    table: dict[object, int] = {}

    def number(graph: Graph) -> tuple[Counter[int], list[int]]:
        of = {v: table.setdefault(("input", i), len(table)) for i, v in enumerate(graph.inputs)}
        nodes: Counter[int] = Counter()
        for node in graph.nodes:
            attrs = tuple((k, ("literal", id(v)) if isinstance(v, Literal) else repr(v))
                          for k, v in node.attrs.items())
            key = table.setdefault((node.op.name, attrs, tuple(of[v] for v in node.inputs)),
                                   len(table))
            nodes[key] += 1
            for index, v in enumerate(node.outputs):
                of[v] = table.setdefault(("output", key, index), len(table))
        return nodes, [of[v] for v in graph.outputs]

    return number(a) == number(b)


def _rule_name(key: object) -> str:
    """egglog reports rules by their declaration; every rule here is named."""
    return getattr(key, "name", None) or str(key)


def saturate(graph: Graph, limits: Limits | None = None, *,
             reassociate: bool = False) -> SaturationResult:
    """Runs equality saturation on ``graph`` under ``limits``.

    The result is ``graph`` itself, unchanged, when no rule matched or when the extraction chose
    the original nodes (in whatever order): a pass that changes nothing keeps node order, names
    and locations. ``reassociate`` adds the re-association of constant matmuls, which can turn
    a NaN into an inf (see ``rules_matmul``)."""
    limits = limits or Limits()
    iteration = ALL_RULES if reassociate else ITERATION
    start = time.perf_counter()
    if not any(is_modelled(node) for node in graph.nodes):
        return SaturationResult(graph, False, stopped="nothing to rewrite")
    egraph = EGraph()
    enc = encode(graph, egraph)
    fired: dict[str, int] = {}
    stopped, iterations, enodes = "iteration limit", 0, 0
    while iterations < limits.max_iterations:
        report = egraph.run(iteration)
        iterations += 1
        for key, count in report.num_matches_per_rule.items():
            fired[_rule_name(key)] = fired.get(_rule_name(key), 0) + count
        enodes = sum(size for _, size in egraph.all_function_sizes())
        if not report.updated:
            stopped = "saturated"
            break
        if enodes >= limits.max_nodes:
            stopped = "node limit"
            break
        if time.perf_counter() - start >= limits.max_seconds:
            stopped = "time limit"
            break
    if not any(fired.values()):
        return SaturationResult(graph, False, fired, iterations, enodes, stopped,
                                time.perf_counter() - start)
    view = read_serialized(egraph._serialize(split_primitive_outputs=False).to_json())
    result = decode(graph, enc, view, choose(view, enc))
    changed = not same_computation(graph, result)
    return SaturationResult(result if changed else graph, changed, fired, iterations, enodes,
                            stopped, time.perf_counter() - start)


def equality_saturation(graph: Graph) -> tuple[Graph, bool, dict[str, object]]:
    """The pipeline pass: ``(graph, changed, notes)`` with the default limits; NaN/Inf-keeping
    rules only."""
    result = saturate(graph)
    return result.graph, result.changed, result.notes()


def equality_saturation_reassociating(graph: Graph) -> tuple[Graph, bool, dict[str, object]]:
    """The pipeline pass with re-association of constant matmuls (``graph_pipeline(
    reassociate=True)``): fewer FLOPs, but an inf in the input can give ±inf where NumPy
    gives NaN."""
    result = saturate(graph, reassociate=True)
    return result.graph, result.changed, result.notes()


__all__ = ["ALL_RULES", "ITERATION", "Limits", "SaturationResult", "equality_saturation",
           "equality_saturation_reassociating", "rule_names", "same_computation", "saturate"]
