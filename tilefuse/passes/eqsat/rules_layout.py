"""Layout rules: transposes move through elementwise ops and matmuls, both ways, so that
extraction can put them where they cost least (or cancel them against each other).

- ``transpose(f(x), p)`` -> ``f(transpose(x, p))`` for unary ``f`` and casts (only pushed: the
  reverse pulled every transpose back up through every unary op; on ResNet-50 it doubled the
  saturation time and changed no extracted graph);
- ``transpose(a op b, p)`` -> ``transpose(a, p) op transpose(b, p)`` when ``a`` and ``b`` have
  the result's shape, or ``b`` (``a``) is a scalar; when ``b`` is a constant that broadcasts
  (a per-channel scale ``[C,1,1]`` against NCHW), it is reshaped to the full rank and transposed
  too, which folding does at compile time: so ``conv -> batch-norm scale/shift -> relu -> conv``
  lowered through NHWC matmuls loses its NCHW round trip; ``transpose(a, p) op transpose(b, p)`` ->
  ``transpose(a op b, p)`` (same rank, so broadcasting commutes with the permutation);
- ``transpose(a @ b, s)`` <-> ``transpose(b, s) @ transpose(a, s)`` for a permutation ``s`` that
  swaps the last two axes (a, b and the result of one rank).
- ``f(reshape(x, t))`` -> ``reshape(f(x), t)`` for a unary ``f`` that keeps its input's type: a
  reshape moves past it towards its readers, where it meets their reshapes. torch's linear
  layers write ``view -> gelu -> view`` between two ``addmm``s; once the views cancel, the gelu
  is the first matmul's epilogue (computed on its accumulators) instead of the second's
  prologue (a pass that reads the hidden activations and writes them back), and so for every
  unary op between a product and its reader.

The cost model charges a transpose as a full memory pass, so a transpose only survives
extraction where it is cheapest; pushing one onto a constant is free (folded at compile time).
"""

from __future__ import annotations

from egglog import String, eq, i64, rule, ruleset, set_, union, var

from tilefuse.passes.eqsat.lang import (
    Term,
    is_const,
    perm_inverse,
    perm_swaps_last_two,
    rank_of,
    ranked,
    scalar_type,
    shape_of,
    transposed,
    ty,
)

layout_rules = ruleset(name="layout")

e, x, a, b, c = (var(n, Term) for n in ("e", "x", "a", "b", "c"))
t, ta, tb, tc, p, pi = (var(n, i64) for n in ("t", "ta", "tb", "tc", "p", "pi"))
op = var("op", String)


def _typed(term: Term, type_id: i64) -> object:
    return set_(ty(term)).to(type_id)


def _with_constant(op, a: Term, c: Term, p, full, *, right: bool) -> Term:
    moved = Term.transpose(Term.reshape(c, full), p)
    pushed = Term.transpose(a, p)
    return Term.binary(op, pushed, moved) if right else Term.binary(op, moved, pushed)


def _typed_constant(a: Term, c: Term, p, ta, tb, tc, t, *, right: bool) -> list:
    reshaped = Term.reshape(c, tb)
    return [_typed(reshaped, tb), _typed(Term.transpose(reshaped, p), tc),
            _typed(Term.transpose(a, p), ta),
            _typed(_with_constant(op, a, c, p, tb, right=right), t), is_const(reshaped),
            is_const(Term.transpose(reshaped, p))]


layout_rules.register(
    rule(eq(e).to(Term.unary(op, Term.reshape(x, t))), eq(t).to(ty(e)), eq(ta).to(ty(x)),
         name="reshape_out_of_unary")
    .then(union(e).with_(Term.reshape(Term.unary(op, x), t)),
          _typed(Term.unary(op, x), ta), _typed(Term.reshape(Term.unary(op, x), t), t)),
    rule(eq(e).to(Term.transpose(Term.unary(op, x), p)), eq(t).to(ty(e)),
         eq(ta).to(transposed(ty(x), p)), name="transpose_into_unary")
    .then(union(e).with_(Term.unary(op, Term.transpose(x, p))),
          _typed(Term.transpose(x, p), ta), _typed(Term.unary(op, Term.transpose(x, p)), t)),
    rule(eq(e).to(Term.transpose(Term.cast(x, tc), p)), eq(t).to(ty(e)),
         eq(ta).to(transposed(ty(x), p)), name="transpose_into_cast")
    .then(union(e).with_(Term.cast(Term.transpose(x, p), t)),
          _typed(Term.transpose(x, p), ta), _typed(Term.cast(Term.transpose(x, p), t), t)),
    rule(eq(e).to(Term.transpose(Term.binary(op, a, b), p)), eq(t).to(ty(e)),
         eq(shape_of(ty(a))).to(shape_of(ty(Term.binary(op, a, b)))),
         eq(shape_of(ty(b))).to(shape_of(ty(Term.binary(op, a, b)))),
         eq(ta).to(transposed(ty(a), p)), eq(tb).to(transposed(ty(b), p)),
         name="transpose_into_binary")
    .then(union(e).with_(Term.binary(op, Term.transpose(a, p), Term.transpose(b, p))),
          _typed(Term.transpose(a, p), ta), _typed(Term.transpose(b, p), tb),
          _typed(Term.binary(op, Term.transpose(a, p), Term.transpose(b, p)), t)),
    rule(eq(e).to(Term.transpose(Term.binary(op, a, c), p)), eq(t).to(ty(e)),
         scalar_type(ty(c)), eq(shape_of(ty(a))).to(shape_of(ty(Term.binary(op, a, c)))),
         eq(ta).to(transposed(ty(a), p)), name="transpose_into_binary_scalar_right")
    .then(union(e).with_(Term.binary(op, Term.transpose(a, p), c)),
          _typed(Term.transpose(a, p), ta), _typed(Term.binary(op, Term.transpose(a, p), c), t)),
    rule(eq(e).to(Term.transpose(Term.binary(op, c, a), p)), eq(t).to(ty(e)),
         scalar_type(ty(c)), eq(shape_of(ty(a))).to(shape_of(ty(Term.binary(op, c, a)))),
         eq(ta).to(transposed(ty(a), p)), name="transpose_into_binary_scalar_left")
    .then(union(e).with_(Term.binary(op, c, Term.transpose(a, p))),
          _typed(Term.transpose(a, p), ta), _typed(Term.binary(op, c, Term.transpose(a, p)), t)),
    rule(eq(e).to(Term.transpose(Term.binary(op, a, c), p)), eq(t).to(ty(e)), is_const(c),
         eq(shape_of(ty(a))).to(shape_of(ty(Term.binary(op, a, c)))),
         eq(ta).to(transposed(ty(a), p)), eq(tb).to(ranked(ty(c), rank_of(ty(a)))),
         eq(tc).to(transposed(tb, p)), name="transpose_into_binary_constant_right")
    .then(union(e).with_(_with_constant(op, a, c, p, tb, right=True)),
          *_typed_constant(a, c, p, ta, tb, tc, t, right=True)),
    rule(eq(e).to(Term.transpose(Term.binary(op, c, a), p)), eq(t).to(ty(e)), is_const(c),
         eq(shape_of(ty(a))).to(shape_of(ty(Term.binary(op, c, a)))),
         eq(ta).to(transposed(ty(a), p)), eq(tb).to(ranked(ty(c), rank_of(ty(a)))),
         eq(tc).to(transposed(tb, p)), name="transpose_into_binary_constant_left")
    .then(union(e).with_(_with_constant(op, a, c, p, tb, right=False)),
          *_typed_constant(a, c, p, ta, tb, tc, t, right=False)),
    rule(eq(e).to(Term.binary(op, Term.transpose(a, p), Term.transpose(b, p))), eq(t).to(ty(e)),
         eq(pi).to(perm_inverse(p)), eq(tb).to(transposed(t, pi)), name="transpose_out_of_binary")
    .then(union(e).with_(Term.transpose(Term.binary(op, a, b), p)),
          _typed(Term.binary(op, a, b), tb), _typed(Term.transpose(Term.binary(op, a, b), p), t)),
    rule(eq(e).to(Term.transpose(Term.matmul(a, b), p)), perm_swaps_last_two(p), eq(t).to(ty(e)),
         eq(ta).to(transposed(ty(a), p)), eq(tb).to(transposed(ty(b), p)),
         name="transpose_into_matmul")
    .then(union(e).with_(Term.matmul(Term.transpose(b, p), Term.transpose(a, p))),
          _typed(Term.transpose(a, p), ta), _typed(Term.transpose(b, p), tb),
          _typed(Term.matmul(Term.transpose(b, p), Term.transpose(a, p)), t)),
    rule(eq(e).to(Term.matmul(Term.transpose(a, p), Term.transpose(b, p))),
         perm_swaps_last_two(p), eq(t).to(ty(e)), eq(tb).to(transposed(t, p)),
         name="transpose_out_of_matmul")
    .then(union(e).with_(Term.transpose(Term.matmul(b, a), p)),
          _typed(Term.matmul(b, a), tb), _typed(Term.transpose(Term.matmul(b, a), p), t)),
)

__all__ = ["layout_rules"]
