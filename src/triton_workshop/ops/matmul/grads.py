"""The backward's products of the matmul family, on torch's GEMMs (why: the comment above
``_needs_preactivation`` in the package): dA = dZ Bᵀ and dB = Aᵀ dZ, each laid out as its
operand and summed over the batch its operand was broadcast across, and the bias's gradient.
"""

from __future__ import annotations

import torch


def column_major(t) -> bool:
    stride = t.stride()
    return stride[0] == 1 and stride[1] != 1


# Each gradient is laid out as its operand: for linear's b = weight.t() (column-major) dB is
# computed as (dZᵀ A)ᵀ, the same GEMM with other transpose flags, so that the gradient autograd
# hands the weight is row-major as the weight and is kept without a copy.
def grad_of_a(grad_z, a, b):
    """dA = dZ Bᵀ (2-D), laid out as ``a``."""
    return torch.mm(b, grad_z.t()).t() if column_major(a) else torch.mm(grad_z, b.t())


def grad_of_b(grad_z, a, b):
    """dB = Aᵀ dZ (2-D), laid out as ``b``."""
    return torch.mm(grad_z.t(), a).t() if column_major(b) else torch.mm(a.t(), grad_z)


def products(grad_z, a, b, need_a: bool, need_b: bool):
    """dA = dZ Bᵀ and dB = Aᵀ dZ, each summed over the batch its operand was broadcast across."""
    if a.dim() == 2 and b.dim() == 2:  # no batch to broadcast or sum over
        return (grad_of_a(grad_z, a, b) if need_a else None,
                grad_of_b(grad_z, a, b) if need_b else None)
    grad_a = grad_b = None
    if need_a:
        grad_a = torch.matmul(grad_z, b.transpose(-1, -2))
        if grad_a.shape != a.shape:
            grad_a = grad_a.sum_to_size(a.shape)
    if need_b:
        if a.dim() == 3 and (b.dim() == 2 or b.shape[0] == 1):
            # b was shared by every batch: one (K, B*M) @ (B*M, N) product sums over the batch
            # inside the GEMM's fp32 accumulator instead of materialising B partial gradients.
            # Explicit row counts: reshape(-1, 0) is ambiguous when K or N is 0.
            K, N = b.shape[-2:]
            rows = a.shape[0] * a.shape[1]
            grad_b = grad_of_b(grad_z.reshape(rows, N), a.reshape(rows, K),
                               b if b.dim() == 2 else b[0])
            if b.dim() == 3:
                grad_b = grad_b.unsqueeze(0)
        else:
            grad_b = torch.matmul(a.transpose(-1, -2), grad_z)
            if grad_b.shape != b.shape:
                grad_b = grad_b.sum_to_size(b.shape)
    return grad_a, grad_b


def bias_grad(grad_z, bias):
    """The bias's gradient: ``grad_z`` summed over all but its last dim in fp32, in bias's dtype
    (torch's sum of a bf16/fp16 tensor accumulates in fp32 and rounds once: no cast after)."""
    rows = 0 if grad_z.dim() == 2 else tuple(range(grad_z.dim() - 1))
    if bias.dtype is grad_z.dtype:
        return grad_z.sum(rows)
    grad_bias = grad_z.sum(rows, dtype=torch.float32)
    return grad_bias if bias.dtype is torch.float32 else grad_bias.to(bias.dtype)
