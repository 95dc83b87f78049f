"""Layout copies: a tiled transpose, and NCHW -> channels-last (NHWC) built on it.

**Why a transpose needs tiles.** ``y = x.T`` reads ``x`` along its rows and writes ``y`` along its
rows, which are ``x``'s *columns*. A kernel that walks one of the two in memory order walks the
other with a stride: one of the two sides then touches a whole 32-byte sector for every 2- or
4-byte element, and runs at a fraction of the memory bandwidth. A tiled transpose moves a
``BLOCK_R x BLOCK_C`` tile at a time: the tile is *loaded* with consecutive lanes along ``x``'s
contiguous axis (16-byte vector loads) and *stored* with consecutive lanes along ``y``'s
contiguous axis (16-byte vector stores). The exchange between the two orders happens on chip:
Triton gives the load and the store different register layouts (its coalescing pass picks, for
each memory access, the axis its analysis proves contiguous) and converts between them through
shared memory, so each element crosses DRAM exactly twice, once in and once out.

**NCHW -> NHWC is a batched transpose.** A contiguous ``(N, C, H, W)`` tensor is ``N`` matrices of
``C x (H*W)``; its channels-last copy is the same ``N`` matrices transposed, ``(H*W) x C``. So
``to_channels_last(x)`` is ``transpose_copy(x.view(N, C, H*W))`` viewed back as ``(N, C, H, W)``
with channels-last strides: one read and one write of ``x``, at the memory bandwidth.

Indices are 32-bit unless a tensor spans 2**31 elements or more (then the kernel is specialised
with 64-bit offsets, ``INT64``): 32-bit address arithmetic is cheaper, and most tensors never
need more.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import register_op, wrap_triton

__all__ = ["transpose_copy", "to_channels_last"]

#: One tile a program: 64 x 64 elements (8 KB in fp16, 16 KB in fp32) with 4 warps, 32 elements a
#: thread. A tile row is 128 or 256 contiguous bytes on both sides: whole 32-byte sectors, 16-byte
#: vectors per thread. Read at every launch (a benchmark script can try others).
BLOCK_R = 64
BLOCK_C = 64
NUM_WARPS = 4

_INT32_LIMIT = 2**31


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


def transpose_args(shape, strides) -> tuple[tuple, tuple, dict]:
    """``(grid, scalar args, constexprs)`` of :func:`transpose_kernel` for x read as a (B, R, C)
    array of the given ``shape`` and element ``strides``: what a launch needs besides the two
    tensors, for launchers that plan their launches once per shape (conv2d)."""
    batch, rows, cols = shape
    stride_b, stride_r, stride_c = strides
    # 64-bit offsets when the copy (numel elements) or x (one past its farthest element; strides
    # are never negative) reaches 2**31.
    span = max(batch * rows * cols, 1 + (batch - 1) * stride_b + (rows - 1) * stride_r
               + (cols - 1) * stride_c)  # fmt: skip
    tiles = runtime.cdiv(rows, BLOCK_R) * runtime.cdiv(cols, BLOCK_C)
    consts = dict(BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, INT64=bool(span >= _INT32_LIMIT),
                  num_warps=NUM_WARPS)
    return (batch * tiles,), (rows, cols, stride_b, stride_r, stride_c), consts


def _transpose_into(x: torch.Tensor, y: torch.Tensor, shape, strides) -> torch.Tensor:
    """Launch the kernel: contiguous ``y`` holds (B, C, R) <- ``x`` read as a (B, R, C) array of
    the given ``shape`` and element ``strides`` (no view needed). Nothing checked: for launchers
    that already know their tensors (also under torch.compile: no data-dependent Python, the
    kernel goes through ``wrap_triton``)."""
    grid, scalars, consts = transpose_args(shape, strides)
    with runtime.device_guard(x):
        wrap_triton(transpose_kernel)[grid](x, y, *scalars, **consts)
    return y


def _transpose_copy_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-2], x.shape[-1], x.shape[-2]))


@register_op("transpose_copy", fake=_transpose_copy_fake)
def _transpose_copy(x: torch.Tensor) -> torch.Tensor:
    y = _transpose_copy_fake(x)
    if y.numel() == 0:
        return y
    if x.dim() == 2:
        return _transpose_into(x, y, (1, *x.shape), (0, *x.stride()))
    return _transpose_into(x, y, x.shape, x.stride())


def _transpose_copy_backward(ctx, grad):
    # The gradient of a transpose is the transpose of the gradient (a view: no copy needed).
    return grad.transpose(-1, -2)


_transpose_copy.register_autograd(_transpose_copy_backward)


def transpose_copy(x: torch.Tensor) -> torch.Tensor:
    """``x.transpose(-1, -2).contiguous()`` in one tiled pass (any dtype Triton loads).

    ``x`` is a (R, C) or (B, R, C) tensor with any strides; the result is a new contiguous
    (C, R) or (B, C, R) tensor. Differentiable.
    """
    runtime.check_tensor(x, "x", ndim=(2, 3))
    if x.is_complex():
        raise TypeError(f"x must be a real or bool tensor, got {x.dtype}")
    return _transpose_copy(x)


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous(memory_format=torch.channels_last)`` for an (N, C, H, W) tensor.

    Whenever H and W merge into one axis of pixels (every contiguous NCHW tensor, and views that
    slice only N or C) this is one tiled transpose per image of x read as (N, C, H*W) into
    channels-last memory, which is (N, H*W, C); any other layout goes through
    ``Tensor.contiguous``. Already channels-last: ``x`` itself. Internal helper for launchers (no
    argument checks; traceable by torch.compile inside a ``triton_op``).
    """
    if x.is_contiguous(memory_format=torch.channels_last):
        return x
    with runtime.device_guard(x):
        return copy_to_channels_last(x, channels_last_copy_args(x.shape, x.stride()))


def channels_last_copy_args(shape, strides):
    """``(grid, scalar args, constexprs)`` of the transpose that copies an (N, C, H, W) array of
    ``shape`` and ``strides`` into channels-last memory, read as (N, C, H*W) into (N, H*W, C); None
    where :func:`copy_to_channels_last` goes through ``Tensor.contiguous`` instead (H and W do not
    merge into one axis of pixels, or nothing to copy). A launcher that plans its launches once
    per shape (conv2d) keeps this and passes it to every call."""
    n, c, h, w = shape
    stride_n, stride_c, stride_h, stride_w = strides
    if w == 1:
        stride_pixel = stride_h
    elif h == 1 or stride_h == w * stride_w:
        stride_pixel = stride_w
    else:
        return None
    if 0 in shape:
        return None
    return transpose_args((n, c, h * w), (stride_n, stride_c, stride_pixel))


def copy_to_channels_last(x: torch.Tensor, args, prepared: dict | None = None) -> torch.Tensor:
    """A channels-last copy of ``x`` through ``args`` from :func:`channels_last_copy_args` (for
    ``x``'s shape and strides), under the caller's device guard. ``prepared``: a launch plan's
    dict of ready launches (see ``runtime.launch_kernel``), or None."""
    if args is None:
        return x.contiguous(memory_format=torch.channels_last)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    grid, scalars, consts = args
    runtime.launch_kernel(transpose_kernel, grid, (x, y), scalars, consts, prepared)
    return y
