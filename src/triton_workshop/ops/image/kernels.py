"""The image kernels: colour transforms on pixel planes, and a 2-D filter that walks column strips.

``greyscale_kernel`` and ``sepia_kernel`` mix the three channels of each pixel (memory-bound: one
read, one write, wide loads); ``filter2d_kernel`` slides a ``K x K`` filter down a strip of
columns, each input row loaded once into registers and added into a sliding window of ``K``
accumulator rows. Float images are computed in fp32, uint8 ones exactly in integer thousandths.
The host code (tuning, plans, registered ops, public functions, named filters) is in
``__init__.py``; the long "why" in ``docs/kernels/image.md``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["filter2d_kernel", "greyscale_kernel", "sepia_kernel"]


# --------------------------------------------------------------------------------------------
# Colour transforms: a program owns BLOCK_SIZE consecutive pixels of one image, and loads their
# red, green and blue values from three planes stride_c elements apart.
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


# --------------------------------------------------------------------------------------------
# filter2d: a program walks down a strip of columns; each thread owns one 16-byte vector of
# output columns (or a few) and keeps a sliding window of K output rows in registers.
# --------------------------------------------------------------------------------------------
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
    """out[plane] = img[plane] cross-correlated with the ``K x K`` weight, zero-padded by ``PAD``.

    Each input row is loaded once (VEC-aligned 16-byte blocks plus the horizontal halo), split
    into registers and added into the ``K`` output rows it touches; the oldest is then complete
    and stored. ``PRELOAD_TAPS``: the ``K * K`` taps stay in registers (small K); otherwise they
    are reloaded from L1 each row. ``PREFETCH``: the next row is loaded before this row's work.
    """
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
