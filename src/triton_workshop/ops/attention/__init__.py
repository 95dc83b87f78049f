"""Fused attention (FlashAttention-2 style): ``softmax(q kᵀ · scale [+ masks]) v`` without the
N x N matrix, forward and backward; :func:`attention` has the semantics of
``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)`` (``enable_gqa=True``
when K/V have fewer heads), plus what today's models add inside the kernel: a key padding mask,
a sliding window, logit soft-capping, attention sinks, dropout and packed variable-length
sequences.

The attention family's host code: input checks, the launches, the registered ops with their
autograd, and the public :func:`attention`. The kernels are in :mod:`.kernels`; the algorithm
(online softmax, exp2, the causal split, the backward, grouped-query attention, the features,
how to swap it into a model) is told in docs/kernels/attention.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import torch
import triton

from ... import runtime
from ...runtime import FLOAT_DTYPES, register_op, wrap_triton
from .._common import SignatureCache, dropout_seed, layout_key
from .kernels import (
    DKDV_CONFIGS,
    DQ_CONFIGS,
    FWD_CONFIGS,
    attn_bwd_dkdv_kernel,
    attn_bwd_dq_kernel,
    attn_bwd_preprocess_kernel,
    attn_dropout_keep_kernel,
    attn_fwd_kernel,
    prune_dkdv_configs,
    prune_dq_configs,
    prune_fwd_configs,
)

__all__ = [
    "AttentionTuning", "DKDV_CONFIGS", "DQ_CONFIGS", "FWD_CONFIGS", "MAX_HEAD_DIM",
    "MIN_HEAD_DIM_PAD", "TUNING", "attention", "attention_backward", "attention_forward",
    "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel", "attn_bwd_preprocess_kernel",
    "attn_dropout_keep_kernel", "attn_fwd_kernel",
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


@dataclasses.dataclass(frozen=True)
class _Features:
    """The optional features of one call, as the registered ops receive them (checked), and what
    each kernel launch takes from them. Absent tensors are passed as None: the kernels then
    compile without them (``KEY_MASK`` etc. are compile-time switches)."""

    key_padding_mask: torch.Tensor | None
    window: int | None
    softcap: float | None
    sinks: torch.Tensor | None
    dropout_p: float
    dropout_seed: torch.Tensor | None
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def may_be_empty(self) -> bool:
        """Whether a query row may see no key at all (its output is then 0)."""
        return self.key_padding_mask is not None or self.window is not None or self.varlen

    def sequences(self, q: torch.Tensor) -> int:
        """Batch entries of the grid: packed sequences, or q's batch."""
        return self.cu_seqlens_q.shape[0] - 1 if self.varlen else q.shape[0]

    def rows(self, q: torch.Tensor, k: torch.Tensor) -> tuple[int, int]:
        """(query, key) rows one batch entry's grid covers: the longest packed sequence, or all."""
        if self.varlen:
            return self.max_seqlen_q, self.max_seqlen_k
        return q.shape[2], k.shape[2]

    def pointers(self, *, sinks: bool) -> tuple:
        mask = self.key_padding_mask
        # Bool tensors are read as bytes (the same storage): one load path on every Triton. In a
        # traced graph (fake tensors) Inductor cannot lower a bool -> uint8 view; a conversion
        # of the (batch, keys) mask there costs one small fused kernel.
        if mask is not None:
            mask = mask.view(torch.uint8) if type(mask) is torch.Tensor else mask.to(torch.uint8)
        tensors = (mask, self.sinks) if sinks else (mask,)
        return (*tensors, self.dropout_seed, self.cu_seqlens_q, self.cu_seqlens_k)

    def strides(self, t: torch.Tensor) -> tuple[int, ...]:
        """A (B, H, N, D) tensor's strides for the kernels: packed sequences index their one
        batch entry by sequence, and their rows by ``cu_seqlens`` alone (batch stride 0)."""
        return (0, *t.stride()[1:]) if self.varlen else t.stride()

    def mask_strides(self) -> tuple[int, int]:
        mask = self.key_padding_mask
        return (0, 0) if mask is None else (mask.stride(0), mask.stride(1))

    def scalars(self) -> tuple:
        """window, softcap, dropout_p: placeholders where a feature is off (never read)."""
        return (self.window or 0, 1.0 if self.softcap is None else self.softcap, self.dropout_p)

    def consts(self) -> dict:
        return dict(
            KEY_MASK=self.key_padding_mask is not None,
            WINDOW=self.window is not None,
            SOFTCAP=self.softcap is not None,
            SINKS=self.sinks is not None,
            DROPOUT=self.dropout_p > 0,
            VARLEN=self.varlen,
        )


def _common_args(q: torch.Tensor, k: torch.Tensor, causal: bool, features: _Features) -> dict:
    """The compile-time arguments every attention kernel takes (one shared dict per signature:
    callers unpack it, never change it)."""
    n_q, n_k = features.rows(q, k)
    return _common_args_for(n_q, n_k, q.shape[3], bool(causal), q.dtype,
                            tuple(features.consts().items()))


@functools.lru_cache(maxsize=1024)
def _common_args_for(n_q: int, n_k: int, head_dim: int, causal: bool, dtype: torch.dtype,
                     feature_consts: tuple) -> dict:
    return dict(
        N_Q_BUCKET=runtime.bucket(n_q),
        N_K_BUCKET=runtime.bucket(n_k),
        HEAD_DIM=int(head_dim),
        HEAD_DIM_PAD=_head_dim_pad(head_dim),
        CAUSAL=causal,
        **_dot_args(dtype),
        **dict(feature_consts),
    )


def _tile_grid(n_rows: int, n_programs_per_tile: int, block_key: str):
    """1-D grid: every (tile, head, batch); see the kernels' ``_program_tile``."""
    return lambda meta: (triton.cdiv(n_rows, meta[block_key]) * n_programs_per_tile,)


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[1], q.shape[2])


def _forward_fake(q, k, v, causal, scale, key_padding_mask=None, window=None, softcap=None,
                  sinks=None, dropout_p=0.0, dropout_seed=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):  # fmt: skip
    return torch.empty_like(q), q.new_empty(_lse_shape(q), dtype=torch.float32)


def _dsinks_like(q: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """The sinks' gradient's tensor: like ``sinks``, or an empty one (no sinks)."""
    return q.new_empty((0,), dtype=torch.float32) if sinks is None else torch.empty_like(sinks)


def _backward_fake(grad_out, q, k, v, out, lse, causal, scale, key_padding_mask=None,
                   window=None, softcap=None, sinks=None, dropout_p=0.0, dropout_seed=None,
                   cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):  # fmt: skip
    dsinks = _dsinks_like(q, sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


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


def _check_op_inputs(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                     dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k) -> _Features:  # fmt: skip
    """The public checks again, on (B, H, N, D) only (packed sequences: (1, H, total, D)): the
    registered ops can also be called directly (``torch.ops.triton_workshop.attention_forward``),
    and must not launch on bad input. The values inside ``cu_seqlens_*`` are the public
    function's to check (reading them waits for the device). Checked once per call signature
    (:data:`_OP_CALLS`); the features are the call's own."""
    _OP_CALLS.checked(_op_key, _check_op_args, q, k, v, causal, scale, key_padding_mask, window,
                      softcap, sinks, dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k,
                      max_seqlen_q, max_seqlen_k)  # fmt: skip
    return _Features(key_padding_mask, window, softcap, sinks, float(dropout_p), dropout_seed,
                     cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))


def _op_key(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks, dropout_p,
            dropout_seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> tuple:
    """Everything :func:`_check_op_args` reads (values where it checks a range, types where it
    checks a type)."""
    return (*_public_key(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                         dropout_p),
            layout_key(dropout_seed), layout_key(cu_seqlens_q), layout_key(cu_seqlens_k),
            max_seqlen_q, type(max_seqlen_q), max_seqlen_k, type(max_seqlen_k))  # fmt: skip


#: The registered ops' checked call signatures (the value is only a mark: the checks passed).
_OP_CALLS = SignatureCache()


def _check_op_args(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks, dropout_p,
                   dropout_seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k) -> bool:  # fmt: skip
    _check_qkv(q, k, v, ndims=(4,))
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    _check_scale(scale, allow_none=False)
    _check_features(q, k, key_padding_mask, window, softcap, sinks, dropout_p)
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    if cu_seqlens_q is not None:
        if q.shape[0] != 1:
            raise ValueError(f"with cu_seqlens, q must be (1, H, total, D), got {tuple(q.shape)}")
        _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q)
        _check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q, like=cu_seqlens_q)
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            _check_int(value, name, minimum=0)
    if dropout_p > 0:
        if not isinstance(dropout_seed, torch.Tensor):
            raise TypeError("dropout_seed must be a tensor when dropout_p > 0")
        if dropout_seed.dtype != torch.int64 or dropout_seed.numel() != 1:
            raise ValueError("dropout_seed must hold one int64")
        runtime.check_same_device(q=q, dropout_seed=dropout_seed)
    return True


# --------------------------------------------------------------------------------------------
# The registered ops: (B, H, N, D) inputs, validated; any strides.
# --------------------------------------------------------------------------------------------
@register_op("attention_forward", fake=_forward_fake,
             autocast="lower_precision_fp")  # as F.scaled_dot_product_attention
def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    key_padding_mask: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(out, lse)``: out like q, lse (B, H, Nq) fp32, the natural-log LSE of each row
    of ``scale · q kᵀ`` (soft-capped, masked, with the sink); -inf for rows that see no key and
    no sink. Packed sequences: q, k, v are (1, H, total, D) and lse (1, H, total_q)."""
    features = _check_op_inputs(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                                dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k)  # fmt: skip
    batch, n_heads, n_q, _ = q.shape
    n_kv_heads, n_k = k.shape[1], k.shape[2]

    out = torch.empty_like(q)
    lse = q.new_empty(_lse_shape(q), dtype=torch.float32)
    if out.numel() == 0:
        return out, lse
    if n_k == 0:
        # No keys: PyTorch returns 0 (an empty weighted sum), and the log of an empty sum is -inf
        # (with sinks, each row's softmax holds its sink alone).
        out.zero_()
        if sinks is None:
            lse.fill_(float("-inf"))
        else:
            lse.copy_(sinks.float()[None, :, None].expand_as(lse))
        return out, lse

    rows_q, _ = features.rows(q, k)
    grid = _tile_grid(rows_q, n_heads * features.sequences(q), "BLOCK_M")
    # A plain launch, not a LaunchPlan: attn_fwd_kernel is autotuned, so its tile, and with it
    # the grid, is only known at launch.
    with runtime.device_guard(q):
        wrap_triton(attn_fwd_kernel)[grid](
            q, k, v, out, lse, *features.pointers(sinks=True),
            *features.strides(q), *features.strides(k), *features.strides(v),
            *features.strides(out), *features.mask_strides(),
            n_heads, n_q, n_k, rows_q, n_heads // n_kv_heads, scale, *features.scalars(),
            POSITIVE_SCALE=scale > 0, **_common_args(q, k, causal, features),
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
    key_padding_mask: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, dsinks)`` from the incoming gradient ``grad_out`` and the forward's ``out``
    and ``lse`` (the same features as the forward: dropout regenerates its mask from
    ``dropout_seed``). ``dsinks`` is like ``sinks``, or empty without sinks."""
    features = _check_op_inputs(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                                dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k)  # fmt: skip
    _OP_CALLS.checked(_saved_key, _check_saved, q, grad_out, out, lse)
    batch, n_heads, n_q, head_dim = q.shape
    n_kv_heads, n_k = k.shape[1], k.shape[2]

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = _dsinks_like(q, sinks)
    if dq.numel() == 0 or dk.numel() == 0:
        # No queries: nothing depends on k and v; no keys: out is 0 whatever q is (and whatever
        # the sinks are).
        return dq.zero_(), dk.zero_(), dv.zero_(), dsinks.zero_()

    delta = torch.empty_like(lse)
    common = _common_args(q, k, causal, features)
    group_size = n_heads // n_kv_heads
    rows_q, rows_k = features.rows(q, k)
    sequences = features.sequences(q)
    scalars = (scale, *features.scalars())
    strides = features.strides
    preprocess = _preprocess_plan(tuple(q.shape), out.stride(), grad_out.stride(), q.dtype, TUNING)
    with runtime.device_guard(q):
        preprocess.launch(out, grad_out, delta)
        # Plain launches, not LaunchPlans: both kernels are autotuned, so their tiles, and with
        # them the grids, are only known at launch.
        wrap_triton(attn_bwd_dkdv_kernel)[_tile_grid(rows_k, n_kv_heads * sequences, "BLOCK_N")](
            q, k, v, grad_out, lse, delta, dk, dv, *features.pointers(sinks=False),
            *strides(q), *strides(k), *strides(v), *strides(grad_out), *strides(dk), *strides(dv),
            *features.mask_strides(),
            n_heads, n_kv_heads, n_q, n_k, rows_k, group_size, *scalars,
            **common,
        )  # fmt: skip
        wrap_triton(attn_bwd_dq_kernel)[_tile_grid(rows_q, n_heads * sequences, "BLOCK_M")](
            q, k, v, grad_out, lse, delta, dq, *features.pointers(sinks=False),
            *strides(q), *strides(k), *strides(v), *strides(grad_out), *strides(dq),
            *features.mask_strides(),
            n_heads, n_q, n_k, rows_q, group_size, *scalars,
            **common,
        )  # fmt: skip
    if sinks is not None:
        # The sink is a logit with no value: dL/dsink = Σ_rows P_sink · (0 - Δ), with
        # P_sink = exp(sink - lse) (rows are never empty with a sink: lse >= sink).
        p_sink = torch.exp(sinks.float()[None, :, None] - lse)
        dsinks.copy_(-(p_sink * delta).sum(dim=(0, 2)))
    return dq, dk, dv, dsinks


def _saved_key(q, grad_out, out, lse) -> tuple:
    return ("backward", layout_key(q), layout_key(grad_out), layout_key(out), layout_key(lse),
            lse.is_contiguous())


def _check_saved(q, grad_out, out, lse) -> bool:
    """The backward's own tensors: the incoming gradient and the forward's out and lse."""
    for name, t in (("grad_out", grad_out), ("out", out)):
        runtime.check_tensor(t, name, dtypes=(q.dtype,), ndim=4)
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
    runtime.check_tensor(lse, "lse", dtypes=(torch.float32,), ndim=3)
    if lse.shape != _lse_shape(q) or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous {_lse_shape(q)} tensor, got {tuple(lse.shape)}")
    runtime.check_same_device(q=q, grad_out=grad_out, out=out, lse=lse)
    return True


#: attention_forward's arguments after q, k, v: their names, as ctx keeps them for the backward.
_OPTIONS = ("causal", "scale", "key_padding_mask", "window", "softcap", "sinks", "dropout_p",
            "dropout_seed", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
_SINKS_INDEX = 3 + _OPTIONS.index("sinks")


def _attention_setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    out, lse = output
    # Tensors go through save_for_backward (None where a feature is off), the rest on ctx.
    tensors = [o if isinstance(o, torch.Tensor) else None for o in options]
    ctx.save_for_backward(q, k, v, out, lse, *tensors)
    ctx.options = [None if isinstance(o, torch.Tensor) else o for o in options]
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zero-filled gradient for lse, which is never used


def _attention_backward(ctx, grad_out, grad_lse):
    n_inputs = 3 + len(_OPTIONS)
    if grad_out is None:  # the output did not reach the loss
        return (None,) * n_inputs
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    options = [t if t is not None else o for t, o in zip(tensors, ctx.options)]
    dq, dk, dv, dsinks = attention_backward(grad_out, q, k, v, out, lse, *options)
    grads = [dq, dk, dv] + [None] * len(_OPTIONS)
    if options[_SINKS_INDEX - 3] is not None:
        grads[_SINKS_INDEX] = dsinks
    return tuple(grads)


attention_forward.register_autograd(_attention_backward, setup_context=_attention_setup_context)


# --------------------------------------------------------------------------------------------
# Dropout's random numbers.
# --------------------------------------------------------------------------------------------
def dropout_keep_mask(seed: torch.Tensor, shape: tuple, dropout_p: float) -> torch.Tensor:
    """The mask (True = kept) that the kernels draw for ``seed``: ``shape`` is (B, H, Nq, Nk),
    or (1, H, total_q, total_k) for packed sequences (of which each sequence uses its block on
    the diagonal). For tests: a reference then applies the very same mask."""
    keep = torch.empty(shape, dtype=torch.int8, device=seed.device)
    block = 1024
    if keep.numel():
        with runtime.device_guard(seed):
            wrap_triton(attn_dropout_keep_kernel)[(triton.cdiv(keep.numel(), block),)](
                seed, keep, keep.numel(), float(dropout_p), BLOCK=block)
    return keep.bool()


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------
def _check_scale(scale, *, allow_none: bool) -> None:
    if scale is None and allow_none:
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")


def _check_int(value, name: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


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


def _check_features(q, k, key_padding_mask, window, softcap, sinks, dropout_p) -> None:
    """The optional features' types, shapes and ranges, on (B, H, N, D) q and k."""
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor):
            raise TypeError(f"key_padding_mask must be a tensor or None, "
                            f"got {type(key_padding_mask).__name__}")
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be a bool tensor (True = attend), "
                            f"got {key_padding_mask.dtype}")
        want = (q.shape[0], k.shape[2])
        if tuple(key_padding_mask.shape) != want:
            raise ValueError(f"key_padding_mask must have shape (B, Nk) = {want}, "
                             f"got {tuple(key_padding_mask.shape)}")
        runtime.check_same_device(q=q, key_padding_mask=key_padding_mask)
    if window is not None:
        _check_int(window, "window", minimum=1)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap must be a float or None, got {type(softcap).__name__}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be a finite number > 0, got {softcap}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"sinks must be a tensor or None, got {type(sinks).__name__}")
        runtime.check_tensor(sinks, "sinks", dtypes=FLOAT_DTYPES, ndim=1)
        if sinks.shape[0] != q.shape[1]:
            raise ValueError(f"sinks must have shape (H,) = ({q.shape[1]},), one logit per query "
                             f"head, got {tuple(sinks.shape)}")
        runtime.check_same_device(q=q, sinks=sinks)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")


def _check_cu_seqlens(cu, name: str, q, *, like=None) -> None:
    """Type, dtype, shape and device of cumulative sequence offsets (not their values)."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with n_seqs + 1 >= 1 entries, "
                         f"got shape {tuple(cu.shape)}")
    if like is not None and cu.shape != like.shape:
        raise ValueError(f"{name} must have one entry per sequence as cu_seqlens does: "
                         f"{tuple(like.shape)}, got {tuple(cu.shape)}")
    runtime.check_same_device(**{"q": q, name: cu})


def _longest_sequence(cu: torch.Tensor, name: str, total: int, max_seqlen, max_name: str) -> int:
    """Check the offsets' values (0 first, non-decreasing, ``total`` last) and ``max_seqlen``
    against them; return the longest sequence (``max_seqlen`` when given). Reads the offsets
    (one wait for the device) unless being traced by torch.compile, where ``max_seqlen`` must
    be given."""
    if max_seqlen is not None:
        _check_int(max_seqlen, max_name, minimum=0)
    if torch.compiler.is_compiling():
        if max_seqlen is None:
            raise ValueError(f"{max_name} must be given under torch.compile")
        return int(max_seqlen)
    lengths = cu[1:] - cu[:-1]
    first, last = cu[0], cu[-1]
    summary = torch.stack([first, last, lengths.min(), lengths.max()]) if lengths.numel() else (
        torch.stack([first, last, first * 0, first * 0]))
    first, last, shortest, longest = summary.tolist()
    if first != 0 or shortest < 0 or last != total:
        raise ValueError(f"{name} must start at 0, never decrease, and end at the number of "
                         f"rows ({total}); got first {first}, last {last}, "
                         f"{'a decrease' if shortest < 0 else 'no decrease'}")
    if max_seqlen is not None and max_seqlen < longest:
        raise ValueError(f"{max_name} is {max_seqlen} but {name} holds a sequence of {longest}")
    return int(longest if max_seqlen is None else max_seqlen)


@runtime.follows_autocast(attention_forward)
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    key_padding_mask: torch.Tensor | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_k: int | None = None,
) -> torch.Tensor:
    """``softmax(q kᵀ · scale [+ masks]) v`` in fused Triton kernels, forward and backward.

    Same semantics as ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``:

    * ``q`` is (B, H, Nq, D) or (H, Nq, D); ``k`` and ``v`` are (B, H_kv, Nk, D) or (H_kv, Nk, D),
      with ``H_kv`` dividing ``H`` (grouped-query / multi-query attention: query head ``h`` reads
      K/V head ``h // (H // H_kv)``, as SDPA with ``enable_gqa=True``). Any strides.
    * fp16, bf16 or fp32 (all three the same); the softmax runs in fp32, fp32 dots are IEEE.
    * ``D`` from 1 to 256 (powers of two are fastest: others are padded with masks).
    * ``causal``: query ``i`` attends keys ``j <= i`` (top-left aligned, like ``is_causal``).
    * ``scale`` defaults to ``1 / sqrt(D)``.
    * Nq = 0 or B = 0 gives an empty result; Nk = 0 gives zeros, as PyTorch does.

    Features, all computed inside the kernels and freely combined (masks are ANDed):

    * ``key_padding_mask``: bool (B, Nk) ((Nk,) for 3-D inputs), True where a key may be
      attended (Hugging Face's ``attention_mask == 1``).
    * ``window``: int >= 1, a sliding window: query ``i`` sees key ``j`` only if
      ``i - j < window`` (transformers' ``sliding_window``); with ``causal`` also ``j <= i``.
      Key tiles outside every row's window are skipped.
    * ``softcap``: float > 0, logit soft-capping (Gemma 2): ``s = softcap · tanh(s / softcap)``
      on the scaled scores, before any mask.
    * ``sinks``: (H,) float tensor, one logit per query head (GPT-OSS): each row's softmax runs
      over its scores and the sink, and the sink's column is then dropped (its value is 0). Used
      as given (neither scaled nor capped). Differentiable.
    * ``dropout_p``: dropout on the attention probabilities, the kept ones scaled by
      ``1 / (1 - dropout_p)`` (as ``F.dropout``); the mask comes from Philox with a seed drawn
      from torch's default generator of q's device, so ``torch.manual_seed`` repeats a run, and
      the backward regenerates the same mask. Applied whenever ``dropout_p > 0`` (pass 0.0 in
      evaluation, as with SDPA).
    * ``cu_seqlens`` (int32 (n_seqs + 1,), cumulative offsets starting at 0) with
      ``max_seqlen``: packed variable-length sequences (flash-attn's varlen convention):
      q is (total_q, H, D), k and v (total_k, H_kv, D), and each sequence attends only within
      itself (``causal`` and ``window`` within it, top-left aligned). ``cu_seqlens_k`` /
      ``max_seqlen_k`` give the keys' offsets when they differ from the queries' (default: the
      same). ``max_seqlen`` defaults to the longest sequence, read from ``cu_seqlens`` (a wait
      for the device; it must be given under torch.compile). Not with ``key_padding_mask``.

    A query row that sees no key at all (every key masked, outside its window, or a sequence
    without keys) outputs 0, and its gradients are 0 (SDPA would give NaN). With sinks such a
    row's softmax holds its sink alone, and its output is 0 as well.

    Differentiable in q, k, v and sinks. Returns a tensor of q's shape, dtype and (dense) layout.
    """
    if cu_seqlens is not None:
        return _varlen_attention(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                                 dropout_p, cu_seqlens, max_seqlen, cu_seqlens_k, max_seqlen_k)
    for name, value in (("max_seqlen", max_seqlen), ("cu_seqlens_k", cu_seqlens_k),
                        ("max_seqlen_k", max_seqlen_k)):
        if value is not None:
            raise ValueError(f"{name} is for packed sequences: it needs cu_seqlens")
    _PUBLIC_CALLS.checked(_public_key, _check_public, q, k, v, causal, scale, key_padding_mask,
                          window, softcap, sinks, dropout_p)  # fmt: skip
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    three_d = q.dim() == 3
    if three_d:
        q, k, v = q[None], k[None], v[None]
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask[None]
    seed = dropout_seed(q.device) if dropout_p > 0 else None
    out, _ = attention_forward(q, k, v, causal, sm_scale, key_padding_mask, window,
                               _float_or_none(softcap), sinks, float(dropout_p), seed)
    return out[0] if three_d else out


def _public_key(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                dropout_p) -> tuple:
    """Everything :func:`_check_public` reads."""
    return (layout_key(q), layout_key(k), layout_key(v), causal, type(causal), type(scale),
            layout_key(key_padding_mask), window, type(window), softcap, type(softcap),
            layout_key(sinks), dropout_p, type(dropout_p))


#: attention's checked call signatures (the value is only a mark: the checks passed).
_PUBLIC_CALLS = SignatureCache()


def _check_public(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                  dropout_p) -> bool:
    """attention's checks on its (B, H, N, D) or (H, N, D) arguments."""
    _check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    _check_scale(scale, allow_none=True)
    if q.dim() == 3:
        q, k = q[None], k[None]
        if isinstance(key_padding_mask, torch.Tensor):
            if key_padding_mask.dim() != 1:
                raise ValueError(f"key_padding_mask must have shape (Nk,) = ({k.shape[2]},) for "
                                 f"3-D inputs, got {tuple(key_padding_mask.shape)}")
            key_padding_mask = key_padding_mask[None]
    _check_features(q, k, key_padding_mask, window, softcap, sinks, dropout_p)
    return True


def _float_or_none(x):
    return None if x is None else float(x)


def _varlen_attention(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                      dropout_p, cu_seqlens, max_seqlen, cu_seqlens_k, max_seqlen_k):  # fmt: skip
    """:func:`attention` on packed sequences: (total, H, D) tensors viewed as (1, H, total, D),
    which the kernels read in place."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES, ndim=3)
    if key_padding_mask is not None:
        raise ValueError("key_padding_mask cannot be combined with cu_seqlens: the offsets "
                         "already say which keys each sequence has")
    if cu_seqlens_k is None and max_seqlen_k is not None:
        raise ValueError("max_seqlen_k needs cu_seqlens_k")
    q4, k4, v4 = (t.transpose(0, 1)[None] for t in (q, k, v))
    _check_qkv(q4, k4, v4, ndims=(4,))
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    _check_scale(scale, allow_none=True)
    _check_features(q4, k4, None, window, softcap, sinks, dropout_p)
    _check_cu_seqlens(cu_seqlens, "cu_seqlens", q)
    if cu_seqlens_k is None:
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"k has {k.shape[0]} rows but q has {q.shape[0]}: give cu_seqlens_k "
                             "when the keys are packed differently")
        cu_seqlens_k = cu_seqlens
        max_seqlen_q = _longest_sequence(cu_seqlens, "cu_seqlens", q.shape[0], max_seqlen,
                                         "max_seqlen")  # fmt: skip
        max_seqlen_k = max_seqlen_q
    else:
        _check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q, like=cu_seqlens)
        max_seqlen_q = _longest_sequence(cu_seqlens, "cu_seqlens", q.shape[0], max_seqlen,
                                         "max_seqlen")  # fmt: skip
        max_seqlen_k = _longest_sequence(cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k,
                                         "max_seqlen_k")  # fmt: skip
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    seed = dropout_seed(q.device) if dropout_p > 0 else None
    out, _ = attention_forward(q4, k4, v4, causal, sm_scale, None, window, _float_or_none(softcap),
                               sinks, float(dropout_p), seed, cu_seqlens, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k)  # fmt: skip
    return out[0].transpose(0, 1)
