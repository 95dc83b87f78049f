"""What a benchmark measures: :class:`Workload` (one computation swept over sizes) and
:class:`Spec` (an op family's workloads), with the units, the candidates' names and the
correctness tolerances every spec shares.

A spec module (``bench/<family>.py``) builds one ``SPEC`` from these; :mod:`.measure` times it and
:mod:`.report` prints and writes what it measured.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import torch

GBPS = "GB/s"
TFLOPS = "TFLOP/s"

#: Work counted per unit: a workload's ``work`` is bytes (GB/s) or FLOPs (TFLOP/s). A new kind of
#: rate (a whole-model spec's, say) is one more entry here.
UNITS = {GBPS: 1e9, TFLOPS: 1e12}

OURS = "triton-workshop"
TORCH_EAGER = "torch eager"
TORCH_COMPILE = "torch.compile"

#: (rtol, atol) of the correctness check, atol relative to the largest |value| of the reference:
#: the outputs' scales differ by orders of magnitude (softmax ~1e-4, a K=8192 product ~500), and an
#: absolute tolerance that suits one lets every wrong value of the other pass.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 4e-3),
}

Size = tuple[int, ...]
Inputs = tuple[Any, ...]


@dataclass(kw_only=True)
class Workload:
    """One computation, swept over sizes, with everything the runner needs to measure it.

    Functions (``ours``, ``reference``, ``peers``) all take the tensors that ``make_inputs``
    returns, in order, and return one tensor. Fwd+bwd workloads build inputs with
    ``requires_grad`` set where a gradient is wanted; the runner times forward + backward with a
    fixed random output gradient.
    """

    name: str
    dtype: torch.dtype
    unit: str  # a key of UNITS: GBPS (work = bytes moved) or TFLOPS (work = FLOPs)
    sizes: tuple[Size, ...]  # the full sweep, in plotting order
    quick: tuple[Size, ...]  # the --quick subset
    headlines: tuple[Size, ...]  # the sizes the summary reports
    make_inputs: Callable[[Size, torch.dtype, torch.device], Inputs]
    work: Callable[[Size, torch.dtype], int]
    work_formula: str  # how `work` is counted, in words (tables, meta.json)
    ours: Callable  # triton-workshop's op, called on the inputs
    reference: Callable  # eager PyTorch: correctness reference and the first peer
    reference_name: str = TORCH_EAGER
    peers: dict[str, Callable] = field(default_factory=dict)  # more peers that run anywhere
    optional_peers: dict[str, Callable[[], Callable]] = field(default_factory=dict)  # factories
    compile_peer: bool = True
    backward: bool = False
    #: None: the copy bandwidth (GB/s workloads; other units then have no ceiling). Otherwise a
    #: function of the inputs whose measured rate at each size is the ceiling (the same object as
    #: ``reference`` reuses that timing).
    ceiling: Callable | None = None
    ceiling_name: str = "copy"
    context: Callable[[], ContextManager] = contextlib.nullcontext
    tolerance: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"{self.name}: unit {self.unit!r} is not one of {list(UNITS)}")
        missing = [s for s in (*self.quick, *self.headlines) if s not in self.sizes]
        if missing:
            raise ValueError(f"{self.name}: quick/headline sizes {missing} are not in sizes")

    def sizes_for(self, quick: bool) -> tuple[Size, ...]:
        return self.quick if quick else self.sizes

    def summary_sizes(self, quick: bool) -> tuple[Size, ...]:
        """The measured sizes the summary reports: the headlines, or in a --quick run that
        measures none of them, its largest size."""
        measured = self.sizes_for(quick)
        return tuple(s for s in measured if s in self.headlines) or measured[-1:]

    def label(self, size: Size) -> str:
        return size_label(size)

    def shrink(self, size: Size, target: int = 4096) -> Size:
        """The same shape family at a tiny scale (about ``target`` elements in the dimensions
        larger than 4), for checks on the CPU: every large dimension divided by one factor."""
        large = [d for d in size if d > 4]
        if not large or math.prod(large) <= target:
            return size
        factor = (math.prod(large) / target) ** (1 / len(large))
        return tuple(d if d <= 4 else max(2, math.ceil(d / factor)) for d in size)

    def candidates(self, *, with_compile: bool = True) -> dict[str, Callable | str]:
        """Name → function, or → a string saying why that candidate is unavailable."""
        found: dict[str, Callable | str] = {OURS: self.ours, self.reference_name: self.reference}
        if with_compile and self.compile_peer:
            # dynamic=False: one graph specialised to this shape, as a user's fixed-shape model gets.
            found[TORCH_COMPILE] = torch.compile(self.reference, dynamic=False)
        found.update(self.peers)
        for name, factory in self.optional_peers.items():
            try:
                found[name] = factory()
            except Exception as exc:
                found[name] = f"not importable: {one_line(exc)}"
        return found

    def check(self, got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> str | None:
        """None when ``got`` matches ``expected`` within the dtype's tolerance, else what differs."""
        rtol, atol = self.tolerance or TOLERANCES[self.dtype]
        names = ["output"] + [f"grad {i}" for i in range(len(expected) - 1)]
        for name, g, e in zip(names, got, expected):
            if tuple(g.shape) != tuple(e.shape):
                return f"{name}: shape {tuple(g.shape)}, expected {tuple(e.shape)}"
            g32, e32 = g.detach().float(), e.detach().float()
            scale = float(e32.abs().nan_to_num(posinf=0.0, neginf=0.0).max()) if e32.numel() else 0.0
            if not torch.allclose(g32, e32, rtol=rtol, atol=atol * (scale or 1.0), equal_nan=True):
                err = float((g32 - e32).abs().nan_to_num(nan=float("inf")).max())
                return f"{name}: max abs error {err:.3g} (rtol {rtol:g}, atol {atol:g}×{scale:.3g})"
        return None


@dataclass
class Spec:
    name: str
    title: str
    workloads: list[Workload]

    @property
    def unit(self) -> str:
        return self.workloads[0].unit


def rate_of(work: int, ms: float, unit: str) -> float:
    """GB/s (1e9 bytes a second) or TFLOP/s (1e12 FLOPs a second) of ``work`` done in ``ms``."""
    return work / ms / (UNITS[unit] / 1e3)


def size_label(size: Size) -> str:
    """``(2**24,)`` → ``2^24``; ``(3, 8192, 8192)`` → ``3×8192×8192``."""
    if len(size) == 1 and size[0] > 0 and size[0] & (size[0] - 1) == 0:
        return f"2^{size[0].bit_length() - 1}"
    return "×".join(str(d) for d in size)


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(
        dtype, str(dtype).replace("torch.", "")
    )


def liger(module: str, attr: str) -> Callable[[], Callable]:
    """A factory for a Liger-Kernel function, for ``Workload.optional_peers``: Liger-Kernel is an
    optional peer, so it is looked up by name when a run starts and reported n/a when absent."""

    def factory():
        return getattr(importlib.import_module(module), attr).apply

    return factory


def one_line(exc: BaseException, limit: int = 160) -> str:
    """An exception as one short line, for a table's note."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"
