"""Fused attention (FlashAttention-2 style): softmax(Q Kᵀ · scale) V without the N x N matrix.

    S = scale · Q Kᵀ        (Nq x Nk scores per head)
    P = softmax(S, dim=-1)  (row-wise)
    O = P V

**Why fuse.** Written in PyTorch this is three kernels, and S and P are ``Nq x Nk`` tensors per
head that go to memory and back: at N = 8192, 32 heads, fp16, that is 4 GiB per tensor, far more
than Q, K, V and O together (N x D each). Attention is then memory-bound on bytes that are only
temporaries. The fused kernel keeps a ``BLOCK_M x BLOCK_N`` tile of S in registers, turns it into
its share of O at once and never writes S or P: memory traffic drops from O(N²) to O(N·D), and
memory use with it, which is what makes long sequences fit at all.

**Online softmax.** A program owns ``BLOCK_M`` query rows and walks K and V in tiles of
``BLOCK_N`` keys, but a row's softmax needs the max and the sum over *all* its keys. It keeps,
per row, the running max ``m``, the running sum ``l = Σ exp(s - m)`` and the unnormalised
output ``acc = Σ exp(s - m) v``. When a tile raises the max from ``m`` to ``m'``, everything
accumulated so far was scaled by ``exp(-m)`` instead of ``exp(-m')``; multiplying ``l`` and
``acc`` by ``alpha = exp(m - m')`` fixes that, and the tile's own terms are added with ``m'``.
After the last tile, ``O = acc / l``: one division per row instead of one per score. All of this
is fp32 whatever the input dtype; only the two matmul operands (Q, K, V and the tile of P) stay
in fp16/bf16, which is what the tensor cores want.

**exp2.** GPUs compute ``2^x`` in one instruction (``ex2``); ``exp(x)`` is ``2^(x · log2 e)``, an
extra multiply. Folding ``log2 e`` into the scale once (``qk_scale = scale · log2 e``) makes every
score already a base-2 exponent, so the inner loop runs ``exp2`` directly; the max, the sums
and the rescaling are unchanged (they are base-independent).

**Causal.** ``causal=True`` is PyTorch's ``is_causal``: top-left aligned, query ``i`` sees keys
``j <= i`` (also when Nq != Nk). K tiles entirely above the diagonal are skipped (never loaded:
half the work at Nq = Nk). Tiles entirely below it need no mask, so the loop runs in two parts:
full tiles without any ``tl.where``, then the few tiles that cross the diagonal or the end of
the keys with the mask. The same split handles a sequence length that is not a multiple of the
block: the last, partial tile is the one that is masked.

**Backward.** The forward saves, per query row, the log-sum-exp ``lse = m + log(l)`` (natural
log, fp32, shape (B, H, Nq)). With it the backward recomputes any tile of P exactly as
``exp(s - lse)``, from Q and K alone, without the row max or sum (and without storing P: O(N)
saved instead of O(N²)). With ``dO`` the incoming gradient:

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP - Δ),   Δ_i = Σ_d dO_id O_id,
    dQ = scale · dS K,   dK = scale · dSᵀ Q.

``Δ`` (= rowsum(P ∘ dP), what the softmax Jacobian needs) is one small preprocess kernel.
Then two kernels, so that every program writes only what it owns and no atomics are needed (the
gradients are bit-for-bit deterministic): ``attn_bwd_dkdv_kernel`` keeps one K/V tile and loops
over the query tiles that see it, accumulating dK and dV; ``attn_bwd_dq_kernel`` keeps one query
tile and loops over the K/V tiles it sees, accumulating dQ. Both recompute P, and the dQ kernel
recomputes dP too: 7 matmuls of N x N x D each, against 4 with P kept in memory. FLOPs are
traded for O(N²) memory and traffic, and for a backward without atomics.

**Grouped-query / multi-query attention.** K and V may have fewer heads than Q (``H_kv`` dividing
``H``): query head ``h`` reads K/V head ``h // (H // H_kv)``, like ``enable_gqa=True`` in PyTorch.
The forward simply points those programs at the shared head. In the backward the dK/dV of a
shared head is the sum over its group of query heads: the dK/dV program loops over the group
itself, so the sum is one fp32 accumulator, not extra memory or atomics.

**Autotuning.** Tile shapes, warps and pipeline depth are tuned per (sequence-length bucket,
head dim, causal, dtype) by :func:`runtime.autotune`; configs that cannot fit shared memory or
would spill their fp32 accumulators out of registers are pruned first. The interpreter runs
configs[0] of each list only.

**In the interpreter** (no GPU): the kernels run through Triton's interpreter, and fp32 scores
use ``input_precision="ieee"`` so they match torch's fp32 math. Triton's interpreter computes
``tl.dot`` on bf16 operands wrongly (triton-lang/triton#11584), so there, and only there, the
bf16 tiles are widened to fp32 just before each dot (P and dS are rounded to bf16 first, exactly
as the GPU would feed them to its tensor cores): results are what the GPU computes. The GPU
keeps native fp16/bf16 dots.

**Swapping it into a model.** :func:`attention` has the semantics of
``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)`` (with
``enable_gqa=True`` behaviour when K/V have fewer heads), for q, k, v of shape (B, H, N, D) or
(H, N, D). In a model's attention block, replace ::

    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

with ::

    from triton_workshop.ops.attention import attention
    out = attention(q, k, v, causal=True)

Inputs may be strided views (the usual ``x.view(B, N, H, D).transpose(1, 2)`` is read in place,
without a copy). Not supported: ``attn_mask`` and ``dropout_p`` (keep SDPA for those).
``torch.compile(fullgraph=True)`` traces through it (it is a registered ``torch.library`` op).
"""

from __future__ import annotations

import math
import numbers

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op, wrap_triton

#: Largest head dim: the fp32 accumulators of a 128-row tile of D = 256 already take half the
#: register file of an H100 SM.
MAX_HEAD_DIM = 256
#: Smallest padded head dim: ``tl.dot`` needs a reduction dimension of at least 16.
MIN_HEAD_DIM_PAD = 16
#: Rows a program of the delta preprocess kernel handles.
PREPROCESS_BLOCK_M = 64

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) = log2(x) * LN2


# --------------------------------------------------------------------------------------------
# Configs. One list per kernel, configs[0] first: it is the interpreter's, and the GPU's fallback
# when pruning leaves nothing. Tuned for the H100 (228 KB shared memory, 64K registers per SM).
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
#: n16 instructions, and do every exp twice (``_prune_dkdv`` drops those configs where others
#: remain). So 64-key tiles take 4 warps and 128-key tiles 8; at D = 128, 2 x 128 x 128 fp32
#: accumulators over 8 warps is 128 registers a thread, and only BLOCK_M <= 32 leaves room for
#: the score tiles (BLOCK_M 64: spills, and ptxas serialises the wgmmas, warning C7515).
DKDV_CONFIGS = [
    # D <= 64 (64 fp32 accumulators a thread); also the interpreter's.
    _config(32, 64, 3, 4),
    # D = 128 (fits with 8 warps, no spill: 255 registers at 2 stages, 4 bytes at 3).
    _config(32, 128, 2, 8),
    _config(32, 128, 3, 8),
    _config(16, 128, 3, 8),
    _config(16, 64, 4, 4),
    # D <= 64: larger query tiles, deeper pipeline (at D = 128 the latter spills 96 bytes).
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
#: no longer fit beside them in 255 registers and ptxas spills (measured on sm_90: fwd 128 x 64,
#: D = 128, 4 warps spills 520 bytes; 8 warps, 64 a thread, none).
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


def _prune_fwd(configs, named_args, **kwargs):
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
#: before ptxas spills on sm_90 (Triton 3.6). 8 warps: BLOCK_N 128, BLOCK_M 32, D 128 is 128 + 32
#: (255 registers, no spill); BLOCK_M 64 (128 + 64) spills. 4 warps: BLOCK_N 64, D 128 with
#: BLOCK_M 16 is 128 + 16 (no spill); BLOCK_M 32 (128 + 32) spills 76-144 bytes.
_DKDV_MAX_LIVE_PER_THREAD = {4: 144, 8: 160}
#: The same for fp32 inputs (IEEE FMA dots, no tensor cores): see ``_prune_dkdv``.
_DKDV_MAX_FMA_PER_THREAD = 80


def _prune_dkdv(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    head_dim_pad = args["HEAD_DIM_PAD"]
    tensor_cores = args["q_ptr"].element_size() < 4  # fp32 dots are IEEE FMAs (_dot_args)

    def registers_fit(c):
        threads = 32 * c.num_warps
        block_m, block_n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        if not tensor_cores:
            # FMA dots keep their operands in registers too: K and V beside dK and dV, and the
            # Q and dO tiles (fp32, D = 128: BLOCK 16 x 32 on 8 warps is 80, no spill; 32 x 32,
            # 96, spills 532 bytes; D = 64: 16 x 64 on 4 warps, 144, spills).
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


def _prune_dq(configs, named_args, **kwargs):
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
# is in the key implicitly (Triton's autotuner adds the dtypes of tensor arguments).
_TUNE_KEY = ["N_Q_BUCKET", "N_K_BUCKET", "HEAD_DIM", "CAUSAL"]
# Integer arguments equal to 1 would otherwise become compile-time constants: one more compile per
# length of 1, and loop bounds that are Python ints where the kernels expect tensors.
_NOT_SPECIALIZED = ["n_q", "n_k", "N_Q_BUCKET", "N_K_BUCKET"]


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
def _key_ranges(start_m, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Keys [0, full_end) come in full tiles that need no mask; keys [full_end, end) are the
    tiles that cross the causal diagonal or the end of the keys, and get one. Keys past ``end``
    are above the diagonal for every row of the tile: skipped, never loaded."""
    full_tiles_end = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        # Row i sees keys j <= i: the first row of the tile (start_m * BLOCK_M) sees every key
        # before it, the last row (start_m * BLOCK_M + BLOCK_M - 1) none after it.
        full_end = tl.minimum(start_m * BLOCK_M, full_tiles_end)
        end = tl.minimum((start_m + 1) * BLOCK_M, n_k)
    else:
        full_end = full_tiles_end
        end = n_k
    return full_end, end


# --------------------------------------------------------------------------------------------
# Forward.
# --------------------------------------------------------------------------------------------
@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    k_ptrs, v_ptrs, stride_kn, stride_vn,
    offs_m, offs_n, mask_d, n_k, lo, hi, qk_scale,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr, POSITIVE_SCALE: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Full tiles with a positive scale: max(scale * s) = scale * max(s), so the row max is taken
    # on the raw scores and each score then costs one fused multiply-add (s * scale - m) instead
    # of a multiply and a subtract: the softmax's arithmetic, as much as the tensor cores, limits
    # this loop at D <= 128.
    SCALE_AFTER_MAX: tl.constexpr = POSITIVE_SCALE and not MASKED
    k_ptrs += lo.to(tl.int64) * stride_kn
    v_ptrs += lo.to(tl.int64) * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = _load_rows(k_ptrs, cols, n_k, mask_d, MASKED, EVEN_D)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        # Scores in base-2 units: scale * log2(e) is folded in (see the module docstring).
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if SCALE_AFTER_MAX:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_sub = m_new
            p = tl.exp2(s * qk_scale - m_sub[:, None])
        else:
            s = s * qk_scale
            if MASKED:
                valid = cols[None, :] < n_k
                if CAUSAL:
                    valid = valid & (cols[None, :] <= offs_m[:, None])
                # -inf, not a large negative number: exp2(-inf) is exactly 0, whatever the scale.
                s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = m_new
            if MASKED:
                # A row that has seen no key yet has m = -inf, and -inf - (-inf) is NaN;
                # subtracting 0 instead makes its p and alpha exactly 0 (m itself stays -inf
                # until a key comes).
                m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_sub[:, None])
        # Online softmax: what was accumulated against the old max is rescaled to the new one.
        alpha = tl.exp2(m_i - m_sub)
        v = _load_rows(v_ptrs, cols, n_k, mask_d, MASKED, EVEN_D)
        acc = acc * alpha[:, None]
        # P is rounded to the inputs' dtype for the tensor-core dot; acc stays fp32.
        acc = tl.dot(
            _dot_operand(p, v.dtype, DOT_IN_FP32),
            _dot_operand(v, v.dtype, DOT_IN_FP32),
            acc,
            input_precision=INPUT_PRECISION,
        )
        # The row sum after the dot, as FlashAttention does: fewer values live across it.
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@runtime.autotune(
    configs=FWD_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune_fwd}
)
@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_heads, n_q, n_k, group_size, sm_scale,
    N_Q_BUCKET, N_K_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr, POSITIVE_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal split needs BLOCK_M % BLOCK_N == 0")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    start_m, head, batch = _program_tile(n_q, n_heads, BLOCK_M, CAUSAL)
    kv_head = head // group_size  # grouped-query attention: a group of q heads shares K/V

    # 64-bit offsets: batch * stride_b passes 2**31 elements for large batches of long sequences.
    batch = batch.to(tl.int64)
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM

    q_ptrs = (q_ptr + batch * stride_qb + head.to(tl.int64) * stride_qh
              + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd)  # fmt: skip
    k_ptrs = (k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
              + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd)  # fmt: skip
    v_ptrs = (v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
              + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)  # fmt: skip

    # The Q tile is loaded once and stays on chip for the whole loop over K/V.
    q = _load_rows(q_ptrs, offs_m, n_q, mask_d, True, EVEN_D)
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # Under torch.compile Inductor passes Python floats as fp64: keep the arithmetic in fp32.
    sm_scale = tl.cast(sm_scale, tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # scale * log2(e)

    full_end, end = _key_ranges(start_m, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    zero = start_m * 0  # a tensor 0: both loops then have tensor bounds
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
        offs_m, offs_n, mask_d, n_k, zero, full_end, qk_scale,
        CAUSAL, False, EVEN_D, POSITIVE_SCALE, DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
        offs_m, offs_n, mask_d, n_k, full_end, end, qk_scale,
        CAUSAL, True, EVEN_D, POSITIVE_SCALE, DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip

    # Every row sees at least key 0 (n_k > 0 is checked by the launcher), so l_i >= 1.
    out = acc / l_i[:, None]
    # Natural-log LSE of the scaled scores: m and log2(l) are in base-2 units.
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453

    mask_m = offs_m < n_q
    o_ptrs = (out_ptr + batch * stride_ob + head.to(tl.int64) * stride_oh
              + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)  # fmt: skip
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])
    lse_ptrs = lse_ptr + (batch * n_heads + head) * n_q + offs_m
    tl.store(lse_ptrs, lse, mask=mask_m)


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
def _attn_bwd_dkdv_inner(
    dk, dv, k, v,
    q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, stride_qn, stride_don,
    offs_n, mask_d, n_q, lo, hi, qk_scale,
    MASKED: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Accumulate one K/V tile's dK, dV over query tiles [lo, hi), in the transposed orientation
    (keys on rows), so that Pᵀ and dSᵀ come straight out of the dots."""
    offs_m0 = tl.arange(0, BLOCK_M).to(tl.int64)
    q_ptrs += lo.to(tl.int64) * stride_qn
    do_ptrs += lo.to(tl.int64) * stride_don
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        mask_m = offs_m < n_q
        q = _load_rows(q_ptrs, offs_m, n_q, mask_d, True, EVEN_D)
        do = _load_rows(do_ptrs, offs_m, n_q, mask_d, True, EVEN_D)
        # Rows past n_q read lse = +inf, which makes their P exactly 0 (and their dO is 0).
        lse2 = tl.load(lse_ptrs + offs_m, mask=mask_m, other=float("inf")) * 1.4426950408889634
        delta = tl.load(delta_ptrs + offs_m, mask=mask_m, other=0.0)
        if DOT_IN_FP32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        # Recompute Pᵀ from the saved LSE: exp(s - lse) is the normalised softmax, exactly.
        s_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * qk_scale
        if MASKED:
            # Causal diagonal tiles only: key j (row here) is seen by query i (column) if j <= i.
            # Masked before the exp, so that a large score above the diagonal cannot overflow.
            s_t = tl.where(offs_n[:, None] <= offs_m[None, :], s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse2[None, :])
        dv = tl.dot(_dot_operand(p_t, q_ptrs.dtype.element_ty, DOT_IN_FP32), do, dv,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        # dS = P ∘ (dP - delta): the softmax Jacobian applied to dP.
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(_dot_operand(ds_t, q_ptrs.dtype.element_ty, DOT_IN_FP32), q, dk,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        q_ptrs += BLOCK_M * stride_qn
        do_ptrs += BLOCK_M * stride_don
    return dk, dv


@runtime.autotune(
    configs=DKDV_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune_dkdv}
)
@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    n_heads, n_kv_heads, n_q, n_k, group_size, sm_scale,
    N_Q_BUCKET, N_K_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    tl.static_assert(BLOCK_N % BLOCK_M == 0, "the causal split needs BLOCK_N % BLOCK_M == 0")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    # One program per K/V tile of one *kv* head; causal: the first key tiles are seen by the most
    # queries, and the natural order already launches them first.
    start_n, kv_head, batch = _program_tile(n_k, n_kv_heads, BLOCK_N, False)
    batch = batch.to(tl.int64)
    offs_n = start_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM

    # K and V stay on chip for the whole loop; key rows past n_k read 0 and are never stored.
    k = _load_rows(k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
                   + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                   offs_n, n_k, mask_d, True, EVEN_D)  # fmt: skip
    v = _load_rows(v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
                   + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                   offs_n, n_k, mask_d, True, EVEN_D)  # fmt: skip
    if DOT_IN_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile (see attn_fwd_kernel)
    qk_scale = sm_scale * 1.4426950408889634

    zero = start_n * 0
    if CAUSAL:
        # Queries before this tile see none of its keys: start at its first key. Query tiles
        # inside [first key, last key] cross the diagonal and are masked; later ones see all.
        masked_lo = start_n * BLOCK_N
        masked_hi = tl.minimum(masked_lo + BLOCK_N, n_q)
        full_lo = masked_lo + BLOCK_N
    else:
        masked_lo = zero
        masked_hi = zero
        full_lo = zero

    # Grouped-query attention: this kv head's gradient is the sum over the q heads that read it.
    # Looping over them here keeps that sum in the fp32 accumulators: no atomics, no extra copy.
    for g in range(0, group_size):
        head = (kv_head * group_size + g).to(tl.int64)
        q_ptrs = (q_ptr + batch * stride_qb + head * stride_qh
                  + offs_m0[:, None] * stride_qn + offs_d[None, :] * stride_qd)  # fmt: skip
        do_ptrs = (do_ptr + batch * stride_dob + head * stride_doh
                   + offs_m0[:, None] * stride_don + offs_d[None, :] * stride_dod)  # fmt: skip
        row0 = (batch * n_heads + head) * n_q
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr + row0, delta_ptr + row0,
            stride_qn, stride_don, offs_n, mask_d, n_q, masked_lo, masked_hi, qk_scale,
            True, EVEN_D, DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
        )  # fmt: skip
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptrs, do_ptrs, lse_ptr + row0, delta_ptr + row0,
            stride_qn, stride_don, offs_n, mask_d, n_q, full_lo, n_q, qk_scale,
            False, EVEN_D, DOT_IN_FP32, INPUT_PRECISION, BLOCK_M,
        )  # fmt: skip

    # S = scale · Q Kᵀ, so dK picks up the scale (dV does not: O = P V has none).
    dk = dk * sm_scale
    mask = (offs_n < n_k)[:, None] & mask_d[None, :]
    tl.store(dk_ptr + batch * stride_dkb + kv_head.to(tl.int64) * stride_dkh
             + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(dk_ptr.dtype.element_ty), mask=mask)  # fmt: skip
    tl.store(dv_ptr + batch * stride_dvb + kv_head.to(tl.int64) * stride_dvh
             + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(dv_ptr.dtype.element_ty), mask=mask)  # fmt: skip


@triton.jit
def _attn_bwd_dq_inner(
    dq, q, do, lse2, delta,
    k_ptrs, v_ptrs, stride_kn, stride_vn,
    offs_m, offs_n, mask_d, n_k, lo, hi, qk_scale,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    k_ptrs += lo.to(tl.int64) * stride_kn
    v_ptrs += lo.to(tl.int64) * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = _load_rows(k_ptrs, cols, n_k, mask_d, MASKED, EVEN_D)
        v = _load_rows(v_ptrs, cols, n_k, mask_d, MASKED, EVEN_D)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        if MASKED:
            # Padded keys read k = 0, so s = 0 and exp(0 - lse) is not 0: mask them explicitly
            # (and before the exp, so that a large score above the diagonal cannot overflow).
            valid = cols[None, :] < n_k
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            s = tl.where(valid, s, float("-inf"))
        p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(_dot_operand(ds, k_ptrs.dtype.element_ty, DOT_IN_FP32), k, dq,
                    input_precision=INPUT_PRECISION)  # fmt: skip
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return dq


@runtime.autotune(
    configs=DQ_CONFIGS, key=_TUNE_KEY, prune_configs_by={"early_config_prune": _prune_dq}
)
@triton.jit(do_not_specialize=_NOT_SPECIALIZED)
def attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    n_heads, n_q, n_k, group_size, sm_scale,
    N_Q_BUCKET, N_K_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "the causal split needs BLOCK_M % BLOCK_N == 0")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    start_m, head, batch = _program_tile(n_q, n_heads, BLOCK_M, CAUSAL)
    kv_head = head // group_size
    batch = batch.to(tl.int64)
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    mask_m = offs_m < n_q

    q = _load_rows(q_ptr + batch * stride_qb + head.to(tl.int64) * stride_qh
                   + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                   offs_m, n_q, mask_d, True, EVEN_D)  # fmt: skip
    do = _load_rows(do_ptr + batch * stride_dob + head.to(tl.int64) * stride_doh
                    + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod,
                    offs_m, n_q, mask_d, True, EVEN_D)  # fmt: skip
    if DOT_IN_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    row0 = (batch * n_heads + head) * n_q
    # Rows past n_q: lse = +inf makes their P 0 (they are not stored either way).
    lse2 = tl.load(lse_ptr + row0 + offs_m, mask=mask_m, other=float("inf")) * 1.4426950408889634
    delta = tl.load(delta_ptr + row0 + offs_m, mask=mask_m, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)  # fp64 under torch.compile (see attn_fwd_kernel)
    qk_scale = sm_scale * 1.4426950408889634

    k_ptrs = (k_ptr + batch * stride_kb + kv_head.to(tl.int64) * stride_kh
              + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd)  # fmt: skip
    v_ptrs = (v_ptr + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
              + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd)  # fmt: skip
    full_end, end = _key_ranges(start_m, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    zero = start_m * 0
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
        offs_m, offs_n, mask_d, n_k, zero, full_end, qk_scale,
        CAUSAL, False, EVEN_D, DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
        offs_m, offs_n, mask_d, n_k, full_end, end, qk_scale,
        CAUSAL, True, EVEN_D, DOT_IN_FP32, INPUT_PRECISION, BLOCK_N,
    )  # fmt: skip

    dq = dq * sm_scale
    tl.store(dq_ptr + batch * stride_dqb + head.to(tl.int64) * stride_dqh
             + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd,
             dq.to(dq_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])  # fmt: skip


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------

def _head_dim_pad(head_dim: int) -> int:
    return max(MIN_HEAD_DIM_PAD, triton.next_power_of_2(int(head_dim)))


def _dot_args(dtype: torch.dtype) -> dict:
    # fp32: exact IEEE products, as torch's fp32 math; fp16/bf16 products are exact either way.
    # bf16 in the interpreter: widen before each dot (module docstring).
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
    """1-D grid: every (tile, head, batch); see ``_program_tile``."""
    return lambda meta: (triton.cdiv(n_rows, meta[block_key]) * n_programs_per_tile,)


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[1], q.shape[2])


def _forward_fake(q, k, v, causal, scale):
    return torch.empty_like(q), q.new_empty(_lse_shape(q), dtype=torch.float32)


def _backward_fake(grad_out, q, k, v, out, lse, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


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
    with runtime.device_guard(q):
        wrap_triton(attn_bwd_preprocess_kernel)[
            (triton.cdiv(n_q, PREPROCESS_BLOCK_M) * n_heads * batch,)
        ](
            out, grad_out, delta, *out.stride(), *grad_out.stride(), n_heads, n_q,
            HEAD_DIM=common["HEAD_DIM"], HEAD_DIM_PAD=common["HEAD_DIM_PAD"],
            BLOCK_M=PREPROCESS_BLOCK_M,
        )  # fmt: skip
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
