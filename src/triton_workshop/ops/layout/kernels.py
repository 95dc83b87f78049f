"""The layout kernel: a tiled transpose, ``y[b, c, r] = x[b, r, c]``.

A transpose reads one tensor along its rows and writes the other along its columns; moving a
tile at a time lets both sides use whole memory sectors (the exchange between the two orders
happens on chip). NCHW -> channels-last is this same kernel on ``(N, C, H*W)``. The host code
(tuning, plans, ``transpose_copy``, ``to_channels_last``) is in ``__init__.py``; the long "why" in
``docs/kernels/layout.md``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["transpose_kernel"]


@triton.jit
def transpose_kernel(
    x_ptr, y_ptr, R, C,
    stride_xb, stride_xr, stride_xc,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    """y[b, c, r] = x[b, r, c]: ``x`` is any (B, R, C) view, ``y`` a contiguous (B, C, R) tensor.

    One program per tile and batch (flat grid: the batch may exceed axis 1's 65,535 limit). No
    stride of ``x`` is assumed; Triton specialises a stride of 1 to a constant, and that is what
    lets it prove the load contiguous along the source's contiguous axis, whichever it is.
    ``INT64``: 64-bit offsets, for tensors that span 2**31 elements or more (32-bit address
    arithmetic is cheaper, and most tensors never need more).
    """
    pid = tl.program_id(0)
    tiles_c = tl.cdiv(C, BLOCK_C)
    tiles = tl.cdiv(R, BLOCK_R) * tiles_c
    b = pid // tiles
    tile = pid % tiles
    offs_r = (tile // tiles_c) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = (tile % tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r < R)[:, None] & (offs_c < C)[None, :]
    if INT64:
        b = b.to(tl.int64)
        offs_r = offs_r.to(tl.int64)
        offs_c = offs_c.to(tl.int64)
    # Load as (R, C): consecutive lanes along x's contiguous axis (C for a row-major x).
    x_ptrs = x_ptr + b * stride_xb + offs_r[:, None] * stride_xr + offs_c[None, :] * stride_xc
    tile_values = tl.load(x_ptrs, mask=mask)
    # Store the same (R, C) tile at y[b, c, r]: r is y's contiguous axis, so the store's lanes run
    # along R. The switch of register layout between the two is Triton's, through shared memory.
    y_ptrs = y_ptr + b * R * C + offs_c[None, :] * R + offs_r[:, None]
    tl.store(y_ptrs, tile_values, mask=mask)
