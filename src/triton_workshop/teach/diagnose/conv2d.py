"""Exercise 3 (2-D convolution): the classic mistakes (a flipped or transposed filter, a shifted
window, a border of -1, taps skipped, channels mixed up), each with the output it produces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .suspects import NAN, Suspect

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["FILTER_SUSPECTS"]


def _correlate(img: torch.Tensor, kernel: torch.Tensor, shift=(0, 0), border: float = 0.0) -> torch.Tensor:
    """out[c, y, x] = sum_ij kernel[i, j] * img[c, y + i - K//2 + dy, x + j - K//2 + dx], with
    ``border`` outside the image."""
    C, H, W = img.shape
    K = kernel.shape[-1]
    r = K // 2
    dy, dx = shift
    pad = r + max(abs(dy), abs(dx))
    padded = F.pad(img.double(), (pad, pad, pad, pad), value=border)
    k = kernel.double().cpu()
    out = torch.zeros(C, H, W, dtype=torch.float64, device=img.device)
    for i in range(K):
        for j in range(K):
            y0, x0 = pad + i - r + dy, pad + j - r + dx
            out += k[i, j].item() * padded[:, y0:y0 + H, x0:x0 + W]
    return out


def _filter_with(kernel_fn=None, shift=(0, 0), border=0.0):
    def output(c: Case) -> torch.Tensor:
        img, kernel = c.inputs
        k = kernel_fn(kernel) if kernel_fn else kernel
        return _correlate(img, k, shift, border).to(img.dtype)

    return output


def _last_tap_only(c: Case) -> torch.Tensor:
    img, kernel = c.inputs
    K = kernel.shape[-1]
    only = torch.zeros_like(kernel)
    only[K - 1, K - 1] = kernel[K - 1, K - 1]
    return _correlate(img, only).to(img.dtype)


def _every_channel_from(c: Case, source: int) -> torch.Tensor:
    img, kernel = c.inputs
    one = _correlate(img[source:source + 1], kernel)
    return one.expand(img.shape[0], -1, -1).to(img.dtype)


def _store_without_channel_offset(c: Case) -> torch.Tensor:
    # Every channel's program stores into plane 0; the interpreter runs channel C - 1 last.
    img, kernel = c.inputs
    out = torch.full(img.shape, NAN, dtype=torch.float64)
    out[0] = _correlate(img[-1:], kernel)[0]
    return out.to(img.dtype)


def _drop_last_taps(rows: bool, cols: bool):
    def fn(kernel: torch.Tensor) -> torch.Tensor:
        k = kernel.clone()
        if rows:
            k[-1, :] = 0
        if cols:
            k[:, -1] = 0
        return k

    return fn


def _shift_name(dy: int, dx: int, r: int) -> tuple[str, str]:
    if (dy, dx) == (r, r):
        return ("a window that is not centred" + (" (or off by one)" if r == 1 else ""),
                "tap (i, j) reads the pixel i - K // 2 rows and j - K // 2 columns away: "
                "in_rows = rows[:, None] + (i - K // 2), in_cols = cols[None, :] + (j - K // 2)")
    return (f"a window shifted by ({dy:+d}, {dx:+d}) pixels",
            "off by one: tap (i, j) reads the pixel (i - K // 2, j - K // 2) away from the output "
            "pixel, in both directions")


def _filter_suspects() -> tuple:
    found = [
        Suspect("a flipped filter (a convolution, not a correlation)",
                "tap (i, j) multiplies kernel[i, j] (at kernel_ptr + i * K + j), not "
                "kernel[K - 1 - i, K - 1 - j]", _filter_with(lambda k: k.flip(0, 1))),
        Suspect("a filter flipped top to bottom", "tap row i multiplies kernel row i: "
                "kernel_ptr + i * K + j", _filter_with(lambda k: k.flip(0))),
        Suspect("a filter flipped left to right", "tap column j multiplies kernel column j: "
                "kernel_ptr + i * K + j", _filter_with(lambda k: k.flip(1))),
        Suspect("a transposed filter", "the weight of tap (i, j) is at kernel_ptr + i * K + j "
                "(row i, column j), not j * K + i", _filter_with(lambda k: k.t())),
        Suspect("acc = instead of acc +=", "each tap replaced the sum so far, so only the last "
                "tap remains: acc += pixels * weight", _last_tap_only),
        Suspect("a border of -1 (other=-1.0)", "pixels outside the image count as zero: "
                "other=0.0", _filter_with(border=-1.0)),
        Suspect("loops that skip the last row and column of taps", "range(K) walks all K taps",
                _filter_with(_drop_last_taps(True, True))),
        Suspect("loops that skip the last row of taps", "range(K) walks all K rows of taps",
                _filter_with(_drop_last_taps(True, False))),
        Suspect("loops that skip the last column of taps", "range(K) walks all K columns of taps",
                _filter_with(_drop_last_taps(False, True))),
        Suspect("every channel read from channel 0", "each program reads its own channel's plane: "
                "img_ptr + channel * H * W", lambda c: _every_channel_from(c, 0)),
        Suspect("every channel stored into plane 0", "each program stores into its own channel's "
                "plane: out_ptr + channel * H * W + ...", _store_without_channel_offset),
    ]
    for r in (1, 2):
        shifts = {(r, r)} | {(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)} - {(0, 0)}
        for dy, dx in sorted(shifts):
            name, advice = _shift_name(dy, dx, r)
            found.append(Suspect(name, advice, (lambda dy, dx, r: lambda c: (
                _filter_with(shift=(dy, dx))(c) if c.inputs[1].shape[-1] // 2 == r else None))(dy, dx, r)))
    return tuple(found)


FILTER_SUSPECTS = _filter_suspects()
