"""The inner loops of the attention kernels: what one run of tiles accumulates. The forward's
online softmax over a run of key tiles (:func:`attn_fwd_inner`), and the backward's dK/dV over a
run of query tiles (:func:`attn_bwd_dkdv_inner`) and dQ over a run of key tiles
(:func:`attn_bwd_dq_inner`).

Each kernel of :mod:`.kernels` calls its loop up to three times: the masked tiles at either end of
the run (the causal diagonal, the window's edge, the end of the keys) and the full tiles between,
which need no mask. The algorithm is told in docs/kernels/attention.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel_helpers import (
    dot_operand,
    dropout_keep,
    is_visible,
    load_lse2_delta,
    load_rows,
    mask_scores,
    scores2,
)


# --------------------------------------------------------------------------------------------
# Forward: one run of key tiles for a query tile (the online softmax).
# --------------------------------------------------------------------------------------------
@triton.jit
def attn_fwd_inner(
    acc, l_i, m_i, q,
    k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
    offs_m, offs_n, mask_d, k_len, lo, hi, qk_scale,
    window, cap_scale, cap_out, seed, dropout_p, rng_rows,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr, POSITIVE_SCALE: tl.constexpr,
    KEY_MASK: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Full tiles with a positive scale: max(scale * s) = scale * max(s), so the row max is taken
    # on the raw scores and each score then costs one fused multiply-add (s * scale - m) instead
    # of a multiply and a subtract: the softmax's arithmetic, as much as the tensor cores, limits
    # this loop at D <= 128. Not with a key mask or soft-capping, which change the scores first.
    SCALE_AFTER_MAX: tl.constexpr = POSITIVE_SCALE and not (MASKED or KEY_MASK or SOFTCAP)
    # Whether some scores of the tile may be -inf (and a row may have seen no key yet).
    ANY_MASK: tl.constexpr = MASKED or KEY_MASK
    k_ptrs += lo.to(tl.int64) * stride_kn
    v_ptrs += lo.to(tl.int64) * stride_vn
    if KEY_MASK:
        key_mask_ptrs += lo.to(tl.int64) * stride_mn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = load_rows(k_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        # Scores in base-2 units: scale * log2(e) is folded in (docs/kernels/attention.md, exp2).
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if SCALE_AFTER_MAX:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_sub = m_new
            p = tl.exp2(s * qk_scale - m_sub[:, None])
        else:
            # Soft-capping comes after the scale and before any mask (Gemma 2's order).
            s, _ = scores2(s, qk_scale, cap_scale, cap_out, SOFTCAP)
            if ANY_MASK:
                s = mask_scores(s, offs_m, cols, k_len, window, key_mask_ptrs,
                                MASKED, KEY_MASK, CAUSAL, WINDOW)  # fmt: skip
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = m_new
            if ANY_MASK:
                # A row that has seen no key yet has m = -inf, and -inf - (-inf) is NaN;
                # subtracting 0 instead makes its p and alpha exactly 0 (m itself stays -inf
                # until a key comes).
                m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_sub[:, None])
        # Online softmax: what was accumulated against the old max is rescaled to the new one.
        alpha = tl.exp2(m_i - m_sub)
        v = load_rows(v_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
        acc = acc * alpha[:, None]
        if DROPOUT:
            # The softmax's denominator counts every probability; only the sum over V drops some
            # (the 1 / (1 - p) comes once, on the output).
            p_sum = tl.sum(p, 1)
            p = tl.where(dropout_keep(seed, rng_rows[:, None] + cols[None, :], dropout_p), p, 0.0)
        # P is rounded to the inputs' dtype for the tensor-core dot; acc stays fp32.
        acc = tl.dot(
            dot_operand(p, v.dtype, DOT_IN_FP32),
            dot_operand(v, v.dtype, DOT_IN_FP32),
            acc,
            input_precision=INPUT_PRECISION,
        )
        # The row sum after the dot, as FlashAttention does: fewer values live across it.
        if DROPOUT:
            l_i = l_i * alpha + p_sum
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
        if KEY_MASK:
            key_mask_ptrs += BLOCK_N * stride_mn
    return acc, l_i, m_i


# --------------------------------------------------------------------------------------------
# Backward: one run of query tiles for a key tile (dK, dV), of key tiles for a query tile (dQ).
# --------------------------------------------------------------------------------------------
@triton.jit
def attn_bwd_dkdv_inner(
    dk, dv, k, v,
    q_head, do_head, tile_q, tile_do, lse2_ptrs, delta_ptrs, stride_qn, stride_don,
    keys, mask_d, q_len, lo, hi, qk_scale,
    window, cap_scale, cap_out, seed, dropout_p, rng_base, rng_stride,
    MASKED: tl.constexpr, CHECK_ROWS: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Accumulate one K/V tile's dK, dV over query tiles [lo, hi), in the transposed orientation
    (keys on rows), so that Pᵀ and dSᵀ come straight out of the dots. (Masked keys of a key
    padding mask are not masked here: their rows of dK and dV are zeroed once, at the store.)
    ``CHECK_ROWS``: the run may reach past the last query, whose rows then read as absent.

    The loop is bound by its instruction count at D = 64, so it carries as little as it can.
    Addressing is a scalar 64-bit row pointer per tile plus the tile's own 32-bit offsets
    (``tile_q``, ``tile_do``, made once by the kernel), and ``keys`` are 32-bit: with 64-bit
    pointer tiles carried through the loop this kernel needed more than 255 registers a thread
    and spilled. Full runs load without row masks (docs/kernels/attention.md)."""
    offs_m0 = tl.arange(0, BLOCK_M)
    # Scalar row pointers, advanced by a tile each step (not made from the step's index: their
    # 64-bit product made LLVM widen the loop counter to 64 bits).
    q_row = q_head + lo.to(tl.int64) * stride_qn
    do_row = do_head + lo.to(tl.int64) * stride_don
    lse2_row = lse2_ptrs + lo
    delta_row = delta_ptrs + lo
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        q = load_rows(q_row + tile_q, offs_m, q_len, mask_d, CHECK_ROWS, EVEN_D)
        do = load_rows(do_row + tile_do, offs_m, q_len, mask_d, CHECK_ROWS, EVEN_D)
        # The rows' LSE and delta from a scalar pointer and the tile's own offsets, like Q and dO:
        # each thread's loads then share one address and differ by constants.
        lse2, delta = load_lse2_delta(lse2_row + offs_m0, delta_row + offs_m0, offs_m < q_len,
                                      CHECK_ROWS)  # fmt: skip
        if DOT_IN_FP32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        # Recompute Pᵀ from the saved LSE: exp(s - lse) is the normalised softmax, exactly.
        qk_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)
        # dPᵀ does not wait for Pᵀ: issued here, its product runs while the exp below does.
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        s_t, tanh_t = scores2(qk_t, qk_scale, cap_scale, cap_out, SOFTCAP)
        if MASKED:
            # Tiles on the causal diagonal or the window's edge: key j (row here) is seen by
            # query i (column) if j <= i and i - j < window. Masked before the exp, so that a
            # large hidden score cannot overflow.
            visible = is_visible(offs_m[None, :], keys[:, None], 0, window, False, CAUSAL, WINDOW)
            s_t = tl.where(visible, s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse2[None, :])
        if DROPOUT:
            # O = (P ∘ Z) V / (1 - p) with Z the kept mask: dV sees the dropped P, and dP the
            # same mask and scale; Δ = rowsum(dO ∘ O) already is rowsum(P ∘ dP).
            keep_t = dropout_keep(seed, rng_base + offs_m.to(tl.int64)[None, :] * rng_stride
                                  + keys[:, None], dropout_p)  # fmt: skip
            keep_scale = 1.0 / (1.0 - dropout_p)
            pd_t = tl.where(keep_t, p_t * keep_scale, 0.0)
        else:
            pd_t = p_t
        dv = tl.dot(dot_operand(pd_t, q_head.dtype.element_ty, DOT_IN_FP32), do, dv,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        if DROPOUT:
            dp_t = tl.where(keep_t, dp_t * keep_scale, 0.0)
        # dS = P ∘ (dP - delta): the softmax Jacobian applied to dP.
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - tanh_t * tanh_t)  # d tanh
        dk = tl.dot(dot_operand(ds_t, q_head.dtype.element_ty, DOT_IN_FP32), q, dk,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        q_row += BLOCK_M * stride_qn
        do_row += BLOCK_M * stride_don
        lse2_row += BLOCK_M
        delta_row += BLOCK_M
    return dk, dv


@triton.jit
def attn_bwd_dq_inner(
    dq, q, do, lse2, delta,
    k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
    offs_m, offs_n, mask_d, k_len, lo, hi, qk_scale,
    window, cap_scale, cap_out, seed, dropout_p, rng_rows,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
    KEY_MASK: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    k_ptrs += lo.to(tl.int64) * stride_kn
    v_ptrs += lo.to(tl.int64) * stride_vn
    if KEY_MASK:
        key_mask_ptrs += lo.to(tl.int64) * stride_mn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = load_rows(k_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
        v = load_rows(v_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)  # runs while the exp does
        s, tanh = scores2(qk, qk_scale, cap_scale, cap_out, SOFTCAP)
        if MASKED or KEY_MASK:
            # Padded keys read k = 0, so s = 0 and exp(0 - lse) is not 0: masked explicitly.
            s = mask_scores(s, offs_m, cols, k_len, window, key_mask_ptrs,
                            MASKED, KEY_MASK, CAUSAL, WINDOW)  # fmt: skip
        p = tl.exp2(s - lse2[:, None])
        if DROPOUT:
            keep = dropout_keep(seed, rng_rows[:, None] + cols[None, :], dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - tanh * tanh)
        dq = tl.dot(dot_operand(ds, k_ptrs.dtype.element_ty, DOT_IN_FP32), k, dq,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
        if KEY_MASK:
            key_mask_ptrs += BLOCK_N * stride_mn
    return dq
