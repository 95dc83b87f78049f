"""The Python part of an eager linear's host time, on the CPU: kernel launches stubbed out, so
what is timed is the checks, the autocast wrapper, the registered op and autograd, and the launch
decisions before a kernel would launch. Run: python probe_host_cpu.py (interpreter mode, no GPU).
Compare two commits by running it from each tree (PYTHONPATH=<tree>/src), alternating."""
import time

import torch
import torch.nn.functional as F

import triton_workshop as tw
from triton_workshop.ops import matmul as mm


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


mm.wrap_triton = lambda kernel: _NoLaunch()


def us(fn, reps=2000):
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


x, w, b = torch.randn(64, 96), torch.randn(128, 96), torch.randn(128)
xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
g = torch.randn(64, 128)
print(f"tw.linear forward           {us(lambda: tw.linear(x, w, b)):7.1f} us a call")
print(f"tw.linear forward+backward  {us(lambda: tw.linear(xg, wg, bg).backward(g)):7.1f} us a call")
with torch.autocast("cpu", dtype=torch.bfloat16):
    print(f"tw.linear under autocast    {us(lambda: tw.linear(x, w, b)):7.1f} us a call")
print(f"(F.linear, computing: {us(lambda: F.linear(x, w, b)):.1f} us)")
