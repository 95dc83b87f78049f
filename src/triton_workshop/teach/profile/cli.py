"""``workshop profile``'s run: on a GPU, the op measured, its kernels, its roofline, its trace;
without one, what it would show and why it cannot (exit code 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
from rich.console import Console
from rich.table import Table

from ... import runtime
from .kernels import (DeviceLimits, KernelInfo, compiled_triton_kernels, export_trace, find_compiled,
                      kernel_info, kernels_by_annotation, ncu_command, occupancy, waves)
from .roofline import Roofline, roofline_png
from .targets import EXERCISE_TARGETS, Plan, dtype_name, resolve, work

__all__ = ["COPY_BYTES", "describe_without_gpu", "measure_copy_gbps", "measure_matmul_tflops",
           "run_profile"]


# ----------------------------------------------------------------------------------------------
# Without a GPU: what it would show, and why it cannot.
# ----------------------------------------------------------------------------------------------
def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _fmt_flops(n: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} FLOP"


def describe_without_gpu(plan: Plan, console: Console) -> None:
    nbytes, flops = work(plan.target, plan.size, plan.dtype)
    console.print(f"[bold]workshop profile {plan.spec}[/bold]: {plan.describe()}", highlight=False)
    console.print(f"Work it must do: {_fmt_bytes(nbytes)} moved and {_fmt_flops(flops)}, "
                  f"{flops / nbytes:.3g} FLOP per byte ({plan.target.work_note}).",
                  highlight=False)
    console.print("On a GPU this command shows:", highlight=False)
    for line in (
        "per kernel: registers per thread, spilled registers, shared memory, warps and stages, "
        "whether the tensor cores run, the occupancy bound and the grid in waves over the SMs",
        "the achieved GB/s and TFLOP/s against the copy bandwidth and cuBLAS measured on the "
        "spot, the verdict memory- or compute-bound, and a roofline PNG",
        f"a torch.profiler trace of one call next to {plan.target.torch_name}, for "
        "chrome://tracing or ui.perfetto.dev",
        "the ncu command line to go deeper",
    ):
        console.print(f"  • {line}", highlight=False)
    reason = runtime.INTERPRET_REASON or "no CUDA device"
    fix = ("unset TRITON_INTERPRET and run it again" if "TRITON_INTERPRET" in reason
           else "run the same command on a machine with an NVIDIA GPU")
    console.print(f"❌ It cannot run here ({reason}): in interpreter mode kernels run as NumPy "
                  f"code on the CPU, with no registers, shared memory or GPU time to measure; "
                  f"{fix}.", highlight=False, markup=False)


# ----------------------------------------------------------------------------------------------
# On a GPU.
# ----------------------------------------------------------------------------------------------
#: The copy that measures the memory ceiling: this many bytes read and as many written per call.
COPY_BYTES = 1 << 29


def measure_copy_gbps(device: torch.device) -> float:
    import triton

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def measure_matmul_tflops(dtype: torch.dtype, device: torch.device) -> float:
    """cuBLAS's rate on a large square product in ``dtype`` (float16 for other dtypes)."""
    import triton

    dtype = dtype if dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float16
    n = 4096 if dtype == torch.float32 else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = triton.testing.do_bench(lambda: torch.matmul(a, b), return_mode="median")
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def _callable_for(plan: Plan) -> Callable:
    if plan.exercise is None:
        return plan.target.ours
    from ..learner_file import load_module

    module = load_module(plan.path, name=f"_workshop_profile_{plan.exercise}")
    call = EXERCISE_TARGETS[plan.exercise][1]
    return lambda *inputs: call(module, *inputs)


def _kernel_table(infos: Sequence[KernelInfo], limits: DeviceLimits) -> Table:
    table = Table(title="Kernels launched (one call)")
    for column in ("kernel", "grid", "warps", "regs/thread", "spills", "shared", "stages",
                   "tensor cores", "occupancy bound", "waves", "GPU time"):
        table.add_column(column)
    for k in infos:
        occ = (occupancy(k.regs, k.shared or 0, k.num_warps, limits)
               if k.regs is not None and k.num_warps else None)
        table.add_row(
            k.name[:40],
            "x".join(map(str, k.grid)) if k.grid else "?",
            str(k.num_warps or "?"),
            str(k.regs if k.regs is not None else "?"),
            ("[red]" + str(k.spills) + "[/red]") if k.spills else str(k.spills if k.spills is not None else "?"),
            _fmt_bytes(k.shared) if k.shared is not None else "?",
            str(k.num_stages or "-"),
            {True: "yes", False: "no", None: "?"}[k.tensor_cores],
            f"{occ.blocks_per_sm}/SM, {100 * occ.fraction:.0f}% ({occ.limiter})" if occ else "?",
            f"{waves(k.programs, occ.blocks_per_sm, limits.sms):.2f}" if occ and k.programs else "?",
            f"{k.gpu_us:.1f} µs" if k.gpu_us is not None else "?",
        )
    return table


def _profile_on_gpu(plan: Plan, out_dir: Path, run_once: bool, console: Console) -> int:
    import triton

    device = torch.device("cuda")
    inputs = plan.target.make_inputs(plan.size, plan.dtype, device,
                                     torch.Generator().manual_seed(0))
    try:
        ours = _callable_for(plan)
        result = ours(*inputs)  # compiles (and autotunes) before anything is measured
        torch.cuda.synchronize()
    except Exception as exc:  # the learner's kernel, or a size the op refuses
        console.print(f"❌ {plan.label} failed on these inputs: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}", markup=False)
        return 2 if isinstance(exc, (ValueError, TypeError)) else 1
    if run_once:  # under ncu --profile-from-start off: exactly one call is captured
        torch.cuda.profiler.start()
        ours(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        console.print(f"ran {plan.label} once inside cudaProfilerStart/Stop", highlight=False)
        return 0

    theirs = plan.target.torch_op
    expected = theirs(*inputs)
    tol = 2e-2 if plan.dtype in (torch.float16, torch.bfloat16) else 1e-4
    scale = expected.double().abs().max().clamp_min(1e-12)
    agree = isinstance(result, torch.Tensor) and result.shape == expected.shape and bool(
        ((result.double() - expected.double()).abs().max() / scale) <= tol)

    out_dir.mkdir(parents=True, exist_ok=True)
    ours_label = f"triton-workshop: {plan.label}"
    torch_label = f"torch: {plan.target.torch_name}"
    trace_path = export_trace([(ours_label, lambda: ours(*inputs)),
                               (torch_label, lambda: theirs(*inputs))],
                              out_dir / "trace.json", cuda=True)
    grouped = kernels_by_annotation(trace_path, [ours_label, torch_label])
    candidates = compiled_triton_kernels()
    infos = [kernel_info(e, find_compiled(e, candidates)) for e in grouped[ours_label]]
    limits = DeviceLimits.of_device(device)

    ms_ours = triton.testing.do_bench(lambda: ours(*inputs), return_mode="median")
    ms_torch = triton.testing.do_bench(lambda: theirs(*inputs), return_mode="median")
    copy_gbps = measure_copy_gbps(device)
    peak = measure_matmul_tflops(plan.dtype, device)
    nbytes, flops = work(plan.target, plan.size, plan.dtype)
    mine = Roofline(nbytes, flops, ms_ours * 1e-3, copy_gbps, peak)
    torch_point = Roofline(nbytes, flops, ms_torch * 1e-3, copy_gbps, peak)
    png = roofline_png(out_dir / "roofline.png",
                       [(plan.label, mine), (plan.target.torch_name, torch_point)],
                       title=f"{plan.target.name} {plan.size_text} {dtype_name(plan.dtype)} "
                             f"on {torch.cuda.get_device_name(device)}")

    console.rule(f"[bold]workshop profile {plan.spec}[/bold] · {runtime.mode_description()}")
    console.print(plan.describe(), highlight=False)
    if not agree:
        console.print(f"[yellow]the result differs from {plan.target.torch_name} by more than "
                      f"{tol:g} (relative): check it with workshop check first[/yellow]")
    console.print(_kernel_table(infos, limits))
    if not infos:
        console.print("(the profiler recorded no kernel for this call)")
    for k in infos:
        if k.spills:
            console.print(f"[red]{k.name} spills {k.spills} registers[/red] to local memory: "
                          "smaller tiles, fewer stages or fewer live values", highlight=False)
    console.print(f"Work per call: {_fmt_bytes(nbytes)} moved, {_fmt_flops(flops)} "
                  f"({plan.target.work_note})", highlight=False)
    console.print(f"Time per call (median): {ms_ours * 1e3:.1f} µs ours, {ms_torch * 1e3:.1f} µs "
                  f"{plan.target.torch_name} ({ms_torch / ms_ours:.2f}x)", highlight=False)
    console.print(f"Achieved: {mine.gbps:.0f} GB/s and {mine.tflops:.2f} TFLOP/s; ceilings "
                  f"measured now: copy {copy_gbps:.0f} GB/s, cuBLAS {dtype_name(plan.dtype)} "
                  f"{peak:.0f} TFLOP/s", highlight=False)
    console.print(f"[bold]Verdict:[/bold] {mine.verdict()}", highlight=False)
    console.print(f"Roofline: {png}", highlight=False)
    console.print(f"Trace: {trace_path} (open in chrome://tracing or https://ui.perfetto.dev)",
                  highlight=False)
    console.print("Deeper, with Nsight Compute:\n    "
                  + ncu_command(plan, [k.name for k in infos], out_dir), highlight=False,
                  markup=False)
    return 0


def run_profile(spec: str, size: str | None = None, dtype: str | None = None, *,
                out: str | Path | None = None, solution: bool = False, run_once: bool = False,
                console: Console | None = None) -> int:
    """``workshop profile``: 0 when profiled, 2 for bad input or no GPU (said in one sentence
    with the fix)."""
    console = console or Console()
    try:
        plan = resolve(spec, size, dtype, solution)
    except (ValueError, FileNotFoundError) as exc:
        console.print(f"❌ {exc}", markup=False, highlight=False)
        return 2
    if runtime.INTERPRET:
        describe_without_gpu(plan, console)
        return 2
    out_dir = Path(out) if out else Path("workshop-output") / f"profile-{plan.spec}"
    return _profile_on_gpu(plan, out_dir, run_once, console)
