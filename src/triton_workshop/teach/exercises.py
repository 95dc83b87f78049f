"""The exercises: what each one's launcher must compute, and the inputs it is checked on.

Every case draws fresh random data (never zeros) at ragged sizes: sizes that are not multiples of
the block, one smaller than a block, one square (so that a transposed result shows).
References are computed by PyTorch in float64 and rounded to the output dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .. import runtime
from ..ops.image import get_filter

GREY_WEIGHTS = (0.299, 0.587, 0.114)
SEPIA_MATRIX = (
    (0.393, 0.769, 0.189),
    (0.349, 0.686, 0.168),
    (0.272, 0.534, 0.131),
)


def greyscale_reference(img: torch.Tensor) -> torch.Tensor:
    w = torch.tensor(GREY_WEIGHTS, dtype=torch.float64, device=img.device)
    return torch.einsum("c,chw->hw", w, img.double()).to(img.dtype)


def sepia_reference(img: torch.Tensor) -> torch.Tensor:
    m = torch.tensor(SEPIA_MATRIX, dtype=torch.float64, device=img.device)
    return torch.einsum("oc,chw->ohw", m, img.double()).clamp(max=1.0).to(img.dtype)


def filter2d_reference(img: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    c, k = img.shape[0], kernel.shape[-1]
    weight = kernel.double().expand(c, 1, k, k)
    return F.conv2d(img.double()[None], weight, padding=k // 2, groups=c)[0].to(img.dtype)


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).to(a.dtype)


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.double(), -1).to(x.dtype)


@dataclass
class Case:
    label: str
    inputs: tuple
    reference: torch.Tensor
    kwargs: dict = field(default_factory=dict)
    dtype_note: str = ""


@dataclass(frozen=True)
class Suspect:
    """A classic mistake, recognised by its output: ``output(case)`` computes what a kernel with
    this bug would return on the case's inputs; when the learner's result matches it (and not
    the reference), the checker names the bug and gives ``advice``."""

    name: str
    advice: str
    output: Callable[[Case], torch.Tensor]


@dataclass
class Task:
    """One launcher an exercise asks for."""

    function: str  # name of the launcher in the learner's module
    make_cases: Callable[[torch.Generator, torch.device], list[Case]]
    block_attrs: Sequence[str]  # module constants giving the tile each program owns
    default_block: Sequence[int]
    program_axes: Sequence[str]
    leading_axis: str | None = None  # a grid axis over the leading dim (channels), if any
    matmul_operands: bool = False
    suspects: Sequence[Suspect] = ()  # classic mistakes recognised by their output


@dataclass
class Exercise:
    number: int
    name: str
    title: str
    lesson: str
    tasks: list[Task]

    @property
    def stem(self) -> str:
        return f"exercise_{self.number}"


def _rand(gen, *shape, dtype=torch.float32, device="cpu"):
    return torch.rand(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def _randn(gen, *shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def _vector_cases(gen, device):
    cases = []
    for n in (1000, 97, 4096, 3001):
        x, y = _randn(gen, n, device=device), _randn(gen, n, device=device)
        cases.append(Case(f"n={n}", (x, y), (x.double() + y.double()).float()))
    return cases


def _image_cases(reference):
    def make(gen, device):
        cases = []
        for h, w in ((37, 53), (64, 64), (5, 130)):
            img = _rand(gen, 3, h, w, device=device)
            cases.append(Case(f"3x{h}x{w}", (img,), reference(img)))
        return cases

    return make


def _filter_cases(gen, device):
    cases = []
    for (h, w), name in (((37, 53), "sharpen"), ((64, 64), "gaussian"), ((21, 70), "sobel_x"),
                         ((33, 33), "motion_blur")):
        img = _rand(gen, 3, h, w, device=device)
        kernel = get_filter(name, device=device)
        cases.append(Case(f"3x{h}x{w} {name}", (img, kernel), filter2d_reference(img, kernel)))
    return cases


def _matmul_cases(gen, device):
    cases = []
    shapes = [((67, 45, 83), torch.float32), ((64, 64, 64), torch.float32),
              ((50, 37, 100), torch.float16)]
    if not runtime.INTERPRET:  # bf16 tl.dot is wrong in the interpreter (triton#11584)
        shapes.append(((77, 90, 130), torch.bfloat16))
    for (m, k, n), dtype in shapes:
        a, b = _randn(gen, m, k, dtype=dtype, device=device), _randn(gen, k, n, dtype=dtype, device=device)
        cases.append(Case(f"{m}x{k} @ {k}x{n} {str(dtype).replace('torch.', '')}", (a, b),
                          matmul_reference(a, b)))
    return cases


# Exercise 5's programs each own one whole row: the checker's block is (1 row, SOFTMAX_MAX_COLS
# columns), which covers the longest row of the cases, so every wrong element maps to the program
# of its row (column block 0).
SOFTMAX_MAX_COLS = 2048


def _softmax_cases(gen, device):
    cases = []
    for (rows, cols), dtype, scale in (((37, 100), torch.float32, 1.0),
                                        ((64, 1500), torch.float32, 1.0),
                                        ((5, 3), torch.float32, 1.0),
                                        ((16, 77), torch.float32, 1000.0),  # exp(x) overflows
                                        ((33, 70), torch.float16, 1.0)):
        assert cols <= SOFTMAX_MAX_COLS
        x = (_randn(gen, rows, cols) * scale).to(device=device, dtype=dtype)
        label = f"{rows}x{cols}" + (f" x{scale:g}" if scale != 1.0 else "") + (
            f" {str(dtype).replace('torch.', '')}" if dtype != torch.float32 else "")
        cases.append(Case(label, (x,), softmax_reference(x)))
    return cases


EXERCISES: dict[int, Exercise] = {
    1: Exercise(
        1, "vector_add", "Vector addition",
        "1-D grid, offsets from the program id, masks for the partial last block",
        [Task("add", _vector_cases, ["BLOCK_SIZE"], [128], ["pid"])],
    ),
    2: Exercise(
        2, "image_filters", "Greyscale and sepia",
        "2-D grid, broadcasting row and column offsets, channel planes",
        [
            Task("greyscale", _image_cases(greyscale_reference), ["BLOCK_H", "BLOCK_W"], [16, 32],
                 ["pid_0 (rows)", "pid_1 (cols)"]),
            Task("sepia", _image_cases(sepia_reference), ["BLOCK_H", "BLOCK_W"], [16, 32],
                 ["pid_0 (rows)", "pid_1 (cols)"], leading_axis="channel"),
        ],
    ),
    3: Exercise(
        3, "conv2d", "2-D convolution with a KxK filter",
        "3-D grid (channel, row block, column block), nested loops over the taps, zero border",
        [Task("filter2d", _filter_cases, ["BLOCK_H", "BLOCK_W"], [16, 32],
              ["pid_1 (rows)", "pid_2 (cols)"], leading_axis="channel (pid_0)")],
    ),
    4: Exercise(
        4, "matmul", "Tiled matrix multiplication",
        "tiles, a K loop, float32 accumulators, tl.dot, and respecting the data types",
        [Task("matmul", _matmul_cases, ["BLOCK_M", "BLOCK_N"], [32, 32],
              ["pid_m", "pid_n"], matmul_operands=True)],
    ),
    5: Exercise(
        5, "softmax", "Fused softmax",
        "one program per row, other=-inf padding, max subtraction, fp32 inside",
        [Task("softmax", _softmax_cases, ["BLOCK_ROWS", "SOFTMAX_MAX_COLS"], [1, SOFTMAX_MAX_COLS],
              ["pid (row)", "column block"])],
    ),
}
