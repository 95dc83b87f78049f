"""The generic rules: compare an output with its reference and name the classic bug from the
shape of the errors (the tail past the last full block, programs repeating block 0, a transposed
result, rounding to a lower precision, NaNs a kernel computed, a grid too small), with which
programs own the wrong elements.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import torch

from ..poison import is_poison
from ..verdict import Geometry, Tolerance, Verdict, close, fmt_index

__all__ = ["diagnose", "grid_maps_tiles", "grid_too_small", "small_error_advice"]


def diagnose(
    out,
    ref: torch.Tensor,
    *,
    block: Sequence[int],
    tol: Tolerance,
    spill: tuple[int, int] = (0, 0),
    program_axes: Sequence[str] | None = None,
    matmul_operands: bool = False,
    uses_dot: bool | None = None,
    unwritten: torch.Tensor | None = None,
    findings: Sequence[str] = (),
    problems: Sequence[str] = (),
    grid: Sequence[int] | None = None,
    lead_axis: int | None = None,
    uses_exp: bool | None = None,
) -> Verdict:
    """Compare ``out`` with ``ref`` and name the classic bug when the pattern of errors shows one.

    ``block`` is the tile each program owns over the trailing ``len(block)`` dims of the output
    (``(BLOCK_SIZE,)`` for a 1-D kernel over the flattened output, ``(BLOCK_M, BLOCK_N)`` for a
    2-D one); leading dims are a grid axis of their own (channels, batches).

    ``unwritten`` (when known exactly, from the write map or a second poison) marks the elements
    never stored; ``findings`` are diagnoses found before (suspects, misplaced stores) and go
    first; ``problems`` fail the case even when every value is right (out-of-bounds accesses,
    stores into an input). ``uses_dot`` says whether TF32 can be a cause at all; ``uses_exp``
    whether an overflowing tl.exp can (None: not known, and the advice says "if").
    """
    if not isinstance(out, torch.Tensor):
        return Verdict(False, f"the launcher returned {type(out).__name__}, not a tensor",
                       ["return the output tensor you allocated and passed to the kernel"])
    if tuple(out.shape) != tuple(ref.shape):
        details = [f"expected shape {tuple(ref.shape)}, got {tuple(out.shape)}"]
        if out.dim() == ref.dim() >= 2 and tuple(out.shape) == tuple(ref.transpose(-1, -2).shape):
            details.append("that is the transposed shape: are rows and columns swapped?")
        return Verdict(False, "wrong output shape", details)
    if out.dtype != ref.dtype:
        return Verdict(False, "wrong output dtype",
                       [f"expected {ref.dtype}, got {out.dtype}: allocate the output with the "
                        "dtype the reference has (torch.empty(..., dtype=...))"])

    out_c, ref_c = out.detach().cpu(), ref.detach().cpu()
    ok = close(out_c, ref_c, tol)
    before, after = spill
    wrong = ~ok
    n_wrong = int(wrong.sum())
    problems = list(problems)
    if n_wrong == 0 and before == 0 and after == 0 and not problems:
        return Verdict(True, "correct")

    details: list[str] = list(problems)
    if after or before:
        where = []
        if after:
            where.append(f"{after} element(s) past the end")
        if before:
            where.append(f"{before} element(s) before the start")
        details.append(
            f"the kernel wrote {' and '.join(where)} of the output: the tl.store needs "
            "mask= so that the lanes of the last, partial block past the edge write nothing"
        )
    if n_wrong == 0:
        headline = "wrote outside the output" if (after or before) and not problems else \
            "the values are right, but " + _problem_summary(problems)
        return Verdict(False, headline, details + list(findings))

    nan_out = is_poison(out_c) & ~is_poison(ref_c)
    known = unwritten is not None
    unwritten_c = (unwritten.cpu() & wrong) if known else nan_out
    total = out_c.numel()
    headline = f"{n_wrong} of {total} elements wrong"
    if int(unwritten_c.sum()):
        headline += f" ({int(unwritten_c.sum())} never written)"

    geo = Geometry(tuple(ref_c.shape), tuple(int(b) for b in block), lead_axis)
    block = geo.block
    nb = geo.nb
    tile_dims = geo.tile_dims
    # Leading dims (channels, batches) are a grid axis of their own: the bug is named on the
    # first slice that has wrong elements, where the tile geometry applies.
    slices = [t.reshape(-1, *tile_dims) for t in (out_c, ref_c, wrong, unwritten_c, nan_out)]
    first = int(slices[2].reshape(len(slices[2]), -1).any(1).nonzero()[0])
    out_t, ref_t, wrong_t, unwritten_t, nan_t = (t[first] for t in slices)
    where = f"in slice {first} of the leading dim, " if len(slices[0]) > 1 else ""

    # Which programs own the wrong elements, and are those the partial blocks at the edges?
    idx = wrong_t.nonzero()
    full = [d // b * b for d, b in zip(tile_dims, block)]  # end of the last full block per dim
    in_partial = torch.zeros(len(idx), dtype=torch.bool)
    for axis in range(nb):
        in_partial |= idx[:, axis] >= full[axis]
    programs = sorted({tuple(int(i) // b for i, b in zip(row, block)) for row in idx.tolist()})
    axes = program_axes or [f"pid_{a}" for a in range(nb)]

    details.extend(findings)
    details.extend(_name_the_bug(out_t, ref_t, wrong_t, unwritten_t, nan_t, known, block, tile_dims,
                                 full, in_partial, tol, matmul_operands,
                                 matmul_operands if uses_dot is None else uses_dot,
                                 quiet=bool(findings or problems), geo=geo, grid=grid,
                                 uses_exp=uses_exp))

    sample = idx[:5].tolist()
    details.append(
        f"first wrong elements{' (' + where.rstrip(', ') + ')' if where else ''}: " + ", ".join(
            f"{fmt_index(i)}: got {_value(out_t, i)}, expected {_value(ref_t, i)}" for i in sample
        )
    )
    shown = ", ".join(fmt_index(p) for p in programs[:8]) + (" ..." if len(programs) > 8 else "")
    details.append(f"programs ({', '.join(axes)}) with wrong elements{' in that slice' if where else ''}: "
                   f"{shown} [{len(programs)} program(s); block {' x '.join(map(str, block))}]")
    # Only where the output has both: a block wider than the whole output is partial everywhere.
    if all(f > 0 for f in full) and any(f < d for f, d in zip(full, tile_dims)):
        n_partial = int(in_partial.sum())
        details.append(
            f"{n_partial} of the wrong elements are in the partial (masked) block at the edge, "
            f"{len(idx) - n_partial} in full blocks"
        )
    return Verdict(False, headline, details)


def _problem_summary(problems: Sequence[str]) -> str:
    text = " ".join(problems)
    kinds = [k for k in ("store", "load") if re.search(rf"(^|\b){k} at offsets", text)]
    if kinds:
        return (" and ".join(f"out-of-bounds {k}s" for k in kinds)
                + " (the checker stopped them; on a GPU they corrupt memory or read garbage)")
    if "input" in text:
        return "the kernel wrote into an input"
    return "see below"


def _value(t: torch.Tensor, index) -> str:
    v = t[tuple(index)].item()
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _name_the_bug(out, ref, wrong, unwritten, nan_out, unwritten_known, block, dims, full, in_partial,
                  tol, matmul_operands, uses_dot, *, quiet=False, geo=None, grid=None,
                  uses_exp=None) -> list[str]:
    """The classic mistakes, each recognised by the shape of its errors. ``quiet``: a finding
    already explains the result, so the catch-all guesses stay out."""
    found: list[str] = []
    nb = len(block)

    # Transposed: the result equals the reference with rows and columns swapped.
    if out.dim() >= 2 and out.shape[-1] * out.shape[-2] > 1:
        swapped = ref.transpose(-1, -2).reshape(out.shape) if out.shape[-1] != out.shape[-2] \
            else ref.transpose(-1, -2)
        if bool(close(out, swapped, tol).all()):
            found.append(
                "the result is transposed: row i holds what belongs in column i. Check that "
                "rows use pid_0 / the row stride and columns pid_1 / the column stride"
                + (" (and that a is M x K, b is K x N)" if matmul_operands else "")
            )
            return found

    # Every program repeated block 0: only the first block is right; the rest is unwritten or
    # a copy of block 0.
    first = tuple(slice(0, b) for b in block)
    n_blocks = math.prod(math.ceil(d / b) for d, b in zip(dims, block))
    if n_blocks > 1 and not bool(wrong[first].any()) and not bool(in_partial.all()):
        tiled_ref = ref[first]
        reps = [math.ceil(d / b) for d, b in zip(dims, block)]
        tiled = tiled_ref.repeat(*reps)[tuple(slice(0, d) for d in dims)]
        rest = torch.ones_like(wrong)  # everything outside the first block
        rest[first] = False
        copies = bool(close(out, tiled, tol)[rest].all())
        only_first_written = bool(unwritten[rest].all())
        if copies or only_first_written:
            found.append(
                "only the first block is right and every other program "
                + ("repeated it" if copies else "left its block unwritten")
                + ": the offsets ignore the program id. Build them from tl.program_id, e.g. "
                "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)"
            )
            return found

    # The tail past the last full block.
    # (Only when a full block exists and is right: with one partial block, anything is "there".)
    if bool(in_partial.all()) and all(f > 0 for f in full) and any(f < d for f, d in zip(full, dims)):
        if bool(unwritten[wrong].all()):
            found.append(
                "only the last, partial block is wrong, and it was never written: the grid "
                "stops at the last full block. Size it with cdiv(n, BLOCK_SIZE) (rounding up), "
                "not n // BLOCK_SIZE, and mask the partial block"
            )
        else:
            found.append(
                "only elements in the last, partial block are wrong: check the mask (offsets < "
                "n, one comparison per dimension) and the other= value of masked loads"
            )
        return found
    if quiet:
        return found

    # Small errors everywhere: rounding to a lower precision somewhere.
    if not bool(nan_out.any()) and bool(torch.isfinite(out).all()):
        scale = ref.double().abs().max().clamp_min(1e-30)
        rel = ((out.double() - ref.double()).abs().max() / scale).item()
        elementwise = ((out.double() - ref.double()).abs()
                       / ref.double().abs().clamp_min(1e-30))[wrong].max().item()
        # A half-precision result a few ulps off, even in few elements, is rounding on the way.
        few_ulps = out.dtype in (torch.float16, torch.bfloat16) and elementwise < 2e-2
        if rel < 2e-2 and (wrong.float().mean().item() > 0.01 or few_ulps):
            found.append(small_error_advice(rel, out.dtype, uses_dot, wrong.float().mean().item()))
            return found

    # One program per whole row (softmax): a NaN with a written element after it in its row is
    # no hole left by a grid or a mask (those leave whole rows or a tail): the kernel computed it.
    if unwritten_known:
        computed_nan = bool((nan_out & ~unwritten)[wrong].any())
    else:
        computed_nan = nb >= 2 and block[-1] >= dims[-1] and bool(
            (nan_out & (~nan_out).flip(-1).cumsum(-1).flip(-1).bool()).any())
    if computed_nan and (bool(nan_out[wrong].all()) or unwritten_known):
        found.append("some rows hold NaN before elements the kernel did write: it computed those "
                     "NaNs (0 / 0, inf - inf, inf / inf)" + _exp_overflow_advice(uses_exp)
                     if nb >= 2 and block[-1] >= dims[-1] else
                     "the kernel computed NaN (the elements were written): 0 / 0, inf - inf, or a "
                     "value loaded past the end of an input (the checker reads NaN there)")
    elif bool(unwritten.any()) and bool(unwritten[wrong].all()):
        too_few = grid_too_small(geo, grid)
        found.append(too_few or "the wrong elements were never written: check the grid covers "
                     "the whole output and that the store's mask is not too strict")
    elif bool((~torch.isfinite(out) & torch.isfinite(ref))[wrong].any()):
        found.append("some results are NaN/inf where the reference is finite: a load may read "
                     "past the end (missing mask=) or a masked load needs other=0")
    return found


def _exp_overflow_advice(uses_exp: bool | None) -> str:
    if uses_exp is False:
        return ""
    return (". If the kernel takes tl.exp: it overflows to inf above ~88 in float32, so subtract "
            "the row max before exp" if uses_exp is None else
            ". tl.exp overflows to inf above ~88 in float32: subtract the row max before exp")


def small_error_advice(rel: float, dtype: torch.dtype, uses_dot: bool, fraction: float = 1.0) -> str:
    who = "every element is" if fraction > 0.5 else f"{fraction:.1%} of the elements are"
    head = f"{who} off by a little (max error {rel:.1e} of the largest value): "
    if dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        if uses_dot:
            return (head + f"the sums were rounded to {name} along the way. Accumulate in float32 "
                    "(acc = tl.zeros(..., dtype=tl.float32), tl.dot(a, b, acc)) and round once, "
                    "on the store")
        return (head + f"the arithmetic ran in {name}. Convert what you load to float32 "
                "(.to(tl.float32)), compute in float32 and round once, on the store")
    if uses_dot:
        return (head + "that is the rounding of a lower precision, e.g. TF32 (10-bit mantissa) in "
                "tl.dot on float32 inputs (input_precision=\"tf32\", or left out: TF32 is the "
                "default on NVIDIA GPUs). Respect the data types: pass "
                "input_precision=\"ieee\" to tl.dot for float32, and accumulate in float32")
    return (head + "a constant slightly off (check each coefficient against the exercise's), or "
            "an intermediate result rounded to a lower precision")


def grid_maps_tiles(geo: Geometry, grid) -> bool:
    """Whether the grid's axes are the output's tile axes. A 1-D grid over a 2-D tiling (the
    grouped order of exercise 7) maps program ids to tiles by a computation of its own: there no
    grid axis owns a tile row or column, and advice about them would mislead."""
    return not (sum(int(g) > 1 for g in grid) <= 1 and sum(t > 1 for t in geo.tiles) >= 2)


def grid_too_small(geo: Geometry | None, grid) -> str | None:
    if geo is None or grid is None or not grid_maps_tiles(geo, grid):
        return None
    lead, axes = geo.tile_axes(grid)
    for a, ax in enumerate(axes):
        if ax < len(grid) and grid[ax] < geo.tiles[a]:
            return (f"the grid launches {grid[ax]} program(s) along axis {ax}, but the output needs "
                    f"{geo.tiles[a]} there ({geo.tile_dims[a]} / {geo.block[a]} per program, rounded "
                    "up): the uncovered part is never written")
    return None

