"""What can be profiled (the library's ops and the exercises' kernels), at which size and dtype,
and the work each op must do: the bytes it must move and the FLOPs it must do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = ["DTYPES", "EXERCISE_TARGETS", "TARGETS", "Plan", "Target", "dtype_name", "parse_dtype",
           "parse_size", "resolve", "work"]


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
        from ..exercises import EXERCISES
        from ..session import exercise_path

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
