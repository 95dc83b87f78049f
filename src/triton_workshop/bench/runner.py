"""The one benchmark runner: every spec is measured the same way, against its peers, in one run.

A *spec* (``bench/<family>.py``) describes an op family as a list of :class:`Workload` s. A workload
says what to compute (triton-workshop's op and the eager PyTorch expression it replaces), at which
sizes, how to build fresh random inputs, and how much work one call does: the bytes it must move
(each input read once, each output written once; fwd+bwd counts the passes its docstring lists)
or the FLOPs of a matrix product. Everything else lives here, once:

* **peers, in the same run**: the eager expression, ``torch.compile`` of it (compiled once per
  shape; a failing compile reports the peer as unavailable), vendor libraries (cuBLAS, cuDNN) and
  Liger-Kernel where it imports;
* **a ceiling**: memory-bound ops are compared with the copy bandwidth measured at the start of the
  run (``dst.copy_(src)`` of 1 GiB, bytes read + written); matrix products with cuBLAS at the same
  shape and precision;
* **correctness first**: each size checks triton-workshop's result (and gradients) against eager
  PyTorch before timing it; a wrong result is reported as WRONG, never timed;
* **timing**: ``triton.testing.do_bench(..., return_mode="median")``, which flushes L2 before
  every repetition, so memory-bound numbers are DRAM numbers; every candidate is timed twice, in
  order and in reverse order, and the two medians averaged, so that drift within a case (clocks,
  power) weighs on all candidates alike;
* **reports**: a rich table per spec, a summary table, ``results.csv``, one PNG per spec and
  ``meta.json`` (GPU, versions, timestamp), written after every spec so a cut-off run keeps what it
  measured.

Benchmarks need a CUDA GPU: in Triton's interpreter kernels run as Python on the CPU and timings
mean nothing, so :func:`main` refuses there with exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import gc
import importlib
import io
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ContextManager, Iterable, Sequence

import torch

from .. import runtime

#: The specs, in the order the suite runs them; each is the module ``triton_workshop.bench.<name>``.
SPEC_NAMES = ("elementwise", "image", "softmax", "layer_norm", "matmul", "conv", "attention")

GBPS = "GB/s"
TFLOPS = "TFLOP/s"

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

#: do_bench budgets in ms (warm-up, timed repetitions) for the full sweep and for --quick.
TIMING_FULL = (25, 100)
TIMING_QUICK = (10, 40)

#: The copy that sets the memory ceiling: 1 GiB read and 1 GiB written per call.
COPY_BYTES = 1 << 30

Size = tuple[int, ...]
Inputs = tuple[Any, ...]


# --------------------------------------------------------------------------------------------
# What a spec declares.
# --------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Workload:
    """One computation, swept over sizes, with everything the runner needs to measure it.

    Functions (``ours(module)``, ``reference``, ``peers``) all take the tensors that
    ``make_inputs`` returns, in order, and return one tensor. Fwd+bwd workloads build inputs with
    ``requires_grad`` set where a gradient is wanted; the runner times forward + backward with a
    fixed random output gradient.
    """

    name: str
    dtype: torch.dtype
    unit: str  # GBPS (work = bytes moved) or TFLOPS (work = FLOPs)
    sizes: tuple[Size, ...]  # the full sweep, in plotting order
    quick: tuple[Size, ...]  # the --quick subset
    headlines: tuple[Size, ...]  # the sizes the summary reports
    make_inputs: Callable[[Size, torch.dtype, torch.device], Inputs]
    work: Callable[[Size, torch.dtype], int]
    work_formula: str  # how `work` is counted, in words (tables, meta.json)
    module: str  # where triton-workshop's op lives, imported lazily
    ours: Callable[[ModuleType], Callable]
    reference: Callable  # eager PyTorch: correctness reference and the first peer
    reference_name: str = TORCH_EAGER
    peers: dict[str, Callable] = field(default_factory=dict)  # more peers that run anywhere
    optional_peers: dict[str, Callable[[], Callable]] = field(default_factory=dict)  # factories
    compile_peer: bool = True
    backward: bool = False
    #: None: the copy bandwidth. Otherwise a function of the inputs whose measured rate at each
    #: size is the ceiling (the same object as ``reference`` reuses that timing).
    ceiling: Callable | None = None
    ceiling_name: str = "copy"
    context: Callable[[], ContextManager] = contextlib.nullcontext
    tolerance: tuple[float, float] | None = None

    def __post_init__(self) -> None:
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

    def load_ours(self) -> Callable:
        """triton-workshop's op (raises what the import raises, e.g. while it is being written)."""
        return self.ours(importlib.import_module(self.module))

    def candidates(self, *, with_compile: bool = True) -> dict[str, Callable | str]:
        """Name → function, or → a string saying why that candidate is unavailable."""
        found: dict[str, Callable | str] = {}
        try:
            found[OURS] = self.load_ours()
        except Exception as exc:  # an op module that does not import yet: report, don't crash
            found[OURS] = f"import failed: {_one_line(exc)}"
        found[self.reference_name] = self.reference
        if with_compile and self.compile_peer:
            # dynamic=False: one graph specialised to this shape, as a user's fixed-shape model gets.
            found[TORCH_COMPILE] = torch.compile(self.reference, dynamic=False)
        found.update(self.peers)
        for name, factory in self.optional_peers.items():
            try:
                found[name] = factory()
            except Exception as exc:
                found[name] = f"not importable: {_one_line(exc)}"
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


def size_label(size: Size) -> str:
    """``(2**24,)`` → ``2^24``; ``(3, 8192, 8192)`` → ``3×8192×8192``."""
    if len(size) == 1 and size[0] > 0 and size[0] & (size[0] - 1) == 0:
        return f"2^{size[0].bit_length() - 1}"
    return "×".join(str(d) for d in size)


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(
        dtype, str(dtype).replace("torch.", "")
    )


def grad_leaves(inputs: Inputs) -> list[torch.Tensor]:
    return [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def evaluate(w: Workload, fn: Callable, inputs: Inputs, dy: torch.Tensor | None) -> tuple:
    """A candidate's output, and for fwd+bwd workloads the gradients of the inputs that want one.

    Forward workloads' inputs do not require grad, so no graph is recorded; the call runs in the
    same grad mode as the timed calls, so torch.compile's first graph is the one that is timed."""
    if not w.backward:
        return (fn(*inputs),)
    out = fn(*inputs)
    grads = torch.autograd.grad(out, grad_leaves(inputs), dy)
    return (out.detach(), *grads)


def timed_call(w: Workload, fn: Callable, inputs: Inputs, dy: torch.Tensor | None) -> Callable:
    """What do_bench repeats: the forward, or forward + backward (autograd.grad returns fresh
    gradients, so nothing accumulates between repetitions)."""
    if not w.backward:
        return lambda: fn(*inputs)
    leaves = grad_leaves(inputs)
    return lambda: torch.autograd.grad(fn(*inputs), leaves, dy)


def output_gradient(w: Workload, inputs: Inputs) -> torch.Tensor | None:
    """A fixed random gradient of the output for fwd+bwd workloads (None for forward only)."""
    if not w.backward:
        return None
    with torch.no_grad():
        probe = w.reference(*inputs)
    return torch.randn_like(probe)


def liger(module: str, attr: str) -> Callable[[], Callable]:
    """A factory for a Liger-Kernel function, for ``Workload.optional_peers``."""

    def factory():
        return getattr(importlib.import_module(module), attr).apply

    return factory


def _one_line(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------------------------
# Results: one Row per (workload, size, candidate); tables, CSV and plots all read Rows.
# --------------------------------------------------------------------------------------------
@dataclass
class Row:
    spec: str
    op: str
    size: str
    dtype: str
    candidate: str
    status: str  # ok | wrong | error | unavailable | oom
    ms: float | None
    rate: float | None
    unit: str
    ceiling: float | None
    ceiling_source: str
    role: str = "peer"  # ours | reference | compile | peer | ceiling
    ratio: float | None = None  # this candidate's ms / triton-workshop's ms (>1: ours is faster)
    headline: bool = False
    note: str = ""

    @property
    def pct_ceiling(self) -> float | None:
        if self.rate is None or not self.ceiling:
            return None
        return 100.0 * self.rate / self.ceiling


CSV_COLUMNS = (
    "spec", "op", "size", "dtype", "candidate", "role", "status", "ms", "rate", "unit",
    "pct_of_ceiling", "ceiling", "ceiling_source", "ratio_vs_triton_workshop", "headline", "note",
)


def rate_of(work: int, ms: float, unit: str) -> float:
    """GB/s (1e9 bytes a second) or TFLOP/s (1e12 FLOPs a second) of ``work`` done in ``ms``."""
    return work / ms / (1e6 if unit == GBPS else 1e9)


class Timer:
    """``triton.testing.do_bench`` with the suite's budgets; the median of the timed runs."""

    def __init__(self, warmup: int, rep: int):
        self.warmup, self.rep = warmup, rep

    def __call__(self, fn: Callable) -> float:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median"))


def measure_copy_ceiling(timer: Timer, device: torch.device) -> Row:
    """The memory ceiling: a device-to-device copy of 1 GiB, counting bytes read + written."""
    src = torch.randn(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    rate = rate_of(2 * COPY_BYTES, ms, GBPS)
    return Row(
        spec="ceiling", op="copy (dst.copy_(src))", size="1 GiB", dtype="fp32", candidate="torch",
        status="ok", ms=ms, rate=rate, unit=GBPS, ceiling=rate, ceiling_source="copy",
        role="ceiling", note="bytes = 2 × 1 GiB (read + write)",
    )


def run_case(
    spec: Spec, w: Workload, size: Size, timer: Timer, device: torch.device,
    copy_rate: float | None, *, with_compile: bool = True, headline: bool | None = None,
) -> list[Row]:
    """Check triton-workshop's result at one size, then time it and every peer."""
    torch._dynamo.reset()  # one compiled graph per shape; no recompile limit across the sweep
    dtype = dtype_name(w.dtype)

    def row(candidate, role, status, ms=None, note="") -> Row:
        return Row(
            spec=spec.name, op=w.name, size=w.label(size), dtype=dtype, candidate=candidate,
            status=status, ms=ms, rate=None if ms is None else rate_of(work, ms, w.unit),
            unit=w.unit, ceiling=None, ceiling_source=w.ceiling_name, role=role,
            headline=size in w.headlines if headline is None else headline, note=note,
        )

    work = w.work(size, w.dtype)
    with w.context():
        candidates = w.candidates(with_compile=with_compile)
        roles = {OURS: "ours", w.reference_name: "reference", TORCH_COMPILE: "compile"}
        try:
            inputs = w.make_inputs(size, w.dtype, device)
            dy = output_gradient(w, inputs)
            expected = evaluate(w, w.reference, inputs, dy)
        except torch.OutOfMemoryError as exc:
            return [row(OURS, "ours", "oom", note=_one_line(exc))]

        results: dict[str, Row] = {}
        ready: list[tuple[str, Callable]] = []
        for name, fn in candidates.items():
            role = roles.get(name, "peer")
            if isinstance(fn, str):
                results[name] = row(name, role, "unavailable", note=fn)
                continue
            try:
                if role == "ours":
                    problem = w.check(evaluate(w, fn, inputs, dy), expected)
                    if problem:
                        results[name] = row(name, role, "wrong", note=problem)
                        continue
                else:
                    evaluate(w, fn, inputs, dy)  # first call: compiles, and fails here if it can't
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except torch.OutOfMemoryError as exc:
                results[name] = row(name, role, "oom", note=_one_line(exc))
                continue
            except Exception as exc:
                status = "error" if role == "ours" else "unavailable"
                results[name] = row(name, role, status, note=_one_line(exc))
                continue
            ready.append((name, timed_call(w, fn, inputs, dy)))
        del expected
        torch.cuda.empty_cache()

        own_ceiling = w.ceiling is not None and w.ceiling is not w.reference
        if own_ceiling:
            ready.append((_CEILING, timed_call(w, w.ceiling, inputs, dy)))
        timings = time_in_both_orders(timer, ready)
        for name, (ms, status, note) in timings.items():
            if name != _CEILING:
                results[name] = row(name, roles.get(name, "peer"), status, ms=ms, note=note)
        ceiling = copy_rate
        if w.ceiling is not None:
            # cuBLAS's own product at this shape: the reference itself, or timed beside it.
            ceiling_ms = timings.get(_CEILING if own_ceiling else w.reference_name, (None,))[0]
            ceiling = None if ceiling_ms is None else rate_of(work, ceiling_ms, w.unit)
        order = list(candidates)
        del inputs, dy, candidates, ready

    gc.collect()
    torch.cuda.empty_cache()
    rows = [results[name] for name in order]
    ours_ms = next((r.ms for r in rows if r.role == "ours" and r.status == "ok"), None)
    for r in rows:
        r.ceiling = ceiling
        if r.ms is not None and ours_ms:
            r.ratio = r.ms / ours_ms
    return rows


_CEILING = "<ceiling>"  # the ceiling's own timing, beside the candidates'


def time_in_both_orders(timer: Timer, calls: Sequence[tuple[str, Callable]]):
    """name → (ms, status, note). Each call is timed twice, in order and then in reverse order,
    and the two medians are averaged: a drift over the case (clocks, power: cuBLAS moved by ±5%
    between consecutive measurements on an H100) then weighs on every candidate alike."""
    samples: dict[str, list[float]] = {name: [] for name, _ in calls}
    failed: dict[str, tuple[None, str, str]] = {}
    for order in (list(calls), list(calls)[::-1]):
        for name, call in order:
            if name in failed:
                continue
            try:
                samples[name].append(timer(call))
            except torch.OutOfMemoryError as exc:
                failed[name] = (None, "oom", _one_line(exc))
                torch.cuda.empty_cache()
            except Exception as exc:
                failed[name] = (None, "error", _one_line(exc))
    return {
        name: failed.get(name) or (sum(samples[name]) / len(samples[name]), "ok", "")
        for name, _ in calls
    }


# --------------------------------------------------------------------------------------------
# Reports.
# --------------------------------------------------------------------------------------------
def _fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "–"
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}"


def _fmt_ratio(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"


_STATUS_STYLE = {"wrong": "bold red", "error": "red", "oom": "red", "unavailable": "dim"}


def _cell(r: Row | None) -> str:
    if r is None:
        return ""
    if r.status != "ok":
        label = {"wrong": "WRONG", "unavailable": "n/a"}.get(r.status, r.status)
        return f"[{_STATUS_STYLE.get(r.status, '')}]{label}[/]"
    if r.role == "ours":
        pct = r.pct_ceiling
        return f"[bold]{_fmt_rate(r.rate)}[/]" + ("" if pct is None else f" ({pct:.0f}%)")
    return f"{_fmt_rate(r.rate)} ({_fmt_ratio(r.ratio)})"


def _cases(rows: Iterable[Row]) -> dict[tuple[str, str, str], dict[str, Row]]:
    """(op, size, dtype) → candidate → Row, in the order measured."""
    cases: dict[tuple[str, str, str], dict[str, Row]] = {}
    for r in rows:
        cases.setdefault((r.op, r.size, r.dtype), {})[r.candidate] = r
    return cases


def spec_table(spec_title: str, rows: Sequence[Row]):
    """One rich table: a row per (op, size), a column per candidate."""
    from rich.table import Table

    candidates = list(dict.fromkeys(r.candidate for r in rows))
    unit = rows[0].unit if rows else ""
    table = Table(
        title=f"{spec_title} ({unit})",
        caption=(
            f"{OURS}: {unit} (% of ceiling); peers: {unit} (speed-up of {OURS} over the peer, "
            ">1× = ours faster). WRONG: failed the correctness check, not timed."
        ),
        caption_justify="left",
    )
    for column in ("op", "size", "dtype", "ceiling"):
        table.add_column(column, no_wrap=True)
    for c in candidates:
        table.add_column(c, justify="right")
    for (op, size, dtype), by_candidate in _cases(rows).items():
        first = next(iter(by_candidate.values()))
        ceiling = f"{_fmt_rate(first.ceiling)} {first.ceiling_source}" if first.ceiling else "–"
        table.add_row(op, size, dtype, ceiling, *(_cell(by_candidate.get(c)) for c in candidates))
    return table


def problems(rows: Iterable[Row]) -> list[str]:
    """One line per result that is not a clean measurement of a candidate we expected to run."""
    out = []
    for r in rows:
        if r.status != "ok" and not r.note.startswith("not importable"):
            out.append(f"{r.op} {r.size} {r.dtype} · {r.candidate}: {r.status.upper()} {r.note}")
    return out


def summary_rows(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """One entry per workload and headline size: ours, % of ceiling, speed-up against each peer."""
    out = []
    for (op, size, dtype), by_candidate in _cases(r for r in rows if r.headline).items():
        ours = by_candidate.get(OURS)
        if ours is None:
            continue
        entry: dict[str, Any] = {
            "op": op, "size": size, "dtype": dtype, "unit": ours.unit, "status": ours.status,
            "rate": ours.rate, "pct_of_ceiling": ours.pct_ceiling,
            "ceiling_source": ours.ceiling_source, "speedup": {},
        }
        for name, r in by_candidate.items():
            if name != OURS:
                entry["speedup"][name] = r.ratio if r.status == "ok" else None
        entry["reference"] = next(
            (n for n, r in by_candidate.items() if r.role == "reference"), None
        )
        out.append(entry)
    return out


def summary_table(rows: Sequence[Row]):
    from rich.table import Table

    table = Table(
        title="Summary: triton-workshop at each workload's headline size",
        caption="speed-ups are peer time / triton-workshop time (>1× = triton-workshop faster)",
        caption_justify="left",
    )
    for column in ("op", "size", "dtype", OURS, "% ceiling", "vs eager/vendor", "vs compile",
                   "vs others"):
        table.add_column(column, no_wrap=column not in ("vs others",),
                         justify="left" if column in ("op", "size", "dtype", "vs others") else "right")
    for e in summary_rows(rows):
        if e["status"] != "ok":
            style = _STATUS_STYLE.get(e["status"], "")
            table.add_row(e["op"], e["size"], e["dtype"], f"[{style}]{e['status'].upper()}[/]",
                          "", "", "", "")
            continue
        speedup = dict(e["speedup"])
        ref = e["reference"]
        ref_ratio = speedup.pop(ref, None)
        ref_cell = _fmt_ratio(ref_ratio) + ("" if ref == TORCH_EAGER or ref is None else f" {ref}")
        compile_cell = _fmt_ratio(speedup.pop(TORCH_COMPILE, None))
        others = ", ".join(f"{n} {_fmt_ratio(v)}" for n, v in speedup.items() if v is not None)
        pct = e["pct_of_ceiling"]
        table.add_row(
            e["op"], e["size"], e["dtype"], f"{_fmt_rate(e['rate'])} {e['unit']}",
            "–" if pct is None else f"{pct:.0f}% {e['ceiling_source']}",
            ref_cell, compile_cell, others,
        )
    return table


def render_text(renderable, width: int = 200) -> str:
    """A rich renderable as plain text (for meta.json and logs)."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(renderable)
    return buffer.getvalue()


def write_csv(path: Path, rows: Iterable[Row]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in rows:
            pct = r.pct_ceiling
            writer.writerow([
                r.spec, r.op, r.size, r.dtype, r.candidate, r.role, r.status,
                "" if r.ms is None else f"{r.ms:.6g}",
                "" if r.rate is None else f"{r.rate:.6g}",
                r.unit,
                "" if pct is None else f"{pct:.2f}",
                "" if r.ceiling is None else f"{r.ceiling:.6g}",
                r.ceiling_source,
                "" if r.ratio is None else f"{r.ratio:.4f}",
                int(r.headline), r.note,
            ])
    return path


def write_plot(path: Path, spec_title: str, rows: Sequence[Row], subtitle: str = "") -> Path:
    """One figure per spec, one panel per workload: x = size, y = GB/s or TFLOP/s, a line per
    candidate, the ceiling dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        panels.setdefault((r.op, r.dtype), []).append(r)
    n = max(1, len(panels))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False)
    # One colour per candidate across all panels, whatever each panel lacks.
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {c: palette[i % len(palette)]
               for i, c in enumerate(dict.fromkeys(r.candidate for r in rows))}
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, ((op, dtype), panel) in zip(axes.flat, panels.items()):
        sizes = list(dict.fromkeys(r.size for r in panel))
        x = list(range(len(sizes)))
        unit = panel[0].unit
        for candidate in dict.fromkeys(r.candidate for r in panel):
            by_size = {r.size: r for r in panel if r.candidate == candidate}
            y = [
                by_size[s].rate if s in by_size and by_size[s].status == "ok" else math.nan
                for s in sizes
            ]
            if all(math.isnan(v) for v in y):
                continue
            ax.plot(x, y, marker="o", label=candidate, color=colours[candidate],
                    linewidth=2.2 if candidate == OURS else 1.4)
        failed = [f"{r.size}: {r.status.upper()}" for r in panel
                  if r.candidate == OURS and r.status != "ok"]
        if failed:
            ax.text(0.02, 0.02, f"{OURS} " + ", ".join(failed), transform=ax.transAxes,
                    color="red", fontsize=7)
        ceiling = {r.size: r.ceiling for r in panel if r.ceiling}
        if ceiling:
            yc = [ceiling.get(s, math.nan) for s in sizes]
            label = f"ceiling ({panel[0].ceiling_source})"
            if len(x) == 1:  # one point draws no line: a dashed tick instead
                ax.hlines(yc, [v - 0.3 for v in x], [v + 0.3 for v in x], colors="k",
                          linestyles="dashed", linewidth=1, label=label)
            else:
                ax.plot(x, yc, "k--", linewidth=1, label=label)
        ax.set_xticks(x)
        ax.set_xticklabels(sizes, rotation=30 if max(len(s) for s in sizes) > 6 else 0,
                           ha="right" if max(len(s) for s in sizes) > 6 else "center", fontsize=8)
        ax.set_title(f"{op} ({dtype})", fontsize=10)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(spec_title + (f" — {subtitle}" if subtitle else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_meta(path: Path, meta: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# The registry and the command line.
# --------------------------------------------------------------------------------------------
def load_spec(name: str) -> Spec:
    return importlib.import_module(f"{__package__}.{name}").SPEC


def resolve_names(names: Sequence[str]) -> list[str]:
    """Spec names as typed (``layer-norm`` = ``layer_norm``), in suite order; all when none."""
    if not names:
        return list(SPEC_NAMES)
    wanted = [n.strip().lower().replace("-", "_") for n in names]
    unknown = [n for n, w in zip(names, wanted) if w not in SPEC_NAMES]
    if unknown:
        raise ValueError(
            f"unknown benchmark {', '.join(map(repr, unknown))}; valid names: {', '.join(SPEC_NAMES)}"
        )
    return [n for n in SPEC_NAMES if n in wanted]


def gpu_unavailable_reason() -> str | None:
    """Why this process cannot benchmark, or None when it can."""
    if runtime.INTERPRET:
        return f"kernels run in Triton's interpreter here ({runtime.INTERPRET_REASON})"
    if not torch.cuda.is_available():
        return "no CUDA device found"
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workshop bench",
        description=(
            "Benchmark triton-workshop's kernels on a CUDA GPU against PyTorch eager, "
            "torch.compile and vendor libraries, with the copy bandwidth (or cuBLAS) as ceiling."
        ),
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run (default: all): {', '.join(SPEC_NAMES)}")
    parser.add_argument("--quick", action="store_true",
                        help="one mid size per workload and shorter timing (about 2 minutes)")
    parser.add_argument("--out", default="bench-results", type=Path,
                        help="folder for results.csv, <spec>.png and meta.json (default: %(default)s)")
    parser.add_argument("-k", "--match", action="append", default=[], metavar="TEXT",
                        help="only the cases whose 'workload size dtype' contains TEXT (repeatable; "
                             "'x' matches '×'), e.g. -k 'fwd+bwd' -k 8192x8192x8192")
    parser.add_argument("--list", action="store_true",
                        help="list the benchmarks, their workloads and sizes, and exit")
    return parser


def list_specs(names: Sequence[str], console) -> None:
    for name in names:
        spec = load_spec(name)
        console.print(f"[bold]{name}[/]: {spec.title}")
        for w in spec.workloads:
            sizes = ", ".join(w.label(s) for s in w.sizes)
            quick = ", ".join(w.label(s) for s in w.quick)
            console.print(f"  {w.name} ({dtype_name(w.dtype)}, {w.unit}): {sizes}  [dim]quick: {quick}[/]")
            console.print(f"    [dim]{w.work_formula}[/]")


def _console():
    from rich.console import Console

    # Piped into a log, rich would assume 80 columns and fold the tables.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def main(argv: list[str] | None = None) -> int:
    """``workshop bench [NAME ...] [--quick] [--out DIR] [--list]``; returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return int(exit_.code or 0)
    try:
        names = resolve_names(args.names)
    except ValueError as exc:
        print(f"workshop bench: error: {exc}", file=sys.stderr)
        return 2
    console = _console()
    if args.list:
        list_specs(names, console)
        return 0
    reason = gpu_unavailable_reason()
    if reason:
        print(
            f"workshop bench: needs a CUDA GPU: {reason}.\n"
            "Benchmarks time compiled kernels; in the interpreter they run as Python on the CPU, "
            "where timings mean nothing. Run it on a machine with an NVIDIA GPU "
            "(scripts/gpu_check.sh runs the tests and the benchmarks there).",
            file=sys.stderr,
        )
        return 2
    return run_suite([load_spec(n) for n in names], quick=args.quick, out=args.out, console=console,
                     match=args.match)


def _environment() -> dict[str, Any]:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def case_matches(w: Workload, size: Size, match: Sequence[str]) -> bool:
    """Whether ``-k`` keeps this case: no filter, or one TEXT is in 'name size dtype'."""
    if not match:
        return True
    text = f"{w.name} {w.label(size)} {dtype_name(w.dtype)}".replace("×", "x").lower()
    return any(m.replace("×", "x").lower() in text for m in match)


def run_suite(specs: Sequence[Spec], *, quick: bool, out: Path, console=None,
              match: Sequence[str] = ()) -> int:
    """Run the specs (only the cases ``match`` keeps, see :func:`case_matches`); print tables;
    write results.csv, <spec>.png and meta.json into ``out``. Returns 0 when every
    triton-workshop result was correct and measured, 1 otherwise (also when nothing matched)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or _console()
    # Inductor's hint to enable TF32 is noise here: the IEEE fp32 product is measured on purpose.
    warnings.filterwarnings("ignore", message=".*TensorFloat32 tensor cores.*")
    device = torch.device("cuda", torch.cuda.current_device())
    timer = Timer(*(TIMING_QUICK if quick else TIMING_FULL))
    env = _environment()
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    console.print(
        f"[bold]triton-workshop bench[/] on {env['gpu']} · torch {env['torch']} · "
        f"triton {env['triton']} · {'quick' if quick else 'full'} sweep · do_bench(warmup="
        f"{timer.warmup}, rep={timer.rep}, median) · results → {out}/"
    )

    plan = [(spec, w, size) for spec in specs for w in spec.workloads for size in w.sizes_for(quick)
            if case_matches(w, size, match)]
    if not plan:
        console.print(f"[red]no benchmark case matches -k {' -k '.join(match)}[/] (see --list)")
        return 1
    ceiling_rows: list[Row] = []
    copy_rate = None
    if any(w.ceiling is None for _, w, _ in plan):
        ceiling_rows.append(measure_copy_ceiling(timer, device))
        copy_rate = ceiling_rows[0].rate
        console.print(f"ceiling: device-to-device copy of 1 GiB: {copy_rate:.0f} GB/s "
                      "(bytes read + written)")

    meta: dict[str, Any] = {
        "timestamp": stamp, **env, "quick": quick, "specs": [s.name for s in specs],
        "timing": {"warmup_ms": timer.warmup, "rep_ms": timer.rep, "return_mode": "median",
                   "l2_flushed": True},
        "copy_ceiling_gbps": copy_rate,
        "work": {f"{w.name} ({dtype_name(w.dtype)})": w.work_formula
                 for s in specs for w in s.workloads},
        "files": [],
    }
    rows: list[Row] = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=not console.is_terminal)
    with progress:
        task = progress.add_task("bench", total=len(plan))
        done = 0
        for spec in specs:
            spec_rows: list[Row] = []
            for w in spec.workloads:
                for size in w.sizes_for(quick):
                    if not case_matches(w, size, match):
                        continue
                    done += 1
                    what = f"{spec.name} · {w.name} {w.label(size)} {dtype_name(w.dtype)}"
                    progress.update(task, description=what)
                    elapsed = time.perf_counter() - started
                    console.print(f"[dim][{done:>2}/{len(plan)} {elapsed:5.0f}s][/] {what}")
                    case = run_case(spec, w, size, timer, device, copy_rate,
                                    headline=size in w.summary_sizes(quick))
                    console.print("        " + _case_line(case))
                    spec_rows += case
                    progress.advance(task)
            if not spec_rows:
                continue
            rows += spec_rows
            console.print(spec_table(spec.title, spec_rows))
            for line in problems(spec_rows):
                console.print(f"  [red]{line}[/]")
            png = write_plot(out / f"{spec.name}.png", spec.title, spec_rows, env["gpu"])
            meta["files"].append(png.name)
            write_csv(out / "results.csv", ceiling_rows + rows)
            meta["elapsed_s"] = round(time.perf_counter() - started, 1)
            write_meta(out / "meta.json", {**meta, "files": ["results.csv", *meta["files"]]})

    summary = summary_table(rows)
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    meta["summary"] = summary_rows(rows)
    meta["summary_table"] = render_text(summary)
    meta["files"] = ["results.csv", *meta["files"], "meta.json"]
    write_csv(out / "results.csv", ceiling_rows + rows)
    write_meta(out / "meta.json", meta)
    failed = [r for r in rows if r.role == "ours" and r.status != "ok"]
    console.print(f"wrote {', '.join(meta['files'])} to {out}/ in {meta['elapsed_s']:.0f} s")
    if failed:
        console.print(f"[red]{len(failed)} triton-workshop result(s) not ok[/]")
    console.print(summary)
    return 1 if failed else 0


def _case_line(rows: Sequence[Row]) -> str:
    parts = []
    for r in rows:
        if r.status != "ok":
            parts.append(f"{r.candidate} {_cell(r)}")
        elif r.role == "ours":
            pct = r.pct_ceiling
            parts.append(f"{r.candidate} {_fmt_rate(r.rate)} {r.unit}"
                         + ("" if pct is None else f" ({pct:.0f}% of {r.ceiling_source})"))
        else:
            parts.append(f"{r.candidate} {_fmt_ratio(r.ratio)}")
    return " · ".join(parts)
