"""Layout copies (host code): ``transpose_copy``, and ``to_channels_last`` built on it.

``transpose_copy(x)`` is ``x.transpose(-1, -2).contiguous()`` in one tiled pass; an NCHW tensor's
channels-last copy is the same transpose of ``(N, C, H*W)``, planned here once per shape for
launchers that repeat it (conv2d). The kernel is in :mod:`.kernels`; why it is tiled:
``docs/kernels/layout.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import runtime
from ...runtime import register_op
from .kernels import transpose_kernel

__all__ = [
    "LayoutTuning", "TUNING", "channels_last_copy_plan", "copy_to_channels_last",
    "to_channels_last", "transpose_copy", "transpose_kernel", "transpose_plan",
]


@dataclass(frozen=True)
class LayoutTuning:
    """The transpose's launch settings: part of every plan's key (conv2d's too, for the copy of
    an NCHW input), so a replaced object (``dataclasses.replace(layout.TUNING, ...)``) takes effect
    at the next call."""

    #: One tile a program, 4 warps: a 64-element tile row is 128 or 256 contiguous bytes on both
    #: sides (whole 32-byte sectors, 16-byte vectors a thread), and 32 elements a thread keep the
    #: tile in registers.
    block_r: int = 64
    block_c: int = 64
    num_warps: int = 4
    #: Copies whose tensors span this many elements get 64-bit offsets (``INT64``); below it,
    #: 32-bit address arithmetic is cheaper. Tests lower it to reach the 64-bit path on small data.
    int32_limit: int = 2**31


TUNING = LayoutTuning()


@runtime.plan_cache()
def transpose_plan(shape, strides, dtype: torch.dtype, tuning: LayoutTuning) -> runtime.LaunchPlan:
    """The launch of :func:`transpose_kernel` that copies x, read as a (B, R, C) array of the
    given ``shape`` and element ``strides``, into a contiguous (B, C, R) tensor:
    ``plan.launch(x, y)``. ``dtype`` (x's and y's) is part of the key though the arguments do not
    depend on it: the plan's prepared launches are compiled for one dtype."""
    batch, rows, cols = shape
    stride_b, stride_r, stride_c = strides
    # 64-bit offsets when the copy (numel elements) or x (one past its farthest element; strides
    # are never negative) reaches the limit.
    span = max(batch * rows * cols, 1 + (batch - 1) * stride_b + (rows - 1) * stride_r
               + (cols - 1) * stride_c)  # fmt: skip
    tiles = runtime.cdiv(rows, tuning.block_r) * runtime.cdiv(cols, tuning.block_c)
    consts = dict(BLOCK_R=tuning.block_r, BLOCK_C=tuning.block_c,
                  INT64=bool(span >= tuning.int32_limit), num_warps=tuning.num_warps)
    return runtime.LaunchPlan(transpose_kernel, (batch * tiles,),
                              scalars=(rows, cols, stride_b, stride_r, stride_c), consts=consts)


def _transpose_copy_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-2], x.shape[-1], x.shape[-2]))


@register_op("transpose_copy", fake=_transpose_copy_fake)
def _transpose_copy(x: torch.Tensor) -> torch.Tensor:
    y = _transpose_copy_fake(x)
    if y.numel() == 0:
        return y
    if x.dim() == 2:
        plan = transpose_plan((1, *x.shape), (0, *x.stride()), x.dtype, TUNING)
    else:
        plan = transpose_plan(x.shape, x.stride(), x.dtype, TUNING)
    with runtime.device_guard(x):
        plan.launch(x, y)
    return y


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
        plan = channels_last_copy_plan(x.shape, x.stride(), x.dtype, TUNING)
        return copy_to_channels_last(x, plan)


def channels_last_copy_plan(shape, strides, dtype: torch.dtype,
                            tuning: LayoutTuning) -> runtime.LaunchPlan | None:
    """The transpose that copies an (N, C, H, W) array of ``shape`` and ``strides`` into
    channels-last memory, read as (N, C, H*W) into (N, H*W, C); None where
    :func:`copy_to_channels_last` goes through ``Tensor.contiguous`` instead (H and W do not
    merge into one axis of pixels, or nothing to copy). A launcher that plans its launches once
    per shape (conv2d) keeps this in its own plan and passes it to every call."""
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
    return transpose_plan((n, c, h * w), (stride_n, stride_c, stride_pixel), dtype, tuning)


def copy_to_channels_last(x: torch.Tensor, plan: runtime.LaunchPlan | None) -> torch.Tensor:
    """A channels-last copy of ``x`` through ``plan`` from :func:`channels_last_copy_plan` (for
    ``x``'s shape and strides), under the caller's device guard."""
    if plan is None:
        return x.contiguous(memory_format=torch.channels_last)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    plan.launch(x, y)
    return y
