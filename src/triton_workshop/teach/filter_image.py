"""``workshop filter IN --filter NAME -o OUT``: one image through one of the library's image ops."""

from __future__ import annotations

from pathlib import Path

from .. import runtime
from .images import load_image, save_image

COLOUR_OPS = ("greyscale", "sepia")
SIGNED_FILTERS = {"edge", "sobel_x", "sobel_y"}  # signed response: the picture shows its magnitude


def filter_names() -> list[str]:
    from ..ops.image import FILTERS

    return [*COLOUR_OPS, *FILTERS]


def apply_filter(img, name: str):
    """``img`` (3, H, W) in [0, 1] through ``name``; the result is ready to save as a picture."""
    from ..ops import image

    if name == "greyscale":
        return image.greyscale(img)
    if name == "sepia":
        return image.sepia(img)
    if name not in image.FILTERS:
        raise ValueError(f"filter must be one of {', '.join(filter_names())}; got {name!r}")
    out = image.filter2d(img, image.get_filter(name, device=img.device))
    return out.abs() if name in SIGNED_FILTERS else out


def filter_file(src: str | Path, name: str, dst: str | Path) -> int:
    try:
        img = load_image(src).to(runtime.DEVICE)
        out = apply_filter(img, name)
    except (FileNotFoundError, ValueError) as exc:
        print(f"❌ {exc}")
        return 2
    path = save_image(out, dst)
    print(f"✅ {name}: {src} -> {path} ({img.shape[2]}x{img.shape[1]}, {runtime.mode_description()})")
    return 0
