"""Gated linear unit benchmarks: ``silu(gate) * up`` (SwiGLU) and ``gelu_tanh(gate) * up`` (GeGLU),
bf16, at a batch of 8192 tokens and an MLP's intermediate width swept (Llama-3-8B's is 14336).

Memory-bound: eager PyTorch runs the activation and the product as two kernels (the activation
written and read back), its backward as several more. Bytes counted, the minimum a fused
implementation must move (``M·N`` elements a tensor):

* forward: ``gate``, ``up`` read, ``out`` written: ``3·M·N·itemsize``;
* forward + backward: the forward's 3, then ``dout``, ``gate``, ``up`` read and ``dgate``,
  ``dup`` written (the activation recomputed, not saved): ``8·M·N·itemsize``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.glu import geglu, swiglu
from .spec import GBPS, Spec, Workload, liger

TOKENS = 8192
SIZES = tuple((TOKENS, n) for n in (4096, 8192, 11008, 14336))
HEADLINE = (TOKENS, 14336)


def swiglu_eager(gate, up):
    return F.silu(gate) * up


def geglu_eager(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def _inputs(requires_grad: bool):
    def make(size, dtype, device):
        return tuple(torch.randn(size, dtype=dtype, device=device).requires_grad_(requires_grad)
                     for _ in range(2))

    return make


def fwd_bytes(size, dtype) -> int:
    """gate, up read, out written."""
    rows, cols = size
    return 3 * rows * cols * dtype.itemsize


def fwd_bwd_bytes(size, dtype) -> int:
    """fwd: gate, up read, out written; bwd: dout, gate, up read, dgate, dup written."""
    rows, cols = size
    return 8 * rows * cols * dtype.itemsize


def _workload(name, ours, reference, liger_name, backward: bool) -> Workload:
    return Workload(
        name=f"{name} fwd+bwd" if backward else f"{name} fwd",
        dtype=torch.bfloat16,
        unit=GBPS,
        sizes=SIZES,
        quick=(HEADLINE,),
        headlines=(HEADLINE,),
        make_inputs=_inputs(backward),
        work=fwd_bwd_bytes if backward else fwd_bytes,
        work_formula=(
            "bytes = 8·M·N·itemsize (fwd: gate, up read, out written; bwd: dout, gate, up read, "
            "dgate, dup written)"
            if backward
            else "bytes = 3·M·N·itemsize (gate, up read, out written)"
        ),
        ours=ours,
        reference=reference,
        optional_peers={"Liger-Kernel": liger(f"liger_kernel.ops.{liger_name[0]}", liger_name[1])},
        backward=backward,
    )


SPEC = Spec(
    name="glu",
    title="Gated linear units: SwiGLU and GeGLU (bf16, 8192 tokens, intermediate width swept)",
    workloads=[
        _workload(name, ours, reference, liger_name, backward)
        for name, ours, reference, liger_name in (
            ("swiglu", swiglu, swiglu_eager, ("swiglu", "LigerSiLUMulFunction")),
            ("geglu", geglu, geglu_eager, ("geglu", "LigerGELUMulFunction")),
        )
        for backward in (False, True)
    ],
)
