"""Exercise 1: vector addition. 1-D grid, offsets, masks.

A kernel runs once per *program*; each program owns BLOCK_SIZE consecutive elements. The program
finds its elements from its id (``tl.program_id(0)``), loads them, adds, and stores. The last
block usually sticks out past the end of the vectors: a mask switches those lanes off so that
they neither read nor write memory that is not ours.

Replace each ``...`` marked ``# TODO n`` with code, in order, then run
``python exercises/exercise_1.py`` (or ``exercise_1``): the checker tries ragged sizes and says
what is wrong. Stuck? ``print_if(f"offsets={offsets}", "=1")`` prints from program 1 only
(interpreter mode), and ``solutions/solution_1.py`` has an answer.
"""

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401

BLOCK_SIZE = 128


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = ...  # TODO 1: the BLOCK_SIZE indices this program owns (use pid and tl.arange)
    mask = ...  # TODO 2: True for the offsets that fall inside the vectors (< n_elements)
    x = ...  # TODO 3: load x at x_ptr + offsets, masked
    y = ...  # TODO 4: load y the same way
    ...  # TODO 5: store x + y at out_ptr + offsets, masked


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    check_tensors_gpu_ready(x, y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    out = torch.empty_like(x)
    n = out.numel()
    grid = ...  # TODO 6: a 1-tuple: how many programs cover n elements? (cdiv rounds up)
    add_kernel[grid](x, y, out, n, BLOCK_SIZE=BLOCK_SIZE)
    return out


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
