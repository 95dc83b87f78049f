"""Fused attention (FlashAttention-2 style): ``softmax(q kᵀ · scale [+ masks]) v`` without the
N x N matrix, forward and backward; :func:`attention` has the semantics of
``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)`` (``enable_gqa=True``
when K/V have fewer heads), plus what today's models add inside the kernel: a key padding mask,
a sliding window, logit soft-capping, attention sinks, dropout and packed variable-length
sequences.

The attention family's host code: the registered ops (the launches) with their autograd, and the
public :func:`attention`. Argument checks are in :mod:`.checks`, what a launch takes from a call's
features in :mod:`.features`; the kernels are in :mod:`.kernels`. The algorithm (online softmax,
exp2, the causal split, the backward, grouped-query attention, the features, how to swap it into
a model) is told in docs/kernels/attention.md.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton

from ... import runtime
from ...runtime import FLOAT_DTYPES, register_op, wrap_triton
from .._common import UNKEYABLE, SignatureCache, dropout_seed
from .checks import (
    OP_CALLS,
    PUBLIC_CALLS,
    check_cu_seqlens,
    check_features,
    check_op_inputs,
    check_public,
    check_qkv,
    check_saved,
    check_scale,
    longest_sequence,
    public_key,
    saved_key,
)
from .features import (
    MAX_HEAD_DIM,
    MIN_HEAD_DIM_PAD,
    Features,
    common_args,
    head_dim_pad,
    lse_shape,
    tile_grid,
)
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


@dataclasses.dataclass(frozen=True)
class AttentionTuning:
    """The attention family's launch choices that are not the autotuner's (its three main
    kernels are autotuned; see :mod:`.kernels`). Read at each call from :data:`TUNING`; a test
    replaces the whole object (``dataclasses.replace(attention.TUNING, ...)``)."""

    #: Query rows a program of the Δ preprocess kernel handles. A small, memory-bound kernel
    #: (one read of O and dO), so a fixed tile rather than autotuning.
    preprocess_block_m: int = 64


TUNING = AttentionTuning()


def _forward_fake(q, k, v, causal, scale, key_padding_mask=None, window=None, softcap=None,
                  sinks=None, dropout_p=0.0, dropout_seed=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):  # fmt: skip
    return torch.empty_like(q), q.new_empty(lse_shape(q), dtype=torch.float32)


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
    """attn_bwd_preprocess_kernel's launch (Δ and the base-2 LSE per query row) for one shape
    and layout. ``dtype`` is unused here but keys the cache: a plan's prepared launches hold a
    kernel compiled for one dtype."""
    batch, n_heads, n_q, head_dim = shape
    block_m = tuning.preprocess_block_m
    return runtime.LaunchPlan(
        attn_bwd_preprocess_kernel, (triton.cdiv(n_q, block_m) * n_heads * batch,),
        scalars=(*out_strides, *grad_strides, n_heads, n_q),
        consts=dict(HEAD_DIM=int(head_dim), HEAD_DIM_PAD=head_dim_pad(head_dim), BLOCK_M=block_m),
    )


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
    features = check_op_inputs(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                               dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k)  # fmt: skip
    n_k = k.shape[2]

    out = torch.empty_like(q)
    lse = q.new_empty(lse_shape(q), dtype=torch.float32)
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

    grid, scalars, consts = _forward_launch(q, k, v, out, causal, scale, features)
    # A plain launch, not a LaunchPlan: the features' tensors are the call's own (the eager
    # path of a call without them keeps one: _kept_forward).
    with runtime.device_guard(q):
        wrap_triton(attn_fwd_kernel)[grid](
            q, k, v, out, lse, *features.pointers(sinks=True), *scalars, **consts)
    return out, lse


def _forward_launch(q, k, v, out, causal, scale, features):
    """attn_fwd_kernel's ``(grid, the arguments after q, k, v, out, lse and the features'
    pointers, the constexprs)``. The grid is a function of the tile the autotuner chooses."""
    n_heads, n_q = q.shape[1], q.shape[2]
    n_kv_heads, n_k = k.shape[1], k.shape[2]
    rows_q, _ = features.rows(q, k)
    grid = tile_grid(rows_q, n_heads * features.sequences(q), "BLOCK_M")
    scalars = (*features.strides(q), *features.strides(k), *features.strides(v),
               *features.strides(out), *features.mask_strides(),
               n_heads, n_q, n_k, rows_q, n_heads // n_kv_heads, scale, *features.scalars())
    return grid, scalars, dict(POSITIVE_SCALE=scale > 0, **common_args(q, k, causal, features))


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
    features = check_op_inputs(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                               dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k)  # fmt: skip
    OP_CALLS.checked(saved_key, check_saved, q, grad_out, out, lse)

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = _dsinks_like(q, sinks)
    if dq.numel() == 0 or dk.numel() == 0:
        # No queries: nothing depends on k and v; no keys: out is 0 whatever q is (and whatever
        # the sinks are).
        return dq.zero_(), dk.zero_(), dv.zero_(), dsinks.zero_()

    # Δ per query row and the LSE in base-2 units (see attn_bwd_preprocess_kernel).
    delta, lse2 = torch.empty_like(lse), torch.empty_like(lse)
    preprocess = _preprocess_plan(tuple(q.shape), out.stride(), grad_out.stride(), q.dtype, TUNING)
    (dkdv_grid, dkdv_scalars), (dq_grid, dq_scalars), common = _backward_launches(
        q, k, v, grad_out, dq, dk, dv, causal, scale, features)
    pointers = features.pointers(sinks=False)
    with runtime.device_guard(q):
        preprocess.launch(out, grad_out, lse, delta, lse2)
        # Plain launches, not LaunchPlans: the features' tensors are the call's own (the eager
        # path of a call without them keeps them: _kept_backward).
        wrap_triton(attn_bwd_dkdv_kernel)[dkdv_grid](
            q, k, v, grad_out, lse2, delta, dk, dv, *pointers, *dkdv_scalars, **common)
        wrap_triton(attn_bwd_dq_kernel)[dq_grid](
            q, k, v, grad_out, lse2, delta, dq, *pointers, *dq_scalars, **common)
    if sinks is not None:
        # The sink is a logit with no value: dL/dsink = Σ_rows P_sink · (0 - Δ), with
        # P_sink = exp(sink - lse) (rows are never empty with a sink: lse >= sink).
        p_sink = torch.exp(sinks.float()[None, :, None] - lse)
        dsinks.copy_(-(p_sink * delta).sum(dim=(0, 2)))
    return dq, dk, dv, dsinks


def _backward_launches(q, k, v, grad_out, dq, dk, dv, causal, scale, features):
    """attn_bwd_dkdv_kernel's and attn_bwd_dq_kernel's ``(grid, the arguments after their
    tensors and the features' pointers)``, and the constexprs both take. Both kernels are
    autotuned: their grids are functions of the tiles chosen."""
    n_heads, n_q = q.shape[1], q.shape[2]
    n_kv_heads, n_k = k.shape[1], k.shape[2]
    group_size = n_heads // n_kv_heads
    rows_q, rows_k = features.rows(q, k)
    sequences = features.sequences(q)
    scalars = (scale, *features.scalars())
    strides = features.strides
    dkdv = (tile_grid(rows_k, n_kv_heads * sequences, "BLOCK_N"), (
        *strides(q), *strides(k), *strides(v), *strides(grad_out), *strides(dk), *strides(dv),
        *features.mask_strides(), n_heads, n_kv_heads, n_q, n_k, rows_k, group_size, *scalars))
    dq_launch = (tile_grid(rows_q, n_heads * sequences, "BLOCK_M"), (
        *strides(q), *strides(k), *strides(v), *strides(grad_out), *strides(dq),
        *features.mask_strides(), n_heads, n_q, n_k, rows_q, group_size, *scalars))
    return dkdv, dq_launch, common_args(q, k, causal, features)


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
# The eager path of a call without the features' tensors (no key padding mask, sinks or packed
# sequences; dropout's seed, drawn for each call, is launched as one of the call's tensors):
# the launches of its signature kept, forward and backward.
# --------------------------------------------------------------------------------------------
def _kept_pointers(features: Features, *, sinks: bool) -> tuple:
    """The features' pointer arguments of a kept launch (all None), less dropout's seed where
    the launch takes one: it comes right after the kernel's tensors, each call's own."""
    pointers = features.pointers(sinks=sinks)
    return pointers[1:] if features.dropout_p > 0 else pointers


def _kept_forward(q, k, v, out, causal, scale, window, softcap, dropout_p):
    """What :func:`attention` keeps for (B, H, N, D) operands of these layouts, as
    attention_forward launched them into ``out``: ``(the forward's plan, lse's shape, the
    backward's recipe (:class:`_KeptBackward`))``; False where attention_forward launches
    nothing (an empty q or k)."""
    if out.numel() == 0 or k.shape[2] == 0:
        return False
    features = Features(None, window, softcap, None, dropout_p, None, None, None, 0, 0)
    grid, scalars, consts = _forward_launch(q, k, v, out, causal, scale, features)
    plan = runtime.LaunchPlan(attn_fwd_kernel, grid,
                              (*_kept_pointers(features, sinks=True), *scalars), consts)
    kept = _KeptBackward(causal, scale, features)
    kept.add(q, k, v, out, out)  # the usual incoming gradient: laid out like out
    return plan, lse_shape(q), kept


class _KeptBackward(dict):
    """The backward of one kept signature, worked out on the calling thread: the launches
    ``(preprocess, dkdv, dq)`` by the incoming gradient's strides (its dtype is out's: autograd
    casts it), so that the backward on autograd's device thread only allocates and launches;
    and the registered op's options, for any other backward (a double backward, a watched one)."""

    __slots__ = ("causal", "scale", "features", "options")

    #: Gradient layouts kept per signature (a model sees one or two).
    MAX_LAYOUTS = 8

    def __init__(self, causal: bool, scale: float, features: Features):
        super().__init__()
        self.causal, self.scale, self.features = causal, scale, features
        self.options = (causal, scale, None, features.window, features.softcap, None,
                        features.dropout_p)

    def add(self, q, k, v, out, grad_out) -> tuple:
        """The launches for an incoming gradient laid out as ``grad_out``, kept."""
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)  # layouts
        (dkdv_grid, dkdv_scalars), (dq_grid, dq_scalars), common = _backward_launches(
            q, k, v, grad_out, dq, dk, dv, self.causal, self.scale, self.features)
        pointers = _kept_pointers(self.features, sinks=False)
        launches = (
            _preprocess_plan(tuple(q.shape), out.stride(), grad_out.stride(), q.dtype, TUNING),
            runtime.LaunchPlan(attn_bwd_dkdv_kernel, dkdv_grid, (*pointers, *dkdv_scalars),
                               common),
            runtime.LaunchPlan(attn_bwd_dq_kernel, dq_grid, (*pointers, *dq_scalars), common))
        self[grad_out.stride()] = launches
        return launches


def _attention_forward_planned(ctx, q, k, v, ready, seed=None):
    """The eager autograd forward of a kept signature (:func:`attention`'s ``RECORD`` path):
    attention_forward with the launch kept, ``out`` alone as the Function's output (lse is
    saved, never returned: nothing to mark non-differentiable), and on ``ctx`` only what
    :func:`_attention_backward_kept` reads. ``seed``: this call's, with dropout."""
    out, lse = _launch_kept_forward(ready, q, k, v, seed)
    ctx.save_for_backward(q, k, v, out, lse, seed)
    ctx.kept = ready[2]
    return out


def _attention_backward_kept(ctx, grad_out):
    """The backward of :func:`_attention_forward_planned`'s Function (inputs q, k, v, the kept
    recipe, the seed): ``(dq, dk, dv, None, None)`` from the kept launches in an eager backward,
    else from the op; dropout's mask drawn again from the forward's seed. Autograd runs a CUDA
    backward on its device thread, already on q's device."""
    q, k, v, out, lse, seed = ctx.saved_tensors
    kept = ctx.kept
    launches = kept.get(grad_out.stride())
    if grad_out.dtype is not q.dtype or not runtime.eager_backward():
        launches = None
    elif launches is None and len(kept) < kept.MAX_LAYOUTS:  # a gradient of another layout
        launches = kept.add(q, k, v, out, grad_out)
    if launches is None:
        dq, dk, dv, _ = attention_backward(grad_out, q, k, v, out, lse, *kept.options, seed)
        return dq, dk, dv, None, None
    preprocess, dkdv, dq_launch = launches
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta, lse2 = torch.empty_like(lse), torch.empty_like(lse)
    preprocess.launch_eager(out, grad_out, lse, delta, lse2)
    seeds = () if seed is None else (seed,)  # launched after the kernels' own tensors
    dkdv.launch_eager(q, k, v, grad_out, lse2, delta, dk, dv, *seeds)
    dq_launch.launch_eager(q, k, v, grad_out, lse2, delta, dq, *seeds)
    return dq, dk, dv, None, None


# The planned Function has a backward of its own: what it reads was worked out in the forward.
attention_forward.register_planned_forward(_attention_forward_planned, _attention_backward_kept)


def _attention_ready(path, ready, q, k, v, seed) -> torch.Tensor:
    """The attention of checked (B, H, N, D) operands of a kept signature
    (:func:`_kept_forward`), on :meth:`~.RegisteredOp.eager_path`'s ``path``; ``seed``: the
    call's dropout seed, or None."""
    if path == runtime.RECORD:
        return attention_forward.record_planned(q, k, v, ready, seed)
    return _launch_kept_forward(ready, q, k, v, seed)[0]


def _launch_kept_forward(ready, q, k, v, seed):
    """``(out, lse)`` of a kept signature's forward plan launched on (B, H, N, D) operands,
    with the call's dropout ``seed`` (or None) after the kernel's own tensors."""
    plan, shape, _ = ready
    out = torch.empty_like(q)
    lse = q.new_empty(shape, dtype=torch.float32)
    seeds = () if seed is None else (seed,)  # launched after the kernel's own tensors
    with runtime.device_guard(q):
        plan.launch_eager(q, k, v, out, lse, *seeds)
    return out, lse


#: Eager calls' layouts and options (no features' tensors) -> :func:`_kept_forward`.
_READY = SignatureCache()


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
      ``1 / (1 - dropout_p)`` (as ``F.dropout``); the mask is a hash of each element's index
      under a seed drawn from torch's default generator of q's device, so
      ``torch.manual_seed`` repeats a run, and the backward regenerates the same mask. Applied
      whenever ``dropout_p > 0`` (pass 0.0 in evaluation, as with SDPA).
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
    if max_seqlen is not None or cu_seqlens_k is not None or max_seqlen_k is not None:
        for name, value in (("max_seqlen", max_seqlen), ("cu_seqlens_k", cu_seqlens_k),
                            ("max_seqlen_k", max_seqlen_k)):
            if value is not None:
                raise ValueError(f"{name} is for packed sequences: it needs cu_seqlens")
    path = key = ready = None
    if key_padding_mask is None and sinks is None:
        path = attention_forward.eager_path(q, k, v)
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            key = (q.shape, q.stride(), q.dtype, q.device, q.layout,
                   k.shape, k.stride(), k.dtype, k.device, k.layout,
                   v.shape, v.stride(), v.dtype, v.device, v.layout,
                   causal, type(causal), scale, type(scale), window, type(window),
                   softcap, type(softcap), dropout_p, type(dropout_p))
            ready = _READY.under(TUNING).get(key)
        except UNKEYABLE:
            key = None
        if ready:
            seed = dropout_seed(q.device) if dropout_p else None
            if q.dim() == 3:  # as one batch entry, as the general path launched it
                return _attention_ready(path, ready, q[None], k[None], v[None], seed)[0]
            return _attention_ready(path, ready, q, k, v, seed)
    PUBLIC_CALLS.checked(public_key, check_public, q, k, v, causal, scale, key_padding_mask,
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
    if key is not None and ready is None:  # not False: a call that launches nothing
        _READY.remember(key, _kept_forward(
            q, k, v, out, causal, sm_scale, window, _float_or_none(softcap), float(dropout_p)))
    return out[0] if three_d else out


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
    check_qkv(q4, k4, v4, ndims=(4,))
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    check_scale(scale, allow_none=True)
    check_features(q4, k4, None, window, softcap, sinks, dropout_p)
    check_cu_seqlens(cu_seqlens, "cu_seqlens", q)
    if cu_seqlens_k is None:
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"k has {k.shape[0]} rows but q has {q.shape[0]}: give cu_seqlens_k "
                             "when the keys are packed differently")
        cu_seqlens_k = cu_seqlens
        max_seqlen_q = longest_sequence(cu_seqlens, "cu_seqlens", q.shape[0], max_seqlen,
                                        "max_seqlen")  # fmt: skip
        max_seqlen_k = max_seqlen_q
    else:
        check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q, like=cu_seqlens)
        max_seqlen_q = longest_sequence(cu_seqlens, "cu_seqlens", q.shape[0], max_seqlen,
                                        "max_seqlen")  # fmt: skip
        max_seqlen_k = longest_sequence(cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k,
                                        "max_seqlen_k")  # fmt: skip
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    seed = dropout_seed(q.device) if dropout_p > 0 else None
    out, _ = attention_forward(q4, k4, v4, causal, sm_scale, None, window, _float_or_none(softcap),
                               sinks, float(dropout_p), seed, cu_seqlens, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k)  # fmt: skip
    return out[0].transpose(0, 1)
