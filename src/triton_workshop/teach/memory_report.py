"""What a bounds-checked run found (:mod:`.memcheck` records it): the out-of-bounds accesses
(:class:`Violation`: which line, which programs, which offsets, which tensor, what the mask let
through), the write map of every tensor (:class:`WriteMap`: which program stored each element),
the launches, and the sentences that describe them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MAX_OFFSETS", "Launch", "MemcheckUnavailable", "MemoryReport", "Site", "TensorArg",
           "Violation", "WriteMap", "decode_program", "describe_violation", "encode_program",
           "format_ranges"]

MAX_OFFSETS = 4096  # offending lanes kept per violation (for the report and the picture)


class MemcheckUnavailable(RuntimeError):
    """The installed Triton's interpreter does not have the methods the bounds checks wrap."""


# ----------------------------------------------------------------------------------------------
# What a run found.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Site:
    """A line of the kernel's source."""

    file: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass
class TensorArg:
    """One tensor argument of a launch, as the interpreter sees it."""

    name: str  # the kernel's parameter name (``out_ptr``)
    key: int  # data_ptr of the caller's tensor: the same tensor on a GPU machine, where the
    #           interpreter works on a host copy
    base: int  # address of element 0 in the interpreter's memory
    lo: int  # byte range [lo, hi) the tensor's elements span
    hi: int
    storage_lo: int
    storage_hi: int
    itemsize: int
    shape: tuple
    strides: tuple

    @property
    def label(self) -> str:
        return self.name[:-4] if self.name.endswith("_ptr") and len(self.name) > 4 else self.name

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def size_text(self) -> str:
        if len(self.shape) <= 1:
            return f"{self.numel} elements"
        return f"{' x '.join(map(str, self.shape))}, {self.numel} elements"


@dataclass
class Violation:
    """Lanes of one load or store line that fell outside the tensor they were aimed at."""

    kind: str  # "load" or "store"
    kernel: str
    site: Site | None
    tensor: TensorArg
    masked: bool  # the call had a mask= (but it let these lanes through)
    mask_source: str | None
    programs: list = field(default_factory=list)  # program ids (tuples), in order of first offence
    n_programs: int = 0
    lanes: int = 0
    first_offsets: list = field(default_factory=list)  # the first offending program's offsets
    lowest: int = 0
    highest: int = 0
    positions: list = field(default_factory=list)  # (element offset, program) pairs, capped
    seen: set = field(default_factory=set, repr=False)

    def program_text(self) -> str:
        shown = ", ".join(_fmt_program(p) for p in self.programs[:4])
        more = f" and {self.n_programs - 4} more" if self.n_programs > 4 else ""
        return f"program{'s' if self.n_programs > 1 else ''} {shown}{more}"


@dataclass
class WriteMap:
    """Which program last stored each element of one tensor, and how many stores it got."""

    writer: np.ndarray  # int64, -1 where nothing was stored; else an encoded program id
    count: np.ndarray  # int32
    spans: dict = field(default_factory=dict)  # program code -> (lowest, highest, stores)

    @property
    def written(self) -> np.ndarray:
        return self.count > 0


@dataclass
class Launch:
    kernel: str
    grid: tuple
    tensors: list  # the kernel's parameter names of its tensor arguments
    keys: list = field(default_factory=list)  # and the caller's data_ptr of each

    def passed(self, tensor) -> bool:
        return tensor.data_ptr() in self.keys


@dataclass
class MemoryReport:
    """Everything the checked run saw, for the checker to turn into sentences."""

    learner_file: str | None = None
    violations: dict = field(default_factory=dict)  # (kind, site, tensor name) -> Violation
    writes: dict = field(default_factory=dict)  # caller tensor data_ptr -> WriteMap
    store_sites: dict = field(default_factory=dict)  # caller tensor data_ptr -> {Site: name}
    no_other_sites: dict = field(default_factory=dict)  # Site -> lanes masked off without other=
    launches: list = field(default_factory=list)
    tf32_dots: int = 0
    bf16_rounded: int = 0
    enabled: bool = True

    @property
    def clean(self) -> bool:
        return not self.violations

    def violations_of(self, kind: str | None = None) -> list[Violation]:
        return [v for v in self.violations.values() if kind is None or v.kind == kind]

    def describe(self, limit: int = 4, explain=None) -> list[str]:
        """One sentence per offending line: where, who, which offsets, and why (``explain(v)``
        may give the why instead, when the checker knows better than the mask)."""
        found = sorted(self.violations.values(), key=lambda v: (v.kind != "store", v.site.line if v.site else 0))
        lines = [describe_violation(v, explain(v) if explain else None) for v in found[:limit]]
        if len(found) > limit:
            lines.append(f"... and {len(found) - limit} more out-of-bounds load/store line(s)")
        return lines

    def notes(self) -> list[str]:
        out = []
        for site, lanes in self.no_other_sites.items():
            out.append(
                f"note: the load at {site} (`{site.code}`) has a mask but no other=: its "
                f"{lanes} masked-off lane(s) are undefined by Triton (zero on today's backends). "
                "Say what they should hold, e.g. other=0.0"
            )
        return out


def encode_program(pid: tuple) -> int:
    x, y, z = (tuple(pid) + (0, 0, 0))[:3]
    return int(x) | (int(y) << 21) | (int(z) << 42)


def decode_program(code: int, dims: int = 3) -> tuple:
    code = int(code)
    full = (code & 0x1FFFFF, (code >> 21) & 0x1FFFFF, (code >> 42) & 0x1FFFFF)
    return full[:dims]


def _fmt_program(pid: tuple) -> str:
    pid = tuple(pid)
    return str(pid[0]) if len(pid) == 1 else "(" + ", ".join(map(str, pid)) + ")"


def format_ranges(values, limit: int = 3) -> str:
    """``[1000, 1001, ..., 1023, 1100]`` as ``1000..1023, 1100``."""
    values = sorted(set(int(v) for v in values))
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:limit])
    return text + (", ..." if len(runs) > limit else "")


def describe_violation(v: Violation, why: str | None = None) -> str:
    t = v.tensor
    where = f" [{v.site} `{v.site.code}`]" if v.site else ""
    head = (f"{v.kind} at offsets {format_ranges(v.first_offsets)} of {t.label} ({t.size_text()}) "
            f"in {v.program_text()}{where}")
    if v.lanes > len(v.first_offsets):
        head += f" ({v.lanes} lanes out of bounds in all)"
    return head + ": " + (why or _why(v))


def _why(v: Violation) -> str:
    t = v.tensor
    n = t.numel
    below = v.lowest < 0
    past = v.highest >= n
    side = "before the start" if below and not past else "past the end"
    reasons = []
    if len(t.shape) == 2 and past and not below:
        rows, cols = t.shape
        reasons.append(f"offset {max(v.lowest, n)} is row {max(v.lowest, n) // cols}, past the last row "
                       f"({rows - 1})")
    if not v.masked:
        what = "loads" if v.kind == "load" else "stores"
        reasons.append(f"the tl.{v.kind} has no mask=, so it {what} every lane, including those "
                       f"{side} of {t.label}" + (
                           "; a mask on the store does not protect the loads" if v.kind == "load" else ""))
        return "; ".join(reasons)
    src = v.mask_source
    first = max(v.lowest, n) if past else v.lowest
    lets = f"the mask{f' `{src}`' if src else ''} lets offset {first} through"
    hints = []
    if src:
        if "<=" in src and past:
            hints.append("`<=`? Offsets run from 0 to n - 1: compare with `<`")
        if "|" in src:
            hints.append("`|` keeps a lane when either condition holds: combine the conditions "
                         "with `&`")
    if below and not hints:
        hints.append("offsets below 0 need a `>= 0` condition in the mask too")
    if not hints:
        hints.append("it must switch off every lane outside the tensor (offsets < its size, one "
                     "condition per dimension, combined with &)")
    return "; ".join(reasons + [lets + ": " + "; ".join(hints)])

