"""Compile attention kernels for sm_90 locally (no GPU) and report registers, spills and
instruction mix, to compare our dK/dV kernel with the probe's."""
import os, re, subprocess, sys, importlib.util
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "ptxas")
NVDIS = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "cuobjdump")


def build(fn, args, num_warps, num_stages, tag):
    """args: list of (name, type-or-constexpr-value)."""
    while not isinstance(fn, triton.runtime.jit.JITFunction):
        fn = fn.fn
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        kind, val = args[name]
        if kind == "c":
            sig[name] = "constexpr"
            consts[(i,)] = val
        else:
            sig[name] = kind
            if val == 16:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, consts, attrs)
    k = triton.compile(src, target=TARGET, options=dict(num_warps=num_warps, num_stages=num_stages))
    ptx = k.asm["ptx"]
    open(f"/tmp/sass/{tag}.ptx", "w").write(ptx)
    open(f"/tmp/sass/{tag}.ttgir", "w").write(k.asm["ttgir"])
    open(f"/tmp/sass/{tag}.cubin", "wb").write(k.asm["cubin"])
    res = subprocess.run([NVDIS, "-res-usage", f"/tmp/sass/{tag}.cubin"], capture_output=True, text=True).stdout
    info = " ".join(re.findall(r"REG:\d+|STACK:\d+", res))
    sass = subprocess.run([NVDIS, "-sass", f"/tmp/sass/{tag}.cubin"], capture_output=True, text=True).stdout
    open(f"/tmp/sass/{tag}.sass", "w").write(sass)
    ops = {}
    for line in sass.splitlines():
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
            op = m.group(1).split(".")[0]
            ops[op] = ops.get(op, 0) + 1
    top = ", ".join(f"{o} {n}" for o, n in sorted(ops.items(), key=lambda x: -x[1])[:18])
    wg = len(re.findall(r"wgmma.mma_async", ptx)), len(re.findall(r"wgmma.wait_group", ptx))
    print(f"[{tag}] {info}\n   wgmma {wg[0]} wait {wg[1]} | {top}\n", flush=True)
    return k


if __name__ == "__main__":
    sys.path.insert(0, "src")
    import torch
    torch.cuda.is_available = lambda: True
    import triton_workshop.ops.attention.kernels as K
    P, F32, I = "*bf16", "*fp32", "i32"

    def args_for(fn, bm, bn):
        while not isinstance(fn, triton.runtime.jit.JITFunction):
            fn = fn.fn
        a = {}
        hd = int(os.environ.get("HD", "64"))
        consts = dict(HEAD_DIM=hd, HEAD_DIM_PAD=hd, CAUSAL=True, INPUT_PRECISION="ieee",
                      DOT_IN_FP32=False, POSITIVE_SCALE=True, KEY_MASK=False, WINDOW=False,
                      SOFTCAP=False, SINKS=False, DROPOUT=False, VARLEN=False, BLOCK_M=bm,
                      BLOCK_N=bn)
        for f in os.environ.get("FEATURES", "").split(","):
            if f:
                consts[f] = True
        ptr_for = dict(seed_ptr=("DROPOUT", "*i64"), key_mask_ptr=("KEY_MASK", "*u8"),
                       cu_q_ptr=("VARLEN", "*i32"), cu_k_ptr=("VARLEN", "*i32"),
                       sinks_ptr=("SINKS", "*fp32"))
        for n in fn.arg_names:
            if n in ptr_for and consts.get(ptr_for[n][0]):
                a[n] = (ptr_for[n][1], 16)
            elif n in consts:
                a[n] = ("c", consts[n])
            elif n in ("seed_ptr", "key_mask_ptr", "cu_q_ptr", "cu_k_ptr", "sinks_ptr"):
                a[n] = ("c", None)
            elif n in ("lse_ptr", "lse2_ptr", "delta_ptr"):
                a[n] = (F32, 16)
            elif n.endswith("_ptr"):
                a[n] = (P, 16)
            elif n.startswith("stride_m"):
                a[n] = (I, 16)
            elif n.startswith("stride_") and n.endswith("d"):
                a[n] = ("c", 1)
            elif n.startswith("stride_"):
                a[n] = (I, 16)
            elif n in ("sm_scale", "softcap", "dropout_p"):
                a[n] = ("fp32", 0)
            elif n in os.environ.get("CONST1", "").split(","):
                a[n] = ("c", 1)
            else:
                a[n] = (I, 16 if n in os.environ.get("DIV16", "").split(",") else 0)
        return a

    which = os.environ.get("KERNELS", "dkdv").split(",")
    tag = os.environ.get("TAG", "ours")
    cfgs = dict(dkdv=(64, 64, 4, 2), dq=(64, 32, 4, 3), fwd=(128, 64, 8, 3), pre=(64, 0, 4, 1))
    kern = dict(dkdv=K.attn_bwd_dkdv_kernel, dq=K.attn_bwd_dq_kernel, fwd=K.attn_fwd_kernel,
                pre=K.attn_bwd_preprocess_kernel)
    for w_ in which:
        bm, bn, w, st = cfgs[w_]
        if os.environ.get("CFG") and w_ == "dkdv":
            bm, bn, w, st = (int(x) for x in os.environ["CFG"].split(","))
        build(kern[w_], args_for(kern[w_], bm, bn), w, st, f"{tag}-{w_}")
    if os.environ.get("PROBE"):
        spec = importlib.util.spec_from_file_location("probe", ".device/attn_probe_kernel.py")
        pm = importlib.util.module_from_spec(spec); spec.loader.exec_module(pm)
        b = {n: (P, 16) for n in ("Q", "K", "V", "DO", "DK", "DV")}
        b.update(LSE2=(F32, 16), DELTA=(F32, 16), DQ=(F32, 16), N=(I, 16), qk_scale=("fp32", 0),
                 sm_scale=("fp32", 0), H=("c", 32), HK=("c", 8), D=("c", 64), BLOCK_M=("c", bm),
                 BLOCK_N=("c", bn), DQ_ATOMIC=("c", False), REVERSE=("c", False),
                 MASK_LOADS=("c", os.environ.get("ML") == "1"), PTR64=("c", False))
        bm, bn, w, st = (int(x) for x in os.environ.get("CFG", "64,64,4,2").split(","))
        b["BLOCK_M"] = ("c", bm); b["BLOCK_N"] = ("c", bn)
        build(pm.fused_bwd, b, w, st, "probe")
