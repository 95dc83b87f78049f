"""The attention family's Triton kernels (FlashAttention-2 style): the forward
(:func:`attn_fwd_kernel`: online softmax over K/V tiles, the N x N scores never written), and the
backward's three (:func:`attn_bwd_preprocess_kernel` for Δ = rowsum(dO ∘ O), then
:func:`attn_bwd_dkdv_kernel` and :func:`attn_bwd_dq_kernel`, each writing only what it owns: no
atomics), with their autotuning configs and the pruning that keeps tiles within shared memory and
registers.

Readable alone: the host code (``ops/attention/__init__.py``) checks inputs and launches. The
algorithm (online softmax, exp2, the causal split, the backward's formulas, grouped-query
attention, the interpreter's bf16 path) is told in docs/kernels/attention.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import runtime

#: The two constants the kernels write out as literals.
LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) = log2(x) * LN2


# --------------------------------------------------------------------------------------------
# Configs. One list per kernel, configs[0] first: it is the interpreter's, and the GPU's fallback
# when pruning leaves nothing. Tuned for Hopper (228 KB shared memory, 64K registers per SM).
# --------------------------------------------------------------------------------------------
def _config(block_m, block_n, stages, warps):
    return triton.Config(
        {"BLOCK_M": block_m, "BLOCK_N": block_n}, num_stages=stages, num_warps=warps
    )


#: Forward: BLOCK_M query rows, BLOCK_N keys per step (BLOCK_M a multiple of BLOCK_N, which the
#: causal split needs). 128 x 64 with 4 warps is FlashAttention-2's choice for D <= 128; 8 warps
#: and 128-key tiles pay off for D = 128 and long sequences; 64 x 64 is the fallback for D = 256
#: (a 128 x 256 fp32 accumulator does not fit the registers of 4 warps).
FWD_CONFIGS = [
    _config(128, 64, 3, 4),
    _config(128, 64, 4, 4),
    _config(128, 64, 2, 4),
    _config(128, 64, 3, 8),
    _config(128, 128, 3, 8),
    _config(128, 128, 2, 8),
    _config(64, 64, 3, 4),
    # D = 256: 64 x 256 fp32 accumulators over 8 warps; 32 x 32 is also the only tile whose K/V
    # pipeline fits shared memory in fp32.
    _config(64, 64, 2, 8),
    _config(32, 32, 2, 4),
]

#: dK/dV: BLOCK_N keys stay resident (two fp32 accumulators), BLOCK_M query rows stream by
#: (BLOCK_N a multiple of BLOCK_M). The kernel's first two dots (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ) have
#: BLOCK_N rows, and an sm_90 warpgroup (4 warps) takes 64 of them per wgmma: with fewer than
#: 16 rows a warp (BLOCK_N 64 on 8 warps) both warpgroups compute the *same* Sᵀ and dPᵀ, in
#: n16 instructions, and do every exp twice (``prune_dkdv_configs`` drops those configs where
#: others remain). So 64-key tiles take 4 warps and 128-key tiles 8; at D = 128, 2 x 128 x 128
#: fp32 accumulators over 8 warps is 128 registers a thread, and only BLOCK_M <= 32 leaves room
#: for the score tiles (BLOCK_M 64 spills, and ptxas serialises the wgmmas: warning C7515).
DKDV_CONFIGS = [
    # D <= 64 (64 fp32 accumulators a thread); also the interpreter's.
    _config(32, 64, 3, 4),
    # D = 128 (fits the registers of 8 warps: see docs/kernels/attention.md).
    _config(32, 128, 2, 8),
    _config(32, 128, 3, 8),
    _config(16, 128, 3, 8),
    _config(16, 64, 4, 4),
    # D <= 64: larger query tiles, deeper pipeline (at D = 128 the latter spills).
    _config(64, 64, 2, 4),
    _config(32, 128, 4, 8),
    # D = 256 and fp32 (FMA dots: far more registers a tile): narrow key tiles; the first two are
    # also the only tiles whose pipeline fits shared memory in fp32 at D = 256.
    _config(16, 32, 2, 8),
    _config(32, 32, 2, 8),
    _config(16, 64, 2, 8),
]

#: dQ: BLOCK_M query rows stay resident (one fp32 accumulator), BLOCK_N keys stream by
#: (BLOCK_M a multiple of BLOCK_N).
DQ_CONFIGS = [
    _config(64, 32, 3, 4),
    _config(128, 32, 3, 4),
    _config(128, 32, 4, 8),
    _config(128, 64, 3, 8),
    _config(64, 64, 3, 4),
    _config(64, 16, 4, 4),
    _config(64, 32, 2, 8),
    # fp32 with D = 256.
    _config(32, 16, 2, 4),
]

#: fp32 accumulator elements a thread may hold: past 64, the recomputed score tile and the operands
#: no longer fit beside them in 255 registers and ptxas spills (the sm_90 compiles behind this
#: bound are in docs/kernels/attention.md).
_MAX_ACC_PER_THREAD = 64


def _prune(
    configs, element_size, head_dim_pad, accumulator_rows, shared_rows,
    registers_fit=None, preferred=None,
):  # fmt: skip
    """Keep the configs whose tiles fit shared memory and whose fp32 accumulators fit registers.

    ``accumulator_rows(c)``: rows (of ``head_dim_pad`` fp32) of accumulators a program keeps for
    its whole life; more than ``_MAX_ACC_PER_THREAD`` a thread and registers spill.
    ``shared_rows(c)``:
    rows (of ``head_dim_pad`` elements) of tiles in shared memory, all pipeline stages counted.
    ``registers_fit(c)``, when given, replaces the accumulator rule with a kernel's own.
    ``preferred(c)``, when given, narrows what fits to the configs it accepts, if any.
    """
    # 4 KB spare: the compiler adds a little (reduction scratch, barriers) to what the tiles need.
    limit = runtime.shared_memory_limit() - 4096

    def fits(c):
        if shared_rows(c) * head_dim_pad * element_size > limit:
            return False
        if registers_fit is not None:
            return registers_fit(c)
        return accumulator_rows(c) * head_dim_pad <= _MAX_ACC_PER_THREAD * 32 * c.num_warps

    kept = [c for c in configs if fits(c)]
    if preferred is not None:
        best = [c for c in kept if preferred(c)]
        if best:
            return best
    if kept:
        return kept
    # Nothing fits comfortably (D = 256 in fp32): the smallest tiles spill least.
    return [min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], -c.num_warps))]


def prune_fwd_configs(configs, named_args, **kwargs):
    """attn_fwd_kernel's configs that fit: one fp32 accumulator row per query row."""
    args = {**named_args, **kwargs}
    return _prune(
        configs,
        args["q_ptr"].element_size(),
        args["HEAD_DIM_PAD"],
        accumulator_rows=lambda c: c.kwargs["BLOCK_M"],  # acc
        # The Q tile once; one K and one V tile per pipeline stage.
        shared_rows=lambda c: c.kwargs["BLOCK_M"] + 2 * c.num_stages * c.kwargs["BLOCK_N"],
    )


#: dK/dV on the tensor cores (fp16/bf16): fp32 values a thread may hold, counting the dK and dV
#: accumulators plus two BLOCK_M x BLOCK_N score tiles (Sᵀ/Pᵀ and dPᵀ/dSᵀ are live together),
#: before ptxas spills on sm_90. 8 warps: BLOCK_N 128, BLOCK_M 32, D 128 is 128 + 32 and fits;
#: BLOCK_M 64 (128 + 64) spills. 4 warps: BLOCK_N 64, D 128 with BLOCK_M 16 is 128 + 16 and
#: fits; BLOCK_M 32 (128 + 32) spills (docs/kernels/attention.md).
_DKDV_MAX_LIVE_PER_THREAD = {4: 144, 8: 160}
#: The same for fp32 inputs (IEEE FMA dots, no tensor cores): see ``prune_dkdv_configs``.
_DKDV_MAX_FMA_PER_THREAD = 80


def prune_dkdv_configs(configs, named_args, **kwargs):
    """attn_bwd_dkdv_kernel's configs that fit, by its own register count (two accumulators and
    two live score tiles), preferring those whose every warp owns distinct key rows."""
    args = {**named_args, **kwargs}
    head_dim_pad = args["HEAD_DIM_PAD"]
    tensor_cores = args["q_ptr"].element_size() < 4  # fp32 dots are IEEE FMAs (the host's)

    def registers_fit(c):
        threads = 32 * c.num_warps
        block_m, block_n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        if not tensor_cores:
            # FMA dots keep their operands in registers too: K and V beside dK and dV, and the
            # Q and dO tiles (fp32, D = 128: BLOCK 16 x 32 on 8 warps is 80 and fits; 32 x 32,
            # 96, spills; D = 64: 16 x 64 on 4 warps, 144, spills).
            return (4 * block_n + 2 * block_m) * head_dim_pad / threads <= _DKDV_MAX_FMA_PER_THREAD
        live = (2 * block_n * head_dim_pad + 2 * block_m * block_n) / threads
        return live <= _DKDV_MAX_LIVE_PER_THREAD.get(c.num_warps, 128)

    return _prune(
        configs,
        args["q_ptr"].element_size(),
        head_dim_pad,
        accumulator_rows=lambda c: 2 * c.kwargs["BLOCK_N"],  # dk and dv
        # K and V once; one Q and one dO tile per stage.
        shared_rows=lambda c: 2 * c.kwargs["BLOCK_N"] + 2 * c.num_stages * c.kwargs["BLOCK_M"],
        registers_fit=registers_fit,
        # Every warp owns 16 distinct key rows of the Sᵀ and dPᵀ wgmmas (see DKDV_CONFIGS).
        preferred=(lambda c: c.kwargs["BLOCK_N"] >= 16 * c.num_warps) if tensor_cores else None,
    )


def prune_dq_configs(configs, named_args, **kwargs):
    """attn_bwd_dq_kernel's configs that fit: one fp32 accumulator row per query row."""
    args = {**named_args, **kwargs}
    return _prune(
        configs,
        args["q_ptr"].element_size(),
        args["HEAD_DIM_PAD"],
        accumulator_rows=lambda c: c.kwargs["BLOCK_M"],  # dq
        # Q and dO once; one K and one V tile per stage.
        shared_rows=lambda c: 2 * c.kwargs["BLOCK_M"] + 2 * c.num_stages * c.kwargs["BLOCK_N"],
    )


# Buckets, not lengths: every length in one power-of-two bucket reuses the tuned config. The dtype
# is in the key implicitly (Triton's autotuner adds the dtypes of tensor arguments). Each feature
# is a compile-time switch and part of the key: a feature's extra registers may favour another
# tile, and the plain kernel keeps its own tuning.
_TUNE_KEY = [
    "N_Q_BUCKET", "N_K_BUCKET", "HEAD_DIM", "CAUSAL",
    "KEY_MASK", "WINDOW", "SOFTCAP", "SINKS", "DROPOUT", "VARLEN",
]
# Integer arguments equal to 1 would otherwise become compile-time constants: one more compile per
# length of 1, and loop bounds that are Python ints where the kernels expect tensors.
_NOT_SPECIALIZED = ["n_q", "n_k", "max_seqlen_q", "max_seqlen_k", "window", "N_Q_BUCKET",
                    "N_K_BUCKET"]


# --------------------------------------------------------------------------------------------
# Kernel helpers.
# --------------------------------------------------------------------------------------------
@triton.jit
def _load_rows(ptrs, rows, n_rows, mask_d, CHECK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """Load a (rows, HEAD_DIM_PAD) tile. Rows past ``n_rows`` and padded head-dim columns read 0:
    a zero column adds nothing to a dot product, and a zero row of K/V/Q/dO is either never
    stored or masked out of the softmax, so the padding needs no other code path. The masks are
    compile-time optional: full tiles of a power-of-two head dim load without any."""
    if CHECK_ROWS:
        if EVEN_D:
            tile = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
        else:
            tile = tl.load(ptrs, mask=(rows < n_rows)[:, None] & mask_d[None, :], other=0.0)
    else:
        if EVEN_D:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=mask_d[None, :], other=0.0)
    return tile


@triton.jit
def _dot_operand(x, dtype, DOT_IN_FP32: tl.constexpr):
    """``x`` rounded to the inputs' dtype, as the tensor cores take it. In the interpreter with
    bf16 inputs the rounded values are widened back to fp32 (exactly), because the interpreter's
    bf16 ``tl.dot`` is wrong; the GPU keeps the native dtype."""
    x = x.to(dtype)
    if DOT_IN_FP32:
        x = x.to(tl.float32)
    return x


@triton.jit
def _program_tile(n_rows, n_heads, BLOCK: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """(tile, head, batch) of this program in a 1-D grid of ``tiles x heads x batch`` programs.

    One axis, not three: grid axes 1 and 2 stop at 65535, and batch x heads passes that in
    windowed attention. Tiles vary fastest, so programs running together share one head's K/V in
    L2. ``HEAVY_LAST`` (causal forward and dQ, where the last query tiles see the most keys)
    launches the tiles in reverse, heaviest first, so no long tile is left alone at the end.
    """
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(n_rows, BLOCK)
    tile = pid % n_tiles
    if HEAVY_LAST:
        tile = n_tiles - 1 - tile
    head_batch = pid // n_tiles
    return tile, head_batch % n_heads, head_batch // n_heads


@triton.jit
def _sequence(cu_q_ptr, cu_k_ptr, batch, head, n_heads, n_q, n_k, VARLEN: tl.constexpr):
    """(first query row, query count, first key row, key count, LSE index of the first query)
    of this program's sequence. Packed sequences (``VARLEN``): ``batch`` is the sequence, its
    rows are ``cu_q[batch]:cu_q[batch + 1]`` of one (total, ...) tensor (the launcher passes
    batch strides of 0), and the LSE is (1, H, total); otherwise every batch entry has all
    ``n_q`` queries and ``n_k`` keys, and the LSE is (B, H, n_q)."""
    if VARLEN:
        q_start = tl.load(cu_q_ptr + batch).to(tl.int64)
        q_len = (tl.load(cu_q_ptr + batch + 1) - q_start).to(tl.int32)
        k_start = tl.load(cu_k_ptr + batch).to(tl.int64)
        k_len = (tl.load(cu_k_ptr + batch + 1) - k_start).to(tl.int32)
        row0 = head * n_q + q_start
    else:
        q_start = 0
        q_len = n_q
        k_start = 0
        k_len = n_k
        row0 = (batch * n_heads + head) * n_q
    return q_start, q_len, k_start, k_len, row0


@triton.jit
def _visible(q_idx, k_idx, k_len, window, CHECK_KEYS: tl.constexpr, CAUSAL: tl.constexpr,
             WINDOW: tl.constexpr):  # fmt: skip
    """Which (query, key) pairs the geometry lets through, for broadcastable index tiles: keys
    that exist (``CHECK_KEYS``), at or before the query (causal), less than ``window`` behind
    it (the sliding window: i - j < window)."""
    if CHECK_KEYS:
        valid = k_idx < k_len
        if CAUSAL:
            valid = valid & (k_idx <= q_idx)
        if WINDOW:
            valid = valid & (q_idx - k_idx < window)
    elif CAUSAL:
        valid = k_idx <= q_idx
        if WINDOW:
            valid = valid & (q_idx - k_idx < window)
    else:
        valid = q_idx - k_idx < window
    return valid


@triton.jit
def _key_allowed(key_mask_ptrs, cols, k_len):
    """The key-padding mask of key tile ``cols``: True where the key may be attended. Keys past
    the end read False (they are masked by the geometry as well)."""
    return tl.load(key_mask_ptrs, mask=cols < k_len, other=0) != 0


@triton.jit
def _mask_scores(s, rows, cols, k_len, window, key_mask_ptrs, MASKED: tl.constexpr,
                 KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):  # fmt: skip
    """Scores ``s`` (query ``rows`` x key ``cols``) with -inf where the query may not see the
    key: the geometry on MASKED tiles (the end of the keys: padded keys read k = 0, so s = 0, not
    -inf; causal; window), and the key padding mask on every tile. -inf, not a large negative
    number: exp2(-inf) is exactly 0, whatever the scale; and before the exp, so that a large
    hidden score cannot overflow."""
    if MASKED:
        valid = _visible(rows[:, None], cols[None, :], k_len, window, True, CAUSAL, WINDOW)
        if KEY_MASK:
            valid = valid & _key_allowed(key_mask_ptrs, cols, k_len)[None, :]
    else:
        valid = _key_allowed(key_mask_ptrs, cols, k_len)[None, :]
    return tl.where(valid, s, float("-inf"))


@triton.jit
def _tanh(x):
    """tanh from one exp2 (``triton.language`` has no tanh on every supported release):
    1 - 2 / (e^2x + 1), which saturates to ±1 without NaN (e^2x = inf gives 1, 0 gives -1). Near 0
    that is 1 minus a number near 1 and loses its relative precision (a cap far above the
    scores would then bend them), so there the odd Taylor series takes over: four terms, below
    1e-10 relative error for |x| < 0.1."""
    x2 = x * x
    series = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333
                                                           - x2 * 0.05396825396825397)))
    formula = 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)  # 2 * log2(e)
    return tl.where(tl.abs(x) < 0.1, series, formula)


@triton.jit
def _scores2(s, qk_scale, cap_scale, cap_out, SOFTCAP: tl.constexpr):
    """Raw dot products to scores in base-2 units: ``scale · s · log2(e)``, or soft-capped,
    ``softcap · tanh(scale · s / softcap) · log2(e)`` (cap_scale = scale / softcap, cap_out =
    softcap · log2(e)). Also returns tanh (the capped scores' derivative is 1 - tanh²), or 0."""
    if SOFTCAP:
        th = _tanh(s * cap_scale)
        return th * cap_out, th
    else:
        return s * qk_scale, 0.0


@triton.jit
def _dropout_keep(seed, offsets, dropout_p):
    """Which elements dropout keeps: Philox uniform numbers, one per element of the (B, H, Nq,
    Nk) probabilities (``offsets`` its flat index), so the forward, the backward and the test
    helper draw the same mask whatever their tiles."""
    return tl.rand(seed, offsets) >= dropout_p


@triton.jit
def _score_constants(sm_scale, softcap, dropout_p):
    """The kernels' fp32 scalars: scale, scale · log2(e), soft-capping's scale / softcap and
    softcap · log2(e), and dropout's p. Cast first: under torch.compile Inductor passes Python
    floats as fp64."""
    sm_scale = tl.cast(sm_scale, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    return (sm_scale, sm_scale * 1.4426950408889634, sm_scale / softcap,
            softcap * 1.4426950408889634, tl.cast(dropout_p, tl.float32))


@triton.jit
def _dropout_rows(seed_ptr, row0, offs_m, n_k, k_start, DROPOUT: tl.constexpr):
    """(seed, flat dropout index of each query row's first key), where ``row0`` is the LSE
    index of the tile's first row: the index of element (b, h, i, j) of the (B, H, Nq, Nk)
    probabilities ((H, total_q, total_k) packed)."""
    if DROPOUT:
        return tl.load(seed_ptr), (row0 + offs_m) * n_k + k_start
    else:
        return 0, offs_m


@triton.jit
def _key_ranges(start_m, k_len, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr):  # fmt: skip
    """The keys a query tile sees, in three runs: [lo, full_lo) and [full_end, end) are tiles
    that cross the causal diagonal, the window's far edge or the end of the keys, and get a mask;
    [full_lo, full_end) are full tiles that need none. Keys outside [lo, end) are hidden from
    every row of the tile: skipped, never loaded (half the work of causal attention; all but
    about window / N of it with a sliding window)."""
    first_row = start_m * BLOCK_M
    full_tiles_end = (k_len // BLOCK_N) * BLOCK_N
    if CAUSAL:
        # Row i sees keys j <= i: the first row of the tile sees every key before it, the last
        # row (first_row + BLOCK_M - 1) none after it.
        full_end = tl.minimum(first_row, full_tiles_end)
        end = tl.minimum(first_row + BLOCK_M, k_len)
    else:
        full_end = full_tiles_end
        end = k_len
    lo = first_row * 0  # a tensor 0: the loops then have tensor bounds
    full_lo = lo
    if WINDOW:
        # Row i sees keys j > i - window: the first row's first key starts the run, and keys
        # from the last row's first key on are inside every row's window. Every bound stays a
        # multiple of BLOCK_N, and a window narrower than the tile leaves no full tile.
        lo = tl.maximum(first_row - window + 1, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(first_row + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N
        full_lo = tl.maximum(lo, tl.minimum(full_lo, full_end))
        full_end = tl.maximum(full_lo, full_end)
        end = tl.maximum(full_end, end)
    return lo, full_lo, full_end, end


@triton.jit
def _query_ranges(start_n, q_len, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, WINDOW: tl.constexpr):  # fmt: skip
    """The queries that see a key tile, in three runs: [lo, full_lo) and [full_hi, hi) cross the
    causal diagonal or the window's far edge and get a mask; [full_lo, full_hi) see every key of
    the tile. Queries outside [lo, hi) see none of it: skipped. Every non-empty run starts at a
    multiple of BLOCK_M (BLOCK_N is one)."""
    first_key = start_n * BLOCK_N
    if CAUSAL:
        # Queries before this tile see none of its keys; the BLOCK_N after its first key cross
        # the diagonal; later ones see all of it (within the window).
        lo = first_key
        full_lo = tl.minimum(first_key + BLOCK_N, q_len)
    else:
        lo = first_key * 0
        full_lo = lo
    full_hi = q_len
    hi = q_len
    if WINDOW:
        # Query i sees key j while i < j + window: all of the tile up to its first key + window.
        full_hi = tl.maximum(full_lo, tl.minimum((first_key + window) // BLOCK_M * BLOCK_M, q_len))
        hi = tl.maximum(full_hi, tl.minimum(first_key + BLOCK_N + window - 1, q_len))
    return lo, full_lo, full_hi, hi


# --------------------------------------------------------------------------------------------
# Forward.
# --------------------------------------------------------------------------------------------
@triton.jit
def _attn_fwd_inner(
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
        k = _load_rows(k_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
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
            s, _ = _scores2(s, qk_scale, cap_scale, cap_out, SOFTCAP)
            if ANY_MASK:
                s = _mask_scores(s, offs_m, cols, k_len, window, key_mask_ptrs,
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
        v = _load_rows(v_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
        acc = acc * alpha[:, None]
        if DROPOUT:
            # The softmax's denominator counts every probability; only the sum over V drops some
            # (the 1 / (1 - p) comes once, on the output).
            p_sum = tl.sum(p, 1)
            p = tl.where(_dropout_keep(seed, rng_rows[:, None] + cols[None, :], dropout_p), p, 0.0)
        # P is rounded to the inputs' dtype for the tensor-core dot; acc stays fp32.
        acc = tl.dot(
            _dot_operand(p, v.dtype, DOT_IN_FP32),
            _dot_operand(v, v.dtype, DOT_IN_FP32),
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


@runtime.autotune(
    configs=FWD_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": prune_fwd_configs}
)
@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    key_mask_ptr, sinks_ptr, seed_ptr, cu_q_ptr, cu_k_ptr,
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
    start_m, head, batch = _program_tile(max_seqlen_q, n_heads, BLOCK_M, CAUSAL)
    kv_head = head // group_size  # grouped-query attention: a group of q heads shares K/V

    # 64-bit offsets: batch * stride_b passes 2**31 elements for large batches of long sequences.
    batch = batch.to(tl.int64)
    q_start, q_len, k_start, k_len, row0 = _sequence(
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
    q = _load_rows(q_ptrs, offs_m, q_len, mask_d, True, EVEN_D)
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
    sm_scale, qk_scale, cap_scale, cap_out, dropout_p = _score_constants(sm_scale, softcap,
                                                                         dropout_p)  # fmt: skip
    seed, rng_rows = _dropout_rows(seed_ptr, row0, offs_m, n_k, k_start, DROPOUT)

    lo, full_lo, full_end, end = _key_ranges(start_m, k_len, window, BLOCK_M, BLOCK_N, CAUSAL,
                                             WINDOW)  # fmt: skip
    if WINDOW:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
            offs_m, offs_n, mask_d, k_len, lo, full_lo, qk_scale,
            window, cap_scale, cap_out, seed, dropout_p, rng_rows,
            CAUSAL, True, EVEN_D, POSITIVE_SCALE, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
            DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
        )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
        offs_m, offs_n, mask_d, k_len, full_lo, full_end, qk_scale,
        window, cap_scale, cap_out, seed, dropout_p, rng_rows,
        CAUSAL, False, EVEN_D, POSITIVE_SCALE, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
        DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(
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
    keep = _dropout_keep(tl.load(seed_ptr), offs, tl.cast(dropout_p, tl.float32))
    tl.store(keep_ptr + offs, keep.to(tl.int8), mask=offs < n_elements)


# --------------------------------------------------------------------------------------------
# Backward.
# --------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n_q"])
def attn_bwd_preprocess_kernel(
    out_ptr, do_ptr, delta_ptr,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    n_heads, n_q,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """delta_i = Σ_d dO_id · O_id, per query row: the rowsum(P ∘ dP) of the softmax backward,
    computed once here instead of inside every program of the dK/dV and dQ kernels."""
    start_m, head, batch = _program_tile(n_q, n_heads, BLOCK_M, False)
    batch = batch.to(tl.int64)
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_m < n_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o_ptrs = (out_ptr + batch * stride_ob + head.to(tl.int64) * stride_oh
              + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)  # fmt: skip
    do_ptrs = (do_ptr + batch * stride_dob + head.to(tl.int64) * stride_doh
               + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod)  # fmt: skip
    o = tl.load(o_ptrs, mask=mask, other=0.0)
    do = tl.load(do_ptrs, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(delta_ptr + (batch * n_heads + head) * n_q + offs_m, delta, mask=offs_m < n_q)


@triton.jit
def _load_lse2(lse_ptrs, mask_m, MAY_BE_EMPTY: tl.constexpr):
    """A query tile's LSE in base-2 units. Rows past the end read +inf, which makes their P
    exactly 0 (and their dO is 0); so do rows that saw no key (LSE -inf: their output is the
    constant 0)."""
    lse2 = tl.load(lse_ptrs, mask=mask_m, other=float("inf")) * 1.4426950408889634
    if MAY_BE_EMPTY:
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    return lse2


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v,
    q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, stride_qn, stride_don,
    offs_n, mask_d, q_len, lo, hi, qk_scale,
    window, cap_scale, cap_out, seed, dropout_p, rng_base, rng_stride,
    MASKED: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, MAY_BE_EMPTY: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Accumulate one K/V tile's dK, dV over query tiles [lo, hi), in the transposed orientation
    (keys on rows), so that Pᵀ and dSᵀ come straight out of the dots. (Masked keys of a key
    padding mask are not masked here: their rows of dK and dV are zeroed once, at the store.)"""
    offs_m0 = tl.arange(0, BLOCK_M).to(tl.int64)
    q_ptrs += lo.to(tl.int64) * stride_qn
    do_ptrs += lo.to(tl.int64) * stride_don
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        mask_m = offs_m < q_len
        q = _load_rows(q_ptrs, offs_m, q_len, mask_d, True, EVEN_D)
        do = _load_rows(do_ptrs, offs_m, q_len, mask_d, True, EVEN_D)
        lse2 = _load_lse2(lse_ptrs + offs_m, mask_m, MAY_BE_EMPTY)
        delta = tl.load(delta_ptrs + offs_m, mask=mask_m, other=0.0)
        if DOT_IN_FP32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        # Recompute Pᵀ from the saved LSE: exp(s - lse) is the normalised softmax, exactly.
        s_t, tanh_t = _scores2(tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION),
                               qk_scale, cap_scale, cap_out, SOFTCAP)  # fmt: skip
        if MASKED:
            # Tiles on the causal diagonal or the window's edge: key j (row here) is seen by
            # query i (column) if j <= i and i - j < window. Masked before the exp, so that a
            # large hidden score cannot overflow.
            visible = _visible(offs_m[None, :], offs_n[:, None], 0, window, False, CAUSAL, WINDOW)
            s_t = tl.where(visible, s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse2[None, :])
        if DROPOUT:
            # O = (P ∘ Z) V / (1 - p) with Z the kept mask: dV sees the dropped P, and dP the
            # same mask and scale; Δ = rowsum(dO ∘ O) already is rowsum(P ∘ dP).
            keep_t = _dropout_keep(seed, rng_base + offs_m[None, :] * rng_stride + offs_n[:, None],
                                   dropout_p)  # fmt: skip
            keep_scale = 1.0 / (1.0 - dropout_p)
            pd_t = tl.where(keep_t, p_t * keep_scale, 0.0)
        else:
            pd_t = p_t
        dv = tl.dot(_dot_operand(pd_t, q_ptrs.dtype.element_ty, DOT_IN_FP32), do, dv,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        if DROPOUT:
            dp_t = tl.where(keep_t, dp_t * keep_scale, 0.0)
        # dS = P ∘ (dP - delta): the softmax Jacobian applied to dP.
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - tanh_t * tanh_t)  # d tanh
        dk = tl.dot(_dot_operand(ds_t, q_ptrs.dtype.element_ty, DOT_IN_FP32), q, dk,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        q_ptrs += BLOCK_M * stride_qn
        do_ptrs += BLOCK_M * stride_don
    return dk, dv


@runtime.autotune(
    configs=DKDV_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": prune_dkdv_configs}
)
@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    key_mask_ptr, seed_ptr, cu_q_ptr, cu_k_ptr,
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
    MAY_BE_EMPTY: tl.constexpr = KEY_MASK or WINDOW or VARLEN
    # One program per K/V tile of one *kv* head; causal: the first key tiles are seen by the most
    # queries, and the natural order already launches them first.
    start_n, kv_head, batch = _program_tile(max_seqlen_k, n_kv_heads, BLOCK_N, False)
    batch = batch.to(tl.int64)
    q_start, q_len, k_start, k_len, _ = _sequence(
        cu_q_ptr, cu_k_ptr, batch, kv_head, n_kv_heads, n_q, n_k, VARLEN)
    if VARLEN:
        if start_n * BLOCK_N >= k_len:  # the grid covers the longest sequence
            return
    offs_n = start_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM

    # K and V stay on chip for the whole loop; key rows past n_k read 0 and are never stored.
    k = _load_rows(k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
                   + (k_start + offs_n[:, None]) * stride_kn + offs_d[None, :] * stride_kd,
                   offs_n, k_len, mask_d, True, EVEN_D)  # fmt: skip
    v = _load_rows(v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
                   + (k_start + offs_n[:, None]) * stride_vn + offs_d[None, :] * stride_vd,
                   offs_n, k_len, mask_d, True, EVEN_D)  # fmt: skip
    if DOT_IN_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    sm_scale, qk_scale, cap_scale, cap_out, dropout_p = _score_constants(sm_scale, softcap,
                                                                         dropout_p)  # fmt: skip
    seed = 0
    if DROPOUT:
        seed = tl.load(seed_ptr)

    lo, full_lo, full_hi, hi = _query_ranges(start_n, q_len, window, BLOCK_M, BLOCK_N, CAUSAL,
                                             WINDOW)  # fmt: skip

    # Grouped-query attention: this kv head's gradient is the sum over the q heads that read it.
    # Looping over them here keeps that sum in the fp32 accumulators: no atomics, no extra copy.
    for g in range(0, group_size):
        head = (kv_head * group_size + g).to(tl.int64)
        q_ptrs = (q_ptr + batch * stride_qb + head * stride_qh
                  + (q_start + offs_m0[:, None]) * stride_qn + offs_d[None, :] * stride_qd)  # fmt: skip
        do_ptrs = (do_ptr + batch * stride_dob + head * stride_doh
                   + (q_start + offs_m0[:, None]) * stride_don + offs_d[None, :] * stride_dod)  # fmt: skip
        if VARLEN:
            row0 = head * n_q + q_start
        else:
            row0 = (batch * n_heads + head) * n_q
        rng_base = row0 * n_k + k_start  # flat dropout index of (query 0, key 0)
        if CAUSAL or WINDOW:
            dk, dv = _attn_bwd_dkdv_inner(
                dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr + row0, delta_ptr + row0,
                stride_qn, stride_don, offs_n, mask_d, q_len, lo, full_lo, qk_scale,
                window, cap_scale, cap_out, seed, dropout_p, rng_base, n_k,
                True, EVEN_D, CAUSAL, WINDOW, SOFTCAP, DROPOUT, MAY_BE_EMPTY,
                DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
            )  # fmt: skip
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr + row0, delta_ptr + row0,
            stride_qn, stride_don, offs_n, mask_d, q_len, full_lo, full_hi, qk_scale,
            window, cap_scale, cap_out, seed, dropout_p, rng_base, n_k,
            False, EVEN_D, CAUSAL, WINDOW, SOFTCAP, DROPOUT, MAY_BE_EMPTY,
            DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
        )  # fmt: skip
        if WINDOW:
            dk, dv = _attn_bwd_dkdv_inner(
                dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr + row0, delta_ptr + row0,
                stride_qn, stride_don, offs_n, mask_d, q_len, full_hi, hi, qk_scale,
                window, cap_scale, cap_out, seed, dropout_p, rng_base, n_k,
                True, EVEN_D, CAUSAL, WINDOW, SOFTCAP, DROPOUT, MAY_BE_EMPTY,
                DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
            )  # fmt: skip

    # S = scale · Q Kᵀ, so dK picks up the scale (dV does not: O = P V has none).
    dk = dk * sm_scale
    mask = (offs_n < k_len)[:, None] & mask_d[None, :]
    if KEY_MASK:
        # A masked key has P = 0 for every query, so its dK and dV are 0: zeroed here once
        # instead of masking every score tile (its scores were computed unmasked, possibly inf).
        allowed = _key_allowed(key_mask_ptr + batch * stride_mb + offs_n * stride_mn, offs_n,
                               k_len)  # fmt: skip
        dk = tl.where(allowed[:, None], dk, 0.0)
        dv = tl.where(allowed[:, None], dv, 0.0)
    tl.store(dk_ptr + batch * stride_dkb + kv_head.to(tl.int64) * stride_dkh
             + (k_start + offs_n[:, None]) * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(dk_ptr.dtype.element_ty), mask=mask)  # fmt: skip
    tl.store(dv_ptr + batch * stride_dvb + kv_head.to(tl.int64) * stride_dvh
             + (k_start + offs_n[:, None]) * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(dv_ptr.dtype.element_ty), mask=mask)  # fmt: skip


@triton.jit
def _attn_bwd_dq_inner(
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
        k = _load_rows(k_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
        v = _load_rows(v_ptrs, cols, k_len, mask_d, MASKED, EVEN_D)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s, tanh = _scores2(tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION),
                           qk_scale, cap_scale, cap_out, SOFTCAP)  # fmt: skip
        if MASKED or KEY_MASK:
            # Padded keys read k = 0, so s = 0 and exp(0 - lse) is not 0: masked explicitly.
            s = _mask_scores(s, offs_m, cols, k_len, window, key_mask_ptrs,
                             MASKED, KEY_MASK, CAUSAL, WINDOW)  # fmt: skip
        p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        if DROPOUT:
            keep = _dropout_keep(seed, rng_rows[:, None] + cols[None, :], dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - tanh * tanh)
        dq = tl.dot(_dot_operand(ds, k_ptrs.dtype.element_ty, DOT_IN_FP32), k, dq,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
        if KEY_MASK:
            key_mask_ptrs += BLOCK_N * stride_mn
    return dq


@runtime.autotune(
    configs=DQ_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": prune_dq_configs}
)
@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    key_mask_ptr, seed_ptr, cu_q_ptr, cu_k_ptr,
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
    MAY_BE_EMPTY: tl.constexpr = KEY_MASK or WINDOW or VARLEN
    start_m, head, batch = _program_tile(max_seqlen_q, n_heads, BLOCK_M, CAUSAL)
    kv_head = head // group_size
    batch = batch.to(tl.int64)
    q_start, q_len, k_start, k_len, row0 = _sequence(
        cu_q_ptr, cu_k_ptr, batch, head, n_heads, n_q, n_k, VARLEN)
    if VARLEN:
        if start_m * BLOCK_M >= q_len:  # the grid covers the longest sequence
            return
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    mask_m = offs_m < q_len

    q = _load_rows(q_ptr + batch * stride_qb + head.to(tl.int64) * stride_qh
                   + (q_start + offs_m[:, None]) * stride_qn + offs_d[None, :] * stride_qd,
                   offs_m, q_len, mask_d, True, EVEN_D)  # fmt: skip
    do = _load_rows(do_ptr + batch * stride_dob + head.to(tl.int64) * stride_doh
                    + (q_start + offs_m[:, None]) * stride_don + offs_d[None, :] * stride_dod,
                    offs_m, q_len, mask_d, True, EVEN_D)  # fmt: skip
    if DOT_IN_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2 = _load_lse2(lse_ptr + row0 + offs_m, mask_m, MAY_BE_EMPTY)
    delta = tl.load(delta_ptr + row0 + offs_m, mask=mask_m, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    sm_scale, qk_scale, cap_scale, cap_out, dropout_p = _score_constants(sm_scale, softcap,
                                                                         dropout_p)  # fmt: skip
    seed, rng_rows = _dropout_rows(seed_ptr, row0, offs_m, n_k, k_start, DROPOUT)

    k_ptrs = (k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
              + (k_start + offs_n[:, None]) * stride_kn + offs_d[None, :] * stride_kd)  # fmt: skip
    v_ptrs = (v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
              + (k_start + offs_n[:, None]) * stride_vn + offs_d[None, :] * stride_vd)  # fmt: skip
    key_mask_ptrs = key_mask_ptr
    if KEY_MASK:
        key_mask_ptrs = key_mask_ptr + batch * stride_mb + offs_n * stride_mn
    lo, full_lo, full_end, end = _key_ranges(start_m, k_len, window, BLOCK_M, BLOCK_N, CAUSAL,
                                             WINDOW)  # fmt: skip
    if WINDOW:
        dq = _attn_bwd_dq_inner(
            dq, q, do, lse2, delta, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
            offs_m, offs_n, mask_d, k_len, lo, full_lo, qk_scale,
            window, cap_scale, cap_out, seed, dropout_p, rng_rows,
            CAUSAL, True, EVEN_D, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
            DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
        )  # fmt: skip
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptrs, v_ptrs, key_mask_ptrs, stride_kn, stride_vn, stride_mn,
        offs_m, offs_n, mask_d, k_len, full_lo, full_end, qk_scale,
        window, cap_scale, cap_out, seed, dropout_p, rng_rows,
        CAUSAL, False, EVEN_D, KEY_MASK, WINDOW, SOFTCAP, DROPOUT,
        DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip
    dq = _attn_bwd_dq_inner(
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
