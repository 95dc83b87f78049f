"""2-D convolution as an implicit GEMM on the tensor cores, and a direct kernel for depthwise.

**Convolution is a matrix product in disguise.** Every output pixel ``(n, oh, ow)`` of filter ``f``
is a dot product between the filter's ``C * KH * KW`` weights and the input values under the
filter's window. Stack the output pixels as rows and the filters as columns and the whole layer is
one GEMM::

    M = N * OH * OW          (output pixels)
    N_gemm = F               (filters)
    K = C * KH * KW          (one window: every channel under every tap)

The classic way to use that is *im2col*: copy every window into a row of an ``M x K`` matrix, then
call a matmul. That matrix is ``KH * KW`` times the size of the input (9x for a 3x3 filter), and
writing it and reading it back costs more memory traffic than the convolution itself. An
**implicit GEMM** never builds it: each program computes one ``BLOCK_M x BLOCK_N`` tile of the
output and, for each step along K, *gathers* its ``BLOCK_M x BLOCK_K`` slice of the would-be im2col
matrix straight from ``x``. A row of the tile is an output pixel ``(n, oh, ow)``; a column of the
slice is a (tap, channel) pair, so the element to load is
``x[n, c, oh*s - p + kh*d, ow*s - p + kw*d]``.
Indices that fall outside the image are masked, and the mask's ``other=0.0`` *is* the zero padding:
padding costs no memory and no extra pass. The weight slice is an ordinary ``BLOCK_K x BLOCK_N``
tile of a ``(KH, KW, C, F)`` copy of the weight (a weight is kilobytes; the launcher permutes it
once per call so that the filter dimension is contiguous). Both slices meet in ``tl.dot``, which
accumulates in fp32 on the tensor cores, exactly as in ``matmul.py``.

**How K is walked.** Two modes, picked by the launcher from the channels per group ``Cg``:

* *channel-tiled* (``Cg`` a multiple of 32, the common case inside a network): the K loop visits
  the taps ``(kh, kw)`` one after another and, within a tap, blocks of ``BLOCK_K`` channels. One tap
  means one ``(ih, iw)`` per row, so the bounds mask is per row and the channels of a row are
  consecutive: in channels-last memory they are *contiguous*, and the gather becomes wide vector
  loads of 16 bytes.
* *flat K* (few or odd channels per group: an RGB stem with ``C = 3``, small groups): with
  ``Cg = 3`` the channel-tiled loop would fill 3 of 32 lanes per step. Instead ``K`` is walked as
  one flat range ``k = (kh * KW + kw) * Cg + c``, decoded per column, so a 3x3 RGB window
  (K = 27) is one step. The addresses are less regular (the compiler cannot prove the columns
  contiguous) but no tensor-core work is wasted.

The K loop is one flat ``for`` over steps (tap and channel block decoded from the step number), not
two nested loops, so that Triton's software pipeline (``num_stages``) overlaps the loads of step
``i + 1`` with the ``tl.dot`` of step ``i`` across tap boundaries.

**Channels-last (NHWC) is the fast layout.** Both layouts are read in place through their strides
(no copy), and the output is written in the input's layout, as ``torch.nn.functional.conv2d`` does
(channels-last in, channels-last out). In NHWC the channels of a pixel, the K axis of the gathered
slice, are neighbours: with 32+ channels per group each row of the slice is loaded with 16-byte
asynchronous copies (``cp.async``) that the software pipeline overlaps with the tensor-core work,
and the output tile is stored with 16-byte vector stores. In NCHW the channels of a pixel are
``H * W`` elements apart; the neighbours are pixels of one image row, which the compiler cannot
prove contiguous (they come out of a division). There the kernel gathers the slice *transposed*,
``(BLOCK_K, BLOCK_M)``, so that a warp's 32 lanes read 32 neighbouring pixels (coalesced, if
element by element) and transposes it on chip for the dot; the output tile is stored the same
way. That is still several times the memory instructions of NHWC. Convert a network once with
``model.to(memory_format=torch.channels_last)`` and keep activations that way.

**Groups.** With ``groups > 1`` filter ``f`` of group ``g`` sees only channels
``g * Cg .. (g + 1) * Cg - 1``: a block-diagonal GEMM. The group is grid axis 1, and each program
offsets its channel and filter ranges by its group; axis 0 holds the output tiles of that group.

**Depthwise** (``groups == C``, one input channel per group: MobileNet / ConvNeXt blocks) has
``K = KH * KW`` and ``F / groups`` filters per group, typically 1. Through the GEMM that is a 9 x 1
product per group padded to 32 x 16 tensor-core tiles: 98% of the work wasted. It gets its own
direct kernel instead: a program owns ``BLOCK_M`` output pixels x ``BLOCK_F`` filters, and for
each tap multiplies the input tile by one weight per filter (fp32 FMAs, no ``tl.dot``). It covers
every convolution with one input channel per group, channel multipliers (``F = m * C``) included.
(``image.filter2d`` is not reused: it applies the *same* filter to every channel, whereas a
depthwise layer has one filter per channel.)

Numerics: products are accumulated in fp32 and rounded once, on the store, after the bias is added
(fused epilogue: the bias costs no extra pass over the output). fp32 inputs follow PyTorch's
convolution TF32 switch (``torch.backends.cudnn.allow_tf32``, default on, or
``torch.backends.cudnn.conv.fp32_precision``): TF32 tensor cores when on, exact fp32
(``input_precision="ieee"``) when off. In Triton's interpreter ``tl.dot`` on bf16 is wrong
(triton-lang/triton#11584), so there, and only there, bf16 tiles are widened to fp32 before the
dot; bf16 products are exact in fp32, so the result is the one the GPU computes.

Autograd (input, weight and bias):

* ``grad_bias = sum(grad_y)`` over batch and pixels (fp32 sum).
* ``grad_input`` for stride 1 is itself a convolution, computed by *this* kernel: ``grad_y``
  convolved with the weight flipped in both spatial axes and with its filter and channel roles
  swapped per group, padding ``d * (k - 1) - p`` on each side (negative padding, which only the
  internal op accepts, crops). For stride > 1 the gradient is a transposed convolution (zeros
  between the ``grad_y`` pixels), which this kernel does not gather: it falls back to
  ``torch.nn.grad.conv2d_input`` (cuDNN on the GPU, not Triton).
* ``grad_weight`` is a GEMM over ``K = N * OH * OW`` with the im2col matrix on the other side; it
  falls back to ``torch.nn.grad.conv2d_weight`` (cuDNN, not Triton).
"""

from __future__ import annotations

from typing import List, Optional

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op, wrap_triton

__all__ = ["conv2d"]

PADDING_MODES = ("same", "valid")

#: Grid axis 1 (the group in the GEMM kernel) is limited to 65,535 programs by CUDA.
_MAX_GRID_AXIS_1 = 65_535

#: Channels per group from which the K loop is tiled by channel (see the module docstring). Every
#: config's BLOCK_K (32 or 64) divides a multiple of 64, and a multiple of 32 fills a 32-wide step.
_CHANNEL_TILE_MULTIPLE = 32


def _gemm_config(bm, bn, bk, stages, warps):
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_stages=stages, num_warps=warps
    )


#: Tuned for the H100 around the workshop's benchmark layer (fp16, x 32x64x56x56, 64 filters 3x3,
#: padding 1: M = 100,352, N = 64, K = 576). N is one 64-wide tile, so the choice is how tall a
#: tile is (M) and how deep a step is (K). configs[0] is what the interpreter runs and a good
#: default everywhere: 784 tiles of 128 rows fill 132 SMs in 6 even waves, BLOCK_K = 64 is one
#: whole tap of 64 channels per step (9 steps), and 3 stages of (128 + 64) x 64 fit shared memory
#: even in fp32 (147 KB).
GEMM_CONFIGS = [
    _gemm_config(128, 64, 64, 3, 4),
    # The benchmark layer and its neighbours: taller tiles read each weight slice for more pixels.
    _gemm_config(256, 64, 64, 3, 8),
    _gemm_config(128, 64, 64, 4, 4),
    _gemm_config(256, 64, 64, 4, 8),
    _gemm_config(128, 64, 32, 4, 4),
    _gemm_config(256, 64, 32, 4, 8),
    _gemm_config(128, 64, 32, 3, 8),
    # Wider layers (F per group >= 128): a 128x128 tile uses each gathered input row twice as often.
    _gemm_config(128, 128, 64, 3, 8),
    _gemm_config(128, 128, 32, 4, 4),
    # Narrow layers or few pixels (late stages of a network, small batches): more, smaller tiles.
    _gemm_config(64, 64, 64, 4, 4),
    _gemm_config(128, 32, 64, 4, 4),
    _gemm_config(64, 32, 32, 4, 4),
    _gemm_config(64, 16, 32, 4, 2),
]


def _depthwise_config(bm, bf, warps):
    return triton.Config({"BLOCK_M": bm, "BLOCK_F": bf}, num_stages=1, num_warps=warps)


#: The depthwise kernel is memory-bound (one FMA per loaded element per tap; the taps re-read
#: neighbouring pixels from L1/L2). configs[0]: 64 pixels x 64 channels = 4096 outputs, 32 a thread;
#: in channels-last a row of 64 fp16 channels is one 128-byte line.
DEPTHWISE_CONFIGS = [
    _depthwise_config(64, 64, 4),
    _depthwise_config(128, 32, 4),
    _depthwise_config(32, 128, 4),
    _depthwise_config(128, 64, 8),
    # NCHW input: pixels, not channels, are contiguous, so tall thin tiles load better.
    _depthwise_config(256, 16, 4),
    _depthwise_config(512, 16, 8),
]


# --------------------------------------------------------------------------------------------
# Config pruning (GPU only: the interpreter runs configs[0] and never prunes).
# --------------------------------------------------------------------------------------------
def _gemm_shared_memory_bytes(config: triton.Config, element_size: int) -> int:
    """One input slice and one weight slice per pipeline stage."""
    kw = config.kwargs
    return config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * element_size


def prune_gemm_configs(configs, named_args, **kwargs):
    """Drop, before benchmarking, configs that cannot launch or that compute mostly padding.

    Pruned: pipelines that overflow shared memory; tiles taller than the (bucketed) pixel count or
    wider than the filters of a group; in channel-tiled mode a BLOCK_K that does not divide the
    channels of a group (the last step of every tap would be partly empty). Never returns an
    empty list.
    """
    from .matmul import _shared_memory_limit  # the one place that knows the GPU's limit

    args = {**named_args, **kwargs}
    element_size = args["x_ptr"].element_size()
    limit = _shared_memory_limit()
    fitting = [c for c in configs if _gemm_shared_memory_bytes(c, element_size) <= limit]
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
def _output_pixels(pid_m, M, OH, OW, BLOCK_M: tl.constexpr):
    """The ``BLOCK_M`` output pixels of tile ``pid_m``, as (n, oh, ow), and the in-range mask.

    int64 from the start: M = N * OH * OW and n * stride_n can pass 2**31 on large batches. The
    divisions run once per program, not once per K step.
    """
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    ow = (offs_m % OW).to(tl.int32)
    rest = offs_m // OW
    oh = (rest % OH).to(tl.int32)
    n = rest // OH
    return n, oh, ow, mask_m


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
    H, W, OH, OW, M,
    GROUP_C, GROUP_F, F, KH, KW,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_yn, stride_yc, stride_yh, stride_yw,
    stride_bias,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dilation_h, dilation_w,
    M_BUCKET,
    HAS_BIAS: tl.constexpr,
    CHANNEL_TILED: tl.constexpr,
    X_PIXEL_MAJOR: tl.constexpr,
    Y_PIXEL_MAJOR: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[n, f, oh, ow] = bias[f] + sum over (kh, kw, c) of x[n, c, ih, iw] * w[kh, kw, c, f].

    ``w`` is the weight permuted to (KH, KW, GROUP_C, F), contiguous: its row
    ``(kh*KW + kw)*GROUP_C + c`` holds the weights of every filter for one (tap, channel).
    ``pad_h``/``pad_w`` are the top/left padding; bottom/right padding only shows in OH/OW (reads
    past the edge are masked to zero).
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

    n, oh, ow, mask_m = _output_pixels(pid_m, M, OH, OW, BLOCK_M)
    # Top-left corner of each row's window; tap (kh, kw) adds (kh * dilation_h, kw * dilation_w).
    ih0 = oh * conv_stride_h - pad_h
    iw0 = ow * conv_stride_w - pad_w
    # The image of each row, and the first channel of this group.
    x_rows = x_ptr + n * stride_xn + (group * GROUP_C).to(tl.int64) * stride_xc

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < GROUP_F
    filters = (group * GROUP_F + offs_n).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)

    if CHANNEL_TILED:
        channel_blocks = tl.cdiv(GROUP_C, BLOCK_K)
        k_steps = KH * KW * channel_blocks
    else:
        k_steps = tl.cdiv(KH * KW * GROUP_C, BLOCK_K)

    # fp32 accumulator whatever the inputs: K = 576 fp16 products would lose their low bits in an
    # fp16 running sum.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, k_steps):
        if CHANNEL_TILED:
            # One tap, BLOCK_K consecutive channels: one (ih, iw) per row, so the bounds mask is
            # per row and (in channels-last) the channels of a row are contiguous.
            tap = step // channel_blocks
            channels = (step % channel_blocks) * BLOCK_K + offs_k
            ih = ih0 + (tap // KW) * dilation_h
            iw = iw0 + (tap % KW) * dilation_w
            inside = mask_m & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            k_mask = channels < GROUP_C
            pixel = x_rows + ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
            x_ptrs = _outer_add(pixel, channels.to(tl.int64) * stride_xc, X_PIXEL_MAJOR)
            x_mask = _outer_and(inside, k_mask, X_PIXEL_MAJOR)
            w_rows = tap * GROUP_C + channels
        else:
            # Flat K: column k is (tap, channel) = divmod(k, GROUP_C), so one step can span taps.
            k = step * BLOCK_K + offs_k
            k_mask = k < KH * KW * GROUP_C
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
            w_rows = k
        # other=0.0 is the zero padding (rows whose window leaves the image) and the K tail (a
        # zero times anything adds nothing). Rows past M read zeros too and are never stored.
        a = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if X_PIXEL_MAJOR:
            a = tl.trans(a)  # (BLOCK_K, BLOCK_M) -> (BLOCK_M, BLOCK_K)
        w_ptrs = w_ptr + w_rows.to(tl.int64)[:, None] * F + filters[None, :]
        b = tl.load(w_ptrs, mask=k_mask[:, None] & mask_n[None, :], other=0.0)
        if DOT_IN_FP32:
            # Interpreter only (bf16 dots are wrong there); the GPU keeps native bf16 tensor cores.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    # Epilogue on the fp32 accumulator: the bias, then the one rounding to the output dtype.
    if HAS_BIAS:
        bias = tl.load(bias_ptr + filters * stride_bias, mask=mask_n, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    out = acc.to(y_ptr.dtype.element_ty)
    if Y_PIXEL_MAJOR:
        out = tl.trans(out)
    y_rows = y_ptr + n * stride_yn + oh.to(tl.int64) * stride_yh + ow.to(tl.int64) * stride_yw
    y_ptrs = _outer_add(y_rows, filters * stride_yc, Y_PIXEL_MAJOR)
    tl.store(y_ptrs, out, mask=_outer_and(mask_m, mask_n, Y_PIXEL_MAJOR))


@runtime.autotune(
    configs=DEPTHWISE_CONFIGS,
    key=["M_BUCKET", "F", "KH", "KW", "stride_xc"],
    prune_configs_by={"early_config_prune": prune_depthwise_configs},
)
@triton.jit(do_not_specialize=["M_BUCKET"])
def conv2d_depthwise_kernel(
    x_ptr, w_ptr, y_ptr, bias_ptr,
    H, W, OH, OW, M,
    F, KH, KW, MULTIPLIER,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_yn, stride_yc, stride_yh, stride_yw,
    stride_bias,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dilation_h, dilation_w,
    M_BUCKET,
    HAS_BIAS: tl.constexpr,
    PIXEL_MAJOR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    """One input channel per group: y[n, f, oh, ow] = bias[f] + sum over (kh, kw) of
    x[n, f // MULTIPLIER, ih, iw] * w[kh, kw, f], with ``w`` permuted to (KH, KW, F).

    The tile is (pixels, filters), or (filters, pixels) when ``PIXEL_MAJOR`` (x and y NCHW-like,
    see :func:`_outer_add`); no dot, so it never needs transposing.
    """
    pid_m = tl.program_id(0)
    pid_f = tl.program_id(1)
    n, oh, ow, mask_m = _output_pixels(pid_m, M, OH, OW, BLOCK_M)
    ih0 = oh * conv_stride_h - pad_h
    iw0 = ow * conv_stride_w - pad_w
    x_rows = x_ptr + n * stride_xn

    filters = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = filters < F
    # Filter f reads channel f // MULTIPLIER (MULTIPLIER = 1, specialised by Triton, for plain
    # depthwise: then the channel *is* the filter and the loads stay contiguous in channels-last).
    channel_offsets = (filters // MULTIPLIER).to(tl.int64) * stride_xc

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
            pixel = x_rows + ih.to(tl.int64) * stride_xh + iw.to(tl.int64) * stride_xw
            # other=0.0: the zero padding, as in the GEMM kernel.
            xv = tl.load(
                _outer_add(pixel, channel_offsets, PIXEL_MAJOR),
                mask=_outer_and(inside, mask_f, PIXEL_MAJOR),
                other=0.0,
            ).to(tl.float32)
            wv = tl.load(w_ptr + (kh * KW + kw) * F + filters, mask=mask_f, other=0.0)
            wv = wv.to(tl.float32)
            if PIXEL_MAJOR:
                acc += xv * wv[:, None]
            else:
                acc += xv * wv[None, :]

    if HAS_BIAS:
        bias = tl.load(bias_ptr + filters * stride_bias, mask=mask_f, other=0.0).to(tl.float32)
        if PIXEL_MAJOR:
            acc += bias[:, None]
        else:
            acc += bias[None, :]
    y_rows = y_ptr + n * stride_yn + oh.to(tl.int64) * stride_yh + ow.to(tl.int64) * stride_yw
    y_ptrs = _outer_add(y_rows, filters.to(tl.int64) * stride_yc, PIXEL_MAJOR)
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=_outer_and(mask_m, mask_f, PIXEL_MAJOR))


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
def tf32_enabled() -> bool:
    """Whether PyTorch would use TF32 for an fp32 convolution on CUDA right now.

    torch >= 2.9 keeps it as ``torch.backends.cudnn.conv.fp32_precision`` ("tf32", "ieee", or
    "none" = inherit from ``torch.backends.cudnn`` and then ``torch.backends``); setting the legacy
    ``torch.backends.cudnn.allow_tf32`` updates it. Older torch has only ``allow_tf32``.
    """
    conv = getattr(torch.backends.cudnn, "conv", None)
    precision = getattr(conv, "fp32_precision", None)
    if precision is None:
        return bool(torch.backends.cudnn.allow_tf32)
    for parent in (torch.backends.cudnn, torch.backends):
        if precision != "none":
            break
        precision = getattr(parent, "fp32_precision", "none")
    return precision == "tf32"


def _input_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and tf32_enabled():
        return "tf32"
    return "ieee"  # exact fp32 products; fp16/bf16 products are exact either way


def uses_channel_tiles(group_c: int) -> bool:
    """Which way the GEMM kernel walks K (see the module docstring)."""
    return group_c % _CHANNEL_TILE_MULTIPLE == 0


def _output_size(size, pad_before, pad_after, dilation, kernel, stride):
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def _output_shape(x, weight, stride, padding, dilation) -> tuple:
    n, _, h, w = x.shape
    f, _, kh, kw = weight.shape
    oh = _output_size(h, padding[0], padding[1], dilation[0], kh, stride[0])
    ow = _output_size(w, padding[2], padding[3], dilation[1], kw, stride[1])
    return (n, f, oh, ow)


# On the GPU, NCHW inputs of the implicit GEMM are converted to channels-last first (see
# _conv2d). The interpreter reads them in place, which keeps the NCHW gather path tested on CPU.
NCHW_VIA_CHANNELS_LAST = not runtime.INTERPRET


def _is_channels_last(x: torch.Tensor) -> bool:
    # Tensors that are both (one channel, or 1x1 images) count as contiguous NCHW.
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _pixel_major(t: torch.Tensor) -> bool:
    """Neighbouring pixels are closer in memory than neighbouring channels (NCHW-like)."""
    return t.stride(3) < t.stride(1)


def _empty_output(x: torch.Tensor, shape) -> torch.Tensor:
    """The output in the input's memory format, as torch.nn.functional.conv2d gives it."""
    fmt = torch.channels_last if _is_channels_last(x) else torch.contiguous_format
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)


def _bucket(n) -> int:
    # Symbolic sizes under torch.compile pass through (the key only matters to eager autotuning).
    return triton.next_power_of_2(n) if isinstance(n, int) else n


def _conv2d_fake(x, weight, bias, stride, padding, dilation, groups):
    return _empty_output(x, _output_shape(x, weight, stride, padding, dilation))


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by conv2d below). padding is
# [top, bottom, left, right]: padding="same" with an even dilated kernel pads one more on the
# bottom/right, like torch. The backward pass calls it with negative padding (a crop).
# --------------------------------------------------------------------------------------------
@register_op("conv2d", fake=_conv2d_fake)
def _conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> torch.Tensor:
    shape = _output_shape(x, weight, stride, padding, dilation)
    out = _empty_output(x, shape)
    n_filters, group_c, kh, kw = weight.shape
    _, _, oh, ow = shape
    if out.numel() == 0:
        return out
    if group_c == 0:
        # No input channels: every window sums nothing, so the output is the bias (or zero).
        out.zero_()
        if bias is not None:
            out += bias.view(1, -1, 1, 1)
        return out

    result = out
    if NCHW_VIA_CHANNELS_LAST and group_c > 1 and _pixel_major(x):
        # Measured on an H100 (fp16 32x64x56x56, 64 3x3 filters): the NCHW gather ran at
        # 13 TFLOP/s, the NHWC one at 122. Two layout copies (a read and a write of x and of
        # the output, ~17 us there) cost far less than the difference.
        x = x.contiguous(memory_format=torch.channels_last)
        out = torch.empty_like(result, memory_format=torch.channels_last)

    # (F, Cg, KH, KW) -> (KH, KW, Cg, F): a K row holds all filters for one (tap, channel), so the
    # weight slice of a step is contiguous along the filters. Kilobytes, copied once per call.
    w_rows = weight.permute(2, 3, 1, 0).contiguous()
    m = shape[0] * oh * ow
    bias_arg = bias if bias is not None else out  # never read when HAS_BIAS is False
    geometry = (x.shape[2], x.shape[3], oh, ow, m)
    strides = (*x.stride(), *out.stride(), bias.stride(0) if bias is not None else 0)
    conv_args = (stride[0], stride[1], padding[0], padding[2], dilation[0], dilation[1])

    with runtime.device_guard(x):
        if group_c == 1:
            def depthwise_grid(meta):
                return (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n_filters, meta["BLOCK_F"]))

            wrap_triton(conv2d_depthwise_kernel)[depthwise_grid](
                x, w_rows, out, bias_arg,
                *geometry,
                n_filters, kh, kw, n_filters // groups,
                *strides, *conv_args,
                _bucket(m),
                HAS_BIAS=bias is not None,
                PIXEL_MAJOR=_pixel_major(x),
            )  # fmt: skip
        else:
            group_f = n_filters // groups

            def gemm_grid(meta):
                tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(group_f, meta["BLOCK_N"])
                return (tiles, groups)

            wrap_triton(conv2d_implicit_gemm_kernel)[gemm_grid](
                x, w_rows, out, bias_arg,
                *geometry,
                group_c, group_f, n_filters, kh, kw,
                *strides, *conv_args,
                _bucket(m),
                HAS_BIAS=bias is not None,
                CHANNEL_TILED=uses_channel_tiles(group_c),
                X_PIXEL_MAJOR=_pixel_major(x),
                Y_PIXEL_MAJOR=_pixel_major(out),
                INPUT_PRECISION=_input_precision(x.dtype),
                DOT_IN_FP32=runtime.INTERPRET and x.dtype == torch.bfloat16,
            )  # fmt: skip
    if out is not result:
        result.copy_(out)
    return result


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _conv2d_setup_context(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups = inputs
    ctx.stride, ctx.padding, ctx.dilation, ctx.groups = stride, padding, dilation, groups
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _grad_input_stride_1(grad, weight, padding, dilation, groups):
    """dL/dx of a stride-1 convolution, as a convolution of ``grad`` by this same kernel.

    x[c] fed y[f] through w[f, c, kh, kw] at offset (kh*d - p); read backwards, grad_x[c] gathers
    grad_y[f] at offset (p - kh*d): the weight flipped in both axes, filters and channels swapped
    within each group, and padding d*(k-1) - p on each side (negative: a crop).
    """
    n_filters, group_c, kh, kw = weight.shape
    group_f = n_filters // groups
    w_t = (
        weight.reshape(groups, group_f, group_c, kh, kw)
        .transpose(1, 2)
        .reshape(groups * group_c, group_f, kh, kw)
        .flip(2, 3)
    )
    reach_h, reach_w = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
    pad_t = [reach_h - padding[0], reach_h - padding[1], reach_w - padding[2], reach_w - padding[3]]
    return _conv2d(grad, w_t, None, [1, 1], pad_t, list(dilation), groups)


def _conv2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.stride, ctx.padding, ctx.dilation, ctx.groups
    grad_x = grad_w = grad_bias = None
    symmetric = padding[0] == padding[1] and padding[2] == padding[3]
    if ctx.needs_input_grad[0]:
        if stride[0] == 1 and stride[1] == 1:
            grad_x = _grad_input_stride_1(grad, weight, padding, dilation, groups)
        else:
            # Fallback (cuDNN / ATen, not Triton): a transposed convolution. Strided padding is
            # always symmetric (padding="same" requires stride 1).
            grad_x = torch.nn.grad.conv2d_input(
                x.shape, weight, grad, stride, padding[::2], dilation, groups
            )
    if ctx.needs_input_grad[1]:
        # Fallback (cuDNN / ATen, not Triton). Asymmetric padding ("same", even kernel) is made
        # explicit on x first, since conv2d_weight takes one padding per axis.
        if symmetric:
            x_in, pad_hw = x, padding[::2]
        else:
            pad_lrtb = (padding[2], padding[3], padding[0], padding[1])
            x_in, pad_hw = torch.nn.functional.pad(x, pad_lrtb), [0, 0]
        grad_w = torch.nn.grad.conv2d_weight(
            x_in, weight.shape, grad, stride, pad_hw, dilation, groups
        )
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad.sum(dim=(0, 2, 3), dtype=torch.float32).to(grad.dtype)
    return grad_x, grad_w, grad_bias, None, None, None, None


_conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup_context)


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------
def _pair(value, name: str, *, minimum: int) -> list[int]:
    """An int or a sequence of 1 or 2 ints, as torch accepts them, checked against ``minimum``."""
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, (tuple, list)) or len(items) not in (1, 2):
        raise TypeError(f"{name} must be an int or a tuple of 2 ints, got {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise TypeError(f"{name} must be an int or a tuple of 2 ints, got {value!r}")
    pair = [items[0], items[-1]]
    if min(pair) < minimum:
        rule = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return pair


def _padding_amounts(padding, weight, dilation, stride) -> list[int]:
    """[top, bottom, left, right]."""
    if isinstance(padding, str):
        if padding not in PADDING_MODES:
            raise ValueError(
                f"padding must be an int, a pair or one of {PADDING_MODES}, got {padding!r}"
            )
        if padding == "valid":
            return [0, 0, 0, 0]
        if stride != [1, 1]:
            raise ValueError(f"padding='same' requires stride 1 (as in torch), got stride {stride}")
        amounts = []
        for d, k in zip(dilation, weight.shape[2:]):
            total = d * (k - 1)
            # torch pads the extra row/column of an odd total on the bottom/right.
            amounts += [total // 2, total - total // 2]
        return amounts
    p = _pair(padding, "padding", minimum=0)
    return [p[0], p[0], p[1], p[1]]


def _check_conv_args(x, weight, bias, stride, padding, dilation, groups):
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES, ndim=(3, 4))
    runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=4)
    runtime.check_same_dtype(x=x, weight=weight)
    if bias is not None:
        runtime.check_tensor(bias, "bias", dtypes=FLOAT_DTYPES, ndim=1)
        runtime.check_same_dtype(x=x, bias=bias)
    runtime.check_same_device(x=x, weight=weight, bias=bias)

    if isinstance(groups, bool) or not isinstance(groups, int):
        raise TypeError(f"groups must be an int, got {type(groups).__name__}")
    if groups < 1:
        raise ValueError(f"groups must be positive, got {groups}")
    n_filters, group_c, kh, kw = weight.shape
    channels = x.shape[-3]
    if n_filters % groups != 0:
        raise ValueError(
            f"weight has {n_filters} filters, which groups={groups} does not divide "
            "(each group needs the same number of filters)"
        )
    if group_c * groups != channels:
        raise ValueError(
            f"x has {channels} channels but weight expects weight.shape[1] * groups = "
            f"{group_c} * {groups} = {group_c * groups} (weight is {tuple(weight.shape)})"
        )
    if group_c != 1 and groups > _MAX_GRID_AXIS_1:
        raise ValueError(
            f"groups must be at most {_MAX_GRID_AXIS_1} unless depthwise, got {groups}"
        )
    if bias is not None and bias.shape[0] != n_filters:
        raise ValueError(
            f"bias must have shape ({n_filters},) to match weight, got {tuple(bias.shape)}"
        )
    if kh == 0 or kw == 0:
        raise ValueError(f"weight must have a non-empty kernel, got shape {tuple(weight.shape)}")

    stride = _pair(stride, "stride", minimum=1)
    dilation = _pair(dilation, "dilation", minimum=1)
    padding = _padding_amounts(padding, weight, dilation, stride)
    for axis, size, k, d, before, after in (
        ("height", x.shape[-2], kh, dilation[0], padding[0], padding[1]),
        ("width", x.shape[-1], kw, dilation[1], padding[2], padding[3]),
    ):
        if size + before + after < d * (k - 1) + 1:
            raise ValueError(
                f"weight's dilated kernel {axis} {d * (k - 1) + 1} is larger than x's padded "
                f"{axis} {size} + {before + after}: the output would be empty"
            )
    return stride, padding, dilation


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> torch.Tensor:
    """``torch.nn.functional.conv2d`` as an implicit GEMM in Triton (same signature, same result).

    ``x`` is (N, C, H, W) or unbatched (C, H, W); ``weight`` (F, C / groups, KH, KW); ``bias`` (F,)
    or None. ``stride``, ``dilation``: int or pair, positive. ``padding``: int or pair (>= 0),
    ``"valid"`` (none) or ``"same"`` (stride 1 only; an odd total pads the extra row/column on the
    bottom/right, like torch). fp16, bf16 or fp32, all the same dtype; the result has that dtype,
    accumulated in fp32 (fp32 follows ``torch.backends.cudnn.allow_tf32``). Any strides are read in
    place; the output is channels-last when ``x`` is, which is also the fast layout (see the
    module docstring). Differentiable in ``x``, ``weight`` and ``bias`` (weight gradients and
    strided input gradients through PyTorch's own convolution, the rest in Triton).
    """
    stride, padding, dilation = _check_conv_args(x, weight, bias, stride, padding, dilation, groups)
    if x.dim() == 3:
        return _conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    return _conv2d(x, weight, bias, stride, padding, dilation, groups)
