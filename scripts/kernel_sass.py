"""What an attention kernel compiles to on a Hopper GPU, on any machine: registers, spilled bytes,
and the SASS instructions of each step of its loops.

No GPU is needed: Triton compiles for ``sm_90`` with the ``ptxas`` it ships, and ``cuobjdump``
(shipped beside it) disassembles the cubin. At D = 64 the backward's dK/dV loop is bound by its
instruction count, so the count a step is a fair first measure of a change to that loop before a
GPU times it (docs/kernels/attention.md: 430 instructions a step took 627 µs at the Llama shape,
a probe's 311 took 352). Counts depend on the Triton release: compare like with like.

::

    python scripts/kernel_sass.py                      # dK/dV, 64 x 64 tiles, 4 warps, 2 stages
    python scripts/kernel_sass.py --kernel dq --config 64,32,4,3
    python scripts/kernel_sass.py --head-dim 128 --config 32,128,8,3 --features WINDOW,SOFTCAP
    python scripts/kernel_sass.py --n-q-unaligned      # n_q not known a multiple of 16
    python scripts/kernel_sass.py --keep DIR           # also write the TTGIR, PTX and SASS

Each loop is listed by the addresses it spans, with its instruction count and most frequent
opcodes; a loop's count is one step of it. A nested outer loop (the dK/dV kernel's loop over a
group's query heads) spans its inner loops and is listed last.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Compiling for the GPU needs Triton's jit functions as made for the GPU: the package would
# otherwise choose its interpreter on a machine without CUDA.
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

torch.cuda.is_available = lambda: True  # kernels decorated for the GPU; nothing is launched

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from triton_workshop.ops.attention import (  # noqa: E402
    attn_bwd_dkdv_kernel,
    attn_bwd_dq_kernel,
    attn_fwd_kernel,
)
from triton_workshop.ops.attention.configs import FEATURE_SWITCHES  # noqa: E402

KERNELS = {
    "dkdv": (attn_bwd_dkdv_kernel, (64, 64, 4, 2)),
    "dq": (attn_bwd_dq_kernel, (64, 32, 4, 3)),
    "fwd": (attn_fwd_kernel, (128, 64, 8, 3)),
}
FEATURES = FEATURE_SWITCHES
#: The pointer each feature brings (absent features pass None, a compile-time constant).
_FEATURE_POINTERS = {"seed_ptr": ("DROPOUT", "*i64"), "key_mask_ptr": ("KEY_MASK", "*u8"),
                     "cu_q_ptr": ("VARLEN", "*i32"), "cu_k_ptr": ("VARLEN", "*i32"),
                     "sinks_ptr": ("SINKS", "*fp32")}


def _jit_function(kernel):
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


def signature(fn, head_dim: int, block_m: int, block_n: int, features: set[str],
              n_q_aligned: bool, dtype: str = "bf16"):
    """(signature, constexprs, attributes) for one compile, as a launch at the Llama shape would
    specialise it: contiguous tensors (16-byte aligned, unit last stride), strides multiples of
    16, the sequence lengths not specialised (``NOT_SPECIALIZED``) except n_q where the kernel
    lets Triton specialise it."""
    consts = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim, CAUSAL=True, INPUT_PRECISION="ieee",
                  DOT_IN_FP32=False, POSITIVE_SCALE=True, BLOCK_M=block_m, BLOCK_N=block_n,
                  **{f: f in features for f in FEATURES})
    unspecialised = {fn.arg_names[a] if isinstance(a, int) else a
                     for a in getattr(fn, "do_not_specialize", ())}
    specialised = set(fn.arg_names) - unspecialised
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        kind, aligned = None, False
        if name in consts:
            constexprs[(i,)] = consts[name]
            sig[name] = "constexpr"
            continue
        if name in _FEATURE_POINTERS:
            feature, ptr_type = _FEATURE_POINTERS[name]
            if feature not in features:
                constexprs[(i,)] = None
                sig[name] = "constexpr"
                continue
            kind, aligned = ptr_type, True
        elif name in ("lse_ptr", "lse2_ptr", "delta_ptr"):
            kind, aligned = "*fp32", True
        elif name.endswith("_ptr"):
            kind, aligned = f"*{dtype}", True
        elif name.startswith("stride_") and name.endswith("d") and not name.startswith("stride_m"):
            constexprs[(i,)] = 1  # a unit stride is specialised to the constant 1
            sig[name] = "constexpr"
            continue
        elif name in ("sm_scale", "softcap", "dropout_p"):
            kind = "fp32"
        else:
            kind = "i32"
            aligned = name.startswith("stride_") or (name == "n_q" and n_q_aligned
                                                     and name in specialised)
        sig[name] = kind
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constexprs, attrs


def _tools():
    import triton.backends.nvidia as nvidia

    return Path(nvidia.__file__).parent / "bin" / "cuobjdump"


def compile_kernel(name: str, head_dim: int, config: tuple, features: set[str],
                   n_q_aligned: bool, keep: Path | None):
    kernel, _ = KERNELS[name]
    fn = _jit_function(kernel)
    block_m, block_n, warps, stages = config
    sig, constexprs, attrs = signature(fn, head_dim, block_m, block_n, features, n_q_aligned)
    compiled = triton.compile(ASTSource(fn, sig, constexprs, attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=stages))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        cuobjdump = _tools()
        usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True,
                               text=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{name}.ttgir").write_text(compiled.asm["ttgir"])
        (keep / f"{name}.ptx").write_text(compiled.asm["ptx"])
        (keep / f"{name}.sass").write_text(sass)
    registers = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return (int(registers.group(1)) if registers else None,
            int(stack.group(1)) if stack else None, sass)


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each SASS instruction."""
    out = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;]*);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


def loops(code: list[tuple[int, str, str]]) -> list[tuple[int, int, collections.Counter]]:
    """Each backward branch's span, (first, last address, opcode counts), for the loops that
    issue tensor-core products (HGMMA)."""
    found = []
    for addr, op, operands in code:
        target = re.search(r"0x([0-9a-f]+)", operands) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            first = int(target.group(1), 16)
            counts = collections.Counter(o for a, o, _ in code if first <= a <= addr)
            if counts["HGMMA"]:
                found.append((first, addr, counts))
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", choices=sorted(KERNELS), default="dkdv")
    p.add_argument("--config", help="BLOCK_M,BLOCK_N,num_warps,num_stages (default: the kernel's"
                                    " pick at the Llama shape before retuning)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--features", default="", help=f"comma-separated: {', '.join(FEATURES)}")
    p.add_argument("--n-q-unaligned", action="store_true",
                   help="n_q not a multiple of 16 (a ragged length)")
    p.add_argument("--keep", type=Path, help="write the TTGIR, PTX and SASS to this folder")
    args = p.parse_args(argv)
    config = (tuple(int(x) for x in args.config.split(",")) if args.config
              else KERNELS[args.kernel][1])
    features = {f.strip() for f in args.features.split(",") if f.strip()}
    unknown = features - set(FEATURES)
    if unknown:
        p.error(f"--features: unknown {', '.join(sorted(unknown))}; known: {', '.join(FEATURES)}")
    registers, stack, sass = compile_kernel(args.kernel, args.head_dim, config, features,
                                            not args.n_q_unaligned, args.keep)
    print(f"{args.kernel} D={args.head_dim} BLOCK_M,BLOCK_N,warps,stages={config} "
          f"features={','.join(sorted(features)) or '-'} (Triton {triton.__version__}, sm_90): "
          f"{registers} registers, {stack} bytes of stack (spills)")
    for first, last, counts in loops(instructions(sass)):
        top = ", ".join(f"{op} {n}" for op, n in counts.most_common(10))
        steps = sum(counts.values())
        print(f"  loop {first:#06x}-{last:#06x}: {steps} instructions a step ({top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
