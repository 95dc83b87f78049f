"""Rotary position embeddings: Hugging Face's ``apply_rotary_pos_emb``, forward and backward in
Triton, q and k in one launch.

    q_out = q * cos + rotate_half(q) * sin      (the same for k)

with ``cos``/``sin`` broadcast after ``unsqueeze(unsqueeze_dim)``, partial rotary (``cos``
narrower than a head: the rest passes through) and grouped-query attention (k with fewer heads).
``convention`` picks the families whose ``apply_rotary_pos_emb`` pairs lanes or reads ``cos``
differently (:data:`CONVENTIONS`).

Host code: the tuning (:class:`RopeTuning`), the cached launch plans, the registered ops, the
autograd and :func:`rope`. The kernel is in :mod:`.kernels`; why it is built as it is is in
docs/kernels/rope.md.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES, LaunchPlan, num_warps_for, plan_cache, register_op
from .._common import SignatureCache, layout_key
from .kernels import rope_kernel


class Convention(NamedTuple):
    """How one family of transformers' ``apply_rotary_pos_emb`` rotates a head."""

    #: Lanes ``2i``, ``2i + 1`` pair up (else lane ``d`` and ``d + R // 2``, ``rotate_half``).
    interleaved: bool
    #: ``cos``/``sin`` hold one value per pair (else one per lane).
    cos_per_pair: bool
    #: The rotated width ``R`` from the width of ``cos``.
    rot_dim: "callable"
    #: Both outputs in q's dtype (else each promoted with cos/sin, as torch's ``*`` does).
    in_q_dtype: bool


#: ``convention=`` -> what it computes, named after the transformers model whose
#: ``apply_rotary_pos_emb`` it reproduces:
#:
#: * ``"llama"`` (the default): ``rotate_half``, ``cos`` as wide as the rotated lanes
#:   (``cat(freqs, freqs)``); partial rotary as Phi-3, GPT-NeoX, StableLM, Qwen3-Next do it.
#:   Llama, Mistral, Qwen2/3, Gemma, Phi-3, GPT-NeoX, OLMo, ... all compute this.
#: * ``"gpt_oss"``: ``rotate_half`` with ``cos`` holding each frequency once (half a head wide;
#:   gpt-oss's ``_apply_rotary_emb``).
#: * ``"glm"``: adjacent lanes ``(2i, 2i + 1)`` rotate together, with frequency ``i`` read from
#:   the first half of a Llama-layout ``cos`` (GLM, GLM-4; partial rotary too).
#: * ``"cohere"``: adjacent lanes, ``cos`` already interleaved (``repeat_interleave(freqs, 2)``),
#:   computed in fp32 and returned in q's dtype (Cohere).
CONVENTIONS = {
    "llama": Convention(False, False, lambda width: width, False),
    "gpt_oss": Convention(False, True, lambda width: 2 * width, False),
    "glm": Convention(True, True, lambda width: 2 * (width // 2), False),
    "cohere": Convention(True, False, lambda width: width, True),
}


@dataclass(frozen=True)
class RopeTuning:
    """The launch decisions of rope: part of every plan's key."""

    #: Elements of one tile of heads (``heads x next_power_of_2(head_dim)``): 8 heads of 128
    #: lanes (Llama's k; its 32 q heads in four tiles), 4 warps. Measured on an H100 at 4 x 4096
    #: tokens, 32/8 heads of 128, bf16 (docs/kernels/rope.md): 97% of copy forward, against 88%
    #: with a whole token's 32 q heads (4096) in one tile of 8 warps.
    tile_elems: int = 1024
    #: rotate_half with an even rotated width read as two halves of each head (contiguous,
    #: vectorised loads), not lane by lane with a gathered partner.
    by_halves: bool = True
    #: Warps a program; 0: :func:`~triton_workshop.runtime.num_warps_for` the tile.
    num_warps: int = 0
    #: rotate_half by halves, every lane rotated: where a token's q and k heads together take
    #: at most this many elements (power-of-two head counts x head_dim), one step rotates them
    #: all, every load issued before a store, on ``token_num_warps`` warps (Llama's 32 + 8 heads
    #: of 128: 5120). Measured on an H200 at 4 x 4096 tokens, 32/8 heads of 128, bf16, in CUDA
    #: graphs (docs/results.md, 2026-11-29): 84.6 us forward, 169.2 forward + backward, against
    #: 87.3 and 174.6 in tiles of ``tile_elems`` in the same run; a standalone kernel of this
    #: structure took 85.1/171.3 on 4 warps and 90.7/182.7 on 16, against 83.9/167.9 on 8.
    token_tile_elems: int = 8192
    token_num_warps: int = 8


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = RopeTuning()


# --------------------------------------------------------------------------------------------
# Layout: every operand as (batch, token, head, lane), cos/sin as (batch, token, column).
# --------------------------------------------------------------------------------------------
def _head_index(q_ndim: int, cos_ndim: int, unsqueeze_dim: int) -> int:
    """The dim of q (and k) that ``cos.unsqueeze(unsqueeze_dim)`` broadcasts over: the heads.
    ``cos`` is aligned with q from the right, as torch broadcasts."""
    return unsqueeze_dim % (cos_ndim + 1) + q_ndim - (cos_ndim + 1)


def _as_tokens_heads(t: torch.Tensor, head: int) -> torch.Tensor:
    """``t`` (3-D or 4-D) as a ``(batch, token, head, lane)`` view."""
    t = t.movedim(head, -2)
    return t.unsqueeze(0) if t.dim() == 3 else t


def _as_tokens(cos: torch.Tensor, shape: torch.Size, head: int, unsqueeze_dim: int):
    """``cos`` broadcast as ``unsqueeze(unsqueeze_dim)`` broadcasts it against ``shape`` (q's),
    as a ``(batch, token, column)`` view: broadcast dims get stride 0, no copy."""
    full = list(shape[:-1]) + [cos.shape[-1]]
    full[head] = 1
    return _as_tokens_heads(cos.unsqueeze(unsqueeze_dim).expand(full), head)[:, :, 0, :]


def _out_dtype(x: torch.Tensor, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               convention: str) -> torch.dtype:
    """``x * cos + rotate_half(x) * sin`` promotes as torch does (bf16 q with fp32 cos: fp32);
    Cohere's casts back to q's dtype."""
    if CONVENTIONS[convention].in_q_dtype:
        return q.dtype
    dtype = x.dtype
    if dtype is cos.dtype and dtype is sin.dtype:  # the usual case, without promote_types
        return dtype
    return torch.promote_types(torch.promote_types(dtype, cos.dtype), sin.dtype)


@plan_cache()
def _plan(n_tokens: int, seq_len: int, n_q_heads: int, n_k_heads: int, head_dim: int,
          rot_dim: int, strides: tuple, convention: str, backward: bool, dtypes: tuple,
          tuning: RopeTuning) -> LaunchPlan:
    """One program per token; each rotates all q heads, then all k heads, a tile of heads at a
    time. ``dtypes`` (of every operand) is in the key: the prepared launches are compiled for
    them."""
    conv = CONVENTIONS[convention]
    block_d = runtime.next_power_of_2(head_dim)
    block_hq, block_hk = (max(1, min(runtime.next_power_of_2(h), tuning.tile_elems // block_d))
                          for h in (n_q_heads, n_k_heads))
    consts = dict(INTERLEAVED=conv.interleaved, COS_PER_PAIR=conv.cos_per_pair,
                  BACKWARD=backward, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_D=block_d,
                  HALVES=False, BLOCK_HALF=1, BLOCK_TAIL=0, ONE_STEP=False,
                  EXACT_HALF=False,
                  num_warps=tuning.num_warps or num_warps_for(max(block_hq, block_hk) * block_d))
    if tuning.by_halves and not conv.interleaved and rot_dim % 2 == 0:
        # rotate_half's pairs are the two halves: two contiguous loads per head (see
        # kernels._rotate_heads_halves), the lanes past rot_dim copied apart.
        tail = head_dim - rot_dim
        consts.update(HALVES=True, BLOCK_HALF=runtime.next_power_of_2(max(rot_dim // 2, 1)),
                      BLOCK_TAIL=runtime.next_power_of_2(tail) if tail else 0)
        all_q, all_k = (runtime.next_power_of_2(max(h, 1)) for h in (n_q_heads, n_k_heads))
        if (not tail and (all_q + all_k) * block_d <= tuning.token_tile_elems
                and _token_offsets_fit(strides, (n_q_heads, n_k_heads) * 2, head_dim)):
            consts.update(ONE_STEP=True, BLOCK_HQ=all_q, BLOCK_HK=all_k,
                          EXACT_HALF=consts["BLOCK_HALF"] == rot_dim // 2,
                          num_warps=tuning.token_num_warps)
    return LaunchPlan(rope_kernel, (n_tokens,),
                      (seq_len, n_q_heads, n_k_heads, head_dim, rot_dim, rot_dim // 2, *strides),
                      consts)


def _token_offsets_fit(strides: tuple, heads: tuple, head_dim: int) -> bool:
    """Whether every element of a token lies within 2**31 - 1 elements of the token's first, in
    each of q, k, q_out, k_out (``strides``: their ``(batch, token, head, lane)`` strides in
    that order, then cos's and sin's): the one-step path's offsets within a token are int32."""
    return all((n - 1) * strides[4 * i + 2] + (head_dim - 1) * strides[4 * i + 3] < 2**31
               for i, n in enumerate(heads))


def _rotate(q, k, cos, sin, q_out, k_out, unsqueeze_dim: int, convention: str,
            backward: bool) -> None:
    """Launch the kernel: ``q_out``, ``k_out`` = q, k rotated (``backward``: rotated back)."""
    try:  # every shape and stride the launch reads, and the dtypes: one lookup per call
        key = (q.shape, q.stride(), k.shape, k.stride(), cos.shape, cos.stride(), sin.stride(),
               q_out.stride(), k_out.stride(), q.dtype, k.dtype, cos.dtype, sin.dtype,
               q_out.dtype, k_out.dtype, unsqueeze_dim, convention, backward, TUNING)
        plan = _LAUNCHES.get(key, _NO_PLAN)
    except TypeError:  # symbolic sizes (torch.compile with dynamic shapes): worked out uncached
        key, plan = None, _NO_PLAN
    if plan is _NO_PLAN:
        plan = _LAUNCHES.remember(key, _layout_plan(q, k, cos, sin, q_out, k_out, unsqueeze_dim,
                                                    convention, backward))
    if plan is None:  # nothing to rotate
        return
    # The (batch, token, head, lane) views of _layout_plan start where the tensors start: the
    # kernel gets the tensors themselves and the views' strides (in the plan).
    with runtime.device_guard(q):
        plan.launch(q, k, cos, sin, q_out, k_out)


#: _rotate's launch plans by every layout they were worked out from (None: nothing to launch).
_LAUNCHES = SignatureCache()
_NO_PLAN = object()


def _layout_plan(q, k, cos, sin, q_out, k_out, unsqueeze_dim: int, convention: str,
                 backward: bool) -> LaunchPlan | None:
    """The launch for these tensors' layouts: the operands viewed as (batch, token, head, lane)
    and cos/sin as (batch, token, column), their strides the kernel's arguments. Every view
    starts at its tensor's first element (moved and unsqueezed dims, a broadcast dim indexed at
    0), so the launch can take the tensors themselves."""
    head = _head_index(q.dim(), cos.dim(), unsqueeze_dim)
    views = [_as_tokens_heads(t, head) for t in (q, k, q_out, k_out)]
    batch, seq_len, n_q_heads, head_dim = views[0].shape
    if batch * seq_len == 0 or head_dim == 0:
        return None
    cos_v, sin_v = (_as_tokens(t, q.shape, head, unsqueeze_dim) for t in (cos, sin))
    strides = tuple(s for v in (*views, cos_v, sin_v) for s in v.stride())
    return _plan(batch * seq_len, seq_len, n_q_heads, views[1].shape[2], head_dim,
                 CONVENTIONS[convention].rot_dim(cos.shape[-1]), strides, convention, backward,
                 tuple(t.dtype for t in (q, k, cos, sin, q_out, k_out)), TUNING)


# --------------------------------------------------------------------------------------------
# Registered ops, autograd.
# --------------------------------------------------------------------------------------------
def _rope_outputs(q, k, cos, sin, convention, dtype=None):
    # empty_like keeps q's strides where q is dense (the transposed views models pass): the
    # kernel then writes in the order it reads.
    return (torch.empty_like(q, dtype=dtype or _out_dtype(q, q, cos, sin, convention)),
            torch.empty_like(k, dtype=dtype or _out_dtype(k, q, cos, sin, convention)))


def _rope_forward_fake(q, k, cos, sin, unsqueeze_dim, convention, dtype=None):
    return _rope_outputs(q, k, cos, sin, convention, dtype)


# Not on torch's autocast lists (the model's rotation is mul/add/cat): dtypes as without.
@register_op("rope_forward", fake=_rope_forward_fake)
def rope_forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 unsqueeze_dim: int, convention: str,
                 dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_out, k_out)`` (arguments already checked by :func:`rope`), in ``dtype`` where
    given."""
    q_out, k_out = _rope_outputs(q, k, cos, sin, convention, dtype)
    _rotate(q, k, cos, sin, q_out, k_out, unsqueeze_dim, convention, backward=False)
    return q_out, k_out


def _rope_grads(dq_out, dk_out, q_dtype, k_dtype):
    return (torch.empty_like(dq_out, dtype=q_dtype), torch.empty_like(dk_out, dtype=k_dtype))


def _rope_backward_fake(dq_out, dk_out, cos, sin, unsqueeze_dim, convention, q_dtype, k_dtype):
    return _rope_grads(dq_out, dk_out, q_dtype, k_dtype)


@register_op("rope_backward", fake=_rope_backward_fake)
def rope_backward(dq_out: torch.Tensor, dk_out: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, unsqueeze_dim: int, convention: str, q_dtype: torch.dtype,
                  k_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dq, dk)``: the outputs' gradients rotated back (by ``-sin``), in q's and k's dtypes."""
    return _rotate_back(dq_out, dk_out, cos, sin, unsqueeze_dim, convention, q_dtype, k_dtype)


def _rotate_back(dq_out, dk_out, cos, sin, unsqueeze_dim, convention, q_dtype, k_dtype):
    dq, dk = _rope_grads(dq_out, dk_out, q_dtype, k_dtype)
    _rotate(dq_out, dk_out, cos, sin, dq, dk, unsqueeze_dim, convention, backward=True)
    return dq, dk


#: The backward's launch for an eager autograd backward: no registered op's dispatch between
#: autograd and the launch (its launch plan is looked up by the gradients' layouts in _rotate).
_rotate_back_directly = runtime.launch_directly(_rotate_back)


def _rope_setup_context(ctx, inputs, output):
    q, k, cos, sin, unsqueeze_dim, convention = inputs[:6]
    ctx.unsqueeze_dim, ctx.convention = unsqueeze_dim, convention
    ctx.q_dtype, ctx.k_dtype = q.dtype, k.dtype
    # q and k only where cos/sin want a gradient (never in transformers' models).
    needs_x = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
    ctx.save_for_backward(cos, sin, q if needs_x else None, k if needs_x else None)


def _rope_backward_autograd(ctx, dq_out, dk_out):
    cos, sin, q, k = ctx.saved_tensors
    need_q, need_k, need_cos, need_sin = ctx.needs_input_grad[:4]
    dq = dk = dcos = dsin = None
    if need_q or need_k:
        backward = _rotate_back_directly if runtime.eager_backward() else rope_backward
        dq, dk = backward(dq_out, dk_out, cos, sin, ctx.unsqueeze_dim, ctx.convention,
                          ctx.q_dtype, ctx.k_dtype)
    if need_cos or need_sin:
        dcos, dsin = _cos_sin_grads((dq_out, dk_out), (q, k), cos, sin, ctx.unsqueeze_dim,
                                    ctx.convention)
    return (dq if need_q else None, dk if need_k else None, dcos if need_cos else None,
            dsin if need_sin else None) + (None,) * (len(ctx.needs_input_grad) - 4)


rope_forward.register_autograd(_rope_backward_autograd, setup_context=_rope_setup_context)


def _cos_sin_grads(grads, inputs, cos, sin, unsqueeze_dim, convention):
    """``(dcos, dsin)`` in torch ops (a path no transformers model takes: its cos/sin never
    require grad): each lane's ``g * x`` (for cos) and ``g * sign * x[partner]`` (for sin),
    summed into the column the lane reads and over every dim cos/sin were broadcast over."""
    conv = CONVENTIONS[convention]
    width = cos.shape[-1]
    rot_dim = conv.rot_dim(width)
    lanes = torch.arange(rot_dim, device=cos.device)
    half = rot_dim // 2
    if conv.interleaved:
        first, partner, pair = lanes % 2 == 0, lanes ^ 1, lanes // 2
    else:
        first = lanes < rot_dim - half
        partner = torch.where(first, lanes + half, lanes - (rot_dim - half))
        pair = torch.where(first, lanes, lanes - (rot_dim - half))
    column = pair if conv.cos_per_pair else lanes
    sign = torch.where(first, -1.0, 1.0)
    cos_u_shape = cos.unsqueeze(unsqueeze_dim).shape
    dcos = dsin = 0
    for g, x in zip(grads, inputs):
        g = g[..., :rot_dim].float()
        x = x[..., :rot_dim].float()
        per_lane = (g * x, g * x.index_select(-1, partner) * sign)
        per_column = [torch.zeros((*t.shape[:-1], width), dtype=t.dtype, device=t.device)
                      .index_add_(-1, column, t).sum_to_size(cos_u_shape) for t in per_lane]
        dcos, dsin = dcos + per_column[0], dsin + per_column[1]
    return dcos.view(cos.shape).to(cos.dtype), dsin.view(sin.shape).to(sin.dtype)


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
def _check_args(q, k, cos, sin, unsqueeze_dim, convention, dtype=None) -> int:
    """Every argument checked before anything launches; ``unsqueeze_dim`` as an int."""
    runtime.check_float_dtype(dtype)
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES)
    runtime.check_same_device(q=q, k=k, cos=cos, sin=sin)
    runtime.check_choice(convention, "convention", CONVENTIONS)
    if q.dim() not in (3, 4):
        raise ValueError(f"q must have 3 or 4 dimensions ((batch,) heads and tokens, head_dim), "
                         f"got shape {tuple(q.shape)}")
    if k.dim() != q.dim():
        raise ValueError(f"k must have as many dimensions as q ({q.dim()}), got shape "
                         f"{tuple(k.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have q's head_dim {q.shape[-1]}, got shape {tuple(k.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got cos {tuple(cos.shape)} "
                         f"and sin {tuple(sin.shape)}")
    if cos.dim() == 0 or cos.dim() + 1 > q.dim():
        raise ValueError(f"cos must have 1 to {q.dim() - 1} dimensions (q has {q.dim()}), got "
                         f"shape {tuple(cos.shape)}")
    if isinstance(unsqueeze_dim, bool):
        raise TypeError("unsqueeze_dim must be an int, got bool")
    try:
        unsqueeze_dim = operator.index(unsqueeze_dim)
    except TypeError:
        raise TypeError(f"unsqueeze_dim must be an int, got {type(unsqueeze_dim).__name__}") \
            from None
    if not -(cos.dim() + 1) <= unsqueeze_dim <= cos.dim():
        raise ValueError(f"unsqueeze_dim must be in [{-(cos.dim() + 1)}, {cos.dim()}] for cos "
                         f"of shape {tuple(cos.shape)}, got {unsqueeze_dim}")
    head = _head_index(q.dim(), cos.dim(), unsqueeze_dim)
    if head == q.dim() - 1:
        raise ValueError(f"unsqueeze_dim {unsqueeze_dim} makes cos broadcast over q's last "
                         f"(head_dim) dimension; it must name q's heads dimension")
    cos_u = list(cos.shape[:-1])
    cos_u.insert(unsqueeze_dim % (cos.dim() + 1), 1)
    for name, x in (("q", q), ("k", k)):
        try:
            fits = torch.broadcast_shapes(tuple(cos_u), x.shape[:-1]) == x.shape[:-1]
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"cos and sin of shape {tuple(cos.shape)}, unsqueezed at {unsqueeze_dim}, must "
                f"broadcast to {name}'s shape {tuple(x.shape)} (all but the last dimension)")
    q_tokens = [n for i, n in enumerate(q.shape[:-1]) if i != head]
    k_tokens = [n for i, n in enumerate(k.shape[:-1]) if i != head]
    if q_tokens != k_tokens:
        raise ValueError(f"q and k must have the same batch and token dimensions (they may differ "
                         f"in heads only), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    conv = CONVENTIONS[convention]
    rot_dim = conv.rot_dim(cos.shape[-1])
    if rot_dim > q.shape[-1]:
        raise ValueError(f"cos and sin of width {cos.shape[-1]} rotate {rot_dim} lanes with "
                         f"convention {convention!r}, more than q's head_dim {q.shape[-1]}")
    if conv.interleaved and rot_dim % 2:
        raise ValueError(f"convention {convention!r} rotates lane pairs: cos and sin must have "
                         f"an even width, got {cos.shape[-1]}")
    return unsqueeze_dim


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
         unsqueeze_dim: int = 1, convention: str = "llama",
         dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_rotated, k_rotated)``: what transformers' ``apply_rotary_pos_emb(q, k, cos, sin,
    unsqueeze_dim)`` computes, in one Triton kernel for q and k together.

    * ``q``, ``k``: ``(batch, heads, tokens, head_dim)`` with ``unsqueeze_dim=1`` or ``(batch,
      tokens, heads, head_dim)`` with ``unsqueeze_dim=2`` (or without the batch dim); k may have
      fewer heads (grouped-query attention); any strides.
    * ``cos``, ``sin``: ``(batch, tokens, rot)`` or ``(tokens, rot)`` as transformers' rotary
      modules build them, broadcast after ``unsqueeze(unsqueeze_dim)``. ``rot < head_dim`` is
      partial rotary: the last ``head_dim - rot`` lanes pass through unchanged (Phi-3, GPT-NeoX).
    * ``convention``: ``"llama"`` (rotate_half; most models), ``"gpt_oss"``, ``"glm"`` or
      ``"cohere"`` (see :data:`CONVENTIONS`).

    fp16/bf16/fp32, mixed as torch promotes them (bf16 q with fp32 cos gives fp32, as in
    transformers); fp32 arithmetic rounded once (transformers rounds each product and the sum
    in the output dtype: the results agree to an ulp or two of fp16/bf16). ``dtype`` (a
    floating dtype) writes both outputs in it instead, rounded once: where the rotated q and k
    go straight to an attention that casts them (under autocast, bf16 q and k with transformers'
    fp32 cos/sin), the values that attention reads, with half the bytes written and no cast
    pass between. Differentiable: the gradient of q and k is the rotation by ``-sin``; cos and
    sin get theirs too where they require one. Traceable by ``torch.compile``."""
    unsqueeze_dim = _CALLS.checked(_call_key, _check_args, q, k, cos, sin, unsqueeze_dim,
                                   convention, dtype)
    if dtype is None:  # the call without it: today's op call
        return rope_forward(q, k, cos, sin, unsqueeze_dim, convention)
    return rope_forward(q, k, cos, sin, unsqueeze_dim, convention, dtype)


def _call_key(q, k, cos, sin, unsqueeze_dim, convention, dtype):
    """Everything the checks read."""
    return (layout_key(q), layout_key(k), layout_key(cos), layout_key(sin), unsqueeze_dim,
            type(unsqueeze_dim), convention, dtype)


#: rope's checked call signatures -> ``unsqueeze_dim`` as the op takes it (an int).
_CALLS = SignatureCache()
