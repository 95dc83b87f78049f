"""The matmul family's Triton kernels: ``dropout(act(A @ B + bias))`` one output tile a program
(:func:`matmul_kernel`, autotuned over :data:`CONFIGS`), its persistent TMA twin for Hopper
(:func:`matmul_tma_kernel`), the padded copy that makes ragged operands 16-byte aligned
(:func:`pad_copy_kernel`), and the backward's dropout of the output gradient
(:func:`dropout_scale_kernel`).

Readable alone: the host code (the other modules of ``ops/matmul/``) only decides which kernel
runs and with what arguments. Why the kernels look as they do (tiles, grouped ordering, no masks
in the main loop, the fused epilogue, the numerics) is told in docs/kernels/matmul.md.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import runtime
from .._common import gemm_shared_memory_bytes


def _config(bm, bn, bk, stages, warps, group_m=8):
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
        num_stages=stages,
        num_warps=warps,
    )


#: Tuned for Hopper (227 KB of shared memory per block, wgmma tensor cores). configs[0] is what
#: the interpreter runs and what a GPU falls back on when pruning leaves one config: 128x128x64 with
#: 3 stages fits shared memory in fp32 too (3 x (128x64 + 64x128) x 4 B = 192 KB).
CONFIGS = [
    _config(128, 128, 64, 3, 8),
    # fp16/bf16, large problems: the widest tile moves the fewest bytes a FLOP (the winner at
    # 4096³ and 8192³; docs/kernels/matmul.md).
    _config(128, 256, 64, 3, 8),
    _config(256, 128, 64, 3, 8),
    _config(128, 128, 64, 4, 4),
    _config(64, 256, 32, 4, 4),
    _config(128, 64, 64, 4, 4),
    _config(64, 128, 64, 4, 4),
    # fp32 (TF32 or FMA): four bytes an element halve the K depth that fits. 128x256x32 is the
    # best TF32 tile when B is K-major (the nn.Linear case, b = w.t()).
    _config(128, 256, 32, 3, 8),
    _config(128, 128, 32, 4, 4),
    _config(64, 128, 32, 4, 4),
    # Small or skinny problems: more, smaller tiles, so that every SM gets one.
    _config(64, 64, 64, 4, 4),
    _config(64, 32, 32, 5, 2),
    _config(32, 64, 32, 5, 2),
    _config(16, 64, 128, 4, 4, group_m=1),
]


#: The largest tile side any config uses: bounds an offset inside an output tile, so the launcher
#: can tell before the autotuner picks a config whether 32-bit offsets within a tile are safe.
MAX_BLOCK = max(max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in CONFIGS)


def prune_configs(configs, named_args, **kwargs):
    """Drop, before benchmarking, the configs that cannot win.

    Configs whose pipeline does not fit in shared memory would fail to launch; tiles much larger
    than the (padded) problem compute mostly padding; small tiles on a large problem (already
    thousands of tiles for about a hundred SMs) only re-read A and B more often. Never returns an
    empty list.
    """
    args = {**named_args, **kwargs}
    element_size = args["a_ptr"].element_size()
    limit = runtime.shared_memory_limit()
    fitting = [c for c in configs
               if gemm_shared_memory_bytes(c, element_size) <= limit] or configs[:1]
    sized = [
        c
        for c in fitting
        if c.kwargs["BLOCK_M"] <= max(args["M_BUCKET"], 64)
        and c.kwargs["BLOCK_N"] <= max(args["N_BUCKET"], 64)
        and c.kwargs["BLOCK_K"] <= max(args["K_BUCKET"], 32)
        and (
            args["M_BUCKET"] * args["N_BUCKET"] < 2048 * 2048
            or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] >= 128 * 64
        )
    ]
    return sized or fitting


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
@triton.jit
def _tanh(x):
    # tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|}): the exponent is never positive, so this
    # cannot overflow (e^{+2x} would be inf past x ~ 44 and give inf/inf = nan). Written out
    # because tl.math.tanh is not in every Triton release this package supports.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def _apply_activation(x, slope, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == "leaky_relu":
        # fp32: Inductor passes Python floats as fp64, which would promote the tile.
        x = tl.where(x > 0, x, x * tl.cast(slope, tl.float32))
    elif ACTIVATION == "gelu":
        # The tanh approximation, as torch.nn.functional.gelu(approximate="tanh");
        # 0.79788... = sqrt(2 / pi).
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = 0.5 * x * (1.0 + _tanh(inner))
    return x


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """The (row, column) tile of program ``pid`` in grouped ordering: GROUP_M tile-rows are
    walked column by column, so that the programs running at the same time share their A and B
    panels in L2 (docs/kernels/matmul.md, "Grouped ordering")."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _mma(a, b, acc, INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    if DOT_IN_FP32:
        # Interpreter only (bf16 dots are wrong there); the GPU keeps native bf16 tensor cores.
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)


@triton.jit
def dropout_factor(seed_ptr, rows, col_start, n_cols, dropout_p,
                   BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Dropout's factor for a (BLOCK_R, BLOCK_C) tile of a (rows, ``n_cols``) output: ``1 / (1 -
    p)`` where kept, 0 where dropped. ``rows`` (int64) are the tile's rows counted through the
    whole output (batches stacked), ``col_start`` its first column, a multiple of 4.

    Philox gives four 32-bit numbers a call: the four columns ``4g .. 4g+3`` of row ``r`` take
    the numbers of counter ``r * cdiv(n_cols, 4) + g``. A function of the element, not of the
    tile, so the forward, the backward and a test redraw the same mask whatever their tiles. One
    call for four elements: the ten Philox rounds (integer work) cost a quarter as much as one
    call an element, and the epilogue holds far fewer registers beside the accumulator (figures
    in docs/kernels/matmul.md)."""
    groups = col_start // 4 + tl.arange(0, BLOCK_C // 4)
    counters = rows[:, None] * tl.cdiv(n_cols, 4) + groups[None, :]
    u0, u1, u2, u3 = tl.rand4x(tl.load(seed_ptr), counters)
    # [u0, u2] and [u1, u3] interleaved, then those two: u0, u1, u2, u3 of each group in a row.
    uniform = tl.interleave(tl.interleave(u0, u2), tl.interleave(u1, u3))
    p = tl.cast(dropout_p, tl.float32)  # Inductor passes Python floats as fp64
    return tl.where(uniform >= p, 1.0 / (1.0 - p), 0.0)


@triton.jit
def _epilogue(acc, rows, col_start, offs_n, N, bias_ptr, stride_bias, slope, seed_ptr, dropout_p,
              HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DROPOUT: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``dropout(act(acc + bias))`` on the fp32 accumulator of the tile at columns ``offs_n``
    (from ``col_start``); ``rows`` (int64) are its rows counted through the whole output, batch
    included (see :func:`dropout_factor`)."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    acc = _apply_activation(acc, slope, ACTIVATION)
    if DROPOUT:
        # Multiplied in rather than selected: a dropped inf or NaN still shows, as in F.dropout.
        acc *= dropout_factor(seed_ptr, rows, col_start, N, dropout_p, BLOCK_M, BLOCK_N)
    return acc


@runtime.autotune(
    configs=CONFIGS,
    # Buckets, not M/N/K: a new length in the same power-of-two bucket reuses the tuned config.
    # The precision is in the key because TF32 and IEEE fp32 favour different tiles.
    key=["M_BUCKET", "N_BUCKET", "K_BUCKET", "INPUT_PRECISION"],
    prune_configs_by={"early_config_prune": prune_configs},
)
@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET", "K_BUCKET"])
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, seed_ptr,
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_bias,
    slope, dropout_p,
    M_BUCKET, N_BUCKET, K_BUCKET,
    A_M_GRAIN: tl.constexpr, A_K_GRAIN: tl.constexpr,
    B_K_GRAIN: tl.constexpr, B_N_GRAIN: tl.constexpr,
    INT32_TILE_OFFSETS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    DROPOUT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """``dropout(act(A @ B + bias))``, one output tile a program (``DROPOUT``: dropout with
    probability ``dropout_p``, its Philox seed read at ``seed_ptr``).

    Each ``*_GRAIN`` (the host's ``grain``) is the multiple of elements the kernel may round
    that operand dimension up to when it reads: the elements in 16 bytes along the contiguous dim
    of an aligned operand, where the compiler moves 16-byte vectors (the extra elements lie in the
    row's padding or its last 16-byte sector, so never across a page), 1 (exact) elsewhere."""
    # One program per output tile; the batch is folded into axis 0 (axis 1 stops at 65535).
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = num_pid_m * num_pid_n
    batch = (pid // tiles_per_batch).to(tl.int64)
    pid = pid % tiles_per_batch

    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)

    # 64-bit offsets: row * stride passes 2**31 on large operands (and on transposed ones, where a
    # K step is M elements), and a 32-bit product would wrap around silently.
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)

    # No masks on the main loop's loads. Hopper's asynchronous copies (cp.async, 16 bytes) need
    # the compiler to prove each 16-byte vector aligned and wholly in or out of the mask; a mask
    # bound along the contiguous dimension that is not a multiple of 16 elements (K = 7777 for a
    # row-major A, N = 2100 for B) proves neither, and that operand falls to 2-byte loads staged
    # through registers, without the multi-stage pipeline. So the rows of an edge tile past M
    # (columns past N) read rows (columns) wrapped around to the start instead: real memory,
    # products that land only in rows (columns) never stored. The hints restore the contiguity
    # the modulo hides; wrapping at a whole number of vectors keeps every vector aligned.
    m_wrap = tl.cdiv(M, A_M_GRAIN) * A_M_GRAIN
    n_wrap = tl.cdiv(N, B_N_GRAIN) * B_N_GRAIN
    rows_a = tl.max_contiguous(tl.multiple_of(offs_m % m_wrap, BLOCK_M), BLOCK_M)
    cols_b = tl.max_contiguous(tl.multiple_of(offs_n % n_wrap, BLOCK_N), BLOCK_N)

    # Strides, not shapes: a transposed or sliced operand (b = w.t(), b[:, ::2]) is read in place.
    a_ptrs = a_ptr + batch * stride_ab + rows_a[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + batch * stride_bb + offs_k[:, None] * stride_bk + cols_b[None, :] * stride_bn

    # fp32 accumulator whatever the inputs: an fp16 running sum of K products would lose the low
    # bits of every product once the sum is large (and overflow at 65504).
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_full = K // BLOCK_K
    for _ in range(0, k_full):
        acc = _mma(tl.load(a_ptrs), tl.load(b_ptrs), acc, INPUT_PRECISION, DOT_IN_FP32)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    # The ragged end of K, once per tile, after the pipelined loop. Its loads still move whole
    # 16-byte vectors where K is contiguous (2-byte loads, one 64-bit address each, cost dozens
    # more registers a thread for the whole kernel: fewer tiles resident per SM); what they read
    # past K is then zeroed on both sides, since the padding may hold anything and NaN * 0 is NaN.
    k_left = K - k_full * BLOCK_K
    if k_left > 0:
        in_k = offs_k < k_left
        a = tl.load(a_ptrs, mask=offs_k[None, :] < tl.cdiv(k_left, A_K_GRAIN) * A_K_GRAIN, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < tl.cdiv(k_left, B_K_GRAIN) * B_K_GRAIN, other=0.0)
        a = tl.where(in_k[None, :], a, 0.0)
        b = tl.where(in_k[:, None], b, 0.0)
        acc = _mma(a, b, acc, INPUT_PRECISION, DOT_IN_FP32)

    # Epilogue on the fp32 accumulator, before the one rounding to the output dtype.
    acc = _epilogue(acc, batch * M + offs_m, pid_n * BLOCK_N, offs_n, N, bias_ptr, stride_bias,
                    slope, seed_ptr, dropout_p, HAS_BIAS, ACTIVATION, DROPOUT, BLOCK_M, BLOCK_N)

    # One 64-bit address for the tile's corner, 32-bit offsets within it (INT32_TILE_OFFSETS:
    # the launcher checked they fit), masks against what is left of M and N past the corner.
    # A 64-bit offset and a mask per element held far more registers a thread on a ragged M and
    # N (one 128x128 tile resident per SM instead of two) and made the GELU epilogue spill at
    # 128x256 (figures in docs/kernels/matmul.md).
    tile_m = tl.arange(0, BLOCK_M)
    tile_n = tl.arange(0, BLOCK_N)
    if not INT32_TILE_OFFSETS:
        tile_m = tile_m.to(tl.int64)
        tile_n = tile_n.to(tl.int64)
    c_corner = (c_ptr + batch * stride_cb + pid_m.to(tl.int64) * BLOCK_M * stride_cm
                + pid_n.to(tl.int64) * BLOCK_N * stride_cn)
    c_ptrs = c_corner + (tile_m[:, None] * stride_cm + tile_n[None, :] * stride_cn)
    in_c = (tile_m[:, None] < M - pid_m * BLOCK_M) & (tile_n[None, :] < N - pid_n * BLOCK_N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=in_c)


@triton.jit
def matmul_tma_kernel(
    a_desc, b_desc, c_desc, c_ptr, bias_ptr, seed_ptr,
    M, N, K,
    stride_cm, stride_bias,
    slope, dropout_p,
    A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr, C_TMA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    DROPOUT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """:func:`matmul_kernel`'s product and epilogue (2-D), Hopper-style: persistent, with tiles
    moved by the Tensor Memory Accelerator.

    ``NUM_SMS`` programs walk the output tiles in grouped order, ``NUM_SMS`` apart, instead of one
    program a tile: with ``FLATTEN`` the compiler pipelines the tile loop and the K loop as one,
    so the loads of a program's next tile are in flight while it finishes the epilogue of this
    one. Each operand is a tensor descriptor over its memory as it lies (``*_K_MAJOR``: K is the
    contiguous dim), and a load is one TMA instruction that copies a whole tile to shared
    memory: no address arithmetic in registers, and the hardware fills what lies past the
    tensor's edge (ragged M, N, K) with zeros, so nothing is masked or wrapped. ``C_TMA`` stores
    the tile through a descriptor too, else through masked pointers at ``c_ptr``."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(start, num_pid_m * num_pid_n, NUM_SMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(k_steps):
            off_k = step * BLOCK_K
            # A transposed operand is a tile of its own memory, transposed in shared memory's
            # addressing: wgmma reads either order of 16-bit operands.
            if A_K_MAJOR:
                a = a_desc.load([off_m, off_k])
            else:
                a = a_desc.load([off_k, off_m]).T
            if B_K_MAJOR:
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            acc = _mma(a, b, acc, INPUT_PRECISION, DOT_IN_FP32)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc = _epilogue(acc, offs_m.to(tl.int64), off_n, offs_n, N, bias_ptr, stride_bias, slope,
                        seed_ptr, dropout_p, HAS_BIAS, ACTIVATION, DROPOUT, BLOCK_M, BLOCK_N)
        out = acc.to(c_ptr.dtype.element_ty)
        if C_TMA:
            c_desc.store([off_m, off_n], out)
        else:
            c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, out, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def pad_copy_kernel(
    src_ptr, dst_ptr,
    rows, cols, cols_padded,
    stride_sb, stride_sr, stride_sc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """``dst[b, r, :] = src[b, r, :]`` followed by zeros up to ``cols_padded``; dst contiguous.

    One pass: the reads are as narrow as the source's alignment allows (2 bytes for a ragged
    fp16 row), but each warp still reads consecutive elements; the writes, to rows a multiple of
    16 elements long, are 16-byte vectors. Writing the padding too (zeros) costs nothing extra in
    those vectors and leaves no uninitialised memory behind for a debugger to trip on."""
    # One grid axis (the others stop at 65535), column blocks fastest: neighbours share rows.
    pid = tl.program_id(0)
    col_blocks = tl.cdiv(cols_padded, BLOCK_C)
    row_blocks = tl.cdiv(rows, BLOCK_R)
    pid_r = pid // col_blocks
    batch = (pid_r // row_blocks).to(tl.int64)
    offs_r = (pid_r % row_blocks).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = (pid % col_blocks).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_rows = offs_r[:, None] < rows
    src = src_ptr + batch * stride_sb + offs_r[:, None] * stride_sr + offs_c[None, :] * stride_sc
    x = tl.load(src, mask=in_rows & (offs_c[None, :] < cols), other=0)
    dst = dst_ptr + (batch * rows + offs_r[:, None]) * cols_padded + offs_c[None, :]
    tl.store(dst, x, mask=in_rows & (offs_c[None, :] < cols_padded))


@triton.jit
def dropout_scale_kernel(
    src_ptr, dst_ptr, seed_ptr,
    rows, cols, rows_per_batch,
    stride_sb, stride_sr, stride_sc,
    dropout_p,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """``dst = src * keep / (1 - p)`` over a (rows, cols) output gradient (batches of
    ``rows_per_batch`` rows stacked, any strides), ``keep`` redrawn as :func:`matmul_kernel`'s
    epilogue drew it (:func:`dropout_factor`); dst contiguous.

    The backward of the epilogue's dropout: regenerating the mask from the seed costs integer
    work (Philox), where a saved mask would cost a write in the forward, a read here, and memory
    from forward to backward."""
    pid = tl.program_id(0)
    col_blocks = tl.cdiv(cols, BLOCK_C)
    col_start = (pid % col_blocks) * BLOCK_C
    offs_r = (pid // col_blocks).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = col_start.to(tl.int64) + tl.arange(0, BLOCK_C)
    inside = (offs_r[:, None] < rows) & (offs_c[None, :] < cols)
    row_start = (offs_r // rows_per_batch) * stride_sb + (offs_r % rows_per_batch) * stride_sr
    grad = tl.load(src_ptr + row_start[:, None] + offs_c[None, :] * stride_sc, mask=inside,
                   other=0.0)
    grad = grad.to(tl.float32) * dropout_factor(seed_ptr, offs_r, col_start, cols, dropout_p,
                                                BLOCK_R, BLOCK_C)
    tl.store(dst_ptr + offs_r[:, None] * cols + offs_c[None, :], grad.to(dst_ptr.dtype.element_ty),
             mask=inside)
