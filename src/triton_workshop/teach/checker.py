"""The checker that teaches: run a learner's launcher on fresh inputs and say *what* is wrong.

Five tricks make the diagnosis possible:

* **Poisoned outputs.** While the learner's launcher runs, ``torch.empty``/``torch.empty_like``
  hand out tensors filled with NaN (or the largest integer). An element the kernel never wrote
  still holds the poison, so "not written" and "written wrong" are told apart; where it is not
  sure (the kernel may compute NaN itself), the case runs again with a second poison.
* **Guard zones.** Inputs and those outputs are views into larger buffers: a NaN zone before and
  after. On a GPU a load past the end (a missing ``mask=``) reads NaN, and a store past the end
  lands in the zone, where the checker sees it.
* **Bounds-checked memory** (interpreter mode, :mod:`.memcheck`): every lane of every load and
  store is checked against the tensor it points into; stray stores are dropped, stray loads read
  NaN, and the report names the kernel line, the programs, the offsets and the mask. The same
  run records which program wrote each element, so stores into an input or into another
  program's block are seen. TF32 rounding in ``tl.dot`` is emulated there, as a GPU does it.
* **Block geometry.** The checker knows the launch's tiling (``BLOCK_SIZE`` etc., read from the
  learner's module), so each wrong element maps to the program that owns it, and to whether it lies
  in a full block or in the partial, masked block at the edge.
* **Suspects.** Each exercise lists its classic mistakes with the output each would produce
  (:class:`~.exercises.Suspect`); a wrong result that matches one is named with its fix.

From these it recognises the classic bugs: the tail past the last full block (grid rounded down, or
a wrong mask), every program repeating the first block (offsets without the program id), a
transposed result, out-of-bounds loads and stores, errors the size of TF32 or float16 rounding,
and NaNs a row-wise kernel computed (exp overflowing in a softmax without the max subtracted).
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from .. import runtime

GUARD = 4096  # elements of poison before and after every guarded buffer
CASE_TIME_LIMIT = 60.0  # seconds one case may run before it counts as hanging


def poison_value(dtype: torch.dtype):
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def second_poison_value(dtype: torch.dtype):
    """A second, finite poison: an element that holds it after a second run was never written
    (exact in float16/bfloat16 too, and an unlikely result)."""
    if dtype.is_floating_point:
        return -1024.0
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min


def is_poison(t: torch.Tensor, poison=None) -> torch.Tensor:
    if poison is None:
        if t.dtype.is_floating_point:
            return torch.isnan(t)
        return t == poison_value(t.dtype)
    return t == torch.tensor(poison, dtype=t.dtype, device=t.device)


@dataclass
class Guarded:
    """A tensor that is a view into the middle of a poisoned buffer."""

    buffer: torch.Tensor
    view: torch.Tensor
    poison: object = None

    @property
    def n(self) -> int:
        return self.view.numel()

    def spill(self) -> tuple[int, int]:
        """How many guard elements before and after the tensor were overwritten."""
        before = (~is_poison(self.buffer[:GUARD], self.poison)).sum().item()
        after = (~is_poison(self.buffer[GUARD + self.n :], self.poison)).sum().item()
        return int(before), int(after)


_REAL_EMPTY = torch.empty
_REAL_EMPTY_LIKE = torch.empty_like


def guarded_empty(shape, dtype, device, poison=None) -> Guarded:
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    buffer = _REAL_EMPTY(n + 2 * GUARD, dtype=dtype, device=device)  # never the patched one
    buffer.fill_(poison_value(dtype) if poison is None else poison)
    return Guarded(buffer, buffer[GUARD : GUARD + n].view(shape), poison)


def guarded_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into a contiguous view with NaN guard zones around it."""
    g = guarded_empty(t.shape, t.dtype, t.device)
    g.view.copy_(t)
    return g.view


# torch.empty is process-wide, the checker's run is one thread's: the swap dispatches on a
# thread-local, so another thread's allocations are never poisoned, and the last user to leave
# puts the real functions back.
_alloc_lock = threading.Lock()
_alloc_users = 0
_alloc_local = threading.local()
_PLAIN_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


class _Poisoner:
    def __init__(self, poison):
        self.poison = poison
        self.made: list[Guarded] = []

    def empty(self, *size, dtype=None, device=None, requires_grad=False, **kwargs):
        if "size" in kwargs:
            size = (kwargs.pop("size"),)
        if kwargs.get("out") is not None or kwargs.pop("memory_format", None) not in _PLAIN_FORMATS:
            return _REAL_EMPTY(*size, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        dtype = dtype or torch.get_default_dtype()
        g = guarded_empty(size, dtype, device or "cpu", self._poison_for(dtype))
        self.made.append(g)
        return g.view.requires_grad_(requires_grad)

    def empty_like(self, t, *, dtype=None, device=None, requires_grad=False, **kwargs):
        if kwargs.pop("memory_format", None) not in _PLAIN_FORMATS or not t.is_contiguous():
            return _REAL_EMPTY_LIKE(t, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        dtype = dtype or t.dtype
        g = guarded_empty(t.shape, dtype, device or t.device, self._poison_for(dtype))
        self.made.append(g)
        return g.view.requires_grad_(requires_grad)

    def _poison_for(self, dtype):
        return None if self.poison is None else self.poison(dtype)


def _empty(*args, **kwargs):
    poisoner = getattr(_alloc_local, "poisoner", None)
    return (poisoner.empty if poisoner else _REAL_EMPTY)(*args, **kwargs)


def _empty_like(*args, **kwargs):
    poisoner = getattr(_alloc_local, "poisoner", None)
    return (poisoner.empty_like if poisoner else _REAL_EMPTY_LIKE)(*args, **kwargs)


@contextlib.contextmanager
def poisoned_allocations(poison: Callable[[torch.dtype], object] | None = None):
    """Within the block, this thread's ``torch.empty`` and ``torch.empty_like`` return poisoned,
    guarded tensors (``poison(dtype)`` gives the fill; NaN / the largest integer by default).

    Yields the list of allocations made, so that the caller can find the returned output and
    check its guard zones. Other threads allocate as usual meanwhile.
    """
    global _alloc_users
    poisoner = _Poisoner(poison)
    previous = getattr(_alloc_local, "poisoner", None)
    with _alloc_lock:
        if _alloc_users == 0:
            torch.empty, torch.empty_like = _empty, _empty_like
        _alloc_users += 1
    _alloc_local.poisoner = poisoner
    try:
        yield poisoner.made
    finally:
        _alloc_local.poisoner = previous
        with _alloc_lock:
            _alloc_users -= 1
            if _alloc_users == 0:
                torch.empty, torch.empty_like = _REAL_EMPTY, _REAL_EMPTY_LIKE


# --------------------------------------------------------------------------------------------
# What the learner's file still has to do.
# --------------------------------------------------------------------------------------------
_TODO_LINE = re.compile(r"\.\.\.\s*#\s*TODO\s*(\d+)\s*:?\s*(.*)$")


def unfinished_todos(path: str | Path) -> list[tuple[int, int, str]]:
    """(todo number, line number, text) of each ``... # TODO n: text`` line still in the file."""
    found = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for lineno, line in enumerate(lines, 1):
        m = _TODO_LINE.search(line)
        if m and not line.lstrip().startswith("#"):
            found.append((int(m.group(1)), lineno, m.group(2).strip()))
    return sorted(found)


# --------------------------------------------------------------------------------------------
# Verdicts.
# --------------------------------------------------------------------------------------------
@dataclass
class Tolerance:
    rtol: float
    atol: float


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    if dtype in (torch.float16, torch.bfloat16):
        return Tolerance(rtol=2e-2, atol=2e-2)
    if dtype == torch.uint8:
        return Tolerance(rtol=0, atol=1)
    return Tolerance(rtol=1e-5, atol=1e-5)


@dataclass
class Verdict:
    passed: bool
    headline: str
    details: list[str] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)  # out-of-bounds findings (also in details)
    picture: dict | None = None  # see picture.build_picture
    # The kernel calls a helper that only Triton's interpreter can run (print_if): compiled, the
    # case cannot even start, and the bounds-checked interpreter run is its check.
    needs_interpreter: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(bool(d["passed"]), str(d["headline"]), list(d.get("details", [])),
                   list(d.get("memory", [])), d.get("picture"), bool(d.get("needs_interpreter", False)))


def _fmt_index(idx: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(i)) for i in idx) + ")" if len(idx) > 1 else str(int(idx[0]))


def _close(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """torch.isclose(a, b, equal_nan=True) in float64, written out: isclose is several times
    slower, and the checker compares every output with many suspects."""
    a, b = a.double(), b.double()
    ok = (a - b).abs() <= tol.atol + tol.rtol * b.abs()
    ok |= a == b  # equal infinities
    ok |= a.isnan() & b.isnan()
    return ok


@dataclass
class Geometry:
    """How the output is tiled: ``block`` over the trailing ``len(block)`` dims (or over the
    flattened output for a 1-D block), leading dims a grid axis of their own."""

    shape: tuple
    block: tuple
    lead_axis: int | None = None  # the grid axis over the leading slices, when the task says so

    @property
    def nb(self) -> int:
        return len(self.block)

    @property
    def tile_dims(self) -> tuple:
        if self.nb == 1 and len(self.shape) != 1:
            return (math.prod(self.shape),)
        return tuple(self.shape[-self.nb:])

    @property
    def slices(self) -> int:
        return math.prod(self.shape) // max(1, math.prod(self.tile_dims)) if math.prod(self.shape) else 1

    @property
    def tiles(self) -> tuple:
        return tuple(math.ceil(d / b) for d, b in zip(self.tile_dims, self.block))

    def tile_axes(self, grid: Sequence[int] | None) -> tuple[int | None, tuple]:
        """(grid axis over the leading slices or None, grid axes over the tiles) for a launch."""
        if self.lead_axis is not None:
            return self.lead_axis, tuple(a for a in range(self.nb + 1) if a != self.lead_axis)
        used = max([i + 1 for i, g in enumerate(grid) if g > 1] or [1]) if grid else 0
        if grid is not None and self.slices > 1 and used == self.nb + 1 and grid[0] == self.slices:
            return 0, tuple(range(1, self.nb + 1))
        return None, tuple(range(self.nb))


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
) -> Verdict:
    """Compare ``out`` with ``ref`` and name the classic bug when the pattern of errors shows one.

    ``block`` is the tile each program owns over the trailing ``len(block)`` dims of the output
    (``(BLOCK_SIZE,)`` for a 1-D kernel over the flattened output, ``(BLOCK_M, BLOCK_N)`` for a
    2-D one); leading dims are a grid axis of their own (channels, batches).

    ``unwritten`` (when known exactly, from the write map or a second poison) marks the elements
    never stored; ``findings`` are diagnoses found before (suspects, misplaced stores) and go
    first; ``problems`` fail the case even when every value is right (out-of-bounds accesses,
    stores into an input). ``uses_dot`` says whether TF32 can be a cause at all.
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
    ok = _close(out_c, ref_c, tol)
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
                                 quiet=bool(findings or problems), geo=geo, grid=grid))

    sample = idx[:5].tolist()
    details.append(
        f"first wrong elements{' (' + where.rstrip(', ') + ')' if where else ''}: " + ", ".join(
            f"{_fmt_index(i)}: got {_value(out_t, i)}, expected {_value(ref_t, i)}" for i in sample
        )
    )
    shown = ", ".join(_fmt_index(p) for p in programs[:8]) + (" ..." if len(programs) > 8 else "")
    details.append(f"programs ({', '.join(axes)}) with wrong elements{' in that slice' if where else ''}: "
                   f"{shown} [{len(programs)} program(s); block {' x '.join(map(str, block))}]")
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
                  tol, matmul_operands, uses_dot, *, quiet=False, geo=None, grid=None) -> list[str]:
    """The classic mistakes, each recognised by the shape of its errors. ``quiet``: a finding
    already explains the result, so the catch-all guesses stay out."""
    found: list[str] = []
    nb = len(block)

    # Transposed: the result equals the reference with rows and columns swapped.
    if out.dim() >= 2 and out.shape[-1] * out.shape[-2] > 1:
        swapped = ref.transpose(-1, -2).reshape(out.shape) if out.shape[-1] != out.shape[-2] \
            else ref.transpose(-1, -2)
        if bool(_close(out, swapped, tol).all()):
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
        copies = bool(_close(out, tiled, tol)[rest].all())
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
            found.append(_small_error_advice(rel, out.dtype, uses_dot, wrong.float().mean().item()))
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
                     "NaNs (inf - inf, inf / inf). tl.exp overflows to inf above ~88 in "
                     "float32: subtract the row max before exp" if nb >= 2 and block[-1] >= dims[-1] else
                     "the kernel computed NaN (the elements were written): 0 / 0, inf - inf, or a "
                     "value loaded past the end of an input (the checker reads NaN there)")
    elif bool(unwritten.any()) and bool(unwritten[wrong].all()):
        too_few = _grid_too_small(geo, grid)
        found.append(too_few or "the wrong elements were never written: check the grid covers "
                     "the whole output and that the store's mask is not too strict")
    elif bool((~torch.isfinite(out) & torch.isfinite(ref))[wrong].any()):
        found.append("some results are NaN/inf where the reference is finite: a load may read "
                     "past the end (missing mask=) or a masked load needs other=0")
    return found


def _small_error_advice(rel: float, dtype: torch.dtype, uses_dot: bool, fraction: float = 1.0) -> str:
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


def _grid_too_small(geo: Geometry | None, grid) -> str | None:
    if geo is None or grid is None:
        return None
    lead, axes = geo.tile_axes(grid)
    for a, ax in enumerate(axes):
        if ax < len(grid) and grid[ax] < geo.tiles[a]:
            return (f"the grid launches {grid[ax]} program(s) along axis {ax}, but the output needs "
                    f"{geo.tiles[a]} there ({geo.tile_dims[a]} / {geo.block[a]} per program, rounded "
                    "up): the uncovered part is never written")
    return None


# --------------------------------------------------------------------------------------------
# What the write map and the launches tell (interpreter mode).
# --------------------------------------------------------------------------------------------
def memory_findings(report, out, inputs: Sequence, input_names: Sequence[str], geo: Geometry | None,
                    ) -> tuple[list[str], list[str]]:
    """(problems, findings) from a bounds-checked run: out-of-bounds accesses and stores into an
    input fail a case whatever the values; misplaced stores and the grid's size explain it."""
    from .memcheck import decode_program

    grid = report.launches[-1].grid if report.launches else None
    excess = []  # (grid axis, tiles there, what a program owns)
    if geo is not None and grid is not None:
        lead, axes = geo.tile_axes(grid)
        for a, ax in enumerate(axes):
            if ax < len(grid) and grid[ax] > geo.tiles[a]:
                excess.append((ax, geo.tiles[a], "row" if geo.block[a] == 1 else f"block of {geo.block[a]}"))

    def explain(v):
        for ax, tiles, what in excess:
            if v.programs and all(len(p) > ax and p[ax] >= tiles for p in v.programs):
                p = v.programs[0]
                return (f"program {_fmt_index(p)} has no {what} of its own: the grid launches "
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
    misplaced = _misplaced(wm, out, geo, grid, decode_program)
    if misplaced and "|" in masks and geo.nb == 2:
        misplaced[0] = misplaced[0].split(": check how")[0] + (
            ": the mask lets lanes past the end of a row through, and they wrap into the next row "
            "(combine the row and column conditions with &)")
    findings.extend(misplaced)
    return problems, findings


def _misplaced(wm, out, geo: Geometry, grid, decode_program) -> list[str]:
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
        text = ", ".join(f"program {_fmt_index(p)} stored into the tile of program {_fmt_index(t)}"
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


# --------------------------------------------------------------------------------------------
# Suspects: the classic mistakes, recognised by their output.
# --------------------------------------------------------------------------------------------
def _on_cpu(case):
    import dataclasses

    def cpu(x):
        return x.detach().cpu() if isinstance(x, torch.Tensor) else x

    try:
        return dataclasses.replace(case, inputs=tuple(cpu(x) for x in case.inputs),
                                   reference=cpu(case.reference))
    except TypeError:  # not a dataclass: use it as it is
        return case


def match_suspects(out, case, suspects: Sequence, tol: Tolerance) -> list[str]:
    """The suspects whose output ``out`` matches (and the reference does not). When none
    matches the whole output, one whose output matches every wrong element (and at least some of
    them are numbers, not holes) is named for that part."""
    if not isinstance(out, torch.Tensor) or case is None:
        return []
    out_c = out.detach().cpu()
    ref = case.reference.detach().cpu()
    case = _on_cpu(case)  # suspects compute on the CPU, whatever device the case ran on
    wrong = ~_close(out_c, ref, tol)
    finite_wrong = wrong & torch.isfinite(out_c.double())
    found, partial = [], []
    for suspect in suspects:
        try:
            expected = suspect.output(case)
        except Exception:  # a suspect that does not apply to this case
            continue
        if expected is None or tuple(expected.shape) != tuple(out_c.shape):
            continue
        expected = expected.detach().cpu().to(out_c.dtype)
        same = _close(out_c, expected, tol)
        differs = ~_close(ref, expected, tol)
        if bool(same.all()) and bool(differs.any()):
            found.append(f"this looks like {suspect.name}: {suspect.advice}")
        elif not found and bool(finite_wrong.any()) and 2 * int(finite_wrong.sum()) >= int(wrong.sum()) \
                and bool(same[wrong].all()) and bool(differs[wrong].all()):
            partial.append(f"the wrong elements are what {suspect.name} gives: {suspect.advice}")
    return found or partial[:1]


# --------------------------------------------------------------------------------------------
# Running one case.
# --------------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    label: str
    verdict: Verdict
    seconds: float


class CaseTimeout(Exception):
    """A case ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise CaseTimeout in this thread after ``seconds`` (main thread only: elsewhere the
    sandbox's parent process keeps the clock)."""
    usable = (seconds and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"ran for more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def hang_verdict(seconds: float, label: str = "") -> Verdict:
    return Verdict(False, f"did not finish within {seconds:g} s",
                   ["the kernel or the launcher seems to loop forever: a while loop whose condition "
                    "never changes, a for loop over a huge range, or a grid with far too many "
                    "programs (a grid counts blocks: cdiv(n, BLOCK_SIZE), not n * BLOCK_SIZE)"])


def _input_names(launcher, n: int) -> list[str]:
    try:
        import inspect

        params = [p.name for p in inspect.signature(launcher).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input {i}" for i in range(n)]


def _lead_axis(leading_axis: str | None) -> int | None:
    """The grid axis a task's leading dim runs over ("channel (pid_0)" -> 0), if it names one."""
    m = re.search(r"pid_(\d)", leading_axis or "")
    return int(m.group(1)) if m else None


def _reduces(learner_file: str | None) -> bool:
    """Whether masked-off lanes can reach a result: only through a reduction or a dot (an
    elementwise kernel stores none of them)."""
    if not learner_file:
        return True
    try:
        text = Path(learner_file).read_text()
    except OSError:
        return True
    return any(f"tl.{name}(" in text for name in ("sum", "max", "min", "dot", "reduce", "cumsum",
                                                  "argmax", "argmin", "xor_sum"))


def _uses_dot(learner_file: str | None, default: bool) -> bool:
    if learner_file:
        try:
            return "tl.dot(" in Path(learner_file).read_text() or default
        except OSError:
            pass
    return default


def run_case(
    launcher: Callable,
    inputs: Sequence,
    ref: torch.Tensor,
    *,
    block: Sequence[int],
    tol: Tolerance,
    kwargs: dict | None = None,
    program_axes: Sequence[str] | None = None,
    learner_file: str | None = None,
    matmul_operands: bool = False,
    suspects: Sequence = (),
    case=None,
    memcheck: bool | None = None,
    time_limit_s: float | None = None,
    picture: bool = True,
    leading_axis: str | None = None,
) -> Verdict:
    """Call ``launcher(*inputs, **kwargs)`` with guarded inputs and poisoned allocations, in
    interpreter mode bounds-checked (``memcheck``, default: when interpreting), and diagnose."""
    kwargs = kwargs or {}
    use_memcheck = runtime.INTERPRET if memcheck is None else memcheck
    guarded_inputs = [guarded_copy(x) if isinstance(x, torch.Tensor) and x.is_contiguous() else x
                      for x in inputs]
    note: list[str] = []
    report = None
    try:
        with time_limit(time_limit_s):
            try:
                out, made, report = _call(launcher, guarded_inputs, kwargs, use_memcheck, learner_file)
            except _Unavailable as exc:
                note.append(f"note: out-of-bounds checks are off ({exc})")
                out, made, report = _call(launcher, guarded_inputs, kwargs, False, learner_file)
    except CaseTimeout:
        return hang_verdict(time_limit_s or 0)
    except _LauncherError as wrapped:
        exc, report = wrapped.exc, wrapped.report
        verdict = _verdict_for_exception(exc, learner_file, launcher)
        if report is not None and report.violations:
            verdict.memory = report.describe()
            verdict.details = verdict.details + verdict.memory
        return verdict
    try:
        return _judge(out, made, report, launcher, inputs, guarded_inputs, ref, kwargs, block=block, tol=tol,
                      program_axes=program_axes, learner_file=learner_file,
                      matmul_operands=matmul_operands, suspects=suspects, case=case, note=note,
                      picture=picture, lead_axis=_lead_axis(leading_axis))
    except Exception as exc:  # a diagnosis that fails must not hide the verdict
        ok = isinstance(out, torch.Tensor) and out.shape == ref.shape and bool(
            _close(out.detach().cpu(), ref.detach().cpu(), tol).all()) and not (
            report is not None and report.violations)
        return Verdict(ok, "correct" if ok else "wrong result",
                       [] if ok else [f"(the checker could not analyse it further: {exc!r})"])


class _Unavailable(Exception):
    pass


class _LauncherError(Exception):
    def __init__(self, exc, report):
        self.exc, self.report = exc, report


def _call(launcher, inputs, kwargs, use_memcheck, learner_file, poison=None):
    """(output, allocations, memory report or None); the learner's errors come wrapped."""
    from . import memcheck

    report = None
    with poisoned_allocations(poison) as made:
        if use_memcheck:
            try:
                ctx = memcheck.memory_checked(learner_file)
                report = ctx.__enter__()
            except memcheck.MemcheckUnavailable as exc:
                raise _Unavailable(str(exc)) from exc
            try:
                out = launcher(*inputs, **kwargs)
            except CaseTimeout:
                raise
            except Exception as exc:  # the learner's code: any error is a finding, not a crash
                raise _LauncherError(exc, report) from exc
            finally:
                ctx.__exit__(None, None, None)
        else:
            try:
                out = launcher(*inputs, **kwargs)
            except CaseTimeout:
                raise
            except Exception as exc:
                raise _LauncherError(exc, None) from exc
    return out, made, report


def _judge(out, made, report, launcher, inputs, guarded_inputs, ref, kwargs, *, block, tol,
           program_axes, learner_file, matmul_operands, suspects, case, note, picture,
           lead_axis=None) -> Verdict:
    spill = (0, 0)
    out_guard = None
    if isinstance(out, torch.Tensor):
        for g in made:
            if g.view.data_ptr() == out.data_ptr() and g.n == out.numel():
                spill, out_guard = g.spill(), g
    names = _input_names(launcher, len(inputs))
    geo = Geometry(tuple(ref.shape), tuple(int(b) for b in block), lead_axis) if isinstance(out, torch.Tensor) \
        and tuple(out.shape) == tuple(ref.shape) else None
    problems: list[str] = []
    findings: list[str] = []
    unwritten = None
    grid = None
    if report is not None:
        problems, findings = memory_findings(report, out, guarded_inputs, names, geo)
        grid = report.launches[-1].grid if report.launches else None
        if isinstance(out, torch.Tensor) and out.is_contiguous() and any(
                launch.passed(out) for launch in report.launches):
            wm = report.writes.get(out.data_ptr())
            n = out.numel()
            unwritten = torch.ones(n, dtype=torch.bool) if wm is None else torch.from_numpy(
                wm.count[:n] == 0)
            unwritten = unwritten.reshape(out.shape)
    else:
        for x, g, name in zip(inputs, guarded_inputs, names):
            if isinstance(x, torch.Tensor) and isinstance(g, torch.Tensor) and g is not x and not bool(
                    _close(g.detach().cpu(), x.detach().cpu(), Tolerance(0, 0)).all()):
                problems.append(f"the kernel changed {name} (an input): a tl.store writes through an "
                                "input's pointer; results belong in the output")
    values_ok = isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(ref.shape) and \
        out.dtype == ref.dtype and bool(_close(out.detach().cpu(), ref.detach().cpu(), tol).all())
    if not values_ok and isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(ref.shape):
        findings = match_suspects(out, case, suspects, tol) + findings
        if unwritten is None and out_guard is not None and bool(is_poison(out.detach().cpu()).any()):
            unwritten = _second_poison_unwritten(launcher, guarded_inputs, kwargs, out)
    verdict = diagnose(out, ref, block=block, tol=tol, spill=spill, program_axes=program_axes,
                       matmul_operands=matmul_operands,
                       uses_dot=_uses_dot(learner_file, matmul_operands), unwritten=unwritten,
                       findings=findings, problems=problems, grid=grid, lead_axis=lead_axis)
    verdict.memory = list(problems)
    if not verdict.passed:
        if report is not None and not values_ok and _reduces(learner_file):
            verdict.details.extend(report.notes())
        verdict.details.extend(note)
        if picture and geo is not None:
            verdict.picture = _picture(out, ref, tol, geo, unwritten, report, program_axes)
    return verdict


def _second_poison_unwritten(launcher, inputs, kwargs, out) -> torch.Tensor | None:
    """Run again with a finite poison: what still holds it was never written (a NaN there the
    first time was the poison, elsewhere the kernel computed it)."""
    try:
        again, made, _ = _call(launcher, [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs],
                               kwargs, False, None, poison=second_poison_value)
    except Exception:
        return None
    if not isinstance(again, torch.Tensor) or again.shape != out.shape:
        return None
    if not any(g.view.data_ptr() == again.data_ptr() for g in made):
        return None  # not a poisoned allocation: nothing to learn
    return is_poison(again.detach().cpu(), second_poison_value(again.dtype))


def _picture(out, ref, tol, geo, unwritten, report, program_axes):
    from . import picture

    try:
        wm = report.writes.get(out.data_ptr()) if report is not None else None
        oob = []
        if report is not None:
            for v in report.violations.values():
                if v.kind == "store" and v.tensor.key == out.data_ptr():
                    oob.extend(v.positions)
        grid = report.launches[-1].grid if report is not None and report.launches else None
        return picture.build_picture(out.detach().cpu(), ref.detach().cpu(), tol=tol, geometry=geo,
                                     unwritten=unwritten, writer=None if wm is None else wm.writer,
                                     oob=oob, grid=grid, program_axes=program_axes)
    except Exception:  # the picture is a bonus: never let it hide the verdict
        return None


# --------------------------------------------------------------------------------------------
# Errors raised by the learner's code.
# --------------------------------------------------------------------------------------------
def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes, outermost first."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _verdict_for_exception(exc: Exception, learner_file: str | None, launcher=None) -> Verdict:
    todos = unfinished_todos(learner_file) if learner_file else []
    if todos:
        number, lineno, text = todos[0]
        name = Path(learner_file).name if learner_file else "your file"
        return Verdict(
            False,
            f"not implemented yet: start at TODO {number} ({name}:{lineno})",
            [f"TODO {number}: {text}" if text else f"TODO {number}",
             f"{len(todos)} TODO(s) left: replace each '...' with your code"],
        )
    chain = _chain(exc)
    helper = _interpreter_only_helper(chain)
    if helper is not None:
        return interpreter_only_verdict(helper, learner_file)
    target = Path(learner_file).resolve() if learner_file else None
    site = None
    culprit = chain[0]
    # The deepest frame in the learner's file, looked for from the innermost cause outwards:
    # the kernel's own line (the interpreter re-raises a kernel's error at the launch line).
    for inner in reversed(chain):
        frames = traceback.extract_tb(inner.__traceback__)
        mine = [f for f in frames if target and Path(f.filename).resolve() == target]
        if mine:
            site, culprit = mine[-1], inner
            break
    if site is None and isinstance(exc, TypeError) and launcher is not None and \
            len(traceback.extract_tb(exc.__traceback__)) <= 2 and getattr(launcher, "__name__", "") in str(exc):
        return Verdict(False, f"the checker could not call {launcher.__name__}(...): {exc}",
                       [f"keep the template's signature: {launcher.__name__} takes the arguments "
                        "the exercise gives it, in that order"])
    compiled = _compile_error_site(chain, target)
    if compiled is not None:  # a GPU compile error points into the kernel's source itself
        lineno, code, message = compiled
        called = _HELPER_CALL.search(code.split("#")[0])
        if called:  # whatever Triton's words (debug.print_if fails inside the helper itself)
            return interpreter_only_verdict(called.group(1), learner_file)
        details = [message[:300] if message else
                   "(Triton's compiler stopped at a check of its own on that line, without a message)"]
        advice = _dot_accumulator_advice(chain, target, lineno, code)
        if advice:
            details.append(advice)
        details.append("the kernel did not compile: that line (and the message) say what Triton "
                       "could not do")
        return Verdict(False, f"raised {type(culprit).__name__} at line {lineno}: {code}", details)
    where = f" at line {site.lineno}: {site.line}" if site else ""
    message = _message(culprit) or _message(exc)
    details = [message[:300]] if message else []
    if type(culprit).__name__ == "CompilationError" or "CompilationError" in type(exc).__name__:
        details.append("the kernel did not compile: the line above (and the message) say where")
    return Verdict(False, f"raised {type(culprit).__name__}{where}", details)


def _compile_error_site(chain, target: Path | None):
    """(line in the learner's file, its code, the reason) of a Triton CompilationError, whose
    message quotes the kernel's line above a caret."""
    if target is None:
        return None
    for exc in chain:
        if type(exc).__name__ != "CompilationError":
            continue
        lines = str(exc).splitlines()
        caret = next((i for i, ln in enumerate(lines) if ln.strip() and set(ln.strip()) == {"^"}), None)
        if not caret:
            continue
        code = lines[caret - 1].strip()
        try:
            source = [ln.strip() for ln in target.read_text().splitlines()]
        except OSError:
            return None
        # The message quotes up to 12 lines of the kernel ending at the culprit: match as many
        # as it gives, so a line that two kernels share is placed in the right one.
        header = next((i for i, ln in enumerate(lines[:caret]) if re.match(r"at \d+:\d+:", ln)), -1)
        excerpt = [ln.strip() for ln in lines[header + 1:caret]]
        found = []
        for take in (len(excerpt), 3, 1):
            tail = excerpt[-take:] if take else []
            found = [i + len(tail) for i in range(len(source) - len(tail) + 1)
                     if tail and source[i:i + len(tail)] == tail]
            if found:
                break
        if not found:
            continue
        reason = (getattr(exc, "error_message", None) or
                  next((ln.strip() for ln in lines[caret + 1:] if ln.strip()), "")) or _message(exc)
        reason = str(reason).strip().splitlines()[-1] if str(reason).strip() else ""
        # A bare assert inside Triton leaves no reason: the last line is then the caret itself.
        return found[0], code, "" if set(reason) <= {"^", " "} else reason
    return None


# Debug helpers that are plain Python functions: the interpreter runs them inside a kernel, a
# compiled kernel cannot call them.
INTERPRETER_ONLY_HELPERS = ("print_if", "breakpoint_if")
# Triton's words for a plain function in a kernel: its dependency check's on a kernel's first
# launch; that check leaves a placeholder hash on the JITFunction, so the same kernel's later
# launches reach the code generator, which names the global instead.
_UNSUPPORTED_FUNCTION = re.compile(r"Unsupported function referenced: <function (\w+)"
                                   r"|Cannot access global variable (\w+)")
_HELPER_CALL = re.compile(r"\b(print_if|breakpoint_if)\s*\(")


def _interpreter_only_helper(chain) -> str | None:
    """``print_if`` or ``breakpoint_if`` when that is why a compiled kernel failed: Triton's
    compiler refuses a plain Python function called in a kernel ("Unsupported function
    referenced"), and the helpers themselves refuse to run outside the interpreter."""
    for exc in chain:
        text = str(exc)
        m = _UNSUPPORTED_FUNCTION.search(text)
        if m and (m.group(1) or m.group(2)) in INTERPRETER_ONLY_HELPERS:
            return m.group(1) or m.group(2)
        if "print_if/breakpoint_if read program ids in interpreter mode only" in text:
            return "breakpoint_if" if "breakpoint_if(" in text else "print_if"
    return None


def interpreter_only_verdict(helper: str, learner_file: str | None) -> Verdict:
    name = Path(learner_file).name if learner_file else "your file"
    return Verdict(False, f"the kernel calls {helper}, which runs only in Triton's interpreter, "
                   "not in a kernel compiled for the GPU",
                   [f"in a compiled kernel use tl.device_print(\"x\", x) instead (or remove the call); "
                    f"to keep {helper}, run in the interpreter: TRITON_INTERPRET=1 python {name}"],
                   needs_interpreter=True)


def _dot_accumulator_advice(chain, target: Path | None, lineno: int, code: str) -> str | None:
    """For a compile error at a ``tl.dot`` line whose accumulator is not float32: Triton 3.6
    rejects it with a bare assert (tl.dot's out_dtype is float32 and must match the accumulator),
    later versions with a message, or (bfloat16) as an unsupported out_dtype."""
    if "dot(" not in code:
        return None
    text = " ".join(str(e) for e in chain)
    stated = re.search(r"accumulator dtype \S+, got (\w+)", text)
    declared = _accumulator_dtype(target, lineno)
    if stated and not _is_float32_text(stated.group(1)):
        what = stated.group(1)
    elif declared is not None:
        what = declared
    else:
        return None
    return (f"the accumulator passed to tl.dot is not float32 (its dtype is {what}): tl.dot sums "
            "its products in float32 and needs a float32 accumulator. Accumulate in float32 "
            "(acc = tl.zeros(..., dtype=tl.float32), tl.dot(a, b, acc)) and round once, on the "
            "store (acc.to(c_ptr.dtype.element_ty))")


def _is_float32_text(text: str) -> bool:
    return text.strip().strip("'\"").split(".")[-1] in ("float32", "fp32")


def _accumulator_dtype(target: Path | None, lineno: int) -> str | None:
    """The source of the dtype the accumulator of the ``tl.dot`` call at ``lineno`` is made
    with (``tl.zeros(..., dtype=X)`` or ``.to(X)``, followed through assignments in the kernel),
    when that is not float32; None when it is float32 or cannot be told."""
    import ast

    if target is None:
        return None
    try:
        text = target.read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= lineno <=
             (n.end_lineno or n.lineno) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "dot"]
    if not calls:
        return None
    call = calls[-1]
    acc = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "acc"), None)
    if acc is None:
        return None

    def dtype_of(expr) -> str | None:
        if not isinstance(expr, ast.Call):
            return None
        given = next((k.value for k in expr.keywords if k.arg == "dtype"), None)
        if given is None and getattr(expr.func, "attr", None) == "to" and expr.args:
            given = expr.args[0]
        return None if given is None else ast.get_source_segment(text, given)

    sources = [dtype_of(acc)]
    if isinstance(acc, ast.Name):
        kernel = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                  and f.lineno <= call.lineno <= (f.end_lineno or f.lineno)]
        for node in ast.walk(kernel[-1]) if kernel else ():
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == acc.id
                                                    for t in node.targets):
                sources.append(dtype_of(node.value))
    bad = [s for s in sources if s and not _is_float32_text(s)]
    return bad[0] if bad else None


def _message(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    # InterpreterError wraps the real one as repr(e); compile errors put the reason last.
    return lines[-1].strip()
