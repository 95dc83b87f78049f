"""The picture of a failing case: the output as a grid of cells, coloured by the program that
stored each one, with the wrong, never-written and out-of-bounds cells marked.

:func:`build_picture` turns a checked run into plain data (JSON-safe: it travels from the sandbox
process to the one that prints); :func:`render` draws it in the terminal with rich, and
:func:`save_png` draws it with matplotlib.

A 1-D output is wrapped into rows of one block each, so that row ``p`` is program ``p``'s block;
a 2-D output (or the first failing plane of a 3-D one) is drawn as it is. Stores past the end of
the output (dropped by the checker) show as extra rows below it. Large outputs are shrunk: a cell
then stands for several elements and shows the worst of them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .memory_report import decode_program
from .poison import is_poison
from .verdict import close

OK, WRONG, UNWRITTEN, OUT_OF_BOUNDS = 0, 1, 2, 3
MAX_SIDE = 256  # cells per side kept in the data
TERMINAL_COLS = 64
TERMINAL_ROWS = 40
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#393b79", "#637939", "#8c6d31", "#7b4173"]
SYMBOLS = {OK: "·", WRONG: "✗", UNWRITTEN: "?", OUT_OF_BOUNDS: "!"}


def build_picture(out: torch.Tensor, ref: torch.Tensor, *, tol, geometry, unwritten=None,
                  writer: np.ndarray | None = None, oob: Sequence = (), grid=None,
                  program_axes: Sequence[str] | None = None) -> dict | None:
    """The data of the picture for the first slice (leading index) with something wrong."""
    out, ref = out.detach().cpu(), ref.detach().cpu()
    wrong = ~close(out, ref, tol)
    if unwritten is None:
        unwritten = is_poison(out) & ~is_poison(ref)
    unwritten = unwritten.cpu().bool() & wrong
    geo = geometry
    slice_size = math.prod(geo.tile_dims)
    n_slices = geo.slices
    flat_wrong = wrong.reshape(n_slices, slice_size)
    flat_unwritten = unwritten.reshape(n_slices, slice_size)
    oob = [(int(o), int(c)) for o, c in oob]
    bad_slices = flat_wrong.any(1).nonzero().flatten().tolist()
    s = bad_slices[0] if bad_slices else (n_slices - 1 if oob else 0)

    if geo.nb == 1 or len(geo.tile_dims) == 1:
        width = geo.block[0] if geo.block[0] <= MAX_SIDE * 4 else 64
        height = math.ceil(slice_size / width)
        row_label, col_label = f"one row per block of {width}", "offset in the block"
    else:
        height, width = geo.tile_dims[-2], geo.tile_dims[-1]
        row_label, col_label = "rows", "columns"
    status = np.full(height * width, OK, dtype=np.int8)
    status[:slice_size][flat_wrong[s].numpy()] = WRONG
    status[:slice_size][flat_unwritten[s].numpy()] = UNWRITTEN
    if slice_size < height * width:
        status[slice_size:] = -1  # padding of the last row: no element there

    # Who owns each cell: the program that stored it, else the one the geometry gives it.
    owner_code = np.full(height * width, -1, dtype=np.int64)
    if writer is not None and writer.size >= (s + 1) * slice_size:
        owner_code[:slice_size] = writer[s * slice_size:(s + 1) * slice_size]
    else:
        local = np.arange(slice_size)
        if len(geo.tile_dims) == 1:
            tiles = [local // geo.block[0]]
        else:
            rows, cols = local // width, local % width
            tiles = [rows // geo.block[-2], cols // geo.block[-1]]
        code = np.zeros(slice_size, dtype=np.int64)
        for k, t in enumerate(tiles):
            code |= t.astype(np.int64) << (21 * k)
        owner_code[:slice_size] = np.where(flat_unwritten[s].numpy(), -1, code)

    # Stores past the end of the output: extra rows below it.
    past = [(o - s * slice_size, c) for o, c in oob if o >= (s + 1) * slice_size or o < s * slice_size]
    past = [(o, c) for o, c in past if o >= slice_size]
    extra_rows = 0
    if past:
        last = max(o for o, _ in past)
        extra_rows = min(math.ceil((last + 1) / width) - height, max(4, height // 2))
        if extra_rows > 0:
            status = np.concatenate([status, np.full(extra_rows * width, -1, dtype=np.int8)])
            owner_code = np.concatenate([owner_code, np.full(extra_rows * width, -1, dtype=np.int64)])
            for o, c in past:
                if o < status.size:
                    status[o] = OUT_OF_BOUNDS
                    owner_code[o] = c
        extra_rows = max(extra_rows, 0)
    total_rows = height + extra_rows
    status = status.reshape(total_rows, width)
    owner_code = owner_code.reshape(total_rows, width)

    # Shrink: each cell the worst of its elements (the output and the rows past its end apart).
    fy, fx = math.ceil(total_rows / MAX_SIDE), math.ceil(width / MAX_SIDE)
    status, owner_code = _shrink_split(status, owner_code, height, fy, fx)

    if writer is not None and grid:
        dims = max([i + 1 for i, g in enumerate(grid) if g > 1] or [1])
    else:
        dims = len(geo.tile_dims)
    codes = sorted({int(c) for c in np.unique(owner_code) if c >= 0})
    index = {c: i for i, c in enumerate(codes)}
    owner = np.vectorize(lambda c: index.get(int(c), -1), otypes=[np.int64])(owner_code) \
        if owner_code.size else owner_code
    programs = [list(decode_program(c, max(1, min(3, dims)))) for c in codes]
    title = f"slice {s} of the leading dim" if n_slices > 1 else "the output"
    return {
        "title": title,
        "shape": list(out.shape),
        "rows": int(status.shape[0]),
        "cols": int(status.shape[1]),
        "cell": [fy, fx],
        "height": int(math.ceil(height / fy)),
        "block": [int(b) for b in geo.block],
        "status": status.astype(int).flatten().tolist(),
        "owner": owner.astype(int).flatten().tolist(),
        "programs": programs,
        "row_label": row_label,
        "col_label": col_label,
        "actual_writers": writer is not None,
        "axes": list(program_axes or []),
        "oob": len(past),
    }


def _shrink(status: np.ndarray, owner: np.ndarray, fy: int, fx: int):
    if fy == 1 and fx == 1:
        return status, owner
    rows, cols = status.shape
    R, C = math.ceil(rows / fy), math.ceil(cols / fx)
    s = np.full((R * fy, C * fx), -1, dtype=np.int8)
    o = np.full((R * fy, C * fx), -1, dtype=np.int64)
    s[:rows, :cols], o[:rows, :cols] = status, owner
    s = s.reshape(R, fy, C, fx).transpose(0, 2, 1, 3).reshape(R, C, fy * fx)
    o = o.reshape(R, fy, C, fx).transpose(0, 2, 1, 3).reshape(R, C, fy * fx)
    pick = s.argmax(axis=2)
    return (np.take_along_axis(s, pick[..., None], 2)[..., 0],
            np.take_along_axis(o, pick[..., None], 2)[..., 0])


def _shrink_split(status, owner, height, fy, fx):
    """Shrink the output's rows and the rows past its end separately (no cell mixes them)."""
    top = _shrink(status[:height], owner[:height], fy, fx)
    if status.shape[0] <= height:
        return top
    below = _shrink(status[height:], owner[height:], fy, fx)
    return np.concatenate([top[0], below[0]]), np.concatenate([top[1], below[1]])


def _terminal_view(pic: dict):
    status = np.array(pic["status"], dtype=np.int8).reshape(pic["rows"], pic["cols"])
    owner = np.array(pic["owner"], dtype=np.int64).reshape(pic["rows"], pic["cols"])
    fy, fx = math.ceil(pic["rows"] / TERMINAL_ROWS), math.ceil(pic["cols"] / TERMINAL_COLS)
    status, owner = _shrink_split(status, owner, pic["height"], fy, fx)
    return status, owner, fy, fx


def render(pic: dict):
    """A rich renderable: the grid, one character per cell, and a legend."""
    from rich.text import Text

    status, owner, fy, fx = _terminal_view(pic)
    cy, cx = pic["cell"][0] * fy, pic["cell"][1] * fx
    height = math.ceil(pic["height"] / fy)
    text = Text()
    who = "the program that stored it" if pic["actual_writers"] else "the program that owns it"
    text.append(f"{pic['title']} {tuple(pic['shape'])}: {pic['row_label']} down, "
                f"{pic['col_label']} across; a cell = {cy} x {cx} element(s); colour = {who}\n",
                style="dim")
    for r in range(status.shape[0]):
        if r == height:
            text.append("  past the end (stores the checker dropped):\n", style="dim")
        text.append("  ")
        for c in range(status.shape[1]):
            st, ow = int(status[r, c]), int(owner[r, c])
            if st < 0:
                text.append(" ")
                continue
            bg = PALETTE[ow % len(PALETTE)] if ow >= 0 else None
            style = ("bold white" if st != OK else "white") + (f" on {bg}" if bg else "")
            if st == UNWRITTEN and bg is None:
                style = "bold red"
            text.append(SYMBOLS[st], style=style)
        text.append("\n")
    progs = pic["programs"]
    shown = [(i, p) for i, p in enumerate(progs)][:6]
    if shown:
        text.append("  programs: ", style="dim")
        for i, p in shown:
            text.append(f" {_fmt(p)} ", style=f"white on {PALETTE[i % len(PALETTE)]}")
            text.append(" ")
        if len(progs) > 6:
            text.append(f"... ({len(progs)} in all)", style="dim")
        text.append("\n")
    text.append("  · right   ✗ wrong   ? never written   ! stored out of bounds (dropped)", style="dim")
    return text


def _fmt(p) -> str:
    p = list(p)
    return str(p[0]) if len(p) == 1 else "(" + ", ".join(map(str, p)) + ")"


def save_png(pictures: Sequence[tuple[str, dict]], path: str | Path) -> Path:
    """Draw ``(title, picture)`` pairs one above the other into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(len(pictures), 1, figsize=(10, 4.5 * len(pictures)), squeeze=False)
    for ax, (title, pic) in zip(axes[:, 0], pictures):
        status = np.array(pic["status"]).reshape(pic["rows"], pic["cols"])
        owner = np.array(pic["owner"]).reshape(pic["rows"], pic["cols"])
        rgb = np.ones((*status.shape, 3))
        for i in range(len(pic["programs"])):
            colour = np.array(to_rgb(PALETTE[i % len(PALETTE)]))
            sel = owner == i
            rgb[sel & (status == OK)] = 0.45 * colour + 0.55  # a light tint: right
            rgb[sel & (status == WRONG)] = colour  # full colour: wrong
            rgb[sel & (status == OUT_OF_BOUNDS)] = 0.35 * colour  # dark: dropped stores
        rgb[(status == UNWRITTEN)] = (0.85, 0.85, 0.85)
        rgb[(status == OUT_OF_BOUNDS) & (owner < 0)] = (0.1, 0.1, 0.1)
        ax.imshow(rgb, interpolation="nearest", aspect="auto")
        ys, xs = np.nonzero(status == WRONG)
        if len(xs) and status.size <= 128 * 128:
            ax.scatter(xs, ys, marker="x", s=8, c="#d62728", linewidths=0.8)
        if pic["rows"] > pic["height"]:
            ax.axhline(pic["height"] - 0.5, color="black", linewidth=1.5)
        cy, cx = pic["cell"]
        block = pic["block"]
        if len(block) >= 2 and pic["row_label"] == "rows":
            for y in range(0, pic["rows"] * cy, block[-2]):
                ax.axhline(y / cy - 0.5, color="white", linewidth=0.5)
            for x in range(0, pic["cols"] * cx, block[-1]):
                ax.axvline(x / cx - 0.5, color="white", linewidth=0.5)
        ax.set_title(f"{title}: {pic['title']} {tuple(pic['shape'])}")
        ax.set_xlabel(f"{pic['col_label']} (a cell = {cx} element(s))")
        ax.set_ylabel(f"{pic['row_label']} (a cell = {cy})")
        handles = [Patch(color=(0.85, 0.85, 0.85), label="never written"),
                   Patch(color="#d62728", label="wrong (x)"),
                   Patch(color="black", label="below the line: stored out of bounds (dropped)")]
        handles += [Patch(color=PALETTE[i % len(PALETTE)], label=f"program {_fmt(p)}")
                    for i, p in enumerate(pic["programs"][:6])]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
