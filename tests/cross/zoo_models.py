"""Tiny models for the cross-compilation zoo: Hugging Face GPT-2 / BERT / Llama / ViT built from
configs with random weights (when ``transformers`` is importable), and hand-written torch
modules of the same structure (causal masked attention with cumsum position ids, embeddings,
layer norm, RMSNorm, RoPE, SwiGLU; a convolution stem with pooling; ResNet-50's layers at a
small width in fp16, channels-last). No downloads.

Each entry of :data:`ZOO` is ``name -> () -> (module, [NumPy inputs])``; shapes are small so
the host simulation of the GPU program stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

BATCH, SEQ, VOCAB = 2, 16, 96


def _ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)


class _Logits(nn.Module):
    """A Hugging Face model called with ``input_ids`` (or pixels), returning one tensor."""

    def __init__(self, model: nn.Module, field: str, key: str = "input_ids"):
        super().__init__()
        self.model, self.field, self.key = model.eval(), field, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**{self.key: x}), self.field)


def hf_gpt2() -> tuple[nn.Module, list[np.ndarray]]:
    import transformers as T

    torch.manual_seed(0)
    config = T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                          bos_token_id=0, eos_token_id=0)
    return _Logits(T.GPT2LMHeadModel(config), "logits"), [_ids()]


def hf_bert() -> tuple[nn.Module, list[np.ndarray]]:
    import transformers as T

    torch.manual_seed(0)
    config = T.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                          intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
    return _Logits(T.BertModel(config), "last_hidden_state"), [_ids(1)]


def hf_llama() -> tuple[nn.Module, list[np.ndarray]]:
    import transformers as T

    torch.manual_seed(0)
    config = T.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=128, vocab_size=VOCAB,
                           max_position_embeddings=64)
    return _Logits(T.LlamaForCausalLM(config), "logits"), [_ids(2)]


def hf_vit() -> tuple[nn.Module, list[np.ndarray]]:
    import transformers as T

    torch.manual_seed(0)
    config = T.ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         intermediate_size=128, image_size=32, patch_size=8)
    pixels = np.random.default_rng(3).random((BATCH, 3, 32, 32), np.float32)
    return _Logits(T.ViTModel(config), "last_hidden_state", "pixel_values"), [pixels]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.rand(dim) + 0.5), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [B, H, S, D]`` at integer ``positions [B, S]``."""
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    angles = positions.float()[:, None, :, None] * inv             # [B, 1, S, D/2]
    cos, sin = torch.cos(angles).repeat(1, 1, 1, 2), torch.sin(angles).repeat(1, 1, 1, 2)
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return (x * cos.to(x.dtype) + half * sin.to(x.dtype))


class TinyDecoder(nn.Module):
    """A Llama-style decoder block stack: embeddings, RMSNorm, RoPE at cumsum position ids from
    the padding mask, causal masked attention (mask built with ``&``), SwiGLU, a tied head."""

    def __init__(self, hidden: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.heads, self.hidden = heads, hidden
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "n1": RMSNorm(hidden), "qkv": nn.Linear(hidden, 3 * hidden, bias=False),
                "o": nn.Linear(hidden, hidden, bias=False), "n2": RMSNorm(hidden),
                "gate": nn.Linear(hidden, 2 * hidden, bias=False),
                "up": nn.Linear(hidden, 2 * hidden, bias=False),
                "down": nn.Linear(2 * hidden, hidden, bias=False)}))
        self.norm = RMSNorm(hidden)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        positions = (torch.cumsum(mask, dim=-1) - 1).clamp(min=0)
        causal = torch.ones(s, s, dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None, None] & mask.bool()[:, None, None, :]
        bias = torch.zeros(allowed.shape, dtype=torch.float32,
                           device=ids.device).masked_fill(~allowed, -1e9)
        x = self.embed(ids)
        d = self.hidden // self.heads
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["n1"](x)).split(self.hidden, dim=-1)
            q, k, v = (t.view(b, s, self.heads, d).transpose(1, 2) for t in (q, k, v))
            q, k = _rope(q, positions), _rope(k, positions)
            scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias.to(q.dtype)
            att = torch.softmax(scores, dim=-1) @ v
            x = x + blk["o"](att.transpose(1, 2).reshape(b, s, self.hidden))
            h = blk["n2"](x)
            x = x + blk["down"](nn.functional.silu(blk["gate"](h)) * blk["up"](h))
        return self.norm(x) @ self.embed.weight.t()


class TinyEncoder(nn.Module):
    """A BERT-style block: word + position + token-type embeddings (gather), layer norm,
    padding-masked attention, GELU MLP, post-norm."""

    def __init__(self, hidden: int = 64, heads: int = 4):
        super().__init__()
        self.heads, self.hidden = heads, hidden
        self.words, self.pos = nn.Embedding(VOCAB, hidden), nn.Embedding(SEQ, hidden)
        self.types = nn.Embedding(2, hidden)
        self.register_buffer("type_ids", torch.zeros(1, SEQ, dtype=torch.long))
        self.n0, self.n1, self.n2 = (nn.LayerNorm(hidden) for _ in range(3))
        self.qkv, self.o = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        at = torch.arange(s, device=ids.device)
        types = torch.gather(self.type_ids.expand(b, -1), 1, at.expand(b, -1))
        x = self.n0(self.words(ids) + self.pos(at) + self.types(types))
        d = self.hidden // self.heads
        q, k, v = (t.view(b, s, self.heads, d).transpose(1, 2)
                   for t in self.qkv(x).split(self.hidden, dim=-1))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1) @ v
        x = self.n1(x + self.o(att.transpose(1, 2).reshape(b, s, self.hidden)))
        return self.n2(x + self.down(nn.functional.gelu(self.up(x))))


class TinyConvNet(nn.Module):
    """A ResNet-style stem and block, channels-last: conv, batch norm, ReLU, max pool, a
    residual pair of convs, global average pool, a linear head, argmax of the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.c1, self.c2 = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 3, 2, 1)
        y = torch.relu(y + self.c2(torch.relu(self.c1(y))))
        logits = self.head(nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))
        return logits, logits.argmax(-1)


def _mask(seed: int) -> np.ndarray:
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[0, :3] = 0    # left padding in the first row
    mask[1, -2:] = 0   # right padding in the second
    return mask


def decoder() -> tuple[nn.Module, list[np.ndarray]]:
    torch.manual_seed(0)
    return TinyDecoder().eval(), [_ids(4), _mask(4)]


def encoder() -> tuple[nn.Module, list[np.ndarray]]:
    torch.manual_seed(0)
    return TinyEncoder().eval(), [_ids(5), _mask(5)]


def convnet() -> tuple[nn.Module, list[np.ndarray]]:
    torch.manual_seed(0)
    net = TinyConvNet().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 1.5)
    x = np.random.default_rng(6).standard_normal((BATCH, 3, 16, 16), np.float32)
    return net, [x]


def resnet50_f16() -> tuple[nn.Module, list[np.ndarray]]:
    """torchvision's ResNet-50 structure (``tilefuse.zoo.resnet50``: every layer, bottleneck
    and downsample; widths divided by 8 so the host simulation stays short), channels-last
    weights, fp16, one 32x32 image."""
    from tilefuse.zoo import resnet50

    net = resnet50(width=8).half().to(memory_format=torch.channels_last)
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float16)
    return net, [x]


def _bf16(make: Callable[[], tuple[nn.Module, list[np.ndarray]]]
          ) -> Callable[[], tuple[nn.Module, list[np.ndarray]]]:
    def build() -> tuple[nn.Module, list[np.ndarray]]:
        module, inputs = make()
        return module.to(torch.bfloat16), inputs
    return build


HAND_WRITTEN: dict[str, Callable[[], tuple[nn.Module, list[np.ndarray]]]] = {
    "decoder": decoder, "encoder": encoder, "convnet": convnet,
    "decoder_bf16": _bf16(decoder), "resnet50_f16": resnet50_f16,
}
TRANSFORMERS: dict[str, Callable[[], tuple[nn.Module, list[np.ndarray]]]] = {
    "gpt2": hf_gpt2, "bert": hf_bert, "llama": hf_llama, "vit": hf_vit,
    "llama_bf16": _bf16(hf_llama),
}


def eager(module: nn.Module, inputs: list[np.ndarray]) -> list[Any]:
    """``module``'s outputs on ``inputs`` in eager torch, as NumPy (bf16 through ml_dtypes)."""
    from tilefuse.frontend.torch.convert import tensor_to_numpy

    with torch.no_grad():
        out = module(*(torch.from_numpy(a) for a in inputs))
    return [tensor_to_numpy(t) for t in (out if isinstance(out, tuple) else (out,))]
