"""The launch caches from several threads at once.

A training loop's backward runs on autograd's device thread while the main thread enqueues the
next forward, and data loaders or servers call ops from thread pools. So :class:`FastLaunch`'s
per-key cache, the prepared launches of plans and :func:`runtime.plan_cache` must hand every
thread a launch for its own arguments, never another thread's, and never a half-built entry.
The launches run against test_launch.py's recording driver (real Triton objects compiled for
sm_90, no GPU needed), so each recorded launch can be checked argument for argument.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

import triton_workshop  # noqa: F401  (chooses the mode first)
from triton_workshop import runtime
from triton_workshop.runtime import launch

from test_launch import _axpy, _tensors, sm90  # noqa: F401  (the fixture)

THREADS = 8
ROUNDS = 25


def _run_together(fn, n_threads=THREADS):
    """``fn(i)`` on ``n_threads`` threads released at the same moment; their results, in order."""
    barrier = threading.Barrier(n_threads)

    def start(i):
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n_threads) as pool:
        return list(pool.map(start, range(n_threads)))


def _address(arg):
    """A pointer argument as the C launcher reads it: Triton's own path passes the tensor, a
    direct launch its address (an int)."""
    return arg.data_ptr() if isinstance(arg, torch.Tensor) else arg


def test_fast_launch_from_many_threads(sm90):  # noqa: F811
    """Each thread launches with its own n (its own key) and its own tensors, many times: every
    recorded launch carries the launching thread's tensors and n, and each key went through
    Triton once."""
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    inputs = [_tensors(64 + i, seed=i) for i in range(THREADS)]

    def work(i):
        x, y, out = inputs[i]
        for _ in range(ROUNDS):
            fast[(4,)](x, y, out, 64 + i, BLOCK=32)
        return i

    _run_together(work)
    assert len(sm90.launches) == THREADS * ROUNDS
    for rec in sm90.launches:
        x, y, out, n = rec.kernel_args[:4]
        assert [_address(a) for a in (x, y, out)] == [t.data_ptr() for t in inputs[n - 64]]
    assert sorted(sm90.through_triton) == ["_axpy"] * THREADS  # one first launch per key
    assert len(fast.cache) == THREADS
    assert launch.FAST_LAUNCH  # no thread's race switched the fast path off


def test_prepared_launches_of_a_shared_plan_from_many_threads(sm90, monkeypatch):  # noqa: F811
    """One plan (one prepared dict) shared by every thread, as a cached plan is: each launch
    carries its own thread's tensors."""
    jit = sm90.jit(_axpy)
    monkeypatch.setattr(runtime.registry._direct, "on", True, raising=False)
    plan = runtime.LaunchPlan(jit, (4,), (100,), {"BLOCK": 32})
    inputs = [_tensors(128, seed=i) for i in range(THREADS)]

    def work(i):
        runtime.registry._direct.on = True  # thread-local: each thread launches directly
        for _ in range(ROUNDS):
            plan.launch(*inputs[i])
        return i

    _run_together(work)
    launches = sm90.launches
    assert len(launches) == THREADS * ROUNDS
    seen = {_address(rec.kernel_args[0]) for rec in launches}
    assert seen == {t[0].data_ptr() for t in inputs}
    for rec in launches:
        i = next(j for j, t in enumerate(inputs) if t[0].data_ptr() == _address(rec.kernel_args[0]))
        assert _address(rec.kernel_args[1]) == inputs[i][1].data_ptr()
        assert _address(rec.kernel_args[2]) == inputs[i][2].data_ptr()
    assert len(plan.prepared) == 1  # one device, one alignment: one prepared launch


def test_plan_cache_from_many_threads():
    """Threads asking for the same and for different plans at once each get the plan of their
    own arguments (a plan function may run twice for one key in a race; both results are
    equal, and the cache keeps one)."""
    calls = []

    @runtime.plan_cache()
    def plan(n, dtype):
        calls.append(n)
        return runtime.LaunchPlan("kernel", (runtime.cdiv(n, 64),), (n,), {"dtype": dtype})

    def work(i):
        got = []
        for r in range(ROUNDS):
            n = 1000 + (i + r) % 4
            p = plan(n, torch.float16)
            got.append((n, p))
        return got

    for got in _run_together(work):
        for n, p in got:
            assert p.scalars == (n,) and p.grid == (runtime.cdiv(n, 64),)
    assert set(calls) == {1000, 1001, 1002, 1003}
    assert {plan(n, torch.float16).scalars for n in range(1000, 1004)} == {(n,) for n in range(1000, 1004)}
