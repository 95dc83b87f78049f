"""Exercise 5: fused softmax. One program per row, the whole row in one block.

softmax(x)_i = exp(x_i) / sum_j exp(x_j), over each row of a 2-D matrix. Eager PyTorch written out
by hand (``x.max``, ``x - max``, ``exp``, ``sum``, ``/``) makes several passes over memory, each
reading and writing the whole matrix. Fused, each program loads its row once, does all the
arithmetic in registers, and stores the result once: one read and one write per element. Memory
traffic is what limits this kernel, so fewer passes means faster.

The row must fit in one block, and ``tl.arange`` needs a power of two: ``BLOCK_SIZE`` is the next
power of two at or above the row length, so a block usually sticks out past the end of the row.
Two details make the masked lanes harmless and the result exact:

* Load them as ``-inf`` (``other=-float("inf")``): -inf never wins the max, and exp(-inf) = 0 adds
  nothing to the sum. ``other=0.0`` would add exp(0 - max) to the sum once per padded lane.
* Subtract the row max before ``tl.exp``: softmax does not change when a constant is subtracted
  from a row, and exp of a float32 above ~88 overflows to inf (inf / inf = NaN). After the
  subtraction every exponent is <= 0, so exp lies in (0, 1] and the sum is at least 1.

The arithmetic runs in float32 whatever the input dtype; the result is rounded once, on the store.

Run it: ``python solutions/solution_5.py`` (or ``solution_5``). The checker tries ragged row
lengths, large values and float16.
"""

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)  # one program per row
    cols = tl.arange(0, BLOCK_SIZE)
    # The block is a power of two, the row usually is not: lanes past the end are switched off.
    mask = cols < n_cols
    # Padding loads as -inf: it never wins the max and exp(-inf) = 0 adds nothing to the sum.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    # Subtract the row max first: every exponent is <= 0, so exp cannot overflow.
    numerator = tl.exp(x - tl.max(x, axis=0))
    y = numerator / tl.sum(numerator, axis=0)
    # Round to the output's dtype once, here.
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    check_tensors_gpu_ready(x)
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D matrix (rows, cols), got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    out = torch.empty_like(x)
    # The whole row in one block: the next power of two at or above the row length.
    BLOCK_SIZE = triton.next_power_of_2(n_cols)
    # Wider rows, more warps to share the work of one program (ignored by the interpreter).
    num_warps = 16 if BLOCK_SIZE >= 8192 else 8 if BLOCK_SIZE >= 2048 else 4
    # One program per row.
    grid = (n_rows,)
    softmax_kernel[grid](x, out, n_cols, x.stride(0), out.stride(0),
                         BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    return out


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
