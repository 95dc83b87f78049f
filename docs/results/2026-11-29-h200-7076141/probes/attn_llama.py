"""Attention at the Llama 1.5B shape (4 x 2048, 32 q / 8 kv heads of 64, causal bf16): ours vs SDPA, CUDA graph us."""
import torch, torch.nn.functional as F, warnings, os
warnings.simplefilter("ignore")
import triton.testing as tt
import triton_workshop as tw
torch.manual_seed(0)
B, N, HQ, HK, D = (int(x) for x in os.environ.get("ASHAPE", "4,2048,32,8,64").split(","))
q = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(B, HK, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
g = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.bfloat16)
for name, fn in (("ours", lambda: tw.attention(q, k, v, causal=True)),
                 ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))):
    def fb():
        q.grad = k.grad = v.grad = None
        fn().backward(g)
    r = []
    for f in (fn, fb):
        f(); f(); torch.cuda.synchronize()
        r.append(tt.do_bench_cudagraph(f, return_mode="median") * 1e3)
    print(f"{name}: fwd {r[0]:.1f} us  fwd+bwd {r[1]:.1f} us  bwd {r[1]-r[0]:.1f}", flush=True)
from torch.profiler import profile, ProfilerActivity
import collections
def fb():
    q.grad = k.grad = v.grad = None
    tw.attention(q, k, v, causal=True).backward(g)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        fb()
    torch.cuda.synchronize()
tot = collections.Counter()
for e in prof.events():
    if e.device_type.name == "CUDA":
        tot[e.name] += e.device_time / 10
print("  " + ", ".join(f"{n} {t:.0f}" for n, t in tot.most_common(5) if "attn" in n))
import triton_workshop.ops.attention.kernels as K
for kn in ("attn_fwd_kernel", "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"):
    kern = getattr(K, kn)
    for key, cfg in getattr(kern, "cache", {}).items():
        print(f"  {kn} {key[:4]} {cfg}")
