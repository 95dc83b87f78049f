"""Exercise 1: vector addition. 1-D grid, offsets, masks.

A kernel runs once per *program*; each program owns BLOCK_SIZE consecutive elements. The program
finds its elements from its id (``tl.program_id(0)``), loads them, adds, and stores. The last
block usually sticks out past the end of the vectors: a mask switches those lanes off so that
they neither read nor write memory that is not ours.

Run it: ``python solutions/solution_1.py`` (or ``solution_1``). The checker tries ragged sizes.
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
    # The elements this program owns: block number pid, BLOCK_SIZE wide.
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    # The last block may stick out past the end: those lanes must not touch memory.
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    check_tensors_gpu_ready(x, y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    out = torch.empty_like(x)
    n = out.numel()
    # Enough programs to cover every element: round up.
    grid = (cdiv(n, BLOCK_SIZE),)
    add_kernel[grid](x, y, out, n, BLOCK_SIZE=BLOCK_SIZE)
    return out


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
