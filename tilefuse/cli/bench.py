"""``tilefuse bench MODEL --vs onnxruntime,torch,inductor``: tilefuse against its peers on one
model, interleaved round by round (:mod:`tilefuse.cli.timing`), medians and ratios, every
output checked first.

Peers per MODEL kind: an ONNX file runs in onnxruntime and OpenVINO; a NumPy function runs as
itself (``numpy``); a torch module runs in torch eager (``torch``), ``torch.compile`` with
Inductor (``inductor``), onnxruntime and OpenVINO (the module exported with
``torch.onnx.export``), and tilefuse
runs it through ``torch.compile(backend=tilefuse.torch.backend)``. A peer that does not apply or
is not installed is listed with the reason, never an error. The outputs of every
implementation are compared with the reference peer's (onnxruntime for ONNX, NumPy, torch
eager) within the reduction tolerance of :mod:`tilefuse.testing`.
"""

from __future__ import annotations

import argparse
import io
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.cli.common import add_model_arguments, note, show_progress, subparser
from tilefuse.cli.models import (
    CliError,
    Model,
    NumpyFunction,
    OnnxFile,
    TorchModule,
    load_model,
    parse_inputs,
    quiet_torch_warnings,
)
from tilefuse.cli.progress import Bar
from tilefuse.cli.timing import format_seconds, interleaved_medians
from tilefuse.codegen.target import quiet_openmp_waits

EXAMPLE = """  tilefuse bench model.onnx --vs onnxruntime --rounds 21
  tilefuse bench "tilefuse.zoo:bert_layer()" --input x=1x128x768 --input mask=1x1x1x128 \\
      --vs torch,inductor,onnxruntime --json bert.json"""

PEERS = ("onnxruntime", "torch", "inductor", "numpy", "openvino")
Impl = Callable[[], list[np.ndarray]]


def add_parser(sub: Any) -> None:
    parser = subparser(sub, "bench", "time MODEL with tilefuse against its peers", EXAMPLE,
                       __doc__.split("\n\n", 1)[1])
    add_model_arguments(parser)
    parser.add_argument("--vs", default="", metavar="PEERS",
                        help=f"comma-separated peers among {', '.join(PEERS)} (default: all "
                        "that apply to MODEL)")
    parser.add_argument("--rounds", type=int, default=15, help="timing rounds (median; 15)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for torch and onnxruntime (default: as many as cores)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    parser.set_defaults(func=run)


@dataclass
class BenchResult:
    """Median seconds per implementation, each output check, and why a peer was left out."""

    medians: dict[str, float] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def ratio(self, name: str) -> float:
        """``name``'s time over tilefuse's (above 1: tilefuse is faster)."""
        return self.medians[name] / self.medians["tilefuse"]

    def to_json(self) -> dict[str, Any]:
        return {"median_s": self.medians, "checks": self.checks, "skipped": self.skipped,
                "ratio_vs_tilefuse": {n: self.ratio(n) for n in self.medians}}


def _outputs(out: Any) -> list[np.ndarray]:
    items = out if isinstance(out, tuple | list) else [out]
    return [o.detach().numpy() if hasattr(o, "detach") else np.asarray(o) for o in items]


def _ort_session(model_bytes: bytes, threads: int | None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def _ort_runner(model_bytes: bytes, arrays: list[np.ndarray], threads: int | None) -> Impl:
    session = _ort_session(model_bytes, threads)
    feed = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
    return lambda: session.run(None, feed)


def openvino_runner(model_bytes: bytes, arrays: list[np.ndarray], threads: int | None
                    ) -> Impl:
    """A call of the ONNX model ``model_bytes`` compiled by OpenVINO for the CPU on ``arrays``
    (its outputs, views of the request's buffers). f32 inference is asked for: OpenVINO's
    default on CPUs with bf16 units is bf16, which would not be the same computation."""
    import openvino as ov

    core = ov.Core()
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = core.compile_model(core.read_model(model_bytes, b""), "CPU", config)
    request = compiled.create_infer_request()
    feed = dict(enumerate(arrays))

    def run() -> list[np.ndarray]:
        request.infer(feed, share_inputs=True)
        return [request.get_output_tensor(i).data for i in range(len(compiled.outputs))]
    return run


def _onnx_peers(model: OnnxFile, arrays: list[np.ndarray], threads: int | None,
                wanted: Sequence[str] = ("onnxruntime",)) -> dict[str, Impl]:
    impls: dict[str, Impl] = {}
    if "onnxruntime" in wanted:
        impls["onnxruntime"] = _ort_runner(model.path.read_bytes(), arrays, threads)
    if "openvino" in wanted:
        impls["openvino"] = openvino_runner(model.path.read_bytes(), arrays, threads)
    return impls


def _torch_peers(model: TorchModule, arrays: list[np.ndarray], wanted: Sequence[str]
                 ) -> tuple[dict[str, Impl], dict[str, str]]:
    import torch

    tensors = [torch.from_numpy(a) for a in arrays]
    impls: dict[str, Impl] = {}
    skipped: dict[str, str] = {}

    def eager() -> list[np.ndarray]:
        with torch.no_grad():
            return _outputs(model.module(*tensors))
    impls["torch"] = eager
    if "inductor" in wanted:
        compiled = torch.compile(model.module)

        def inductor() -> list[np.ndarray]:
            with torch.no_grad():
                return _outputs(compiled(*tensors))
        impls["inductor"] = inductor
    exporters = [p for p in ("onnxruntime", "openvino") if p in wanted]
    if exporters:
        try:
            exported = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model.module, tuple(tensors), exported, dynamo=False,
                                  input_names=[s.name for s in model.inputs()])
        except Exception as err:  # an exporter failure is a note, not a crash
            skipped.update({p: f"torch.onnx.export failed: {type(err).__name__}: {err}"
                            for p in exporters})
            return impls, skipped
        for peer in exporters:
            try:
                runner = _ort_runner if peer == "onnxruntime" else openvino_runner
                impls[peer] = runner(exported.getvalue(), arrays, torch.get_num_threads())
            except ImportError as err:
                skipped[peer] = f"not installed ({err.name})"
    return impls, skipped


def peer_impls(model: Model, arrays: list[np.ndarray], wanted: Sequence[str] | None,
               threads: int | None = None) -> tuple[dict[str, Impl], dict[str, str]]:
    """The wanted peers (None: every one that applies) of ``model``, reference first, and
    why any wanted one is left out."""
    applies = {"onnx": ("onnxruntime", "openvino"), "numpy": ("numpy",),
               "torch": ("torch", "inductor", "onnxruntime", "openvino")}[model.kind]
    wanted = applies if wanted is None else wanted
    skipped = {p: f"does not apply to a {model.kind} model" for p in wanted if p not in applies}
    chosen = [p for p in applies if p in wanted]
    impls: dict[str, Impl] = {}
    try:
        if isinstance(model, OnnxFile) and chosen:
            impls = _onnx_peers(model, arrays, threads, chosen)
        elif isinstance(model, NumpyFunction) and chosen:
            impls = {"numpy": lambda: _outputs(model.fn(*arrays))}
        elif isinstance(model, TorchModule) and chosen:
            import torch

            if threads:
                torch.set_num_threads(threads)
            impls, more = _torch_peers(model, arrays, chosen)
            skipped.update(more)
    except ImportError as err:
        skipped.update({p: f"not installed ({err.name})" for p in chosen})
    except Exception as err:  # a peer that cannot take the model is a note, not a crash
        skipped.update({p: f"failed to load the model: {type(err).__name__}: "
                        f"{str(err).strip()[:160]}" for p in chosen if p not in impls})
    return {p: impls[p] for p in chosen if p in impls}, skipped


def check(reference: list[np.ndarray], outputs: list[np.ndarray]) -> str:
    """``ok``, or how the outputs differ from the reference's."""
    from tilefuse.testing import assert_close

    if len(outputs) != len(reference):
        return f"differs: {len(outputs)} outputs, the reference has {len(reference)}"
    for i, (got, want) in enumerate(zip(outputs, reference)):
        got = np.asarray(got).reshape(np.shape(want)) if np.size(got) == np.size(want) else got
        try:
            assert_close(np.asarray(got).astype(want.dtype), want, reduction=True)
        except AssertionError:
            if np.shape(got) != np.shape(want):
                return f"differs: output {i} shape {np.shape(got)}, expected {np.shape(want)}"
            diff = np.nanmax(np.abs(np.asarray(got, np.float64) - want.astype(np.float64)))
            return f"differs: output {i} max abs error {diff:.3g}"
    return "ok"


def bench_model(model: Model, arrays: list[np.ndarray], wanted: Sequence[str] | None,
                rounds: int,
                *, threads: int | None = None, progress: bool | None = None) -> BenchResult:
    """Checks and times tilefuse and the wanted peers on ``arrays`` (module docstring)."""
    compiled = model.compile()
    first = {"tilefuse": compiled(arrays)}  # compiles first: a model tilefuse cannot take fails
    peers, skipped = peer_impls(model, arrays, wanted, threads)
    for name, fn in list(peers.items()):  # compiles and warms up the peers
        try:
            first[name] = fn()
        except Exception as err:  # a peer failing on the model is a note, not a crash
            skipped[name] = f"failed: {type(err).__name__}: {str(err).strip()[:160]}"
            del peers[name]
    impls: dict[str, Impl] = {"tilefuse": lambda: compiled(arrays), **peers}
    result = BenchResult(skipped=skipped)
    reference = next(iter(peers), "tilefuse")
    for name, outs in first.items():
        result.checks[name] = "reference" if name == reference and peers else \
            check(first[reference], outs)
    steps = max(1, rounds) * (1 + ("numpy" in impls))
    with Bar("timing", steps, show=progress) as bar:
        result.medians = interleaved_medians(impls, rounds, separate=("numpy",),
                                             on_round=bar.step)
    return result


def report(result: BenchResult) -> str:
    head = f"{'implementation':<14} {'median':>10} {'vs tilefuse':>11}  output"
    lines = [head, "-" * len(head)]
    for name, seconds in result.medians.items():
        ratio = "1.00x" if name == "tilefuse" else f"{result.ratio(name):.2f}x"
        lines.append(f"{name:<14} {format_seconds(seconds):>10} {ratio:>11}  "
                     f"{result.checks.get(name, '')}")
    for name, why in result.skipped.items():
        lines.append(f"{name:<14} {'-':>10} {'-':>11}  left out: {why}")
    lines.append("vs tilefuse: the peer's time over tilefuse's (above 1.00x: tilefuse is faster)")
    return "\n".join(lines)


def parse_peers(text: str) -> list[str] | None:
    """The ``--vs`` names (None when not given: every peer that applies)."""
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in PEERS]
    if unknown:
        raise CliError(f"unknown peer(s) {', '.join(unknown)} (known: {', '.join(PEERS)})")
    return names or None


def run(args: argparse.Namespace) -> int:
    quiet_openmp_waits()  # before torch loads its OpenMP runtime; see benchmarks/run.py
    quiet_torch_warnings()
    model = load_model(args.model, args.quantize)
    wanted = parse_peers(args.vs)
    arrays = parse_inputs(model, args.input, args.seed)
    note(args, f"compiling {args.model} and its peers ...")
    result = bench_model(model, arrays, wanted, args.rounds, threads=args.threads,
                         progress=show_progress(args))
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps({"model": args.model, **result.to_json()}, indent=2))
    bad = [n for n, c in result.checks.items() if c.startswith("differs")]
    if bad:
        raise CliError(f"outputs differ from the reference: {', '.join(bad)}")
    return 0
