"""The models the benchmark trains, and the examples too (examples/train_gpt2.py,
examples/train_resnet.py): built from ``torch.nn`` modules with random weights, nothing
downloaded. GPT-2 (nanoGPT's layout), ResNet-18, a pre-norm ``nn.TransformerEncoder``, and
transformers' ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` (imported when one is built).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BasicBlock", "Block", "GPT", "GPTConfig", "ResNet", "gpt2_hf", "llama", "resnet18",
           "transformer_encoder"]


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """GPT-2's shape; the defaults are GPT-2 small (124M parameters; the vocabulary padded from
    50257 to 50304, a multiple of 128, as nanoGPT does, so the head's matmul tiles evenly)."""

    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``. Built from
    ``torch.nn`` modules only, so that :func:`triton_workshop.nn.patch` finds all of them; the MLP
    is an ``nn.Sequential`` so that patch can prove the GELU follows its first Linear."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        width = config.n_embd
        self.ln_1 = nn.LayerNorm(width, bias=config.bias)
        self.attn = nn.MultiheadAttention(width, config.n_head, dropout=config.dropout,
                                          bias=config.bias, batch_first=True)
        self.ln_2 = nn.LayerNorm(width, bias=config.bias)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width, bias=config.bias),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * width, width, bias=config.bias),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        # The mask comes with is_causal=True as torch's hint: both torch and triton-workshop then
        # run causal attention without reading it.
        x = x + self.attn(h, h, h, attn_mask=causal_mask, is_causal=True, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 (nanoGPT's layout): token and position embeddings, ``n_layer`` blocks, a final
    LayerNorm and a language-model head tied to the token embedding.

    ``forward(idx)`` returns the logits (B, T, vocab); ``forward(idx, targets)`` returns
    ``(logits, loss)``; with ``fused_loss`` set (a callable ``(weight, hidden, targets) -> loss``,
    e.g. Liger-Kernel's fused linear cross-entropy) the loss is computed from the hidden states
    without materialising the logits, which are then None."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.fused_loss: Callable | None = None
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's: N(0, 0.02) weights, zero biases, and the projections into the residual
        stream scaled by 1/sqrt(2·n_layer) (each block adds two)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                nn.init.ones_(p)
            elif name.endswith(("attn.out_proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, 0.0, residual_std)
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        batch, seq = idx.shape
        if seq > self.config.block_size:
            raise ValueError(f"sequence length {seq} exceeds block_size {self.config.block_size}")
        positions = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        causal_mask = torch.ones(seq, seq, dtype=torch.bool, device=idx.device).triu(1)
        for block in self.blocks:
            x = block(x, causal_mask)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        h = self.hidden(idx)
        if targets is None:
            return self.lm_head(h)
        if self.fused_loss is not None:
            flat = h.reshape(-1, h.shape[-1])
            return None, self.fused_loss(self.lm_head.weight, flat, targets.reshape(-1))
        logits = self.lm_head(h)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


class BasicBlock(nn.Module):
    """ResNet's two 3×3 convolutions with a shortcut (a strided 1×1 convolution when the shape
    changes)."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-18 (``blocks=(2, 2, 2, 2)``, ``width=64``) for ImageNet-sized inputs: a 7×7
    stride-2 stem and max-pool, four stages, global average pool, a Linear classifier."""

    def __init__(self, blocks=(2, 2, 2, 2), width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )  # fmt: skip
        stages, in_channels = [], width
        for i, count in enumerate(blocks):
            channels = width * 2**i
            layers = [BasicBlock(in_channels, channels, 1 if i == 0 else 2)]
            layers += [BasicBlock(channels, channels, 1) for _ in range(count - 1)]
            stages.append(nn.Sequential(*layers))
            in_channels = channels
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18(num_classes: int = 1000, width: int = 64) -> ResNet:
    """ResNet-18 with random weights (``width`` scales every stage: 64 is the real one)."""
    return ResNet((2, 2, 2, 2), width, num_classes)


def transformer_encoder(d_model: int, nhead: int, dim_feedforward: int, num_layers: int = 4):
    """``nn.TransformerEncoder`` of pre-norm GELU layers, batch first, no dropout."""
    layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)


def gpt2_hf(config: dict) -> nn.Module:
    """transformers' ``GPT2LMHeadModel`` with random weights: ``config`` holds ``GPT2Config``
    fields over its defaults (GPT-2 small: 12 layers, 768 wide, vocabulary 50257, dropout 0.1
    in the embeddings, the attention and after each projection), on transformers' SDPA
    attention."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**config, attn_implementation="sdpa"))


def llama(config: dict) -> nn.Module:
    """transformers' ``LlamaForCausalLM`` with random weights; ``config`` holds ``LlamaConfig``
    fields (layers, widths, heads, vocabulary)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**config))
