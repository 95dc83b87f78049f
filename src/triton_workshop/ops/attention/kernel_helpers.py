"""The ``@triton.jit`` helpers the attention kernels share: which tile a program owns and where
its sequence lies, tile loads, the masks (geometry and key padding), scores in base-2 units with
soft-capping, dropout's random numbers, the runs of key (or query) tiles a tile visits, and the
saved LSE read back by the backward.

Device functions only, called by :mod:`.kernels` and :mod:`.kernel_loops`; the algorithm they
serve is told in docs/kernels/attention.md.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(ptrs, rows, n_rows, mask_d, CHECK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
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
def dot_operand(x, dtype, DOT_IN_FP32: tl.constexpr):
    """``x`` rounded to the inputs' dtype, as the tensor cores take it. In the interpreter with
    bf16 inputs the rounded values are widened back to fp32 (exactly), because the interpreter's
    bf16 ``tl.dot`` is wrong; the GPU keeps the native dtype."""
    x = x.to(dtype)
    if DOT_IN_FP32:
        x = x.to(tl.float32)
    return x


@triton.jit
def program_tile(n_rows, n_heads, BLOCK: tl.constexpr, HEAVY_LAST: tl.constexpr):
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
def sequence(cu_q_ptr, cu_k_ptr, batch, head, n_heads, n_q, n_k, VARLEN: tl.constexpr):
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
def is_visible(q_idx, k_idx, k_len, window, CHECK_KEYS: tl.constexpr, CAUSAL: tl.constexpr,
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
def key_allowed(key_mask_ptrs, cols, k_len):
    """The key-padding mask of key tile ``cols``: True where the key may be attended. Keys past
    the end read False (they are masked by the geometry as well)."""
    return tl.load(key_mask_ptrs, mask=cols < k_len, other=0) != 0


@triton.jit
def mask_scores(s, rows, cols, k_len, window, key_mask_ptrs, MASKED: tl.constexpr,
                KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):  # fmt: skip
    """Scores ``s`` (query ``rows`` x key ``cols``) with -inf where the query may not see the
    key: the geometry on MASKED tiles (the end of the keys: padded keys read k = 0, so s = 0, not
    -inf; causal; window), and the key padding mask on every tile. -inf, not a large negative
    number: exp2(-inf) is exactly 0, whatever the scale; and before the exp, so that a large
    hidden score cannot overflow."""
    if MASKED:
        valid = is_visible(rows[:, None], cols[None, :], k_len, window, True, CAUSAL, WINDOW)
        if KEY_MASK:
            valid = valid & key_allowed(key_mask_ptrs, cols, k_len)[None, :]
    else:
        valid = key_allowed(key_mask_ptrs, cols, k_len)[None, :]
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
def scores2(s, qk_scale, cap_scale, cap_out, SOFTCAP: tl.constexpr):
    """Raw dot products to scores in base-2 units: ``scale · s · log2(e)``, or soft-capped,
    ``softcap · tanh(scale · s / softcap) · log2(e)`` (cap_scale = scale / softcap, cap_out =
    softcap · log2(e)). Also returns tanh (the capped scores' derivative is 1 - tanh²), or 0."""
    if SOFTCAP:
        th = _tanh(s * cap_scale)
        return th * cap_out, th
    else:
        return s * qk_scale, 0.0


@triton.jit
def _mix32(x):
    """A bijective 32-bit integer mixer (xorshift-multiply, the "lowbias32" family found by the
    hash prospector): every input bit flips each output bit with probability close to 1/2."""
    x ^= x >> 16
    x *= 0x21F0AAAD
    x ^= x >> 15
    x *= 0x735A2D97
    x ^= x >> 15
    return x


@triton.jit
def dropout_keep(seed, offsets, dropout_p):
    """Which elements dropout keeps: one uniform number per element of the (B, H, Nq, Nk)
    probabilities (``offsets``, int64, its flat index), a function of the element alone, so the
    forward, the backward and the test helper draw the same mask whatever their tiles.

    The number is the index hashed under the 64-bit seed: its low word through the mixer, then
    its high word and the seed's other half through it again. Two mixer rounds are 16 integer
    operations against Philox's ten rounds (``tl.rand``, about 80), which made dropout cost its
    attention kernels several times their work (docs/kernels/attention.md)."""
    lo = offsets.to(tl.uint32) ^ seed.to(tl.uint32)
    hi = (offsets >> 32).to(tl.uint32) ^ (seed >> 32).to(tl.uint32)
    bits = _mix32(_mix32(lo) ^ hi)
    # The top 24 bits as a float in [0, 1), as tl.rand makes its uniforms.
    return (bits >> 8).to(tl.float32) * 5.9604644775390625e-08 >= dropout_p


@triton.jit
def score_constants(sm_scale, softcap, dropout_p):
    """The kernels' fp32 scalars: scale, scale · log2(e), soft-capping's scale / softcap and
    softcap · log2(e), and dropout's p. Cast first: under torch.compile Inductor passes Python
    floats as fp64."""
    sm_scale = tl.cast(sm_scale, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    return (sm_scale, sm_scale * 1.4426950408889634, sm_scale / softcap,
            softcap * 1.4426950408889634, tl.cast(dropout_p, tl.float32))


@triton.jit
def dropout_rows(seed_ptr, row0, offs_m, n_k, k_start, DROPOUT: tl.constexpr):
    """(seed, flat dropout index of each query row's first key), where ``row0`` is the LSE
    index of the tile's first row: the index of element (b, h, i, j) of the (B, H, Nq, Nk)
    probabilities ((H, total_q, total_k) packed)."""
    if DROPOUT:
        return tl.load(seed_ptr), (row0 + offs_m) * n_k + k_start
    else:
        return 0, offs_m


@triton.jit
def key_ranges(start_m, k_len, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
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
def query_ranges(start_n, q_len, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
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


@triton.jit
def load_lse2_delta(lse2_ptrs, delta_ptrs, mask_m, CHECK_ROWS: tl.constexpr):
    """A query tile's LSE in base-2 units, as the preprocess kernel wrote it (+inf for a row
    that saw no key), and its Δ. Rows past the end (``mask_m`` False, read only with
    ``CHECK_ROWS``) read LSE +inf, which makes their P exactly 0 (and their dO is 0), and Δ 0."""
    if CHECK_ROWS:
        lse2 = tl.load(lse2_ptrs, mask=mask_m, other=float("inf"))
        delta = tl.load(delta_ptrs, mask=mask_m, other=0.0)
    else:
        lse2 = tl.load(lse2_ptrs)
        delta = tl.load(delta_ptrs)
    return lse2, delta
