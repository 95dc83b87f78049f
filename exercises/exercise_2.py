"""Exercise 2: greyscale and sepia. 2-D grids, broadcasting, channel offsets.

An image is a (3, H, W) tensor: three planes, R then G then B, each H rows of W pixels. A 2-D
grid gives each program a BLOCK_H x BLOCK_W tile: ``pid_0`` picks the row block, ``pid_1`` the
column block. Row offsets as a column (``[:, None]``) and column offsets as a row (``[None, :]``)
*broadcast* into the tile's 2-D offsets, and the mask is built the same way. A channel plane
starts ``H * W`` elements after the previous one.

* greyscale: 0.299 R + 0.587 G + 0.114 B, output (H, W);
* sepia: R' = 0.393 R + 0.769 G + 0.189 B, G' = 0.349 R + 0.686 G + 0.168 B,
  B' = 0.272 R + 0.534 G + 0.131 B, each clipped at 1.0; output (3, H, W).

Replace each ``...`` marked ``# TODO n``, in order; run ``python exercises/exercise_2.py``.
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
    rows = ...  # TODO 1: the BLOCK_H row indices of this program (pid_0)
    cols = ...  # TODO 2: the BLOCK_W column indices of this program (pid_1)
    offsets = ...  # TODO 3: 2-D offsets in one plane: rows as a column times W, plus cols as a row
    mask = ...  # TODO 4: inside the image in both directions
    plane = H * W
    r = tl.load(img_ptr + offsets, mask=mask)
    g = ...  # TODO 5: load the G plane (one plane further)
    b = ...  # TODO 6: load the B plane
    grey = ...  # TODO 7: the luminosity-weighted sum
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
    new_r = ...  # TODO 8: the sepia R', clipped at 1.0 (tl.minimum)
    new_g = ...  # TODO 9: G', clipped
    new_b = ...  # TODO 10: B', clipped
    tl.store(out_ptr + offsets, new_r, mask=mask)
    ...  # TODO 11: store new_g and new_b in their planes of out


def _check_image(img: torch.Tensor) -> None:
    check_tensors_gpu_ready(img)
    if img.dim() != 3 or img.shape[0] != 3:
        raise ValueError(f"img must have shape (3, H, W), got {tuple(img.shape)}")


def greyscale(img: torch.Tensor) -> torch.Tensor:
    _check_image(img)
    _, H, W = img.shape
    out = torch.empty((H, W), dtype=img.dtype, device=img.device)
    grid = ...  # TODO 12: a 2-tuple: row blocks, column blocks
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
