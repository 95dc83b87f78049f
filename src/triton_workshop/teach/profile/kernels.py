"""The kernels of one call: occupancy from their resources (registers, shared memory, warps),
what the profiler's trace saw of their launches, their compiled metadata, and the ncu command.
"""

from __future__ import annotations

import gc
import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from .targets import Plan, dtype_name

__all__ = ["DeviceLimits", "KernelInfo", "Occupancy", "compiled_triton_kernels", "export_trace",
           "find_compiled", "kernel_info", "kernels_by_annotation", "ncu_command", "occupancy",
           "uses_tensor_cores", "waves"]


@dataclass(frozen=True)
class DeviceLimits:
    """Per-multiprocessor limits that bound occupancy (an H100's by default)."""

    sms: int = 132
    max_threads_per_sm: int = 2048
    regs_per_sm: int = 65536
    shared_per_sm: int = 233472  # bytes usable by blocks (228 KiB)
    max_blocks_per_sm: int = 32
    reg_alloc_unit: int = 256  # registers are handed to a warp in chunks of this many
    shared_reserved_per_block: int = 1024  # the driver keeps 1 KiB per block
    warp_size: int = 32

    @classmethod
    def of_device(cls, device: int | torch.device | None = None) -> "DeviceLimits":
        props = torch.cuda.get_device_properties(device if device is not None else 0)
        default = cls()
        return cls(
            sms=props.multi_processor_count,
            max_threads_per_sm=getattr(props, "max_threads_per_multi_processor",
                                       default.max_threads_per_sm),
            regs_per_sm=getattr(props, "regs_per_multiprocessor", default.regs_per_sm),
            shared_per_sm=getattr(props, "shared_memory_per_multiprocessor",
                                  default.shared_per_sm),
            warp_size=getattr(props, "warp_size", default.warp_size),
        )


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    fraction: float  # of the multiprocessor's warp slots
    limiter: str  # "registers", "shared memory", "threads" or "blocks"


def occupancy(regs_per_thread: int, shared_bytes: int, num_warps: int,
              limits: DeviceLimits = DeviceLimits()) -> Occupancy:
    """How many programs (thread blocks) fit on one multiprocessor at once, and what stops more."""
    if num_warps < 1:
        raise ValueError(f"num_warps must be at least 1, got {num_warps}")
    max_warps = limits.max_threads_per_sm // limits.warp_size
    regs_per_warp = math.ceil(max(regs_per_thread, 1) * limits.warp_size
                              / limits.reg_alloc_unit) * limits.reg_alloc_unit
    bounds = {
        "threads": max_warps // num_warps,
        "registers": (limits.regs_per_sm // regs_per_warp) // num_warps,
        "blocks": limits.max_blocks_per_sm,
    }
    if shared_bytes > 0:  # without shared memory that bound never binds
        bounds["shared memory"] = (limits.shared_per_sm
                                   // (shared_bytes + limits.shared_reserved_per_block))
    limiter = min(bounds, key=lambda k: (bounds[k], list(bounds).index(k)))
    blocks = bounds[limiter]
    return Occupancy(blocks, blocks * num_warps, blocks * num_warps / max_warps, limiter)


def waves(programs: int, blocks_per_sm: int, sms: int) -> float:
    """How many rounds of programs the grid takes when every SM holds ``blocks_per_sm``."""
    return programs / max(1, blocks_per_sm * sms)


@dataclass
class KernelInfo:
    name: str
    grid: tuple[int, ...] | None = None
    threads: int | None = None
    regs: int | None = None
    spills: int | None = None
    shared: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    tensor_cores: bool | None = None
    gpu_us: float | None = None

    @property
    def programs(self) -> int | None:
        return math.prod(self.grid) if self.grid else None


def uses_tensor_cores(ptx: str) -> bool:
    """The PTX has matrix-multiply-accumulate instructions (Ampere mma.sync, Hopper wgmma,
    Blackwell tcgen05.mma)."""
    return any(op in ptx for op in ("mma.sync", "wgmma.", "tcgen05.mma"))


def kernel_info(event: dict, compiled=None) -> KernelInfo:
    """A kernel launch as the profiler recorded it (``event``, a chrome-trace event), completed
    from the compiled kernel's metadata when it was found (``n_regs``, ``n_spills``,
    ``metadata.shared``, warps, stages, PTX)."""
    args = event.get("args", {})
    info = KernelInfo(
        name=event.get("name", "?"),
        grid=tuple(args["grid"]) if "grid" in args else None,
        threads=math.prod(args["block"]) if "block" in args else None,
        regs=args.get("registers per thread"),
        shared=args.get("shared memory"),
        gpu_us=event.get("dur"),
    )
    if compiled is not None:
        meta = getattr(compiled, "metadata", None)
        info.regs = getattr(compiled, "n_regs", None) or info.regs
        info.spills = getattr(compiled, "n_spills", None)
        info.shared = getattr(meta, "shared", info.shared)
        info.num_warps = getattr(meta, "num_warps", None)
        info.num_stages = getattr(meta, "num_stages", None)
        asm = getattr(compiled, "asm", {}) or {}
        ptx = asm.get("ptx", "") if hasattr(asm, "get") else ""
        info.tensor_cores = uses_tensor_cores(ptx) if ptx else None
    if info.num_warps is None and info.threads:
        info.num_warps = max(1, info.threads // 32)
    return info


def export_trace(calls: Sequence[tuple[str, Callable[[], object]]], path: str | Path, *,
                 cuda: bool | None = None) -> Path:
    """Run each ``(label, fn)`` once under ``torch.profiler``, each inside a range named
    ``label``, and write the chrome trace JSON (chrome://tracing, https://ui.perfetto.dev)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available() if cuda is None else cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for label, fn in calls:
            with record_function(label):
                fn()
                if cuda:
                    torch.cuda.synchronize()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


def kernels_by_annotation(trace: dict | list | str | Path,
                          labels: Sequence[str]) -> dict[str, list[dict]]:
    """The GPU kernel events of a chrome trace, grouped by the ``record_function`` range (one of
    ``labels``) their start falls in; kernels outside every range go under ``"other"``. The
    ranges the profiler mapped onto the GPU timeline are used where present, the CPU ones
    otherwise (the calls synchronise inside their range, so their kernels run within it)."""
    if isinstance(trace, (str, Path)):
        trace = json.loads(Path(trace).read_text())
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else list(trace)
    ranges: dict[str, list[tuple[float, float]]] = {}
    for category in ("gpu_user_annotation", "user_annotation"):
        for label in labels:
            if label in ranges:
                continue
            found = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                     if e.get("cat") == category and e.get("name") == label and "ts" in e]
            if found:
                ranges[label] = found
    grouped: dict[str, list[dict]] = {label: [] for label in labels}
    grouped["other"] = []
    for event in events:
        if event.get("cat") != "kernel" or "ts" not in event:
            continue
        start = float(event["ts"])
        owner = next((label for label in labels
                      if any(lo <= start <= hi for lo, hi in ranges.get(label, ()))), "other")
        grouped[owner].append(event)
    for kernels in grouped.values():
        kernels.sort(key=lambda e: float(e["ts"]))
    return grouped


def find_compiled(event: dict, candidates: Sequence) -> object | None:
    """The compiled Triton kernel behind a profiled launch: same name, then the same threads per
    program, registers and shared memory as the profiler recorded (an autotuned kernel has one
    compiled variant per config, all with the same name)."""
    args = event.get("args", {})
    same_name = [k for k in candidates if getattr(k, "name", None) == event.get("name")]
    if not same_name:
        return None

    def score(kernel) -> int:
        meta = getattr(kernel, "metadata", None)
        points = 0
        if "block" in args and getattr(meta, "num_warps", None) is not None:
            points += 4 * (meta.num_warps * getattr(meta, "warp_size", 32) == math.prod(args["block"]))
        if "registers per thread" in args:
            points += 2 * (getattr(kernel, "n_regs", None) == args["registers per thread"])
        if "shared memory" in args:
            points += getattr(meta, "shared", None) == args["shared memory"]
        return points

    return max(same_name, key=score)


def compiled_triton_kernels() -> list:
    """Every compiled Triton kernel this process holds (whichever JIT function, module or cache
    it hangs from)."""
    return [obj for obj in gc.get_objects()
            if type(obj).__name__ == "CompiledKernel" and hasattr(obj, "metadata")]


def ncu_command(plan: Plan, kernel_names: Sequence[str], out_dir: str | Path) -> str:
    """Nsight Compute on the same launch: the command re-runs this profile with ``--run-once``,
    which brackets one call (after compiling and tuning) with cudaProfilerStart/Stop."""
    names = sorted(set(kernel_names)) or [plan.target.name]
    report = Path(out_dir) / f"ncu-{plan.spec}"
    argv = ["ncu", "--set", "full", "--import-source", "yes", "--profile-from-start", "off",
            "-k", "regex:" + "|".join(re.escape(n) for n in names), "-o", str(report),
            "workshop", "profile", plan.spec, "--size", plan.size_text,
            "--dtype", dtype_name(plan.dtype), "--run-once"]
    if plan.solution:
        argv.append("--solution")
    return shlex.join(argv)
