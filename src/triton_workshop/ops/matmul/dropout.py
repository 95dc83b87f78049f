"""The backward of the epilogue's dropout: the output gradient through the mask the forward drew,
redrawn from its seed by ``dropout_scale_kernel`` (:func:`dropout_scaled`, the registered op
``matmul_dropout_backward`` with its own autograd), and that mask written out for tests
(:func:`dropout_keep_mask`).
"""

from __future__ import annotations

import math

import torch

from ... import runtime
from ...runtime import register_op
from .kernels import dropout_scale_kernel
from .tuning import TUNING, MatmulTuning


@runtime.plan_cache()
def _dropout_scale_plan(rows: int, cols: int, rows_per_batch: int, src_strides: tuple,
                        dropout_p: float, dtype: torch.dtype,
                        tuning: MatmulTuning) -> runtime.LaunchPlan:
    """dropout_scale_kernel's launch for one gradient layout. ``dtype`` is unused here but keys
    the cache: a plan's prepared launches hold a kernel compiled for one dtype."""
    block_r, block_c = tuning.dropout_block_rows, tuning.dropout_block_cols
    grid = (runtime.cdiv(rows, block_r) * runtime.cdiv(cols, block_c),)
    return runtime.LaunchPlan(dropout_scale_kernel, grid,
                              scalars=(rows, cols, rows_per_batch, *src_strides, dropout_p),
                              consts=dict(BLOCK_R=block_r, BLOCK_C=block_c,
                                          num_warps=tuning.dropout_num_warps))


def dropout_scaled(src: torch.Tensor, seed: torch.Tensor, dropout_p: float,
                   eager: bool = False) -> torch.Tensor:
    """``src * keep / (1 - p)`` for ``src`` shaped as matmul's output, (M, N) or (B, M, N) of
    any strides, ``keep`` the mask the epilogue draws for ``seed``; contiguous. ``eager``: called
    from an eager autograd backward (launched straight, as :meth:`LaunchPlan.launch_eager`)."""
    out = src.new_empty(src.shape)
    if out.numel() == 0:
        return out
    rows_per_batch, cols = src.shape[-2:]
    src_strides = (src.stride(0) if src.dim() == 3 else 0, src.stride(-2), src.stride(-1))
    plan = _dropout_scale_plan(out.numel() // cols, cols, rows_per_batch, src_strides,
                               dropout_p, src.dtype, TUNING)
    with runtime.device_guard(src):
        if eager:
            plan.launch_eager(src, out, seed)
        else:
            plan.launch(src, out, seed)
    return out


def _dropout_grad_fake(grad, seed, dropout_p):
    return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)


@register_op("matmul_dropout_backward", fake=_dropout_grad_fake)
def matmul_dropout_backward(grad: torch.Tensor, seed: torch.Tensor,
                            dropout_p: float) -> torch.Tensor:
    return dropout_scaled(grad, seed, dropout_p)


def _dropout_grad_setup_context(ctx, inputs, output):
    _, seed, ctx.dropout_p = inputs
    ctx.save_for_backward(seed)


def _dropout_grad_backward(ctx, grad):
    # Linear in its input: its own backward is the same masking (a double backward).
    (seed,) = ctx.saved_tensors
    return matmul_dropout_backward(grad, seed, ctx.dropout_p), None, None


matmul_dropout_backward.register_autograd(_dropout_grad_backward,
                                          setup_context=_dropout_grad_setup_context)


def dropout_keep_mask(seed: torch.Tensor, shape: tuple, dropout_p: float) -> torch.Tensor:
    """The mask (True = kept) that :func:`linear` with ``dropout_p`` applies for ``seed`` to an
    output of ``shape`` (..., N), its leading dims counted as rows (see kernels.dropout_factor),
    drawn by the backward's kernel. For tests: a reference then applies the very same mask."""
    shape = tuple(shape)
    ones = torch.ones((math.prod(shape[:-1]), shape[-1]), device=seed.device)
    return (dropout_scaled(ones, seed, dropout_p) != 0).reshape(shape)
