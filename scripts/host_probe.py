"""Host (Python) time per call of each public op against the torch op it replaces.

Small tensors, so that the host, not the GPU, sets the pace: what is measured is the Python and
launch overhead of one eager call, forward alone and forward + backward under autograd. The
target: no more than the torch op's time + ``--budget`` µs (5 by default).

On a GPU (real launches)::

    python scripts/host_probe.py --csv host.csv

times a batch of calls between two ``torch.cuda.synchronize()`` (time per call = wall / calls; the
kernels of tiny tensors finish faster than the host enqueues them) and reports the median of
several batches, ours and torch's alternating batch by batch.

On a machine without a GPU::

    python scripts/host_probe.py --stub

takes the GPU's launch path with Triton's C launcher replaced by a no-op
(:func:`triton_workshop.runtime.launch.stub_launches`: the kernels do not run, outputs hold
garbage), so what is timed is the Python of the call; torch's ops compute on tiny CPU tensors.
The C launcher's own cost on the GPU (a few µs) is not in the stubbed numbers.

``--autocast`` times every call under ``torch.autocast(bfloat16)``, the way a training step's
forward calls the ops (the inputs, float32 by default, are cast as torch casts them): ours and
torch's casts both count, and the region is entered at each call (torch keeps a weight's cast
until its region ends; a step casts each weight once).

``--same-thread`` runs every backward on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``). By default autograd runs a CUDA backward on
its own device thread, and handing each ``backward()`` over to it and back costs more than most
ops (torch's ``x.clone()``, forward + backward, took 133.7 µs with the thread and 52.8 without on an
H200: docs/results.md, 2026-11-28, 13bbc96), and it varies from run to run by tens of µs. A
training step pays that hand-off once per backward, not once per op; with ``--same-thread`` a
fwd+bwd row measures what the op itself costs, ours and torch's alike.

The first row, ``autograd_floor``, is a yardstick rather than an op: torch's add wrapped in the
least a ``torch.autograd.Function`` can be. Its fwd+bwd difference from ``torch.add`` is what
autograd charges any node whose backward is Python, before any of our code runs; an op whose
gradient needs our kernels cannot come in under torch's time + that difference.

Ops that are not in this tree (families added later) are skipped with a note.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class Case:
    """One op: our call and torch's, forward and forward + backward (None: not differentiable)."""

    name: str
    ours: Callable[[], object]
    theirs: Callable[[], object]
    ours_backward: Callable[[], object] | None = None
    theirs_backward: Callable[[], object] | None = None
    #: A yardstick, not an op: its difference is printed, never judged against the budget.
    reference: bool = False


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stub", action="store_true",
                   help="no GPU: take the GPU's launch path with the C launcher a no-op")
    p.add_argument("--csv", metavar="PATH", help="also write the table as CSV")
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--calls", type=int, default=200, help="calls a timed batch")
    p.add_argument("--batches", type=int, default=15, help="timed batches (the median is kept)")
    p.add_argument("--budget", type=float, default=5.0, help="µs allowed over torch's time")
    p.add_argument("--stat", default="median", choices=["median", "min"],
                   help="batch statistic kept (min is steadier on a loaded machine)")
    p.add_argument("--autocast", action="store_true",
                   help="every call under torch.autocast(bfloat16), entered at each call, as a training "
                        "step's forward runs (inputs of --dtype, float32 by default, cast as torch "
                        "casts them)")
    p.add_argument("--same-thread", action="store_true",
                   help="run backwards on the calling thread (no hand-off to autograd's device "
                        "thread, which a step pays once per backward, not per op)")
    p.add_argument("--profile", metavar="OP",
                   help="print cProfile's view of OP's forward and fwd+bwd instead of the table")
    return p.parse_args(argv)


def _backward_of(fn, grad):
    def run():
        fn().backward(grad)
    return run


def _sum_backward(fn):
    def run():
        fn().sum().backward()
    return run


def build_cases(tw, torch, device, dtype) -> tuple[list[Case], list[str]]:
    """Every public op's case at tiny shapes; and notes on the ops skipped."""
    F = torch.nn.functional
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, positive=False, grad=False):
        t = torch.rand(*shape, generator=gen) if positive else torch.randn(*shape, generator=gen)
        t = t.to(device=device, dtype=dtype)
        return t.requires_grad_() if grad else t

    cases: list[Case] = []
    notes: list[str] = []

    # The floor every op with a Python backward stands on: torch's add wrapped in the least a
    # torch.autograd.Function can be (the forward calls torch.add, the backward returns the
    # gradient twice). Its difference from torch.add is what autograd charges a Python node,
    # before any of our code runs.
    class _AddFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a_, b_):
            return torch.add(a_, b_)

        @staticmethod
        def backward(ctx, grad):
            return grad, grad

    fx, fy = rand(8, 64), rand(8, 64)
    fxg, fyg = rand(8, 64, grad=True), rand(8, 64, grad=True)
    f64 = rand(8, 64)
    cases.append(Case("autograd_floor", lambda: _AddFunction.apply(fx, fy),
                      lambda: torch.add(fx, fy),
                      _backward_of(lambda: _AddFunction.apply(fxg, fyg), f64),
                      _backward_of(lambda: torch.add(fxg, fyg), f64), reference=True))

    # linear / matmul: (8, 32) @ (32, 16).
    x, w, b = rand(8, 32), rand(16, 32), rand(16)
    xg, wg, bg = rand(8, 32, grad=True), rand(16, 32, grad=True), rand(16, grad=True)
    g16 = rand(8, 16)
    cases.append(Case("linear", lambda: tw.linear(x, w, b), lambda: F.linear(x, w, b),
                      _backward_of(lambda: tw.linear(xg, wg, bg), g16),
                      _backward_of(lambda: F.linear(xg, wg, bg), g16)))
    # A Linear fused with its GELU (patch's default swap for a Linear followed by a GELU).
    cases.append(Case(
        "linear_gelu", lambda: tw.linear(x, w, b, activation="gelu"),
        lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        _backward_of(lambda: tw.linear(xg, wg, bg, activation="gelu"), g16),
        _backward_of(lambda: F.gelu(F.linear(xg, wg, bg), approximate="tanh"), g16)))
    a, bm = rand(8, 32), rand(32, 16)
    ag, bmg = rand(8, 32, grad=True), rand(32, 16, grad=True)
    cases.append(Case("matmul", lambda: tw.matmul(a, bm), lambda: torch.matmul(a, bm),
                      _backward_of(lambda: tw.matmul(ag, bmg), g16),
                      _backward_of(lambda: torch.matmul(ag, bmg), g16)))

    # Row-wise ops over (8, 64).
    r, rw, rb = rand(8, 64), rand(64), rand(64)
    rg, rwg, rbg = rand(8, 64, grad=True), rand(64, grad=True), rand(64, grad=True)
    g64 = rand(8, 64)
    cases.append(Case("layer_norm", lambda: tw.layer_norm(r, (64,), rw, rb),
                      lambda: F.layer_norm(r, (64,), rw, rb),
                      _backward_of(lambda: tw.layer_norm(rg, (64,), rwg, rbg), g64),
                      _backward_of(lambda: F.layer_norm(rg, (64,), rwg, rbg), g64)))
    cases.append(Case("softmax", lambda: tw.softmax(r, -1), lambda: torch.softmax(r, -1),
                      _backward_of(lambda: tw.softmax(rg, -1), g64),
                      _backward_of(lambda: torch.softmax(rg, -1), g64)))
    r2, r2g = rand(8, 64), rand(8, 64, grad=True)
    cases.append(Case("add", lambda: tw.add(r, r2), lambda: torch.add(r, r2),
                      _backward_of(lambda: tw.add(rg, r2g), g64),
                      _backward_of(lambda: torch.add(rg, r2g), g64)))
    p1, p2, p3 = (rand(8, 64, positive=True) for _ in range(3))
    p1g, p2g, p3g = (rand(8, 64, positive=True, grad=True) for _ in range(3))
    cases.append(Case("fused_mul_add_sqrt", lambda: tw.fused_mul_add_sqrt(p1, p2, p3),
                      lambda: torch.sqrt(p1 * p2 + p3),
                      _backward_of(lambda: tw.fused_mul_add_sqrt(p1g, p2g, p3g), g64),
                      _backward_of(lambda: torch.sqrt(p1g * p2g + p3g), g64)))

    lw, lb = rand(32), rand(32)
    lwg, lbg = rand(32, grad=True), rand(32, grad=True)
    cases.append(Case(
        "layer_norm_linear", lambda: tw.layer_norm_linear(x, lw, lb, w, b),
        lambda: F.linear(F.layer_norm(x, (32,), lw, lb), w, b),
        _backward_of(lambda: tw.layer_norm_linear(xg, lwg, lbg, wg, bg), g16),
        _backward_of(lambda: F.linear(F.layer_norm(xg, (32,), lwg, lbg), wg, bg), g16)))

    img, cw, cb = rand(1, 4, 8, 8), rand(8, 4, 3, 3), rand(8)
    imgg, cwg, cbg = rand(1, 4, 8, 8, grad=True), rand(8, 4, 3, 3, grad=True), rand(8, grad=True)
    gimg = rand(1, 8, 8, 8)
    cases.append(Case("conv2d", lambda: tw.conv2d(img, cw, cb, padding=1),
                      lambda: F.conv2d(img, cw, cb, padding=1),
                      _backward_of(lambda: tw.conv2d(imgg, cwg, cbg, padding=1), gimg),
                      _backward_of(lambda: F.conv2d(imgg, cwg, cbg, padding=1), gimg)))

    q, k, v = rand(1, 2, 16, 16), rand(1, 2, 16, 16), rand(1, 2, 16, 16)
    qg, kg, vg = (rand(1, 2, 16, 16, grad=True) for _ in range(3))
    gq = rand(1, 2, 16, 16)
    cases.append(Case("attention", lambda: tw.attention(q, k, v, causal=True),
                      lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                      _backward_of(lambda: tw.attention(qg, kg, vg, causal=True), gq),
                      _backward_of(lambda: F.scaled_dot_product_attention(qg, kg, vg,
                                                                           is_causal=True), gq)))

    # Families that may not be in this tree: looked up by name, skipped when absent.
    import importlib

    families = {"rms_norm": "rms_norm", "add_rms_norm": "rms_norm", "rope": "rope",
                "swiglu": "glu", "geglu": "glu", "cross_entropy": "cross_entropy",
                "linear_cross_entropy": "cross_entropy"}

    def public(name):
        fn = getattr(tw, name, None)
        if fn is None:  # a family not exported (yet) from the package: its own module
            try:
                fn = getattr(importlib.import_module(f"triton_workshop.ops.{families[name]}"),
                             name, None)
            except ImportError:
                fn = None
        if fn is None:
            notes.append(f"{name}: not in this tree, skipped")
        return fn

    rms = public("rms_norm")
    if rms is not None:
        cases.append(Case("rms_norm", lambda: rms(r, (64,), rw), lambda: F.rms_norm(r, (64,), rw),
                          _backward_of(lambda: rms(rg, (64,), rwg), g64),
                          _backward_of(lambda: F.rms_norm(rg, (64,), rwg), g64)))
    add_rms = public("add_rms_norm")
    if add_rms is not None:
        def torch_add_rms(a_, b_, w_):
            s = a_ + b_
            return F.rms_norm(s, (64,), w_), s
        cases.append(Case("add_rms_norm", lambda: add_rms(r, r2, (64,), rw),
                          lambda: torch_add_rms(r, r2, rw),
                          _sum_backward(lambda: add_rms(rg, r2g, (64,), rwg)[0]),
                          _sum_backward(lambda: torch_add_rms(rg, r2g, rwg)[0])))
    rope = public("rope")
    if rope is not None:  # transformers' convention: cos/sin (batch, tokens, head_dim)
        hq, hk = rand(1, 2, 16, 16), rand(1, 2, 16, 16)
        hqg, hkg = rand(1, 2, 16, 16, grad=True), rand(1, 2, 16, 16, grad=True)
        inv = 1.0 / (10000 ** (torch.arange(0, 16, 2, device=device, dtype=torch.float32) / 16))
        ang = torch.arange(16, device=device, dtype=torch.float32)[:, None] * inv
        ang = torch.cat((ang, ang), -1)[None]
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

        def torch_rope(q_, k_):
            c, s_ = cos.unsqueeze(1), sin.unsqueeze(1)

            def rotate_half(t):
                return torch.cat((-t[..., 8:], t[..., :8]), -1)
            return q_ * c + rotate_half(q_) * s_, k_ * c + rotate_half(k_) * s_

        def both_sum(fn):
            def run():
                a_, b_ = fn()
                (a_.sum() + b_.sum()).backward()
            return run
        cases.append(Case("rope", lambda: rope(hq, hk, cos, sin), lambda: torch_rope(hq, hk),
                          both_sum(lambda: rope(hqg, hkg, cos, sin)),
                          both_sum(lambda: torch_rope(hqg, hkg))))
    for name, act in (("swiglu", F.silu), ("geglu", lambda t: F.gelu(t, approximate="tanh"))):
        glu = public(name)
        if glu is not None:
            cases.append(Case(name, lambda glu=glu: glu(r, r2), lambda act=act: act(r) * r2,
                              _backward_of(lambda glu=glu: glu(rg, r2g), g64),
                              _backward_of(lambda act=act: act(rg) * r2g, g64)))
    ce = public("cross_entropy")
    if ce is not None:
        labels = torch.randint(0, 64, (8,), generator=gen).to(device)
        cases.append(Case("cross_entropy", lambda: ce(r, labels), lambda: F.cross_entropy(r, labels),
                          _sum_backward(lambda: ce(rg, labels)),
                          _sum_backward(lambda: F.cross_entropy(rg, labels))))
    lce = public("linear_cross_entropy")
    if lce is not None:
        labels16 = torch.randint(0, 16, (8,), generator=gen).to(device)
        cases.append(Case("linear_cross_entropy", lambda: lce(x, w, labels16),
                          lambda: F.cross_entropy(F.linear(x, w), labels16),
                          _sum_backward(lambda: lce(xg, wg, labels16)),
                          _sum_backward(lambda: F.cross_entropy(F.linear(xg, wg), labels16))))
    return cases, notes


def time_per_call(fn, calls: int, sync) -> float:
    """µs a call over one batch of ``calls`` calls, the device synchronised before and after."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def measure(ours, theirs, calls: int, batches: int, sync, stat=statistics.median
            ) -> tuple[float, float]:
    """µs a call of ``ours`` and ``theirs`` (``stat`` of the batches), batches alternating so
    that drift in the machine's speed hits both."""
    for _ in range(3):  # warm: first launches compile, caches fill
        ours(), theirs()
    a, b = [], []
    for _ in range(batches):
        a.append(time_per_call(ours, calls, sync))
        b.append(time_per_call(theirs, calls, sync))
    return stat(a), stat(b)


def under(context, fn):
    """``fn`` called inside ``context()``, entered at each call: torch's autocast keeps the casts
    of leaf tensors (weights) until its region ends, and a training step casts each weight once,
    so a region a call is what a step's call sees."""
    def call():
        with context():
            return fn()
    return call


def profile(case: Case, calls: int, sync) -> None:
    """cProfile's view (internal time) of ``case``'s calls, forward then forward + backward."""
    import cProfile
    import io
    import pstats

    for what, fn in (("forward", case.ours), ("fwd+bwd", case.ours_backward)):
        if fn is None:
            continue
        for _ in range(3):
            fn()
        sync()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        sync()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(f"=== {case.name} {what}: {calls} calls")
        print(out.getvalue())


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    import triton_workshop as tw
    from triton_workshop import runtime

    if args.stub:
        runtime.launch.stub_launches()
        torch.set_num_threads(1)  # torch's CPU ops on tiny tensors: no thread pool hand-offs
        device, sync = torch.device("cpu"), (lambda: None)
        where = "CPU, launches stubbed (the C launcher a no-op; torch computes on the CPU)"
    elif torch.cuda.is_available() and not runtime.INTERPRET:
        device, sync = torch.device("cuda"), torch.cuda.synchronize
        where = f"GPU {torch.cuda.get_device_name()}, real launches"
    else:
        print("no GPU here: kernels would run in Triton's interpreter; use --stub to time the "
              "host path with launches stubbed", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    cases, notes = build_cases(tw, torch, device, dtype)
    if args.ops:
        wanted = set(args.ops.split(","))
        cases = [c for c in cases if c.name in wanted]
    if args.profile:
        for case in cases:
            if case.name == args.profile:
                profile(case, args.calls, sync)
                return 0
        print(f"no op named {args.profile!r}", file=sys.stderr)
        return 2
    stat = statistics.median if args.stat == "median" else min
    if args.autocast:
        def context():
            return torch.autocast(device.type, dtype=torch.bfloat16)
        where += ", under torch.autocast(bfloat16), a region a call"

    if args.same_thread:
        # Process-wide for this script: the probe's own process, nothing else runs in it.
        torch.autograd.set_multithreading_enabled(False)
        where += ", backwards on the calling thread"

    print(f"host time per call, µs ({where}; {args.dtype}; {args.stat} of {args.batches} batches "
          f"of {args.calls} calls; budget torch + {args.budget:g} µs)")
    header = f"{'op':<22} {'pass':<10} {'ours':>8} {'torch':>8} {'diff':>8}  verdict"
    print(header)
    print("-" * len(header))
    rows = []
    for case in cases:
        passes = [("forward", case.ours, case.theirs)]
        if case.ours_backward is not None:
            passes.append(("fwd+bwd", case.ours_backward, case.theirs_backward))
        for what, ours, theirs in passes:
            try:
                if args.autocast:
                    ours, theirs = under(context, ours), under(context, theirs)
                ours_us, torch_us = measure(ours, theirs, args.calls, args.batches, sync, stat)
            except Exception as exc:  # noqa: BLE001 - one op failing must not hide the others
                message = " ".join(str(exc).split())[:160]
                print(f"{case.name:<22} {what:<10} failed: {type(exc).__name__}: {message}")
                rows.append(dict(op=case.name, pass_=what, ours_us="", torch_us="", diff_us="",
                                 verdict=f"error: {type(exc).__name__}"))
                continue
            diff = ours_us - torch_us
            verdict = "floor" if case.reference else "pass" if diff <= args.budget else "FAIL"
            print(f"{case.name:<22} {what:<10} {ours_us:8.1f} {torch_us:8.1f} {diff:+8.1f}  {verdict}")
            rows.append(dict(op=case.name, pass_=what, ours_us=f"{ours_us:.2f}",
                             torch_us=f"{torch_us:.2f}", diff_us=f"{diff:.2f}", verdict=verdict))
    for note in notes:
        print(f"note: {note}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["op", "pass", "ours_us", "torch_us", "diff_us", "verdict", "where",
                             "dtype"])
            for row in rows:
                writer.writerow([row["op"], row["pass_"], row["ours_us"], row["torch_us"],
                                 row["diff_us"], row["verdict"], where, args.dtype])
        print(f"wrote {args.csv}")
    failed = [r for r in rows if r["verdict"] not in ("pass", "floor")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
