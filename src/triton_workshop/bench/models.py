"""``workshop bench models``: whole models, end to end, on a CUDA GPU.

A practitioner judges a kernel library by the model, not by the kernel. This benchmark trains (or
runs) real models the way one would, with bf16 autocast, and measures per candidate:

* **ms/step**: the median of many steps, each timed with CUDA events, after a warm-up;
* **first step (s)**: the wall time of the very first step, compiling and autotuning included
  (what a user waits for before anything happens);
* **peak memory**: ``torch.cuda.max_memory_allocated`` over the run;
* **loss Δ**: the largest difference between this candidate's losses and torch eager's over the
  first N steps from the same initial weights and the same batches (training: the optimiser's
  updates included, so errors compound as they would in a run).

The models (built here, from random weights and synthetic data: nothing is downloaded):

=====================  =====================================================================
``gpt2_train``         GPT-2 124M (12 layers, 768 wide, 12 heads, vocab 50304), a training step:
                       forward, cross-entropy, backward, AdamW; batch 8 × 1024 tokens
``gpt2_prefill``       the same GPT-2, inference: one forward over 8 × 1024 tokens, no grad
``resnet18_train``     ResNet-18, batch 64 × 3 × 224², cross-entropy, SGD with momentum (NCHW)
``resnet18_train_cl``  the same in channels-last (NHWC), the layout tensor cores prefer
``encoder_train``      a 4-layer ``nn.TransformerEncoder`` (768 wide, 12 heads, pre-norm), a
                       training step on 16 × 512 tokens, MSE against a random target, AdamW
=====================  =====================================================================

The candidates: ``torch eager``; ``torch.compile``; ``triton-workshop`` (the model after
:func:`triton_workshop.nn.patch`, eager); ``torch.compile + triton-workshop`` (patched, then
compiled); ``Liger-Kernel`` where it imports (its LayerNorm and fused linear cross-entropy; n/a for
the ResNet, which it has no kernels for). The GPT-2 is written with ``torch.nn`` modules only
(``nn.MultiheadAttention``, an ``nn.Sequential`` MLP), so ``patch`` swaps every LayerNorm, Linear
and attention and fuses the MLP's GELU into its first matmul.

Each case runs in a fresh process (``spawn``): a crash, an out-of-memory or a compile that does not
end within ``--timeout`` seconds is reported for that case and the run goes on; each starts with
a clean GPU and the same on-disk compile caches. Results: a rich table, ``models.csv``,
``models.png`` and ``models.json`` in the output folder, written after every model.

Everything but the timing runs on the CPU too (tiny sizes, a fake timer): see
tests/test_bench_models.py. :func:`main` refuses without a GPU (exit code 2).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import json
import math
import multiprocessing
import queue as queue_module
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import runtime

TORCH_EAGER = "torch eager"
TORCH_COMPILE = "torch.compile"
OURS = "triton-workshop"
OURS_COMPILED = "torch.compile + triton-workshop"
LIGER = "Liger-Kernel"
CANDIDATES = (TORCH_EAGER, TORCH_COMPILE, OURS, OURS_COMPILED, LIGER)


# ============================================================================================
# The models.
# ============================================================================================
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


# ============================================================================================
# Workloads: a model, its data, its loss, its optimiser, at three sizes.
# ============================================================================================
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


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model to measure. The callables are module-level functions (a case is sent to a fresh
    process by pickling, which names functions by module and name)."""

    name: str
    title: str
    model: Callable[[dict], nn.Module]  # size -> model on the CPU, seeded by the caller
    batches: Callable[[dict, int], list]  # (size, count) -> CPU batches, deterministic
    loss: Callable[[nn.Module, Any], torch.Tensor]
    sizes: dict  # "full" / "quick" / "tiny" -> size dict
    train: bool = True
    optimizer: str = "adamw"  # or "sgd"
    channels_last: bool = False
    liger: Callable[[nn.Module], nn.Module] | None = None  # None: Liger-Kernel has nothing for it

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

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("gpt2_train", "GPT-2 124M training step (fwd+bwd+AdamW)", _gpt_model,
                 _gpt_batches, _gpt_loss, _GPT_SIZES, liger=_liger_gpt),
        Workload("gpt2_prefill", "GPT-2 124M inference (prefill)", _gpt_model, _gpt_batches,
                 _gpt_prefill_loss, _GPT_SIZES, train=False, liger=_liger_layer_norms),
        Workload("resnet18_train", "ResNet-18 training step (NCHW)", _resnet_model,
                 _resnet_batches, _classification_loss, _RESNET_SIZES, optimizer="sgd"),
        Workload("resnet18_train_cl", "ResNet-18 training step (channels-last)", _resnet_model,
                 _resnet_batches, _classification_loss, _RESNET_SIZES, optimizer="sgd",
                 channels_last=True),
        Workload("encoder_train", "4-layer nn.TransformerEncoder training step", _encoder_model,
                 _encoder_batches, _regression_loss,
                 {"full": {"batch": 16, "seq": 512, "d_model": 768, "nhead": 12, "ff": 3072, "layers": 4},
                  "quick": {"batch": 8, "seq": 256, "d_model": 768, "nhead": 12, "ff": 3072, "layers": 4},
                  "tiny": {"batch": 2, "seq": 8, "d_model": 16, "nhead": 2, "ff": 32, "layers": 2}},
                 liger=_liger_layer_norms),
    )
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Steps:
    """How many steps: ``loss`` from the start (compared with torch eager; the first is the
    first-step time), then ``warmup`` untimed, then ``timed``."""

    loss: int
    warmup: int
    timed: int


STEPS = {"full": Steps(loss=10, warmup=10, timed=50), "quick": Steps(loss=5, warmup=3, timed=15),
         "tiny": Steps(loss=2, warmup=0, timed=2)}  # fmt: skip


# ============================================================================================
# Measuring one case.
# ============================================================================================
class CudaTimer:
    """Steps timed with CUDA events (GPU time between two points of the stream), wall time with
    ``perf_counter`` after a synchronise, peak memory from the caching allocator."""

    def now(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        torch.cuda.synchronize()

    def time_ms(self, fn: Callable[[], Any]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak_bytes(self) -> int | None:
        return torch.cuda.max_memory_allocated()


class WallTimer(CudaTimer):
    """The CPU's stand-in (tests, ``--device cpu`` debugging): wall time, no memory figure."""

    def sync(self) -> None:
        pass

    def time_ms(self, fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    def reset_peak(self) -> None:
        pass

    def peak_bytes(self) -> int | None:
        return None


@dataclasses.dataclass
class Measurement:
    ms_per_step: float
    first_step_s: float
    peak_bytes: int | None
    losses: list[float]
    step_ms: list[float]


def measure(step: Callable[[Any], torch.Tensor], batches: Sequence, steps: Steps, timer) -> Measurement:
    """Run ``step`` over ``batches`` (cycled): the first ``steps.loss`` steps record the loss (the
    first is timed by wall clock, compilation and tuning included), then ``steps.warmup`` untimed
    steps, then ``steps.timed`` steps timed one by one; ms/step is their median (robust to the odd
    slow step: a clock change, a host hiccup)."""
    if steps.loss < 1 or steps.timed < 1 or steps.warmup < 0:
        raise ValueError(f"steps needs loss >= 1, timed >= 1, warmup >= 0, got {steps}")
    if not batches:
        raise ValueError("batches must not be empty")
    timer.reset_peak()
    start = timer.now()
    losses = [float(step(batches[0]))]
    timer.sync()
    first_step_s = timer.now() - start
    for i in range(1, steps.loss):
        losses.append(float(step(batches[i % len(batches)])))
    offset = steps.loss
    for i in range(steps.warmup):
        step(batches[(offset + i) % len(batches)])
    offset += steps.warmup
    step_ms = []
    for i in range(steps.timed):
        batch = batches[(offset + i) % len(batches)]
        step_ms.append(timer.time_ms(lambda: step(batch)))
    return Measurement(statistics.median(step_ms), first_step_s, timer.peak_bytes(), losses, step_ms)


def prepare(model: nn.Module, candidate: str) -> nn.Module:
    """The model as ``candidate`` runs it (ImportError: the candidate is not installed)."""
    if candidate == TORCH_EAGER:
        return model
    if candidate == TORCH_COMPILE:
        return torch.compile(model)
    if candidate in (OURS, OURS_COMPILED):
        from ..nn import patch

        patch(model)
        return torch.compile(model) if candidate == OURS_COMPILED else model
    raise ValueError(f"unknown candidate {candidate!r}; valid: {', '.join(CANDIDATES)}")


def _to_device(batch, device: torch.device, channels_last: bool):
    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, non_blocking=True)
        return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t

    return tuple(move(t) for t in batch)


def make_step(model: nn.Module, workload: Workload, device: torch.device, amp: bool):
    """One training step (forward under autocast, backward, optimiser step) or one inference
    forward; returns the loss, detached."""
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    if not workload.train:
        model.eval()

        def infer(batch):
            with torch.no_grad(), autocast():
                return workload.loss(model, batch).detach()

        return infer
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if workload.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)

    def train(batch):
        with autocast():
            loss = workload.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return train


@dataclasses.dataclass(frozen=True)
class Case:
    workload: Workload
    candidate: str
    size: str = "full"
    device: str = "cuda"
    amp: bool = True
    steps: Steps | None = None  # None: STEPS[size]
    seed: int = 0


def run_case(case: Case, timer=None) -> dict:
    """Build the model (seeded, the same for every candidate), prepare it for the candidate,
    measure. Returns a plain dict (it crosses a process boundary)."""
    workload, size = case.workload, case.workload.sizes[case.size]
    device = torch.device(case.device)
    steps = case.steps or STEPS[case.size]
    timer = timer or (CudaTimer() if device.type == "cuda" else WallTimer())
    torch.manual_seed(case.seed)
    model = workload.model(size)
    if case.candidate == LIGER:
        if workload.liger is None:
            raise _NotApplicable(f"{LIGER} has no kernels for {workload.name}")
        workload.liger(model)  # ImportError when it is not installed
    model = model.to(device)
    if workload.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if case.candidate != LIGER:
        model = prepare(model, case.candidate)
    count = max(steps.loss, 4)
    batches = [_to_device(b, device, workload.channels_last) for b in workload.batches(size, count)]
    step = make_step(model, workload, device, case.amp)
    m = measure(step, batches, steps, timer)
    return dataclasses.asdict(m)


class _NotApplicable(Exception):
    pass


def _child(case: Case, results) -> None:
    """A fresh process's whole life: one case, its result (or its error) on the queue."""
    try:
        results.put(("ok", run_case(case)))
    except (_NotApplicable, ImportError) as exc:
        results.put(("n/a", str(exc)))
    except torch.cuda.OutOfMemoryError as exc:
        results.put(("oom", str(exc).splitlines()[0]))
    except Exception as exc:  # reported in the table: one case failing must not end the run
        where = traceback.extract_tb(exc.__traceback__)[-1]
        results.put(("failed", f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"))


def run_isolated(case: Case, timeout_s: float) -> tuple[str, Any]:
    """:func:`run_case` in a fresh process; ``("timeout", note)`` when it has not finished
    within ``timeout_s`` (it is killed), ``("failed", note)`` when it died without a word."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_child, args=(case, results), daemon=True)
    process.start()
    deadline = time.monotonic() + timeout_s
    try:
        # get before join: a child blocks on exit until its queued result has been read. Polled,
        # so that a child killed outright (a segfault, the OOM killer) is noticed at once.
        while True:
            try:
                return results.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue_module.Empty:
                pass
            if not process.is_alive():
                try:  # it may have put its result just before it ended
                    return results.get(timeout=1.0)
                except queue_module.Empty:
                    return "failed", f"the process died (exit code {process.exitcode})"
            if time.monotonic() >= deadline:
                return "timeout", f"not finished within {timeout_s:.0f} s (killed)"
    finally:
        if process.is_alive():
            process.kill()
        process.join(5)


def run_inline(case: Case, timer=None) -> tuple[str, Any]:
    """:func:`run_case` in this process, errors caught as :func:`run_isolated` reports them (no
    timeout: nothing can stop a compile that hangs)."""
    try:
        return "ok", run_case(case, timer)
    except (_NotApplicable, ImportError) as exc:
        return "n/a", str(exc)
    except Exception as exc:
        return "failed", f"{type(exc).__name__}: {exc}"
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ============================================================================================
# Results: a row per (model, candidate), the table, the CSV, the plot.
# ============================================================================================
@dataclasses.dataclass
class ModelResult:
    model: str
    title: str
    candidate: str
    status: str  # ok, n/a, failed, oom, timeout
    size: str = ""
    ms_per_step: float | None = None
    first_step_s: float | None = None
    peak_gib: float | None = None
    loss_diff: float | None = None  # max |loss - torch eager's loss| over the first N steps
    final_loss: float | None = None
    vs_eager: float | None = None  # torch eager ms / this ms (>1: faster than eager)
    vs_compile: float | None = None  # torch.compile ms / this ms
    note: str = ""
    losses: list = dataclasses.field(default_factory=list, repr=False)  # json only


CSV_COLUMNS = tuple(f.name for f in dataclasses.fields(ModelResult) if f.name != "losses")


def result_of(workload: Workload, case: Case, status: str, payload) -> ModelResult:
    row = ModelResult(workload.name, workload.title, case.candidate, status,
                      size=workload.describe(case.size))
    if status != "ok":
        row.note = str(payload)
        return row
    row.ms_per_step = payload["ms_per_step"]
    row.first_step_s = payload["first_step_s"]
    peak = payload.get("peak_bytes")
    row.peak_gib = None if peak is None else peak / 2**30
    row.losses = list(payload["losses"])
    row.final_loss = row.losses[-1]
    return row


def compare(rows: list[ModelResult]) -> None:
    """Fill ``vs_eager``, ``vs_compile`` and ``loss_diff`` of each model's rows from its torch
    eager and torch.compile rows."""
    by_model: dict[str, dict[str, ModelResult]] = {}
    for r in rows:
        by_model.setdefault(r.model, {})[r.candidate] = r
    for candidates in by_model.values():
        eager, compiled = candidates.get(TORCH_EAGER), candidates.get(TORCH_COMPILE)
        reference = eager.losses if eager and eager.status == "ok" else None
        for r in candidates.values():
            if r.status != "ok":
                continue
            if eager and eager.status == "ok":
                r.vs_eager = eager.ms_per_step / r.ms_per_step
            if compiled and compiled.status == "ok":
                r.vs_compile = compiled.ms_per_step / r.ms_per_step
            if reference is not None and r.losses:
                diffs = [abs(a - b) for a, b in zip(r.losses, reference)]
                r.loss_diff = max(diffs) if all(map(math.isfinite, diffs)) else math.inf


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def table(rows: Sequence[ModelResult]):
    from rich.markup import escape
    from rich.table import Table

    t = Table(
        title="Whole models (bf16 autocast)",
        caption=("ms/step: median over the timed steps (CUDA events). first step: wall time, "
                 "compile and autotune included. ×: torch's ms/step over this one (>1: faster). "
                 "loss Δ: max |loss − torch eager's| over the first steps, same init and data."),
        caption_justify="left",
    )  # fmt: skip
    for column, justify in (("model", "left"), ("candidate", "left"), ("ms/step", "right"),
                            ("× eager", "right"), ("× compile", "right"), ("first step", "right"),
                            ("peak GiB", "right"), ("loss Δ", "right"), ("note", "left")):
        t.add_column(column, justify=justify, no_wrap=column != "note")
    previous = None
    for r in rows:
        name = r.model if r.model != previous else ""
        previous = r.model
        if r.status != "ok":
            style = "dim" if r.status == "n/a" else "red"
            t.add_row(name, r.candidate, f"[{style}]{r.status}[/]", "", "", "", "", "",
                      f"[{style}]{escape(r.note)}[/]")
            continue
        ours = r.candidate in (OURS, OURS_COMPILED)
        ms = _fmt(r.ms_per_step, ".1f")
        t.add_row(
            name, f"[bold]{r.candidate}[/]" if ours else r.candidate,
            f"[bold]{ms}[/]" if ours else ms,
            _fmt(r.vs_eager, ".2f", "×"), _fmt(r.vs_compile, ".2f", "×"),
            _fmt(r.first_step_s, ".1f", " s"), _fmt(r.peak_gib, ".2f"),
            _fmt(r.loss_diff, ".2g"), escape(r.note),
        )  # fmt: skip
    return t


def verdicts(rows: Sequence[ModelResult]) -> list[str]:
    """One line per model: triton-workshop's best (eager or compiled) against torch.compile."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        ours = [r for r in rows if r.model == model and r.candidate in (OURS, OURS_COMPILED)
                and r.status == "ok" and r.vs_compile is not None]  # fmt: skip
        if not ours:
            lines.append(f"{model}: no comparison with torch.compile (a candidate did not run)")
            continue
        best = max(ours, key=lambda r: r.vs_compile)
        lines.append(f"{model}: {OURS} at its best ({best.candidate}) runs "
                     f"{best.vs_compile:.2f}× torch.compile's speed")
    return lines


def write_csv(path: Path, rows: Sequence[ModelResult]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in rows:
            values = [getattr(r, c) for c in CSV_COLUMNS]
            writer.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)
                             for v in values])  # fmt: skip
    return path


def write_plot(path: Path, rows: Sequence[ModelResult]) -> Path:
    """Two panels, a group of bars per model: speed relative to torch eager (higher is better),
    and the first step's seconds (log scale). A case that did not run has no bar but a mark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    candidates = [c for c in CANDIDATES if any(r.candidate == c for r in rows)]
    cell = {(r.model, r.candidate): r for r in rows}
    fig, (speed_ax, first_ax) = plt.subplots(1, 2, figsize=(max(8, 3.2 * len(models)), 4.5))
    width = 0.8 / max(1, len(candidates))
    for i, c in enumerate(candidates):
        offset = (i - (len(candidates) - 1) / 2) * width
        for ax, field in ((speed_ax, "vs_eager"), (first_ax, "first_step_s")):
            xs, heights = [], []
            for m, model in enumerate(models):
                r = cell.get((model, c))
                value = getattr(r, field) if r is not None and r.status == "ok" else None
                if value is not None:
                    xs.append(m + offset)
                    heights.append(value)
                elif r is not None:  # it ran and failed, or timed out: a mark, not a gap
                    ax.annotate("×", (m + offset, 0), ha="center", va="bottom", color="red",
                                xycoords=("data", "axes fraction"))
            ax.bar(xs, heights, width, label=c if ax is speed_ax else None)
    speed_ax.axhline(1.0, color="grey", linewidth=0.8)
    speed_ax.set_ylabel("speed vs torch eager (×, higher is better)")
    first_ax.set_ylabel("first step (s, compile + tune included)")
    first_ax.set_yscale("log")
    for ax in (speed_ax, first_ax):
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=15)
    speed_ax.legend(fontsize=8)
    fig.suptitle("Whole models: triton-workshop against torch eager, torch.compile and peers")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _environment(device: str) -> dict[str, Any]:
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__,
           "python": sys.version.split()[0], "device": device,
           "time": datetime.datetime.now().isoformat(timespec="seconds")}  # fmt: skip
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def write_reports(out: Path, rows: Sequence[ModelResult], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "models.csv", rows)
    write_plot(out / "models.png", rows)
    with open(out / "models.json", "w") as f:
        json.dump({**meta, "verdicts": verdicts(rows),
                   "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=2, default=str)


# ============================================================================================
# The run.
# ============================================================================================
def gpu_unavailable_reason() -> str | None:
    if runtime.mode.INTERPRET:
        return f"kernels run in Triton's interpreter here ({runtime.INTERPRET_REASON})"
    if not torch.cuda.is_available():
        return "no CUDA device found"
    return None


def run_models(
    *,
    quick: bool,
    out: Path,
    console=None,
    models: Sequence[str] | None = None,
    candidates: Sequence[str] | None = None,
    timeout_s: float = 300.0,
    isolate: bool = True,
    device: str | None = None,
    size: str | None = None,
    amp: bool | None = None,
    timer=None,
) -> list[ModelResult]:
    """Measure ``models`` (default: all of :data:`WORKLOADS`) for ``candidates`` (default: all),
    torch eager first (the reference for the loss differences). Writes ``models.csv``,
    ``models.png`` and ``models.json`` into ``out`` after every model, prints the table to
    ``console`` (rich) and returns the rows.

    On a GPU, every case runs in its own process with ``timeout_s``; ``isolate=False`` runs them
    here. ``device``/``size``/``amp``/``timer`` exist for the CPU tests (``device="cpu"``,
    ``size="tiny"``, ``amp=False``: the interpreter's bf16 dots are not exact, and a fake timer);
    without ``device``, a missing GPU is a ``RuntimeError``."""
    if device is None:
        reason = gpu_unavailable_reason()
        if reason:
            raise RuntimeError(f"workshop bench models needs a CUDA GPU: {reason}")
        device = "cuda"
    size = size or ("quick" if quick else "full")
    if size not in SIZE_NAMES:
        raise ValueError(f"size must be one of {SIZE_NAMES}, got {size!r}")
    amp = device.startswith("cuda") if amp is None else amp
    names = list(models) if models else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; valid: {', '.join(WORKLOADS)}")
    chosen = list(candidates) if candidates else list(CANDIDATES)
    bad = [c for c in chosen if c not in CANDIDATES]
    if bad:
        raise ValueError(f"unknown candidate(s) {bad}; valid: {', '.join(CANDIDATES)}")
    chosen = [c for c in CANDIDATES if c in chosen]  # torch eager first: the loss reference
    from rich.markup import escape

    if console is None:
        from rich.console import Console

        console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    out = Path(out)
    meta = {**_environment(device), "size": size, "amp_bf16": amp, "timeout_s": timeout_s}
    rows: list[ModelResult] = []
    for name in names:
        workload = WORKLOADS[name]
        console.print(f"[bold]{workload.title}[/] ({workload.describe(size)})")
        for candidate in chosen:
            case = Case(workload, candidate, size=size, device=device, amp=amp)
            started = time.perf_counter()
            if isolate:
                status, payload = run_isolated(case, timeout_s)
            else:
                status, payload = run_inline(case, timer)
            row = result_of(workload, case, status, payload)
            rows.append(row)
            what = f"{row.ms_per_step:.2f} ms/step" if status == "ok" else f"{status}: {escape(row.note)}"
            console.print(f"  {candidate}: {what} [dim]({time.perf_counter() - started:.0f} s)[/]")
            compare(rows)
            write_reports(out, rows, meta)  # after every case: a run cut off keeps what it measured
    console.print(table(rows))
    for line in verdicts(rows):
        console.print(line)
    console.print(f"[dim]wrote {out / 'models.csv'}, {out / 'models.png'}, {out / 'models.json'}[/]")
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workshop bench models",
        description="Whole models on a CUDA GPU (GPT-2 124M, ResNet-18, a TransformerEncoder): "
                    "ms/step, first-step seconds, peak memory and loss difference, for torch "
                    "eager, torch.compile, triton-workshop (patched), both, and Liger-Kernel.",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="smaller batches and fewer steps (GPT-2 4×512, ResNet 32×160²)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="folder for models.csv, models.png, models.json (default: %(default)s)")
    parser.add_argument("--models", default="", help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    parser.add_argument("--candidates", default="",
                        help=f"comma-separated subset of: {', '.join(CANDIDATES)}")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one case may take, compile included (default: %(default)s)")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run the cases in this process (no timeout; for debugging)")
    parser.add_argument("--list", action="store_true", help="list the models and candidates")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``workshop bench models [--quick] [--out DIR] [--models a,b] [--candidates a,b]
    [--timeout S] [--no-isolate] [--list]``; returns the exit code (2 without a GPU)."""
    try:
        args = _parser().parse_args(list(argv) if argv is not None else None)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.list:
        for w in WORKLOADS.values():
            print(f"{w.name}: {w.title}  [full: {w.describe('full')}; quick: {w.describe('quick')}]")
        print("candidates: " + ", ".join(CANDIDATES))
        return 0
    reason = gpu_unavailable_reason()
    if reason:
        print(f"workshop bench models: needs a CUDA GPU: {reason}.\n"
              "It times whole training steps; in the interpreter kernels run as Python on the "
              "CPU, where timings mean nothing. Run it on a machine with an NVIDIA GPU.",
              file=sys.stderr)  # fmt: skip
        return 2
    split = lambda text: [s.strip() for s in text.split(",") if s.strip()]  # noqa: E731
    try:
        run_models(quick=args.quick, out=args.out, models=split(args.models) or None,
                   candidates=split(args.candidates) or None, timeout_s=args.timeout,
                   isolate=not args.no_isolate)  # fmt: skip
    except ValueError as exc:
        print(f"workshop bench models: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # The cases cross to their processes by pickle, which names classes by module: run main from
    # the imported module, not from this copy executed as __main__.
    from triton_workshop.bench.models import main as _main

    sys.exit(_main())
