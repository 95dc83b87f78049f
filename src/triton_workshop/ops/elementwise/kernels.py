"""Elementwise kernels: the workshop's first lesson in fusion.

Both kernels are the same 1-D pattern: each program owns ``BLOCK_SIZE`` consecutive elements, the
offsets are 64-bit so that tensors past 2**31 elements index correctly, and the mask switches off
the lanes of the last block that fall past the end. Why one kernel beats PyTorch's three is in
docs/kernels/elementwise.md; the launchers are in ``__init__.py``.
"""

import triton
import triton.language as tl


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
