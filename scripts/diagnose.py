"""Where the time goes, for maintainers on the GPU machine (``workshop bench`` says *how fast*;
this says *why*).

    PYTHONPATH=src python3 scripts/diagnose.py [SECTION ...]      # sections: see SECTIONS below

For each case it prints

* the GPU time of one call (median of ``triton.testing.do_bench``) and the CPU time it takes to
  *enqueue* one call (a call whose CPU time is close to its GPU time is launch-bound: Python and
  launch overhead, not the kernel, set its speed);
* the kernels one call runs, from ``torch.profiler``, with their GPU time each;
* the config the autotuner chose, for autotuned kernels;
* for the row-wise backward kernels, the same call under variants of the launch heuristics
  (the module constants the launchers read at every launch), so that one run compares them.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

import triton_workshop as tw
from triton_workshop import runtime
from triton_workshop.ops import attention as attn_ops
from triton_workshop.ops import conv as conv_ops
from triton_workshop.ops import layer_norm as ln_ops
from triton_workshop.ops import layer_norm_linear as lnl_ops
from triton_workshop.ops import matmul as mm_ops
from triton_workshop.ops import softmax as sm_ops
from triton_workshop.ops.matmul import grouped_tile

DEV = "cuda"


def gpu_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def cpu_us(fn, n: int = 30) -> float:
    """CPU time to enqueue one call (the GPU is not waited for inside the loop)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def kernels(fn, iters: int = 5) -> list[tuple[str, float, float]]:
    """(kernel name, launches per call, GPU µs per call) of the kernels ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total = defaultdict(float)
    count = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            count[e.name] += 1
    rows = [(name[:90], count[name] / iters, total[name] / iters) for name in total]
    return sorted(rows, key=lambda r: -r[2])


def report(label: str, fn, *, work: float | None = None, unit: str = "GB/s", peers=None,
           profile: bool = True) -> float:
    """Time ``fn`` (and ``peers``: name -> fn) and print one block; returns ``fn``'s ms."""
    scale = 1e6 if unit == "GB/s" else 1e9  # work per ms -> GB/s or TFLOP/s
    ms = gpu_ms(fn)
    rate = "" if work is None else f"  {work / ms / scale:.1f} {unit}"
    line = f"{label}: {ms * 1e3:8.1f} µs GPU, {cpu_us(fn):7.1f} µs CPU enqueue{rate}"
    for name, peer in (peers or {}).items():
        pms = gpu_ms(peer)
        prate = "" if work is None else f" {work / pms / scale:.1f}"
        line += f" | {name} {pms * 1e3:.1f} µs{prate} ({pms / ms:.2f}×)"
    print(line, flush=True)
    if profile:
        for name, per_call, us in kernels(fn):
            print(f"      {us:9.1f} µs  ×{per_call:<4g} {name}")
    return ms


def best_configs(*kernels_) -> None:
    for k in kernels_:
        cache = getattr(k, "cache", {})
        for key, cfg in list(cache.items())[-3:]:
            name = getattr(getattr(k, "fn", None), "__name__", str(k))
            print(f"      best config {name}: {cfg}  (key {key})")


@contextlib.contextmanager
def knobs(module, **values):
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


# --------------------------------------------------------------------------------------------
ROW_SIZES = [(65536, 1024), (16384, 4096), (8192, 8192), (2048, 32768)]


def section_softmax():
    print("== softmax (fp16): forward, backward, fwd+bwd through autograd")
    for m, n in ROW_SIZES:
        x = torch.randn(m, n, device=DEV, dtype=torch.float16, requires_grad=True)
        dy = torch.randn_like(x)
        y = tw.softmax(x.detach())
        nb = m * n * 2
        report(f"softmax fwd {m}x{n}", lambda: sm_ops.softmax_forward(x.detach(), 1), work=2 * nb,
               peers={"torch": lambda: torch.softmax(x.detach(), -1)}, profile=False)
        variants = {"default": {}, "no reload": {"BACKWARD_RELOAD_MIN_ELEMS": 1 << 40},
                    "tile 2048": {"TILE_ELEMS": 2048}, "tile 8192": {"TILE_ELEMS": 8192},
                    "tile 16384": {"TILE_ELEMS": 16384}}
        for name, vals in variants.items():
            with knobs(sm_ops, **vals):
                report(f"softmax bwd {m}x{n} [{name}]", lambda: sm_ops.softmax_backward(dy, y, 1),
                       work=3 * nb, profile=False,
                       peers={"torch": lambda: torch._softmax_backward_data(dy, y, 1, y.dtype)}
                       if name == "default" else None)
        report(f"softmax fwd+bwd {m}x{n}", lambda: torch.autograd.grad(tw.softmax(x), [x], dy),
               work=5 * nb, peers={"torch": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy)})


def section_softmax_long():
    print("== softmax (fp16) long rows: single block up to SINGLE_BLOCK_MAX_COLS, else multi-block")
    for m, n in ((2048, 32768), (1024, 65536)):
        x = torch.randn(m, n, device=DEV, dtype=torch.float16, requires_grad=True)
        dy = torch.randn_like(x)
        nb = m * n * 2
        ref = torch.autograd.grad(torch.softmax(x.float(), -1), [x], dy.float())[0]
        for limit in (16384, 32768, 65536):
            with knobs(sm_ops, SINGLE_BLOCK_MAX_COLS=limit, BACKWARD_SINGLE_BLOCK_MAX_COLS=limit):
                err = (torch.autograd.grad(tw.softmax(x), [x], dy)[0].float() - ref).abs().max().item()
                report(f"softmax fwd {m}x{n} [single<={limit}]",
                       lambda: sm_ops.softmax_forward(x.detach(), 1), work=2 * nb, profile=False)
                report(f"softmax fwd+bwd {m}x{n} [single<={limit}] err {err:.1e}",
                       lambda: torch.autograd.grad(tw.softmax(x), [x], dy), work=5 * nb,
                       profile=limit == 16384,
                       peers={"torch": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy)}
                       if limit == 16384 else None)


def layer_norm_case(m: int, n: int):
    """fp16 ``x`` (m, n), weight and bias (all requiring grad), a gradient ``dy``, and the
    forward's saved ``mean`` and ``rstd``."""
    x = torch.randn(m, n, device=DEV, dtype=torch.float16, requires_grad=True)
    w = torch.randn(n, device=DEV, dtype=torch.float16, requires_grad=True)
    b = torch.randn(n, device=DEV, dtype=torch.float16, requires_grad=True)
    _, mean, rstd = ln_ops.layer_norm_forward(x.detach(), w.detach(), b.detach(), 1, 1e-5)
    return x, w, b, torch.randn_like(x), mean, rstd


def section_layer_norm():
    print("== layer_norm (fp16, weight and bias): forward, backward variants, fwd+bwd")
    for m, n in ROW_SIZES[:3] + [(4096, 16384)]:
        x, w, b, dy, mean, rstd = layer_norm_case(m, n)
        nb = m * n * 2
        report(f"ln fwd {m}x{n}", lambda: ln_ops.layer_norm_forward(x.detach(), w, b, 1, 1e-5),
               work=2 * nb, profile=False,
               peers={"torch": lambda: F.layer_norm(x.detach(), (n,), w.detach(), b.detach())})
        eager_bwd = lambda: torch.ops.aten.native_layer_norm_backward(  # noqa: E731
            dy, x, (n,), mean.view(m, 1), rstd.view(m, 1), w, b, [True, True, True])
        variants = {"default": {}, "stages 1": {"BACKWARD_STAGES": 1},
                    "stages 2": {"BACKWARD_STAGES": 2},
                    "1/SM": {"BACKWARD_PROGRAMS_PER_SM": 1}, "4/SM": {"BACKWARD_PROGRAMS_PER_SM": 4},
                    "8/SM": {"BACKWARD_PROGRAMS_PER_SM": 8},
                    "4/SM stages 1": {"BACKWARD_PROGRAMS_PER_SM": 4, "BACKWARD_STAGES": 1},
                    "tile 2048": {"TILE_ELEMS": 2048}, "tile 8192": {"TILE_ELEMS": 8192},
                    "wide 16 warps": {"BACKWARD_WIDE_NUM_WARPS": 16},
                    "not wide": {"BACKWARD_WIDE_TILE_ELEMS": 1 << 40}}
        for name, vals in variants.items():
            with knobs(ln_ops, **vals):
                report(f"ln bwd {m}x{n} [{name}]",
                       lambda: ln_ops.layer_norm_backward(dy, x, w, mean, rstd, 1, True, True, True),
                       work=3 * nb, profile=name == "default",
                       peers={"torch": eager_bwd} if name == "default" else None)
        report(f"ln fwd+bwd {m}x{n}",
               lambda: torch.autograd.grad(tw.layer_norm(x, (n,), w, b), [x, w, b], dy),
               work=5 * nb,
               peers={"torch": lambda: torch.autograd.grad(F.layer_norm(x, (n,), w, b), [x, w, b], dy)})


def section_ln_long():
    """layer_norm's backward on rows longer than the fused kernel takes (fp16 4096x16384): dx in
    one single-block pass (default) or two chunked passes, each kernel's time; fwd+bwd against
    eager and torch.compile."""
    print("== ln_long: layer_norm fp16 backward, rows of 12288 and 16384 (8192: the fused kernel)")
    for m, n in ((4096, 16384), (4096, 12288), (8192, 8192)):
        x, w, b, dy, mean, rstd = layer_norm_case(m, n)
        nb = m * n * 2
        for name, vals in {"dx one pass": {}, "dx two passes": {"BACKWARD_DX_SINGLE_BLOCK_MAX_COLS": 8192},
                           "dwdb 1 stage": {"DWDB_STAGES": 1}, "dwdb 2 stages": {"DWDB_STAGES": 2},
                           "dwdb 4 stages": {"DWDB_STAGES": 4}}.items():
            with knobs(ln_ops, **vals):
                report(f"ln bwd {m}x{n} [{name}]",
                       lambda: ln_ops.layer_norm_backward(dy, x, w, mean, rstd, 1, True, True, True),
                       work=3 * nb)
        compiled = torch.compile(lambda x, w, b: F.layer_norm(x, (n,), w, b))
        for name, vals in {"default": {}, "chunked": {"SINGLE_BLOCK_MAX_COLS": n // 2},
                           "chunked 8192": {"SINGLE_BLOCK_MAX_COLS": n // 2, "CHUNK_COLS": 8192}}.items():
            with knobs(ln_ops, **vals):
                report(f"ln fwd {m}x{n} [{name}]",
                       lambda: tw.layer_norm(x.detach(), (n,), w.detach(), b.detach()), work=2 * nb,
                       peers={"compile": lambda: compiled(x.detach(), w.detach(), b.detach())})
        report(f"ln fwd+bwd {m}x{n}",
               lambda: torch.autograd.grad(tw.layer_norm(x, (n,), w, b), [x, w, b], dy),
               work=5 * nb,
               peers={"torch": lambda: torch.autograd.grad(F.layer_norm(x, (n,), w, b), [x, w, b], dy),
                      "compile": lambda: torch.autograd.grad(compiled(x, w, b), [x, w, b], dy)})


def section_conv():
    print("== conv2d fp16 32x64x56x56, 64 filters 3x3 pad 1")
    x = torch.randn(32, 64, 56, 56, device=DEV, dtype=torch.float16)
    w = torch.randn(64, 64, 3, 3, device=DEV, dtype=torch.float16) / 24
    flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
    xcl = x.contiguous(memory_format=torch.channels_last)
    wcl = w.contiguous(memory_format=torch.channels_last)
    for label, xx, ww in (("NCHW", x, w), ("channels_last", xcl, wcl)):
        report(f"conv {label}", lambda: tw.conv2d(xx, ww, padding=1), work=flops, unit="TFLOP/s",
               peers={"cuDNN": lambda: F.conv2d(xx, ww, padding=1)})
    best_configs(conv_ops.conv2d_implicit_gemm_kernel)


def section_matmul():
    print("== matmul fp16: ragged 5012x2100x7777, 4096^3; TF32 4096^3; layer_norm+linear")
    for m, n, k in ((5012, 2100, 7777), (4096, 4096, 4096)):
        a = torch.randn(m, k, device=DEV, dtype=torch.float16)
        b = torch.randn(k, n, device=DEV, dtype=torch.float16)
        report(f"matmul {m}x{n}x{k}", lambda: tw.matmul(a, b), work=2 * m * n * k, unit="TFLOP/s",
               peers={"cuBLAS": lambda: a @ b})
    best_configs(mm_ops.matmul_kernel)
    a = torch.randn(4096, 4096, device=DEV)
    b = torch.randn(4096, 4096, device=DEV)
    torch.backends.cuda.matmul.allow_tf32 = True
    report("matmul TF32 4096^3", lambda: tw.matmul(a, b), work=2 * 4096**3, unit="TFLOP/s",
           peers={"cuBLAS": lambda: a @ b})
    torch.backends.cuda.matmul.allow_tf32 = False
    best_configs(mm_ops.matmul_kernel)
    for m in (4096, 8192):
        x = torch.randn(m, 4096, device=DEV, dtype=torch.float16)
        lw = 1 + 0.1 * torch.randn(4096, device=DEV, dtype=torch.float16)
        lb = 0.1 * torch.randn(4096, device=DEV, dtype=torch.float16)
        w = torch.randn(4096, 4096, device=DEV, dtype=torch.float16) / 64
        bias = torch.randn(4096, device=DEV, dtype=torch.float16)
        report(f"layer_norm_linear {m}x4096x4096",
               lambda: tw.layer_norm_linear(x, lw, lb, w, bias), work=2 * m * 4096 * 4096,
               unit="TFLOP/s",
               peers={"eager": lambda: F.linear(F.layer_norm(x, (4096,), lw, lb), w, bias),
                      "linear alone": lambda: F.linear(x, w, bias)})
    best_configs(mm_ops.matmul_kernel)  # layer_norm_linear tunes under LN_EPILOGUE=True


def section_attention():
    print("== attention fp16 B=4 H=32 N=4096, causal fwd+bwd")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for d in (128, 64):
        q, k, v = (torch.randn(4, 32, 4096, d, device=DEV, dtype=torch.float16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn_like(q)
        flops = 4 * 4 * 32 * 4096 * 4096 * d * 0.5 * 3.5  # causal: half; fwd+bwd: 2.5x more

        def fa2():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                           [q, k, v], do)

        report(f"attention fwd+bwd causal D={d}",
               lambda: torch.autograd.grad(tw.attention(q, k, v, causal=True), [q, k, v], do),
               work=flops, unit="TFLOP/s", peers={"SDPA flash": fa2})
        best_configs(attn_ops.attn_fwd_kernel, attn_ops.attn_bwd_dkdv_kernel,
                     attn_ops.attn_bwd_dq_kernel)


def section_filter2d():
    print("== filter2d fp32 3x8192x8192 (per-channel KxK, 'same'): knob sweep; copy = ceiling")
    from triton_workshop.ops import image as image_ops

    img = torch.rand(3, 8192, 8192, device=DEV)
    nb = 2 * img.numel() * img.element_size()
    dst = torch.empty_like(img)
    report("copy", lambda: dst.copy_(img), work=nb, profile=False)
    sweeps = {
        3: [{}] + [{"FILTER_NUM_WARPS_BY_K": {3: w}} for w in (2, 4, 16)] + [
            {"FILTER_MAX_ROWS": r} for r in (32, 128, 512)] + [
            {"FILTER_VECTORS_PER_THREAD_BY_K": {3: 2}, "FILTER_NUM_WARPS_BY_K": {3: 4}}],
        5: [{}] + [{"FILTER_NUM_WARPS": w} for w in (1, 4)] + [
            {"FILTER_VECTORS_PER_THREAD_BY_K": {5: v}} for v in (2, 8)] + [
            {"FILTER_MAX_ROWS": 128}, {"FILTER_MAX_ROWS": 32}],
    }
    for k in (3, 5):
        kernel = torch.randn(k, k, device=DEV)
        ref = F.conv2d(img[None], kernel.expand(3, 1, k, k), padding=k // 2, groups=3)[0]
        for vals in sweeps[k]:
            with knobs(image_ops, **vals):
                out = tw.filter2d(img, kernel)
                err = (out - ref).abs().max().item()
                name = ", ".join(f"{key[7:].lower()}={v}" for key, v in vals.items()) or "default"
                report(f"filter2d {k}x{k} [{name}] err {err:.1e}", lambda: tw.filter2d(img, kernel),
                       work=nb, profile=False)


def best_host_us(fn, rounds: int = 5, calls: int = 300) -> float:
    """Host µs per call of ``fn``: the best of ``rounds`` rounds of ``calls`` calls, each round
    started on an idle GPU."""
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def through_autograd(backward):
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

def section_overhead():
    """CPU cost of one eager call, step by step, on shapes so small that the GPU never limits:
    what the host charges for an allocation, a launch, autograd, and each op end to end."""
    print("== CPU µs per call on tiny shapes (best of 5 rounds of 300 calls; the GPU is idle)")
    x = torch.randn(64, 1024, device=DEV, dtype=torch.float16, requires_grad=True)
    xd = x.detach()
    w = torch.randn(1024, device=DEV, dtype=torch.float16, requires_grad=True)
    b = torch.randn(1024, device=DEV, dtype=torch.float16, requires_grad=True)
    dy = torch.randn_like(xd)
    y = tw.softmax(xd)


    Null = through_autograd(lambda g: g)
    AllocInBackward = through_autograd(torch.empty_like)
    LaunchInBackward = through_autograd(lambda g: sm_ops.softmax_backward(g, y, 1))

    wd, bd = w.detach(), b.detach()
    _, mean, rstd = ln_ops.layer_norm_forward(xd, wd, bd, 1, 1e-5)
    # Outside a launcher, wrap_triton is torch's traceable wrapper: what a launch costs when
    # torch.compile is not tracing but the fast path is not taken either.
    fwd_launch = runtime.wrap_triton(sm_ops.softmax_fwd_kernel)
    plan = sm_ops._plan(xd.shape, 1, (xd.stride(), y.stride()), xd.dtype, False, sm_ops._knobs())
    _, grid, scalars, consts = plan
    cases = {
        "torch.cuda.current_device()": torch.cuda.current_device,
        "x.data_ptr()": xd.data_ptr,
        "torch.empty_like(x)": lambda: torch.empty_like(xd),
        "x.new_empty(shape)": lambda: xd.new_empty(xd.shape),
        "Null fwd+bwd (autograd.grad)": lambda: torch.autograd.grad(Null.apply(x), [x], dy),
        "Null fwd only, grad mode": lambda: Null.apply(x),
        "AllocInBackward fwd+bwd": lambda: torch.autograd.grad(AllocInBackward.apply(x), [x], dy),
        "LaunchInBackward fwd+bwd": lambda: torch.autograd.grad(LaunchInBackward.apply(x), [x], dy),
        "softmax launch via torch.library.wrap_triton": lambda: fwd_launch[grid](xd, y, *scalars, **consts),
        "softmax_forward launcher": lambda: sm_ops.softmax_forward(xd, 1),
        "softmax_backward launcher": lambda: sm_ops.softmax_backward(dy, y, 1),
        "tw.softmax forward only, grad mode": lambda: tw.softmax(x),
        "tw.softmax no grad": lambda: tw.softmax(xd),
        "torch.softmax no grad": lambda: torch.softmax(xd, -1),
        "tw.softmax fwd+bwd": lambda: torch.autograd.grad(tw.softmax(x), [x], dy),
        "torch.softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy),
        "tw.layer_norm no grad": lambda: tw.layer_norm(xd, (1024,), wd, bd),
        "F.layer_norm no grad": lambda: F.layer_norm(xd, (1024,), wd, bd),
        "layer_norm_forward launcher": lambda: ln_ops.layer_norm_forward(xd, wd, bd, 1, 1e-5),
        "layer_norm_backward launcher": lambda: ln_ops.layer_norm_backward(dy, xd, wd, mean, rstd, 1, True, True, True),
        "tw.layer_norm forward only, grad mode": lambda: tw.layer_norm(x, (1024,), w, b),
        "tw.layer_norm fwd+bwd": lambda: torch.autograd.grad(tw.layer_norm(x, (1024,), w, b), [x, w, b], dy),
        "F.layer_norm fwd+bwd": lambda: torch.autograd.grad(F.layer_norm(x, (1024,), w, b), [x, w, b], dy),
    }
    for name, fn in cases.items():
        for _ in range(50):
            fn()
        print(f"   {best_host_us(fn):8.1f} µs  {name}")


def cpu_profile(fn, n: int = 200, top: int = 14) -> None:
    """Print where the CPU time of ``n`` calls of ``fn`` goes (cProfile, µs per call, by own
    time)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (file, line, func), (cc, nc, tt, ct, _) in rows:
        where = f"{file.split('site-packages/')[-1].split('src/')[-1]}:{line}({func})"
        print(f"      {tt / n * 1e6:7.1f} own {ct / n * 1e6:7.1f} cum  ×{nc / n:<4g} {where[:110]}")


def section_cpu():
    """Where the CPU time of one eager call goes (cProfile, per call), for calls whose CPU
    enqueue time rivals their GPU time."""
    print("== CPU profile of eager calls (µs per call, by own time)")
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.float16, requires_grad=True)
    w = torch.randn(8192, device=DEV, dtype=torch.float16, requires_grad=True)
    b = torch.randn(8192, device=DEV, dtype=torch.float16, requires_grad=True)
    dy = torch.randn_like(x)
    xc = torch.randn(32, 64, 56, 56, device=DEV, dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    xn = xc.contiguous()
    wc = torch.randn(64, 64, 3, 3, device=DEV, dtype=torch.float16)
    a = torch.randn(1024, 1024, device=DEV, dtype=torch.float16)
    cases = {
        "softmax fwd+bwd": lambda: torch.autograd.grad(tw.softmax(x), [x], dy),
        "torch softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy),
        "layer_norm fwd+bwd": lambda: torch.autograd.grad(tw.layer_norm(x, (8192,), w, b), [x, w, b], dy),
        "torch layer_norm fwd+bwd": lambda: torch.autograd.grad(F.layer_norm(x, (8192,), w, b), [x, w, b], dy),
        "conv2d channels_last": lambda: tw.conv2d(xc, wc, padding=1),
        "conv2d NCHW": lambda: tw.conv2d(xn, wc, padding=1),
        "matmul 1024^3": lambda: tw.matmul(a, a),
        "add 1024^2": lambda: tw.add(a, a),
    }
    n = 200
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        wall = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        print(f"{name}: {wall:.1f} µs wall per call (unprofiled, GPU may be the limit)")
        cpu_profile(fn, n)
    cached = {type(f.kernel).__name__ + ":" + getattr(getattr(f.kernel, "fn", f.kernel), "__name__", "?"):
              len(f.cache) for f in runtime._FAST_LAUNCHERS.values()}
    print(f"   fast launch: {'on' if runtime.FAST_LAUNCH else 'OFF'}; launch keys cached: {cached}")


def section_waits():
    """Does an eager call make the CPU wait for the GPU? A long GPU sleep is queued first, then
    the call runs: a call that only enqueues returns in microseconds, one that synchronises
    (directly, or through the allocator or autograd) returns only when the sleep is over. Then
    the CPU enqueue time per call across sizes, and a profile of the CUDA runtime calls."""
    from torch.profiler import ProfilerActivity, profile

    print("== waits: CPU ms of calls queued behind a 30 ms GPU sleep (>= 30 means it waited)")
    m, n = 8192, 8192
    x = torch.randn(m, n, device=DEV, dtype=torch.float16, requires_grad=True)
    w = torch.randn(n, device=DEV, dtype=torch.float16, requires_grad=True)
    b = torch.randn(n, device=DEV, dtype=torch.float16, requires_grad=True)
    xd = x.detach()
    dy = torch.randn_like(xd)
    y = tw.softmax(xd)

    Passthrough = through_autograd(lambda g: g)
    AllocInBackward = through_autograd(torch.empty_like)
    LaunchInBackward = through_autograd(lambda g: sm_ops.softmax_backward(g, y, 1))
    compiled = torch.compile(lambda t: torch.softmax(t, -1))
    compiled_ln = torch.compile(lambda t, w_, b_: F.layer_norm(t, (n,), w_, b_))
    cases = {
        "torch.empty_like(x) 128 MiB": lambda: torch.empty_like(xd),
        "Null fwd+bwd": lambda: torch.autograd.grad(Passthrough.apply(x), [x], dy),
        "AllocInBackward fwd+bwd": lambda: torch.autograd.grad(AllocInBackward.apply(x), [x], dy),
        "LaunchInBackward fwd+bwd": lambda: torch.autograd.grad(LaunchInBackward.apply(x), [x], dy),
        "softmax_forward launcher": lambda: sm_ops.softmax_forward(xd, 1),
        "softmax_backward launcher": lambda: sm_ops.softmax_backward(dy, y, 1),
        "tw.softmax fwd, grad mode": lambda: tw.softmax(x),
        "tw.softmax fwd+bwd": lambda: torch.autograd.grad(tw.softmax(x), [x], dy),
        "torch.softmax fwd+bwd": lambda: torch.autograd.grad(torch.softmax(x, -1), [x], dy),
        "compiled softmax fwd+bwd": lambda: torch.autograd.grad(compiled(x), [x], dy),
        "tw.layer_norm fwd+bwd": lambda: torch.autograd.grad(tw.layer_norm(x, (n,), w, b), [x, w, b], dy),
        "F.layer_norm fwd+bwd": lambda: torch.autograd.grad(F.layer_norm(x, (n,), w, b), [x, w, b], dy),
        "compiled layer_norm fwd+bwd": lambda: torch.autograd.grad(compiled_ln(x, w, b), [x, w, b], dy),
    }
    sleep_cycles = int(30e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    for name, fn in cases.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        torch.cuda._sleep(sleep_cycles)
        for _ in range(4):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        flag = "  <-- WAITED" if max(times) > 20 else ""
        print(f"   {name:32s} " + " ".join(f"{t:7.2f}" for t in times) + " ms" + flag, flush=True)

    print("== CPU enqueue µs per fwd+bwd call (30 calls, no sync) by size, and GPU µs (do_bench)")
    for rows, cols in ((64, 1024), (1024, 1024), (8192, 1024), (65536, 1024), (8192, 8192)):
        xs = torch.randn(rows, cols, device=DEV, dtype=torch.float16, requires_grad=True)
        dys = torch.randn_like(xs)
        for name, fn in {"tw": lambda: torch.autograd.grad(tw.softmax(xs), [xs], dys),
                         "torch": lambda: torch.autograd.grad(torch.softmax(xs, -1), [xs], dys),
                         "Null": lambda: torch.autograd.grad(Passthrough.apply(xs), [xs], dys)}.items():
            print(f"   softmax {rows}x{cols} {name:6s}: {cpu_us(fn):7.1f} µs CPU, "
                  f"{gpu_ms(fn) * 1e3:7.1f} µs GPU", flush=True)

    print("== CUDA runtime calls in 20 tw.softmax fwd+bwd calls at 8192x8192 (CPU µs per call)")
    fn = cases["tw.softmax fwd+bwd"]
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.key.startswith("cu") or "ynchron" in e.key
            or "autograd" in e.key.lower()]
    for e in sorted(rows, key=lambda e: -e.cpu_time_total)[:15]:
        print(f"      {e.cpu_time_total / 20:9.1f} µs  ×{e.count / 20:<5g} {e.key[:90]}")
    gpu = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    gaps = [(b[0] - a[1], a[2][:40], b[2][:40]) for a, b in zip(gpu, gpu[1:])]
    busy = sum(e - s for s, e, _ in gpu)
    span = gpu[-1][1] - gpu[0][0] if gpu else 0
    print(f"      GPU busy {busy / 20:.1f} µs per call of a {span / 20:.1f} µs span; largest gaps:")
    for gap, a, b_ in sorted(gaps, reverse=True)[:4]:
        print(f"      {gap:9.1f} µs between {a} and {b_}")


def section_thread():
    """The same host code on the main thread and on autograd's device thread (where CUDA
    backwards run), with the GPU idle and with the GPU busy (a long sleep queued ahead): µs per
    step, measured inside the thread that runs it, and the hand-off cost of autograd.grad."""
    print("== thread: µs per step on the main thread vs autograd's device thread, GPU idle/busy")
    small = torch.randn(64, 1024, device=DEV, dtype=torch.float16)
    big = torch.randn(8192, 8192, device=DEV, dtype=torch.float16)
    y_small, y_big = tw.softmax(small), tw.softmax(big)
    sm_ops.softmax_backward(small, y_small, 1)  # warm-up: compiled, fast-launch entry made

    def python_loop():
        total = 0
        for i in range(200):
            total += i
        return total

    steps = {
        "python loop (200 adds)": python_loop,
        "torch.cuda.current_device()": torch.cuda.current_device,
        "torch.empty_like(64x1024)": lambda: torch.empty_like(small),
        "torch.empty_like(8192x8192)": lambda: torch.empty_like(big),
        "torch.neg(64x1024) (one aten launch)": lambda: torch.neg(small),
        "softmax_backward launcher 64x1024": lambda: sm_ops.softmax_backward(small, y_small, 1),
        "softmax_backward launcher 8192x8192": lambda: sm_ops.softmax_backward(big, y_big, 1),
    }
    reps = 50
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

    RunInBackward = through_autograd(time_steps)

    leaf = torch.randn(4, device=DEV, requires_grad=True)
    g4 = torch.ones(4, device=DEV)
    sleep_cycles = int(40e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    print(f"   {'step':40s} {'main idle':>10s} {'main busy':>10s} {'dev idle':>10s} {'dev busy':>10s}")
    for name, step in steps.items():
        row = []
        for thread in ("main", "device"):
            for busy in (False, True):
                best = float("inf")
                for _ in range(3):
                    torch.cuda.synchronize()
                    if busy:
                        torch.cuda._sleep(sleep_cycles)
                    if thread == "main":
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            step()
                        us = (time.perf_counter() - t0) / reps * 1e6
                    else:
                        probe["step"] = step
                        torch.autograd.grad(RunInBackward.apply(leaf), [leaf], g4)
                        us = probe["t"]
                    best = min(best, us)
                torch.cuda.synchronize()
                row.append(best)
        print(f"   {name:40s} " + " ".join(f"{v:10.1f}" for v in row), flush=True)
    # Hand-off: from calling autograd.grad to the backward's first line, and back.
    probe["step"] = lambda: None
    for busy in (False, True):
        into, back = [], []
        for _ in range(20):
            torch.cuda.synchronize()
            if busy:
                torch.cuda._sleep(sleep_cycles // 10)
            out = RunInBackward.apply(leaf)
            t0 = time.perf_counter()
            torch.autograd.grad(out, [leaf], g4)
            t1 = time.perf_counter()
            into.append((probe["enter"] - t0) * 1e6)
            back.append((t1 - probe["leave"]) * 1e6)
        into.sort(), back.sort()
        print(f"   autograd.grad hand-off, GPU {'busy' if busy else 'idle'}: into backward "
              f"{into[10]:.1f} µs, back to caller {back[10]:.1f} µs (medians of 20)")


def section_launch():
    """What one launch costs on the host, layer by layer (softmax backward, 64x1024, GPU idle):
    Triton's C launcher alone, FastLaunch, the launcher's plan and guard, the registered op."""
    import cProfile
    import pstats



    print("== launch: host µs per softmax backward launch, layer by layer (best of 5 x 300)")
    x = torch.randn(64, 1024, device=DEV, dtype=torch.float16)
    y = tw.softmax(x)
    dy = torch.randn_like(x)
    dx = torch.empty_like(x)
    sm_ops.softmax_backward(dy, y, 1)
    plan = sm_ops._plan(y.shape, 1, (y.stride(), dy.stride(), dx.stride()), y.dtype, True,
                        sm_ops._knobs())
    _, grid, scalars, consts = plan
    fast = runtime._fast_launcher(sm_ops.softmax_bwd_kernel)
    fast[grid](y, dy, dx, *scalars, **consts)
    compiled, grid3, tail, run = next(iter(fast.cache.values()))
    dev = torch.cuda.current_device()
    stream = torch._C._cuda_getCurrentRawStream(dev)
    args = (y, dy, dx, *scalars, *tail)

    def c_launcher():
        run(*grid3, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)

    ptrs = (y.data_ptr(), dy.data_ptr(), dx.data_ptr())
    int_args = (*ptrs, *scalars, *tail)

    def c_launcher_ints():
        run(*grid3, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *int_args)

    cases = {
        "torch.neg(x) (aten launch)": lambda: torch.neg(x),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "C launcher, tensors": c_launcher,
        "C launcher, int pointers": c_launcher_ints,
        "FastLaunch kernel[grid](...)": lambda: fast[grid](y, dy, dx, *scalars, **consts),
        "sm_ops._launch (plan, guard, fast)": lambda: sm_ops._launch(
            sm_ops.softmax_bwd_kernel, sm_ops.softmax_bwd_online_kernel, 1, y, dy, dx, backward=True),
        "softmax_backward (registered op)": lambda: sm_ops.softmax_backward(dy, y, 1),
        "tw.add(x, x)": lambda: tw.add(x, x),
        "torch.add(x, x)": lambda: torch.add(x, x),
    }
    for name, fn in cases.items():
        try:
            for _ in range(50):
                fn()
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say what failed and go on
            print(f"   failed: {name}: {type(exc).__name__}: {exc}")
            continue
        print(f"   {best_host_us(fn):8.1f} µs  {name}", flush=True)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    n = 2000
    prof.enable()
    for _ in range(n):
        sm_ops.softmax_backward(dy, y, 1)
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:16]
    print("   cProfile of softmax_backward (µs per call, own time):")
    for (file, line, func), (cc, nc, tt, ct, _) in rows:
        where = f"{file.split('site-packages/')[-1].split('src/')[-1]}:{line}({func})"
        print(f"      {tt / n * 1e6:7.1f} own {ct / n * 1e6:7.1f} cum  ×{nc / n:<4g} {where[:100]}")


def section_lnl():
    """Where layer_norm_linear's time goes at fp16 8192x4096x4096: B's layout (W' is K-major),
    the LayerNorm epilogue, the matmul config, and the two small kernels before it."""
    print("== lnl: layer_norm_linear fp16 8192x4096x4096, piece by piece")
    M, N, K = 8192, 4096, 4096
    flops = 2 * M * N * K
    x = torch.randn(M, K, device=DEV, dtype=torch.float16)
    lw = 1 + 0.1 * torch.randn(K, device=DEV, dtype=torch.float16)
    lb = 0.1 * torch.randn(K, device=DEV, dtype=torch.float16)
    w = torch.randn(N, K, device=DEV, dtype=torch.float16) / 64
    bias = torch.randn(N, device=DEV, dtype=torch.float16)
    wc = w.t().contiguous()  # (K, N), N contiguous
    mean = torch.empty(M, device=DEV)
    rstd = torch.empty(M, device=DEV)
    # The private launchers, called directly (outside their registered op): launch_directly, or
    # each launch goes through torch's traceable wrapper (milliseconds a call).
    row_stats = runtime.launch_directly(lnl_ops._row_stats)
    fold_weights = runtime.launch_directly(lnl_ops._fold_weights)
    launch_matmul = runtime.launch_directly(mm_ops._launch_matmul)
    row_stats(x, mean, rstd, 1e-5)
    w_prime, sums = fold_weights(w, lw, lb, bias)
    out = torch.empty(M, N, device=DEV, dtype=torch.float16)
    report("cuBLAS F.linear(x, w, bias)", lambda: F.linear(x, w, bias), work=flops, unit="TFLOP/s",
           profile=False)
    report("cuBLAS x @ wc", lambda: x @ wc, work=flops, unit="TFLOP/s", profile=False)
    report("tw.matmul(x, wc) (B N-major)", lambda: tw.matmul(x, wc), work=flops, unit="TFLOP/s",
           profile=False)
    report("tw.matmul(x, w.t()) (B K-major)", lambda: tw.matmul(x, w.t()), work=flops,
           unit="TFLOP/s", profile=False)
    report("tw.matmul(x, w.t(), bias)", lambda: tw.matmul(x, w.t(), bias=bias), work=flops,
           unit="TFLOP/s", profile=False)

    def ln_gemm():
        return launch_matmul(x, w_prime.t(), out, bias=sums[N:], ln_epilogue=(mean, rstd, sums))

    report("matmul_kernel LN epilogue", ln_gemm, work=flops, unit="TFLOP/s", profile=False)
    report("row_stats", lambda: row_stats(x, mean, rstd, 1e-5), work=M * K * 2, profile=False)
    report("fold_weights", lambda: fold_weights(w, lw, lb, bias), work=2 * N * K * 2,
           profile=False)
    report("layer_norm_linear", lambda: tw.layer_norm_linear(x, lw, lb, w, bias), work=flops,
           unit="TFLOP/s")
    # Configs, interleaved over rounds (the machine's timings drift by ~10% between minutes):
    # the median per config and case.
    kernel = mm_ops.matmul_kernel
    configs = list(kernel.configs)
    candidates = [(128, 256, 64, 3, 8, 8), (128, 256, 64, 3, 8, 16), (128, 256, 64, 4, 8, 8),
                  (128, 256, 64, 4, 8, 16), (256, 128, 64, 3, 8, 16), (128, 256, 64, 3, 8, 32)]
    cases = {"LN": ln_gemm, "K-major": lambda: tw.matmul(x, w.t()),
             "cuBLAS linear": lambda: F.linear(x, w, bias)}
    times = defaultdict(list)
    try:
        for _ in range(5):
            for cand in candidates:
                bm, bn, bk, stages, warps, group = cand
                kernel.configs = [triton.Config(
                    {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                    num_stages=stages, num_warps=warps)]
                kernel.cache.clear()
                runtime._FAST_LAUNCHERS.pop(id(kernel), None)  # it remembers the config chosen
                for label, fn in cases.items():
                    if label == "cuBLAS linear" and cand != candidates[0]:
                        continue
                    times[(cand, label)].append(gpu_ms(fn))
    finally:
        kernel.configs = configs
        kernel.cache.clear()
        runtime._FAST_LAUNCHERS.pop(id(kernel), None)
    for (cand, label), ms in times.items():
        med = statistics.median(ms)
        print(f"   config {'x'.join(map(str, cand[:3]))} s{cand[3]} w{cand[4]} g{cand[5]} {label}: "
              f"median {med * 1e3:7.1f} µs {flops / med / 1e9:6.1f} TFLOP/s "
              f"(range {min(ms) * 1e3:.0f}-{max(ms) * 1e3:.0f})")


def interleaved(cases: dict, rounds: int = 5) -> dict:
    """Median ms per case, the cases timed in turn over ``rounds`` rounds (the machine's timings
    drift by ~10% between minutes: a case timed alone a minute later is not comparable)."""
    times = defaultdict(list)
    for _ in range(rounds):
        for label, fn in cases.items():
            times[label].append(gpu_ms(fn))
    return {label: statistics.median(ms) for label, ms in times.items()}


def section_tma():
    """matmul_tma_kernel (persistent, TMA) against matmul_kernel and cuBLAS, config by config:
    fp16 LN+Linear's GEMM (8192x4096x4096, B K-major, LN epilogue) and 8192^3 (B N-major)."""
    print("== tma: persistent TMA matmul configs, fp16")
    launch_tma = runtime.launch_directly(mm_ops._launch_matmul_tma)
    launch_matmul = runtime.launch_directly(mm_ops._launch_matmul)
    candidates = {
        "256x64 s3 w8 flat": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8),
        "256x64 s3 w8": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8,
                             FLATTEN=False),
        "256x64 s3 w8 flat g16": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3,
                                      num_warps=8, GROUP_M=16),
        "128x64 s4 w8 flat": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=8),
        "128x64 s4 w4 flat": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=4),
        "128x128 s3 w8 flat": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_stages=3,
                                   num_warps=8),
        "256x64 s3 w8 ws": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8,
                                WARP_SPECIALIZE=True),
        "128x64 s4 w4 ws": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4, num_warps=4,
                                WARP_SPECIALIZE=True),
        "256x64 s4 w8 ws": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8,
                                WARP_SPECIALIZE=True),
    }
    for title, (M, N, K), k_major in (("LN GEMM 8192x4096x4096", (8192, 4096, 4096), True),
                                       ("8192^3", (8192, 8192, 8192), False),
                                       ("4096^3", (4096, 4096, 4096), False)):
        flops = 2 * M * N * K
        x = torch.randn(M, K, device=DEV, dtype=torch.float16)
        w = torch.randn(N, K, device=DEV, dtype=torch.float16) / 64
        b = w.t() if k_major else w.t().contiguous()
        out = torch.empty(M, N, device=DEV, dtype=torch.float16)
        ln = None
        if k_major:
            ln = (torch.randn(M, device=DEV), torch.rand(M, device=DEV) + 0.5,
                  torch.randn(2 * N, device=DEV))
        bias = ln[2][N:] if ln else None
        ref = launch_matmul(x, b, torch.empty_like(out), bias=bias, ln_epilogue=ln)
        cases = {"cuBLAS": lambda: torch.mm(x, b),
                 "matmul_kernel": lambda: launch_matmul(x, b, out, bias=bias, ln_epilogue=ln)}
        for label, cfg in candidates.items():
            config = dict(mm_ops.TMA_CONFIG, **cfg)
            try:
                launch_tma(x, b, out, bias=bias, ln_epilogue=ln, config=config)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a config that does not compile: say so
                print(f"   {title} {label}: failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            print(f"   {title} {label}: max error {err:.2e} relative to max |ref|")
            cases[label] = (lambda config=config: launch_tma(x, b, out, bias=bias, ln_epilogue=ln,
                                                             config=config))
        cpu = cpu_us(cases.get("256x64 s3 w8 flat", cases["matmul_kernel"]))
        for label, ms in interleaved(cases).items():
            print(f"   {title} {label:>22}: {ms * 1e3:7.1f} µs {flops / ms / 1e9:6.1f} TFLOP/s "
                  f"({ms / 1:.3f} ms)")
        print(f"   {title}: {cpu:.0f} µs CPU to enqueue one TMA call")


def section_conv_graph():
    """conv2d fp16 32x64x56x56 through a CUDA graph (GPU time alone, no host in it) against
    do_bench's eager timing, for ours and cuDNN: how much of the gap is the host."""
    from triton.testing import do_bench_cudagraph

    print("== conv_graph: conv2d eager vs CUDA-graph timing")
    x = torch.randn(32, 64, 56, 56, device=DEV, dtype=torch.float16)
    w = torch.randn(64, 64, 3, 3, device=DEV, dtype=torch.float16) / 24
    flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
    for label, fmt in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
        xx, ww = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
        for name, fn in (("ours", lambda: tw.conv2d(xx, ww, padding=1)),
                         ("cuDNN", lambda: F.conv2d(xx, ww, padding=1))):
            eager = gpu_ms(fn)
            graph = do_bench_cudagraph(fn, rep=100, return_mode="median")
            print(f"   {label} {name:>5}: eager {eager * 1e3:6.1f} µs, graph {graph * 1e3:6.1f} µs "
                  f"({flops / graph / 1e9:.0f} TFLOP/s), {cpu_us(fn):.0f} µs CPU a call")
    best_configs(conv_ops.conv2d_implicit_gemm_kernel)


def section_tma_ops():
    """The public ops with Hopper's TMA matmul on (auto) and off, against their peers, timed in
    turn: matmul fp16/bf16 4096^3, 8192^3, ragged 5012x2100x7777; layer_norm_linear fp16/bf16
    8192x4096x4096 (against torch.compile of the unfused pair) and its pieces."""
    print("== tma_ops: public ops, TMA matmul on and off")

    def tma(flag, fn):
        def run():
            before, mm_ops.TMA_MATMUL = mm_ops.TMA_MATMUL, flag
            try:
                return fn()
            finally:
                mm_ops.TMA_MATMUL = before
        return run

    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192), (5012, 2100, 7777)):
            a = torch.randn(m, k, device=DEV, dtype=dtype)
            b = torch.randn(k, n, device=DEV, dtype=dtype)
            cases = {"cuBLAS": lambda: a @ b, "ours TMA": tma(None, lambda: tw.matmul(a, b)),
                     "ours matmul_kernel": tma(False, lambda: tw.matmul(a, b))}
            flops = 2 * m * n * k
            for label, ms in interleaved(cases).items():
                print(f"   matmul {dtype} {m}x{n}x{k} {label:>20}: {ms * 1e3:8.1f} µs "
                      f"{flops / ms / 1e9:6.1f} TFLOP/s")
        M, N, K = 8192, 4096, 4096
        flops = 2 * M * N * K
        x = torch.randn(M, K, device=DEV, dtype=dtype)
        lw = 1 + 0.1 * torch.randn(K, device=DEV, dtype=dtype)
        lb = 0.1 * torch.randn(K, device=DEV, dtype=dtype)
        w = torch.randn(N, K, device=DEV, dtype=dtype) / 64
        bias = torch.randn(N, device=DEV, dtype=dtype)

        def unfused(x, lw, lb, w, bias):
            return F.linear(F.layer_norm(x, (K,), lw, lb), w, bias)

        compiled = torch.compile(unfused)
        ref = unfused(x.double(), lw.double(), lb.double(), w.double(), bias.double())
        got = tw.layer_norm_linear(x, lw, lb, w, bias)
        err = ((got.double() - ref).norm() / ref.norm()).item()
        mean = torch.empty(M, device=DEV)
        rstd = torch.empty(M, device=DEV)
        row_stats = runtime.launch_directly(lnl_ops._row_stats)
        fold_weights = runtime.launch_directly(lnl_ops._fold_weights)
        cases = {"torch.compile": lambda: compiled(x, lw, lb, w, bias),
                 "eager": lambda: unfused(x, lw, lb, w, bias),
                 "cuBLAS F.linear": lambda: F.linear(x, w, bias),
                 "ours TMA": tma(None, lambda: tw.layer_norm_linear(x, lw, lb, w, bias)),
                 "ours matmul_kernel": tma(False, lambda: tw.layer_norm_linear(x, lw, lb, w, bias)),
                 "row_stats": lambda: row_stats(x, mean, rstd, 1e-5),
                 "fold_weights": lambda: fold_weights(w, lw, lb, bias)}
        for fn in cases.values():
            fn()
        for label, ms in interleaved(cases).items():
            print(f"   layer_norm_linear {dtype} {M}x{N}x{K} {label:>20}: {ms * 1e3:8.1f} µs "
                  f"{flops / ms / 1e9:6.1f} TFLOP/s")
        print(f"   layer_norm_linear {dtype}: relative error {err:.2e} against float64")


@triton.jit
def _ln_prologue_tma_kernel(a_desc, b_desc, c_desc, mean_ptr, rstd_ptr, g_ptr, beta_ptr, bias_ptr,
                            M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                            FLATTEN: tl.constexpr):
    """Prototype: LayerNorm as a *prologue* of the persistent TMA matmul. Each A tile of raw x is
    normalised in registers ((x - mean)·rstd·g + beta, rounded to x's dtype) before the dot, so
    W is read as it is (no folded copy) and the epilogue adds only the bias."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(start, num_pid_m * num_pid_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        rstd = tl.load(rstd_ptr + offs_m, mask=offs_m < M, other=0.0)
        shift = tl.load(mean_ptr + offs_m, mask=offs_m < M, other=0.0) * rstd
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for off_k in range(0, K, BLOCK_K):
            offs_k = off_k + tl.arange(0, BLOCK_K)
            g = tl.load(g_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            beta = tl.load(beta_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            x = a_desc.load([off_m, off_k]).to(tl.float32)
            xhat = x * rstd[:, None] - shift[:, None]
            a = (xhat * g[None, :] + beta[None, :]).to(a_desc.dtype)
            b = b_desc.load([off_n, off_k]).T
            acc = tl.dot(a, b, acc)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def section_ln_prologue():
    """layer_norm_linear fp16/bf16 8192x4096x4096: the LayerNorm as a prologue of the TMA
    matmul (prototype above: no weight fold) against the epilogue form (fold + TMA GEMM with the
    LN epilogue), torch.compile and cuBLAS; and the statistics and folding, apart and in one
    launch."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    print("== ln_prologue: LayerNorm as a matmul prologue vs the epilogue form")
    M, N, K = 8192, 4096, 4096
    flops = 2 * M * N * K
    sms = runtime.num_sms(torch.device(DEV))
    row_stats = runtime.launch_directly(lnl_ops._row_stats)
    fold_weights = runtime.launch_directly(lnl_ops._fold_weights)
    prepare = runtime.launch_directly(lnl_ops._prepare)
    launch_tma = runtime.launch_directly(mm_ops._launch_matmul_tma)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(M, K, device=DEV, dtype=dtype) + 0.5
        lw = 1 + 0.1 * torch.randn(K, device=DEV, dtype=dtype)
        lb = 0.1 * torch.randn(K, device=DEV, dtype=dtype)
        w = torch.randn(N, K, device=DEV, dtype=dtype) / 64
        bias = torch.randn(N, device=DEV, dtype=dtype)
        mean = torch.empty(M, device=DEV)
        rstd = torch.empty(M, device=DEV)
        out = torch.empty(M, N, device=DEV, dtype=dtype)
        row_stats(x, mean, rstd, 1e-5)
        w_prime, sums = fold_weights(w, lw, lb, bias)
        ref = F.linear(F.layer_norm(x.double(), (K,), lw.double(), lb.double(), 1e-5), w.double(),
                       bias.double())
        compiled = torch.compile(lambda: F.linear(F.layer_norm(x, (K,), lw, lb), w, bias))

        def prologue(bm=128, bn=256, bk=64, stages=3, warps=8, flatten=True):
            grid = (min(sms, runtime.cdiv(M, bm) * runtime.cdiv(N, bn)),)
            _ln_prologue_tma_kernel[grid](
                TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                TensorDescriptor.from_tensor(out, [bm, bn]), mean, rstd, lw, lb, bias, M, N, K,
                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, NUM_SMS=sms, FLATTEN=flatten,
                num_stages=stages, num_warps=warps)
            return out

        cases = {"torch.compile": compiled, "cuBLAS F.linear": lambda: F.linear(x, w, bias),
                 "ours (epilogue form)": lambda: tw.layer_norm_linear(x, lw, lb, w, bias),
                 "epilogue GEMM alone": lambda: launch_tma(x, w_prime.t(), out, bias=sums[N:],
                                                           ln_epilogue=(mean, rstd, sums))}
        for label, cfg in {"prologue 128x256x64 s3 w8": {},
                           "prologue 128x256x64 s3 w8 noflat": dict(flatten=False)}.items():
            try:
                got = prologue(**cfg)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a config that does not compile: say so
                print(f"   {dtype} {label}: failed: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
            print(f"   {dtype} {label}: max error {err:.2e} relative to max |ref|")
            cases[label] = (lambda cfg=cfg: prologue(**cfg))
        cases["row_stats"] = lambda: row_stats(x, mean, rstd, 1e-5)
        cases["fold_weights"] = lambda: fold_weights(w, lw, lb, bias)
        cases["both, one launch"] = lambda: prepare(x, mean, rstd, 1e-5, w, lw, lb, bias)
        for chunk, elems in ((2048, 4096), (1024, 4096), (1024, 2048), (4096, 8192)):
            def chunked(chunk=chunk, elems=elems):
                with knobs(lnl_ops, STATS_CHUNK_COLS=chunk, STATS_TILE_ELEMS=elems):
                    prepare(x, mean, rstd, 1e-5, w, lw, lb, bias)
            cases[f"both, stats {elems // min(chunk, K)}x{chunk}"] = chunked
        cases["copy of W (read+write)"] = lambda: w_prime.copy_(w)
        cases["sum of x (read)"] = lambda: x.sum(dim=1, dtype=torch.float32)
        for fn in cases.values():
            fn()
        for label, ms in interleaved(cases).items():
            if label.startswith(("row_stats", "sum")):
                rate = f"{M * K * x.element_size() / ms / 1e6:6.0f} GB/s"
            elif label.startswith("both"):
                rate = f"{(M + 2 * N) * K * x.element_size() / ms / 1e6:6.0f} GB/s"
            elif label.startswith(("fold", "copy")):
                rate = f"{2 * N * K * w.element_size() / ms / 1e6:6.0f} GB/s"
            else:
                rate = f"{flops / ms / 1e9:6.1f} TFLOP/s"
            print(f"   {dtype} {label:>34}: {ms * 1e3:7.1f} µs {rate}")
        from triton.testing import do_bench_cudagraph
        for label in ("torch.compile", "ours (epilogue form)"):
            graph = do_bench_cudagraph(cases[label], rep=200, return_mode="median")
            print(f"   {dtype} {label}: {cpu_us(cases[label]):.0f} µs CPU to enqueue a call; "
                  f"through a CUDA graph (no host, L2 not flushed) {graph * 1e3:.1f} µs")
            print(f"   {dtype} {label}, kernel by kernel:")
            for name, count, us in kernels(cases[label]):
                print(f"      {us:7.1f} µs  ×{count:g}  {name[:90]}")
        if dtype == torch.float16:
            print("   ours, CPU profile:")
            cpu_profile(cases["ours (epilogue form)"], top=20)


SECTIONS = {"softmax": section_softmax, "softmax_long": section_softmax_long,
            "layer_norm": section_layer_norm, "conv": section_conv, "filter2d": section_filter2d,
            "matmul": section_matmul, "attention": section_attention,
            "cpu": section_cpu, "overhead": section_overhead, "waits": section_waits, "thread": section_thread, "launch": section_launch,
            "lnl": section_lnl, "ln_long": section_ln_long, "tma": section_tma, "tma_ops": section_tma_ops,
            "conv_graph": section_conv_graph, "ln_prologue": section_ln_prologue}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", metavar="SECTION",
                        help=f"some of: {', '.join(SECTIONS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    if not torch.cuda.is_available():
        print("diagnose.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__}")
    for name in args.sections or SECTIONS:
        t = time.perf_counter()
        SECTIONS[name]()
        print(f"   ({name}: {time.perf_counter() - t:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
