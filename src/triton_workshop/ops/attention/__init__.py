"""Fused attention (FlashAttention-2 style): ``softmax(q kᵀ · scale [+ causal mask]) v`` without
the N x N matrix, forward and backward; :func:`attention` has the semantics of
``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)`` (``enable_gqa=True``
when K/V have fewer heads).

The attention family's host code: input checks, the launches, the registered ops with their
autograd, and the public :func:`attention`. The kernels are in :mod:`.kernels`; the algorithm
(online softmax, exp2, the causal split, the backward, grouped-query attention, how to swap it
into a model) is told in docs/kernels/attention.md.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch
import triton

from ... import runtime
from ...runtime import FLOAT_DTYPES, register_op, wrap_triton
from .kernels import (
    DKDV_CONFIGS,
    DQ_CONFIGS,
    FWD_CONFIGS,
    attn_bwd_dkdv_kernel,
    attn_bwd_dq_kernel,
    attn_bwd_preprocess_kernel,
    attn_fwd_kernel,
    prune_dkdv_configs,
    prune_dq_configs,
    prune_fwd_configs,
)

__all__ = [
    "AttentionTuning", "DKDV_CONFIGS", "DQ_CONFIGS", "FWD_CONFIGS", "MAX_HEAD_DIM",
    "MIN_HEAD_DIM_PAD", "TUNING", "attention", "attention_backward", "attention_forward",
    "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel", "attn_bwd_preprocess_kernel", "attn_fwd_kernel",
    "prune_dkdv_configs", "prune_dq_configs", "prune_fwd_configs",
]

#: Largest head dim: the fp32 accumulators of a 128-row tile of D = 256 already take half the
#: register file of an SM (Hopper's 256 KB).
MAX_HEAD_DIM = 256
#: Smallest padded head dim: ``tl.dot`` needs a reduction dimension of at least 16.
MIN_HEAD_DIM_PAD = 16


@dataclasses.dataclass(frozen=True)
class AttentionTuning:
    """The attention family's launch choices that are not the autotuner's (its three main
    kernels are autotuned; see :mod:`.kernels`). Read at each call from :data:`TUNING`; a test
    replaces the whole object (``dataclasses.replace(attention.TUNING, ...)``)."""

    #: Query rows a program of the Δ preprocess kernel handles. A small, memory-bound kernel
    #: (one read of O and dO), so a fixed tile rather than autotuning.
    preprocess_block_m: int = 64


TUNING = AttentionTuning()


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
def _head_dim_pad(head_dim: int) -> int:
    return max(MIN_HEAD_DIM_PAD, triton.next_power_of_2(int(head_dim)))


def _dot_args(dtype: torch.dtype) -> dict:
    # fp32: exact IEEE products, as torch's fp32 math; fp16/bf16 products are exact either way.
    # bf16 in the interpreter: widen before each dot (docs/kernels/attention.md).
    return dict(
        INPUT_PRECISION="ieee",
        DOT_IN_FP32=runtime.INTERPRET and dtype == torch.bfloat16,
    )


def _common_args(q: torch.Tensor, k: torch.Tensor, causal: bool) -> dict:
    n_q, n_k, head_dim = q.shape[2], k.shape[2], q.shape[3]
    return dict(
        N_Q_BUCKET=runtime.bucket(n_q),
        N_K_BUCKET=runtime.bucket(n_k),
        HEAD_DIM=int(head_dim),
        HEAD_DIM_PAD=_head_dim_pad(head_dim),
        CAUSAL=bool(causal),
        **_dot_args(q.dtype),
    )


def _tile_grid(n_rows: int, n_programs_per_tile: int, block_key: str):
    """1-D grid: every (tile, head, batch); see the kernels' ``_program_tile``."""
    return lambda meta: (triton.cdiv(n_rows, meta[block_key]) * n_programs_per_tile,)


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[1], q.shape[2])


def _forward_fake(q, k, v, causal, scale):
    return torch.empty_like(q), q.new_empty(_lse_shape(q), dtype=torch.float32)


def _backward_fake(grad_out, q, k, v, out, lse, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@runtime.plan_cache()
def _preprocess_plan(shape: tuple, out_strides: tuple, grad_strides: tuple, dtype: torch.dtype,
                     tuning: AttentionTuning) -> runtime.LaunchPlan:
    """attn_bwd_preprocess_kernel's launch (Δ per query row) for one shape and layout. ``dtype``
    is unused here but keys the cache: a plan's prepared launches hold a kernel compiled for one
    dtype."""
    batch, n_heads, n_q, head_dim = shape
    block_m = tuning.preprocess_block_m
    return runtime.LaunchPlan(
        attn_bwd_preprocess_kernel, (triton.cdiv(n_q, block_m) * n_heads * batch,),
        scalars=(*out_strides, *grad_strides, n_heads, n_q),
        consts=dict(HEAD_DIM=int(head_dim), HEAD_DIM_PAD=_head_dim_pad(head_dim), BLOCK_M=block_m),
    )


def _check_op_inputs(q, k, v, causal, scale) -> None:
    """The public checks again, on (B, H, N, D) only: the registered ops can also be called
    directly (``torch.ops.triton_workshop.attention_forward``), and must not launch on bad input."""
    _check_qkv(q, k, v, ndims=(4,))
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    _check_scale(scale, allow_none=False)


# --------------------------------------------------------------------------------------------
# The registered ops: (B, H, N, D) inputs, validated; any strides.
# --------------------------------------------------------------------------------------------
@register_op("attention_forward", fake=_forward_fake,
             autocast="lower_precision_fp")  # as F.scaled_dot_product_attention
def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(out, lse)``: out like q, lse (B, H, Nq) fp32, the natural-log LSE of each row
    of ``scale · q kᵀ`` (after the causal mask); -inf for rows that see no key (Nk = 0)."""
    _check_op_inputs(q, k, v, causal, scale)
    batch, n_heads, n_q, _ = q.shape
    n_kv_heads, n_k = k.shape[1], k.shape[2]

    out = torch.empty_like(q)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    if out.numel() == 0:
        return out, lse
    if n_k == 0:
        # No keys: PyTorch returns 0 (an empty weighted sum), and the log of an empty sum is -inf.
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse

    grid = _tile_grid(n_q, n_heads * batch, "BLOCK_M")
    # A plain launch, not a LaunchPlan: attn_fwd_kernel is autotuned, so its tile, and with it
    # the grid, is only known at launch.
    with runtime.device_guard(q):
        wrap_triton(attn_fwd_kernel)[grid](
            q, k, v, out, lse,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            n_heads, n_q, n_k, n_heads // n_kv_heads, scale,
            POSITIVE_SCALE=scale > 0, **_common_args(q, k, causal),
        )  # fmt: skip
    return out, lse


@register_op("attention_backward", fake=_backward_fake)
def attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` from the incoming gradient ``grad_out`` and the forward's ``out`` and
    ``lse``."""
    _check_op_inputs(q, k, v, causal, scale)
    for name, t in (("grad_out", grad_out), ("out", out)):
        runtime.check_tensor(t, name, dtypes=(q.dtype,), ndim=4)
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
    runtime.check_tensor(lse, "lse", dtypes=(torch.float32,), ndim=3)
    if lse.shape != _lse_shape(q) or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous {_lse_shape(q)} tensor, got {tuple(lse.shape)}")
    runtime.check_same_device(q=q, grad_out=grad_out, out=out, lse=lse)
    batch, n_heads, n_q, head_dim = q.shape
    n_kv_heads, n_k = k.shape[1], k.shape[2]

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if dq.numel() == 0 or dk.numel() == 0:
        # No queries: nothing depends on k and v; no keys: out is 0 whatever q is.
        return dq.zero_(), dk.zero_(), dv.zero_()

    delta = torch.empty_like(lse)
    common = _common_args(q, k, causal)
    group_size = n_heads // n_kv_heads
    preprocess = _preprocess_plan(tuple(q.shape), out.stride(), grad_out.stride(), q.dtype, TUNING)
    with runtime.device_guard(q):
        preprocess.launch(out, grad_out, delta)
        # Plain launches, not LaunchPlans: both kernels are autotuned, so their tiles, and with
        # them the grids, are only known at launch.
        wrap_triton(attn_bwd_dkdv_kernel)[_tile_grid(n_k, n_kv_heads * batch, "BLOCK_N")](
            q, k, v, grad_out, lse, delta, dk, dv,
            *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(),
            *dk.stride(), *dv.stride(),
            n_heads, n_kv_heads, n_q, n_k, group_size, scale,
            **common,
        )  # fmt: skip
        wrap_triton(attn_bwd_dq_kernel)[_tile_grid(n_q, n_heads * batch, "BLOCK_M")](
            q, k, v, grad_out, lse, delta, dq,
            *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dq.stride(),
            n_heads, n_q, n_k, group_size, scale,
            **common,
        )  # fmt: skip
    return dq, dk, dv


def _attention_setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zero-filled gradient for lse, which is never used


def _attention_backward(ctx, grad_out, grad_lse):
    if grad_out is None:  # the output did not reach the loss
        return None, None, None, None, None
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


attention_forward.register_autograd(_attention_backward, setup_context=_attention_setup_context)


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------
def _check_scale(scale, *, allow_none: bool) -> None:
    if scale is None and allow_none:
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")


def _check_qkv(q, k, v, *, ndims=(3, 4)) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES, ndim=ndims)
    runtime.check_same_dtype(q=q, k=k, v=v)
    runtime.check_same_device(q=q, k=k, v=v)
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(
                f"{name} must have as many dimensions as q ({q.dim()}), got shape {tuple(t.shape)}"
            )
    if q.dim() == 4:
        for name, t in (("k", k), ("v", v)):
            if t.shape[0] != q.shape[0]:
                raise ValueError(
                    f"{name} has batch size {t.shape[0]} but q has {q.shape[0]}: they must match"
                )
    head_dim = q.shape[-1]
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != head_dim:
            raise ValueError(
                f"{name} has head dim {t.shape[-1]} but q has {head_dim}: they must match"
            )
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"q has head dim {head_dim}; supported head dims are 1 to {MAX_HEAD_DIM} "
            "(any size: non-powers of two are padded)"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v has sequence length {v.shape[-2]} but k has {k.shape[-2]}: they must match"
        )
    if v.shape[-3] != k.shape[-3]:
        raise ValueError(f"v has {v.shape[-3]} heads but k has {k.shape[-3]}: they must match")
    n_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_kv_heads == 0 and n_heads != 0 or n_kv_heads != 0 and n_heads % n_kv_heads != 0:
        raise ValueError(
            f"q has {n_heads} heads, which is not a multiple of k's {n_kv_heads} heads "
            "(grouped-query attention needs H divisible by H_kv)"
        )


@runtime.follows_autocast(attention_forward)
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """``softmax(q kᵀ · scale [+ causal mask]) v`` in fused Triton kernels, forward and backward.

    Same semantics as ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``:

    * ``q`` is (B, H, Nq, D) or (H, Nq, D); ``k`` and ``v`` are (B, H_kv, Nk, D) or (H_kv, Nk, D),
      with ``H_kv`` dividing ``H`` (grouped-query / multi-query attention: query head ``h`` reads
      K/V head ``h // (H // H_kv)``, as SDPA with ``enable_gqa=True``). Any strides.
    * fp16, bf16 or fp32 (all three the same); the softmax runs in fp32, fp32 dots are IEEE.
    * ``D`` from 1 to 256 (powers of two are fastest: others are padded with masks).
    * ``causal``: query ``i`` attends keys ``j <= i`` (top-left aligned, like ``is_causal``).
    * ``scale`` defaults to ``1 / sqrt(D)``.
    * Nq = 0 or B = 0 gives an empty result; Nk = 0 gives zeros, as PyTorch does.

    Differentiable in q, k and v. Returns a tensor of q's shape, dtype and (dense) layout.
    """
    _check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    _check_scale(scale, allow_none=True)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if q.dim() == 3:
        out, _ = attention_forward(q[None], k[None], v[None], causal, sm_scale)
        return out[0]
    out, _ = attention_forward(q, k, v, causal, sm_scale)
    return out
