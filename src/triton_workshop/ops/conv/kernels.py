"""The conv2d kernels: an implicit GEMM on the tensor cores, and a direct depthwise kernel.

``conv2d_implicit_gemm_kernel`` computes a convolution as a matrix product (output pixels x
filters, K = channels x taps) without building the im2col matrix: each K step gathers its slice of
it straight from ``x``, the masked loads' zeros being the padding. ``conv2d_depthwise_kernel``
handles one input channel per group with plain FMAs. Both accumulate in fp32 and round once on
the store, after the bias. Their configs and pruning are here too; the host code (plans, the
registered op, autograd, ``conv2d``) is in ``__init__.py``, the long "why" in
``docs/kernels/conv.md``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import runtime
from .._common import gemm_shared_memory_bytes

__all__ = [
    "DEPTHWISE_CONFIGS",
    "GEMM_CONFIGS",
    "conv2d_depthwise_kernel",
    "conv2d_implicit_gemm_kernel",
    "depthwise_config",
    "gemm_config",
    "gemm_shared_memory_bytes",
    "prune_depthwise_configs",
    "prune_gemm_configs",
]


def gemm_config(bm, bn, bk, stages, warps):
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_stages=stages, num_warps=warps
    )


#: Tuned on the GPU machine around the workshop's benchmark layer (a 3x3 fp16 layer whose 64
#: filters make N one 64-wide tile; see docs/kernels/conv.md), so the choice is how tall a tile is
#: (M), how deep a step is (K) and how many programs share an SM. A step is a handful of
#: tensor-core instructions, so hiding its loads takes several programs per SM: each entry below
#: leaves room for 2 to 4 (shared memory ``stages * (BLOCK_M + BLOCK_N) * BLOCK_K * 2`` bytes, and
#: registers, none spilled). configs[0] is what the interpreter runs and a good default everywhere:
#: 128-row tiles fill the SMs in even waves on that layer, and BLOCK_K = 64 is one whole tap of 64
#: channels per step.
GEMM_CONFIGS = [
    gemm_config(128, 64, 64, 3, 4),
    # The benchmark layer and its neighbours. 128 x 64 x 32, 4 stages: the autotuner's pick before
    # the default above (4 programs an SM). 2 stages of 64-deep steps: 4 programs an SM with half
    # the steps.
    gemm_config(128, 64, 32, 4, 4),
    gemm_config(128, 64, 64, 2, 4),
    # 256-row tiles read each weight slice for twice the pixels (half the weight traffic from
    # L2), 2 programs an SM; deeper pipelines would leave room for one only.
    gemm_config(256, 64, 32, 4, 8),
    gemm_config(256, 64, 64, 2, 8),
    # Wider layers (F per group >= 128): a 128x128 tile uses each gathered input row twice as often.
    gemm_config(128, 128, 64, 3, 8),
    gemm_config(128, 128, 32, 4, 4),
    # Narrow layers or few pixels (late stages of a network, small batches): more, smaller tiles.
    gemm_config(64, 64, 64, 4, 4),
    gemm_config(128, 32, 64, 4, 4),
    gemm_config(64, 32, 32, 4, 4),
    gemm_config(64, 16, 32, 4, 2),
]


def depthwise_config(bm, bf, warps):
    return triton.Config({"BLOCK_M": bm, "BLOCK_F": bf}, num_stages=1, num_warps=warps)


#: The depthwise kernel is memory-bound (one FMA per loaded element per tap; the taps re-read
#: neighbouring pixels from L1/L2). configs[0]: 64 pixels x 64 channels = 4096 outputs, 32 a thread;
#: in channels-last a row of 64 fp16 channels is one 128-byte line.
DEPTHWISE_CONFIGS = [
    depthwise_config(64, 64, 4),
    depthwise_config(128, 32, 4),
    depthwise_config(32, 128, 4),
    depthwise_config(128, 64, 8),
    # NCHW input: pixels, not channels, are contiguous, so tall thin tiles load better.
    depthwise_config(256, 16, 4),
    depthwise_config(512, 16, 8),
]


# --------------------------------------------------------------------------------------------
# Config pruning (GPU only: the interpreter runs configs[0] and never prunes).
# --------------------------------------------------------------------------------------------
def prune_gemm_configs(configs, named_args, **kwargs):
    """Drop, before benchmarking, configs that cannot launch or that compute mostly padding.

    Pruned: pipelines that overflow shared memory; tiles taller than the (bucketed) pixel count or
    wider than the filters of a group; in channel-tiled mode a BLOCK_K that does not divide the
    channels of a group (the last step of every tap would be partly empty). Never returns an
    empty list.
    """
    args = {**named_args, **kwargs}
    element_size = args["x_ptr"].element_size()
    limit = runtime.shared_memory_limit()
    fitting = [c for c in configs if gemm_shared_memory_bytes(c, element_size) <= limit]
    fitting = fitting or configs[:1]
    group_c, group_f = args["GROUP_C"], args["GROUP_F"]
    k_total = args["KH"] * args["KW"] * group_c

    def k_fits(block_k: int) -> bool:
        if args["CHANNEL_TILED"]:
            return group_c % block_k == 0
        return block_k <= max(triton.next_power_of_2(k_total), 32)

    sized = [
        c
        for c in fitting
        if c.kwargs["BLOCK_M"] <= max(args["M_BUCKET"], 64)
        and c.kwargs["BLOCK_N"] <= max(triton.next_power_of_2(group_f), 16)
        and k_fits(c.kwargs["BLOCK_K"])
    ]
    return sized or fitting


def prune_depthwise_configs(configs, named_args, **kwargs):
    """Drop tiles much wider than the filters or taller than the pixels. Never empty."""
    args = {**named_args, **kwargs}
    sized = [
        c
        for c in configs
        if c.kwargs["BLOCK_F"] <= max(triton.next_power_of_2(args["F"]), 16)
        and c.kwargs["BLOCK_M"] <= max(args["M_BUCKET"], 64)
    ]
    return sized or configs[:1]


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
@triton.jit
def _output_pixels(pid_m, M, OHW, BLOCK_M: tl.constexpr):
    """The ``BLOCK_M`` output pixels of tile ``pid_m``: image ``n``, pixel ``oh * OW + ow`` within
    the image, and the in-range mask.

    int64 from the start: M = N * OH * OW and n * stride_n can pass 2**31 on large batches. The
    divisions run once per program, not once per K step. Dividing by ``OHW`` (not by OW, then OH)
    is what lets the compiler vectorise the NCHW store: when Triton sees ``OHW`` divisible by 16
    (it specialises on that), it can prove runs of 16 consecutive rows belong to one image and
    have consecutive ``pixel``, i.e. neighbouring addresses in an NCHW output.
    """
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    n = offs_m // OHW
    pixel = offs_m % OHW
    return n, pixel, mask_m


@triton.jit
def _outer_add(rows, cols, PIXEL_MAJOR: tl.constexpr):
    """rows[:, None] + cols[None, :] as a (rows, cols) tile, or, PIXEL_MAJOR, as its transpose.

    Every 2-D index and mask of a tile is built through this (and :func:`_outer_and`), so that one
    flag flips the whole tile. Why flip: Triton lays a tile out with consecutive threads along its
    *last* axis when it cannot prove either axis contiguous, which is the case for gathered pixels.
    In NCHW the pixels (rows) are the neighbours in memory, so the pixel axis goes last and a warp
    reads runs of neighbouring pixels instead of 32 channels H*W elements apart.
    """
    if PIXEL_MAJOR:
        return cols[:, None] + rows[None, :]
    else:
        return rows[:, None] + cols[None, :]


@triton.jit
def _outer_and(rows, cols, PIXEL_MAJOR: tl.constexpr):
    if PIXEL_MAJOR:
        return cols[:, None] & rows[None, :]
    else:
        return rows[:, None] & cols[None, :]


@triton.jit
def _store_output(y_ptr, values, n, pixel, mask_m, filters, mask_f,
                  stride_yn, stride_yc, stride_yp, PIXEL_MAJOR: tl.constexpr):  # fmt: skip
    """Store an fp32 tile at y[n, f, pixel], rounded once to y's dtype: (pixels, filters), or
    (filters, pixels) when ``PIXEL_MAJOR`` (NCHW y), built through :func:`_outer_add` like x's.

    ``stride_yp`` is the stride of one pixel ``oh * OW + ow`` (the launcher allocates y, so H and
    W are always one run of pixels). In NCHW consecutive lanes then walk pixels, which are
    contiguous in memory: 16-byte vector stores when ``OHW`` is a multiple of 16 (see
    :func:`_output_pixels`). In channels-last they walk filters, contiguous there.
    """
    out = values.to(y_ptr.dtype.element_ty)
    y_rows = n * stride_yn + pixel * stride_yp
    y_ptrs = y_ptr + _outer_add(y_rows, filters * stride_yc, PIXEL_MAJOR)
    tl.store(y_ptrs, out, mask=_outer_and(mask_m, mask_f, PIXEL_MAJOR))


@runtime.autotune(
    configs=GEMM_CONFIGS,
    # The layer's geometry (bucketed pixel count, channels and filters per group, kernel size) and
    # the input layout (stride_xc is 1 in channels-last) decide the best tile; the dtypes of the
    # tensor arguments are added to the key by Triton itself.
    key=["M_BUCKET", "GROUP_C", "GROUP_F", "KH", "KW", "stride_xc", "INPUT_PRECISION"],
    prune_configs_by={"early_config_prune": prune_gemm_configs},
)
@triton.jit(do_not_specialize=["M_BUCKET"])
def conv2d_implicit_gemm_kernel(
    x_ptr, w_ptr, y_ptr, bias_ptr,
    H, W, OW, OHW, M,
    GROUP_C, GROUP_F,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wf, stride_wk,
    stride_yn, stride_yc, stride_yp,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dilation_h, dilation_w,
    M_BUCKET,
    KH: tl.constexpr, KW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CHANNEL_TILED: tl.constexpr,
    EVEN_CHANNELS: tl.constexpr,
    X_PIXEL_MAJOR: tl.constexpr,
    Y_PIXEL_MAJOR: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[n, f, oh, ow] = bias[f] + sum over (kh, kw, c) of x[n, c, ih, iw] * w[f, c, kh, kw].

    ``w`` holds the weight as a K x F matrix, K ordered like the gathered columns,
    ``k = (kh*KW + kw)*GROUP_C + c``: ``w[f, k]`` is at ``f * stride_wf + k * stride_wk``. The
    launcher passes the channel-tiled mode the weight in channels-last memory, (F, KH, KW,
    GROUP_C): K-contiguous rows (``stride_wk`` = 1), 16-byte loads along K, the K-major operand
    TF32 tensor cores require. Flat K gets a (KH, KW, GROUP_C, F) copy, contiguous along F
    (``stride_wf`` = 1): its K rows (27 for an RGB 3x3) are rarely 16-byte multiples, F often is.
    ``pad_h``/``pad_w`` are the top/left padding; bottom/right padding only shows in OH/OW (reads
    past the edge are masked to zero). ``bias`` is contiguous.
    ``X_PIXEL_MAJOR`` / ``Y_PIXEL_MAJOR``: x / y is NCHW-like (see :func:`_outer_add`); the input
    slice is then gathered as (BLOCK_K, BLOCK_M) and transposed for the dot.
    """
    # Filter tiles vary fastest: the programs of one pixel tile run together and share its gathered
    # input rows in L2. Axis 1 is the group.
    pid = tl.program_id(0)
    group = tl.program_id(1)
    num_pid_n = tl.cdiv(GROUP_F, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n

    n, pixel, mask_m = _output_pixels(pid_m, M, OHW, BLOCK_M)
    pixel32 = pixel.to(tl.int32)
    # Top-left corner of each row's window; tap (kh, kw) adds (kh * dilation_h, kw * dilation_w).
    # Rows past M get a corner far above the image, so the bounds test alone masks them out.
    ih0 = tl.where(mask_m, (pixel32 // OW) * conv_stride_h - pad_h, -(2**30))
    iw0 = (pixel32 % OW) * conv_stride_w - pad_w
    # The image of each row, and the first channel of this group.
    x_rows = x_ptr + n * stride_xn + (group * GROUP_C).to(tl.int64) * stride_xc

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < GROUP_F
    filters = (group * GROUP_F + offs_n).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    k_total = KH * KW * GROUP_C
    w_filters = w_ptr + filters * stride_wf

    if CHANNEL_TILED:
        k_steps = KH * KW * tl.cdiv(GROUP_C, BLOCK_K)
        # Everything per row or per column is computed once: a step only adds its tap's offset
        # (one scalar) to the pointers and its tap's shift to the bounds test.
        corner = x_rows + ih0.to(tl.int64) * stride_xh + iw0.to(tl.int64) * stride_xw
        x_tile = _outer_add(corner, offs_k.to(tl.int64) * stride_xc, X_PIXEL_MAJOR)
        w_tile = w_filters[None, :] + (offs_k * stride_wk)[:, None]
        # tl.cast, not H.to(): a launch with H (or W) equal to 1 passes it as a Python int
        # constant (Triton specialises integer arguments equal to 1), which has no .to().
        height = tl.cast(H, tl.uint32)
        width = tl.cast(W, tl.uint32)
    else:
        k_steps = tl.cdiv(k_total, BLOCK_K)
    # (tap row, tap column, first channel) of the step: counters, not a division per step.
    kh = 0 * k_steps
    kw = 0 * k_steps
    c0 = 0 * k_steps

    # fp32 accumulator whatever the inputs: K = 576 fp16 products would lose their low bits in an
    # fp16 running sum.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, k_steps):
        if CHANNEL_TILED:
            # One tap, BLOCK_K consecutive channels: one (ih, iw) per row, so the bounds mask is
            # per row and (in channels-last) the channels of a row are contiguous.
            dh = kh * dilation_h
            dw = kw * dilation_w
            # 0 <= ih < H in one unsigned comparison (a negative ih wraps to a huge one).
            inside = (((ih0 + dh).to(tl.uint32, bitcast=True) < height)
                      & ((iw0 + dw).to(tl.uint32, bitcast=True) < width))  # fmt: skip
            if EVEN_CHANNELS and 64 % BLOCK_K == 0:
                # Whole BLOCK_K blocks of channels (a multiple of 64 per group): no tail to mask.
                k_mask = offs_k < BLOCK_K
            else:
                k_mask = (c0 + offs_k) < GROUP_C
            x_mask = _outer_and(inside, k_mask, X_PIXEL_MAJOR)
            x_ptrs = x_tile + (dh.to(tl.int64) * stride_xh + dw.to(tl.int64) * stride_xw
                               + c0.to(tl.int64) * stride_xc)  # fmt: skip
            b_ptrs = w_tile + ((kh * KW + kw) * GROUP_C + c0) * stride_wk
            c0 += BLOCK_K
            next_tap = c0 >= GROUP_C
            c0 = tl.where(next_tap, 0, c0)
            kw = tl.where(next_tap, kw + 1, kw)
            next_row = kw == KW
            kw = tl.where(next_row, 0, kw)
            kh = tl.where(next_row, kh + 1, kh)
        else:
            # Flat K: column k is (tap, channel) = divmod(k, GROUP_C), so one step can span taps.
            k = step * BLOCK_K + offs_k
            k_mask = k < k_total
            channels = k % GROUP_C
            tap = k // GROUP_C
            ih = _outer_add(ih0, (tap // KW) * dilation_h, X_PIXEL_MAJOR)
            iw = _outer_add(iw0, (tap % KW) * dilation_w, X_PIXEL_MAJOR)
            x_mask = (
                _outer_and(mask_m, k_mask, X_PIXEL_MAJOR)
                & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            )  # fmt: skip
            x_ptrs = (
                _outer_add(x_rows, channels.to(tl.int64) * stride_xc, X_PIXEL_MAJOR)
                + ih.to(tl.int64) * stride_xh
                + iw.to(tl.int64) * stride_xw
            )
            b_ptrs = w_filters[None, :] + (k * stride_wk)[:, None]
        # other=0.0 is the zero padding (rows whose window leaves the image) and the K tail (a
        # zero times anything adds nothing). Rows past M read zeros too and are never stored.
        a = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if X_PIXEL_MAJOR:
            a = tl.trans(a)  # (BLOCK_K, BLOCK_M) -> (BLOCK_M, BLOCK_K)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & mask_n[None, :], other=0.0)
        if DOT_IN_FP32:
            # Interpreter only (bf16 dots are wrong there); the GPU keeps native bf16 tensor cores.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    # Epilogue on the fp32 accumulator: the bias, then the one rounding to the output dtype.
    if HAS_BIAS:
        acc += tl.load(bias_ptr + filters, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if Y_PIXEL_MAJOR:
        acc = tl.trans(acc)  # (filters, pixels): an NCHW store walks pixels (see _store_output)
    _store_output(y_ptr, acc, n, pixel, mask_m, filters, mask_n,
                  stride_yn, stride_yc, stride_yp, Y_PIXEL_MAJOR)  # fmt: skip


@runtime.autotune(
    configs=DEPTHWISE_CONFIGS,
    key=["M_BUCKET", "F", "KH", "KW", "stride_xc"],
    prune_configs_by={"early_config_prune": prune_depthwise_configs},
)
@triton.jit(do_not_specialize=["M_BUCKET"])
def conv2d_depthwise_kernel(
    x_ptr, w_ptr, y_ptr, bias_ptr,
    H, W, OW, OHW, M,
    F, MULTIPLIER,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_yn, stride_yc, stride_yp,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dilation_h, dilation_w,
    M_BUCKET,
    KH: tl.constexpr, KW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PIXEL_MAJOR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    """One input channel per group: y[n, f, oh, ow] = bias[f] + sum over (kh, kw) of
    x[n, f // MULTIPLIER, ih, iw] * w[f, 0, kh, kw], with ``w`` contiguous (F, 1, KH, KW) (the
    weight as it comes: a one-channel weight is contiguous and channels-last at once).

    The tile is (pixels, filters), or (filters, pixels) when ``PIXEL_MAJOR`` (x and y NCHW-like,
    see :func:`_outer_add`); no dot, so it never needs transposing.
    """
    pid_m = tl.program_id(0)
    pid_f = tl.program_id(1)
    n, pixel, mask_m = _output_pixels(pid_m, M, OHW, BLOCK_M)
    pixel32 = pixel.to(tl.int32)
    ih0 = (pixel32 // OW) * conv_stride_h - pad_h
    iw0 = (pixel32 % OW) * conv_stride_w - pad_w
    x_rows = x_ptr + n * stride_xn

    filters = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = filters < F
    # Filter f reads channel f // MULTIPLIER (MULTIPLIER = 1, specialised by Triton, for plain
    # depthwise: then the channel *is* the filter and the loads stay contiguous in channels-last).
    channel_offsets = (filters // MULTIPLIER).to(tl.int64) * stride_xc
    # The taps of a filter are KH * KW apart: a strided load of BLOCK_F weights per tap, from L1.
    w_filters = w_ptr + filters * (KH * KW)

    if PIXEL_MAJOR:
        acc = tl.zeros((BLOCK_F, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_F), dtype=tl.float32)
    for kh in range(0, KH):
        ih = ih0 + kh * dilation_h
        row_inside = mask_m & (ih >= 0) & (ih < H)
        for kw in range(0, KW):
            iw = iw0 + kw * dilation_w
            inside = row_inside & (iw >= 0) & (iw < W)
            pixel_ptrs = x_rows + ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
            # other=0.0: the zero padding, as in the GEMM kernel.
            xv = tl.load(
                _outer_add(pixel_ptrs, channel_offsets, PIXEL_MAJOR),
                mask=_outer_and(inside, mask_f, PIXEL_MAJOR),
                other=0.0,
            ).to(tl.float32)
            wv = tl.load(w_filters + (kh * KW + kw), mask=mask_f, other=0.0).to(tl.float32)
            if PIXEL_MAJOR:
                acc += xv * wv[:, None]
            else:
                acc += xv * wv[None, :]

    if HAS_BIAS:
        bias = tl.load(bias_ptr + filters, mask=mask_f, other=0.0).to(tl.float32)
        if PIXEL_MAJOR:
            acc += bias[:, None]
        else:
            acc += bias[None, :]
    _store_output(y_ptr, acc, n, pixel, mask_m, filters.to(tl.int64), mask_f,
                  stride_yn, stride_yc, stride_yp, PIXEL_MAJOR)  # fmt: skip

