"""Matrix product benchmarks: compute-bound, measured in TFLOP/s against cuBLAS.

Sizes are ``M×N×K``: ``a`` is ``M×K``, ``b`` is ``K×N``, and one product is ``2·M·N·K`` FLOPs
(a multiply and an add per term; the epilogue's ``M·N`` activations are not counted). The ceiling
at each shape is cuBLAS's own measured rate (``torch.matmul``) at the same shape and precision,
taken in the same run. ``5012×2100×7777`` is ragged: no dimension is a multiple of a tile.

fp32 is measured twice, with ``torch.backends.cuda.matmul.allow_tf32`` off (IEEE fp32 on both
sides) and on (TF32 tensor cores on both sides: ``ops.matmul`` follows the same switch).
``matmul+leaky_relu`` fuses the activation into the product's epilogue; its eager peer is cuBLAS
followed by ``F.leaky_relu`` (one more pass over ``M·N``), its ceiling cuBLAS's product alone.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..ops.layer_norm_linear import layer_norm_linear
from ..ops.matmul import matmul
from .spec import TFLOPS, Spec, Workload

CUBLAS = "cuBLAS (torch.matmul)"

SQUARE_4K = (4096, 4096, 4096)
SQUARE_8K = (8192, 8192, 8192)
RAGGED = (5012, 2100, 7777)
HALF_SIZES = ((2048, 2048, 2048), SQUARE_4K, RAGGED, SQUARE_8K)
SMALL_SIZES = ((2048, 2048, 2048), SQUARE_4K)


def matmul_cublas(a, b):
    return a @ b


def matmul_leaky_relu_eager(a, b):
    return F.leaky_relu(a @ b)  # negative slope 0.01, the default of both F.leaky_relu and ours


def matmul_inputs(size, dtype, device):
    m, n, k = size
    return (
        torch.randn(m, k, dtype=dtype, device=device),
        torch.randn(k, n, dtype=dtype, device=device),
    )


def matmul_flops(size, dtype) -> int:
    m, n, k = size
    return 2 * m * n * k


def allow_tf32(enabled: bool):
    """Set PyTorch's TF32 switch for fp32 products for the duration (ours reads the same one)."""

    @contextlib.contextmanager
    def context():
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = enabled
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved

    return context


def _workload(name, dtype, sizes, headlines, *, activation=None, context=None, tolerance=None):
    fused = activation is not None
    return Workload(
        name=name,
        dtype=dtype,
        unit=TFLOPS,
        sizes=sizes,
        quick=(SQUARE_4K,),
        headlines=headlines,
        make_inputs=matmul_inputs,
        work=matmul_flops,
        work_formula="FLOPs = 2·M·N·K" + (" (the activation is not counted)" if fused else ""),
        ours=lambda a, b: matmul(a, b, activation=activation),
        reference=matmul_leaky_relu_eager if fused else matmul_cublas,
        reference_name="cuBLAS + F.leaky_relu" if fused else CUBLAS,
        ceiling=matmul_cublas,
        ceiling_name="cuBLAS",
        context=context or contextlib.nullcontext,
        tolerance=tolerance,
    )


LN_LINEAR = (8192, 4096, 4096)  # M rows of K features -> N outputs


def ln_linear_inputs(size, dtype, device):
    m, n, k = size
    return (
        torch.randn(m, k, dtype=dtype, device=device),
        1 + 0.1 * torch.randn(k, dtype=dtype, device=device),  # LayerNorm weight
        0.1 * torch.randn(k, dtype=dtype, device=device),  # LayerNorm bias
        torch.randn(n, k, dtype=dtype, device=device) / k**0.5,  # Linear weight, (N, K)
        0.1 * torch.randn(n, dtype=dtype, device=device),  # Linear bias
    )


def ln_linear_eager(x, ln_w, ln_b, w, b):
    return F.linear(F.layer_norm(x, (x.shape[-1],), ln_w, ln_b), w, b)


def ln_linear_cublas(x, ln_w, ln_b, w, b):
    return F.linear(x, w, b)  # the product alone: the ceiling for a fused LayerNorm + Linear


def _ln_linear_workload(dtype):
    return Workload(
        name="layer_norm+linear",
        dtype=dtype,
        unit=TFLOPS,
        sizes=((4096, 4096, 4096), LN_LINEAR),
        quick=(LN_LINEAR,),
        headlines=(LN_LINEAR,),
        make_inputs=ln_linear_inputs,
        work=matmul_flops,
        work_formula="FLOPs = 2·M·N·K (the normalisation is not counted)",
        ours=layer_norm_linear,
        reference=ln_linear_eager,
        reference_name="torch eager (F.layer_norm + F.linear)",
        ceiling=ln_linear_cublas,
        ceiling_name="cuBLAS linear",
    )


SPEC = Spec(
    name="matmul",
    title="Matrix product M×N×K (TFLOP/s, ceiling = cuBLAS at the same shape)",
    workloads=[
        _workload("matmul", torch.float16, HALF_SIZES, (SQUARE_4K, SQUARE_8K, RAGGED)),
        _workload("matmul", torch.bfloat16, HALF_SIZES, (SQUARE_4K, SQUARE_8K, RAGGED)),
        _workload("matmul IEEE", torch.float32, SMALL_SIZES, (SQUARE_4K,),
                  context=allow_tf32(False)),
        # TF32 rounds the inputs to 10 mantissa bits: differences of ~sqrt(K)·2^-11 per output.
        _workload("matmul TF32", torch.float32, SMALL_SIZES, (SQUARE_4K,),
                  context=allow_tf32(True), tolerance=(1e-2, 2e-3)),
        _workload("matmul+leaky_relu", torch.float16, SMALL_SIZES, (SQUARE_4K,),
                  activation="leaky_relu"),
        _workload("matmul+leaky_relu", torch.bfloat16, SMALL_SIZES, (SQUARE_4K,),
                  activation="leaky_relu"),
        _ln_linear_workload(torch.float16),
        _ln_linear_workload(torch.bfloat16),
    ],
)
