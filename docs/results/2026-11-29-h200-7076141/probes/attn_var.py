"""Probe: attention backward in one kernel with dQ accumulated by fp32 atomics (five products
instead of seven), against ours (dkdv + dq kernels) and cuDNN's SDPA, at the Llama 1.5B shape.
Also: torch.mm with an fp32 output against mm + cast, for the weight gradients."""
import math, os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.nn.functional as F
import triton, triton.language as tl
import triton.testing as tt

torch.manual_seed(0)
B, N, HQ, HK, D = (int(x) for x in os.environ.get("ASHAPE", "4,2048,32,8,64").split(","))


@triton.jit
def _inner(dk, dv, k, v, Qp, DOp, DQp, LSEp, DELp, offs_n, offs_d, lo, hi, qk_scale, n_q,
           D: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, DQ_ATOMIC: tl.constexpr,
           MASK_LOADS: tl.constexpr, PTR64: tl.constexpr):
    offs_m0 = tl.arange(0, BLOCK_M)
    if PTR64:
        offs_m0 = offs_m0.to(tl.int64)
        q_ptrs = Qp + (lo + offs_m0[:, None]) * D + offs_d[None, :]
        do_ptrs = DOp + (lo + offs_m0[:, None]) * D + offs_d[None, :]
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        if not PTR64:
            q_ptrs = Qp + offs_m[:, None] * D + offs_d[None, :]
            do_ptrs = DOp + offs_m[:, None] * D + offs_d[None, :]
        if MASK_LOADS:
            mm = offs_m < n_q
            q = tl.load(q_ptrs, mask=mm[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=mm[:, None], other=0.0)
            lse = tl.load(LSEp + offs_m, mask=mm, other=float("inf"))
            delta = tl.load(DELp + offs_m, mask=mm, other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(LSEp + offs_m)
            delta = tl.load(DELp + offs_m)
        if PTR64:
            q_ptrs += BLOCK_M * D
            do_ptrs += BLOCK_M * D
        qk_t = tl.dot(k, tl.trans(q))
        dp_t = tl.dot(v, tl.trans(do))
        s_t = qk_t * qk_scale
        if MASKED:
            s_t = tl.where(offs_n[:, None] <= offs_m[None, :], s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse[None, :])
        dv = tl.dot(p_t.to(q.dtype), do, dv)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        if DQ_ATOMIC:
            dq = tl.dot(tl.trans(ds_t), k)
            tl.atomic_add(DQp + offs_m[:, None] * D + offs_d[None, :], dq, sem="relaxed")
    return dk, dv


@triton.jit
def fused_bwd(Q, K, V, DO, LSE2, DELTA, DK, DV, DQ, N, qk_scale, sm_scale,
              H: tl.constexpr, HK: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DQ_ATOMIC: tl.constexpr,
              REVERSE: tl.constexpr, MASK_LOADS: tl.constexpr = False, PTR64: tl.constexpr = False):
    pid_n = tl.program_id(0)
    if REVERSE:
        pid_n = tl.num_programs(0) - 1 - pid_n
    bk = tl.program_id(1)
    b = bk // HK
    kvh = bk % HK
    GROUP: tl.constexpr = H // HK
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kv_off = (b * HK + kvh).to(tl.int64) * N * D
    k = tl.load(K + kv_off + offs_n[:, None] * D + offs_d[None, :])
    v = tl.load(V + kv_off + offs_n[:, None] * D + offs_d[None, :])
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for g in range(GROUP):
        h = kvh * GROUP + g
        q_off = (b * H + h).to(tl.int64) * N * D
        r_off = (b * H + h).to(tl.int64) * N
        dk, dv = _inner(dk, dv, k, v, Q + q_off, DO + q_off, DQ + q_off, LSE2 + r_off,
                        DELTA + r_off, offs_n, offs_d, start_n, start_n + BLOCK_N, qk_scale, N,
                        D, BLOCK_M, True, DQ_ATOMIC, MASK_LOADS, PTR64)
        dk, dv = _inner(dk, dv, k, v, Q + q_off, DO + q_off, DQ + q_off, LSE2 + r_off,
                        DELTA + r_off, offs_n, offs_d, start_n + BLOCK_N, N, qk_scale, N,
                        D, BLOCK_M, False, DQ_ATOMIC, MASK_LOADS, PTR64)
    dk = dk * sm_scale
    tl.store(DK + kv_off + offs_n[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty))
    tl.store(DV + kv_off + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty))


@triton.jit
def dq_convert(DQ32, DQ, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(DQ + offs, (tl.load(DQ32 + offs, mask=m) * scale).to(DQ.dtype.element_ty), mask=m)


q = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(B, HK, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
do = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.bfloat16)
sm_scale = 1 / math.sqrt(D)
qk_scale = sm_scale * math.log2(math.e)

# Reference (fp32 SDPA via autograd) and the saved statistics.
qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True)
o.backward(do.float())
ke = kr.detach().repeat_interleave(HQ // HK, 1)
s = (qr.detach() @ ke.transpose(-1, -2)) * sm_scale
s = s.masked_fill(torch.ones(N, N, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
lse2 = (torch.logsumexp(s, -1) * math.log2(math.e)).contiguous()
del s, ke
delta = (o.detach().to(torch.bfloat16).float() * do.float()).sum(-1).contiguous()

def run(bm, bn, w, st, atomic=True, reverse=False, ml=False, p64=False):
    dk = torch.empty_like(k); dv = torch.empty_like(v)
    dq32 = torch.zeros(q.shape, device="cuda", dtype=torch.float32)
    dq = torch.empty_like(q)
    def f():
        dq32.zero_()
        fused_bwd[(N // bn, B * HK)](q, k, v, do, lse2, delta, dk, dv, dq32, N, qk_scale,
                                     sm_scale, HQ, HK, D, bm, bn, atomic, reverse, ml, p64,
                                     num_warps=w, num_stages=st)
        if atomic:
            dq_convert[(triton.cdiv(dq.numel(), 4096),)](dq32, dq, dq.numel(), sm_scale, 4096)
    return f, dq, dk, dv

def err(a, b):
    return ((a.float() - b).abs().max() / b.abs().max()).item()

print(f"shape B{B} N{N} HQ{HQ} HK{HK} D{D}", flush=True)
for cfg in [(64, 64, 4, 2), (64, 64, 4, 3)]:
    for ml, p64 in ((False, False), (True, False), (False, True), (True, True)):
        f, dq, dk, dv = run(*cfg, atomic=False, ml=ml, p64=p64)
        f(); torch.cuda.synchronize()
        e = (err(dk, kr.grad), err(dv, vr.grad))
        t = tt.do_bench_cudagraph(f, return_mode="median") * 1e3
        print(f"cfg {cfg} maskloads={ml} ptr64={p64}: {t:7.1f} us  err dk {e[0]:.1e} dv {e[1]:.1e}", flush=True)
# The memset and the conversion alone.
dq32 = torch.zeros(q.shape, device="cuda", dtype=torch.float32); dq = torch.empty_like(q)
print("zero_ fp32 dq:", round(tt.do_bench_cudagraph(lambda: dq32.zero_(), return_mode="median") * 1e3, 1), "us")
print("convert:", round(tt.do_bench_cudagraph(lambda: dq_convert[(triton.cdiv(dq.numel(), 4096),)](
    dq32, dq, dq.numel(), sm_scale, 4096), return_mode="median") * 1e3, 1), "us", flush=True)

# Ours and SDPA, whole backward.
sys.path.insert(0, "src")
import triton_workshop as tw
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
for name, fn in (("ours", lambda: tw.attention(qg, kg, vg, causal=True)),
                 ("sdpa", lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=True))):
    def fb():
        qg.grad = kg.grad = vg.grad = None
        fn().backward(do)
    r = []
    for f in (fn, fb):
        f(); f(); torch.cuda.synchronize()
        r.append(tt.do_bench_cudagraph(f, return_mode="median") * 1e3)
    print(f"{name}: fwd {r[0]:.1f} us  fwd+bwd {r[1]:.1f} us  bwd {r[1]-r[0]:.1f}", flush=True)

