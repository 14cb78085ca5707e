"""The e-graph language: one egglog sort for tensor terms and the tables rules consult.

Terms name no arrays and no shapes. Graph values that stay as they are (graph inputs, constants,
results of ops the e-graph does not model) are ``Term.leaf(id)``, constants included: they are
referenced by id, never by content. Every term's type (a ``TensorType``) is an id too, kept in
``ty(term)``; rules that build a term set its type from a table the encoder filled in Python
(transposed type, matmul result type, ...), and the decoder checks each rebuilt node's inferred type
against it, so a wrong rule fails loudly instead of changing results.

Attributes are ids as well: a transpose's permutation (``perm`` tables: composition, inverse,
identity, swap of the last two axes), a reshape / cast / broadcast's target type, an elementwise
op's ``(op, attrs)`` key (a string such as ``"add"`` or ``"gelu{approximate=tanh}"``).
"""

from __future__ import annotations

from egglog import (
    Expr,
    String,
    StringLike,
    function,
    i64,
    i64Like,
    relation,
    rule,
    ruleset,
    set_,
    union,
    var,
    vars_,
)


class Term(Expr):
    """A tensor-valued term."""

    @classmethod
    def leaf(cls, value_id: i64Like) -> Term: ...

    @classmethod
    def unary(cls, op: StringLike, x: Term) -> Term: ...

    @classmethod
    def binary(cls, op: StringLike, a: Term, b: Term) -> Term: ...

    @classmethod
    def transpose(cls, x: Term, perm: i64Like) -> Term: ...

    @classmethod
    def reshape(cls, x: Term, to: i64Like) -> Term: ...

    @classmethod
    def broadcast(cls, x: Term, to: i64Like) -> Term: ...

    @classmethod
    def cast(cls, x: Term, to: i64Like) -> Term: ...

    @classmethod
    def matmul(cls, a: Term, b: Term) -> Term: ...

    @classmethod
    def concat_last(cls, a: Term, b: Term) -> Term: ...

    @classmethod
    def slice_last(cls, x: Term, start: i64Like, stop: i64Like) -> Term: ...


@function(merge=lambda old, new: old)
def ty(x: Term) -> i64:
    """The type id of a term (all terms of one e-class share it)."""


@function
def root(index: i64Like) -> Term:
    """The terms the decoder extracts: graph outputs and inputs of unmodelled nodes."""


@function
def ref(index: i64Like) -> Term:
    """The encoder's name for the term of graph value ``index`` (how one fact reads another's
    term without an egglog ``let``, which costs a global table each)."""


# Rows the encoder loads in bulk (egglog ``input`` of TSV files); the ``load`` rules below turn
# them into terms. Every graph value has an id; ``ref(id)`` is its term.
leaf_row = relation("leaf_row", i64, i64)                         # id, type
unary_row = relation("unary_row", i64, String, i64, i64)          # id, op, x, type
binary_row = relation("binary_row", i64, String, i64, i64, i64)   # id, op, a, b, type
transpose_row = relation("transpose_row", i64, i64, i64, i64)     # id, x, perm, type
reshape_row = relation("reshape_row", i64, i64, i64)              # id, x, type
broadcast_row = relation("broadcast_row", i64, i64, i64)          # id, x, type
cast_row = relation("cast_row", i64, i64, i64)                    # id, x, type
matmul_row = relation("matmul_row", i64, i64, i64, i64)           # id, a, b, type
root_row = relation("root_row", i64, i64)                         # root index, id
const_row = relation("const_row", i64)
one_row = relation("one_row", i64)
zero_row = relation("zero_row", i64)
group_row = relation("group_row", i64, i64)                       # weight id, chain position

# Facts about leaves (set by the encoder) and propagated by rules.
is_const = relation("is_const", Term)
is_one = relation("is_one", Term)
is_zero = relation("is_zero", Term)


# Tables over ids, filled by the encoder.
@function
def perm_compose(first: i64Like, then: i64Like) -> i64:
    """``transpose(transpose(x, first), then) == transpose(x, perm_compose(first, then))``."""


@function
def perm_inverse(perm: i64Like) -> i64: ...


perm_identity = relation("perm_identity", i64)
perm_swaps_last_two = relation("perm_swaps_last_two", i64)


@function
def transposed(type_id: i64Like, perm: i64Like) -> i64:
    """The type of ``transpose(x, perm)`` for ``x`` of type ``type_id``."""


@function
def shape_of(type_id: i64Like) -> i64:
    """A shape id: two types with the same shape (any dtype) have the same one."""


@function
def matmul_type(a: i64Like, b: i64Like) -> i64:
    """The type of ``matmul(a, b)`` (filled for the pairs rules may build)."""


@function
def concat_last_type(a: i64Like, b: i64Like) -> i64:
    """The type of ``a`` and ``b`` concatenated on their last axis (filled where rules need it)."""


@function
def last_dim(type_id: i64Like) -> i64: ...


@function
def rank_of(type_id: i64Like) -> i64: ...


@function
def ranked(type_id: i64Like, rank: i64Like) -> i64:
    """A constant's type with leading 1s up to ``rank`` (how it broadcasts against that rank)."""


@function(merge=lambda old, new: old)
def group_first(weight: Term) -> i64:
    """Position of the first weight in a chain of parallel-matmul weights (see rules_matmul)."""


@function(merge=lambda old, new: old)
def group_last(weight: Term) -> i64: ...


group_head = relation("group_head", i64)             # the first position of a group
group_next = relation("group_next", i64, i64)        # (i, i + 1) within one group


scalar_type = relation("scalar_type", i64)           # rank 0
exact_cast = relation("exact_cast", i64, i64)        # (from, to): every value survives
rank2_type = relation("rank2_type", i64)             # 2-D (for matmul merges / re-association)
scale_type = relation("scale_type", i64, i64)        # (w, c): w * c has w's type, c rank 0



def _load_rules():
    """The ``load`` rule set: rows -> terms, types and facts (run once, before the rewrites)."""
    i, a, b, t, p, k = vars_("i a b t p k", i64)
    op = var("op", String)
    rules = ruleset(name="load")

    def made(term: Term):
        return union(ref(i)).with_(term), set_(ty(ref(i))).to(t)

    rules.register(
        rule(leaf_row(i, t), name="load_leaf").then(*made(Term.leaf(i))),
        rule(unary_row(i, op, a, t), name="load_unary").then(*made(Term.unary(op, ref(a)))),
        rule(binary_row(i, op, a, b, t), name="load_binary")
        .then(*made(Term.binary(op, ref(a), ref(b)))),
        rule(transpose_row(i, a, p, t), name="load_transpose")
        .then(*made(Term.transpose(ref(a), p))),
        rule(reshape_row(i, a, t), name="load_reshape").then(*made(Term.reshape(ref(a), t))),
        rule(broadcast_row(i, a, t), name="load_broadcast").then(*made(Term.broadcast(ref(a), t))),
        rule(cast_row(i, a, t), name="load_cast").then(*made(Term.cast(ref(a), t))),
        rule(matmul_row(i, a, b, t), name="load_matmul").then(*made(Term.matmul(ref(a), ref(b)))),
        rule(root_row(k, i), name="load_root").then(union(root(k)).with_(ref(i))),
        rule(const_row(i), name="load_const").then(is_const(ref(i))),
        rule(one_row(i), name="load_one").then(is_one(ref(i))),
        rule(zero_row(i), name="load_zero").then(is_zero(ref(i))),
        rule(group_row(i, p), name="load_group")
        .then(set_(group_first(ref(i))).to(p), set_(group_last(ref(i))).to(p)),
    )
    return rules


load_rules = _load_rules()

__all__ = [
    "String",
    "Term",
    "binary_row",
    "broadcast_row",
    "cast_row",
    "concat_last_type",
    "const_row",
    "exact_cast",
    "group_first",
    "group_head",
    "group_last",
    "group_next",
    "group_row",
    "is_const",
    "is_one",
    "is_zero",
    "last_dim",
    "leaf_row",
    "load_rules",
    "matmul_row",
    "matmul_type",
    "one_row",
    "perm_compose",
    "perm_identity",
    "perm_inverse",
    "perm_swaps_last_two",
    "rank2_type",
    "ref",
    "reshape_row",
    "root",
    "root_row",
    "scalar_type",
    "scale_type",
    "shape_of",
    "transpose_row",
    "transposed",
    "ty",
    "unary_row",
    "zero_row",
]
