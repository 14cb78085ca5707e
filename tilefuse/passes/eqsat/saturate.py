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
from dataclasses import dataclass, field

from egglog import EGraph

from tilefuse.graph.ir import Graph, Literal
from tilefuse.passes.eqsat.decode import decode
from tilefuse.passes.eqsat.encode import encode, is_modelled
from tilefuse.passes.eqsat.extract import choose, read_serialized
from tilefuse.passes.eqsat.rules_identity import identity_rules
from tilefuse.passes.eqsat.rules_layout import layout_rules
from tilefuse.passes.eqsat.rules_matmul import matmul_rules

ALL_RULES = identity_rules | layout_rules | matmul_rules
ITERATION = ALL_RULES
"""One iteration: every rule once. (Saturating the identity rules inside each iteration was
tried: on ResNet-50 it multiplies the transposes by every permutation of the closure.)"""


def rule_names() -> frozenset[str]:
    """The names of every rewrite rule (each rule is named; tests have one case per name)."""
    return frozenset(decl.name for rules in (identity_rules, layout_rules, matmul_rules)
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


def same_nodes(a: Graph, b: Graph) -> bool:
    """Whether ``b`` has ``a``'s nodes in order (ops, attributes, inputs by position).

    Cheaper than printing both graphs: constants the decoder kept are the same Literal objects, so
    they compare by identity instead of by hashing their contents."""
    if len(a.nodes) != len(b.nodes) or len(a.inputs) != len(b.inputs):
        return False
    index_a = {v: i for i, v in enumerate(a.inputs)}
    index_b = {v: i for i, v in enumerate(b.inputs)}
    defined = len(a.inputs)
    for node_a, node_b in zip(a.nodes, b.nodes):
        if node_a.op is not node_b.op or len(node_a.inputs) != len(node_b.inputs):
            return False
        if any(index_a.get(x) != index_b.get(y) for x, y in zip(node_a.inputs, node_b.inputs)):
            return False
        if node_a.attrs.keys() != node_b.attrs.keys() or any(
                not (x is y if isinstance(x, Literal) else x == y)
                for x, y in zip(node_a.attrs.values(), node_b.attrs.values())):
            return False
        for x, y in zip(node_a.outputs, node_b.outputs):
            index_a[x] = index_b[y] = defined
            defined += 1
    return [index_a.get(v) for v in a.outputs] == [index_b.get(v) for v in b.outputs]


def _rule_name(key: object) -> str:
    """egglog reports rules by their declaration; every rule here is named."""
    return getattr(key, "name", None) or str(key)


def saturate(graph: Graph, limits: Limits | None = None) -> SaturationResult:
    """Runs equality saturation on ``graph`` under ``limits``."""
    limits = limits or Limits()
    start = time.perf_counter()
    if not any(is_modelled(node) for node in graph.nodes):
        return SaturationResult(graph, False, stopped="nothing to rewrite")
    egraph = EGraph()
    enc = encode(graph, egraph)
    fired: dict[str, int] = {}
    stopped, iterations, enodes = "iteration limit", 0, 0
    while iterations < limits.max_iterations:
        report = egraph.run(ITERATION)
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
    view = read_serialized(egraph._serialize(split_primitive_outputs=False).to_json())
    result = decode(graph, enc, view, choose(view, enc))
    changed = not same_nodes(graph, result)
    return SaturationResult(result if changed else graph, changed, fired, iterations, enodes,
                            stopped, time.perf_counter() - start)


def equality_saturation(graph: Graph) -> tuple[Graph, bool, dict[str, object]]:
    """The pipeline pass: ``(graph, changed, notes)`` with the default limits."""
    result = saturate(graph)
    return result.graph, result.changed, result.notes()


__all__ = ["ALL_RULES", "Limits", "SaturationResult", "equality_saturation", "rule_names",
           "saturate"]
