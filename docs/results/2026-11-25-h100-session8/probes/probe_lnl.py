import sys, os, time, torch, torch.nn.functional as F
import triton_workshop as tw, triton
from triton.testing import do_bench
print("tw from", tw.__file__, "triton", triton.__version__, torch.cuda.get_device_name())
dev = "cuda"
# eps / numerics checks (meaningful on head only)
xd = torch.randn(64, 40, dtype=torch.float64, device=dev)
print("f64 eps err", (tw.layer_norm(xd, (40,), eps=1e-3) - F.layer_norm(xd, (40,), eps=1e-3)).abs().max().item())
for ratio in (0, 1e2, 1e4):
    x = ratio + torch.randn(64, 4096, device=dev)
    w = torch.randn(4096, device=dev) + 1; b = torch.randn(4096, device=dev)
    ref = F.layer_norm(x.double(), (4096,), w.double(), b.double())
    print("ln fp32 ratio", ratio, "ours", (tw.layer_norm(x, (4096,), w, b).double() - ref).abs().max().item(),
          "torch", (F.layer_norm(x, (4096,), w, b).double() - ref).abs().max().item())
const = torch.full((8, 8192), 100.7, device=dev); bb = torch.randn(8192, device=dev)
print("ln const", (tw.layer_norm(const, (8192,), None, bb) - bb).abs().max().item())
def lnl_unfused(x, g, be, w, bias):
    return tw.linear(tw.layer_norm(x, (x.shape[-1],), g, be), w, bias)
def lnl_torch(x, g, be, w, bias):
    return F.linear(F.layer_norm(x, (x.shape[-1],), g, be), w, bias)
lnl_compiled = torch.compile(lnl_torch)
rows = []
for dtype in (torch.float16, torch.bfloat16):
    for M, K, N in ((8192, 4096, 4096), (8192, 768, 2304), (8192, 768, 3072), (16384, 1024, 4096)):
        x = torch.randn(M, K, device=dev, dtype=dtype); g = torch.randn(K, device=dev, dtype=dtype) + 1
        be = torch.randn(K, device=dev, dtype=dtype); w = torch.randn(N, K, device=dev, dtype=dtype) / K**0.5
        bias = torch.randn(N, device=dev, dtype=dtype)
        fns = {"fused": tw.layer_norm_linear, "ours_unfused": lnl_unfused, "torch": lnl_torch, "compile": lnl_compiled}
        t = {}
        for name, fn in fns.items():
            fn(x, g, be, w, bias); torch.cuda.synchronize()
            t[name] = do_bench(lambda: fn(x, g, be, w, bias), warmup=25, rep=100, return_mode="median")
        flops = 2 * M * N * K
        print(f"{str(dtype)[6:]} {M}x{K}x{N}: " + "  ".join(f"{k} {v*1e3:.1f}us ({flops/v/1e9:.0f} TF)" for k, v in t.items())
              + f"  fused/compile {t['compile']/t['fused']:.2f}x  unfused/compile {t['compile']/t['ours_unfused']:.2f}x")
        # large-mean numerics
        xs = (1e3 + torch.randn(M if M < 4096 else 1024, K, device=dev)).to(dtype)
        ref = lnl_torch(xs.double(), g.double(), be.double(), w.double(), bias.double())
        e = {n: (f(xs, g, be, w, bias).double() - ref).abs().max().item() for n, f in (("fused", tw.layer_norm_linear), ("unfused", lnl_unfused), ("torch", lnl_torch))}
        print("   mean 1e3 errors", e)
