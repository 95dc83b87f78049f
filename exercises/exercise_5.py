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

Replace each ``...`` marked ``# TODO n`` with code, in order, then run
``python exercises/exercise_5.py`` (or ``exercise_5``): the checker tries ragged row lengths, large
values and float16, and says what is wrong. Stuck? ``print_if(f"x={x}", "=0")`` prints row 0's
block (interpreter mode), and ``solutions/solution_5.py`` has an answer.
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
    mask = ...  # TODO 1: True for the columns inside the row (< n_cols)
    x = ...  # TODO 2: load x_ptr + row * x_row_stride + cols, masked, other=-float("inf"), .to(tl.float32)
    numerator = ...  # TODO 3: tl.exp of x minus the row max (tl.max(x, axis=0))
    y = ...  # TODO 4: numerator divided by its sum over the row (tl.sum(numerator, axis=0))
    ...  # TODO 5: store y.to(out_ptr.dtype.element_ty) at out_ptr + row * out_row_stride + cols, masked


def softmax(x: torch.Tensor) -> torch.Tensor:
    check_tensors_gpu_ready(x)
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D matrix (rows, cols), got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    out = torch.empty_like(x)
    BLOCK_SIZE = ...  # TODO 6: the whole row in one block: triton.next_power_of_2(n_cols)
    # Wider rows, more warps to share the work of one program (ignored by the interpreter).
    num_warps = 16 if BLOCK_SIZE >= 8192 else 8 if BLOCK_SIZE >= 2048 else 4
    grid = ...  # TODO 7: a 1-tuple: one program per row
    softmax_kernel[grid](x, out, n_cols, x.stride(0), out.stride(0),
                         BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    return out


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
