"""Images in and out: a sample picture made on the spot (no download), and PNG/JPEG <-> tensors.

Kernels see an image as a float (3, H, W) tensor in [0, 1]: channel planes, as in the exercises.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw


def sample_image(height: int = 192, width: int = 256) -> torch.Tensor:
    """A colourful test card: smooth gradients (for sepia/greyscale), hard edges and a
    checkerboard (for the edge and Sobel filters), and a thin diagonal line (for motion blur)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    rgb = np.stack([u, v, 1.0 - 0.5 * (u + v)], axis=-1)
    img = Image.fromarray((rgb * 255).round().astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    s = min(height, width)
    draw.ellipse([0.08 * width, 0.12 * height, 0.08 * width + 0.38 * s, 0.12 * height + 0.38 * s],
                 fill=(230, 60, 40), outline=(255, 255, 255), width=3)
    draw.rectangle([0.55 * width, 0.15 * height, 0.9 * width, 0.45 * height], fill=(40, 170, 90))
    cell = max(s // 16, 2)
    for i in range(6):
        for j in range(6):
            if (i + j) % 2 == 0:
                x0, y0 = int(0.55 * width) + j * cell, int(0.55 * height) + i * cell
                draw.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=(250, 250, 250))
    draw.line([0, height - 1, width - 1, 0], fill=(20, 20, 20), width=2)
    draw.text((6, height - 16), "triton-workshop", fill=(255, 255, 255))
    return to_tensor(img)


def to_tensor(img: Image.Image) -> torch.Tensor:
    arr = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()


def load_image(path: str | Path) -> torch.Tensor:
    """A PNG/JPEG (any mode Pillow reads) as a float32 (3, H, W) tensor in [0, 1]."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no image at {path}")
    with Image.open(path) as img:
        return to_tensor(img)


def save_image(t: torch.Tensor, path: str | Path) -> Path:
    """Save (3, H, W) or (H, W) values in [0, 1] (clipped) as an image; format from the suffix."""
    arr = t.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu()
    if arr.dim() == 3:
        arr = arr.permute(1, 2, 0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr.numpy()).save(path)
    return path
