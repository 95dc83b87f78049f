"""Rotary position embedding kernels: q and k rotated together, one program per token.

For each lane ``d`` of a head below the rotated width ``R`` (the rest passes through):

    out[d] = x[d] * cos[c(d)] + sign(d) * x[partner(d)] * sin[c(d)]

which is Hugging Face's ``x * cos + rotate_half(x) * sin``. The conventions differ in which lanes
pair up and which column of ``cos``/``sin`` a lane reads:

* halves (``INTERLEAVED`` off; Llama, GPT-NeoX, Phi-3, gpt-oss, ...): ``rotate_half`` pairs lane
  ``d`` with ``d + R//2``; for an odd ``R`` the map is a cyclic shift by ``R//2``, as torch's
  ``cat((-x2, x1))`` makes it;
* interleaved (GLM, Cohere): lanes ``2i`` and ``2i + 1`` pair up;
* ``COS_PER_PAIR``: ``cos``/``sin`` hold one value per pair, read at the pair's index (gpt-oss,
  and GLM, which uses the first half of a Llama-layout ``cos``), else one per lane.

The backward is the transposed rotation (``x`` is the output's gradient): lane ``d`` reads the
lane whose forward partner it is, with that lane's ``sin`` and sign.

One program handles one token: it reads the token's ``cos``/``sin`` once, then rotates every
head of q and every head of k (grouped query attention: their head counts differ), a tile of
heads at a time. The partner lanes are a second load of the same cache lines (from L1), not a
second trip to memory. Every operand has its own strides (the transposed views Hugging Face
models pass, slices of a fused qkv projection). The host code is in ``__init__.py``; why it is
built this way is in docs/kernels/rope.md.
"""

import triton
import triton.language as tl


@triton.jit
def _is_first(lane, rot_dim, INTERLEAVED: tl.constexpr):
    """Whether ``lane`` takes ``-x[partner] * sin`` (the first lane of its pair) rather than
    ``+x[partner] * sin`` in the forward."""
    if INTERLEAVED:
        first = (lane % 2) == 0
    else:
        first = lane < rot_dim - rot_dim // 2
    return first


@triton.jit
def _cos_column(lane, rot_dim, INTERLEAVED: tl.constexpr, COS_PER_PAIR: tl.constexpr):
    """The column of ``cos``/``sin`` that ``lane`` reads."""
    if COS_PER_PAIR:
        if INTERLEAVED:
            column = lane // 2
        else:
            column = tl.where(lane < rot_dim - rot_dim // 2, lane, lane - (rot_dim - rot_dim // 2))
    else:
        column = lane
    return column


@triton.jit
def _source_lane(lane, rot_dim, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr):
    """The lane whose value ``lane`` combines with its own: its partner in the forward, the
    lane it is the partner of in the backward (the inverse map)."""
    half = rot_dim // 2
    if INTERLEAVED:
        source = lane ^ 1
    elif BACKWARD:
        source = tl.where(lane >= half, lane - half, lane + (rot_dim - half))
    else:
        source = tl.where(lane < rot_dim - half, lane + half, lane - (rot_dim - half))
    return source


@triton.jit
def _rotate_heads(
    x_ptr, out_ptr, x_head_stride, x_lane_stride, out_head_stride, out_lane_stride,
    n_heads, head_dim, lanes, source, rotated, cos, signed_sin, BLOCK_H: tl.constexpr,
):
    """Rotate the ``n_heads`` heads of one token (``x_ptr``, ``out_ptr`` at the token), a tile of
    ``BLOCK_H`` heads at a time, with this token's ``cos`` and ``signed_sin`` per lane."""
    lane_mask = (lanes < head_dim)[None, :]
    for first_head in range(0, n_heads, BLOCK_H):
        heads = (first_head + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
        head_mask = heads < n_heads
        x_row = x_ptr + heads * x_head_stride
        x = tl.load(x_row + lanes[None, :] * x_lane_stride, mask=head_mask & lane_mask)
        partner = tl.load(x_row + source[None, :] * x_lane_stride,
                          mask=head_mask & rotated[None, :], other=0.0)
        x = x.to(tl.float32)
        # Lanes past the rotated width pass through exactly (where, not x * 1 + p * 0: an inf
        # partner would make that NaN).
        out = tl.where(rotated[None, :],
                       x * cos[None, :] + partner.to(tl.float32) * signed_sin[None, :], x)
        tl.store(out_ptr + heads * out_head_stride + lanes[None, :] * out_lane_stride,
                 out.to(out_ptr.dtype.element_ty), mask=head_mask & lane_mask)


@triton.jit
def _rotate_heads_halves(
    x_ptr, out_ptr, x_head_stride, x_lane_stride, out_head_stride, out_lane_stride,
    n_heads, half, rot_dim, head_dim, cos1, cos2, sin1, sin2,
    BACKWARD: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
):
    """:func:`_rotate_heads` for ``rotate_half`` with an even rotated width: each head read as its
    two halves ``x1 = x[:R/2]``, ``x2 = x[R/2:R]`` (two contiguous loads that vectorise, where a
    partner gathered through a computed lane index is read one element at a time), then

        forward:   (x1 cos1 - x2 sin1,  x2 cos2 + x1 sin2)
        backward:  (x1 cos1 + x2 sin2,  x2 cos2 - x1 sin1)

    with ``cos1``/``sin1`` the first half's columns and ``cos2``/``sin2`` the second's; the lanes
    past ``R`` are copied."""
    j = tl.arange(0, BLOCK_HALF)[None, :]
    for first_head in range(0, n_heads, BLOCK_H):
        heads = (first_head + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
        head_mask = heads < n_heads
        mask = head_mask & (j < half)
        x_row = x_ptr + heads * x_head_stride
        out_row = out_ptr + heads * out_head_stride
        x1, x2 = _load_halves(x_row, x_lane_stride, half, j, mask)
        _store_rotated_halves(out_row, out_lane_stride, half, j, x1, x2, mask, cos1, cos2, sin1,
                              sin2, BACKWARD)
        if BLOCK_TAIL > 0:  # partial rotary: the lanes past R pass through
            t = rot_dim + tl.arange(0, BLOCK_TAIL)[None, :]
            tail_mask = head_mask & (t < head_dim)
            tail = tl.load(x_row + t * x_lane_stride, mask=tail_mask)
            tl.store(out_row + t * out_lane_stride, tail.to(out_ptr.dtype.element_ty),
                     mask=tail_mask)


@triton.jit
def _load_halves(x_row, lane_stride, half, j, mask):
    """The two halves ``x[:R/2]``, ``x[R/2:R]`` of the heads at ``x_row``, in fp32."""
    x1 = tl.load(x_row + j * lane_stride, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (j + half) * lane_stride, mask=mask, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_rotated_halves(out_row, lane_stride, half, j, x1, x2, mask, cos1, cos2, sin1, sin2,
                          BACKWARD: tl.constexpr):
    """The heads at ``out_row`` = the halves ``x1``, ``x2`` rotated (see
    :func:`_rotate_heads_halves`), stored by halves in ``out_row``'s dtype."""
    if BACKWARD:
        out1 = x1 * cos1 + x2 * sin2
        out2 = x2 * cos2 - x1 * sin1
    else:
        out1 = x1 * cos1 - x2 * sin1
        out2 = x2 * cos2 + x1 * sin2
    out_ty = out_row.dtype.element_ty
    tl.store(out_row + j * lane_stride, out1.to(out_ty), mask=mask)
    tl.store(out_row + (j + half) * lane_stride, out2.to(out_ty), mask=mask)


@triton.jit
def rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    seq_len, n_q_heads, n_k_heads, head_dim, rot_dim, half,
    q_stride_b, q_stride_s, q_stride_h, q_stride_d,
    k_stride_b, k_stride_s, k_stride_h, k_stride_d,
    q_out_stride_b, q_out_stride_s, q_out_stride_h, q_out_stride_d,
    k_out_stride_b, k_out_stride_s, k_out_stride_h, k_out_stride_d,
    cos_stride_b, cos_stride_s, cos_stride_d,
    sin_stride_b, sin_stride_s, sin_stride_d,
    INTERLEAVED: tl.constexpr, COS_PER_PAIR: tl.constexpr, BACKWARD: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    HALVES: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_TAIL: tl.constexpr,
    ONE_STEP: tl.constexpr, EXACT_HALF: tl.constexpr,
):
    """Rotate (``BACKWARD``: rotate back) every q and k head of token ``program_id`` of a
    ``(batch, seq_len)`` grid of tokens. Operands are indexed ``(batch, token, head, lane)``;
    ``cos``/``sin`` ``(batch, token, column)``, broadcast dims with stride 0. ``HALVES``:
    ``rotate_half`` with an even ``rot_dim`` (``half`` = ``rot_dim // 2``), read by halves.
    ``ONE_STEP`` (with ``HALVES``, every lane rotated): all of the token's q and k heads in one
    tile each (``BLOCK_HQ``, ``BLOCK_HK`` hold them), every load issued before any store;
    ``EXACT_HALF``: ``half == BLOCK_HALF``, no lane to mask."""
    token = tl.program_id(0).to(tl.int64)
    b = token // seq_len
    s = token - b * seq_len
    if HALVES:
        j = tl.arange(0, BLOCK_HALF)
        cos_row = cos_ptr + b * cos_stride_b + s * cos_stride_s
        sin_row = sin_ptr + b * sin_stride_b + s * sin_stride_s
        cos1 = tl.load(cos_row + j * cos_stride_d, mask=j < half, other=0.0).to(tl.float32)
        sin1 = tl.load(sin_row + j * sin_stride_d, mask=j < half, other=0.0).to(tl.float32)
        if COS_PER_PAIR:  # one column per pair: both halves read column j
            cos2 = cos1
            sin2 = sin1
        else:
            cos2 = tl.load(cos_row + (j + half) * cos_stride_d, mask=j < half,
                           other=0.0).to(tl.float32)
            sin2 = tl.load(sin_row + (j + half) * sin_stride_d, mask=j < half,
                           other=0.0).to(tl.float32)
        if ONE_STEP:
            # Offsets within the token in int32 (the host takes this path only where they fit):
            # q's and k's loads all issued, then the stores.
            hq = tl.arange(0, BLOCK_HQ)[:, None]
            hk = tl.arange(0, BLOCK_HK)[:, None]
            if EXACT_HALF:  # every lane of a half is real: heads alone are masked
                q_mask = tl.broadcast_to(hq < n_q_heads, (BLOCK_HQ, BLOCK_HALF))
                k_mask = tl.broadcast_to(hk < n_k_heads, (BLOCK_HK, BLOCK_HALF))
            else:
                q_mask = (hq < n_q_heads) & (j[None, :] < half)
                k_mask = (hk < n_k_heads) & (j[None, :] < half)
            q1, q2 = _load_halves(q_ptr + b * q_stride_b + s * q_stride_s + hq * q_stride_h,
                                  q_stride_d, half, j[None, :], q_mask)
            k1, k2 = _load_halves(k_ptr + b * k_stride_b + s * k_stride_s + hk * k_stride_h,
                                  k_stride_d, half, j[None, :], k_mask)
            _store_rotated_halves(
                q_out_ptr + b * q_out_stride_b + s * q_out_stride_s + hq * q_out_stride_h,
                q_out_stride_d, half, j[None, :], q1, q2, q_mask, cos1[None, :], cos2[None, :],
                sin1[None, :], sin2[None, :], BACKWARD)
            _store_rotated_halves(
                k_out_ptr + b * k_out_stride_b + s * k_out_stride_s + hk * k_out_stride_h,
                k_out_stride_d, half, j[None, :], k1, k2, k_mask, cos1[None, :], cos2[None, :],
                sin1[None, :], sin2[None, :], BACKWARD)
            return
        _rotate_heads_halves(q_ptr + b * q_stride_b + s * q_stride_s,
                             q_out_ptr + b * q_out_stride_b + s * q_out_stride_s,
                             q_stride_h, q_stride_d, q_out_stride_h, q_out_stride_d,
                             n_q_heads, half, rot_dim, head_dim, cos1[None, :], cos2[None, :],
                             sin1[None, :], sin2[None, :], BACKWARD, BLOCK_HQ, BLOCK_HALF,
                             BLOCK_TAIL)
        _rotate_heads_halves(k_ptr + b * k_stride_b + s * k_stride_s,
                             k_out_ptr + b * k_out_stride_b + s * k_out_stride_s,
                             k_stride_h, k_stride_d, k_out_stride_h, k_out_stride_d,
                             n_k_heads, half, rot_dim, head_dim, cos1[None, :], cos2[None, :],
                             sin1[None, :], sin2[None, :], BACKWARD, BLOCK_HK, BLOCK_HALF,
                             BLOCK_TAIL)
        return
    lanes = tl.arange(0, BLOCK_D)
    rotated = lanes < rot_dim
    source = _source_lane(lanes, rot_dim, INTERLEAVED, BACKWARD)
    # The lane whose sin (and sign) this lane's partner term carries: its own in the forward,
    # its source's in the backward (the transpose).
    if BACKWARD:
        sin_lane = source
    else:
        sin_lane = lanes
    cos_col = _cos_column(lanes, rot_dim, INTERLEAVED, COS_PER_PAIR)
    sin_col = _cos_column(sin_lane, rot_dim, INTERLEAVED, COS_PER_PAIR)
    # Read once per token, shared by all heads of q and k (cos/sin do not vary over heads).
    cos = tl.load(cos_ptr + b * cos_stride_b + s * cos_stride_s + cos_col * cos_stride_d,
                  mask=rotated, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + b * sin_stride_b + s * sin_stride_s + sin_col * sin_stride_d,
                  mask=rotated, other=0.0).to(tl.float32)
    signed_sin = tl.where(_is_first(sin_lane, rot_dim, INTERLEAVED), -sin, sin)
    _rotate_heads(q_ptr + b * q_stride_b + s * q_stride_s,
                  q_out_ptr + b * q_out_stride_b + s * q_out_stride_s,
                  q_stride_h, q_stride_d, q_out_stride_h, q_out_stride_d,
                  n_q_heads, head_dim, lanes, source, rotated, cos, signed_sin, BLOCK_HQ)
    _rotate_heads(k_ptr + b * k_stride_b + s * k_stride_s,
                  k_out_ptr + b * k_out_stride_b + s * k_out_stride_s,
                  k_stride_h, k_stride_d, k_out_stride_h, k_out_stride_d,
                  n_k_heads, head_dim, lanes, source, rotated, cos, signed_sin, BLOCK_HK)
