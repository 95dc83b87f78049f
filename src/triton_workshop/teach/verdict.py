"""Judging: the vocabulary of a check. :class:`Tolerance` (per dtype), :class:`Verdict` (passed,
a headline, the details), :class:`CaseResult` (one case's verdict and time), :class:`Geometry` (how
the output is tiled into the programs' blocks), and :func:`close`, the comparison every judge uses.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

__all__ = ["CaseResult", "Geometry", "TaskReport", "Tolerance", "Verdict", "case_tolerance",
           "close", "fmt_index", "tolerance_for"]


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


def fmt_index(idx: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(i)) for i in idx) + ")" if len(idx) > 1 else str(int(idx[0]))


def close(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> torch.Tensor:
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


def case_tolerance(case) -> Tolerance:
    """The case's own tolerance when it has one (derived from how the reference is computed),
    else the dtype's."""
    tol = getattr(case, "tolerance", None)
    return Tolerance(*tol) if tol else tolerance_for(case.reference.dtype)


@dataclass
class CaseResult:
    label: str
    verdict: Verdict
    seconds: float


@dataclass
class TaskReport:
    function: str
    cases: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(c.verdict.passed for c in self.cases)
