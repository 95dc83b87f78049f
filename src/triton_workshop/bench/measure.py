"""How a workload is measured, one size at a time: correctness first, then every candidate timed.

* **correctness first**: each size checks triton-workshop's result (and gradients) against eager
  PyTorch before timing it; a wrong result is reported as WRONG, never timed;
* **timing**: ``triton.testing.do_bench(..., return_mode="median")``, which flushes L2 before
  every repetition, so memory-bound numbers are DRAM numbers; every candidate is timed twice, in
  order and in reverse order, and the two medians averaged, so that drift within a case (clocks,
  power) weighs on all candidates alike;
* **a ceiling**: memory-bound ops are compared with the copy bandwidth measured at the start of the
  run (``dst.copy_(src)`` of 1 GiB, bytes read + written); matrix products with cuBLAS at the same
  shape and precision, timed beside the candidates.

Every result is a :class:`Row`, one per (workload, size, candidate); :mod:`.report` reads Rows.

Whole models (:mod:`.models`) are timed here too, a training step at a time
(:func:`measure_steps`): CUDA events around each step (:class:`CudaTimer`; :class:`WallTimer` on
the CPU), the median of the timed steps, the first step's wall time, the peak memory.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .. import runtime

from .spec import (
    GBPS, OURS, TORCH_COMPILE, Inputs, Size, Spec, Workload, dtype_name, one_line, rate_of,
)

__all__ = ["COPY_BYTES", "TIMING_FULL", "TIMING_QUICK", "CudaTimer", "Measurement", "Row", "Steps",
           "Timer", "WallTimer", "evaluate", "gpu_unavailable_reason", "grad_leaves",
           "measure_case", "measure_copy_ceiling", "measure_steps", "needs_copy_ceiling",
           "output_gradient", "outputs", "time_in_both_orders", "timed_call"]

#: do_bench budgets in ms (warm-up, timed repetitions) for the full sweep and for --quick.
TIMING_FULL = (25, 100)
TIMING_QUICK = (10, 40)

#: The copy that sets the memory ceiling: 1 GiB read and 1 GiB written per call.
COPY_BYTES = 1 << 30


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


def gpu_unavailable_reason() -> str | None:
    """Why this process cannot benchmark, or None when it can."""
    if runtime.INTERPRET:
        return f"kernels run in Triton's interpreter here ({runtime.INTERPRET_REASON})"
    if not torch.cuda.is_available():
        return "no CUDA device found"
    return None


class Timer:
    """``triton.testing.do_bench`` with the suite's budgets; the median of the timed runs.

    ``graphs``: ``triton.testing.do_bench_cudagraph`` instead, the calls captured in a CUDA graph
    and replayed: the GPU's own time, without the host's launches and autograd in between. A
    small fwd+bwd case through autograd is bound by the host (the GPU idles between kernels), so
    plain timing reports the host's speed there; graphs report the kernels'. L2 is not flushed
    between replays (the cases whose data fits in L2 read faster than DRAM allows). A call that
    cannot be captured is timed plainly and says so (:meth:`time`)."""

    def __init__(self, warmup: int, rep: int, *, graphs: bool = False):
        self.warmup, self.rep, self.graphs = warmup, rep, graphs

    def __call__(self, fn: Callable) -> float:
        return self.time(fn)[0]

    def time(self, fn: Callable) -> tuple[float, str]:
        """(ms, note): the note is empty, or says that a graph capture failed."""
        from triton.testing import do_bench, do_bench_cudagraph

        if self.graphs:
            try:
                return float(do_bench_cudagraph(fn, rep=self.rep, return_mode="median")), ""
            except Exception as exc:  # capture refused (a host sync, a CPU tensor, ...)
                if isinstance(exc, torch.OutOfMemoryError):
                    raise
                note = f"not capturable in a CUDA graph ({one_line(exc)}): timed plainly"
                torch.cuda.synchronize()
                return float(do_bench(fn, warmup=self.warmup, rep=self.rep,
                                      return_mode="median")), note
        return float(do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median")), ""


def grad_leaves(inputs: Inputs) -> list[torch.Tensor]:
    return [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]


def evaluate(w: Workload, fn: Callable, inputs: Inputs, dy: torch.Tensor | None) -> tuple:
    """A candidate's output, and for fwd+bwd workloads the gradients of the inputs that want one.

    Forward workloads' inputs do not require grad, so no graph is recorded; the call runs in the
    same grad mode as the timed calls, so torch.compile's first graph is the one that is timed."""
    if not w.backward:
        return outputs(fn(*inputs))
    outs = outputs(fn(*inputs))
    grads = torch.autograd.grad(outs, grad_leaves(inputs), dy)
    return (*(o.detach() for o in outs), *grads)


def outputs(out) -> tuple:
    """A candidate's result as a tuple of tensors (ops such as rope return two)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def timed_call(w: Workload, fn: Callable, inputs: Inputs, dy: torch.Tensor | None) -> Callable:
    """What do_bench repeats: the forward, or forward + backward (autograd.grad returns fresh
    gradients, so nothing accumulates between repetitions)."""
    if not w.backward:
        return lambda: fn(*inputs)
    leaves = grad_leaves(inputs)
    return lambda: torch.autograd.grad(fn(*inputs), leaves, dy)


def output_gradient(w: Workload, inputs: Inputs) -> torch.Tensor | tuple | None:
    """A fixed random gradient of the output for fwd+bwd workloads (None for forward only); a
    scalar output (a loss) gets 1, what ``loss.backward()`` passes in a training step."""
    if not w.backward:
        return None
    with torch.no_grad():
        probe = w.reference(*inputs)
    if isinstance(probe, (tuple, list)):  # one gradient per output
        return tuple(torch.randn_like(p) for p in probe)
    if probe.dim() == 0:
        return torch.ones_like(probe)
    return torch.randn_like(probe)


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


def needs_copy_ceiling(w: Workload) -> bool:
    """Whether ``w`` is compared with the copy bandwidth: a GB/s workload without a ceiling."""
    return w.ceiling is None and w.unit == GBPS


def measure_case(
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
            return [row(OURS, "ours", "oom", note=one_line(exc))]

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
                results[name] = row(name, role, "oom", note=one_line(exc))
                continue
            except Exception as exc:
                status = "error" if role == "ours" else "unavailable"
                results[name] = row(name, role, status, note=one_line(exc))
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
        ceiling = copy_rate if needs_copy_ceiling(w) else None
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


def time_in_both_orders(timer: Timer | Callable[[Callable], float],
                        calls: Sequence[tuple[str, Callable]]):
    """name → (ms, status, note). Each call is timed twice, in order and then in reverse order,
    and the two medians are averaged: a drift over the case (clocks, power: cuBLAS moved by ±5%
    between consecutive measurements on an H100) then weighs on every candidate alike."""
    # A timer is any callable returning ms; a Timer also says how it timed (Timer.time).
    timed = getattr(timer, "time", None) or (lambda call: (timer(call), ""))
    samples: dict[str, list[float]] = {name: [] for name, _ in calls}
    notes: dict[str, str] = {}
    failed: dict[str, tuple[None, str, str]] = {}
    for order in (list(calls), list(calls)[::-1]):
        for name, call in order:
            if name in failed:
                continue
            try:
                ms, note = timed(call)
                samples[name].append(ms)
                if note:
                    notes[name] = note
            except torch.OutOfMemoryError as exc:
                failed[name] = (None, "oom", one_line(exc))
                torch.cuda.empty_cache()
            except Exception as exc:
                failed[name] = (None, "error", one_line(exc))
    return {
        name: failed.get(name) or (sum(samples[name]) / len(samples[name]), "ok",
                                   notes.get(name, ""))
        for name, _ in calls
    }


# ----------------------------------------------------------------------------------------------
# Whole models: a step at a time.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Steps:
    """How many steps: ``loss`` from the start (compared with torch eager; the first is the
    first-step time), then ``warmup`` untimed, then ``timed``."""

    loss: int
    warmup: int
    timed: int


class CudaTimer:
    """Steps timed with CUDA events (GPU time between two points of the stream), wall time with
    ``perf_counter`` after a synchronise, peak memory from the caching allocator."""

    def now(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        torch.cuda.synchronize()

    def time_ms(self, fn: Callable[[], Any]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak_bytes(self) -> int | None:
        return torch.cuda.max_memory_allocated()


class WallTimer(CudaTimer):
    """The CPU's stand-in (tests, ``--device cpu`` debugging): wall time, no memory figure."""

    def sync(self) -> None:
        pass

    def time_ms(self, fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    def reset_peak(self) -> None:
        pass

    def peak_bytes(self) -> int | None:
        return None


@dataclass
class Measurement:
    ms_per_step: float
    first_step_s: float
    peak_bytes: int | None
    losses: list[float]
    step_ms: list[float]


def start_steps(step: Callable[[Any], torch.Tensor], batches: Sequence, steps: Steps,
                timer) -> tuple[float, list[float]]:
    """The untimed part of :func:`measure_steps`: the ``steps.loss`` steps that record the loss
    (the first timed by wall clock, compilation and tuning included), then ``steps.warmup``
    steps. Returns ``(first_step_s, losses)``; the timed steps start at batch ``steps.loss +
    steps.warmup``."""
    if steps.loss < 1 or steps.timed < 1 or steps.warmup < 0:
        raise ValueError(f"steps needs loss >= 1, timed >= 1, warmup >= 0, got {steps}")
    if not batches:
        raise ValueError("batches must not be empty")
    timer.reset_peak()
    start = timer.now()
    losses = [float(step(batches[0]))]
    timer.sync()
    first_step_s = timer.now() - start
    for i in range(1, steps.loss):
        losses.append(float(step(batches[i % len(batches)])))
    offset = steps.loss
    for i in range(steps.warmup):
        step(batches[(offset + i) % len(batches)])
    return first_step_s, losses


def timed_steps(step: Callable[[Any], torch.Tensor], batches: Sequence, first: int, count: int,
                timer) -> list[float]:
    """``count`` steps timed one by one (ms), over ``batches`` cycled from index ``first``."""
    step_ms = []
    for i in range(count):
        batch = batches[(first + i) % len(batches)]
        step_ms.append(timer.time_ms(lambda: step(batch)))
    return step_ms


def measure_steps(step: Callable[[Any], torch.Tensor], batches: Sequence, steps: Steps, timer) -> Measurement:
    """Run ``step`` over ``batches`` (cycled): the first ``steps.loss`` steps record the loss (the
    first is timed by wall clock, compilation and tuning included), then ``steps.warmup`` untimed
    steps, then ``steps.timed`` steps timed one by one; ms/step is their median (robust to the odd
    slow step: a clock change, a host hiccup)."""
    first_step_s, losses = start_steps(step, batches, steps, timer)
    step_ms = timed_steps(step, batches, steps.loss + steps.warmup, steps.timed, timer)
    return Measurement(statistics.median(step_ms), first_step_s, timer.peak_bytes(), losses, step_ms)
