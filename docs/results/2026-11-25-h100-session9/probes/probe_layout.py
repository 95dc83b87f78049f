"""Issue 22's three rows that moved in session 8's one before/after run, measured alone (no
peers, no torch.compile) so the two trees can alternate in one call: greyscale and filter2d 5x5 on
a 3x4096x4096 fp32 image, conv2d 3x3 NCHW fp16 32x64x56x56. Run it under each tree's
PYTHONPATH=<tree>/src; prints one line per op."""
import sys
import torch
from triton.testing import do_bench
import triton_workshop as tw

img = torch.rand(3, 4096, 4096, device="cuda")
k5 = torch.rand(5, 5, device="cuda")
x = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.float16)
w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16)
tag = sys.argv[1]
for name, fn, amount, unit in (
    ("greyscale 3x4096x4096", lambda: tw.greyscale(img), 4 * 4096 * 4096 * 4, "GB/s"),
    ("filter2d 5x5 3x4096x4096", lambda: tw.filter2d(img, k5), (2 * 3 * 4096 * 4096 + 25) * 4, "GB/s"),
    ("conv2d NCHW 32x64x56x56", lambda: tw.conv2d(x, w, padding=1), 2 * 32 * 64 * 56 * 56 * 64 * 9, "TFLOP/s"),
):
    fn(); torch.cuda.synchronize()
    ms = do_bench(fn, warmup=100, rep=500, return_mode="median")
    rate = amount / ms / 1e6 if unit == "GB/s" else amount / ms / 1e9
    print(f"{tag:6s} {name:28s} {ms * 1e3:8.1f} us {rate:8.0f} {unit}")
