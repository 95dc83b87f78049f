"""Exercise 3: 2-D convolution of an image with a K x K filter, per channel.

Each output pixel is the weighted sum of the K x K input pixels around it (a correlation, as
``F.conv2d`` computes it); pixels outside the image count as zero. A 3-D grid gives each program
one channel (``pid_0``) and one BLOCK_H x BLOCK_W tile of it (``pid_1``, ``pid_2``). Two nested
loops walk the K x K taps: for each tap the program loads the input tile shifted by that tap
(masked where it falls outside the image: the zero border) and accumulates in float32.

Neighbouring taps load overlapping tiles: the overlap comes from the cache, not from memory.
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
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    plane = img_ptr + channel * H * W
    acc = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
    for i in range(K):
        for j in range(K):
            # The input pixel under tap (i, j), centred on the output pixel.
            in_rows = rows[:, None] + (i - K // 2)
            in_cols = cols[None, :] + (j - K // 2)
            inside = (in_rows >= 0) & (in_rows < H) & (in_cols >= 0) & (in_cols < W)
            pixels = tl.load(plane + in_rows * W + in_cols, mask=inside, other=0.0)
            weight = tl.load(kernel_ptr + i * K + j)
            acc += pixels.to(tl.float32) * weight
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    tl.store(out_ptr + channel * H * W + rows[:, None] * W + cols[None, :], acc, mask=mask)


def filter2d(img: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    check_tensors_gpu_ready(img, kernel)
    if img.dim() != 3:
        raise ValueError(f"img must have shape (C, H, W), got {tuple(img.shape)}")
    if kernel.dim() != 2 or kernel.shape[0] != kernel.shape[1] or kernel.shape[0] % 2 == 0:
        raise ValueError(f"kernel must be K x K with K odd, got {tuple(kernel.shape)}")
    C, H, W = img.shape
    K = kernel.shape[0]
    out = torch.empty_like(img)
    grid = (C, cdiv(H, BLOCK_H), cdiv(W, BLOCK_W))
    filter2d_kernel[grid](img, kernel, out, H, W, K=K, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W)
    return out


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
