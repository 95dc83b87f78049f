import torch, time, cProfile, pstats, io, warnings
warnings.simplefilter("always")
import triton_workshop as tw
from triton_workshop.ops import matmul as mm
from triton_workshop.runtime import launch as L
dev = "cuda"
x = torch.randn(8192, 768, device=dev, dtype=torch.bfloat16); w = torch.randn(2304, 768, device=dev, dtype=torch.bfloat16); b = torch.randn(2304, device=dev, dtype=torch.bfloat16)
for tma in (None, False):
    mm.TMA_MATMUL = tma
    for _ in range(20): tw.linear(x, w, b)
    torch.cuda.synchronize()
    print("FAST_LAUNCH", L.FAST_LAUNCH, "tma", tma)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200): tw.linear(x, w, b)
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:5000])
x = torch.randn(8192, 768, device=dev, dtype=torch.bfloat16)
for name, f in (("layer_norm", lambda: tw.layer_norm(x, (768,))), ("softmax", lambda: tw.softmax(x)), ("add", lambda: tw.add(x, x))):
    for _ in range(20): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(500): f()
    print(name, "host us/call", (time.perf_counter() - t) / 500 * 1e6); torch.cuda.synchronize()
