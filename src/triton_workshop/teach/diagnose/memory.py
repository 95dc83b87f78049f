"""What a bounds-checked run tells (interpreter mode, :mod:`..memcheck`): out-of-bounds accesses
and stores into an input, which fail a case whatever the values; stores that landed in another
program's block, and a grid larger than the output, which explain a wrong result.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..memory_report import decode_program
from ..poison import is_poison
from ..verdict import Geometry, fmt_index
from .rules import grid_maps_tiles

__all__ = ["memory_findings"]


def memory_findings(report, out, inputs: Sequence, input_names: Sequence[str], geo: Geometry | None,
                    ) -> tuple[list[str], list[str]]:
    """(problems, findings) from a bounds-checked run: out-of-bounds accesses and stores into an
    input fail a case whatever the values; misplaced stores and the grid's size explain it."""
    grid = report.launches[-1].grid if report.launches else None
    excess = []  # (grid axis, tiles there, what a program owns)
    if geo is not None and grid is not None and grid_maps_tiles(geo, grid):
        lead, axes = geo.tile_axes(grid)
        for a, ax in enumerate(axes):
            if ax < len(grid) and grid[ax] > geo.tiles[a]:
                excess.append((ax, geo.tiles[a], "row" if geo.block[a] == 1 else f"block of {geo.block[a]}"))

    def explain(v):
        for ax, tiles, what in excess:
            if v.programs and all(len(p) > ax and p[ax] >= tiles for p in v.programs):
                p = v.programs[0]
                return (f"program {fmt_index(p)} has no {what} of its own: the grid launches "
                        f"{grid[ax]} programs along axis {ax} where the output has {tiles}")
        return None

    problems = report.describe(explain=explain)
    findings: list[str] = []
    into_input = False
    for x, name in zip(inputs, input_names):
        if not isinstance(x, torch.Tensor):
            continue
        sites = report.store_sites.get(x.data_ptr())
        if sites:
            into_input = True
            site, param = next(iter(sites.items()))
            problems.append(
                f"the kernel stored into {name} (an input) through {param} at {site} `{site.code}`: "
                "results belong in the output's pointer; an input must stay as it was")
    for ax, tiles, what in excess:
        if report.violations:
            findings.append(
                f"the grid launches {grid[ax]} programs along axis {ax}, but the output has "
                f"{tiles} {what}s there: programs {tiles}..{grid[ax] - 1} have nothing to work on "
                "and run past the end. Size the grid from the output's shape")
    if not isinstance(out, torch.Tensor) or geo is None or not report.launches:
        return problems, findings
    if not any(launch.passed(out) for launch in report.launches):
        # A launcher may return a view, a reshape or a stack of what the kernel wrote (layer
        # norm's statistics, the weight gradients): only an output still all poison was never
        # given to the kernel.
        if not bool(is_poison(out.detach().cpu()).all()):
            return problems, findings
        findings.append("the tensor the launcher returned was not passed to the kernel: return the "
                        "output the kernel stores into")
        return problems, findings
    wm = report.writes.get(out.data_ptr())
    if wm is None:
        if out.is_contiguous() and not into_input:
            findings.append("the kernel never stored anything into the output tensor the launcher "
                            "returned: check the pointer each tl.store writes through")
        return problems, findings
    masks = " ".join(v.mask_source or "" for v in report.violations.values() if v.kind == "store")
    misplaced = _misplaced(wm, out, geo, grid) if grid_maps_tiles(geo, grid) else []
    if misplaced and "|" in masks and geo.nb == 2:
        misplaced[0] = misplaced[0].split(": check how")[0] + (
            ": the mask lets lanes past the end of a row through, and they wrap into the next row "
            "(combine the row and column conditions with &)")
    findings.extend(misplaced)
    return problems, findings


def _misplaced(wm, out, geo: Geometry, grid) -> list[str]:
    """Stores that landed outside the storing program's own block (its tile, and its plane of
    the leading dim when a grid axis runs over it), described with the likely cause."""
    n = out.numel()
    count = wm.count[:n]
    written = np.nonzero(count > 0)[0]
    if not written.size:
        return []
    lead_axis, axes = geo.tile_axes(grid)
    dims = (geo.slices, *geo.tile_dims)
    pos = np.unravel_index(written, dims)
    writers = wm.writer[written]
    progs = np.stack([(writers >> (21 * k)) & 0x1FFFFF for k in range(3)], axis=1)
    tiles = np.stack([pos[1 + a] // geo.block[a] for a in range(geo.nb)], axis=1)
    own = np.stack([progs[:, ax] for ax in axes], axis=1)
    off = (tiles != own).any(axis=1)
    out_lines: list[str] = []
    if lead_axis is not None:
        plane_off = pos[0] != progs[:, lead_axis]
        if plane_off.any():
            pairs = sorted({(int(p), int(q)) for p, q in zip(progs[plane_off, lead_axis], pos[0][plane_off])})
            text = ", ".join(f"programs of slice {p} (axis {lead_axis}) stored into slice {q}"
                             for p, q in pairs[:3])
            out_lines.append(f"stores landed in another slice of the leading dim: {text}. Each "
                             "program's plane starts (its pid) * H * W elements in")
    if geo.nb == 1:
        spans = sorted(wm.spans.items())
        starts = {decode_program(c)[axes[0]]: lo for c, (lo, hi, k) in spans}
        bad = [(decode_program(c), lo, hi) for c, (lo, hi, k) in spans
               if not (lo >= decode_program(c)[axes[0]] * geo.block[0]
                       and hi < (decode_program(c)[axes[0]] + 1) * geo.block[0])]
        if bad:
            b = geo.block[0]
            pid, lo, hi = next((x for x in bad if x[0][axes[0]] > 0), bad[0])
            p = pid[axes[0]]
            line = (f"programs stored outside their own blocks: program {p} stored elements "
                    f"{lo}..{hi}, but its block is {p * b}..{(p + 1) * b - 1}")
            others = [q for q in starts if q > 0]
            if others and all(starts[q] == q for q in others):
                line += (": the offsets step by 1 per program. Multiply the program id by the "
                         "block size: offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)")
            elif others and all(starts[q] == 0 for q in others):
                line += ": every program stored into block 0. The offsets ignore the program id"
            out_lines.append(line)
    elif off.any():
        pairs = {}
        for prog, tile in zip(progs[off].tolist(), tiles[off].tolist()):
            mine = tuple(prog[ax] for ax in axes)
            pairs.setdefault(mine, tuple(tile))
        sample = list(pairs.items())[:3]
        text = ", ".join(f"program {fmt_index(p)} stored into the tile of program {fmt_index(t)}"
                         for p, t in sample)
        line = f"stores landed in other programs' tiles: {text}"
        varied = len({p[0] for p in pairs}) > 1 and len({p[1] for p in pairs}) > 1
        if geo.nb == 2 and not varied:
            line += (": check how the offsets are built (rows[:, None] * row stride + "
                     "cols[None, :]; a row holds W elements)")
        elif geo.nb == 2:
            if all(t == (p[0], p[0]) for p, t in pairs.items()):
                line += (": the column block follows the first program id. Take it from the "
                         "second axis: tl.program_id(1)")
            elif all(t == (p[1], p[1]) for p, t in pairs.items()):
                line += ": the row block follows the second program id. Take it from tl.program_id(0)"
            elif all(t == (p[1], p[0]) for p, t in pairs.items()):
                line += (": rows and columns take each other's program ids (or the grid's axes are "
                         "swapped): axis 0 covers the rows, axis 1 the columns")
            else:
                line += (": check how the offsets are built (rows[:, None] * row stride + "
                         "cols[None, :]; a row holds W elements)")
        out_lines.append(line)
    twice = int((count > 1).sum())
    if twice and (geo.nb > 1 or not out_lines):
        out_lines.append(f"{twice} element(s) were stored more than once: programs overlap")
    return out_lines

