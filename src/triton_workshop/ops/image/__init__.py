"""Image ops: colour transforms on pixel planes, and 2-D filters that slide down column strips.

An image batch is an ``(N, C, H, W)`` tensor: ``N * C`` planes of ``H * W`` pixels. This file teaches
two ways to cut such a batch into programs.

**Colour transforms** (``greyscale``, ``sepia``) mix the three channels of one pixel and nothing else,
so they are memory-bound: every byte is read once and written once, and the only goal is to keep
the loads wide and in flight. A program owns ``BLOCK_SIZE`` consecutive pixels of one image and
loads the red, green and blue values from three planes ``stride_c`` elements apart. The grid is 1-D
(``N * blocks_per_plane`` programs): grid axes 1 and 2 are limited to 65,535 programs, axis 0 to
2**31 - 1, so the batch goes on axis 0. When the plane is contiguous the pixel offset *is* the flat
index, which keeps the loads vectorised; any other layout (channels-last, a sliced view) is read
in place through its strides, at the cost of a division per pixel, instead of being copied first.

**Filters** (``filter2d``) need a neighbourhood: each output pixel of a ``K x K`` filter reads
``K * K`` inputs. Loading the input tile once per tap (``K * K`` shifted, unaligned loads an
output) is simple, and the repeats hit in cache, but the load units then run out long before
DRAM does: on an H100 that design moved 64% of copy bandwidth at 3 x 3 and 31% at 5 x 5. So a
program here walks *down* a strip of columns instead: each thread owns one 16-byte vector of
output columns (4 fp32, 8 fp16/bf16) and, for each input row, loads the VEC-aligned blocks that
cover those columns plus the ``K - 1`` columns of halo (16-byte vector loads), splits them into
registers (``reshape`` + ``split``: no data moves), and adds the row's ``K x K x V`` products
into the ``K`` output rows that this input row touches. Those rows are a sliding window of
accumulators, a tuple of ``K * V`` fp32 values carried by the loop: when the window slides, the
oldest row is complete and is stored, one 16-byte vector a thread. Each input row is loaded
once: at 3 x 3 or 5 x 5 in fp32, three loads a thread (halo, own vector, halo) for 4 outputs,
where the tile design issued 9 or 25 loads, most of them scalar, for every output.
The zero border of ``padding="same"`` is the ``other=0.0`` of the masked loads that fall outside
the image. The grid is 1-D: (plane, chunk of rows, strip of columns) per program; a chunk's
first ``K - 1`` input rows only warm its window up, so chunks are tall.

Numerics: float images are computed in fp32 and rounded once on the store. uint8 images are
computed *exactly*, in integer thousandths (the colour weights have three decimals), then rounded
half to even and saturated at 255, so they agree with ``torch.round`` on the exact value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op, wrap_triton

__all__ = ["FILTERS", "filter2d", "get_filter", "greyscale", "sepia"]

COLOR_DTYPES = (*FLOAT_DTYPES, torch.uint8)
PADDINGS = ("same", "valid")

# Colour ops: 1024 pixels a program, 4 warps, 8 pixels a thread. Measured on an H100 (8 x 3 x
# 2160 x 3840 images): fp32 moves ~3.0 TB/s whatever the block (it is DRAM-bound); uint8 reaches
# ~2.8 TB/s contiguous and channels-last does best with small blocks (2.3 TB/s here against
# 2.0 at 4096 / 8 warps), where more programs keep more of the strided loads in flight.
COLOR_BLOCK_SIZE = 1024
COLOR_NUM_WARPS = 4

# filter2d: a program is 2 warps, one 16-byte vector of output columns a thread, so a strip is
# 256 fp32 or 512 fp16 columns wide (each thread loads its own horizontal halo, so narrow strips
# cost nothing, and more programs fill the GPU better). Chunks of rows: as tall as gives
# FILTER_PROGRAMS_PER_SM programs an SM, between max(FILTER_MIN_ROWS, 2 (K - 1)) and
# FILTER_MAX_ROWS: each chunk re-reads and re-multiplies K - 1 rows of vertical halo. Taps stay
# in registers up to FILTER_PRELOAD_MAX_TAPS (7 x 7); beyond, the K * K taps would crowd out the
# K * V accumulators, so they are reloaded from L1 for each row and a thread owns
# FILTER_LARGE_K_COLUMNS columns to share each reload (8: 2 vectors fp32, 1 vector fp16).
# Module constants, so a sweep can set them (see scripts/diagnose.py's knobs()).
FILTER_NUM_WARPS = 2
FILTER_VECTORS_PER_THREAD = 1
# Per filter size (others: the defaults above): 3 x 3 takes 8 warps; 5 x 5 4 vectors a thread and
# 7 x 7 2 (more work per row load hides the shifts; 4 at 7 x 7 would crowd the registers). H100,
# fp32 3 x 8192 x 8192 (scripts/diagnose.py filter2d): 3 x 3 2578 -> 2670 GB/s, 5 x 5 2275 ->
# 2570 GB/s (2 vectors: 2426) against the defaults.
FILTER_NUM_WARPS_BY_K = {3: 8}
FILTER_VECTORS_PER_THREAD_BY_K = {5: 4, 7: 2}
FILTER_PROGRAMS_PER_SM = 32
FILTER_MIN_ROWS = 16
FILTER_MAX_ROWS = 64
FILTER_PRELOAD_MAX_TAPS = 49
FILTER_LARGE_K_COLUMNS = 8

# In-plane pixel indices are int32 (cheap division for strided layouts); batch offsets are int64.
_MAX_PLANE_PIXELS = 2**31 - 1 - COLOR_BLOCK_SIZE


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
@triton.jit
def _load_rgb_block(
    img_ptr, n_pixels, width, blocks_per_plane,
    stride_n, stride_c, stride_h, stride_w,
    PLANE_CONTIGUOUS: tl.constexpr, IS_UINT8: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """The red, green and blue values of this program's pixels, as int32 (uint8 images) or fp32."""
    pid = tl.program_id(0)
    # int64 before any multiplication by a stride: image * stride_n passes 2**31 for big batches.
    image = (pid // blocks_per_plane).to(tl.int64)
    offs = (pid % blocks_per_plane) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_pixels
    if PLANE_CONTIGUOUS:
        # Consecutive lanes, consecutive addresses: the loads vectorise.
        pixel = offs
    else:
        pixel = (offs // width).to(tl.int64) * stride_h + (offs % width).to(tl.int64) * stride_w
    red_ptr = img_ptr + image * stride_n + pixel
    # Step plane by plane: 2 * stride_c in int32 could wrap for a view into a huge tensor.
    green_ptr = red_ptr + stride_c
    blue_ptr = green_ptr + stride_c
    # Masked-off lanes are never stored, so their `other` value does not matter.
    r = tl.load(red_ptr, mask=mask)
    g = tl.load(green_ptr, mask=mask)
    b = tl.load(blue_ptr, mask=mask)
    if IS_UINT8:
        r = r.to(tl.int32)
        g = g.to(tl.int32)
        b = b.to(tl.int32)
    else:
        r = r.to(tl.float32)
        g = g.to(tl.float32)
        b = b.to(tl.float32)
    return r, g, b, image, offs, mask


@triton.jit
def _mix_rgb(
    r, g, b,
    WR: tl.constexpr, WG: tl.constexpr, WB: tl.constexpr,
    IS_UINT8: tl.constexpr, SATURATE: tl.constexpr,
):
    """(WR * r + WG * g + WB * b) / 1000, the weights given in integer thousandths."""
    if IS_UINT8:
        # Exact: at most 1351 * 255 = 344,505, far inside int32. Rounding the exact value (rather
        # than an fp32 approximation of it) makes ties (x.5) round the same way every time.
        total = r * WR + g * WG + b * WB
        quotient = total // 1000
        remainder = total - quotient * 1000
        round_up = (remainder > 500) | ((remainder == 500) & ((quotient % 2) == 1))
        value = quotient + round_up.to(tl.int32)
        if SATURATE:
            value = tl.minimum(value, 255)
    else:
        value = r * (WR / 1000) + g * (WG / 1000) + b * (WB / 1000)
        if SATURATE:
            value = tl.minimum(value, 1.0)
    return value


@triton.jit
def greyscale_kernel(
    img_ptr, out_ptr, n_pixels, width, blocks_per_plane,
    stride_n, stride_c, stride_h, stride_w,
    PLANE_CONTIGUOUS: tl.constexpr, IS_UINT8: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    r, g, b, image, offs, mask = _load_rgb_block(
        img_ptr, n_pixels, width, blocks_per_plane, stride_n, stride_c, stride_h, stride_w,
        PLANE_CONTIGUOUS, IS_UINT8, BLOCK_SIZE,
    )
    # ITU-R BT.601 luma. The weights sum to 1, so [0, 1] (or [0, 255]) stays in range: no clip.
    grey = _mix_rgb(r, g, b, 299, 587, 114, IS_UINT8, False)
    out_ptrs = out_ptr + image * n_pixels + offs
    tl.store(out_ptrs, grey.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sepia_kernel(
    img_ptr, out_ptr, n_pixels, width, blocks_per_plane,
    stride_n, stride_c, stride_h, stride_w,
    PLANE_CONTIGUOUS: tl.constexpr, IS_UINT8: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    r, g, b, image, offs, mask = _load_rgb_block(
        img_ptr, n_pixels, width, blocks_per_plane, stride_n, stride_c, stride_h, stride_w,
        PLANE_CONTIGUOUS, IS_UINT8, BLOCK_SIZE,
    )
    # Rows of the classic sepia matrix sum to 1.351, 1.203 and 0.937: bright pixels overflow,
    # so red and green saturate at white.
    red = _mix_rgb(r, g, b, 393, 769, 189, IS_UINT8, True)
    green = _mix_rgb(r, g, b, 349, 686, 168, IS_UINT8, True)
    blue = _mix_rgb(r, g, b, 272, 534, 131, IS_UINT8, True)
    out_dtype = out_ptr.dtype.element_ty
    # The output is contiguous (N, 3, H, W); image * 3 is int64 before it meets n_pixels.
    red_out = out_ptr + image * 3 * n_pixels + offs
    green_out = red_out + n_pixels
    blue_out = green_out + n_pixels
    tl.store(red_out, red.to(out_dtype), mask=mask)
    tl.store(green_out, green.to(out_dtype), mask=mask)
    tl.store(blue_out, blue.to(out_dtype), mask=mask)


@triton.constexpr_function
def _bit_reverse(value, bits):
    """``value`` with its lowest ``bits`` bits in reverse order (compile time)."""
    return int(format(value, f"0{bits}b")[::-1], 2) if bits else 0


@triton.constexpr_function
def _log2(value):
    return value.bit_length() - 1


@triton.jit
def _row_window(blocks, N_BLOCKS: tl.constexpr, GROUPS: tl.constexpr, VEC: tl.constexpr):
    """The columns of ``N_BLOCKS`` ``[GROUPS, VEC]`` blocks, in order, as one tuple of ``[GROUPS]``
    fp32 tensors: a thread's window of one input row, one register per column.

    Each thread holds whole rows of a block, so this is free: halving the last dimension with
    ``reshape`` + ``split`` only renames registers. A split takes the even and the odd columns
    apart, so after log2(VEC) of them the pieces are in bit-reversed column order."""
    window = ()
    for b in tl.static_range(N_BLOCKS):
        parts = (blocks[b],)
        for level in tl.static_range(_log2(VEC)):
            halves = ()
            for p in tl.static_range(1 << level):
                even, odd = tl.split(tl.reshape(parts[p], (GROUPS, VEC >> (level + 1), 2)))
                halves = halves + (even, odd)
            parts = halves
        for c in tl.static_range(VEC):
            column = tl.reshape(parts[_bit_reverse(c, _log2(VEC))], (GROUPS,))
            window = window + (column.to(tl.float32),)
    return window


@triton.jit
def _store_filter_row(
    out_ptrs, out_cols, out_limit, values,
    BLOCKS: tl.constexpr, GROUPS: tl.constexpr, VEC: tl.constexpr,
):
    """Store ``BLOCKS * VEC`` ``[GROUPS]`` fp32 columns (a thread's outputs in one row) at
    ``out_ptrs`` (the first VEC-wide block's), the columns ``< out_limit`` only. The inverse of
    :func:`_row_window`: joins rebuild each ``[GROUPS, VEC]`` block, stored as one 16-byte vector a
    thread. One block a store: a wider per-thread tile would be re-laid out (through shared memory)
    to store consecutive 16-byte vectors from consecutive threads."""
    for b in tl.static_range(BLOCKS):
        parts = ()
        for p in tl.static_range(VEC):
            parts = parts + (tl.reshape(values[b * VEC + _bit_reverse(p, _log2(VEC))], (GROUPS, 1)),)
        for level in tl.static_range(_log2(VEC)):
            joined = ()
            for p in tl.static_range(VEC >> (level + 1)):
                pair = tl.join(parts[2 * p], parts[2 * p + 1])
                joined = joined + (tl.reshape(pair, (GROUPS, 2 << level)),)
            parts = joined
        tile = parts[0].to(out_ptrs.dtype.element_ty)
        tl.store(out_ptrs + b * VEC, tile, mask=out_cols + b * VEC < out_limit)


@triton.jit
def _load_filter_row(row_ptr, row, row_begin, row_end, width, col_offsets, cols, N_BLOCKS: tl.constexpr):
    """The ``N_BLOCKS`` raw ``[GROUPS, VEC]`` blocks of input row ``row`` (a tuple). A row outside
    ``[row_begin, row_end)`` and columns outside the image read as zero: the padding of "same"."""
    # Out-of-range rows get no column in range: a scalar select, not a broadcast scalar mask.
    row_width = tl.where((row >= row_begin) & (row < row_end), width, 0)
    blocks = ()
    for b in tl.static_range(N_BLOCKS):
        mask = (cols[b] >= 0) & (cols[b] < row_width)
        blocks = blocks + (tl.load(row_ptr + col_offsets[b], mask=mask, other=0.0),)
    return blocks


@triton.jit
def filter2d_kernel(
    img_ptr, weight_ptr, out_ptr,
    channels, height, width, out_height, out_width,
    stride_n, stride_c, stride_h, stride_w,
    weight_stride_0, weight_stride_1,
    n_strips, n_chunks, rows_per_program,
    K: tl.constexpr, PAD: tl.constexpr, GROUPS: tl.constexpr, VEC: tl.constexpr,
    BLOCKS: tl.constexpr, LEFT_BLOCKS: tl.constexpr, RIGHT_BLOCKS: tl.constexpr,
    PRELOAD_TAPS: tl.constexpr, PREFETCH: tl.constexpr,
):
    # Program = (plane, chunk of rows_per_program output rows, strip of GROUPS * V columns);
    # thread g owns output columns g * V .. g * V + V - 1 of the strip, a whole row at a time.
    V: tl.constexpr = BLOCKS * VEC
    N_BLOCKS: tl.constexpr = LEFT_BLOCKS + BLOCKS + RIGHT_BLOCKS
    # window[t] is input column c0 - LEFT_BLOCKS * VEC + t (c0: the thread's first output
    # column), so output column c0 + v meets tap column j (input c0 + v + j - PAD) at t = v + j + SKIP.
    SKIP: tl.constexpr = LEFT_BLOCKS * VEC - PAD
    pid = tl.program_id(0)
    strip = pid % n_strips
    chunk = (pid // n_strips) % n_chunks
    # 64-bit because N * C * stride can pass 2**31.
    plane = (pid // n_strips // n_chunks).to(tl.int64)
    image = plane // channels
    channel = plane % channels

    col_base = strip * (GROUPS * V)
    groups = tl.arange(0, GROUPS)
    # The thread's input window, as VEC-aligned blocks of VEC columns: LEFT_BLOCKS of halo, the
    # BLOCKS under its outputs, RIGHT_BLOCKS of halo. Aligned blocks load as 16-byte vectors
    # (when stride_w == 1 and rows start 16-byte aligned), and the K horizontal shifts of a tap
    # row come from registers rather than K loads. Row-invariant: computed once.
    cols = ()
    col_offsets = ()
    for b in tl.static_range(N_BLOCKS):
        block_cols = col_base + groups[:, None] * V + (b - LEFT_BLOCKS) * VEC + tl.arange(0, VEC)[None, :]
        cols = cols + (block_cols,)
        col_offsets = col_offsets + (block_cols.to(tl.int64) * stride_w,)
    # Output columns of each thread's first VEC-wide block.
    out_cols = col_base + groups[:, None] * V + tl.arange(0, VEC)[None, :]

    first_out = chunk * rows_per_program
    end_out = tl.minimum(first_out + rows_per_program, out_height)
    # The chunk needs input rows first_out - PAD .. end_out - 1 + (K - 1 - PAD); the loads are
    # masked to the part of that inside the image.
    first_in = first_out - PAD
    row_begin = tl.maximum(first_in, 0)
    row_end = tl.minimum(end_out + (K - 1 - PAD), height)

    if PRELOAD_TAPS:
        # Small K: the K * K taps stay in registers for the whole program.
        taps = ()
        for i in tl.static_range(K):
            for j in tl.static_range(K):
                tap = tl.load(weight_ptr + i * weight_stride_0 + j * weight_stride_1).to(tl.float32)
                taps = taps + (tl.full((GROUPS,), tap, tl.float32),)

    # The sliding window of K output rows that the current input row contributes to, oldest
    # first: acc[s * V + v] is column v of output row (input row) - (K - 1) + PAD + s, which the
    # input row meets at tap row K - 1 - s. After each input row the oldest is complete: it is
    # stored and the window slides by one (a renaming of loop-carried values, not a copy).
    zero = tl.zeros((GROUPS,), dtype=tl.float32)
    acc = ()
    for s in tl.static_range(K * V):
        acc = acc + (zero,)

    row_ptr = img_ptr + image * stride_n + channel * stride_c + first_in.to(tl.int64) * stride_h
    out_row_ptr = (
        out_ptr + plane * out_height * out_width
        + (first_in - (K - 1) + PAD).to(tl.int64) * out_width + out_cols
    )
    # Software pipelining (PREFETCH): the next row is loaded before this row's arithmetic and
    # store (a load cannot move above a store that might alias it), so each warp keeps a row of
    # loads in flight while it computes.
    if PREFETCH:
        pending = _load_filter_row(row_ptr, first_in, row_begin, row_end, width, col_offsets, cols, N_BLOCKS)
    for row in range(first_in, end_out + (K - 1 - PAD)):
        if PREFETCH:
            blocks = pending
            pending = _load_filter_row(
                row_ptr + stride_h, row + 1, row_begin, row_end, width, col_offsets, cols, N_BLOCKS,
            )
        else:
            blocks = _load_filter_row(row_ptr, row, row_begin, row_end, width, col_offsets, cols, N_BLOCKS)
        row_ptr += stride_h
        if not PRELOAD_TAPS:
            # Large K: K * K registers of taps would crowd out the accumulators; they are
            # reloaded (from L1) for each row, and used V times each.
            taps = ()
            for i in tl.static_range(K):
                for j in tl.static_range(K):
                    tap = tl.load(weight_ptr + i * weight_stride_0 + j * weight_stride_1).to(tl.float32)
                    taps = taps + (tl.full((GROUPS,), tap, tl.float32),)
        window = _row_window(blocks, N_BLOCKS, GROUPS, VEC)
        # K * K * V fused multiply-adds into the K rows of the window: fp32 accumulation
        # whatever the image dtype (K * K products of fp16/bf16 would lose bits).
        slid = ()
        for s in tl.static_range(K):
            for v in tl.static_range(V):
                total = acc[s * V + v]
                for j in tl.static_range(K):
                    total = tl.fma(taps[(K - 1 - s) * K + j], window[v + j + SKIP], total)
                slid = slid + (total,)
        # The oldest row is complete. It is ours unless it lies above the chunk: the first
        # K - 1 - PAD input rows only warm the window up.
        out_limit = tl.where(row - (K - 1) + PAD >= first_out, out_width, 0)
        _store_filter_row(out_row_ptr, out_cols, out_limit, slid, BLOCKS, GROUPS, VEC)
        out_row_ptr += out_width
        acc = slid[V:]
        for v in tl.static_range(V):
            acc = acc + (zero,)


# --------------------------------------------------------------------------------------------
# Launchers, registered as torch ops. Each takes (C, H, W) or (N, C, H, W) and reads the input
# through its strides; outputs are new contiguous tensors.
# --------------------------------------------------------------------------------------------
def _batched(img: torch.Tensor) -> torch.Tensor:
    """An (N, C, H, W) view (no copy) of a (C, H, W) or (N, C, H, W) image."""
    return img if img.dim() == 4 else img.unsqueeze(0)


def _plane_is_contiguous(img4: torch.Tensor) -> bool:
    """Whether pixel (h, w) of each plane sits at h * W + w: then the flat index is the offset.
    Strides of size-1 dimensions never matter (their index is always 0)."""
    _, _, height, width = img4.shape
    _, _, stride_h, stride_w = img4.stride()
    return (width == 1 or stride_w == 1) and (height == 1 or stride_h == width)


def _launch_color(kernel, img: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The shared launch of the colour kernels: empty → grid → launch."""
    img4 = _batched(img)
    batch, _, height, width = img4.shape
    n_pixels = height * width
    if out.numel() == 0:
        return out
    blocks_per_plane = runtime.cdiv(n_pixels, COLOR_BLOCK_SIZE)
    grid = (batch * blocks_per_plane,)
    with runtime.device_guard(img):
        wrap_triton(kernel)[grid](
            img4, out, n_pixels, width, blocks_per_plane,
            *img4.stride(),
            PLANE_CONTIGUOUS=_plane_is_contiguous(img4),
            IS_UINT8=img.dtype == torch.uint8,
            BLOCK_SIZE=COLOR_BLOCK_SIZE,
            num_warps=COLOR_NUM_WARPS,
        )
    return out


def _greyscale_shape(img: torch.Tensor) -> tuple[int, ...]:
    return (*img.shape[:-3], *img.shape[-2:])


def _greyscale_fake(img: torch.Tensor) -> torch.Tensor:
    return img.new_empty(_greyscale_shape(img))


def _sepia_fake(img: torch.Tensor) -> torch.Tensor:
    return img.new_empty(img.shape)


@register_op("greyscale", fake=_greyscale_fake)
def _greyscale(img: torch.Tensor) -> torch.Tensor:
    out = torch.empty(_greyscale_shape(img), dtype=img.dtype, device=img.device)
    return _launch_color(greyscale_kernel, img, out)


@register_op("sepia", fake=_sepia_fake)
def _sepia(img: torch.Tensor) -> torch.Tensor:
    out = torch.empty(img.shape, dtype=img.dtype, device=img.device)
    return _launch_color(sepia_kernel, img, out)


def _filter2d_geometry(img: torch.Tensor, kernel: torch.Tensor, padding: str):
    """(pad, out_height, out_width). An empty image gives an empty output, never a negative size."""
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    size = kernel.shape[-1]
    height, width = img.shape[-2:]
    if padding == "same":
        return size // 2, height, width
    return 0, max(height - size + 1, 0), max(width - size + 1, 0)


def _filter2d_fake(img: torch.Tensor, kernel: torch.Tensor, padding: str) -> torch.Tensor:
    _, out_height, out_width = _filter2d_geometry(img, kernel, padding)
    return img.new_empty((*img.shape[:-2], out_height, out_width))


@dataclass(frozen=True)
class _FilterPlan:
    """How filter2d is launched: a 1-D grid of ``programs`` = planes x n_chunks x n_strips."""

    vec: int  # columns in 16 bytes: one vector load
    blocks: int  # vectors of output columns a thread owns
    num_warps: int
    groups: int  # threads of a program
    n_strips: int
    n_chunks: int
    rows_per_program: int
    preload_taps: bool
    programs: int


def _filter2d_plan(img: torch.Tensor, size: int, planes: int, out_height: int, out_width: int) -> _FilterPlan:
    vec = 16 // img.element_size()
    preload = size * size <= FILTER_PRELOAD_MAX_TAPS
    num_warps = FILTER_NUM_WARPS_BY_K.get(size, FILTER_NUM_WARPS)
    if not preload:
        # Reloaded taps are shared by a thread's columns: more columns, fewer reloads an output.
        blocks = max(1, FILTER_LARGE_K_COLUMNS // vec)
    else:
        blocks = FILTER_VECTORS_PER_THREAD_BY_K.get(size, FILTER_VECTORS_PER_THREAD)
    groups = 32 * num_warps
    n_strips = runtime.cdiv(out_width, groups * vec * blocks)
    # Enough programs to fill the GPU several times over, each as tall as that allows: the
    # K - 1 rows above and below a chunk are read and multiplied again by its neighbours.
    fewest = max(FILTER_MIN_ROWS, 2 * (size - 1))
    rows = runtime.cdiv(planes * n_strips * out_height, runtime.num_sms(img.device) * FILTER_PROGRAMS_PER_SM)
    rows = min(max(rows, fewest), max(FILTER_MAX_ROWS, fewest), out_height)
    n_chunks = runtime.cdiv(out_height, rows)
    return _FilterPlan(
        vec=vec, blocks=blocks, num_warps=num_warps, groups=groups, n_strips=n_strips,
        n_chunks=n_chunks, rows_per_program=rows, preload_taps=preload, programs=planes * n_chunks * n_strips,
    )


@register_op("filter2d", fake=_filter2d_fake)
def _filter2d(img: torch.Tensor, kernel: torch.Tensor, padding: str) -> torch.Tensor:
    pad, out_height, out_width = _filter2d_geometry(img, kernel, padding)
    out = torch.empty(
        (*img.shape[:-2], out_height, out_width), dtype=img.dtype, device=img.device
    )
    if out.numel() == 0:
        return out
    img4 = _batched(img)
    batch, channels, height, width = img4.shape
    size = kernel.shape[-1]
    plan = _filter2d_plan(img, size, batch * channels, out_height, out_width)
    with runtime.device_guard(img):
        wrap_triton(filter2d_kernel)[(plan.programs,)](
            img4, kernel, out,
            channels, height, width, out_height, out_width,
            *img4.stride(),
            *kernel.stride(),
            plan.n_strips, plan.n_chunks, plan.rows_per_program,
            K=size, PAD=pad, GROUPS=plan.groups, VEC=plan.vec, BLOCKS=plan.blocks,
            LEFT_BLOCKS=runtime.cdiv(pad, plan.vec),
            RIGHT_BLOCKS=runtime.cdiv(size - 1 - pad, plan.vec),
            # Prefetching a row needs its registers; large K has arithmetic enough to hide loads.
            PRELOAD_TAPS=plan.preload_taps, PREFETCH=plan.preload_taps,
            num_warps=plan.num_warps,
        )
    return out


# --------------------------------------------------------------------------------------------
# Public API: validate (clear errors naming the argument), then call the registered op.
# --------------------------------------------------------------------------------------------
def _check_rgb(img) -> None:
    runtime.check_tensor(img, "img", dtypes=COLOR_DTYPES, ndim=(3, 4))
    if img.shape[-3] != 3:
        raise ValueError(
            f"img must have 3 colour channels (RGB) in dimension -3, got shape {tuple(img.shape)}"
        )
    if img.shape[-2] * img.shape[-1] > _MAX_PLANE_PIXELS:
        raise ValueError(f"img planes of more than 2**31 pixels are not supported, got {tuple(img.shape)}")


def greyscale(img: torch.Tensor) -> torch.Tensor:
    """Luminosity greyscale ``0.299 R + 0.587 G + 0.114 B``.

    ``img`` is ``(3, H, W)`` or ``(N, 3, H, W)``, any strides (channels-last and sliced views are
    read in place). Returns ``(H, W)`` or ``(N, H, W)``, contiguous, in ``img``'s dtype: float32,
    float16 or bfloat16 (values in [0, 1], fp32 arithmetic inside), or uint8 (values in [0, 255],
    computed exactly and rounded to nearest, ties to even, like ``torch.round``).
    """
    _check_rgb(img)
    return _greyscale(img)


def sepia(img: torch.Tensor) -> torch.Tensor:
    """The classic sepia tone, ``out = M @ rgb`` per pixel, clipped at white::

        R' = 0.393 R + 0.769 G + 0.189 B
        G' = 0.349 R + 0.686 G + 0.168 B
        B' = 0.272 R + 0.534 G + 0.131 B

    Shapes and dtypes as :func:`greyscale`; the result has ``img``'s shape (contiguous). Float
    images are clipped at 1.0 (inputs are expected in [0, 1]); uint8 images are computed exactly,
    rounded half to even and saturated at 255.
    """
    _check_rgb(img)
    return _sepia(img)


def filter2d(img: torch.Tensor, kernel: torch.Tensor, padding: str = "same") -> torch.Tensor:
    """Filter every channel of ``img`` with the same ``K x K`` ``kernel`` (cross-correlation, as
    ``F.conv2d`` computes it: the kernel is not flipped).

    ``img`` is ``(C, H, W)`` or ``(N, C, H, W)``, float32/float16/bfloat16, any strides; ``kernel``
    is a square float tensor of odd size on the same device. ``padding="same"`` pads with zeros and
    keeps ``H x W``; ``"valid"`` returns ``(H - K + 1) x (W - K + 1)``. Equal to
    ``F.conv2d(img, kernel.expand(C, 1, K, K), padding=padding, groups=C)``, accumulated in fp32,
    returned contiguous in ``img``'s dtype.
    """
    runtime.check_tensor(img, "img", dtypes=FLOAT_DTYPES, ndim=(3, 4))
    runtime.check_tensor(kernel, "kernel", dtypes=FLOAT_DTYPES, ndim=2)
    runtime.check_same_device(img=img, kernel=kernel)
    rows, cols = kernel.shape
    if rows != cols:
        raise ValueError(f"kernel must be square (K x K), got shape {tuple(kernel.shape)}")
    if rows % 2 == 0:
        raise ValueError(f"kernel size must be odd (it has a centre pixel), got {rows} x {cols}")
    if not isinstance(padding, str) or padding not in PADDINGS:
        raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}")
    height, width = img.shape[-2:]
    if padding == "valid" and img.numel() > 0 and (height < rows or width < rows):
        raise ValueError(
            f"padding='valid' needs img at least as large as kernel: img is {height} x {width}, "
            f"kernel is {rows} x {cols}"
        )
    return _filter2d(img, kernel, padding)


# --------------------------------------------------------------------------------------------
# Named filters.
# --------------------------------------------------------------------------------------------
def _binomial_5x5() -> torch.Tensor:
    row = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
    return torch.outer(row, row) / 256.0


_SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])

#: Named ``K x K`` filters for :func:`filter2d` (float32, on the CPU; see :func:`get_filter`).
FILTERS: dict[str, torch.Tensor] = {
    "sharpen": torch.tensor([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]]),
    "edge": torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 8.0, -1.0], [-1.0, -1.0, -1.0]]),
    "gaussian": _binomial_5x5(),
    "motion_blur": torch.eye(5) / 5.0,
    "sobel_x": _SOBEL_X,
    "sobel_y": _SOBEL_X.T.contiguous(),
}


def get_filter(
    name: str, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A fresh copy of the named filter on ``device`` (the CPU by default) in ``dtype``."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}; valid names: {', '.join(sorted(FILTERS))}")
    return FILTERS[name].to(device=device, dtype=dtype, copy=True)
