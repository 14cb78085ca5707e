"""Matmul rules over constant operands (constants are folded after extraction, so work moved onto
them is done once at compile time).

- scale folding: ``(x @ W) * c`` -> ``x @ (W * c)`` and ``(x @ W) / c`` -> ``x @ (W / c)`` for a
  constant W and a scalar constant c of W's dtype (and the mirror ``c * (x @ W)``);
- re-association (its own rule set, ``reassociation_rules``, off by default): ``(x @ A) @ B`` ->
  ``x @ (A @ B)`` for constant 2-D A and B; the cost model (FLOPs) decides which side is
  extracted. It changes NaN/Inf semantics: with an inf in ``x``, ``x @ A`` holds infs of both
  signs, so ``(x @ A) @ B`` sums ``+inf`` and ``-inf`` into NaN where ``x @ (A @ B)`` gives
  ``±inf`` (found by the fuzzer). Only ``saturate(..., reassociate=True)`` /
  ``graph_pipeline(reassociate=True)`` run it;
- parallel matmuls sharing an input: ``x @ A`` and ``x @ B`` (constant 2-D, same rows) ->
  slices of ``x @ concat(A, B)``. The encoder numbers each group's weights in graph order
  (``group_head`` / ``group_next``); the rule only extends a chain that starts at the head with the
  next weight, so Q, K, V become ``x @ concat(concat(Wq, Wk), Wv)`` one way only, and it subsumes
  the separate matmuls. The merge is a decision, not a cost-model choice: no extractor that picks
  per e-class sees that three slices share one matmul, so offering both forms would let it pick
  half-merged mixtures that compute the big matmul more than once. The encoder offers a group
  only when the merge pays under the cost model's prices (``encode.merge_pays``: ``x`` read
  once instead of k times, against a memory pass per slice); for BERT-base's Q/K/V (x and each
  result the same size) it does not, and the projections stay three matmuls.
- then their bias adds: ``slice(m, 0, i) + a`` and ``slice(m, i, j) + b`` (constant a, b of
  the slices' widths) -> slices of ``slice(m, 0, j) + concat(a, b)``, again only from the start
  of ``m`` and subsuming the separate adds, so the merged matmul keeps its bias as one epilogue.
"""

from __future__ import annotations

from egglog import eq, i64, rule, ruleset, set_, subsume, union, var

from tilefuse.passes.eqsat.lang import (
    Term,
    concat_last_type,
    group_first,
    group_head,
    group_last,
    group_next,
    is_const,
    last_dim,
    matmul_type,
    rank2_type,
    scale_type,
    ty,
)

matmul_rules = ruleset(name="matmul")

e, x, w, c, a, b, m = (var(n, Term) for n in ("e", "x", "w", "c", "a", "b", "m"))
m1, m2 = var("m1", Term), var("m2", Term)
t, tw, tab, tcat, tm, na, nb = (var(n, i64) for n in ("t", "tw", "tab", "tcat", "tm", "na", "nb"))
fa, la, fb, lb = (var(n, i64) for n in ("fa", "la", "fb", "lb"))


def _scale(name: str, op: str, pattern: Term) -> None:
    scaled = Term.matmul(x, Term.binary(op, w, c))
    matmul_rules.register(
        rule(eq(e).to(pattern), is_const(w), is_const(c), eq(tw).to(ty(w)),
             scale_type(tw, ty(c)), eq(t).to(ty(e)), eq(t).to(ty(Term.matmul(x, w))), name=name)
        .then(union(e).with_(scaled), set_(ty(Term.binary(op, w, c))).to(tw),
              set_(ty(scaled)).to(t), is_const(Term.binary(op, w, c))))


_scale("scale_into_matmul", "mul", Term.binary("mul", Term.matmul(x, w), c))
_scale("scale_into_matmul_left", "mul", Term.binary("mul", c, Term.matmul(x, w)))
_scale("divide_into_matmul", "div", Term.binary("div", Term.matmul(x, w), c))

reassociation_rules = ruleset(name="reassociate")
reassociation_rules.register(
    rule(eq(e).to(Term.matmul(Term.matmul(x, a), b)), is_const(a), is_const(b),
         rank2_type(ty(a)), rank2_type(ty(b)), eq(tab).to(matmul_type(ty(a), ty(b))),
         eq(t).to(ty(e)), name="reassociate_constant_matmuls")
    .then(union(e).with_(Term.matmul(x, Term.matmul(a, b))),
          set_(ty(Term.matmul(a, b))).to(tab), set_(ty(Term.matmul(x, Term.matmul(a, b)))).to(t),
          is_const(Term.matmul(a, b))),
)

_merged = Term.matmul(x, Term.concat_last(a, b))
_chained = Term.concat_last(a, b)
matmul_rules.register(
    rule(eq(m1).to(Term.matmul(x, a)), eq(m2).to(Term.matmul(x, b)),
         eq(fa).to(group_first(a)), group_head(fa), eq(la).to(group_last(a)),
         eq(fb).to(group_first(b)), group_next(la, fb), eq(lb).to(group_last(b)),
         eq(tcat).to(concat_last_type(ty(a), ty(b))), eq(tm).to(concat_last_type(ty(m1), ty(m2))),
         eq(na).to(last_dim(ty(a))), eq(nb).to(last_dim(ty(b))), name="merge_parallel_matmuls")
    .then(set_(ty(_chained)).to(tcat), is_const(_chained), set_(group_first(_chained)).to(fa),
          set_(group_last(_chained)).to(lb), set_(ty(_merged)).to(tm),
          union(m1).with_(Term.slice_last(_merged, 0, na)),
          union(m2).with_(Term.slice_last(_merged, na, na + nb)),
          subsume(Term.matmul(x, a)), subsume(Term.matmul(x, b))),
)

_s1 = Term.slice_last(m, 0, na)
_s2 = Term.slice_last(m, na, nb)
_whole = Term.slice_last(m, 0, nb)
_biases = Term.concat_last(a, b)
_biased = Term.binary("add", _whole, _biases)
matmul_rules.register(
    rule(eq(m1).to(Term.binary("add", _s1, a)), eq(m2).to(Term.binary("add", _s2, b)),
         is_const(a), is_const(b), eq(na).to(last_dim(ty(a))), eq(nb - na).to(last_dim(ty(b))),
         eq(t).to(ty(_s1)), eq(t).to(ty(m1)), eq(tw).to(ty(_s2)), eq(tw).to(ty(m2)),
         eq(tcat).to(concat_last_type(ty(a), ty(b))), eq(tm).to(concat_last_type(t, tw)),
         name="merge_sliced_bias_adds")
    .then(set_(ty(_biases)).to(tcat), is_const(_biases), set_(ty(_whole)).to(tm),
          set_(ty(_biased)).to(tm),
          union(m1).with_(Term.slice_last(_biased, 0, na)),
          union(m2).with_(Term.slice_last(_biased, na, nb)),
          subsume(Term.binary("add", _s1, a)), subsume(Term.binary("add", _s2, b))),
)

__all__ = ["matmul_rules", "reassociation_rules"]
