"""The model workloads: a model, its data, its loss, its optimiser, at three sizes (``full``,
``quick``, and ``tiny`` for the CPU tests), and the candidates that run it.

=====================  =====================================================================
``gpt2_train``         GPT-2 124M (12 layers, 768 wide, 12 heads, vocab 50304), a training step:
                       forward, cross-entropy, backward, AdamW; batch 8 × 1024 tokens
``gpt2_prefill``       the same GPT-2, inference: one forward over 8 × 1024 tokens, no grad
``resnet18_train``     ResNet-18, batch 64 × 3 × 224², cross-entropy, SGD with momentum (NCHW)
``resnet18_train_cl``  the same in channels-last (NHWC), the layout tensor cores prefer
``encoder_train``      a 4-layer ``nn.TransformerEncoder`` (768 wide, 12 heads, pre-norm), a
                       training step on 16 × 512 tokens, MSE against a random target, AdamW
``gpt2_hf_train``      transformers' ``GPT2LMHeadModel`` (GPT-2 small, its default config: vocab
                       50257, dropout 0.1), a training step on 8 × 1024 tokens, fused AdamW
``llama_train``        a LLaMA of 1.5B parameters (transformers' ``LlamaForCausalLM``: 16
                       layers, hidden 2048, SwiGLU MLP 8192, 32 query / 8 key-value heads, vocab
                       128256), a training step (forward, loss, backward, fused AdamW) on
                       4 × 2048 tokens
``llama_train_small``  a LLaMA of 8 layers, hidden 1024, SwiGLU MLP 4096, 16 query / 4
                       key-value heads (the large one's head size, 64, and 4 query heads per key
                       head), vocab 32000; 8 × 1024 tokens
=====================  =====================================================================

The candidates: ``torch eager``; ``torch.compile``; ``triton-workshop`` (the model patched:
:func:`triton_workshop.nn.patch`, or for the transformers models
:func:`triton_workshop.integrations.transformers.patch_model`; the GPT-2's loss fused with its
LM head), eager; ``torch.compile + triton-workshop`` (patched with ``compiled=True``, its
standalone norms left to Inductor, then compiled); ``Liger-Kernel`` where it imports (its LayerNorm and
fused linear cross-entropy for GPT-2, its LLaMA patch ``apply_liger_kernel_to_llama``; n/a for the
ResNet and transformers' GPT-2, which it has no patch for) and ``torch.compile + Liger-Kernel``. Liger's LLaMA patch replaces transformers' classes
for the whole process: each candidate runs in a process of its own (:mod:`.run`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..measure import Steps
from ..spec import OURS, TORCH_COMPILE, TORCH_EAGER
from .zoo import GPT, GPTConfig, gpt2_hf, llama, resnet18, transformer_encoder

__all__ = ["CANDIDATES", "LIGER", "LIGER_COMPILED", "OURS", "OURS_COMPILED", "SIZE_NAMES", "STEPS",
           "TORCH_COMPILE", "TORCH_EAGER", "WORKLOADS", "ModelWorkload", "patch_torch_modules",
           "patch_transformers_model"]

OURS_COMPILED = "torch.compile + triton-workshop"
LIGER = "Liger-Kernel"
LIGER_COMPILED = "torch.compile + Liger-Kernel"
CANDIDATES = (TORCH_EAGER, TORCH_COMPILE, OURS, OURS_COMPILED, LIGER, LIGER_COMPILED)
#: The candidates that run Liger-Kernel's version of the model.
LIGER_CANDIDATES = (LIGER, LIGER_COMPILED)

SIZE_NAMES = ("full", "quick", "tiny")  # tiny: CPU tests only


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _gpt_model(size: dict) -> nn.Module:
    return GPT(GPTConfig(**size["config"]))


def _gpt_batches(size: dict, count: int) -> list:
    g, vocab = _generator(1), size["config"].get("vocab_size", GPTConfig.vocab_size)
    shape = (size["batch"], size["seq"])
    return [(torch.randint(0, vocab, shape, generator=g), torch.randint(0, vocab, shape, generator=g))
            for _ in range(count)]  # fmt: skip


def _gpt_loss(model, batch) -> torch.Tensor:
    idx, targets = batch
    return model(idx, targets)[1]


def _gpt_prefill_loss(model, batch) -> torch.Tensor:
    idx, targets = batch
    logits = model(idx)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _resnet_model(size: dict) -> nn.Module:
    return resnet18(num_classes=size["classes"], width=size["width"])


def _resnet_batches(size: dict, count: int) -> list:
    g = _generator(2)
    shape = (size["batch"], 3, size["image"], size["image"])
    return [(torch.randn(shape, generator=g), torch.randint(0, size["classes"], (size["batch"],), generator=g))
            for _ in range(count)]  # fmt: skip


def _classification_loss(model, batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images).float(), labels)


def _encoder_model(size: dict) -> nn.Module:
    return transformer_encoder(size["d_model"], size["nhead"], size["ff"], size["layers"])


def _encoder_batches(size: dict, count: int) -> list:
    g = _generator(3)
    shape = (size["batch"], size["seq"], size["d_model"])
    return [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(count)]


def _regression_loss(model, batch) -> torch.Tensor:
    x, target = batch
    return F.mse_loss(model(x).float(), target)


def _linear_cross_entropy_loss(weight: torch.Tensor, hidden: torch.Tensor,
                               targets: torch.Tensor) -> torch.Tensor:
    """A GPT's ``fused_loss`` (its argument order) on triton-workshop's fused loss."""
    from ...ops.cross_entropy import linear_cross_entropy

    return linear_cross_entropy(hidden, weight, targets)


def _patch_gpt(model: nn.Module, compiled: bool = False) -> None:
    """triton-workshop's GPT: its modules patched and, eagerly, its loss fused with the LM head
    (``linear_cross_entropy``: no logits in memory; Liger-Kernel's candidate has its own fused
    loss). Compiled, the loss stays Inductor's, the faster one there (docs/results.md)."""
    patch_torch_modules(model, compiled)
    if not compiled:
        model.fused_loss = _linear_cross_entropy_loss


def _liger_gpt(model: nn.Module) -> nn.Module:
    """Liger-Kernel's pieces for a GPT: its LayerNorm and its fused linear cross-entropy."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    _liger_layer_norms(model)
    model.fused_loss = LigerFusedLinearCrossEntropyLoss()
    return model


def _liger_layer_norms(model: nn.Module) -> nn.Module:
    from liger_kernel.transformers.functional import liger_layer_norm

    class LigerLayerNorm(nn.Module):  # shares the LayerNorm's parameters
        def __init__(self, ln: nn.LayerNorm) -> None:
            super().__init__()
            self.ln = ln

        def forward(self, x):
            return liger_layer_norm(x, self.ln.weight, self.ln.bias, self.ln.eps)

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm:
                setattr(parent, name, LigerLayerNorm(child))
    return model


def _gpt2_hf_model(size: dict) -> nn.Module:
    return gpt2_hf(size["config"])


def _llama_model(size: dict) -> nn.Module:
    return llama(size["config"])


def _causal_lm_batches(size: dict, count: int) -> list:
    """Token ids and labels (transformers shifts the labels itself)."""
    g, vocab = _generator(4), size["config"]["vocab_size"]
    shape = (size["batch"], size["seq"])
    return [(torch.randint(0, vocab, shape, generator=g), torch.randint(0, vocab, shape, generator=g))
            for _ in range(count)]  # fmt: skip


def _causal_lm_loss(model, batch) -> torch.Tensor:
    idx, labels = batch
    return model(input_ids=idx, labels=labels).loss


def _liger_llama(model: nn.Module) -> nn.Module:
    """Liger-Kernel's LLaMA: RMSNorm, RoPE, SwiGLU and the fused linear cross-entropy, patched
    into this model (and into transformers' classes, for the whole process)."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(model=model)
    return model


def _tokens(size: dict) -> int:
    return size["batch"] * size["seq"]


def patch_torch_modules(model: nn.Module, compiled: bool = False) -> None:
    """triton-workshop's version of a model built from ``torch.nn`` modules (``compiled``: the
    version for torch.compile, its standalone norms left to Inductor)."""
    from ...nn import patch

    patch(model, compiled=compiled)


def patch_transformers_model(model: nn.Module, compiled: bool = False) -> None:
    """triton-workshop's version of a transformers model (attention, RMSNorm, RoPE, SwiGLU,
    the loss; ``compiled``: the version for torch.compile, its norms left to Inductor)."""
    from ...integrations.transformers import patch_model

    patch_model(model, compiled=compiled)


@dataclasses.dataclass(frozen=True)
class ModelWorkload:
    """One model to measure. The callables are module-level functions (a case is sent to a fresh
    process by pickling, which names functions by module and name)."""

    name: str
    title: str
    model: Callable[[dict], nn.Module]  # size -> model on the CPU, seeded by the caller
    batches: Callable[[dict, int], list]  # (size, count) -> CPU batches, deterministic
    loss: Callable[[nn.Module, Any], torch.Tensor]
    sizes: dict  # "full" / "quick" / "tiny" -> size dict
    train: bool = True
    optimizer: str = "adamw"  # "adamw_fused" (fused on a GPU) or "sgd"
    channels_last: bool = False
    liger: Callable[[nn.Module], nn.Module] | None = None  # None: Liger-Kernel has nothing for it
    #: triton-workshop's version, in place: ``patch(model, compiled)``, ``compiled`` for the
    #: candidate that torch.compile then runs.
    patch: Callable[[nn.Module, bool], Any] = patch_torch_modules
    tokens: Callable[[dict], int] | None = None  # tokens a step processes (tokens/s); None: no tokens
    #: Liger's patch replaces library classes for the whole process: the case needs its own.
    liger_process_wide: bool = False

    def describe(self, size_name: str) -> str:
        size = self.sizes[size_name]
        return ", ".join(f"{k}={v}" for k, v in size.items() if k != "config")


_GPT_TINY = {"vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32}
_GPT_SIZES = {
    "full": {"batch": 8, "seq": 1024, "config": {}},
    "quick": {"batch": 4, "seq": 512, "config": {}},
    "tiny": {"batch": 2, "seq": 16, "config": _GPT_TINY},
}
_RESNET_SIZES = {
    "full": {"batch": 64, "image": 224, "width": 64, "classes": 1000},
    "quick": {"batch": 32, "image": 160, "width": 64, "classes": 1000},
    "tiny": {"batch": 2, "image": 32, "width": 8, "classes": 10},
}
_GPT2_HF_TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 16,
                 "bos_token_id": 0, "eos_token_id": 0}
_GPT2_HF_SIZES = {
    "full": {"batch": 8, "seq": 1024, "config": {"vocab_size": 50257}},  # GPT2Config's own
    "quick": {"batch": 4, "seq": 512, "config": {"vocab_size": 50257}},
    "tiny": {"batch": 2, "seq": 16, "config": _GPT2_HF_TINY},
}
_LLAMA_TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
               "max_position_embeddings": 32}
_LLAMA = {"num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
          "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
          "max_position_embeddings": 2048}
_LLAMA_SMALL = {"num_hidden_layers": 8, "hidden_size": 1024, "intermediate_size": 4096,
                "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
                "max_position_embeddings": 1024}
_LLAMA_SIZES = {
    "full": {"batch": 4, "seq": 2048, "config": _LLAMA},
    "quick": {"batch": 2, "seq": 1024, "config": _LLAMA},
    "tiny": {"batch": 2, "seq": 16, "config": _LLAMA_TINY},
}
_LLAMA_SMALL_SIZES = {
    "full": {"batch": 8, "seq": 1024, "config": _LLAMA_SMALL},
    "quick": {"batch": 4, "seq": 512, "config": _LLAMA_SMALL},
    "tiny": {"batch": 2, "seq": 16, "config": _LLAMA_TINY},
}

WORKLOADS: dict[str, ModelWorkload] = {
    w.name: w
    for w in (
        ModelWorkload("gpt2_train", "GPT-2 124M training step (fwd+bwd+AdamW)", _gpt_model,
                 _gpt_batches, _gpt_loss, _GPT_SIZES, liger=_liger_gpt, patch=_patch_gpt,
                 tokens=_tokens),
        ModelWorkload("gpt2_prefill", "GPT-2 124M inference (prefill)", _gpt_model, _gpt_batches,
                 _gpt_prefill_loss, _GPT_SIZES, train=False, liger=_liger_layer_norms,
                 tokens=_tokens),
        ModelWorkload("resnet18_train", "ResNet-18 training step (NCHW)", _resnet_model,
                 _resnet_batches, _classification_loss, _RESNET_SIZES, optimizer="sgd"),
        ModelWorkload("resnet18_train_cl", "ResNet-18 training step (channels-last)", _resnet_model,
                 _resnet_batches, _classification_loss, _RESNET_SIZES, optimizer="sgd",
                 channels_last=True),
        ModelWorkload("encoder_train", "4-layer nn.TransformerEncoder training step", _encoder_model,
                 _encoder_batches, _regression_loss,
                 {"full": {"batch": 16, "seq": 512, "d_model": 768, "nhead": 12, "ff": 3072, "layers": 4},
                  "quick": {"batch": 8, "seq": 256, "d_model": 768, "nhead": 12, "ff": 3072, "layers": 4},
                  "tiny": {"batch": 2, "seq": 8, "d_model": 16, "nhead": 2, "ff": 32, "layers": 2}},
                 liger=_liger_layer_norms, tokens=_tokens),
        ModelWorkload("gpt2_hf_train", "transformers' GPT-2 124M training step (dropout 0.1)",
                      _gpt2_hf_model, _causal_lm_batches, _causal_lm_loss, _GPT2_HF_SIZES,
                      optimizer="adamw_fused", patch=patch_transformers_model, tokens=_tokens),
        ModelWorkload("llama_train", "LLaMA 1.5B training step (fwd+loss+bwd+fused AdamW)",
                      _llama_model, _causal_lm_batches, _causal_lm_loss, _LLAMA_SIZES,
                      optimizer="adamw_fused", liger=_liger_llama, patch=patch_transformers_model,
                      tokens=_tokens, liger_process_wide=True),
        ModelWorkload("llama_train_small", "LLaMA 8 layers × 1024 training step (fused AdamW)",
                      _llama_model, _causal_lm_batches, _causal_lm_loss, _LLAMA_SMALL_SIZES,
                      optimizer="adamw_fused", liger=_liger_llama, patch=patch_transformers_model,
                      tokens=_tokens, liger_process_wide=True),
    )
}  # fmt: skip


#: How many steps at each size (the tiny CPU runs are as short as possible).
STEPS = {"full": Steps(loss=10, warmup=10, timed=50), "quick": Steps(loss=5, warmup=3, timed=15),
         "tiny": Steps(loss=2, warmup=0, timed=2)}  # fmt: skip
