"""Exercise 2 (greyscale and sepia): the classic mistakes of each launcher (channel planes mixed
up, weights rounded, rows of H elements, program ids from the wrong axis), each with its output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from ...runtime import cdiv
from ..references import GREY_WEIGHTS, SEPIA_MATRIX, greyscale_reference
from .suspects import NAN, Suspect, learner_block

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["GREYSCALE_SUSPECTS", "PLANE_NAMES", "SEPIA_SUSPECTS"]


PLANE_NAMES = ("R", "G", "B")


def _planes(img: torch.Tensor) -> list[torch.Tensor]:
    return [img[i].double() for i in range(img.shape[0])]


def _weighted(img: torch.Tensor, weights, planes=(0, 1, 2), clip=False) -> torch.Tensor:
    p = _planes(img)
    out = sum(w * p[k] for w, k in zip(weights, planes))
    return out.clamp(max=1.0) if clip else out


def _grey_from_planes(planes):
    return lambda c: _weighted(c.inputs[0], GREY_WEIGHTS, planes).to(c.inputs[0].dtype)


def _plane_advice(planes) -> str:
    wrong = [(PLANE_NAMES[want], PLANE_NAMES[got]) for want, got in enumerate(planes) if want != got]
    parts = [f"the {want} values came from the {got} plane" for want, got in wrong]
    return ("; ".join(parts) + ": plane k starts k * H * W elements after img_ptr (R at img_ptr, G at "
            "img_ptr + plane, B at img_ptr + 2 * plane)")


def _wrong_planes():
    return [p for p in ((a, b, c) for a in range(3) for b in range(3) for c in range(3)) if p != (0, 1, 2)]


def _shifted_planes(c: Case, plane: int, weights, clip=False) -> torch.Tensor:
    """Channels read ``plane`` elements apart (plane = H or W instead of H * W)."""
    img = c.inputs[0]
    _, H, W = img.shape
    flat = img.double().flatten()
    p = [flat[k * plane:k * plane + H * W].reshape(H, W) for k in range(3)]
    rows = [sum(w * p[k] for k, w in enumerate(row)) for row in weights]
    out = torch.stack(rows) if len(rows) > 1 else rows[0]
    return (out.clamp(max=1.0) if clip else out).to(img.dtype)


def _row_stride_h(c: Case, per_plane: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Offsets rows * H + cols: element (r, c) of the tile lands at flat offset r * H + c, and the
    value computed there is the right one for that offset (loads and store share the offsets)."""
    img = c.inputs[0]
    _, H, W = img.shape
    right = per_plane(img)
    lead = right.shape[:-2]
    flat_right = right.reshape(*lead, H * W)
    r, col = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    hit = (r * H + col).flatten()
    hit = hit[hit < H * W].unique()
    out = torch.full_like(flat_right, NAN)
    out[..., hit] = flat_right[..., hit]
    return out.reshape(right.shape)


def _tiles_written(c: Case, shape, keep) -> torch.Tensor:
    """A mask of the (H, W) elements whose tile (row block, column block) satisfies ``keep``."""
    H, W = shape
    bh, bw = learner_block(c, 0, 16), learner_block(c, 1, 32)
    tr = (torch.arange(H) // bh)[:, None].expand(H, W)
    tc = (torch.arange(W) // bw)[None, :].expand(H, W)
    return keep(tr, tc, cdiv(H, bh), cdiv(W, bw))


def _only_tiles(c: Case, keep) -> torch.Tensor:
    ref = c.reference.double()
    written = _tiles_written(c, ref.shape[-2:], keep)
    return torch.where(written, ref, torch.full_like(ref, NAN)).to(c.reference.dtype)


def _pid0_for_both(tr, tc, n_row_blocks, n_col_blocks):
    return tr == tc


def _axes_swapped(tr, tc, n_row_blocks, n_col_blocks):
    return (tr < n_col_blocks) & (tc < n_row_blocks)


def _image_layout_suspects(per_plane: Callable[[torch.Tensor], torch.Tensor]) -> list[Suspect]:
    return [
        Suspect("both program ids taken from axis 0",
                "pid_1 = tl.program_id(0) makes the column block follow the row block: only the "
                "tiles on the diagonal get written. Take pid_1 from tl.program_id(1)",
                lambda c: _only_tiles(c, _pid0_for_both)),
        Suspect("grid axes and program ids that disagree",
                "rows come from one axis and the grid sizes it for the other: axis 0 of the grid "
                "is cdiv(H, BLOCK_H) row blocks (pid_0 -> rows), axis 1 cdiv(W, BLOCK_W) column "
                "blocks (pid_1 -> columns)",
                lambda c: _only_tiles(c, _axes_swapped)),
        Suspect("a row offset of rows * H",
                "a row holds W elements, so row r starts at r * W: offsets = rows[:, None] * W + "
                "cols[None, :] (rows * H only works for square images)",
                lambda c: _row_stride_h(c, per_plane).to(c.inputs[0].dtype)),
    ]


GREYSCALE_SUSPECTS = tuple(
    [Suspect("rounded weights 0.3 / 0.59 / 0.11",
             "the luminosity weights are 0.299, 0.587 and 0.114: rounded ones are off by up to 1%",
             lambda c: _weighted(c.inputs[0], (0.3, 0.59, 0.11)).to(c.inputs[0].dtype)),
     Suspect("the weights in B, G, R order",
             "0.299 goes with R (plane 0), 0.587 with G, 0.114 with B",
             lambda c: _weighted(c.inputs[0], GREY_WEIGHTS[::-1]).to(c.inputs[0].dtype))]
    + [Suspect(f"channel planes mixed up ({''.join(PLANE_NAMES[k] for k in p)} read as RGB)",
               _plane_advice(p), _grey_from_planes(p)) for p in _wrong_planes()]
    + [Suspect(f"a channel plane of {name} elements",
               f"a plane holds H * W elements, not {name}: plane = H * W",
               (lambda which: lambda c: _shifted_planes(
                   c, c.inputs[0].shape[which], (GREY_WEIGHTS,)))(which))
       for name, which in (("H", 1), ("W", 2))]
    + _image_layout_suspects(greyscale_reference)
)


def _sepia(img: torch.Tensor, matrix=SEPIA_MATRIX, planes=(0, 1, 2), clip: str = "min") -> torch.Tensor:
    rows = [_weighted(img, m, planes) for m in matrix]
    out = torch.stack(rows)
    if clip == "min":
        out = out.clamp(max=1.0)
    elif clip == "max":
        out = out.clamp(min=1.0)
    return out.to(img.dtype)


def _sepia_stored(targets) -> Callable[[Case], torch.Tensor]:
    """R', G', B' stored into planes ``targets`` (in that order: a later store wins)."""
    def output(c: Case) -> torch.Tensor:
        right = _sepia(c.inputs[0]).double()
        out = torch.full_like(right, NAN)
        for k, t in enumerate(targets):
            out[t] = right[k]
        return out.to(c.inputs[0].dtype)

    return output


def _store_advice(targets) -> str:
    wrong = [f"{PLANE_NAMES[k]}' went to plane {t} ({PLANE_NAMES[t]})" for k, t in enumerate(targets) if k != t]
    return "; ".join(wrong) + ": store R' at out_ptr + offsets, G' at + plane, B' at + 2 * plane"


SEPIA_SUSPECTS = tuple(
    [Suspect("no clipping at 1.0", "bright pixels go past 1.0: clip each channel with "
             "tl.minimum(..., 1.0)", lambda c: _sepia(c.inputs[0], clip="none")),
     Suspect("tl.maximum instead of tl.minimum", "clipping at white keeps the smaller value: "
             "tl.minimum(value, 1.0)", lambda c: _sepia(c.inputs[0], clip="max")),
     Suspect("the sepia matrix read by columns",
             "R' = 0.393 R + 0.769 G + 0.189 B: each output channel takes a row of the matrix",
             lambda c: _sepia(c.inputs[0], tuple(zip(*SEPIA_MATRIX))))]
    + [Suspect(f"stores into the wrong channel planes ({''.join(PLANE_NAMES[t] for t in targets)})",
               _store_advice(targets), _sepia_stored(targets))
       for targets in ((a, b, c) for a in range(3) for b in range(3) for c in range(3))
       if targets != (0, 1, 2)]
    + [Suspect(f"channel planes mixed up ({''.join(PLANE_NAMES[k] for k in p)} read as RGB)",
               _plane_advice(p), (lambda p: lambda c: _sepia(c.inputs[0], planes=p))(p))
       for p in _wrong_planes()]
    + [Suspect(f"a channel plane of {name} elements",
               f"a plane holds H * W elements, not {name}: plane = H * W",
               (lambda which: lambda c: _sepia_plane_shift(c, which))(which))
       for name, which in (("H", 1), ("W", 2))]
    + _image_layout_suspects(lambda img: _sepia(img).double())
)


def _sepia_plane_shift(c: Case, which: int) -> torch.Tensor:
    """Sepia with loads and stores a plane of H (or W) elements apart."""
    img = c.inputs[0]
    _, H, W = img.shape
    step = img.shape[which]
    flat = img.double().flatten()
    p = [flat[k * step:k * step + H * W].reshape(H, W) for k in range(3)]
    values = [sum(w * p[k] for k, w in enumerate(row)).clamp(max=1.0) for row in SEPIA_MATRIX]
    out = torch.full((3 * H * W,), NAN, dtype=torch.float64)
    for k, v in enumerate(values):
        out[k * step:k * step + H * W] = v.flatten()
    return out.reshape(3, H, W).to(img.dtype)

