"""The attention family's Triton kernels (FlashAttention-2 style): the forward
(:func:`attn_fwd_kernel`: online softmax over K/V tiles, the N x N scores never written), and the
backward's three (:func:`attn_bwd_preprocess_kernel` for Δ = rowsum(dO ∘ O), then
:func:`attn_bwd_dkdv_kernel` and :func:`attn_bwd_dq_kernel`, each writing only what it owns: no
atomics). Each kernel finds its tile, loads what stays on chip, walks its runs of tiles through
the inner loops of :mod:`.kernel_loops`, and stores; the device helpers they share are in
:mod:`.kernel_helpers`, the autotuning configs and pruning in :mod:`.configs` (re-exported here).

The host code (``ops/attention/__init__.py``, with :mod:`.checks` and :mod:`.features`) checks
inputs and launches them. The algorithm (online softmax, exp2, the causal split, the backward's
formulas, grouped-query attention, the interpreter's bf16 path) is told in
docs/kernels/attention.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import runtime
from .configs import (
    DKDV_CONFIGS,
    DKDV_NOT_SPECIALIZED,
    DQ_CONFIGS,
    FWD_CONFIGS,
    NOT_SPECIALIZED,
    TUNE_KEY,
    prune_dkdv_configs,
    prune_dq_configs,
    prune_fwd_configs,
)
from .kernel_helpers import (
    dropout_keep,
    dropout_rows,
    key_allowed,
    key_ranges,
    load_lse2_delta,
    load_rows,
    program_tile,
    query_ranges,
    score_constants,
    sequence,
)
from .kernel_loops import attn_bwd_dkdv_inner, attn_bwd_dq_inner, attn_fwd_inner

#: The two constants the kernels write out as literals.
LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) = log2(x) * LN2


# --------------------------------------------------------------------------------------------
# Forward.
# --------------------------------------------------------------------------------------------
@runtime.autotune(
    configs=FWD_CONFIGS, key=TUNE_KEY, prune_configs_by={"early_config_prune": prune_fwd_configs}
)
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    seed_ptr, key_mask_ptr, sinks_ptr, cu_q_ptr, cu_k_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_mb, stride_mn,
    n_heads, n_q, n_k, max_seqlen_q, group_size, sm_scale, window, softcap, dropout_p,
    N_Q_BUCKET, N_K_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, POSITIVE_SCALE: tl.constexpr,
    KEY_MASK: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
    DROPOUT: tl.constexpr, VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal split needs BLOCK_M % BLOCK_N == 0")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    # Rows that may see no key at all (all masked, outside the window, an empty sequence).
    MAY_BE_EMPTY: tl.constexpr = KEY_MASK or WINDOW or VARLEN
    start_m, head, batch = program_tile(max_seqlen_q, n_heads, BLOCK_M, CAUSAL)
    kv_head = head // group_size  # grouped-query attention: a group of q heads shares K/V

    # 64-bit offsets: batch * stride_b passes 2**31 elements for large batches of long sequences.
    batch = batch.to(tl.int64)
    q_start, q_len, k_start, k_len, row0 = sequence(
        cu_q_ptr, cu_k_ptr, batch, head, n_heads, n_q, n_k, VARLEN)
    if VARLEN:
        if start_m * BLOCK_M >= q_len:  # the grid covers the longest sequence
            return
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM

    q_ptrs = (q_ptr + batch * stride_qb + head.to(tl.int64) * stride_qh
              + (q_start + offs_m[:, None]) * stride_qn + offs_d[None, :] * stride_qd)  # fmt: skip
    k_ptrs = (k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
              + (k_start + offs_n[:, None]) * stride_kn + offs_d[None, :] * stride_kd)  # fmt: skip
    v_ptrs = (v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
              + (k_start + offs_n[:, None]) * stride_vn + offs_d[None, :] * stride_vd)  # fmt: skip
    key_mask_ptrs = key_mask_ptr
    if KEY_MASK:
        key_mask_ptrs = key_mask_ptr + batch * stride_mb + offs_n * stride_mn

    # The Q tile is loaded once and stays on chip for the whole loop over K/V.
    q = load_rows(q_ptrs, offs_m, q_len, mask_d, True, EVEN_D)
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    if SINKS:
        # The sink is one more logit in every row's softmax, with no value: starting the online
        # softmax from it (max = sink, sum = exp(sink - max) = 1, acc = 0) is all it takes.
        sink2 = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sink2
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    sm_scale, qk_scale, cap_scale, cap_out, dropout_p = score_constants(sm_scale, softcap,
                                                                        dropout_p)  # fmt: skip
    seed, rng_rows = dropout_rows(seed_ptr, row0, offs_m, n_k, k_start, DROPOUT)

    lo, full_lo, full_end, end = key_ranges(start_m, k_len, window, BLOCK_M, BLOCK_N, CAUSAL,
                                            WINDOW)  # fmt: skip
    if WINDOW:
        acc, l_i, m_i = attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
            offs_m, offs_n, mask_d, k_len, lo, full_lo, qk_scale,
            window, cap_scale, cap_out, seed, dropout_p, rng_rows,
            CAUSAL, True, EVEN_D, POSITIVE_SCALE, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
            DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
        )  # fmt: skip
    acc, l_i, m_i = attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
        offs_m, offs_n, mask_d, k_len, full_lo, full_end, qk_scale,
        window, cap_scale, cap_out, seed, dropout_p, rng_rows,
        CAUSAL, False, EVEN_D, POSITIVE_SCALE, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
        DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip
    acc, l_i, m_i = attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
        offs_m, offs_n, mask_d, k_len, full_end, end, qk_scale,
        window, cap_scale, cap_out, seed, dropout_p, rng_rows,
        CAUSAL, True, EVEN_D, POSITIVE_SCALE, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
        DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip

    if MAY_BE_EMPTY:
        # A row that saw no key (and no sink) has l = 0 and acc = 0: its output is 0, not 0 / 0,
        # and its LSE -inf, which the backward reads as "P = 0".
        empty = l_i == 0.0
        l_i = tl.where(empty, 1.0, l_i)
        out = acc / l_i[:, None]
        # Natural-log LSE of the scaled scores: m and log2(l) are in base-2 units.
        lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_i)) * 0.6931471805599453)
    else:
        # Every row sees at least key 0 (n_k > 0 is checked by the launcher), so l_i >= 1.
        out = acc / l_i[:, None]
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    if DROPOUT:
        out = out * (1.0 / (1.0 - dropout_p))

    mask_m = offs_m < q_len
    o_ptrs = (out_ptr + batch * stride_ob + head.to(tl.int64) * stride_oh
              + (q_start + offs_m[:, None]) * stride_on + offs_d[None, :] * stride_od)  # fmt: skip
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])
    tl.store(lse_ptr + row0 + offs_m, lse, mask=mask_m)


@triton.jit
def attn_dropout_keep_kernel(seed_ptr, keep_ptr, n_elements, dropout_p, BLOCK: tl.constexpr):
    """The dropout mask the attention kernels draw for ``seed``, written out (1 = kept) as a
    flat (B, H, Nq, Nk) tensor (packed sequences: (H, total_q, total_k)); for tests."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = dropout_keep(tl.load(seed_ptr), offs, tl.cast(dropout_p, tl.float32))
    tl.store(keep_ptr + offs, keep.to(tl.int8), mask=offs < n_elements)


# --------------------------------------------------------------------------------------------
# Backward.
# --------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n_q"])
def attn_bwd_preprocess_kernel(
    out_ptr, do_ptr, lse_ptr, delta_ptr, lse2_ptr,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    n_heads, n_q,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """delta_i = Σ_d dO_id · O_id, per query row: the rowsum(P ∘ dP) of the softmax backward,
    computed once here instead of inside every program of the dK/dV and dQ kernels. And the LSE
    as those kernels use it, in base-2 units: lse · log2(e), +inf for a row that saw no key
    (LSE -inf, output the constant 0), which makes its P exactly 0. Made once here, it costs the
    dK/dV loop no multiply per step."""
    start_m, head, batch = program_tile(n_q, n_heads, BLOCK_M, False)
    batch = batch.to(tl.int64)
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_m = offs_m < n_q
    mask = mask_m[:, None] & (offs_d < HEAD_DIM)[None, :]
    o_ptrs = (out_ptr + batch * stride_ob + head.to(tl.int64) * stride_oh
              + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)  # fmt: skip
    do_ptrs = (do_ptr + batch * stride_dob + head.to(tl.int64) * stride_doh
               + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod)  # fmt: skip
    o = tl.load(o_ptrs, mask=mask, other=0.0)
    do = tl.load(do_ptrs, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    rows = (batch * n_heads + head) * n_q + offs_m
    tl.store(delta_ptr + rows, delta, mask=mask_m)
    lse = tl.load(lse_ptr + rows, mask=mask_m, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    tl.store(lse2_ptr + rows, lse2, mask=mask_m)


@runtime.autotune(
    configs=DKDV_CONFIGS, key=TUNE_KEY, prune_configs_by={"early_config_prune": prune_dkdv_configs}
)
@triton.jit(do_not_specialize=DKDV_NOT_SPECIALIZED)
def attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr,
    seed_ptr, key_mask_ptr, cu_q_ptr, cu_k_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_mb, stride_mn,
    n_heads, n_kv_heads, n_q, n_k, max_seqlen_k, group_size, sm_scale, window, softcap, dropout_p,
    N_Q_BUCKET, N_K_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    KEY_MASK: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
    DROPOUT: tl.constexpr, VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    tl.static_assert(BLOCK_N % BLOCK_M == 0, "the causal split needs BLOCK_N % BLOCK_M == 0")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    # One program per K/V tile of one *kv* head; causal: the first key tiles are seen by the most
    # queries, and the natural order already launches them first.
    start_n, kv_head, batch = program_tile(max_seqlen_k, n_kv_heads, BLOCK_N, False)
    batch = batch.to(tl.int64)
    q_start, q_len, k_start, k_len, _ = sequence(
        cu_q_ptr, cu_k_ptr, batch, kv_head, n_kv_heads, n_q, n_k, VARLEN)
    if VARLEN:
        if start_n * BLOCK_N >= k_len:  # the grid covers the longest sequence
            return
    offs_n = start_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM

    # K and V stay on chip for the whole loop; key rows past n_k read 0 and are never stored.
    k = load_rows(k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
                  + (k_start + offs_n[:, None]) * stride_kn + offs_d[None, :] * stride_kd,
                  offs_n, k_len, mask_d, True, EVEN_D)  # fmt: skip
    v = load_rows(v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
                  + (k_start + offs_n[:, None]) * stride_vn + offs_d[None, :] * stride_vd,
                  offs_n, k_len, mask_d, True, EVEN_D)  # fmt: skip
    if DOT_IN_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    sm_scale, qk_scale, cap_scale, cap_out, dropout_p = score_constants(sm_scale, softcap,
                                                                        dropout_p)  # fmt: skip
    seed = 0
    if DROPOUT:
        seed = tl.load(seed_ptr)

    lo, full_lo, full_hi, hi = query_ranges(start_n, q_len, window, BLOCK_M, BLOCK_N, CAUSAL,
                                            WINDOW)  # fmt: skip
    whole_hi = tl.maximum(full_lo, tl.minimum(full_hi, q_len // BLOCK_M * BLOCK_M))

    # Grouped-query attention: this kv head's gradient is the sum over the q heads that read it.
    # Looping over them here keeps that sum in the fp32 accumulators: no atomics, no extra copy.
    keys = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # 32-bit, for the masks (see the loop)
    offs_m0 = tl.arange(0, BLOCK_M)
    tile_q = offs_m0[:, None] * stride_qn + offs_d[None, :] * stride_qd
    tile_do = offs_m0[:, None] * stride_don + offs_d[None, :] * stride_dod
    for g in range(0, group_size):
        head = (kv_head * group_size + g).to(tl.int64)
        q_head = q_ptr + batch * stride_qb + head * stride_qh + q_start * stride_qn
        do_head = do_ptr + batch * stride_dob + head * stride_doh + q_start * stride_don
        if VARLEN:
            row0 = head * n_q + q_start
        else:
            row0 = (batch * n_heads + head) * n_q
        rng_base = row0 * n_k + k_start  # flat dropout index of (query 0, key 0)
        if CAUSAL or WINDOW:
            dk, dv = attn_bwd_dkdv_inner(
                dk, dv, k, v, q_head, do_head, tile_q, tile_do, lse2_ptr + row0, delta_ptr + row0,
                stride_qn, stride_don, keys, mask_d, q_len, lo, full_lo, qk_scale,
                window, cap_scale, cap_out, seed, dropout_p, rng_base, n_k,
                True, True, EVEN_D, CAUSAL, WINDOW, SOFTCAP, DROPOUT,
                DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
            )  # fmt: skip
        # The full run in two: whole query tiles load without row masks, then at most one tile
        # that reaches past the last query.
        dk, dv = attn_bwd_dkdv_inner(
            dk, dv, k, v, q_head, do_head, tile_q, tile_do, lse2_ptr + row0, delta_ptr + row0,
            stride_qn, stride_don, keys, mask_d, q_len, full_lo, whole_hi, qk_scale,
            window, cap_scale, cap_out, seed, dropout_p, rng_base, n_k,
            False, False, EVEN_D, CAUSAL, WINDOW, SOFTCAP, DROPOUT,
            DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
        )  # fmt: skip
        dk, dv = attn_bwd_dkdv_inner(
            dk, dv, k, v, q_head, do_head, tile_q, tile_do, lse2_ptr + row0, delta_ptr + row0,
            stride_qn, stride_don, keys, mask_d, q_len, whole_hi, full_hi, qk_scale,
            window, cap_scale, cap_out, seed, dropout_p, rng_base, n_k,
            False, True, EVEN_D, CAUSAL, WINDOW, SOFTCAP, DROPOUT,
            DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
        )  # fmt: skip
        if WINDOW:
            dk, dv = attn_bwd_dkdv_inner(
                dk, dv, k, v, q_head, do_head, tile_q, tile_do, lse2_ptr + row0, delta_ptr + row0,
                stride_qn, stride_don, keys, mask_d, q_len, full_hi, hi, qk_scale,
                window, cap_scale, cap_out, seed, dropout_p, rng_base, n_k,
                True, True, EVEN_D, CAUSAL, WINDOW, SOFTCAP, DROPOUT,
                DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
            )  # fmt: skip

    # S = scale · Q Kᵀ, so dK picks up the scale (dV does not: O = P V has none).
    dk = dk * sm_scale
    mask = (offs_n < k_len)[:, None] & mask_d[None, :]
    if KEY_MASK:
        # A masked key has P = 0 for every query, so its dK and dV are 0: zeroed here once
        # instead of masking every score tile (its scores were computed unmasked, possibly inf).
        allowed = key_allowed(key_mask_ptr + batch * stride_mb + offs_n * stride_mn, offs_n,
                              k_len)  # fmt: skip
        dk = tl.where(allowed[:, None], dk, 0.0)
        dv = tl.where(allowed[:, None], dv, 0.0)
    tl.store(dk_ptr + batch * stride_dkb + kv_head.to(tl.int64) * stride_dkh
             + (k_start + offs_n[:, None]) * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(dk_ptr.dtype.element_ty), mask=mask)  # fmt: skip
    tl.store(dv_ptr + batch * stride_dvb + kv_head.to(tl.int64) * stride_dvh
             + (k_start + offs_n[:, None]) * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(dv_ptr.dtype.element_ty), mask=mask)  # fmt: skip


@runtime.autotune(
    configs=DQ_CONFIGS, key=TUNE_KEY, prune_configs_by={"early_config_prune": prune_dq_configs}
)
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr,
    seed_ptr, key_mask_ptr, cu_q_ptr, cu_k_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    stride_mb, stride_mn,
    n_heads, n_q, n_k, max_seqlen_q, group_size, sm_scale, window, softcap, dropout_p,
    N_Q_BUCKET, N_K_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    KEY_MASK: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
    DROPOUT: tl.constexpr, VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal split needs BLOCK_M % BLOCK_N == 0")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    start_m, head, batch = program_tile(max_seqlen_q, n_heads, BLOCK_M, CAUSAL)
    kv_head = head // group_size
    batch = batch.to(tl.int64)
    q_start, q_len, k_start, k_len, row0 = sequence(
        cu_q_ptr, cu_k_ptr, batch, head, n_heads, n_q, n_k, VARLEN)
    if VARLEN:
        if start_m * BLOCK_M >= q_len:  # the grid covers the longest sequence
            return
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    mask_m = offs_m < q_len

    q = load_rows(q_ptr + batch * stride_qb + head.to(tl.int64) * stride_qh
                  + (q_start + offs_m[:, None]) * stride_qn + offs_d[None, :] * stride_qd,
                  offs_m, q_len, mask_d, True, EVEN_D)  # fmt: skip
    do = load_rows(do_ptr + batch * stride_dob + head.to(tl.int64) * stride_doh
                   + (q_start + offs_m[:, None]) * stride_don + offs_d[None, :] * stride_dod,
                   offs_m, q_len, mask_d, True, EVEN_D)  # fmt: skip
    if DOT_IN_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2, delta = load_lse2_delta(lse2_ptr + row0 + offs_m, delta_ptr + row0 + offs_m, mask_m,
                                  True)  # fmt: skip
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    sm_scale, qk_scale, cap_scale, cap_out, dropout_p = score_constants(sm_scale, softcap,
                                                                        dropout_p)  # fmt: skip
    seed, rng_rows = dropout_rows(seed_ptr, row0, offs_m, n_k, k_start, DROPOUT)

    k_ptrs = (k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
              + (k_start + offs_n[:, None]) * stride_kn + offs_d[None, :] * stride_kd)  # fmt: skip
    v_ptrs = (v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
              + (k_start + offs_n[:, None]) * stride_vn + offs_d[None, :] * stride_vd)  # fmt: skip
    key_mask_ptrs = key_mask_ptr
    if KEY_MASK:
        key_mask_ptrs = key_mask_ptr + batch * stride_mb + offs_n * stride_mn
    lo, full_lo, full_end, end = key_ranges(start_m, k_len, window, BLOCK_M, BLOCK_N, CAUSAL,
                                            WINDOW)  # fmt: skip
    if WINDOW:
        dq = attn_bwd_dq_inner(
            dq, q, do, lse2, delta, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
            offs_m, offs_n, mask_d, k_len, lo, full_lo, qk_scale,
            window, cap_scale, cap_out, seed, dropout_p, rng_rows,
            CAUSAL, True, EVEN_D, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
            DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
        )  # fmt: skip
    dq = attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
        offs_m, offs_n, mask_d, k_len, full_lo, full_end, qk_scale,
        window, cap_scale, cap_out, seed, dropout_p, rng_rows,
        CAUSAL, False, EVEN_D, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
        DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip
    dq = attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
        offs_m, offs_n, mask_d, k_len, full_end, end, qk_scale,
        window, cap_scale, cap_out, seed, dropout_p, rng_rows,
        CAUSAL, True, EVEN_D, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
        DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip

    dq = dq * sm_scale
    tl.store(dq_ptr + batch * stride_dqb + head.to(tl.int64) * stride_dqh
             + (q_start + offs_m[:, None]) * stride_dqn + offs_d[None, :] * stride_dqd,
             dq.to(dq_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])  # fmt: skip
