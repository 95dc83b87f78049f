"""``workshop tune``: tune the autotuned kernels on this GPU and keep the winners as a table.

Runs each autotuned op (matmul/linear with and without a fused activation, attention, conv2d)
forward and backward at the sizes of the models people train (GPT-2, Llama-class decoders,
ResNet), with the tables off so that every candidate is timed, then writes what the autotuners
chose into a table (:mod:`triton_workshop.runtime.tuned`) that later processes read before
tuning: their first step launches at once instead of compiling and timing a dozen candidates
for each new shape.

::

    workshop tune                 # every case, written to ~/.cache/triton_workshop/tuned/<arch>.json
    workshop tune --quick         # the GPT-2 and Llama sizes only
    workshop tune --out FILE      # somewhere else (the package's own: runtime/tuned/<arch>.json)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import torch

from . import runtime
from .runtime import tuned


class Case(NamedTuple):
    """One op call to tune: ``run(device, dtype)`` calls the op forward and backward."""

    name: str
    run: Callable[[torch.device, torch.dtype], None]
    quick: bool = True


def _backward(out: torch.Tensor) -> None:
    out.backward(torch.randn_like(out))


def linear_case(m: int, k: int, n: int, activation: str | None) -> Callable:
    def run(device, dtype):
        from .ops.matmul import linear

        x = torch.randn(m, k, device=device, dtype=dtype, requires_grad=True)
        w = (torch.randn(n, k, device=device, dtype=dtype) / k**0.5).requires_grad_()
        b = torch.randn(n, device=device, dtype=dtype, requires_grad=True)
        _backward(linear(x, w, b, activation))

    return run


def attention_case(b: int, h: int, h_kv: int, n: int, d: int, causal: bool) -> Callable:
    def run(device, dtype):
        from .ops.attention import attention

        q = torch.randn(b, h, n, d, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(b, h_kv, n, d, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn(b, h_kv, n, d, device=device, dtype=dtype, requires_grad=True)
        _backward(attention(q, k, v, causal=causal))

    return run


def conv_case(n: int, c: int, f: int, hw: int, kernel: int, stride: int, channels_last: bool):
    def run(device, dtype):
        from .ops.conv import conv2d

        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        x = torch.randn(n, c, hw, hw, device=device, dtype=dtype).to(memory_format=memory_format)
        w = torch.randn(f, c, kernel, kernel, device=device, dtype=dtype) / (c * kernel**2) ** 0.5
        x.requires_grad_()
        w = w.to(memory_format=memory_format).requires_grad_()
        _backward(conv2d(x, w, None, stride, kernel // 2))

    return run


def cases() -> list[Case]:
    """The sizes of the models in ``workshop bench models`` (and their neighbours in the same
    power-of-two buckets, which share a table entry)."""
    out: list[Case] = []
    # (tokens, hidden, [(in, out) of the projections with a fused activation or none]).
    for tokens, label in ((2048, "GPT-2 4x512"), (4096, "GPT-2 8x512"), (8192, "8k tokens")):
        for k, n, act in ((768, 3072, "gelu"), (768, 2304, None), (768, 768, None),
                          (3072, 768, None), (1024, 4096, "gelu"), (2048, 8192, "gelu")):
            out.append(Case(f"linear {tokens}x{k}->{n} {act or ''} ({label})",
                            linear_case(tokens, k, n, act), quick=tokens != 4096))
    for b, h, h_kv, n, d, causal in ((4, 12, 12, 512, 64, True), (8, 12, 12, 1024, 64, True),
                                     (8, 16, 4, 1024, 64, True), (4, 32, 8, 2048, 64, True),
                                     (4, 16, 16, 1024, 128, True), (2, 16, 16, 1024, 128, False)):
        out.append(Case(f"attention B{b} H{h}/{h_kv} N{n} D{d}{' causal' if causal else ''}",
                        attention_case(b, h, h_kv, n, d, causal)))
    for c, f, hw, kernel, stride in ((3, 64, 160, 7, 2), (64, 64, 40, 3, 1), (64, 128, 40, 3, 2),
                                     (128, 128, 20, 3, 1), (128, 256, 20, 3, 2),
                                     (256, 256, 10, 3, 1), (256, 512, 10, 3, 2),
                                     (512, 512, 5, 3, 1)):
        for channels_last in (True, False):
            out.append(Case(f"conv2d 32x{c}x{hw}² -> {f} {kernel}x{kernel}/{stride}"
                            f"{' channels-last' if channels_last else ''}",
                            conv_case(32, c, f, hw, kernel, stride, channels_last), quick=False))
    return out


def run_cases(selected: Iterable[Case], dtypes: Iterable[torch.dtype], device: torch.device,
              say: Callable[[str], None] = print) -> list[tuple[str, str, float, str | None]]:
    """Run each case in each dtype; returns (case, dtype, seconds, error or None) rows. A case
    that fails is reported and skipped: the others still tune."""
    rows = []
    for case in selected:
        for dtype in dtypes:
            start = time.perf_counter()
            error = None
            try:
                case.run(device, dtype)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as exc:  # noqa: BLE001 - one failing size must not stop the rest
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            seconds = time.perf_counter() - start
            rows.append((case.name, str(dtype).removeprefix("torch."), seconds, error))
            say(f"  {case.name:<52} {rows[-1][1]:<9} {seconds:6.1f} s"
                f"{'  FAILED ' + error if error else ''}")
    return rows


def default_out(arch: str) -> Path:
    return tuned.user_dir() / f"{arch}.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="workshop tune",
        description="Tune the autotuned kernels on this GPU and keep the winners as a table that "
                    "later runs read before tuning (their first step then launches at once).")
    p.add_argument("--quick", action="store_true", help="the GPT-2 and Llama sizes only")
    p.add_argument("--dtypes", default="bfloat16,float16",
                   help="comma-separated dtypes to tune (default: %(default)s)")
    p.add_argument("--out", type=Path, help="the table to write (default: the user's, read "
                   "before the package's own: $TRITON_WORKSHOP_TUNED_DIR/<arch>.json)")
    p.add_argument("--replace", action="store_true",
                   help="write only this run's entries (default: keep the file's other keys)")
    p.add_argument("-k", dest="pattern", default="", help="only cases whose name contains this")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if runtime.INTERPRET or not torch.cuda.is_available():
        print("workshop tune: needs a CUDA GPU (kernels run in Triton's interpreter here, where "
              "nothing can be timed); nothing written.", file=sys.stderr)
        return 2
    try:
        dtypes = [getattr(torch, name.strip()) for name in args.dtypes.split(",") if name.strip()]
    except AttributeError as exc:
        print(f"workshop tune: --dtypes: unknown dtype ({exc})", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_WORKSHOP_AUTOTUNE", "1") == "0":
        print("workshop tune: TRITON_WORKSHOP_AUTOTUNE=0 gives each kernel one candidate; unset "
              "it to tune.", file=sys.stderr)
        return 2
    os.environ["TRITON_WORKSHOP_TUNED"] = "0"  # every candidate timed, whatever the tables say
    device = torch.device("cuda", torch.cuda.current_device())
    arch = tuned.device_arch(device)
    gpu = torch.cuda.get_device_name(device)
    selected = [c for c in cases() if (c.quick or not args.quick) and args.pattern in c.name]
    print(f"workshop tune: {len(selected)} cases x {len(dtypes)} dtypes on {gpu} ({arch})")
    start = time.perf_counter()
    rows = run_cases(selected, dtypes, device)
    kernels = tuned.snapshot()
    out = args.out or default_out(arch)
    tuned.write_table(out, kernels, arch=arch, gpu=gpu, merge=not args.replace)
    entries = sum(len(v) for v in kernels.values())
    failed = sum(1 for r in rows if r[3])
    print(f"workshop tune: {entries} tuned keys of {len(kernels)} kernels written to {out} in "
          f"{time.perf_counter() - start:.0f} s{f'; {failed} case(s) failed' if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
