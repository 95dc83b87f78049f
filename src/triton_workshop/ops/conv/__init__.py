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
tile of the weight in *channels-last* memory, ``(F, KH, KW, C)``: filter ``f``'s K row is one
contiguous run, ordered (tap, channel) like the gathered columns, so the slice is loaded with
16-byte vectors along K (K-major, the operand order TF32 tensor cores require). A network converted
with ``model.to(memory_format=torch.channels_last)`` has its weights that way already; otherwise
the launcher copies the weight (kilobytes) each call. (The flat-K mode below reads a copy that is
contiguous along F instead: its K rows are rarely a multiple of 16 bytes long.) Both slices meet
in ``tl.dot``, which accumulates in fp32 on the tensor cores, exactly as in ``matmul.py``.

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

The K loop is one flat ``for`` over steps, not two nested loops, so that Triton's software
pipeline (``num_stages``) overlaps the loads of step ``i + 1`` with the ``tl.dot`` of step ``i``
across tap boundaries. A step is only a few tensor-core instructions (4 for a 128 x 64 x 32 tile),
so the integer work around them sets the pace: everything per row (window corner, pointer) and
per column is computed once per program, and a channel-tiled step adds one scalar tap offset to
the pointers and one shift to a one-comparison bounds test (``0 <= ih < H`` as an unsigned
``ih < H``), with the tap and channel block kept in counters rather than divided out of the step
number. On an sm_90 compile this took the loop from 224 to 135 instructions per step.

**Channels-last (NHWC) is the fast layout.** The output is written in the input's layout, as
``torch.nn.functional.conv2d`` does (channels-last in, channels-last out). In NHWC the channels of
a pixel, the K axis of the gathered slice, are neighbours: with 32+ channels per group each row of
the slice is loaded with 16-byte asynchronous copies (``cp.async``) that the software pipeline
overlaps with the tensor-core work, and the output tile is stored with 16-byte vector stores. In
NCHW the channels of a pixel are ``H * W`` elements apart. The kernel can gather that too (the
slice is then loaded *transposed*, ``(BLOCK_K, BLOCK_M)``, so that a warp's lanes read
neighbouring pixels, and transposed on chip for the dot), but element by element, at a tenth of
the NHWC speed. So on the GPU an NCHW input is first copied to NHWC by one tiled transpose
(``layout.to_channels_last``: a read and a write of ``x`` at full bandwidth), and the kernel
writes the NCHW output itself, no copy back: the output tile is transposed on chip so that
consecutive lanes walk pixels, and because the kernel splits the row index into (image, pixel of
the image) with a single division by ``OH * OW``, Triton can prove runs of 16 consecutive pixels
contiguous whenever ``OH * OW`` is a multiple of 16 (56 x 56, 28 x 28, ...) and stores them with
16-byte vectors. The interpreter keeps reading NCHW in place, so both gathers stay tested on CPU.
Converting a network once with ``model.to(memory_format=torch.channels_last)`` still saves the
transposes.

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

import functools
from typing import List, Optional

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op
from . import layout

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
#: tile is (M), how deep a step is (K) and how many programs share an SM. A step is a handful of
#: tensor-core instructions, so hiding its loads takes several programs per SM: each entry below
#: fits 2 to 4 (shared memory ``stages * (BLOCK_M + BLOCK_N) * BLOCK_K * 2`` bytes of 227 KB, and
#: registers: 110-166 a thread for these tiles in an sm_90 compile, none spilled). configs[0] is
#: what the interpreter runs and a good default everywhere: 784 tiles of 128 rows fill 132 SMs in
#: 6 even waves, BLOCK_K = 64 is one whole tap of 64 channels per step (9 steps), 3 programs an SM.
GEMM_CONFIGS = [
    _gemm_config(128, 64, 64, 3, 4),
    # The benchmark layer and its neighbours. 128 x 64 x 32, 4 stages: the H100's pick before
    # (4 programs an SM). 2 stages of 64-deep steps: 4 programs an SM with half the steps.
    _gemm_config(128, 64, 32, 4, 4),
    _gemm_config(128, 64, 64, 2, 4),
    # 256-row tiles read each weight slice for twice the pixels (half the weight traffic from
    # L2), 2 programs an SM; deeper pipelines would leave room for one only.
    _gemm_config(256, 64, 32, 4, 8),
    _gemm_config(256, 64, 64, 2, 8),
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
    args = {**named_args, **kwargs}
    element_size = args["x_ptr"].element_size()
    limit = runtime.shared_memory_limit()
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


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
#: ``torch.backends.cudnn.conv`` (torch >= 2.9; None before), looked up once: every fp32 call
#: reads the TF32 switch (it is part of the launch plan's key), and the lookup was a fifth of that.
_CUDNN_CONV = getattr(torch.backends.cudnn, "conv", None)


def tf32_enabled() -> bool:
    """Whether PyTorch would use TF32 for an fp32 convolution on CUDA right now.

    torch >= 2.9 keeps it as ``torch.backends.cudnn.conv.fp32_precision`` ("tf32", "ieee", or
    "none" = inherit from ``torch.backends.cudnn`` and then ``torch.backends``); setting the legacy
    ``torch.backends.cudnn.allow_tf32`` updates it. Older torch has only ``allow_tf32``.
    """
    precision = getattr(_CUDNN_CONV, "fp32_precision", None)
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
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def _pixel_major(t: torch.Tensor) -> bool:
    """Neighbouring pixels are closer in memory than neighbouring channels (NCHW-like)."""
    return t.stride(3) < t.stride(1)


def _empty_output(x: torch.Tensor, shape) -> torch.Tensor:
    """The output in the input's memory format, as torch.nn.functional.conv2d gives it."""
    if _is_channels_last(x):
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return x.new_empty(shape)



def _conv2d_fake(x, weight, bias, stride, padding, dilation, groups):
    return _empty_output(x, _output_shape(x, weight, stride, padding, dilation))


# --------------------------------------------------------------------------------------------
# Launch plans. On the GPU machine (H100, fp16 x 32x64x56x56 channels-last, 64 3x3 filters,
# padding 1) an eager call cost 36 us of host CPU for a 31 us kernel, where cuDNN's call costs
# 21 us: in eager benchmarks this layer was host-bound. Most of that Python worked out, call after
# call, what only depends on the shapes, strides, dtype and conv arguments (output shape and
# memory format, K loop, weight layout, the kernels' scalar and constexpr arguments), and then
# FastLaunch built a key over all 36 of the kernel's arguments to find the kernel it launched
# last time. A plan does all of that once per such combination and keeps its launch ready to
# repeat (runtime.launch_kernel), so a call only looks the plan up, allocates the output, copies what
# must be copied and launches.
# --------------------------------------------------------------------------------------------
class _ConvPlan:
    """How one combination of shapes, strides and arguments is launched.

    ``out_shape``, ``out_strides``: the output, in the input's memory format (as torch lays it
    out). ``kernel`` is None when nothing is launched: an empty output, or no input channels
    (``zero_fill``: the output is the bias, or zero). ``weight_strides``: the layout the kernel
    reads the weight in; a weight with other strides goes through ``relayout`` (a copy, or
    Tensor.contiguous finding it already fits). ``to_channels_last``: x is copied to channels-last
    first (the GPU's NCHW path): ``transpose`` is ``(args, prepared)`` for
    ``layout.copy_to_channels_last`` (args None: through Tensor.contiguous); ``x_strides`` are the
    strides of x as the kernel reads it. ``grid``, ``scalars``, ``consts``, ``prepared``: the arguments of
    :func:`runtime.launch_kernel` (``prepared`` fills with the compiled launches, one per device and
    pointer alignment, on the GPU).
    """

    __slots__ = ("out_shape", "out_strides", "zero_fill", "kernel", "grid", "scalars", "consts",
                 "prepared", "weight_strides", "relayout", "to_channels_last", "x_strides",
                 "transpose")

    def __init__(self, out_shape, out_strides, *, zero_fill=False, kernel=None, grid=None,
                 scalars=(), consts=None, weight_strides=None, relayout=None,
                 to_channels_last=False, x_strides=None, transpose=None):
        self.out_shape, self.out_strides, self.zero_fill = out_shape, out_strides, zero_fill
        self.kernel, self.grid, self.scalars, self.consts = kernel, grid, scalars, consts
        self.prepared = {} if kernel is not None else None
        self.weight_strides, self.relayout = weight_strides, relayout
        self.to_channels_last, self.x_strides = to_channels_last, x_strides
        self.transpose = transpose


def _meta(shape, strides=None, memory_format=torch.contiguous_format) -> torch.Tensor:
    """A storage-less tensor: its strides and contiguity are torch's own, found without copying
    torch's rules for size-0 and size-1 dims (and it takes the symbolic sizes of torch.compile)."""
    if strides is not None:
        return torch.empty_strided(shape, strides, device="meta")
    return torch.empty(shape, device="meta", memory_format=memory_format)


def _weight_channels_last(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous(memory_format=torch.channels_last)


def _weight_along_filters(weight: torch.Tensor) -> torch.Tensor:
    return weight.permute(2, 3, 1, 0).contiguous()  # (KH, KW, Cg, F): rows along F


def _weight_contiguous(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous()


@functools.lru_cache(maxsize=1024)
def _plan(x_shape, x_strides, w_shape, dtype, geometry, groups, has_bias, precision, knobs):
    """The :class:`_ConvPlan` of a convolution. ``geometry``: (stride, padding [top, bottom, left,
    right], dilation) flattened; ``precision``: the fp32 dot's (the TF32 switch when the plan was
    made); ``knobs``: the module settings it depends on (tests change them)."""
    nchw_via_channels_last, interpret, _layout_knobs = knobs  # the last: the transpose tile
    stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, dilation_h, dilation_w = geometry
    batch, _, h, w = x_shape
    n_filters, group_c, kh, kw = w_shape
    oh = _output_size(h, pad_top, pad_bottom, dilation_h, kh, stride_h)
    ow = _output_size(w, pad_left, pad_right, dilation_w, kw, stride_w)
    out_shape = (batch, n_filters, oh, ow)
    x_meta = _meta(x_shape, x_strides)
    out_format = torch.channels_last if _is_channels_last(x_meta) else torch.contiguous_format
    out_strides = _meta(out_shape, memory_format=out_format).stride()
    if batch * n_filters * oh * ow == 0:
        return _ConvPlan(out_shape, out_strides)
    if group_c == 0:
        return _ConvPlan(out_shape, out_strides, zero_fill=True)

    ohw = oh * ow
    m = batch * ohw
    # y's pixel (oh * OW + ow) stride: the output is allocated as planned, so H and W always merge.
    stride_yn, stride_yc, _, stride_yp = out_strides
    conv_args = (stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w)
    x_pixel_major = _pixel_major(x_meta)
    # The grids close over the plan's ints only: runtime.FastLaunch keys a grid by its closure.
    if group_c == 1:

        def depthwise_grid(meta):
            return (runtime.cdiv(m, meta["BLOCK_M"]), runtime.cdiv(n_filters, meta["BLOCK_F"]))

        return _ConvPlan(
            out_shape, out_strides, kernel=conv2d_depthwise_kernel, grid=depthwise_grid,
            scalars=(h, w, ow, ohw, m, n_filters, n_filters // groups, *x_strides,
                     stride_yn, stride_yc, stride_yp, *conv_args, runtime.bucket(m)),
            consts=dict(
                KH=int(kh), KW=int(kw),  # constexprs: int() pins symbolic sizes
                HAS_BIAS=has_bias,
                PIXEL_MAJOR=x_pixel_major,
            ),
            # A one-channel weight (F, 1, KH, KW) is contiguous in either memory format: read as is.
            weight_strides=_meta(w_shape).stride(), relayout=_weight_contiguous,
        )  # fmt: skip

    copy_x, transpose = False, None
    if nchw_via_channels_last and x_pixel_major:
        # Measured on an H100 (fp16 32x64x56x56, 64 3x3 filters): the NCHW gather ran at
        # 13 TFLOP/s, the NHWC one at 122. One tiled transpose of x (a read and a write: 26 MB
        # there, under 10 us at the memory bandwidth) costs far less, and the kernel writes the
        # NCHW output itself.
        copy_x = not x_meta.is_contiguous(memory_format=torch.channels_last)
        if copy_x:
            transpose = (layout.channels_last_copy_args(x_shape, x_strides), {})
        x_strides = x_meta.contiguous(memory_format=torch.channels_last).stride()
        x_pixel_major = False
    channel_tiled = uses_channel_tiles(group_c)
    if channel_tiled:
        # The weight in channels-last memory, (F, KH, KW, Cg): K-major rows, see the kernel. A
        # network converted with .to(memory_format=torch.channels_last) already has it (no copy);
        # otherwise a copy of a few kilobytes per call.
        weight_strides = _meta(w_shape, memory_format=torch.channels_last).stride()
        relayout = _weight_channels_last
        stride_wf, stride_wk = kh * kw * group_c, 1
    else:
        # (KH, KW, Cg, F) contiguous: the strides, in (F, Cg, KH, KW) order, of a weight already
        # laid out that way.
        weight_strides = _meta((kh, kw, group_c, n_filters)).permute(3, 2, 0, 1).stride()
        relayout = _weight_along_filters
        stride_wf, stride_wk = 1, n_filters
    group_f = n_filters // groups

    def gemm_grid(meta):
        tiles = runtime.cdiv(m, meta["BLOCK_M"]) * runtime.cdiv(group_f, meta["BLOCK_N"])
        return (tiles, groups)

    return _ConvPlan(
        out_shape, out_strides, kernel=conv2d_implicit_gemm_kernel, grid=gemm_grid,
        scalars=(h, w, ow, ohw, m, group_c, group_f, *x_strides, stride_wf, stride_wk,
                 stride_yn, stride_yc, stride_yp, *conv_args, runtime.bucket(m)),
        consts=dict(
            KH=int(kh), KW=int(kw),  # constexprs: int() pins symbolic sizes
            HAS_BIAS=has_bias,
            CHANNEL_TILED=channel_tiled,
            EVEN_CHANNELS=bool(group_c % 64 == 0),
            X_PIXEL_MAJOR=x_pixel_major,
            Y_PIXEL_MAJOR=stride_yp < stride_yc,
            INPUT_PRECISION=precision,
            DOT_IN_FP32=interpret and dtype == torch.bfloat16,
        ),
        weight_strides=weight_strides, relayout=relayout,
        to_channels_last=copy_x, x_strides=x_strides, transpose=transpose,
    )  # fmt: skip


def _knobs() -> tuple:
    """The module settings a plan depends on, part of its key (tests and scripts change them)."""
    return (NCHW_VIA_CHANNELS_LAST, runtime.INTERPRET,
            (layout.BLOCK_R, layout.BLOCK_C, layout.NUM_WARPS))


def _find_plan(x, weight, stride, padding, dilation, groups, has_bias) -> _ConvPlan:
    key = (x.shape, x.stride(), weight.shape, x.dtype, (*stride, *padding, *dilation), groups,
           has_bias, _input_precision(x.dtype), _knobs())
    try:
        return _plan(*key)
    except TypeError:  # symbolic sizes under torch.compile are not hashable: no cache
        return _plan.__wrapped__(*key)


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by conv2d below). padding is
# [top, bottom, left, right]: padding="same" with an even dilated kernel pads one more on the
# bottom/right, like torch. The backward pass calls it with negative padding (a crop).
# Per call: the plan, the output, the copies the plan asks for (a bias with a stride, a weight
# not in the kernel's layout, x to channels-last) and the launch; everything else is planned.
# --------------------------------------------------------------------------------------------
@register_op("conv2d", fake=_conv2d_fake, autocast="lower_precision_fp")  # as F.conv2d
def _conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> torch.Tensor:
    plan = _find_plan(x, weight, stride, padding, dilation, groups, bias is not None)
    out = torch.empty_strided(plan.out_shape, plan.out_strides, dtype=x.dtype, device=x.device)
    kernel = plan.kernel
    if kernel is None:
        if plan.zero_fill:
            # No input channels: every window sums nothing, so the output is the bias (or zero).
            out.zero_()
            if bias is not None:
                out += bias.view(1, -1, 1, 1)
        return out
    if bias is None:
        bias = out  # never read when HAS_BIAS is False
    elif bias.stride(0) != 1:
        bias = bias.contiguous()
    if weight.stride() != plan.weight_strides:
        weight = plan.relayout(weight)
    with runtime.device_guard(x):
        if plan.to_channels_last:
            x = layout.copy_to_channels_last(x, *plan.transpose)
        runtime.launch_kernel(kernel, plan.grid, (x, weight, out, bias), plan.scalars, plan.consts,
                       plan.prepared)
    return out


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
    if grad.numel() == 0 or x.numel() == 0 or weight.numel() == 0:
        # Some dimension is 0 (no filters, no images, no pixels, no channels): every sum behind
        # a gradient is empty, so the gradients are zeros. cuDNN/ATen's grad helpers refuse
        # several of these shapes (zero filters), so answer before reaching them.
        if ctx.needs_input_grad[0]:
            grad_x = torch.zeros_like(x)
        if ctx.needs_input_grad[1]:
            grad_w = torch.zeros_like(weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:  # the bias still reached every output
            grad_bias = grad.sum(dim=(0, 2, 3), dtype=torch.float32).to(grad.dtype)
        return grad_x, grad_w, grad_bias, None, None, None, None
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
    if type(value) is int and value >= minimum:  # the common case, first (bool is not int here)
        return [value, value]
    if type(value) is tuple and len(value) == 2:  # nn.Conv2d keeps its arguments as such pairs
        first, second = value
        if type(first) is int and type(second) is int and min(first, second) >= minimum:
            return [first, second]
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


def _padding_amounts(padding, kernel_size, dilation, stride) -> list[int]:
    """[top, bottom, left, right] (``kernel_size``: the weight's (KH, KW))."""
    if type(padding) is int and padding >= 0:
        return [padding, padding, padding, padding]
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
        for d, k in zip(dilation, kernel_size):
            total = d * (k - 1)
            # torch pads the extra row/column of an odd total on the bottom/right.
            amounts += [total // 2, total - total // 2]
        return amounts
    p = _pair(padding, "padding", minimum=0)
    return [p[0], p[0], p[1], p[1]]


#: Where the kernels can read tensors (see runtime.check_kernel_device).
_KERNEL_DEVICE_TYPES = ("cuda", "cpu") if runtime.INTERPRET else ("cuda",)


def _tensors_pass(x, weight, bias) -> bool:
    """Whether the tensor checks of :func:`_check_conv_args` pass, in a fraction of their time
    (every call pays this; the full checks, with their messages, run only when it says no)."""
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    dtype, device = x.dtype, x.device
    if (
        dtype not in FLOAT_DTYPES
        or weight.dtype != dtype
        or device.type not in _KERNEL_DEVICE_TYPES
        or weight.device != device
        or x.dim() not in (3, 4)
        or weight.dim() != 4
    ):
        return False
    return bias is None or (
        isinstance(bias, torch.Tensor)
        and bias.dtype == dtype
        and bias.device == device
        and bias.dim() == 1
    )


def _is_plain(value) -> bool:
    """An int or a pair of ints, exactly (no bool, float or int subclass inside)."""
    return type(value) is int or (
        type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int
    )


def _check_conv_args(x, weight, bias, stride, padding, dilation, groups):
    """Every argument check, before any launch. Returns (stride, padding [top, bottom, left,
    right], dilation) as tuples."""
    if not _tensors_pass(x, weight, bias):
        runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES, ndim=(3, 4))
        runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=4)
        runtime.check_same_dtype(x=x, weight=weight)
        if bias is not None:
            runtime.check_tensor(bias, "bias", dtypes=FLOAT_DTYPES, ndim=1)
            runtime.check_same_dtype(x=x, bias=bias)
        runtime.check_same_device(x=x, weight=weight, bias=bias)
    key = (x.shape, weight.shape, None if bias is None else bias.shape, stride, padding, dilation,
           groups)
    # The shape checks depend on nothing else, and a network calls with the same few shapes
    # every step: cached, for plain ints and pairs of them only (True and 1.0 hash and compare
    # equal to 1, and must still be refused), and not while torch.compile traces this (it would
    # warn that it ignores the cache).
    if (type(groups) is int and _is_plain(stride) and _is_plain(dilation)
            and (type(padding) is str or _is_plain(padding))
            and not torch.compiler.is_compiling()):  # fmt: skip
        try:
            return _checked_geometry(*key)
        except TypeError:  # symbolic sizes are not hashable (a TypeError of a check recurs below)
            pass
    return _checked_geometry.__wrapped__(*key)


@functools.lru_cache(maxsize=1024)
def _checked_geometry(x_shape, w_shape, bias_shape, stride, padding, dilation, groups):
    """The checks of the shapes against each other and the conv arguments (errors name them),
    and the arguments in the op's form: see :func:`_check_conv_args`."""
    if type(groups) is not int and (isinstance(groups, bool) or not isinstance(groups, int)):
        raise TypeError(f"groups must be an int, got {type(groups).__name__}")
    if groups < 1:
        raise ValueError(f"groups must be positive, got {groups}")
    n_filters, group_c, kh, kw = w_shape
    channels, height, width = x_shape[-3:]
    if n_filters % groups != 0:
        raise ValueError(
            f"weight has {n_filters} filters, which groups={groups} does not divide "
            "(each group needs the same number of filters)"
        )
    if group_c * groups != channels:
        raise ValueError(
            f"x has {channels} channels but weight expects weight.shape[1] * groups = "
            f"{group_c} * {groups} = {group_c * groups} (weight is {tuple(w_shape)})"
        )
    if group_c != 1 and groups > _MAX_GRID_AXIS_1:
        raise ValueError(
            f"groups must be at most {_MAX_GRID_AXIS_1} unless depthwise, got {groups}"
        )
    if bias_shape is not None and bias_shape[0] != n_filters:
        raise ValueError(
            f"bias must have shape ({n_filters},) to match weight, got {tuple(bias_shape)}"
        )
    if kh == 0 or kw == 0:
        raise ValueError(f"weight must have a non-empty kernel, got shape {tuple(w_shape)}")

    stride = _pair(stride, "stride", minimum=1)
    dilation = _pair(dilation, "dilation", minimum=1)
    padding = _padding_amounts(padding, (kh, kw), dilation, stride)
    if (height + padding[0] + padding[1] < dilation[0] * (kh - 1) + 1
            or width + padding[2] + padding[3] < dilation[1] * (kw - 1) + 1):  # fmt: skip
        for axis, size, k, d, before, after in (
            ("height", height, kh, dilation[0], padding[0], padding[1]),
            ("width", width, kw, dilation[1], padding[2], padding[3]),
        ):
            if size + before + after < d * (k - 1) + 1:
                raise ValueError(
                    f"weight's dilated kernel {axis} {d * (k - 1) + 1} is larger than x's padded "
                    f"{axis} {size} + {before + after}: the output would be empty"
                )
    # Tuples: the cache hands the same ones to every call, so they must not be mutable.
    return tuple(stride), tuple(padding), tuple(dilation)


@runtime.follows_autocast(_conv2d)
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
