"""Exercise 4 (tiled matmul): the classic mistakes (a K tile that never advances, an accumulator
replaced at each step, TF32 in tl.dot), each with the output it produces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .suspects import Suspect

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["MATMUL_SUSPECTS"]


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 (10 mantissa bits, to nearest even), as a GPU's tensor
    cores read them."""
    bits = t.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
    rounded = torch.where(torch.isfinite(t.float()), rounded, bits)
    return (rounded - ((rounded >> 31) << 32)).to(torch.int32).view(torch.float32)


def _matmul_k_tiles(c: Case) -> list[tuple[int, int]]:
    K = c.inputs[0].shape[1]
    bk = int(c.constants.get("BLOCK_K", 32))
    return [(k0, min(k0 + bk, K)) for k0 in range(0, K, bk)]


def _matmul_first_tile_every_step(c: Case) -> torch.Tensor:
    a, b = c.inputs
    tiles = _matmul_k_tiles(c)
    lo, hi = tiles[0]
    return (len(tiles) * (a[:, lo:hi].double() @ b[lo:hi].double())).to(a.dtype)


def _matmul_last_tile_only(c: Case) -> torch.Tensor:
    a, b = c.inputs
    lo, hi = _matmul_k_tiles(c)[-1]
    return (a[:, lo:hi].double() @ b[lo:hi].double()).to(a.dtype)


def _matmul_tf32(c: Case) -> torch.Tensor | None:
    a, b = c.inputs
    if a.dtype != torch.float32:
        return None
    return (_tf32(a).double() @ _tf32(b).double()).to(a.dtype)


MATMUL_SUSPECTS = (
    Suspect("a K tile that never advances",
            "every step of the K loop loads the first tile: the K offsets must move with the loop, "
            "ks = k0 + tl.arange(0, BLOCK_K)", _matmul_first_tile_every_step),
    Suspect("acc = instead of accumulating",
            "each step replaced the sum so far, so only the last K tile remains: "
            "acc = tl.dot(a, b, acc, ...) (or acc += tl.dot(a, b, ...))", _matmul_last_tile_only),
    Suspect("TF32 in tl.dot",
            "tl.dot rounded the float32 inputs to TF32 (10-bit mantissa): that happens with "
            "input_precision=\"tf32\" and also when input_precision is left out (TF32 is the "
            "default on NVIDIA GPUs). Pass input_precision=INPUT_PRECISION, \"ieee\" unless the "
            "caller allows TF32", _matmul_tf32),
)
