"""Elementwise ops, and the workshop's first lesson in fusion.

``torch.sqrt(a * b + c)`` in eager PyTorch is three kernels (multiply, add, square root): each
reads its inputs from memory and writes a temporary, 5 reads + 3 writes in all. One Triton kernel
reads ``a``, ``b`` and ``c`` once and writes the result once, 3 reads + 1 write: for a memory-bound
op the speed-up is the ratio of bytes moved.

Both kernels are the same 1-D pattern: each program owns ``BLOCK_SIZE`` consecutive elements, the
offsets are 64-bit so that tensors past 2**31 elements index correctly, and the mask switches off
the lanes of the last block that fall past the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op, wrap_triton

# 4096 fp32 elements a program, 8 warps: 16 elements a thread, four 16-byte loads in flight per
# input, enough to cover memory latency on an H100 without a tail effect on small tensors.
BLOCK_SIZE = 4096
NUM_WARPS = 8


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    # Add in fp32 and round once: exact for fp32, correctly rounded for fp16/bf16 (and the
    # interpreter cannot add bf16 natively: it would add the raw bit patterns).
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def mul_add_sqrt_kernel(a_ptr, b_ptr, c_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    # fp16/bf16 are widened to fp32 for the arithmetic, rounded once on the store.
    a = tl.load(a_ptr + offsets, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask).to(tl.float32)
    c = tl.load(c_ptr + offsets, mask=mask).to(tl.float32)
    out = tl.sqrt(a * b + c)
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def _grid(n: int):
    return (runtime.cdiv(n, BLOCK_SIZE),)


def _prepare(**tensors: torch.Tensor) -> list[torch.Tensor]:
    """Validate, then broadcast to one shape and promote to one floating dtype, as torch does.

    The kernels walk flat memory, so operands that are broadcast or strided are made contiguous
    here (one extra copy; contiguous same-shape inputs, the fast path, are passed through).
    """
    for name, t in tensors.items():
        runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES)
    runtime.check_same_device(**tensors)
    values = list(tensors.values())
    first = values[0]
    if all(t.shape == first.shape and t.dtype == first.dtype and t.is_contiguous() for t in values):
        return values  # the common case, without broadcast_tensors' and to()'s Python overhead
    dtype = first.dtype
    for t in tensors.values():
        dtype = torch.promote_types(dtype, t.dtype)
    try:
        shaped = torch.broadcast_tensors(*tensors.values())
    except RuntimeError:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in tensors.items())
        raise ValueError(f"shapes do not broadcast: {shapes}") from None
    return [t.to(dtype).contiguous() for t in shaped]


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register_op("add", fake=lambda x, y: _empty_like(x))
def _add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = _empty_like(x)
    n = out.numel()
    if n == 0:
        return out
    with runtime.device_guard(x):
        wrap_triton(add_kernel)[_grid(n)](x, y, out, n, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)
    return out


@register_op("fused_mul_add_sqrt", fake=lambda a, b, c: _empty_like(a))
def _fused_mul_add_sqrt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    out = _empty_like(a)
    n = out.numel()
    if n == 0:
        return out
    with runtime.device_guard(a):
        wrap_triton(mul_add_sqrt_kernel)[_grid(n)](
            a, b, c, out, n, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS
        )
    return out


def _add_backward(ctx, grad):
    return grad, grad


_add.register_autograd(_add_backward)


def _mul_add_sqrt_setup(ctx, inputs, output):
    a, b, _ = inputs
    ctx.save_for_backward(a, b, output)


def _mul_add_sqrt_backward(ctx, grad):
    a, b, out = ctx.saved_tensors
    # d sqrt(u) = du / (2 sqrt(u)), u = a*b + c
    g = grad / (2 * out)
    return g * b, g * a, g


_fused_mul_add_sqrt.register_autograd(_mul_add_sqrt_backward, setup_context=_mul_add_sqrt_setup)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` (broadcast and promoted like ``torch.add``) in one Triton kernel."""
    x, y = _prepare(x=x, y=y)
    return _add(x, y)


def fused_mul_add_sqrt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``torch.sqrt(a * b + c)`` in one pass over memory (fp32 arithmetic inside)."""
    a, b, c = _prepare(a=a, b=b, c=c)
    return _fused_mul_add_sqrt(a, b, c)
