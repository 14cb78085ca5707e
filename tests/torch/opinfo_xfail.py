"""Expected failures of the torch op suite (tests/torch/test_torch_opinfo.py): a test id
(``<opinfo entry>-<sample index>``) or a whole OpInfo entry, each with its reason. They run as
strict xfails: when a fix makes one pass, the suite fails until the entry is removed here."""

from __future__ import annotations

_TRAINING_BN = ("batch_norm in training mode (batch statistics, in-place running-stat "
                "updates) runs in torch: the torch frontend is inference only")
_INDICES = ("max_pool2d(return_indices=True): the indices result has no tilefuse converter, "
            "so the node runs in torch")
_DIVISOR = "avg_pool2d's divisor_override has no tilefuse lowering (the node runs in torch)"
_UNEVEN = ("adaptive_avg_pool2d with overlapping / uneven windows (input size not a multiple "
           "of the output size) has no tilefuse lowering")

_AS_STRIDED = ("as_strided to other sizes, strides or an offset (a view of some elements) has "
               "no converter: only a restride of the same elements (channels-last) converts")

XFAIL: dict[str, str] = {
    "as_strided-1": _AS_STRIDED,
    "as_strided.partial_views-0": _AS_STRIDED,
    "as_strided.partial_views-1": _AS_STRIDED,
    "native_batch_norm-0": _TRAINING_BN,
    "native_batch_norm-1": "native_batch_norm's saved mean / invstd results are read (only "
                           "the normalised output is converted)",
    "nn.functional.batch_norm-0": _TRAINING_BN,
    "nn.functional.batch_norm-1": _TRAINING_BN,
    "nn.functional.max_pool2d-0": _INDICES,
    "nn.functional.max_pool2d-1": _INDICES,
    "nn.functional.avg_pool2d-0": _DIVISOR,
    "nn.functional.avg_pool2d-1": _DIVISOR,
    "nn.functional.adaptive_avg_pool2d-0": _UNEVEN + " (8x8 -> 5x7)",
    "nn.functional.adaptive_avg_pool2d-1": _UNEVEN + " (4x3 -> 5x3)",
}
