"""Where the time goes, for maintainers on the GPU machine (``workshop bench`` says *how fast*
each op is against its peers; this says *why*).

    PYTHONPATH=src python3 scripts/diagnose.py [SECTION ...]    # all sections when none named
    PYTHONPATH=src python3 scripts/diagnose.py --list           # the sections, one line each
    PYTHONPATH=src python3 scripts/diagnose.py --check [SECTION ...]

Sections:

* one per benchmark spec (``elementwise``, ``softmax``, ..., whatever ``bench.SPECS`` holds):
  each workload at its ``--quick`` size, triton-workshop's op and the reference, with the GPU time
  of one call (median of ``triton.testing.do_bench``), the CPU time it takes to *enqueue* one call
  (a call whose CPU time is close to its GPU time is launch-bound: Python and launch overhead, not
  the kernel, set its speed), its time through a CUDA graph (no host in it), the kernels it runs
  (``torch.profiler``) and the configs the autotuner picked;
* ``overhead``: the host's cost of one eager call, step by step, on shapes too small for the GPU
  to matter (an allocation, autograd, a launch in a backward, each op against PyTorch's);
* ``waits``: which calls make the CPU wait for the GPU (queued behind a long GPU sleep);
* ``thread``: host code on the main thread against autograd's device thread, GPU idle and busy;
* ``cpu``: where the CPU time of an eager call goes (cProfile).

``--check`` runs every case of the named sections once, at a tiny size, on whatever device this
machine has (the CPU and Triton's interpreter included), and times nothing: it shows the script
still runs against the library (``tests/test_diagnose.py`` runs it).

Everything here goes through the public API (``triton_workshop``, ``triton_workshop.bench``).
Earlier versions also swept the ops' launch constants and timed private launchers and prototype
kernels; those sections are in the git history, their findings in docs/results.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from typing import Callable

import torch
import torch.nn.functional as F

# Before anything imports Triton: the package decides interpreter or GPU when it is imported, and
# Triton's own jit helpers must be decorated after that decision.
import triton_workshop as tw
from triton_workshop import runtime
from triton_workshop.bench import SPECS
from triton_workshop.bench.measure import output_gradient, timed_call
from triton_workshop.bench.spec import OURS, Spec, dtype_name, rate_of


# --------------------------------------------------------------------------------------------
# Measuring: Clock on a CUDA GPU; DryRun for --check (every call once, tiny sizes, no timing).
# --------------------------------------------------------------------------------------------
class Clock:
    """The measurements the sections print, on a CUDA GPU."""

    check = False

    def __init__(self, device: torch.device):
        self.device = device

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def workload_size(self, w) -> tuple[int, ...]:
        return w.quick[0]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def gpu_ms(self, fn: Callable) -> float:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")

    def graph_ms(self, fn: Callable) -> float:
        """GPU time through a CUDA graph: no host in it (and L2 not flushed between calls)."""
        from triton.testing import do_bench_cudagraph

        return do_bench_cudagraph(fn, rep=100, return_mode="median")

    def cpu_us(self, fn: Callable, n: int = 30) -> float:
        """CPU time to enqueue one call (the GPU is not waited for inside the loop)."""
        fn()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        self.sync()
        return (t1 - t0) / n * 1e6

    def host_us(self, fn: Callable, rounds: int = 5, calls: int = 300) -> float:
        """Host µs per call of ``fn``: the best of ``rounds`` rounds of ``calls`` calls, each
        round started on an idle GPU."""
        best = float("inf")
        for _ in range(rounds):
            self.sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best

    def kernels(self, fn: Callable, iters: int = 5) -> list[tuple[str, float, float]]:
        """(kernel name, launches per call, GPU µs per call) of the kernels ``fn`` runs."""
        from torch.profiler import ProfilerActivity, profile

        fn()
        self.sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            self.sync()
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                total[e.name] += (e.device_time_total if hasattr(e, "device_time_total")
                                  else e.cuda_time_total)
                count[e.name] += 1
        rows = [(name[:90], count[name] / iters, total[name] / iters) for name in total]
        return sorted(rows, key=lambda r: -r[2])

    def runtime_calls(self, fn: Callable, iters: int = 20):
        """The CUDA runtime calls of ``fn`` (name, CPU µs per call, count per call), and the GPU's
        busy time, span and largest idle gaps per call, from ``torch.profiler``."""
        from torch.profiler import ProfilerActivity, profile

        fn()
        self.sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            self.sync()
        calls = [(e.key, e.cpu_time_total / iters, e.count / iters) for e in prof.key_averages()
                 if e.key.startswith("cu") or "ynchron" in e.key or "autograd" in e.key.lower()]
        gpu = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
        gaps = sorted(((b[0] - a[1], a[2][:40], b[2][:40]) for a, b in zip(gpu, gpu[1:])),
                      reverse=True)
        busy = sum(end - start for start, end, _ in gpu) / iters
        span = (gpu[-1][1] - gpu[0][0]) / iters if gpu else 0.0
        return sorted(calls, key=lambda c: -c[1]), busy, span, gaps

    def sleep(self, ms: float) -> None:
        """Queue a GPU sleep of about ``ms`` (the GPU is then busy while the host goes on)."""
        clock_khz = torch.cuda.get_device_properties(self.device).clock_rate
        torch.cuda._sleep(int(ms * clock_khz))

    def compile(self, fn: Callable) -> Callable:
        return torch.compile(fn)

    def cpu_profile(self, fn: Callable, n: int = 200, top: int = 14) -> None:
        """Print where the CPU time of ``n`` calls of ``fn`` goes (cProfile, µs per call, by
        own time)."""
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        self.sync()
        rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]
        for (file, line, func), (_, calls, own, cumulative, _) in rows:
            where = f"{file.split('site-packages/')[-1].split('src/')[-1]}:{line}({func})"
            print(f"      {own / n * 1e6:7.1f} own {cumulative / n * 1e6:7.1f} cum  "
                  f"×{calls / n:<4g} {where[:110]}")


class DryRun(Clock):
    """``--check``: tiny sizes, each measured call run once, nothing timed (NaN), on any device."""

    check = True

    def shape(self, shape):
        return tuple(min(d, 16) for d in shape)

    def workload_size(self, w):
        return w.shrink(w.quick[0], target=256)

    def gpu_ms(self, fn):
        return math.nan

    def graph_ms(self, fn):
        return math.nan

    def cpu_us(self, fn, n=30):
        fn()
        return math.nan

    def host_us(self, fn, rounds=5, calls=300):
        fn()
        return math.nan

    def kernels(self, fn, iters=5):
        return []

    def runtime_calls(self, fn, iters=20):
        fn()
        return [], 0.0, 0.0, []

    def sleep(self, ms):
        pass

    def compile(self, fn):
        return fn  # Inductor would compile C++ on the CPU: minutes, and not what is checked

    def cpu_profile(self, fn, n=200, top=14):
        super().cpu_profile(fn, n=1, top=3)


def through_autograd(backward: Callable):
    """An autograd.Function that passes its input through and runs ``backward(grad)``:
    autograd's own cost, plus whatever ``backward`` does on autograd's device thread."""

    class Passthrough(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return backward(g)

    return Passthrough


def half(clock: Clock, *shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(shape, device=clock.device, dtype=torch.float16, requires_grad=grad)


# --------------------------------------------------------------------------------------------
# One section per benchmark spec: each workload, ours and the reference, call by call.
# --------------------------------------------------------------------------------------------
def autotuned_configs() -> dict[tuple, object]:
    """(kernel name, key) → config for every Triton autotuner in triton_workshop's op modules,
    found by type rather than by name, so the list follows the kernels wherever they live."""
    from triton.runtime import Autotuner

    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("triton_workshop.ops"):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Autotuner):
                kernel = getattr(getattr(value, "fn", None), "__name__", repr(value))
                for key, config in list(getattr(value, "cache", {}).items()):
                    found[(kernel, key)] = config
    return found


def report(clock: Clock, label: str, call: Callable, work: int, unit: str) -> None:
    """One call timed four ways (GPU, CPU enqueue, CUDA graph) and its kernels, printed."""
    ms = clock.gpu_ms(call)
    cpu = clock.cpu_us(call)
    try:
        graph = f"{clock.graph_ms(call) * 1e3:8.1f} µs in a CUDA graph"
    except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: say why
        graph = f"no CUDA graph ({type(exc).__name__}: {str(exc)[:80]})"
    clock.sync()
    print(f"   {label}: {ms * 1e3:8.1f} µs GPU ({rate_of(work, ms, unit):7.1f} {unit}), "
          f"{cpu:7.1f} µs CPU enqueue, {graph}", flush=True)
    for name, per_call, us in clock.kernels(call):
        print(f"      {us:9.1f} µs  ×{per_call:<4g} {name}")


def spec_section(spec: Spec) -> Callable[[Clock], None]:
    def section(clock: Clock) -> None:
        print(f"== {spec.name}: {spec.title}: one call at the --quick size, GPU µs "
              "(do_bench median), CPU µs to enqueue it, µs through a CUDA graph, its kernels")
        for w in spec.workloads:
            size = clock.workload_size(w)
            work = w.work(size, w.dtype)
            with w.context():
                inputs = w.make_inputs(size, w.dtype, clock.device)
                dy = output_gradient(w, inputs)
                for who, fn in ((OURS, w.ours), (w.reference_name, w.reference)):
                    call = timed_call(w, fn, inputs, dy)
                    before = autotuned_configs()
                    call()  # compiles and tunes outside the timings
                    clock.sync()
                    report(clock, f"{w.name} {w.label(size)} {dtype_name(w.dtype)} · {who}", call,
                           work, w.unit)
                    for (kernel, key), config in autotuned_configs().items():
                        if (kernel, key) not in before:
                            print(f"      autotuned {kernel}: {config}  (key {key})")
            del inputs, dy
            if clock.device.type == "cuda":
                torch.cuda.empty_cache()

    section.__doc__ = (f"{spec.name} benchmark workloads, ours and the reference: GPU, CPU "
                       "enqueue and CUDA-graph time, kernels, autotuner picks")
    return section


# --------------------------------------------------------------------------------------------
# The host.
# --------------------------------------------------------------------------------------------
def section_overhead(clock: Clock) -> None:
    """Host µs of one eager call, step by step, on shapes too small for the GPU to matter."""
    print("== overhead: CPU µs per call on tiny shapes (best of 5 rounds of 300 calls; GPU idle)")
    rows, cols = clock.shape((64, 1024))
    x = half(clock, rows, cols, grad=True)
    xd = x.detach()
    w = half(clock, cols, grad=True)
    b = half(clock, cols, grad=True)
    wd, bd = w.detach(), b.detach()
    dy = torch.randn_like(xd)
    null = through_autograd(lambda g: g)
    alloc_in_backward = through_autograd(torch.empty_like)
    launch_in_backward = through_autograd(tw.softmax)  # a Triton launch on autograd's thread
    cases = {
        "x.data_ptr()": xd.data_ptr,
        "torch.empty_like(x)": lambda: torch.empty_like(xd),
        "x.new_empty(shape)": lambda: xd.new_empty(xd.shape),
        "Null fwd+bwd (autograd.grad)": lambda: torch.autograd.grad(null.apply(x), [x], dy),
        "Null fwd only, grad mode": lambda: null.apply(x),
        "AllocInBackward fwd+bwd": lambda: torch.autograd.grad(alloc_in_backward.apply(x), [x], dy),
        "LaunchInBackward fwd+bwd":
            lambda: torch.autograd.grad(launch_in_backward.apply(x), [x], dy),
        "tw.add no grad": lambda: tw.add(xd, xd),
        "torch.add no grad": lambda: torch.add(xd, xd),
        "tw.softmax forward only, grad mode": lambda: tw.softmax(x),
        "tw.softmax no grad": lambda: tw.softmax(xd),
        "torch.softmax no grad": lambda: torch.softmax(xd, -1),
        "tw.softmax fwd+bwd": lambda: torch.autograd.grad(tw.softmax(x), [x], dy),
        "torch.softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy),
        "tw.layer_norm no grad": lambda: tw.layer_norm(xd, (cols,), wd, bd),
        "F.layer_norm no grad": lambda: F.layer_norm(xd, (cols,), wd, bd),
        "tw.layer_norm forward only, grad mode": lambda: tw.layer_norm(x, (cols,), w, b),
        "tw.layer_norm fwd+bwd":
            lambda: torch.autograd.grad(tw.layer_norm(x, (cols,), w, b), [x, w, b], dy),
        "F.layer_norm fwd+bwd":
            lambda: torch.autograd.grad(F.layer_norm(x, (cols,), w, b), [x, w, b], dy),
    }
    for name, fn in cases.items():
        for _ in range(1 if clock.check else 50):
            fn()
        print(f"   {clock.host_us(fn):8.1f} µs  {name}", flush=True)


def section_waits(clock: Clock) -> None:
    """Which eager calls make the CPU wait for the GPU; CPU enqueue µs by size; CUDA calls.

    A long GPU sleep is queued first, then the call runs: a call that only enqueues returns in
    microseconds, one that synchronises (directly, or through the allocator or autograd) returns
    only when the sleep is over. Then the CPU enqueue time per call across sizes, and a profile
    of the CUDA runtime calls and of the GPU's idle gaps in one fwd+bwd."""
    print("== waits: CPU ms of calls queued behind a 30 ms GPU sleep (>= 30 means it waited)")
    m, n = clock.shape((8192, 8192))
    x = half(clock, m, n, grad=True)
    w = half(clock, n, grad=True)
    b = half(clock, n, grad=True)
    xd = x.detach()
    dy = torch.randn_like(xd)
    passthrough = through_autograd(lambda g: g)
    alloc_in_backward = through_autograd(torch.empty_like)
    launch_in_backward = through_autograd(tw.softmax)
    compiled = clock.compile(lambda t: torch.softmax(t, -1))
    compiled_ln = clock.compile(lambda t, w_, b_: F.layer_norm(t, (n,), w_, b_))
    cases = {
        "torch.empty_like(x)": lambda: torch.empty_like(xd),
        "Null fwd+bwd": lambda: torch.autograd.grad(passthrough.apply(x), [x], dy),
        "AllocInBackward fwd+bwd": lambda: torch.autograd.grad(alloc_in_backward.apply(x), [x], dy),
        "LaunchInBackward fwd+bwd":
            lambda: torch.autograd.grad(launch_in_backward.apply(x), [x], dy),
        "tw.softmax fwd, grad mode": lambda: tw.softmax(x),
        "tw.softmax fwd+bwd": lambda: torch.autograd.grad(tw.softmax(x), [x], dy),
        "torch.softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy),
        "compiled softmax fwd+bwd": lambda: torch.autograd.grad(compiled(x), [x], dy),
        "tw.layer_norm fwd+bwd":
            lambda: torch.autograd.grad(tw.layer_norm(x, (n,), w, b), [x, w, b], dy),
        "F.layer_norm fwd+bwd":
            lambda: torch.autograd.grad(F.layer_norm(x, (n,), w, b), [x, w, b], dy),
        "compiled layer_norm fwd+bwd":
            lambda: torch.autograd.grad(compiled_ln(x, w, b), [x, w, b], dy),
    }
    for name, fn in cases.items():
        for _ in range(1 if clock.check else 3):
            fn()
        clock.sync()
        times = []
        clock.sleep(30)
        for _ in range(1 if clock.check else 4):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        clock.sync()
        flag = "  <-- WAITED" if max(times) > 20 and not clock.check else ""
        print(f"   {name:32s} " + " ".join(f"{t:7.2f}" for t in times) + " ms" + flag, flush=True)

    print("== CPU enqueue µs per fwd+bwd call (30 calls, no sync) by size, and GPU µs (do_bench)")
    for rows, cols in map(clock.shape, ((64, 1024), (1024, 1024), (8192, 1024), (65536, 1024),
                                         (8192, 8192))):
        xs = half(clock, rows, cols, grad=True)
        dys = torch.randn_like(xs)
        per_size = {"tw": lambda: torch.autograd.grad(tw.softmax(xs), [xs], dys),
                    "torch": lambda: torch.autograd.grad(torch.softmax(xs, -1), [xs], dys),
                    "Null": lambda: torch.autograd.grad(passthrough.apply(xs), [xs], dys)}
        for name, fn in per_size.items():
            print(f"   softmax {rows}x{cols} {name:6s}: {clock.cpu_us(fn):7.1f} µs CPU, "
                  f"{clock.gpu_ms(fn) * 1e3:7.1f} µs GPU", flush=True)

    print(f"== CUDA runtime calls in 20 tw.softmax fwd+bwd calls at {m}x{n} (CPU µs per call)")
    calls, busy, span, gaps = clock.runtime_calls(cases["tw.softmax fwd+bwd"])
    for key, us, count in calls[:15]:
        print(f"      {us:9.1f} µs  ×{count:<5g} {key[:90]}")
    print(f"      GPU busy {busy:.1f} µs per call of a {span:.1f} µs span; largest gaps:")
    for gap, before, after in gaps[:4]:
        print(f"      {gap:9.1f} µs between {before} and {after}")


def section_thread(clock: Clock) -> None:
    """Host code on the main thread against autograd's device thread, GPU idle and busy.

    CUDA backwards run on autograd's device thread: the same step is timed there and on the main
    thread, with a long GPU sleep queued ahead or not, and the hand-off of autograd.grad."""
    print("== thread: µs per step on the main thread vs autograd's device thread, GPU idle/busy")
    small = half(clock, *clock.shape((64, 1024)))
    big = half(clock, *clock.shape((8192, 8192)))
    tw.softmax(small)  # compiled before anything is timed

    def python_loop():
        total = 0
        for i in range(200):
            total += i
        return total

    steps = {
        "python loop (200 adds)": python_loop,
        f"torch.empty_like({'x'.join(map(str, small.shape))})": lambda: torch.empty_like(small),
        f"torch.empty_like({'x'.join(map(str, big.shape))})": lambda: torch.empty_like(big),
        "torch.neg(small) (one aten launch)": lambda: torch.neg(small),
        "tw.softmax(small) (one Triton launch)": lambda: tw.softmax(small),
        "tw.softmax(big)": lambda: tw.softmax(big),
    }
    reps = 1 if clock.check else 50
    probe = {"step": None, "t": 0.0, "enter": 0.0, "leave": 0.0}

    def time_steps(g):
        probe["enter"] = time.perf_counter()
        step = probe["step"]
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        probe["t"] = (time.perf_counter() - t0) / reps * 1e6
        probe["leave"] = time.perf_counter()
        return g

    run_in_backward = through_autograd(time_steps)
    leaf = torch.randn(4, device=clock.device, requires_grad=True)
    ones = torch.ones(4, device=clock.device)
    print(f"   {'step':40s} " + " ".join(f"{column:>10s}" for column in
                                         ("main idle", "main busy", "dev idle", "dev busy")))
    for name, step in steps.items():
        row = []
        for thread in ("main", "device"):
            for busy in (False, True):
                best = float("inf")
                for _ in range(1 if clock.check else 3):
                    clock.sync()
                    if busy:
                        clock.sleep(40)
                    if thread == "main":
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            step()
                        us = (time.perf_counter() - t0) / reps * 1e6
                    else:
                        probe["step"] = step
                        torch.autograd.grad(run_in_backward.apply(leaf), [leaf], ones)
                        us = probe["t"]
                    best = min(best, us)
                clock.sync()
                row.append(best)
        print(f"   {name:40s} " + " ".join(f"{v:10.1f}" for v in row), flush=True)
    # Hand-off: from calling autograd.grad to the backward's first line, and back.
    probe["step"] = lambda: None
    rounds = 1 if clock.check else 20
    for busy in (False, True):
        into, back = [], []
        for _ in range(rounds):
            clock.sync()
            if busy:
                clock.sleep(4)
            out = run_in_backward.apply(leaf)
            t0 = time.perf_counter()
            torch.autograd.grad(out, [leaf], ones)
            t1 = time.perf_counter()
            into.append((probe["enter"] - t0) * 1e6)
            back.append((t1 - probe["leave"]) * 1e6)
        into.sort(), back.sort()
        print(f"   autograd.grad hand-off, GPU {'busy' if busy else 'idle'}: into backward "
              f"{into[rounds // 2]:.1f} µs, back to caller {back[rounds // 2]:.1f} µs "
              f"(medians of {rounds})")


def section_cpu(clock: Clock) -> None:
    """Where the CPU time of one eager call goes (cProfile), for launch-bound calls.

    A call whose CPU enqueue time rivals its GPU time is as fast as its host code."""
    print("== cpu: CPU profile of eager calls (µs per call, by own time)")
    m, n = clock.shape((8192, 8192))
    x = half(clock, m, n, grad=True)
    w = half(clock, n, grad=True)
    b = half(clock, n, grad=True)
    dy = torch.randn_like(x)
    batch, channels, height, width = clock.shape((32, 64, 56, 56))
    xc = half(clock, batch, channels, height, width).contiguous(memory_format=torch.channels_last)
    xn = xc.contiguous()
    wc = half(clock, channels, channels, 3, 3)
    a = half(clock, *clock.shape((1024, 1024)))
    cases = {
        "softmax fwd+bwd": lambda: torch.autograd.grad(tw.softmax(x), [x], dy),
        "torch softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy),
        "layer_norm fwd+bwd":
            lambda: torch.autograd.grad(tw.layer_norm(x, (n,), w, b), [x, w, b], dy),
        "torch layer_norm fwd+bwd":
            lambda: torch.autograd.grad(F.layer_norm(x, (n,), w, b), [x, w, b], dy),
        "conv2d channels_last": lambda: tw.conv2d(xc, wc, padding=1),
        "conv2d NCHW": lambda: tw.conv2d(xn, wc, padding=1),
        f"matmul {'x'.join(map(str, a.shape))}x{a.shape[1]}": lambda: tw.matmul(a, a),
        f"add {'x'.join(map(str, a.shape))}": lambda: tw.add(a, a),
    }
    n_calls = 1 if clock.check else 200
    for name, fn in cases.items():
        for _ in range(1 if clock.check else 20):
            fn()
        clock.sync()
        t0 = time.perf_counter()
        for _ in range(n_calls):
            fn()
        wall = (time.perf_counter() - t0) / n_calls * 1e6
        clock.sync()
        print(f"{name}: {wall:.1f} µs wall per call (unprofiled, GPU may be the limit)")
        clock.cpu_profile(fn, n_calls)


SECTIONS: dict[str, Callable[[Clock], None]] = {
    **{spec.name: spec_section(spec) for spec in SPECS},
    "overhead": section_overhead,
    "waits": section_waits,
    "thread": section_thread,
    "cpu": section_cpu,
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help=f"some of: {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--check", action="store_true",
                        help="run every case once at a tiny size on this device, timing nothing")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, section in SECTIONS.items():
            print(f"{name:12s} {section.__doc__.split(chr(10))[0]}")
        return 0
    if args.check:
        clock: Clock = DryRun(torch.device(runtime.DEVICE))
    elif not torch.cuda.is_available() or runtime.INTERPRET:
        print("diagnose.py needs a CUDA GPU (--check runs anywhere)", file=sys.stderr)
        return 2
    else:
        clock = Clock(torch.device("cuda", torch.cuda.current_device()))
    import triton

    where = torch.cuda.get_device_name(clock.device) if clock.device.type == "cuda" else "CPU"
    check = " · --check: each case once, tiny sizes; the numbers mean nothing"
    print(f"{where} · torch {torch.__version__} · triton {triton.__version__}"
          + (check if clock.check else ""))
    for name in args.sections or SECTIONS:
        t = time.perf_counter()
        SECTIONS[name](clock)
        print(f"   ({name}: {time.perf_counter() - t:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
