"""The loop IR: loops with kinds, vector loads and stores, locals; printer, parser, simplifier,
verifier and a NumPy interpreter (the oracle for code generation)."""

from tilefuse.loop.ir import (
    BOOL,
    I64,
    Block,
    BufferParam,
    Expr,
    For,
    If,
    Let,
    Local,
    LocalStore,
    LoopFunction,
    LoopKind,
    LType,
    Prefetch,
    Stmt,
    Store,
    XOp,
    binary,
    block,
    broadcast,
    cast,
    const,
    fma,
    iota,
    load,
    local_load,
    loop,
    maximum,
    minimum,
    reduce,
    select,
    thread_id,
    unary,
    var,
)
from tilefuse.loop.printer import format_expr, format_function
from tilefuse.loop.simplify import fold_constants, fold_expr, hoist_invariants, simplify
from tilefuse.loop.verify import verify


def __getattr__(name: str) -> object:
    """``interpret`` and ``parse_function``, imported on first use: the interpreter pulls the
    scalar semantics and NumPy special functions, which running compiled kernels never needs."""
    if name == "interpret":
        from tilefuse.loop.interp import interpret

        return interpret
    if name == "parse_function":
        from tilefuse.loop.parser import parse_function

        return parse_function
    raise AttributeError(f"module 'tilefuse.loop' has no attribute {name!r}")


__all__ = [
    "BOOL", "I64", "Block", "BufferParam", "Expr", "For", "If", "LType", "Let", "Local",
    "LocalStore", "LoopFunction", "LoopKind", "Prefetch", "Stmt", "Store", "XOp", "binary", "block",
    "broadcast", "cast", "const", "fma", "fold_constants", "fold_expr", "format_expr",
    "format_function", "hoist_invariants", "interpret", "iota", "load", "local_load", "loop",
    "maximum", "minimum", "parse_function", "reduce", "select", "simplify", "thread_id", "unary",
    "var", "verify",
]
