"""Exercise 2: greyscale and sepia. 2-D grids, broadcasting, channel offsets.

An image is a (3, H, W) tensor: three planes, R then G then B, each H rows of W pixels. A 2-D
grid gives each program a BLOCK_H x BLOCK_W tile: ``pid_0`` picks the row block, ``pid_1`` the
column block. Row offsets as a column (``[:, None]``) and column offsets as a row (``[None, :]``)
*broadcast* into the tile's 2-D offsets, and the mask is built the same way. A channel plane
starts ``H * W`` elements after the previous one.

* greyscale: 0.299 R + 0.587 G + 0.114 B, output (H, W);
* sepia: each output channel a weighted sum of R, G, B (the classic matrix), clipped at 1.0.
"""

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401

BLOCK_H = 16
BLOCK_W = 32


@triton.jit
def greyscale_kernel(img_ptr, out_ptr, H, W, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_0 = tl.program_id(0)
    pid_1 = tl.program_id(1)
    rows = pid_0 * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = pid_1 * BLOCK_W + tl.arange(0, BLOCK_W)
    # (BLOCK_H, 1) and (1, BLOCK_W) broadcast to the tile's (BLOCK_H, BLOCK_W) offsets.
    offsets = rows[:, None] * W + cols[None, :]
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    plane = H * W  # the G plane starts one plane after R, B two
    r = tl.load(img_ptr + offsets, mask=mask)
    g = tl.load(img_ptr + plane + offsets, mask=mask)
    b = tl.load(img_ptr + 2 * plane + offsets, mask=mask)
    grey = 0.299 * r + 0.587 * g + 0.114 * b
    tl.store(out_ptr + offsets, grey, mask=mask)


@triton.jit
def sepia_kernel(img_ptr, out_ptr, H, W, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_0 = tl.program_id(0)
    pid_1 = tl.program_id(1)
    rows = pid_0 * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = pid_1 * BLOCK_W + tl.arange(0, BLOCK_W)
    offsets = rows[:, None] * W + cols[None, :]
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    plane = H * W
    r = tl.load(img_ptr + offsets, mask=mask)
    g = tl.load(img_ptr + plane + offsets, mask=mask)
    b = tl.load(img_ptr + 2 * plane + offsets, mask=mask)
    # Bright pixels would go past 1.0 (the weights of R' sum to 1.351): clip.
    new_r = tl.minimum(0.393 * r + 0.769 * g + 0.189 * b, 1.0)
    new_g = tl.minimum(0.349 * r + 0.686 * g + 0.168 * b, 1.0)
    new_b = tl.minimum(0.272 * r + 0.534 * g + 0.131 * b, 1.0)
    tl.store(out_ptr + offsets, new_r, mask=mask)
    tl.store(out_ptr + plane + offsets, new_g, mask=mask)
    tl.store(out_ptr + 2 * plane + offsets, new_b, mask=mask)


def _check_image(img: torch.Tensor) -> None:
    check_tensors_gpu_ready(img)
    if img.dim() != 3 or img.shape[0] != 3:
        raise ValueError(f"img must have shape (3, H, W), got {tuple(img.shape)}")


def greyscale(img: torch.Tensor) -> torch.Tensor:
    _check_image(img)
    _, H, W = img.shape
    out = torch.empty((H, W), dtype=img.dtype, device=img.device)
    grid = (cdiv(H, BLOCK_H), cdiv(W, BLOCK_W))
    greyscale_kernel[grid](img, out, H, W, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W)
    return out


def sepia(img: torch.Tensor) -> torch.Tensor:
    _check_image(img)
    _, H, W = img.shape
    out = torch.empty_like(img)
    grid = (cdiv(H, BLOCK_H), cdiv(W, BLOCK_W))
    sepia_kernel[grid](img, out, H, W, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W)
    return out


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
