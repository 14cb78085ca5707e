"""The torch op suite: every ATen op in ``ATEN_CONVERTERS`` run on a few of its OpInfo sample
inputs through ``torch.compile(backend=tilefuse)`` and compared with torch eager.

Each OpInfo entry that exercises a mapped ATen op gets at most :data:`PER_OP` samples (float32,
no grad, no complex), chosen to differ in shapes and arguments (first, middle and last of the
distinct ones); the whole suite is capped at :data:`TOTAL_CAP` samples. Tensors reach the
compiled function as inputs; every other argument is baked in as a constant. A sample passes
when it matches eager within :mod:`tilefuse.testing`'s tolerances *and* no node fell back to
torch (the partition reports and the ``tilefuse.fallback`` log both say none did). Known
failures are listed, each with its reason, in :mod:`opinfo_xfail` and run as strict xfails so
that a fix shows. ATen ops that no OpInfo exercises are listed in :data:`NO_OPINFO`.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest")

from opinfo_xfail import XFAIL  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.opinfo.core import OpInfo, SampleInput  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402

from tilefuse.frontend.torch.aten import ATEN_CONVERTERS  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402

PER_OP = 3
"""Samples per OpInfo entry at most."""
TOTAL_CAP = 150
"""Samples in the whole suite at most (a torch.compile costs ~0.2-0.5 s)."""

OPINFO_OVERRIDES: dict[str, tuple[str, ...]] = {
    "aten.silu.default": ("nn.functional.silu",),
    "aten.convolution.default": ("nn.functional.conv1d", "nn.functional.conv2d"),
    "aten.native_layer_norm.default": ("native_layer_norm", "nn.functional.layer_norm"),
    "aten.native_batch_norm.default": ("native_batch_norm",),
    "aten.native_group_norm.default": ("nn.functional.group_norm",),
    "aten._native_batch_norm_legit_no_training.default": ("nn.functional.batch_norm",),
    "aten.embedding.default": ("nn.functional.embedding",),
    "aten._to_copy.default": ("to", "float", "double"),
    "aten.max_pool2d_with_indices.default": ("nn.functional.max_pool2d",),
    "aten._adaptive_avg_pool2d.default": ("nn.functional.adaptive_avg_pool2d",),
    "aten.constant_pad_nd.default": ("constant_pad_nd", "nn.functional.pad.constant"),
    "aten.gelu.default": ("nn.functional.gelu",),
    "aten.relu.default": ("nn.functional.relu",),
    "aten.avg_pool2d.default": ("nn.functional.avg_pool2d",),
    "aten.empty.memory_format": (),
    **{f"aten.bitwise_{name}.{kind}": () for name, kind in
       (("and", "Tensor"), ("or", "Tensor"), ("xor", "Tensor"), ("and", "Scalar"),
        ("or", "Scalar"), ("not", "default"))},
}
"""ATen overload → OpInfo entries (``name`` or ``name.variant``) where the aten name is not
enough."""

NO_OPINFO: dict[str, str] = {
    "aten._unsafe_view.default": "internal view; no OpInfo (reached through reshape/matmul)",
    "aten.detach.default": "no OpInfo (autograd-only alias)",
    "aten.alias.default": "no OpInfo (internal alias)",
    "aten.lift_fresh_copy.default": "no OpInfo (internal, from torch.tensor constants)",
    "aten.empty.memory_format": "OpInfo 'empty' exists, but its values are undefined: "
                                "there is nothing to compare with eager",
    "aten.as_strided_.default": "no OpInfo for the in-place form (channels-last restrides "
                                "from adaptive_avg_pool2d); run by resnet50_f16 in "
                                "tests/cross/test_zoo_cuda.py",
    "aten.index.Tensor": "no OpInfo named index (advanced indexing reaches it through "
                         "__getitem__); tested in tests/cross/test_aten_index.py",
    **{f"aten.bitwise_{name}.{kind}": "OpInfo samples here are float32, which bitwise ops "
       "refuse; the bool forms (the only ones converted) are in tests/cross/test_aten_index.py"
       for name, kind in (("and", "Tensor"), ("or", "Tensor"), ("xor", "Tensor"),
                          ("and", "Scalar"), ("or", "Scalar"), ("not", "default"))},
    **{f"aten._scaled_dot_product_{kind}_attention{extra}.default":
       "the fused SDPA kernels' op, which only CUDA traces give (CPU traces decompose SDPA); "
       "converted in tests/gpu/test_attention.py"
       for kind, extra in (("flash", ""), ("efficient", ""), ("cudnn", ""),
                           ("fused", "_overrideable"))},
    "aten.convolution_backward.default": "a backward op (no OpInfo); checked by the CNN "
                                         "training tests in tests/torch/test_torch_training.py",
    "aten.copy.default": "the functional copy of an optimizer step's copy_ (OpInfo 'copy_' "
                         "is in place); checked in tests/torch/test_torch_training.py",
}
"""Mapped ATen ops that no OpInfo sample exercises here, with why."""

REDUCTION_OPS = ("sum", "mean", "var", "mm", "bmm", "matmul", "addmm", "softmax", "log_softmax",
                 "native_layer_norm", "nn.functional.layer_norm", "nn.functional.group_norm",
                 "native_batch_norm",
                 "nn.functional.batch_norm", "nn.functional.conv1d", "nn.functional.conv2d",
                 "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d")
"""OpInfo entries compared with the reduction/contraction tolerance."""


def _entry_name(op: OpInfo) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _opinfos() -> dict[str, OpInfo]:
    """The OpInfo entries that exercise some mapped ATen op, by entry name."""
    by_name: dict[str, list[OpInfo]] = {}
    for op in op_db:
        for key in {op.name, op.aten_name, _entry_name(op)}:
            by_name.setdefault(key, []).append(op)
    chosen: dict[str, OpInfo] = {}
    for overload in ATEN_CONVERTERS:
        if overload is operator.getitem:
            continue
        key = str(overload)
        if key in OPINFO_OVERRIDES:
            names = OPINFO_OVERRIDES[key]
        else:
            names = (overload._schema.name.split("::")[1].lstrip("_"),)
        for name in names:
            for op in by_name.get(name, []):
                chosen.setdefault(_entry_name(op), op)
    return dict(sorted(chosen.items()))


@dataclass(frozen=True)
class Case:
    entry: str
    index: int
    sample: SampleInput | None


def _unsupported(sample: SampleInput) -> str | None:
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.is_complex():
                return "complex tensor"
            if leaf.requires_grad:
                return "requires_grad"
        elif isinstance(leaf, complex):
            return "complex scalar"
        elif isinstance(leaf, (torch.dtype, torch.device, torch.memory_format)):
            continue
    return None


def _signature(sample: SampleInput) -> tuple[Any, ...]:
    def describe(x: Any) -> Any:
        return ("T", tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(x)
    return tuple(describe(x) for x in pytree.tree_leaves((sample.input, sample.args,
                                                           sample.kwargs)))


def _pick(samples: list[SampleInput], n: int) -> list[SampleInput]:
    """The first, middle and last of the distinct samples (distinct shapes / arguments)."""
    distinct: dict[tuple[Any, ...], SampleInput] = {}
    for s in samples:
        distinct.setdefault(_signature(s), s)
    unique = list(distinct.values())
    if len(unique) <= n:
        return unique
    picks = sorted({round(i * (len(unique) - 1) / (n - 1)) for i in range(n)}) if n > 1 else [0]
    return [unique[i] for i in picks]


SKIPPED: dict[str, int] = {}
"""Samples left out, by reason (counted at collection)."""


REDUNDANT = frozenset({"bmm.triton_optimized", "addmm.decomposed", "softmax.with_dtype",
                       "log_softmax.with_dtype", "nn.functional.batch_norm.without_cudnn",
                       "double"})
"""OpInfo variants that call the same ATen op on the same samples as an entry already here."""


@contextlib.contextmanager
def _no_test_fn_lookup() -> Iterator[None]:
    """Two costs of torch's sample iterators that buy nothing here, each paid again by every
    pytest-xdist worker at collection. They look for the running unittest ``TestCase`` by
    walking ``inspect.stack()`` (which reads the source of every frame and scans
    ``sys.modules`` for each): at collection there is none, so answer None at once. And they
    reseed before every sample with ``torch.manual_seed``, which also queues a lazy seed for
    each accelerator, recording a formatted stack each time: seed the CPU generator, ``random``
    and NumPy only, which is all that CPU samples draw from. The samples are the same, bit for
    bit (their seed falls back to torch's SEED without a test function)."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    def set_rng_seed(seed: int | None = None) -> None:
        seed = common_utils.SEED if seed is None else seed
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)

    saved = common_utils.extract_test_fn, core.extract_test_fn, common_utils.set_rng_seed
    common_utils.extract_test_fn = core.extract_test_fn = lambda: None
    common_utils.set_rng_seed = set_rng_seed
    try:
        yield
    finally:
        common_utils.extract_test_fn, core.extract_test_fn, common_utils.set_rng_seed = saved


def _cases() -> Iterator[Case]:
    """Up to PER_OP samples per entry, taken round-robin (every entry's first sample, then
    every entry's second, ...) until TOTAL_CAP."""
    picks: dict[str, list[SampleInput]] = {}
    for entry, op in OPINFOS.items():
        if entry in REDUNDANT:
            continue
        torch.manual_seed(0)
        usable = []
        with _no_test_fn_lookup():
            for s in op.sample_inputs("cpu", torch.float32, requires_grad=False):
                reason = _unsupported(s)
                if reason is None:
                    usable.append(s)
                else:
                    SKIPPED[reason] = SKIPPED.get(reason, 0) + 1
        picks[entry] = _pick(usable, PER_OP)
    chosen: list[Case] = []
    for i in range(PER_OP):
        for entry, samples in picks.items():
            if i < len(samples):
                if len(chosen) < TOTAL_CAP:
                    chosen.append(Case(entry, i, samples[i]))
                else:
                    SKIPPED["over the suite cap"] = SKIPPED.get("over the suite cap", 0) + 1
    yield from sorted(chosen, key=lambda c: (c.entry, c.index))


OPINFOS = _opinfos()
CASES = list(_cases())


def _params() -> list[Any]:
    params = []
    for case in CASES:
        case_id = f"{case.entry}-{case.index}"
        marks = []
        reason = XFAIL.get(case_id) or XFAIL.get(case.entry)
        if reason:
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(case, id=case_id, marks=marks))
    return params


def _compile_and_call(op: OpInfo, sample: SampleInput) -> tuple[Any, Any, list[str]]:
    """Runs ``sample`` through torch.compile(tilefuse) and eagerly; returns both results and
    the fallbacks the partition reports recorded."""
    from tilefuse.frontend.torch.backend import SpecializedGraph, tilefuse_backend

    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    fn_op: Callable[..., Any] = op.op

    def fn(*tensors: torch.Tensor) -> Any:
        values = list(leaves)
        for i, t in zip(positions, tensors, strict=True):
            values[i] = t
        x, args, kwargs = pytree.tree_unflatten(values, spec)
        return fn_op(x, *args, **kwargs)

    graphs: list[SpecializedGraph] = []

    def spy(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], **kw: Any) -> Any:
        compiled = tilefuse_backend(gm, inputs, **kw)
        graphs.append(compiled)
        return compiled

    tensors = [leaves[i] for i in positions]
    with torch.no_grad():
        expected = fn(*[t.clone() for t in tensors])
        actual = torch.compile(fn, backend=spy, dynamic=False)(*tensors)
    fallbacks = [f"{name}: {why}" for g in graphs for r in g.reports for name, why in r.fallbacks]
    return actual, expected, fallbacks


def _compare(actual: Any, expected: Any, reduction: bool) -> None:
    got, want = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    assert len(got) == len(want), f"{len(got)} results, eager has {len(want)}"
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"result {i}: {type(a)}"
            assert a.shape == e.shape, f"result {i}: shape {a.shape} != {e.shape}"
            assert a.dtype == e.dtype, f"result {i}: dtype {a.dtype} != {e.dtype}"
            assert_close(a.contiguous().numpy(), e.contiguous().numpy(), reduction=reduction,
                         msg=f"result {i}")
        else:
            assert a == e, f"result {i}: {a!r} != {e!r}"


@pytest.mark.parametrize("case", _params())
def test_opinfo_sample(case: Case, caplog: pytest.LogCaptureFixture) -> None:
    op = OPINFOS[case.entry]
    assert case.sample is not None
    caplog.set_level(logging.DEBUG, logger="tilefuse.fallback")
    actual, expected, fallbacks = _compile_and_call(op, case.sample)
    logged = [r.getMessage() for r in caplog.records if "torch fallback" in r.getMessage()]
    assert not fallbacks and not logged, fallbacks + logged
    _compare(actual, expected, reduction=op.name in REDUCTION_OPS)


def test_every_mapped_op_is_exercised_or_listed() -> None:
    """Each mapped ATen op has an OpInfo entry here or a reason in NO_OPINFO."""
    covered = set()
    for overload in ATEN_CONVERTERS:
        if overload is operator.getitem:
            continue
        key = str(overload)
        names = OPINFO_OVERRIDES.get(key, (overload._schema.name.split("::")[1].lstrip("_"),))
        if any(OPINFOS.get(n) or any(e.split(".")[0] == n or OPINFOS[e].name == n
                                     or OPINFOS[e].aten_name == n for e in OPINFOS)
               for n in names):
            covered.add(key)
    missing = {str(k) for k in ATEN_CONVERTERS if k is not operator.getitem} - covered
    assert missing <= set(NO_OPINFO), sorted(missing - set(NO_OPINFO))
    assert len(CASES) <= TOTAL_CAP
