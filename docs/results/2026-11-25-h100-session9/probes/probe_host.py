"""Where the eager library's host time goes (session 9): per-call host microseconds of single ops
against torch's, cProfile of the matmul paths, and cProfile of one patched GPT-2 training step.
Run on the GPU machine: PYTHONPATH=<snapshot>/src python3 probe_host.py [--step-only]"""
import cProfile, dataclasses, io, pstats, sys, time
from pathlib import Path
import torch, torch.nn.functional as F
import triton_workshop as tw
from triton_workshop.ops import matmul as mm

dev = "cuda"
def host_us(fn, reps=300):
    for _ in range(10): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps): fn()
    h = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize(); return h
def prof(fn, reps=200, n=25, sort="tottime"):
    for _ in range(10): fn()
    torch.cuda.synchronize(); pr = cProfile.Profile(); pr.enable()
    for _ in range(reps): fn()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(n); return s.getvalue()

bf = torch.bfloat16
if "--step-only" not in sys.argv:
    x = torch.randn(2048, 768, device=dev, dtype=bf); w = torch.randn(2304, 768, device=dev, dtype=bf); b = torch.randn(2304, device=dev, dtype=bf)
    xg = x.clone().requires_grad_(); wg = w.clone().requires_grad_(); bg = b.clone().requires_grad_()
    g = torch.randn(2048, 2304, device=dev, dtype=bf)
    ln_w = torch.ones(768, device=dev, dtype=bf, requires_grad=True); ln_b = torch.zeros(768, device=dev, dtype=bf, requires_grad=True)
    rows = []
    for name, ours, theirs in (
        ("linear fwd", lambda: tw.linear(x, w, b), lambda: F.linear(x, w, b)),
        ("linear+gelu fwd", lambda: tw.linear(x, w, b, activation="gelu"), lambda: F.gelu(F.linear(x, w, b), approximate="tanh")),
        ("linear fwd+bwd", lambda: tw.linear(xg, wg, bg).backward(g), lambda: F.linear(xg, wg, bg).backward(g)),
        ("layer_norm fwd", lambda: tw.layer_norm(x, (768,)), lambda: F.layer_norm(x, (768,))),
        ("layer_norm fwd+bwd", lambda: tw.layer_norm(xg, (768,), ln_w, ln_b).backward(x), lambda: F.layer_norm(xg, (768,), ln_w, ln_b).backward(x)),
        ("softmax fwd", lambda: tw.softmax(x), lambda: torch.softmax(x, -1)),
        ("add", lambda: tw.add(x, x), lambda: torch.add(x, x)),
    ):
        rows.append((name, host_us(ours), host_us(theirs)))
    for tma in (None, False):
        mm.TUNING = dataclasses.replace(mm.TUNING, tma_matmul=tma)
        rows.append((f"linear fwd tma={tma}", host_us(lambda: tw.linear(x, w, b)), float("nan")))
        print(f"=== cProfile tw.linear 2048x768x2304 bf16, tma={tma}, 200 calls"); print(prof(lambda: tw.linear(x, w, b))[:6000])
    mm.TUNING = dataclasses.replace(mm.TUNING, tma_matmul=None)
    print("=== cProfile tw.layer_norm fwd+bwd"); print(prof(lambda: tw.layer_norm(xg, (768,), ln_w, ln_b).backward(x))[:6000])
    print("=== cProfile tw.linear fwd+bwd"); print(prof(lambda: tw.linear(xg, wg, bg).backward(g))[:6000])
    print("host us/call: op | triton-workshop | torch")
    for r in rows: print(f"{r[0]:28s} {r[1]:8.1f} {r[2]:8.1f}")

sys.path.insert(0, str(Path(tw.__file__).resolve().parents[2] / "examples"))
import train_gpt2 as ex
args = ex.parse_args(["--batch", "4", "--seq", "512", "--steps", "1"])
for patched in (False, True):
    torch.manual_seed(0); model = ex.build_model(args).to(dev)
    if patched: tw.nn.patch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = ex.batches(args, dev)
    def step():
        x, y = data[0]
        with torch.autocast("cuda", dtype=bf):
            loss = ex.loss_of(model, x, y, False)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    t = time.perf_counter(); step(); torch.cuda.synchronize(); first = time.perf_counter() - t
    for _ in range(3): step()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): step()
    host = (time.perf_counter() - t) / 10 * 1e3; torch.cuda.synchronize(); wall = (time.perf_counter() - t) / 10 * 1e3
    print(f"GPT-2 4x512 patched={patched}: first step {first:.1f} s, host {host:.1f} ms/step (enqueue), wall {wall:.1f} ms/step")
    if patched:
        print("=== cProfile patched GPT-2 step (5 steps), tottime"); out = prof(step, reps=5, n=45); print(out[:9000])
        print("=== cumulative"); print(prof(step, reps=5, n=45, sort="cumulative")[:9000])
