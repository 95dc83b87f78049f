import torch, time, triton_workshop as tw, torch.nn.functional as F
from triton.testing import do_bench
from triton_workshop.ops import matmul as mm
dev = "cuda"
def graph_time(fn, reps=50):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps): fn()
    g.replay(); torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True); t1 = torch.cuda.Event(enable_timing=True)
    t0.record(); g.replay(); t1.record(); torch.cuda.synchronize()
    return t0.elapsed_time(t1) / reps
def host_time(fn, reps=200):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps): fn()
    h = (time.perf_counter() - t) / reps
    torch.cuda.synchronize()
    return h * 1e3
for dtype in (torch.bfloat16,):
    for M, K, N in ((8192, 768, 2304), (8192, 768, 3072), (8192, 3072, 768), (8192, 768, 768), (4096, 4096, 4096)):
        x = torch.randn(M, K, device=dev, dtype=dtype); w = torch.randn(N, K, device=dev, dtype=dtype) / K**.5; b = torch.randn(N, device=dev, dtype=dtype)
        res = {}
        for tma in (None, False):
            mm.TMA_MATMUL = tma
            f = lambda: tw.linear(x, w, b)
            f(); torch.cuda.synchronize()
            res[f"tw tma={tma}"] = (do_bench(f, return_mode="median"), graph_time(f), host_time(f))
        mm.TMA_MATMUL = None
        f = lambda: F.linear(x, w, b)
        res["torch"] = (do_bench(f, return_mode="median"), graph_time(f), host_time(f))
        fl = 2 * M * N * K
        print(f"{M}x{K}x{N} " + " | ".join(f"{k}: bench {v[0]*1e3:.0f}us graph {v[1]*1e3:.0f}us ({fl/v[1]/1e9:.0f} TF) host {v[2]*1e3:.0f}us" for k, v in res.items()))
