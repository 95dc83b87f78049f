"""Exercises 1-5, the workshop's first part: what each launcher must compute and the inputs it is
checked on. Every case draws fresh random data (never zeros) at ragged sizes: sizes that are not
multiples of the block, one smaller than a block, one square (so that a transposed result shows).
References are computed by PyTorch in float64 and rounded to the output dtype
(:mod:`..references`); each task's classic mistakes live in :mod:`..diagnose`.
"""

from __future__ import annotations

import torch

from ... import runtime
from ..diagnose.conv2d import FILTER_SUSPECTS
from ..diagnose.image_filters import GREYSCALE_SUSPECTS, SEPIA_SUSPECTS
from ..diagnose.matmul import MATMUL_SUSPECTS
from ..diagnose.softmax import SOFTMAX_SUSPECTS
from ..diagnose.vector_add import VECTOR_SUSPECTS
from ..references import (filter2d_reference, greyscale_reference, matmul_reference,
                          sepia_reference, softmax_reference)
from .types import Case, Exercise, Task

__all__ = ["FP16_ONE_ROUNDING", "FP16_SOFTMAX_ONE_ROUNDING", "PART_ONE", "SOFTMAX_MAX_COLS"]


# (rtol, atol) for a float16 result rounded once from float32 arithmetic: one float16 ulp is at
# most 2**-10 of the value, plus float32's own error for values near zero.
FP16_ONE_ROUNDING = (1.5 * 2.0**-10, 1e-3)
# Softmax values reach float16's subnormals: there one ulp is 2**-24.
FP16_SOFTMAX_ONE_ROUNDING = (1.5 * 2.0**-10, 2.0**-23)


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
    # The filters alone, not the image ops: registering those on a GPU costs seconds.
    from ...ops.image_filters import get_filter

    cases = []
    # The named filters are symmetric or nearly so; a random 5x5 one shows a flipped, transposed
    # or shifted window that they would hide. The 5x5 filters' images are small, as each of their
    # programs runs 25 taps one after another in the interpreter: the gaussian's is square and a
    # whole number of blocks, the random one's has a partial block beside a full one.
    for (h, w), name in (((37, 53), "sharpen"), ((32, 32), "gaussian"), ((21, 40), "sobel_x"),
                         ((16, 33), "random 5x5")):
        img = _rand(gen, 3, h, w, device=device)
        if name.startswith("random"):
            kernel = (_rand(gen, 5, 5) - 0.3).to(device=device)
        else:
            kernel = get_filter(name, device=device)
        cases.append(Case(f"3x{h}x{w} {name}", (img, kernel), filter2d_reference(img, kernel)))
    return cases


def _matmul_cases(gen, device):
    cases = []
    shapes = [((67, 45, 83), torch.float32), ((64, 64, 64), torch.float32),
              ((50, 37, 100), torch.float16), ((40, 1100, 36), torch.float16)]
    if not runtime.INTERPRET:  # bf16 tl.dot is wrong in the interpreter (triton#11584)
        shapes.append(((77, 90, 130), torch.bfloat16))
    for (m, k, n), dtype in shapes:
        a, b = _randn(gen, m, k, dtype=dtype, device=device), _randn(gen, k, n, dtype=dtype, device=device)
        # A long K shows a float16 accumulator: a float32 one rounds once, on the store, so the
        # result is within one float16 ulp of the exact product; float16 sums drift by several.
        tolerance = FP16_ONE_ROUNDING if dtype == torch.float16 and k >= 1024 else None
        cases.append(Case(f"{m}x{k} @ {k}x{n} {str(dtype).replace('torch.', '')}", (a, b),
                          matmul_reference(a, b), tolerance=tolerance))
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
                                        ((33, 70), torch.float16, 8.0)):
        assert cols <= SOFTMAX_MAX_COLS
        x = (_randn(gen, rows, cols) * scale).to(device=device, dtype=dtype)
        label = f"{rows}x{cols}" + (f" x{scale:g}" if scale != 1.0 else "") + (
            f" {str(dtype).replace('torch.', '')}" if dtype != torch.float32 else "")
        # float16 with a wide spread of values: x - max computed in float16 rounds the exponent
        # by up to 2**-8 (errors of several ulps); done in float32, the result is one rounding
        # from exact.
        tolerance = FP16_SOFTMAX_ONE_ROUNDING if dtype == torch.float16 else None
        cases.append(Case(label, (x,), softmax_reference(x), tolerance=tolerance))
    return cases


PART_ONE: dict[int, Exercise] = {
    1: Exercise(
        1, "vector_add", "Vector addition",
        "1-D grid, offsets from the program id, masks for the partial last block",
        [Task("add", _vector_cases, ["BLOCK_SIZE"], [128], ["pid"], suspects=VECTOR_SUSPECTS)],
    ),
    2: Exercise(
        2, "image_filters", "Greyscale and sepia",
        "2-D grid, broadcasting row and column offsets, channel planes",
        [
            Task("greyscale", _image_cases(greyscale_reference), ["BLOCK_H", "BLOCK_W"], [16, 32],
                 ["pid_0 (rows)", "pid_1 (cols)"], suspects=GREYSCALE_SUSPECTS),
            Task("sepia", _image_cases(sepia_reference), ["BLOCK_H", "BLOCK_W"], [16, 32],
                 ["pid_0 (rows)", "pid_1 (cols)"], leading_axis="channel", suspects=SEPIA_SUSPECTS),
        ],
    ),
    3: Exercise(
        3, "conv2d", "2-D convolution with a KxK filter",
        "3-D grid (channel, row block, column block), nested loops over the taps, zero border",
        [Task("filter2d", _filter_cases, ["BLOCK_H", "BLOCK_W"], [16, 32],
              ["pid_1 (rows)", "pid_2 (cols)"], leading_axis="channel (pid_0)",
              suspects=FILTER_SUSPECTS)],
    ),
    4: Exercise(
        4, "matmul", "Tiled matrix multiplication",
        "tiles, a K loop, float32 accumulators, tl.dot, and respecting the data types",
        [Task("matmul", _matmul_cases, ["BLOCK_M", "BLOCK_N"], [32, 32],
              ["pid_m", "pid_n"], matmul_operands=True, suspects=MATMUL_SUSPECTS,
              constants=["BLOCK_K"])],
    ),
    5: Exercise(
        5, "softmax", "Fused softmax",
        "one program per row, other=-inf padding, max subtraction, fp32 inside",
        [Task("softmax", _softmax_cases, ["BLOCK_ROWS", "SOFTMAX_MAX_COLS"], [1, SOFTMAX_MAX_COLS],
              ["pid (row)", "column block"], suspects=SOFTMAX_SUSPECTS)],
    ),
}
