"""Cross-entropy benchmarks at an LLM's vocabulary (128256 words, bf16).

* ``cross_entropy fwd`` and ``fwd+bwd``: (N, V) logits, the mean loss over int64 targets.
  Memory-bound; bytes counted are the minimum any implementation must move: the forward reads
  the logits (``N·V·itemsize``) and the targets (``8·N``); forward + backward also writes the
  gradient (``2·N·V·itemsize + 8·N``). The backward starts from a gradient of 1, as
  ``loss.backward()`` does (:func:`.measure.output_gradient`): ours then moves just those bytes
  (the forward writes the gradient, the backward has nothing to scale); another incoming
  gradient (a loss divided by accumulation steps) costs a read and a write more.
* ``linear_cross_entropy fwd+bwd``: ``F.cross_entropy(F.linear(x, W).float(), t)`` with x
  (N, H), W (V, H), the gradients of x and W. Compute-bound: three products of ``2·N·H·V`` FLOPs
  (logits, grad x, grad W). What the fused op is for is memory: eager PyTorch holds N x V logits
  in bf16 and fp32 and their gradient (about 17 GB at the headline size), the fused op one chunk
  of them; :func:`peak_memory` measures each candidate's peak (the harness has no column for it
  yet).

Liger-Kernel's functions are the optional peers. Its cross-entropy overwrites the logits with
their gradient when they require grad (so that no N x V gradient is allocated): in the fwd+bwd
workload the later candidates read gradients instead of logits, which changes no timing.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch
import torch.nn.functional as F

from ..ops.cross_entropy import cross_entropy, linear_cross_entropy
from .measure import evaluate
from .spec import GBPS, TFLOPS, Size, Spec, Workload, liger

VOCAB = 128256  # Llama 3's vocabulary
CE_SIZES = ((8192, 32000), (8192, 65536), (8192, VOCAB))
CE_HEADLINE = (8192, VOCAB)
LINEAR_SIZES = ((4096, 2048, VOCAB), (8192, 2048, VOCAB))
LINEAR_HEADLINE = (8192, 2048, VOCAB)


#: The targets of each (tokens, vocabulary, device), drawn once with a fixed seed. A workload's
#: inputs are tensors of its dtype (bf16 cannot hold a class index of 128255), so the candidates
#: look the targets up by their operands' shapes instead of taking them as an input.
_TARGETS: dict[tuple, torch.Tensor] = {}


def targets_for(n: int, vocab: int, device: torch.device) -> torch.Tensor:
    key = (n, vocab, str(device))
    if key not in _TARGETS:
        g = torch.Generator(device="cpu").manual_seed(n * 7919 + vocab)
        _TARGETS[key] = torch.randint(0, vocab, (n,), generator=g).to(device)
    return _TARGETS[key]


def _logits_targets(logits: torch.Tensor) -> torch.Tensor:
    return targets_for(logits.shape[0], logits.shape[1], logits.device)


def _ce_inputs(requires_grad: bool):
    def make(size, dtype, device):
        n, vocab = size
        logits = torch.randn(n, vocab, dtype=dtype, device=device) * 2.0
        return (logits.requires_grad_(requires_grad),)

    return make


def ce_fwd_bytes(size, dtype) -> int:
    """Logits read, targets read."""
    n, vocab = size
    return n * vocab * dtype.itemsize + 8 * n


def ce_fwd_bwd_bytes(size, dtype) -> int:
    """Logits read, gradient written, targets read."""
    n, vocab = size
    return 2 * n * vocab * dtype.itemsize + 8 * n


def cross_entropy_eager(logits):
    return F.cross_entropy(logits, _logits_targets(logits))


def _liger_cross_entropy():
    apply = liger("liger_kernel.ops.cross_entropy", "LigerCrossEntropyFunction")()
    # (input, target, class weight, ignore_index, lse_square_scale, label_smoothing, reduction);
    # it returns (loss, z_loss, ...).
    return lambda logits: apply(logits, _logits_targets(logits), None, -100, 0.0, 0.0,
                                "mean")[0]


def _ce_workload(name, backward: bool) -> Workload:
    return Workload(
        name=name,
        dtype=torch.bfloat16,
        unit=GBPS,
        sizes=CE_SIZES,
        quick=(CE_HEADLINE,),
        headlines=(CE_HEADLINE,),
        make_inputs=_ce_inputs(backward),
        work=ce_fwd_bwd_bytes if backward else ce_fwd_bytes,
        work_formula=(
            "bytes = 2·N·V·itemsize + 8·N (logits read, gradient written, int64 targets read)"
            if backward else "bytes = N·V·itemsize + 8·N (logits read, int64 targets read)"),
        ours=lambda logits: cross_entropy(logits, _logits_targets(logits)),
        reference=cross_entropy_eager,
        optional_peers={"Liger-Kernel": _liger_cross_entropy},
        backward=backward,
    )


def _linear_inputs(size, dtype, device):
    n, hidden, vocab = size
    x = torch.randn(n, hidden, dtype=dtype, device=device)
    weight = torch.randn(vocab, hidden, dtype=dtype, device=device) * hidden ** -0.5
    return x.requires_grad_(), weight.requires_grad_()


def _linear_targets(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return targets_for(x.shape[0], weight.shape[0], x.device)


def linear_flops(size, dtype) -> int:
    """Three products of 2·N·H·V: the logits, grad x and grad W."""
    n, hidden, vocab = size
    return 3 * 2 * n * hidden * vocab


def linear_cross_entropy_eager(x, weight):
    return F.cross_entropy(F.linear(x, weight).float(), _linear_targets(x, weight))


def _liger_linear_cross_entropy():
    apply = liger("liger_kernel.ops.fused_linear_cross_entropy",
                  "LigerFusedLinearCrossEntropyFunction")()
    # (input, weight, target, bias, class weight, ignore_index, lse_square_scale,
    # label_smoothing, reduction); it returns (loss, z_loss, ...).
    return lambda x, weight: apply(x, weight, _linear_targets(x, weight), None, None, -100, 0.0,
                                   0.0, "mean")[0]


LINEAR_WORKLOAD = Workload(
    name="linear_cross_entropy fwd+bwd",
    dtype=torch.bfloat16,
    unit=TFLOPS,
    sizes=LINEAR_SIZES,
    quick=(LINEAR_HEADLINE,),
    headlines=(LINEAR_HEADLINE,),
    make_inputs=_linear_inputs,
    work=linear_flops,
    work_formula="FLOPs = 3 · 2·N·H·V (logits, grad x, grad W)",
    ours=lambda x, weight: linear_cross_entropy(x, weight, _linear_targets(x, weight)),
    reference=linear_cross_entropy_eager,
    optional_peers={"Liger-Kernel": _liger_linear_cross_entropy},
    backward=True,
    # grad W is summed over chunks of tokens in bf16 (one rounding a chunk, as cuBLAS adds into
    # it) where eager PyTorch rounds one product once.
    tolerance=(2e-2, 8e-3),
)


SPEC = Spec(
    name="cross_entropy",
    title="Cross-entropy over bf16 logits (mean loss, vocabulary swept up to 128256)",
    workloads=[
        _ce_workload("cross_entropy fwd", backward=False),
        _ce_workload("cross_entropy fwd+bwd", backward=True),
    ],
)

#: A spec of its own: its unit is TFLOP/s (a spec's workloads share one unit).
LINEAR_SPEC = Spec(
    name="linear_cross_entropy",
    title="Linear + cross-entropy fused, at a 128256-word vocabulary (bf16, H = 2048)",
    workloads=[LINEAR_WORKLOAD],
)

SPECS = (SPEC, LINEAR_SPEC)


def peak_memory(w: Workload, size: Size, device: torch.device,
                with_compile: bool = True) -> dict[str, int | str]:
    """Name → the most bytes the candidate held at once beyond its inputs, over one call
    (forward, and backward for fwd+bwd workloads), or → why it was not measured. Each candidate
    runs once first (compiles, tuning), then once measured; the inputs are made afresh for each
    (Liger-Kernel overwrites logits in place)."""
    results: dict[str, int | str] = {}
    for name, fn in w.candidates(with_compile=with_compile).items():
        if isinstance(fn, str):
            results[name] = fn
            continue
        try:
            results[name] = _one_peak(w, fn, size, device)
        except torch.OutOfMemoryError:
            results[name] = "out of memory"
        gc.collect()
        torch.cuda.empty_cache()
    return results


def _one_peak(w: Workload, fn: Callable, size: Size, device) -> int:
    inputs = w.make_inputs(size, w.dtype, device)
    dy = None  # the losses are scalars: autograd's implicit gradient of 1
    evaluate(w, fn, inputs, dy)  # warm: compiles and tunes outside the measurement
    del inputs
    gc.collect()
    torch.cuda.empty_cache()
    inputs = w.make_inputs(size, w.dtype, device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = evaluate(w, fn, inputs, dy)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out, inputs
    return peak


def print_peak_memory(device: torch.device | None = None) -> None:
    """The peak memory of every workload's candidates at its headline size, in MiB."""
    device = device or torch.device("cuda")
    for w in (w for spec in SPECS for w in spec.workloads):
        for size in w.headlines:
            for name, peak in peak_memory(w, size, device).items():
                shown = f"{peak / 2**20:9.0f} MiB" if isinstance(peak, int) else peak
                print(f"{w.name:32s} {w.label(size):18s} {name:18s} {shown}")


if __name__ == "__main__":
    print_peak_memory()
