"""Reference models shared by the benchmarks, the tests and the command line: a BERT-base encoder
layer (and a stack of them) written as a plain PyTorch module, and the tilefuse graph it becomes
through the torch frontend. Imports torch lazily: ``import tilefuse`` never needs it.

The layer follows BERT-base as Hugging Face writes it (hidden 768, 12 heads of 64, intermediate
3072, GELU with erf, post-norm LayerNorm with eps 1e-12, an additive attention mask), so that
the attention arrives in the spelling most exported models use: ``softmax(q @ k^T / sqrt(d) +
mask) @ v`` over ``[batch, heads, seq, head_dim]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.graph.ir import Graph


@dataclass(frozen=True)
class BertConfig:
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def bert_layer(config: BertConfig = BertConfig(), seed: int = 0) -> Any:
    """One BERT encoder layer as a ``torch.nn.Module`` taking ``(x [B,S,H], mask [B,1,1,S])``,
    in eval mode, with weights drawn from ``seed``."""
    import torch
    from torch import nn

    class BertLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, i = config.hidden, config.intermediate
            self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
            self.attn_out = nn.Linear(h, h)
            self.attn_norm = nn.LayerNorm(h, eps=config.eps)
            self.ffn_in, self.ffn_out = nn.Linear(h, i), nn.Linear(i, h)
            self.ffn_norm = nn.LayerNorm(h, eps=config.eps)

        def _heads(self, t: torch.Tensor) -> torch.Tensor:
            b, s, _ = t.shape
            return t.view(b, s, config.heads, config.head_dim).permute(0, 2, 1, 3)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), \
                self._heads(self.value(x))
            scores = q @ k.transpose(-1, -2) / math.sqrt(config.head_dim) + mask
            context = torch.softmax(scores, dim=-1) @ v
            b, _, s, _ = context.shape
            context = context.permute(0, 2, 1, 3).reshape(b, s, config.hidden)
            x = self.attn_norm(x + self.attn_out(context))
            ffn = self.ffn_out(nn.functional.gelu(self.ffn_in(x)))
            return self.ffn_norm(x + ffn)

    torch.manual_seed(seed)
    return BertLayer().eval()


def bert_encoder(layers: int = 12, config: BertConfig = BertConfig(), seed: int = 0) -> Any:
    """``layers`` BERT layers in sequence, one module taking ``(x, mask)``."""
    from torch import nn

    class BertEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(bert_layer(config, seed + i) for i in range(layers))

        def forward(self, x: Any, mask: Any) -> Any:
            for layer in self.layers:
                x = layer(x, mask)
            return x

    return BertEncoder().eval()


def bert_layer_numpy(module: Any, config: BertConfig = BertConfig()) -> Any:
    """The same layer as a NumPy function ``layer(x, mask)`` with ``module``'s weights (from
    :func:`bert_layer`), written shape-generically so that ``tilefuse.jit`` can trace it with
    symbolic batch and sequence dims."""
    import scipy.special

    p = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    heads, head_dim, hidden = config.heads, config.head_dim, config.hidden

    def linear(t: Any, name: str) -> Any:
        return t @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    def norm(t: Any, name: str) -> Any:
        mean = t.mean(-1, keepdims=True)
        var = ((t - mean) ** 2).mean(-1, keepdims=True)
        return (t - mean) / np.sqrt(var + config.eps) * p[f"{name}.weight"] + p[f"{name}.bias"]

    def split(t: Any) -> Any:
        b, s, _ = t.shape
        return t.reshape(b, s, heads, head_dim).transpose(0, 2, 1, 3)

    def layer(x: Any, mask: Any) -> Any:
        q, k, v = split(linear(x, "query")), split(linear(x, "key")), split(linear(x, "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + mask
        e = np.exp(scores - scores.max(-1, keepdims=True))
        context = (e / e.sum(-1, keepdims=True)) @ v
        b, _, s, _ = context.shape
        context = context.transpose(0, 2, 1, 3).reshape(b, s, hidden)
        x = norm(x + linear(context, "attn_out"), "attn_norm")
        h = linear(x, "ffn_in")
        h = 0.5 * h * (1 + scipy.special.erf(h / math.sqrt(2)))
        return norm(x + linear(h, "ffn_out"), "ffn_norm")

    return layer


def bert_inputs(batch: int = 1, seq: int = 128, config: BertConfig = BertConfig(),
                seed: int = 0) -> list[np.ndarray]:
    """Random hidden states and an additive mask (0 for kept positions, -10000 for the last
    quarter of each sequence after the first, as padding)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, config.hidden), dtype=np.float32)
    mask = np.zeros((batch, 1, 1, seq), np.float32)
    for b in range(1, batch):
        mask[b, ..., seq - seq // 4:] = -10000.0
    return [x, mask]


def torch_graph(module: Any, inputs: list[np.ndarray], name: str = "model",
                fused_attention: bool = False) -> Graph:
    """The tilefuse graph of ``module`` on ``inputs`` as the torch frontend builds it (core ATen,
    parameters and buffers as constants), before any graph pass. Every op must convert.
    ``fused_attention``: each SDPA call one ``attention`` node, as the cuda target traces."""
    import torch

    from tilefuse.frontend.torch.aten import ATEN_CONVERTERS
    from tilefuse.frontend.torch.backend import trace_to_core_aten
    from tilefuse.frontend.torch.convert import Placeholder, lower_graph, numpy_to_tensor

    params = dict(module.named_parameters()) | dict(module.named_buffers())
    names = list(params)

    def flat(*args: Any) -> Any:
        weights, user = args[:len(names)], args[len(names):]
        state = dict(zip(names, weights))
        return torch.func.functional_call(module, state, tuple(user))

    args = [p.detach() for p in params.values()] + [numpy_to_tensor(a) for a in inputs]
    with torch.no_grad():
        traced = trace_to_core_aten(_as_graph_module(flat, len(args)), args, fused_attention)
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    specs = [Placeholder(node, args[i] if i < len(names) else None)
             for i, node in enumerate(placeholders)]
    return lower_graph(traced, specs, name, ATEN_CONVERTERS)


def _as_graph_module(fn: Any, n_args: int) -> Any:
    """``fn`` wrapped as an FX GraphModule of ``n_args`` placeholders calling it (make_fx traces
    through the call)."""
    import torch
    from torch import fx

    graph = fx.Graph()
    args = [graph.placeholder(f"a{i}") for i in range(n_args)]
    out = graph.call_function(fn, tuple(args))
    graph.output(out)
    return fx.GraphModule(torch.nn.Module(), graph)


def resnet50(width: int = 64, blocks: tuple[int, ...] = (3, 4, 6, 3), classes: int = 1000,
             seed: int = 0) -> Any:
    """torchvision's ResNet-50 (``torchvision.models.resnet50(weights=None)``: the same module
    names, Bottleneck blocks with the stride on the 3x3 conv, expansion 4, zero-init not
    applied) built in code so that it needs no torchvision, in eval mode with random weights
    and batch-norm statistics drawn from ``seed``. ``width`` (64) and ``blocks`` shrink it for
    tests; the defaults are ResNet-50."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int,
                     downsample: nn.Module | None) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inplanes = width
            self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(width, blocks[0], 1)
            self.layer2 = self._make_layer(width * 2, blocks[1], 2)
            self.layer3 = self._make_layer(width * 4, blocks[2], 2)
            self.layer4 = self._make_layer(width * 8, blocks[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(width * 8 * 4, classes)

        def _make_layer(self, planes: int, count: int, stride: int) -> nn.Sequential:
            downsample = None
            if stride != 1 or self.inplanes != planes * 4:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                    nn.BatchNorm2d(planes * 4))
            layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * 4
            layers += [Bottleneck(self.inplanes, planes, 1, None) for _ in range(1, count)]
            return nn.Sequential(*layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    torch.manual_seed(seed)
    net = ResNet()
    with torch.no_grad():   # batch-norm statistics a trained net would have, not 0 and 1
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.0)
                m.bias.uniform_(-0.2, 0.2)
    return net.eval()
