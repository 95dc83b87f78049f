"""Matrix multiplication, with the epilogue (bias, activation) fused in, in three steps.

1. **A naive tile.** Each program computes one ``BLOCK_M x BLOCK_N`` tile of ``C = A @ B``: it walks
   K in steps of ``BLOCK_K``, loads a ``BLOCK_M x BLOCK_K`` slice of A and a ``BLOCK_K x BLOCK_N``
   slice of B, and accumulates their ``tl.dot`` in fp32 registers. Each element of A is then read
   ``N / BLOCK_N`` times instead of ``N`` times: bigger tiles mean fewer bytes moved per FLOP, which
   is what turns a memory-bound loop into a tensor-core-bound one.
2. **Grouped ordering.** Programs run roughly in launch order. Row-major ordering (all of row 0 of
   C, then row 1) makes consecutive programs share one row-panel of A but stream *every* column
   panel of B through L2, which does not fit for large N. Launching tiles in groups of ``GROUP_M``
   rows, column by column, makes a wave of programs share ``GROUP_M`` panels of A and a few panels
   of B, so most loads hit L2 instead of HBM. Measured on an H100, fp16, 128x256x64 tiles:
   GROUP_M=8 against GROUP_M=1 (row-major) is 644 against 592 TFLOP/s at 8192³ and 663 against
   478 at 16384³, where B no longer fits in the 50 MB L2.
3. **Autotuning.** The best tile shape, pipeline depth and warp count depend on the GPU, the dtype
   and the problem shape. ``runtime.autotune`` benchmarks a short list of configs the first time it
   sees a new *bucket* of shapes (M, N and K rounded up to a power of two, so that a batch of
   ragged sequence lengths does not retune for every length), and caches the winner. In the
   interpreter it keeps only the first config, so that one is a good general one.

**Ragged shapes.** The loop is fast only while every load in it is a 16-byte vector: that is what
Hopper's asynchronous copies move, and what lets Triton keep several K steps in flight. Triton must
*prove* it from the launch arguments: a pointer counts as aligned when ``data_ptr % 16 == 0`` bytes,
but a stride only when ``stride % 16 == 0`` *elements*; and a mask along the contiguous dimension
must be constant over each vector, so its bound a multiple of 8 fp16 elements. A ragged K (7777) or
N (2100) broke both, and fp16 5012x2100x7777 ran at 95 TFLOP/s on an H100 (cuBLAS: ~120). So the
launcher copies an operand with strides Triton cannot see aligned into rows padded to 16 elements
(``_aligned``), and the main loop has no masks at all: it runs over whole ``BLOCK_K`` steps, with
the ragged end of K one masked step after it, and edge tiles read their rows past M (columns past
N) wrapped around to the start instead of masked; those land only in results never stored.

The epilogue (``+ bias``, then ReLU / leaky ReLU / GELU) runs on the fp32 accumulator before the
single store: ``act(A @ B + bias)`` costs one write of C instead of three passes over it.

Numerics: products are accumulated in fp32 whatever the input dtype and rounded once, on the store.
fp32 inputs follow PyTorch's TF32 setting (``torch.backends.cuda.matmul.allow_tf32``, or
``fp32_precision`` on torch >= 2.9; see :func:`tf32_enabled`): TF32 tensor cores when it is on,
exact fp32 (``input_precision="ieee"``) when it is off, so results match ``torch.matmul`` in both
modes. Triton's interpreter multiplies bf16 bit patterns wrongly in
``tl.dot`` (triton-lang/triton#11584), so there, and only there, bf16 tiles are widened to fp32
before the dot; products of bf16 values are exact in fp32, so the result is what the GPU computes.

Autograd: ``dA = dZ @ Bᵀ``, ``dB = Aᵀ @ dZ`` (both through this same kernel, reading the transposed
views in place) and ``dbias = Σ dZ``, where ``dZ`` is the gradient at the pre-activation
``Z = A @ B + bias``. ReLU and leaky ReLU (slope >= 0) get ``dZ`` from the saved *output* (its sign
is the sign of Z), so nothing extra is stored. GELU (and leaky ReLU with a negative slope) needs Z
itself; rather than keep a second M x N tensor alive from forward to backward, backward recomputes
Z with one more matmul (the trade activation checkpointing makes: memory for FLOPs).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op, wrap_triton

#: Public activation names; ``None`` means none. Inside the registered op "none" stands for None,
#: because a torch.library schema has no optional string with a meaning of its own.
ACTIVATIONS = ("relu", "leaky_relu", "gelu")
_OP_ACTIVATIONS = ("none",) + ACTIVATIONS
_BIAS_DTYPES = FLOAT_DTYPES + (torch.float64,)


def _config(bm, bn, bk, stages, warps, group_m=8):
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
        num_stages=stages,
        num_warps=warps,
    )


#: Tuned for the H100 (227 KB of shared memory per block, wgmma tensor cores). configs[0] is what
#: the interpreter runs and what a GPU falls back on when pruning leaves one config: 128x128x64 with
#: 3 stages fits shared memory in fp32 too (3 x (128x64 + 64x128) x 4 B = 192 KB).
CONFIGS = [
    _config(128, 128, 64, 3, 8),
    # fp16/bf16, large problems: 128x256x64 wins at 4096³ and 8192³ on an H100, 620-645 TFLOP/s
    # against cuBLAS's 685-745 (torch 2.11, Triton 3.6).
    _config(128, 256, 64, 3, 8),
    _config(256, 128, 64, 3, 8),
    _config(128, 128, 64, 4, 4),
    _config(64, 256, 32, 4, 4),
    _config(128, 64, 64, 4, 4),
    _config(64, 128, 64, 4, 4),
    # fp32 (TF32 or FMA): four bytes an element halve the K depth that fits. 128x256x32 is the
    # best TF32 tile when B is K-major (the nn.Linear case, b = w.t()): ~330 TFLOP/s at 4096³.
    _config(128, 256, 32, 3, 8),
    _config(128, 128, 32, 4, 4),
    _config(64, 128, 32, 4, 4),
    # Small or skinny problems: more, smaller tiles to fill 132 SMs.
    _config(64, 64, 64, 4, 4),
    _config(64, 32, 32, 5, 2),
    _config(32, 64, 32, 5, 2),
    _config(16, 64, 128, 4, 4, group_m=1),
]


#: The largest tile side any config uses: bounds an offset inside an output tile.
_MAX_BLOCK = max(max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in CONFIGS)


def _shared_memory_bytes(config: triton.Config, element_size: int) -> int:
    """What the software pipeline keeps in shared memory: one A and one B slice per stage."""
    kw = config.kwargs
    return config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * element_size


def prune_configs(configs, named_args, **kwargs):
    """Drop, before benchmarking, the configs that cannot win.

    Configs whose pipeline does not fit in shared memory would fail to launch; tiles much larger
    than the (padded) problem compute mostly padding; small tiles on a large problem (already
    thousands of tiles for 132 SMs) only re-read A and B more often. Never returns an empty list.
    """
    args = {**named_args, **kwargs}
    element_size = args["a_ptr"].element_size()
    limit = runtime.shared_memory_limit()
    fitting = [c for c in configs if _shared_memory_bytes(c, element_size) <= limit] or configs[:1]
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
    panels in L2 (see the module docstring)."""
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
def _epilogue(acc, offs_n, N, bias_ptr, stride_bias, slope,
              HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """``act(acc + bias)`` on the fp32 accumulator of the tile at columns ``offs_n``."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    return _apply_activation(acc, slope, ACTIVATION)


@runtime.autotune(
    configs=CONFIGS,
    # Buckets, not M/N/K: a new length in the same power-of-two bucket reuses the tuned config.
    # The precision is in the key because TF32 and IEEE fp32 favour different tiles.
    key=["M_BUCKET", "N_BUCKET", "K_BUCKET", "INPUT_PRECISION"],
    prune_configs_by={"early_config_prune": prune_configs},
)
@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET", "K_BUCKET"])
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr,
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_bias,
    slope,
    M_BUCKET, N_BUCKET, K_BUCKET,
    A_M_GRAIN: tl.constexpr, A_K_GRAIN: tl.constexpr,
    B_K_GRAIN: tl.constexpr, B_N_GRAIN: tl.constexpr,
    INT32_TILE_OFFSETS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """``act(A @ B + bias)``, one output tile a program.

    Each ``*_GRAIN`` (from :func:`_grain`) is the multiple of elements the kernel may round that
    operand dimension up to when it reads: the elements in 16 bytes along the contiguous dim of
    an aligned operand, where the compiler moves 16-byte vectors (the extra elements lie in the
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
    # 16-byte vectors where K is contiguous (2-byte loads, one 64-bit address each, cost ~50 more
    # registers a thread for the whole kernel: fewer tiles resident per SM); what they read past
    # K is then zeroed on both sides, since the padding may hold anything and NaN * 0 is NaN.
    k_left = K - k_full * BLOCK_K
    if k_left > 0:
        in_k = offs_k < k_left
        a = tl.load(a_ptrs, mask=offs_k[None, :] < tl.cdiv(k_left, A_K_GRAIN) * A_K_GRAIN, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < tl.cdiv(k_left, B_K_GRAIN) * B_K_GRAIN, other=0.0)
        a = tl.where(in_k[None, :], a, 0.0)
        b = tl.where(in_k[:, None], b, 0.0)
        acc = _mma(a, b, acc, INPUT_PRECISION, DOT_IN_FP32)

    # Epilogue on the fp32 accumulator, before the one rounding to the output dtype.
    acc = _epilogue(acc, offs_n, N, bias_ptr, stride_bias, slope, HAS_BIAS, ACTIVATION)

    # One 64-bit address for the tile's corner, 32-bit offsets within it (INT32_TILE_OFFSETS:
    # the launcher checked they fit), masks against what is left of M and N past the corner.
    # A 64-bit offset and a mask per element held ~80 more registers a thread on a ragged M and N
    # (210 against 126 at 128x128: one tile resident per SM instead of two) and made the GELU
    # epilogue spill at 128x256.
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
    a_desc, b_desc, c_desc, c_ptr, bias_ptr,
    M, N, K,
    stride_cm, stride_bias,
    slope,
    A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr, C_TMA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
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
        acc = _epilogue(acc, offs_n, N, bias_ptr, stride_bias, slope, HAS_BIAS, ACTIVATION)
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


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
def _batch_size(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The batch of the result, or None for a 2-D product. A 2-D operand, or a batch of 1, is
    broadcast (read with batch stride 0) against the other's batch."""
    if a.dim() == 2 and b.dim() == 2:
        return None
    batches = [t.shape[0] for t in (a, b) if t.dim() == 3]
    return max(batches) if min(batches) == 1 else batches[0]


def _out_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    batch = _batch_size(a, b)
    mn = (a.shape[-2], b.shape[-1])
    return mn if batch is None else (batch, *mn)


def _batch_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.dim() == 3 and t.shape[0] != 1 else 0



def tf32_enabled() -> bool:
    """Whether PyTorch would use TF32 for an fp32 matmul on CUDA right now.

    torch >= 2.9 keeps the setting as ``torch.backends.cuda.matmul.fp32_precision`` (read here
    already resolved through its parents, so ``torch.backends.fp32_precision = "tf32"`` counts);
    the legacy ``allow_tf32`` is kept in sync when it is *set*, but reading it raises once the two
    APIs were mixed. Older torch has only ``allow_tf32`` (which ``set_float32_matmul_precision``
    also drives).
    """
    backend = torch.backends.cuda.matmul
    precision = getattr(backend, "fp32_precision", None)
    if precision is not None:
        return precision == "tf32"
    return bool(backend.allow_tf32)


def _k_major(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands laid out with K contiguous, as Hopper's TF32 tensor-core instruction reads them.

    With a row-major (K, N) B, Triton re-lays every tile out and TF32 ran at ~85 TFLOP/s on an
    H100 (cuBLAS: ~370); with B = w.t() (K-major) it reached ~330. A copy of B (one read and one
    write, a few percent of a large product's time) is far cheaper than that difference. Only
    on the GPU: the interpreter has no such instruction."""
    if runtime.INTERPRET:
        return a, b
    return _aligned(a, contiguous_dim=-1), _aligned(b, contiguous_dim=-2)


# On the GPU, operands Triton cannot prove 16-byte aligned are copied into aligned storage first
# (see _aligned). The interpreter reads them in place, which keeps that path tested on CPU.
ALIGN_OPERANDS = not runtime.INTERPRET

#: Triton specialises an integer argument (a stride) as "divisible by 16" when its *value* is,
#: i.e. in elements, whatever the dtype; no weaker divisibility is ever assumed.
_STRIDE_UNIT = 16


def _contiguous_dim(t: torch.Tensor) -> int | None:
    """Which of the last two dims is contiguous (-1 or -2): the one with unit stride, else one of
    size 1 (a single row or column, whatever its stride); None when neither is."""
    for dim in (-1, -2):
        if t.stride(dim) == 1 and t.shape[dim] > 1:
            return dim
    for dim in (-1, -2):
        if t.shape[dim] == 1:
            return dim
    return None


def _is_aligned(t: torch.Tensor) -> bool:
    """Whether Triton can read ``t`` with 16-byte loads, judging from the launch arguments alone.

    It specialises a pointer on ``data_ptr % 16`` bytes but a stride only on ``stride % 16``
    *elements*: an fp16 row of 7784 elements, 16-byte aligned, still compiles to 2-byte loads.
    So: one contiguous dim, and every other stride a multiple of 16 elements. A matrix with no
    unit stride (``b[:, ::2]``) is gathered element by element and fails this, as does an
    overlapping view with two. The storage offset stands in for data_ptr(): fake tensors under
    torch.compile have no data pointer, and PyTorch's allocators hand out storage aligned to far
    more than 16 bytes."""
    dim = _contiguous_dim(t)
    if dim is None or (t.storage_offset() * t.element_size()) % 16 != 0:
        return False
    contiguous = t.dim() + dim
    return all(
        t.stride(d) % _STRIDE_UNIT == 0 for d in range(t.dim()) if d != contiguous and t.shape[d] > 1
    )


def _aligned(t: torch.Tensor, contiguous_dim: int | None = None) -> torch.Tensor:
    """``t`` itself, or a copy laid out with ``contiguous_dim`` (by default the one already
    contiguous) contiguous and its rows padded to a multiple of 16 elements (see _is_aligned).

    Unaligned, the product falls to 2-byte loads and loses its software pipeline: fp16
    5012x2100x7777 ran at 95 TFLOP/s on an H100, against ~510 for torch.compile, which pads.
    The copy costs about one read and one write of the operand. Its padding is zeros, and the
    kernel never lets it reach a stored result anyway (see matmul_kernel)."""
    dim = contiguous_dim if contiguous_dim is not None else _contiguous_dim(t)
    if dim is None:
        dim = -1  # strided both ways: make rows contiguous
    if _is_aligned(t) and (t.stride(dim) == 1 or t.shape[dim] == 1):
        return t
    src = t if dim == -1 else t.transpose(-1, -2)  # (..., rows, cols), cols to become contiguous
    rows, cols = src.shape[-2:]
    padded = runtime.cdiv(cols, _STRIDE_UNIT) * _STRIDE_UNIT
    buf = t.new_empty((*src.shape[:-1], padded))
    batch = src.shape[0] if src.dim() == 3 else 1
    block_r, block_c = 32, 128
    grid = (batch * runtime.cdiv(rows, block_r) * runtime.cdiv(padded, block_c),)
    with runtime.device_guard(t):
        wrap_triton(pad_copy_kernel)[grid](
            src, buf, rows, cols, padded,
            src.stride(0) if src.dim() == 3 else 0, src.stride(-2), src.stride(-1),
            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4,
        )  # fmt: skip
    view = buf[..., :cols]
    return view if dim == -1 else view.transpose(-1, -2)


def _grain(t: torch.Tensor, dim: int) -> int:
    """How far matmul_kernel may read past the end of ``t``'s dim ``dim``: to a whole number of
    16-byte vectors, in elements, where ``dim`` is the contiguous dim of an aligned operand (the
    compiler reads such vectors along it, so wrapping or masking at a finer grain would misalign
    them or break them up); 1, nothing past the end, elsewhere. Those reads stay within the last
    16-byte sector of the row, or its padding."""
    if t.shape[dim] > 1 and t.stride(dim) == 1 and _is_aligned(t):
        return 16 // t.element_size()
    return 1


def input_precision(dtype: torch.dtype) -> str:
    """The ``tl.dot`` precision a product of ``dtype`` operands runs in: "tf32" or "ieee"."""
    if dtype == torch.float32 and tf32_enabled():
        return "tf32"
    # fp32 with TF32 off; fp16 and bf16 dots are exact products either way.
    return "ieee"


def launch_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    slope: float = 0.0,
) -> torch.Tensor:
    """``out = act(a @ b + bias)`` through :func:`matmul_kernel`; returns ``out``.

    What every caller needs between checked inputs and the launch, written once: the TF32
    operand layout, the aligned copies, the grid, the autotuning buckets, the grains. Shapes as
    ``_out_shape`` gives them (``out`` of any strides), no dimension empty, K included. The
    host function other op families call for a product (arguments already checked)."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = out.shape[0] if out.dim() == 3 else 1
    precision = input_precision(a.dtype)
    if precision == "tf32":
        a, b = _k_major(a, b)
    if ALIGN_OPERANDS:
        a, b = _aligned(a), _aligned(b)
    if _use_tma(a, b, out, precision):
        return _launch_matmul_tma(a, b, out, bias=bias, activation=activation, slope=slope)
    # A placeholder, never read: HAS_BIAS is off.
    bias_arg = bias if bias is not None else out

    def grid(meta):
        return (batch * triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    with runtime.device_guard(a):
        wrap_triton(matmul_kernel)[grid](
            a, b, out, bias_arg,
            M, N, K,
            _batch_stride(a), a.stride(-2), a.stride(-1),
            _batch_stride(b), b.stride(-2), b.stride(-1),
            out.stride(0) if out.dim() == 3 else 0, out.stride(-2), out.stride(-1),
            bias.stride(0) if bias is not None else 0,
            slope,
            runtime.bucket(M), runtime.bucket(N), runtime.bucket(K),
            A_M_GRAIN=_grain(a, -2), A_K_GRAIN=_grain(a, -1),
            B_K_GRAIN=_grain(b, -2), B_N_GRAIN=_grain(b, -1),
            INT32_TILE_OFFSETS=bool(_MAX_BLOCK * (out.stride(-2) + out.stride(-1)) < 2**31),
            HAS_BIAS=bias is not None,
            ACTIVATION=activation,
            INPUT_PRECISION=precision,
            DOT_IN_FP32=runtime.INTERPRET and a.dtype == torch.bfloat16,
        )  # fmt: skip
    return out


#: Whether 2-D fp16/bf16 products run through :func:`matmul_tma_kernel`: None picks it on Hopper
#: GPUs (compute capability 9.x, where it was measured) for products of at least a wave of tiles;
#: True always (tests force it in the interpreter), False never.
TMA_MATMUL: bool | None = None

#: matmul_tma_kernel's config. Not autotuned: a persistent grid is the SM count whatever the
#: config, and this one won, or tied within 2%, at every shape measured on an H100 (fp16 4096³,
#: 8192³, 8192x4096x4096 with a K-major B: 100-104% of cuBLAS, against 92-94% for matmul_kernel;
#: ``diagnose.py tma``). 128x256x64 tiles, 3 stages: 3 x 48 KB of operands plus the 64 KB output
#: tile staged for its TMA store fit the 227 KB of shared memory; 4 stages do not.
TMA_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3,
              "num_warps": 8, "FLATTEN": True, "WARP_SPECIALIZE": False}


@functools.lru_cache(maxsize=None)
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can describe the 2-D ``t`` as it lies: one dim of unit stride,
    the other's stride a multiple of 16 bytes, the start 16-byte aligned."""
    size = t.element_size()
    if t.data_ptr() % 16 != 0:
        return False
    return (t.stride(1) == 1 and t.stride(0) * size % 16 == 0) or (
        t.stride(0) == 1 and t.stride(1) * size % 16 == 0)


def _use_tma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, precision: str) -> bool:
    """Whether this (aligned) product goes to :func:`matmul_tma_kernel` (see TMA_MATMUL)."""
    if TMA_MATMUL is False or out.dim() != 2 or a.dim() != 2 or b.dim() != 2:
        return False
    if a.dtype not in (torch.float16, torch.bfloat16) or precision != "ieee":
        return False
    if not runtime.launching_directly():
        return False  # torch.compile traces matmul_kernel (no descriptors to trace)
    if TMA_MATMUL is None:
        if runtime.INTERPRET or a.device.type != "cuda" or not _is_hopper(a.device.index or 0):
            return False
        M, N = out.shape
        tiles = runtime.cdiv(M, TMA_CONFIG["BLOCK_M"]) * runtime.cdiv(N, TMA_CONFIG["BLOCK_N"])
        if tiles < runtime.num_sms(a.device) or a.shape[1] < 4 * TMA_CONFIG["BLOCK_K"]:
            return False
    return _tma_ready(a) and _tma_ready(b) and out.stride(1) == 1


def _descriptor(t: torch.Tensor, block: tuple[int, int]):
    """A TMA descriptor of the 2-D ``t`` over its memory as it lies: dims ordered so that the
    contiguous one is last, ``block`` given in ``t``'s (rows, cols) order."""
    if t.stride(1) == 1:
        return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block))
    return TensorDescriptor(t, [t.shape[1], t.shape[0]], [t.stride(1), t.stride(0)],
                            [block[1], block[0]])  # fmt: skip


def _launch_matmul_tma(a, b, out, *, bias=None, activation="none", slope=0.0, config=None):
    """``out = act(a @ b + bias)`` through :func:`matmul_tma_kernel` (see ``_use_tma``):
    ``a``, ``b`` 2-D and TMA-ready, ``out`` 2-D with a unit stride."""
    cfg = dict(TMA_CONFIG if config is None else config)
    bm, bn, bk = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    M, K = a.shape
    N = b.shape[1]
    c_tma = out.stride(1) == 1 and _tma_ready(out)
    sms = runtime.num_sms(a.device)
    grid = (min(sms, runtime.cdiv(M, bm) * runtime.cdiv(N, bn)),)
    with runtime.device_guard(a):
        wrap_triton(matmul_tma_kernel)[grid](
            _descriptor(a, (bm, bk)), _descriptor(b, (bk, bn)),
            _descriptor(out, (bm, bn)) if c_tma else None,
            out, bias if bias is not None else out,
            M, N, K, out.stride(0), bias.stride(0) if bias is not None else 0, slope,
            A_K_MAJOR=a.stride(1) == 1, B_K_MAJOR=b.stride(1) != 1,  # as _descriptor lays them
            C_TMA=c_tma,
            HAS_BIAS=bias is not None,
            ACTIVATION=activation, INPUT_PRECISION="ieee",
            DOT_IN_FP32=runtime.INTERPRET and a.dtype == torch.bfloat16,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_SMS=sms, **cfg,
        )  # fmt: skip
    return out

def _activation_torch(z: torch.Tensor, activation: str, slope: float) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(z)
    if activation == "leaky_relu":
        return torch.nn.functional.leaky_relu(z, slope)
    if activation == "gelu":
        return torch.nn.functional.gelu(z, approximate="tanh")
    return z


def _matmul_fake(a, b, bias, activation, slope):
    return a.new_empty(_out_shape(a, b))


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by the public functions below).
# --------------------------------------------------------------------------------------------
@register_op("matmul", fake=_matmul_fake, autocast="lower_precision_fp")  # as torch.matmul
def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: str,
    slope: float,
) -> torch.Tensor:
    if activation not in _OP_ACTIVATIONS:
        raise ValueError(f"activation must be one of {_OP_ACTIVATIONS}, got {activation!r}")
    shape = _out_shape(a, b)
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = 1 if len(shape) == 2 else shape[0]

    if M == 0 or N == 0 or batch == 0:
        return a.new_empty(shape)
    if K == 0:
        # An empty sum is 0, so the result is the epilogue applied to zeros: no kernel needed.
        z = torch.zeros(shape, dtype=torch.float32, device=a.device)
        if bias is not None:
            z = z + bias.to(torch.float32)
        return _activation_torch(z, activation, slope).to(a.dtype)

    out = a.new_empty(shape)
    return launch_matmul(a, b, out, bias=bias, activation=activation, slope=slope)


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _needs_preactivation(activation: str, slope: float) -> bool:
    # ReLU and leaky ReLU with slope >= 0 keep the sign of their input: out > 0 exactly when
    # Z > 0, so the output alone tells which branch each element took.
    return activation == "gelu" or (activation == "leaky_relu" and slope < 0)


def _matmul_setup_context(ctx, inputs, output):
    a, b, bias, activation, slope = inputs
    ctx.activation = activation
    ctx.slope = slope
    keep_output = activation != "none" and not _needs_preactivation(activation, slope)
    ctx.save_for_backward(a, b, bias, output if keep_output else None)


def _preactivation_grad(ctx, grad, a, b, bias, out):
    activation, slope = ctx.activation, ctx.slope
    if activation == "none":
        return grad
    if not _needs_preactivation(activation, slope):
        negative_side = grad * slope if activation == "leaky_relu" else 0.0
        return torch.where(out > 0, grad, negative_side)
    # Recompute Z = A @ B + bias instead of having saved it (see the module docstring).
    z = _matmul(a, b, bias, "none", 0.0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    return torch.where(z > 0, grad, grad * slope)


def _matmul_backward(ctx, grad):
    a, b, bias, out = ctx.saved_tensors
    grad_z = _preactivation_grad(ctx, grad, a, b, bias, out)
    grad_a = grad_b = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_a = matmul(grad_z, b.transpose(-1, -2)).sum_to_size(a.shape)
    if ctx.needs_input_grad[1]:
        if b.dim() == 2 and a.dim() == 3:
            # b was shared by every batch: one (K, B*M) @ (B*M, N) product sums over the batch
            # inside the fp32 accumulator instead of materialising B partial gradients.
            # Explicit row counts: reshape(-1, 0) is ambiguous when K or N is 0.
            K, N = b.shape
            rows = a.shape[0] * a.shape[1]
            grad_b = matmul(a.reshape(rows, K).t(), grad_z.reshape(rows, N))
        else:
            grad_b = matmul(a.transpose(-1, -2), grad_z).sum_to_size(b.shape)
    if bias is not None and ctx.needs_input_grad[2]:
        rows = tuple(range(grad_z.dim() - 1))
        grad_bias = grad_z.sum(dim=rows, dtype=torch.float32).to(bias.dtype)
    return grad_a, grad_b, grad_bias, None, None


_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup_context)


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------
def check_activation(activation, leaky_relu_slope) -> str:
    if activation is None or activation == "none":
        op_activation = "none"
    elif isinstance(activation, str) and activation in ACTIVATIONS:
        op_activation = activation
    else:
        valid = ", ".join(["None"] + [repr(name) for name in ACTIVATIONS])
        raise ValueError(f"activation must be one of {valid}; got {activation!r}")
    if isinstance(leaky_relu_slope, bool) or not isinstance(leaky_relu_slope, (int, float)):
        raise TypeError(
            f"leaky_relu_slope must be a float, got {type(leaky_relu_slope).__name__}"
        )
    return op_activation


def _check_matmul_args(a, b, bias, activation, leaky_relu_slope) -> str:
    runtime.check_tensor(a, "a", dtypes=FLOAT_DTYPES, ndim=(2, 3))
    runtime.check_tensor(b, "b", dtypes=FLOAT_DTYPES, ndim=(2, 3))
    runtime.check_same_dtype(a=a, b=b)
    if bias is not None:
        runtime.check_tensor(bias, "bias", dtypes=_BIAS_DTYPES, ndim=1)
    runtime.check_same_device(a=a, b=b, bias=bias)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"a has K={a.shape[-1]} but b has K={b.shape[-2]}: inner dimensions must match "
            f"(a is {tuple(a.shape)}, b is {tuple(b.shape)})"
        )
    if a.dim() == 3 and b.dim() == 3 and 1 not in (a.shape[0], b.shape[0]):
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"batch sizes differ: a has batch {a.shape[0]} but b has batch {b.shape[0]} "
                "(they must be equal, or one of them 1)"
            )
    if bias is not None and bias.shape[0] != b.shape[-1]:
        raise ValueError(
            f"bias must have shape (N,) = ({b.shape[-1]},) to match b, got {tuple(bias.shape)}"
        )
    return check_activation(activation, leaky_relu_slope)


@runtime.follows_autocast(_matmul)
def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    leaky_relu_slope: float = 0.01,
) -> torch.Tensor:
    """``activation(a @ b + bias)`` in one Triton kernel.

    ``a`` is (M, K) or (B, M, K), ``b`` is (K, N) or (B, K, N); a 2-D operand or a batch of 1 is
    broadcast against the other's batch. Any strides (transposed, sliced views are read in place).
    fp16, bf16 or fp32, both the same; the result has that dtype, accumulated in fp32 (fp32 inputs
    follow ``torch.backends.cuda.matmul.allow_tf32``). ``bias`` is (N,), any float dtype.
    ``activation`` is None, ``"relu"``, ``"leaky_relu"`` (negative slope ``leaky_relu_slope``) or
    ``"gelu"`` (tanh approximation). Differentiable in ``a``, ``b`` and ``bias``.
    """
    op_activation = _check_matmul_args(a, b, bias, activation, leaky_relu_slope)
    return _matmul(a, b, bias, op_activation, float(leaky_relu_slope))


@runtime.follows_autocast(_matmul)  # as F.linear
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    leaky_relu_slope: float = 0.01,
) -> torch.Tensor:
    """``activation(x @ weight.T + bias)``, like ``torch.nn.functional.linear`` plus an activation.

    ``x`` is (..., in_features), ``weight`` (out_features, in_features). The leading dimensions of
    ``x`` are flattened into M (one large product fills the GPU better than many small ones) and
    ``weight.T`` is read in place, without a copy. A 3-D ``x`` whose leading dimensions cannot be
    merged without a copy (``x.transpose(0, 1)``, say) runs as a batched product against the
    shared weight instead, also without a copy.
    """
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=2)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension, got a scalar")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has in_features={x.shape[-1]} but weight has in_features={weight.shape[1]} "
            f"(weight is (out_features, in_features) = {tuple(weight.shape)})"
        )
    runtime.check_same_dtype(x=x, weight=weight)
    if x.dim() == 1:
        rows = x[None]
    elif x.dim() == 3 and x.shape[0] > 1 and x.shape[1] > 1 and x.stride(0) != x.stride(1) * x.shape[1]:
        rows = x  # flattening would copy
    else:
        rows = x.flatten(0, -2)
    out = matmul(
        rows, weight.t(), bias=bias, activation=activation, leaky_relu_slope=leaky_relu_slope
    )
    return out.reshape(*x.shape[:-1], weight.shape[0])
