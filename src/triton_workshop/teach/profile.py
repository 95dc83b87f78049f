"""``workshop profile OP_OR_EXERCISE [--size ...] [--dtype ...]``: where one kernel's time goes.

On a GPU it runs one op of the library (``matmul``, ``layer_norm``, ...) or the kernel of an
exercise (``6``: the learner's ``exercises/exercise_6.py``, ``--solution`` for the reference) at one
size, and shows:

* per kernel launched: registers per thread, spilled registers, shared memory, warps and pipeline
  stages, whether the tensor cores run (``mma`` instructions in the PTX), the occupancy bound
  those imply and the grid, in waves over the multiprocessors (from the compiled kernel's
  metadata, and the profiler's record of the launch);
* the bytes the op must move and the FLOPs it must do, the achieved GB/s and TFLOP/s, against two
  ceilings measured on the spot: the copy bandwidth and cuBLAS's matmul; the verdict, memory- or
  compute-bound, and a roofline PNG;
* a ``torch.profiler`` trace of one call next to the torch op it replaces (chrome trace JSON, for
  chrome://tracing or https://ui.perfetto.dev);
* the ``ncu`` command line that profiles the same launch in depth.

Without a GPU it says what it would show and why it cannot, with the work it *can* count (bytes,
FLOPs, arithmetic intensity), and exits 2. Every piece that needs no GPU (the work per op, the
occupancy arithmetic, the verdict, the roofline picture, reading a trace) is a plain function
tested on the CPU; :func:`run_profile` strings them together.
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
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from .. import runtime

__all__ = [
    "TARGETS", "EXERCISE_TARGETS", "Target", "Plan", "Roofline", "DeviceLimits", "Occupancy",
    "KernelInfo", "resolve", "parse_size", "parse_dtype", "work", "occupancy", "waves",
    "roofline_png", "export_trace", "kernels_by_annotation", "kernel_info", "ncu_command",
    "describe_without_gpu", "run_profile",
]

DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ----------------------------------------------------------------------------------------------
# What can be profiled, and the work each op must do.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """An op: its inputs at a size, the library's version and torch's, and its minimum work.

    ``bytes_moved(size, itemsize)`` counts each input read once and the output written once (the
    least any implementation must move); ``flops(size)`` the arithmetic, a multiply-add as 2.
    """

    name: str
    size_names: tuple[str, ...]
    default_size: tuple[int, ...]
    default_dtype: torch.dtype
    make_inputs: Callable[[tuple, torch.dtype, torch.device, torch.Generator], tuple]
    ours: Callable[..., torch.Tensor]
    torch_op: Callable[..., torch.Tensor]
    torch_name: str
    bytes_moved: Callable[[tuple, int], int]
    flops: Callable[[tuple], int]
    work_note: str


def _randn(gen, shape, dtype, device):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def _rand(gen, shape, dtype, device):
    return torch.rand(*shape, generator=gen).to(device=device, dtype=dtype)


_GREY = (0.299, 0.587, 0.114)
_SEPIA = ((0.393, 0.769, 0.189), (0.349, 0.686, 0.168), (0.272, 0.534, 0.131))


def _torch_greyscale(img):
    return torch.einsum("c,chw->hw", torch.tensor(_GREY, dtype=img.dtype, device=img.device), img)


def _torch_sepia(img):
    m = torch.tensor(_SEPIA, dtype=img.dtype, device=img.device)
    return torch.einsum("oc,chw->ohw", m, img).clamp(max=1.0)


def _torch_filter2d(img, kernel):
    k = kernel.shape[-1]
    weight = kernel.to(img.dtype).expand(img.shape[0], 1, k, k)
    return F.conv2d(img[None], weight, padding=k // 2, groups=img.shape[0])[0]


def _lib(name):
    """The library op ``triton_workshop.<name>``, imported when first called (profile.py is
    imported by the command line before it knows whether it will launch anything)."""
    def call(*args, **kwargs):
        import triton_workshop

        return getattr(triton_workshop, name)(*args, **kwargs)

    call.__name__ = name
    return call


def _layer_norm_ours(x, w, b):
    return _lib("layer_norm")(x, (x.shape[-1],), w, b)


def _conv_inputs(size, dtype, device, gen):
    n, c, h, w, oc, k = size
    return _randn(gen, (n, c, h, w), dtype, device), _randn(gen, (oc, c, k, k), dtype, device) * 0.1


def _conv_ours(x, weight):
    return _lib("conv2d")(x, weight, padding=weight.shape[-1] // 2)


def _conv_torch(x, weight):
    return F.conv2d(x, weight, padding=weight.shape[-1] // 2)


_ELEMENTWISE = "each input read once, the output written once"

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("add", ("n",), (1 << 26,), torch.float32,
           lambda s, d, dev, g: (_randn(g, s, d, dev), _randn(g, s, d, dev)),
           _lib("add"), torch.add, "torch.add",
           lambda s, b: 3 * s[0] * b, lambda s: s[0], _ELEMENTWISE + "; 1 FLOP per element"),
    Target("fused_mul_add_sqrt", ("n",), (1 << 26,), torch.float32,
           lambda s, d, dev, g: tuple(_rand(g, s, d, dev) for _ in range(3)),
           _lib("fused_mul_add_sqrt"), lambda a, b, c: torch.sqrt(a * b + c),
           "torch.sqrt(a * b + c)",
           lambda s, b: 4 * s[0] * b, lambda s: 3 * s[0],
           _ELEMENTWISE + "; multiply, add, square root: 3 FLOPs per element"),
    Target("greyscale", ("H", "W"), (4096, 4096), torch.float32,
           lambda s, d, dev, g: (_rand(g, (3, *s), d, dev),),
           _lib("greyscale"), _torch_greyscale, "torch.einsum",
           lambda s, b: 4 * s[0] * s[1] * b, lambda s: 5 * s[0] * s[1],
           "3 planes read, 1 written; 3 multiplies and 2 adds per pixel"),
    Target("sepia", ("H", "W"), (4096, 4096), torch.float32,
           lambda s, d, dev, g: (_rand(g, (3, *s), d, dev),),
           _lib("sepia"), _torch_sepia, "torch.einsum + clamp",
           lambda s, b: 6 * s[0] * s[1] * b, lambda s: 18 * s[0] * s[1],
           "3 planes read, 3 written; a 3x3 matrix (15 FLOPs) and 3 clips per pixel"),
    Target("filter2d", ("H", "W", "K"), (4096, 4096, 5), torch.float32,
           lambda s, d, dev, g: (_rand(g, (3, s[0], s[1]), d, dev),
                                 _randn(g, (s[2], s[2]), torch.float32, dev)),
           _lib("filter2d"), _torch_filter2d, "F.conv2d (groups=3)",
           lambda s, b: 6 * s[0] * s[1] * b + s[2] * s[2] * 4,
           lambda s: 2 * 3 * s[0] * s[1] * s[2] * s[2],
           "3 planes read once and written once (the taps' overlap comes from the cache); "
           "a multiply-add per tap per pixel"),
    Target("softmax", ("rows", "cols"), (8192, 8192), torch.float16,
           lambda s, d, dev, g: (_randn(g, s, d, dev),),
           _lib("softmax"), lambda x: torch.softmax(x, dim=-1), "torch.softmax",
           lambda s, b: 2 * s[0] * s[1] * b, lambda s: 5 * s[0] * s[1],
           _ELEMENTWISE + "; max, subtract, exp, sum, divide: 5 FLOPs per element"),
    Target("layer_norm", ("rows", "cols"), (8192, 4096), torch.float16,
           lambda s, d, dev, g: (_randn(g, s, d, dev), _randn(g, (s[1],), d, dev),
                                 _randn(g, (s[1],), d, dev)),
           _layer_norm_ours, lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
           "F.layer_norm",
           lambda s, b: (2 * s[0] * s[1] + 2 * s[1]) * b, lambda s: 7 * s[0] * s[1],
           "x read and y written once, weight and bias once; sum, subtract, square, sum, "
           "scale, multiply, add: 7 FLOPs per element"),
    Target("matmul", ("M", "N", "K"), (4096, 4096, 4096), torch.float16,
           lambda s, d, dev, g: (_randn(g, (s[0], s[2]), d, dev), _randn(g, (s[2], s[1]), d, dev)),
           _lib("matmul"), torch.matmul, "torch.matmul (cuBLAS)",
           lambda s, b: (s[0] * s[2] + s[2] * s[1] + s[0] * s[1]) * b,
           lambda s: 2 * s[0] * s[1] * s[2],
           "A, B read once and C written once; a multiply-add per (m, n, k)"),
    Target("attention", ("B", "H", "N", "D"), (4, 32, 4096, 128), torch.float16,
           lambda s, d, dev, g: tuple(_randn(g, s, d, dev) for _ in range(3)),
           _lib("attention"), F.scaled_dot_product_attention, "F.scaled_dot_product_attention",
           lambda s, b: 4 * s[0] * s[1] * s[2] * s[3] * b,
           lambda s: 4 * s[0] * s[1] * s[2] * s[2] * s[3],
           "q, k, v read once, the output written once (the scores never reach memory); "
           "two N x N x D products per head"),
    Target("conv2d", ("N", "C", "H", "W", "OC", "K"), (32, 64, 56, 56, 64, 3), torch.float16,
           _conv_inputs, _conv_ours, _conv_torch, "F.conv2d (cuDNN)",
           lambda s, b: (s[0] * s[1] * s[2] * s[3] + s[4] * s[1] * s[5] ** 2
                         + s[0] * s[4] * s[2] * s[3]) * b,
           lambda s: 2 * s[0] * s[4] * s[2] * s[3] * s[1] * s[5] ** 2,
           "input, weight read once, output written once (stride 1, same padding); a "
           "multiply-add per output pixel per input channel per tap"),
)}


def _exercise_call(function: str, adapt: Callable | None = None):
    def call(module, *inputs):
        fn = getattr(module, function)
        return adapt(fn, *inputs) if adapt else fn(*inputs)

    return call


#: exercise number -> (target, how to call the exercise's launcher on the target's inputs)
EXERCISE_TARGETS: dict[int, tuple[str, Callable]] = {
    1: ("add", _exercise_call("add")),
    2: ("greyscale", _exercise_call("greyscale")),
    3: ("filter2d", _exercise_call("filter2d")),
    4: ("matmul", _exercise_call("matmul")),
    5: ("softmax", _exercise_call("softmax")),
    6: ("layer_norm", _exercise_call("layer_norm")),
    7: ("matmul", _exercise_call("matmul")),
    8: ("attention", _exercise_call("attention")),
}


def parse_dtype(text: str | None, target: Target) -> torch.dtype:
    if text is None:
        return target.default_dtype
    dtype = DTYPES.get(text.strip().lower())
    if dtype is None:
        raise ValueError(f"--dtype must be one of float16, bfloat16, float32, got {text!r}")
    return dtype


def parse_size(text: str | None, target: Target) -> tuple[int, ...]:
    """``"4096,4096,4096"`` (or ``4096x4096x4096``) as a tuple, one number per size name."""
    if text is None:
        return target.default_size
    parts = [p for p in re.split(r"[,x\s]+", text.strip()) if p]
    what = f"--size for {target.name} is {','.join(target.size_names)}"
    if len(parts) != len(target.size_names) or not all(p.isdigit() for p in parts):
        raise ValueError(f"{what} ({len(target.size_names)} whole numbers), got {text!r}")
    size = tuple(int(p) for p in parts)
    if min(size) < 1:
        raise ValueError(f"{what}, each at least 1, got {text!r}")
    return size


def work(target: Target, size: Sequence[int], dtype: torch.dtype) -> tuple[int, int]:
    """(bytes moved, FLOPs) of one call at ``size``."""
    size = tuple(size)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return int(target.bytes_moved(size, itemsize)), int(target.flops(size))


# ----------------------------------------------------------------------------------------------
# Which op or exercise: the plan.
# ----------------------------------------------------------------------------------------------
@dataclass
class Plan:
    spec: str  # what the user typed
    target: Target
    size: tuple[int, ...]
    dtype: torch.dtype
    exercise: int | None = None
    path: Path | None = None  # the exercise file
    solution: bool = False

    @property
    def label(self) -> str:
        if self.exercise is None:
            return f"triton_workshop.{self.target.name}"
        return f"{self.path.parent.name}/{self.path.name}" if self.path else f"exercise {self.exercise}"

    @property
    def size_text(self) -> str:
        return ",".join(map(str, self.size))

    def describe(self) -> str:
        names = ",".join(self.target.size_names)
        return (f"{self.label}, {dtype_name(self.dtype)}, {names} = {self.size_text}, "
                f"next to {self.target.torch_name}")


def resolve(spec: str, size: str | None = None, dtype: str | None = None,
            solution: bool = False) -> Plan:
    """The op or exercise ``spec`` names, at ``size`` (text) in ``dtype`` (text); clear
    ``ValueError``/``FileNotFoundError`` for anything wrong."""
    spec = str(spec).strip()
    if spec.isdigit():
        from . import EXERCISES, exercise_path

        number = int(spec)
        if number not in EXERCISE_TARGETS or number not in EXERCISES:
            raise ValueError(f"exercise must be one of {sorted(EXERCISE_TARGETS)}, got {number}: "
                             "`workshop list` lists them")
        target = TARGETS[EXERCISE_TARGETS[number][0]]
        path = exercise_path(number, solution=solution)
        return Plan(spec, target, parse_size(size, target), parse_dtype(dtype, target), number,
                    path, solution)
    if spec not in TARGETS:
        raise ValueError(f"unknown op or exercise {spec!r}: choose an op ({', '.join(TARGETS)}) "
                         f"or an exercise number ({', '.join(map(str, EXERCISE_TARGETS))})")
    if solution:
        raise ValueError("--solution goes with an exercise number, not a library op")
    target = TARGETS[spec]
    return Plan(spec, target, parse_size(size, target), parse_dtype(dtype, target))


# ----------------------------------------------------------------------------------------------
# The roofline: achieved rates against the measured ceilings, and the verdict.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Roofline:
    """One call's work and time, against the copy bandwidth and the matmul ceiling."""

    bytes: int
    flops: int
    seconds: float
    copy_gbps: float  # measured copy bandwidth, bytes read + written per second / 1e9
    peak_tflops: float  # measured cuBLAS matmul rate in the same dtype

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    @property
    def ridge(self) -> float:
        """The intensity where the two ceilings meet: below it, bytes limit the speed."""
        return self.peak_tflops * 1e12 / (self.copy_gbps * 1e9)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def bound(self) -> str:
        return "memory" if self.intensity < self.ridge else "compute"

    @property
    def roof_tflops(self) -> float:
        """The best rate possible at this intensity."""
        return min(self.peak_tflops, self.intensity * self.copy_gbps / 1e3)

    @property
    def fraction_of_roof(self) -> float:
        return self.tflops / self.roof_tflops

    def verdict(self) -> str:
        if self.bound == "memory":
            text = (f"memory-bound: {self.intensity:.3g} FLOP/byte, below the ridge at "
                    f"{self.ridge:.0f} FLOP/byte, so the bytes set the time. {self.gbps:.0f} GB/s "
                    f"is {100 * self.gbps / self.copy_gbps:.0f}% of the copy bandwidth "
                    f"({self.copy_gbps:.0f} GB/s)")
        else:
            text = (f"compute-bound: {self.intensity:.3g} FLOP/byte, above the ridge at "
                    f"{self.ridge:.0f} FLOP/byte, so the arithmetic sets the time. "
                    f"{self.tflops:.1f} TFLOP/s is {100 * self.tflops / self.peak_tflops:.0f}% of "
                    f"cuBLAS's {self.peak_tflops:.0f} TFLOP/s")
        if self.fraction_of_roof < 0.5:
            text += (". Far below the roof: look at the occupancy bound, spills and the waves "
                     "of the grid above, then at ncu")
        return text


def roofline_png(path: str | Path, points: Sequence[tuple[str, Roofline]], *,
                 title: str = "") -> Path:
    """Draw the roofline of ``points[0]``'s ceilings with every point on it; returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not points:
        raise ValueError("points must name at least one measured call")
    first = points[0][1]
    intensities = [p.intensity for _, p in points] + [first.ridge]
    lo, hi = min(intensities) / 10, max(intensities) * 10
    steps = 200
    xs = [lo * (hi / lo) ** (i / (steps - 1)) for i in range(steps)]
    roof = [min(first.peak_tflops, x * first.copy_gbps / 1e3) for x in xs]

    fig = Figure(figsize=(7.5, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.loglog(xs, roof, color="black", linewidth=2,
              label=f"roof: copy {first.copy_gbps:.0f} GB/s, matmul {first.peak_tflops:.0f} TFLOP/s")
    ax.axvline(first.ridge, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {first.ridge:.0f} FLOP/B", (first.ridge, first.peak_tflops),
                textcoords="offset points", xytext=(5, -14), fontsize=8, color="grey")
    for (label, point), colour in zip(points, ("tab:green", "tab:blue", "tab:orange", "tab:red")):
        ax.loglog([point.intensity], [point.tflops], "o", color=colour, markersize=8,
                  label=f"{label}: {point.tflops:.3g} TFLOP/s, {point.gbps:.0f} GB/s")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or "roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


# ----------------------------------------------------------------------------------------------
# The kernels: occupancy from their resources, what the profiler saw of their launches.
# ----------------------------------------------------------------------------------------------
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
    from . import load_module

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
