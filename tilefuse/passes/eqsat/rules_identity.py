"""Identity rules: each removes work that computes nothing.

- ``x*1``, ``1*x``, ``x/1``, ``x+0``, ``0+x``, ``x-0`` -> ``x`` when the result has ``x``'s type
  (the constant broadcasts into ``x`` without widening or promoting it);
- ``neg(neg(x))`` -> ``x``;
- ``transpose(transpose(x, p), q)`` -> ``transpose(x, p;q)``; ``transpose(x, identity)`` -> ``x``;
- ``reshape(reshape(x))`` -> ``reshape(x)``; a reshape to ``x``'s own type -> ``x`` (squeeze and
  expand_dims are encoded as reshapes, so squeeze/expand pairs cancel through these two);
- ``cast(cast(x, t1), t2)`` -> ``cast(x, t2)`` when ``t1`` holds every value of ``x`` exactly;
  a cast to ``x``'s own type -> ``x``;
- ``slice(slice(x))`` -> one slice; a slice covering the whole last axis -> ``x``;
- broadcasts: to ``x``'s own type -> ``x``; ``broadcast(broadcast(x))`` -> ``broadcast(x)``;
  ``a op broadcast(b)`` -> ``a op b`` when ``a`` already has the result's shape (the op broadcasts
  ``b`` itself), and the mirror.
"""

from __future__ import annotations

from egglog import String, eq, i64, rule, ruleset, set_, union, var

from tilefuse.passes.eqsat.lang import (
    Term,
    exact_cast,
    is_one,
    is_zero,
    last_dim,
    perm_compose,
    perm_identity,
    shape_of,
    ty,
)

identity_rules = ruleset(name="identity")

e, x, y, c = (var(n, Term) for n in ("e", "x", "y", "c"))
t, t1, t2, p, q, r, u = (var(n, i64) for n in ("t", "t1", "t2", "p", "q", "r", "u"))


def _neutral(name: str, pattern: Term, constant_fact) -> None:
    identity_rules.register(
        rule(eq(e).to(pattern), constant_fact, eq(t).to(ty(e)), eq(t).to(ty(x)), name=name)
        .then(union(e).with_(x)))


_neutral("mul_one", Term.binary("mul", x, c), is_one(c))
_neutral("one_mul", Term.binary("mul", c, x), is_one(c))
_neutral("div_one", Term.binary("div", x, c), is_one(c))
_neutral("add_zero", Term.binary("add", x, c), is_zero(c))
_neutral("zero_add", Term.binary("add", c, x), is_zero(c))
_neutral("sub_zero", Term.binary("sub", x, c), is_zero(c))

identity_rules.register(
    rule(eq(e).to(Term.unary("neg", Term.unary("neg", x))), name="neg_neg").then(union(e).with_(x)),
    rule(eq(e).to(Term.transpose(Term.transpose(x, p), q)), eq(r).to(perm_compose(p, q)),
         eq(t).to(ty(e)), name="transpose_transpose")
    .then(union(e).with_(Term.transpose(x, r)), set_(ty(Term.transpose(x, r))).to(t)),
    rule(eq(e).to(Term.transpose(x, p)), perm_identity(p), name="transpose_identity")
    .then(union(e).with_(x)),
    rule(eq(e).to(Term.reshape(Term.reshape(x, t1), t2)), name="reshape_reshape")
    .then(union(e).with_(Term.reshape(x, t2)), set_(ty(Term.reshape(x, t2))).to(t2)),
    rule(eq(e).to(Term.reshape(x, t)), eq(t).to(ty(x)), name="reshape_identity")
    .then(union(e).with_(x)),
    rule(eq(e).to(Term.cast(Term.cast(x, t1), t2)), eq(t).to(ty(x)), exact_cast(t, t1),
         name="cast_cast_exact")
    .then(union(e).with_(Term.cast(x, t2)), set_(ty(Term.cast(x, t2))).to(t2)),
    rule(eq(e).to(Term.cast(x, t)), eq(t).to(ty(x)), name="cast_identity").then(union(e).with_(x)),
    rule(eq(e).to(Term.slice_last(Term.slice_last(x, p, q), r, u)), eq(t).to(ty(e)),
         name="slice_slice")
    .then(union(e).with_(Term.slice_last(x, p + r, p + u)),
          set_(ty(Term.slice_last(x, p + r, p + u))).to(t)),
    rule(eq(e).to(Term.slice_last(x, 0, q)), eq(q).to(last_dim(ty(x))), name="slice_identity")
    .then(union(e).with_(x)),
    rule(eq(e).to(Term.broadcast(x, t)), eq(t).to(ty(x)), name="broadcast_identity")
    .then(union(e).with_(x)),
    rule(eq(e).to(Term.broadcast(Term.broadcast(x, t1), t2)), name="broadcast_broadcast")
    .then(union(e).with_(Term.broadcast(x, t2)), set_(ty(Term.broadcast(x, t2))).to(t2)),
)


def _implicit_broadcast(name: str, pattern: Term, replacement: Term, kept: Term) -> None:
    identity_rules.register(
        rule(eq(e).to(pattern), eq(t).to(ty(e)), eq(shape_of(ty(kept))).to(shape_of(t)),
             name=name)
        .then(union(e).with_(replacement), set_(ty(replacement)).to(t)))


op = var("op", String)
_implicit_broadcast("binary_broadcast_right", Term.binary(op, x, Term.broadcast(y, t1)),
                    Term.binary(op, x, y), x)
_implicit_broadcast("binary_broadcast_left", Term.binary(op, Term.broadcast(y, t1), x),
                    Term.binary(op, y, x), x)

__all__ = ["identity_rules"]
