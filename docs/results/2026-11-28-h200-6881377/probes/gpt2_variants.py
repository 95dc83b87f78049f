"""GPT-2 eager, one process: torch against patched variants (which kinds swapped), ms/step."""
import sys, time, warnings, torch
warnings.simplefilter("ignore")
from triton_workshop.bench.models.workloads import WORKLOADS
from triton_workshop.bench.models.run import make_step, _to_device
from triton_workshop.nn import patch
name = sys.argv[1]; sizes = sys.argv[2].split(",")
w = WORKLOADS[name]; dev = torch.device("cuda")
VARIANTS = {
    "torch eager": None,
    "tw default": {},
    "tw linear=always": {"linear": "always"},
    "tw no layer_norm": {"layer_norm": False},
    "tw attention only": {"layer_norm": False, "linear": "never"},
    "tw layer_norm only": {"attention": False, "linear": "never"},
    "tw fused linear only": {"attention": False, "layer_norm": False},
}
only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(VARIANTS)
for size in sizes:
    s = w.sizes[size]
    for label in only:
        flags = VARIANTS[label]
        torch.manual_seed(0)
        m = w.model(s).to(dev)
        counts = patch(m, **flags) if flags is not None else "-"
        batches = [_to_device(b, dev, False) for b in w.batches(s, 4)]
        step = make_step(m, w, dev, True)
        for b in batches: step(b)
        torch.cuda.synchronize()
        runs = []
        for rep in range(5):
            t = time.perf_counter()
            for i in range(10): step(batches[i % 4])
            torch.cuda.synchronize(); runs.append((time.perf_counter() - t) / 10 * 1e3)
        runs.sort()
        print(f"{name} {size:5s} {label:22s} min {runs[0]:6.1f}  median {runs[2]:6.1f} ms/step  {dict(counts) if flags is not None else ''}", flush=True)
        del m, step, batches; torch.cuda.empty_cache()
