"""The checker that teaches: run a learner's launcher on fresh inputs and say *what* is wrong.

Three tricks make the diagnosis possible:

* **Poisoned outputs.** While the learner's launcher runs, ``torch.empty``/``torch.empty_like``
  hand out tensors filled with NaN (or the largest integer). An element the kernel never wrote
  still holds the poison, so "not written" and "written wrong" are told apart.
* **Guard zones.** Inputs and those outputs are views into larger buffers: a NaN zone before and
  after. A load past the end (a missing ``mask=``) reads NaN instead of crashing the interpreter,
  and a store past the end lands in the zone, where the checker sees it.
* **Block geometry.** The checker knows the launch's tiling (``BLOCK_SIZE`` etc., read from the
  learner's module), so each wrong element maps to the program that owns it, and to whether it lies
  in a full block or in the partial, masked block at the edge.

From these it recognises the classic bugs: the tail past the last full block (grid rounded down, or
a wrong mask), every program repeating the first block (offsets without the program id), a
transposed result, writes past the end, errors the size of TF32 rounding, and NaNs a row-wise
kernel computed (exp overflowing in a softmax without the max subtracted).
"""

from __future__ import annotations

import contextlib
import math
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

GUARD = 4096  # elements of poison before and after every guarded buffer


def poison_value(dtype: torch.dtype):
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def is_poison(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point:
        return torch.isnan(t)
    return t == poison_value(t.dtype)


@dataclass
class Guarded:
    """A tensor that is a view into the middle of a poisoned buffer."""

    buffer: torch.Tensor
    view: torch.Tensor

    @property
    def n(self) -> int:
        return self.view.numel()

    def spill(self) -> tuple[int, int]:
        """How many guard elements before and after the tensor were overwritten."""
        before = (~is_poison(self.buffer[:GUARD])).sum().item()
        after = (~is_poison(self.buffer[GUARD + self.n :])).sum().item()
        return int(before), int(after)


def guarded_empty(shape, dtype, device) -> Guarded:
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    buffer = _REAL_EMPTY(n + 2 * GUARD, dtype=dtype, device=device)  # never the patched one
    buffer.fill_(poison_value(dtype))
    return Guarded(buffer, buffer[GUARD : GUARD + n].view(shape))


def guarded_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into a contiguous view with NaN guard zones around it."""
    g = guarded_empty(t.shape, t.dtype, t.device)
    g.view.copy_(t)
    return g.view


_REAL_EMPTY = torch.empty


@contextlib.contextmanager
def poisoned_allocations():
    """Within the block, ``torch.empty`` and ``torch.empty_like`` return poisoned, guarded tensors.

    Yields the list of allocations made, so that the caller can find the returned output and
    check its guard zones.
    """
    made: list[Guarded] = []
    real_empty, real_empty_like = torch.empty, torch.empty_like
    plain_formats = (None, torch.contiguous_format, torch.preserve_format)

    def empty(*size, dtype=None, device=None, requires_grad=False, **kwargs):
        if "size" in kwargs:
            size = (kwargs.pop("size"),)
        if kwargs.get("out") is not None or kwargs.pop("memory_format", None) not in plain_formats:
            return real_empty(*size, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        g = guarded_empty(size, dtype or torch.get_default_dtype(), device or "cpu")
        made.append(g)
        return g.view.requires_grad_(requires_grad)

    def empty_like(t, *, dtype=None, device=None, requires_grad=False, **kwargs):
        if kwargs.pop("memory_format", None) not in plain_formats or not t.is_contiguous():
            return real_empty_like(t, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        g = guarded_empty(t.shape, dtype or t.dtype, device or t.device)
        made.append(g)
        return g.view.requires_grad_(requires_grad)

    torch.empty, torch.empty_like = empty, empty_like
    try:
        yield made
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


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
# Diagnosis.
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


def _fmt_index(idx: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(i)) for i in idx) + ")" if len(idx) > 1 else str(int(idx[0]))


def _close(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    return torch.isclose(a.double(), b.double(), rtol=tol.rtol, atol=tol.atol, equal_nan=True)


def diagnose(
    out,
    ref: torch.Tensor,
    *,
    block: Sequence[int],
    tol: Tolerance,
    spill: tuple[int, int] = (0, 0),
    program_axes: Sequence[str] | None = None,
    matmul_operands: bool = False,
) -> Verdict:
    """Compare ``out`` with ``ref`` and name the classic bug when the pattern of errors shows one.

    ``block`` is the tile each program owns over the trailing ``len(block)`` dims of the output
    (``(BLOCK_SIZE,)`` for a 1-D kernel over the flattened output, ``(BLOCK_M, BLOCK_N)`` for a
    2-D one); leading dims are a grid axis of their own (channels, batches).
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
    if n_wrong == 0 and before == 0 and after == 0:
        return Verdict(True, "correct")

    details: list[str] = []
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
        return Verdict(False, "wrote outside the output", details)

    unwritten = is_poison(out_c) & ~is_poison(ref_c)
    total = out_c.numel()
    headline = f"{n_wrong} of {total} elements wrong"
    if int(unwritten.sum()):
        headline += f" ({int(unwritten.sum())} never written)"

    block = tuple(int(b) for b in block)
    nb = len(block)
    if nb == 1 and ref_c.dim() != 1:  # a 1-D kernel over the flattened tensor
        tile_dims: tuple[int, ...] = (total,)
    else:
        tile_dims = tuple(ref_c.shape[-nb:])
    # Leading dims (channels, batches) are a grid axis of their own: the bug is named on the
    # first slice that has wrong elements, where the tile geometry applies.
    slices = [t.reshape(-1, *tile_dims) for t in (out_c, ref_c, wrong, unwritten)]
    first = int(slices[2].reshape(len(slices[2]), -1).any(1).nonzero()[0])
    out_t, ref_t, wrong_t, unwritten_t = (t[first] for t in slices)
    where = f"in slice {first} of the leading dim, " if len(slices[0]) > 1 else ""

    # Which programs own the wrong elements, and are those the partial blocks at the edges?
    idx = wrong_t.nonzero()
    full = [d // b * b for d, b in zip(tile_dims, block)]  # end of the last full block per dim
    in_partial = torch.zeros(len(idx), dtype=torch.bool)
    for axis in range(nb):
        in_partial |= idx[:, axis] >= full[axis]
    programs = sorted({tuple(int(i) // b for i, b in zip(row, block)) for row in idx.tolist()})
    axes = program_axes or [f"pid_{a}" for a in range(nb)]

    details.extend(_name_the_bug(out_t, ref_t, wrong_t, unwritten_t, block, tile_dims, full,
                                 in_partial, tol, matmul_operands))

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


def _value(t: torch.Tensor, index) -> str:
    v = t[tuple(index)].item()
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _name_the_bug(out, ref, wrong, unwritten, block, dims, full, in_partial, tol,
                  matmul_operands) -> list[str]:
    """The classic mistakes, each recognised by the shape of its errors."""
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

    # Small errors everywhere: rounding of a lower-precision dtype (TF32 in tl.dot).
    if not bool(unwritten.any()) and bool(torch.isfinite(out).all()):
        scale = ref.double().abs().max().clamp_min(1e-30)
        rel = ((out.double() - ref.double()).abs().max() / scale).item()
        if rel < 2e-2 and wrong.float().mean().item() > 0.05:
            found.append(
                f"every element is off by a little (max error {rel:.1e} of the largest value): "
                "that is the rounding of a lower precision, e.g. TF32 (10-bit mantissa) in "
                "tl.dot on float32 inputs. Respect the data types: pass "
                "input_precision=\"ieee\" to tl.dot for float32, and accumulate in float32"
            )
            return found

    # One program per whole row (softmax): a NaN with a written element after it in its row is
    # no hole left by a grid or a mask (those leave whole rows or a tail): the kernel computed it.
    computed_nan = nb >= 2 and block[-1] >= dims[-1] and bool(
        (unwritten & (~is_poison(out)).flip(-1).cumsum(-1).flip(-1).bool()).any())
    if computed_nan and bool(unwritten[wrong].all()):
        found.append("some rows hold NaN before elements the kernel did write: it computed those "
                     "NaNs (inf - inf, inf / inf). tl.exp overflows to inf above ~88 in "
                     "float32: subtract the row max before exp")
    elif bool(unwritten.any()) and bool(unwritten[wrong].all()):
        found.append("the wrong elements were never written: check the grid covers the whole "
                     "output and that the store's mask is not too strict")
    elif bool((~torch.isfinite(out) & torch.isfinite(ref))[wrong].any()):
        found.append("some results are NaN/inf where the reference is finite: a load may read "
                     "past the end (missing mask=) or a masked load needs other=0")
    return found


# --------------------------------------------------------------------------------------------
# Running one case.
# --------------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    label: str
    verdict: Verdict
    seconds: float


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
) -> Verdict:
    """Call ``launcher(*inputs, **kwargs)`` with guarded inputs and poisoned allocations."""
    guarded_inputs = [guarded_copy(x) if isinstance(x, torch.Tensor) and x.is_contiguous() else x
                      for x in inputs]
    try:
        with poisoned_allocations() as made:
            out = launcher(*guarded_inputs, **(kwargs or {}))
    except Exception as exc:  # the learner's code: any error is a finding, not a crash
        return _verdict_for_exception(exc, learner_file)
    spill = (0, 0)
    if isinstance(out, torch.Tensor):
        for g in made:
            if g.view.data_ptr() == out.data_ptr() and g.n == out.numel():
                spill = g.spill()
    try:
        return diagnose(out, ref, block=block, tol=tol, spill=spill, program_axes=program_axes,
                        matmul_operands=matmul_operands)
    except Exception as exc:  # a diagnosis that fails must not hide the verdict
        ok = isinstance(out, torch.Tensor) and out.shape == ref.shape and bool(
            _close(out.detach().cpu(), ref.detach().cpu(), tol).all())
        return Verdict(ok, "correct" if ok else "wrong result",
                       [] if ok else [f"(the checker could not analyse it further: {exc!r})"])


def _verdict_for_exception(exc: Exception, learner_file: str | None) -> Verdict:
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
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if learner_file and Path(f.filename).resolve() == Path(learner_file).resolve()]
    where = f" (line {mine[-1].lineno}: {mine[-1].line})" if mine else ""
    message = str(exc).strip().splitlines()
    first = message[-1] if message else ""
    return Verdict(False, f"raised {type(exc).__name__}{where}", [first[:300]] if first else [])
