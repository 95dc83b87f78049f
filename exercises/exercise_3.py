"""Exercise 3: 2-D convolution of an image with a K x K filter, per channel.

Each output pixel is the weighted sum of the K x K input pixels around it (a correlation, as
``F.conv2d`` computes it); pixels outside the image count as zero. A 3-D grid gives each program
one channel (``pid_0``) and one BLOCK_H x BLOCK_W tile of it (``pid_1``, ``pid_2``). Two nested
loops walk the K x K taps: for each tap the program loads the input tile shifted by that tap
(masked where it falls outside the image: the zero border) and accumulates in float32.

Replace each ``...`` marked ``# TODO n``, in order; run ``python exercises/exercise_3.py``.
"""

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401

BLOCK_H = 16
BLOCK_W = 32


@triton.jit
def filter2d_kernel(img_ptr, kernel_ptr, out_ptr, H, W, K: tl.constexpr,
                    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    channel = tl.program_id(0)
    rows = ...  # TODO 1: this program's output rows (grid axis 1)
    cols = ...  # TODO 2: this program's output columns (grid axis 2)
    plane = img_ptr + channel * H * W
    acc = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
    for i in range(K):
        for j in range(K):
            in_rows = ...  # TODO 3: input rows under tap i, centred: rows shifted by i - K // 2, as a column
            in_cols = ...  # TODO 4: input columns under tap j, as a row
            inside = ...  # TODO 5: the shifted pixel lies inside the image (4 comparisons)
            pixels = ...  # TODO 6: load them, masked, with other=0.0 (the zero border)
            weight = tl.load(kernel_ptr + i * K + j)
            acc += pixels.to(tl.float32) * weight
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    ...  # TODO 7: store acc into this channel's plane of out, masked


def filter2d(img: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    check_tensors_gpu_ready(img, kernel)
    if img.dim() != 3:
        raise ValueError(f"img must have shape (C, H, W), got {tuple(img.shape)}")
    if kernel.dim() != 2 or kernel.shape[0] != kernel.shape[1] or kernel.shape[0] % 2 == 0:
        raise ValueError(f"kernel must be K x K with K odd, got {tuple(kernel.shape)}")
    C, H, W = img.shape
    K = kernel.shape[0]
    out = torch.empty_like(img)
    grid = ...  # TODO 8: a 3-tuple: channels, row blocks, column blocks
    filter2d_kernel[grid](img, kernel, out, H, W, K=K, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W)
    return out


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
