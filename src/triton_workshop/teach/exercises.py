"""The exercises: what each one's launcher must compute, and the inputs it is checked on.

Every case draws fresh random data (never zeros) at ragged sizes: sizes that are not multiples of
the block, one smaller than a block, one square (so that a transposed result shows).
References are computed by PyTorch in float64 and rounded to the output dtype.
"""

from __future__ import annotations

import math
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
    tolerance: tuple[float, float] | None = None  # (rtol, atol) when the dtype's default is too loose
    block: tuple = ()  # the learner's tile sizes, set by the checker before suspects are asked
    constants: dict = field(default_factory=dict)  # the Task's constants, read from the module


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
    constants: Sequence[str] = ()  # more module constants the suspects need (case.constants)


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
    cases = []
    # The named filters are symmetric or nearly so; a random 5x5 one shows a flipped, transposed
    # or shifted window that they would hide.
    for (h, w), name in (((37, 53), "sharpen"), ((64, 64), "gaussian"), ((21, 70), "sobel_x"),
                         ((33, 33), "random 5x5")):
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


# --------------------------------------------------------------------------------------------
# The classic mistakes of exercises 1-5, each with the output it produces (in float64, then
# the output dtype). NaN marks elements such a kernel never writes (the checker's poison).
# --------------------------------------------------------------------------------------------
NAN = float("nan")
PLANE_NAMES = ("R", "G", "B")


def _block(case: Case, axis: int, default: int) -> int:
    return int(case.block[axis]) if len(case.block) > axis else default


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _add_offsets_step_by_one(case: Case) -> torch.Tensor:
    x, y = case.inputs
    n, block = x.numel(), _block(case, 0, 128)
    out = torch.full((n,), NAN, dtype=torch.float64)
    total = x.double().flatten() + y.double().flatten()
    for pid in range(_cdiv(n, block)):
        idx = torch.arange(pid, min(pid + block, n))
        out[idx] = total[idx]
    return out.reshape(x.shape).to(x.dtype)


VECTOR_SUSPECTS = (
    Suspect("offsets that step by one program, not one block",
            "offsets = pid + tl.arange(0, BLOCK_SIZE) makes program p start at element p, on top of "
            "its neighbours: multiply, offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
            _add_offsets_step_by_one),
    Suspect("y loaded from x_ptr", "the result is x + x: load y from y_ptr",
            lambda c: (c.inputs[0].double() * 2).to(c.inputs[0].dtype)),
    Suspect("the store of x alone", "the result is x: store x + y",
            lambda c: c.inputs[0].clone()),
)


def _planes(img: torch.Tensor) -> list[torch.Tensor]:
    return [img[i].double() for i in range(img.shape[0])]


def _weighted(img: torch.Tensor, weights, planes=(0, 1, 2), clip=False) -> torch.Tensor:
    p = _planes(img)
    out = sum(w * p[k] for w, k in zip(weights, planes))
    return out.clamp(max=1.0) if clip else out


def _grey_from_planes(planes):
    return lambda c: _weighted(c.inputs[0], GREY_WEIGHTS, planes).to(c.inputs[0].dtype)


def _plane_advice(planes) -> str:
    wrong = [(PLANE_NAMES[want], PLANE_NAMES[got]) for want, got in enumerate(planes) if want != got]
    parts = [f"the {want} values came from the {got} plane" for want, got in wrong]
    return ("; ".join(parts) + ": plane k starts k * H * W elements after img_ptr (R at img_ptr, G at "
            "img_ptr + plane, B at img_ptr + 2 * plane)")


def _wrong_planes():
    return [p for p in ((a, b, c) for a in range(3) for b in range(3) for c in range(3)) if p != (0, 1, 2)]


def _shifted_planes(c: Case, plane: int, weights, clip=False) -> torch.Tensor:
    """Channels read ``plane`` elements apart (plane = H or W instead of H * W)."""
    img = c.inputs[0]
    _, H, W = img.shape
    flat = img.double().flatten()
    p = [flat[k * plane:k * plane + H * W].reshape(H, W) for k in range(3)]
    rows = [sum(w * p[k] for k, w in enumerate(row)) for row in weights]
    out = torch.stack(rows) if len(rows) > 1 else rows[0]
    return (out.clamp(max=1.0) if clip else out).to(img.dtype)


def _row_stride_h(c: Case, per_plane: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Offsets rows * H + cols: element (r, c) of the tile lands at flat offset r * H + c, and the
    value computed there is the right one for that offset (loads and store share the offsets)."""
    img = c.inputs[0]
    _, H, W = img.shape
    right = per_plane(img)
    lead = right.shape[:-2]
    flat_right = right.reshape(*lead, H * W)
    r, col = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    hit = (r * H + col).flatten()
    hit = hit[hit < H * W].unique()
    out = torch.full_like(flat_right, NAN)
    out[..., hit] = flat_right[..., hit]
    return out.reshape(right.shape)


def _tiles_written(c: Case, shape, keep) -> torch.Tensor:
    """A mask of the (H, W) elements whose tile (row block, column block) satisfies ``keep``."""
    H, W = shape
    bh, bw = _block(c, 0, 16), _block(c, 1, 32)
    tr = (torch.arange(H) // bh)[:, None].expand(H, W)
    tc = (torch.arange(W) // bw)[None, :].expand(H, W)
    return keep(tr, tc, _cdiv(H, bh), _cdiv(W, bw))


def _only_tiles(c: Case, keep) -> torch.Tensor:
    ref = c.reference.double()
    written = _tiles_written(c, ref.shape[-2:], keep)
    return torch.where(written, ref, torch.full_like(ref, NAN)).to(c.reference.dtype)


def _pid0_for_both(tr, tc, n_row_blocks, n_col_blocks):
    return tr == tc


def _axes_swapped(tr, tc, n_row_blocks, n_col_blocks):
    return (tr < n_col_blocks) & (tc < n_row_blocks)


def _image_layout_suspects(per_plane: Callable[[torch.Tensor], torch.Tensor]) -> list[Suspect]:
    return [
        Suspect("both program ids taken from axis 0",
                "pid_1 = tl.program_id(0) makes the column block follow the row block: only the "
                "tiles on the diagonal get written. Take pid_1 from tl.program_id(1)",
                lambda c: _only_tiles(c, _pid0_for_both)),
        Suspect("grid axes and program ids that disagree",
                "rows come from one axis and the grid sizes it for the other: axis 0 of the grid "
                "is cdiv(H, BLOCK_H) row blocks (pid_0 -> rows), axis 1 cdiv(W, BLOCK_W) column "
                "blocks (pid_1 -> columns)",
                lambda c: _only_tiles(c, _axes_swapped)),
        Suspect("a row offset of rows * H",
                "a row holds W elements, so row r starts at r * W: offsets = rows[:, None] * W + "
                "cols[None, :] (rows * H only works for square images)",
                lambda c: _row_stride_h(c, per_plane).to(c.inputs[0].dtype)),
    ]


GREYSCALE_SUSPECTS = tuple(
    [Suspect("rounded weights 0.3 / 0.59 / 0.11",
             "the luminosity weights are 0.299, 0.587 and 0.114: rounded ones are off by up to 1%",
             lambda c: _weighted(c.inputs[0], (0.3, 0.59, 0.11)).to(c.inputs[0].dtype)),
     Suspect("the weights in B, G, R order",
             "0.299 goes with R (plane 0), 0.587 with G, 0.114 with B",
             lambda c: _weighted(c.inputs[0], GREY_WEIGHTS[::-1]).to(c.inputs[0].dtype))]
    + [Suspect(f"channel planes mixed up ({''.join(PLANE_NAMES[k] for k in p)} read as RGB)",
               _plane_advice(p), _grey_from_planes(p)) for p in _wrong_planes()]
    + [Suspect(f"a channel plane of {name} elements",
               f"a plane holds H * W elements, not {name}: plane = H * W",
               (lambda which: lambda c: _shifted_planes(
                   c, c.inputs[0].shape[which], (GREY_WEIGHTS,)))(which))
       for name, which in (("H", 1), ("W", 2))]
    + _image_layout_suspects(greyscale_reference)
)


def _sepia(img: torch.Tensor, matrix=SEPIA_MATRIX, planes=(0, 1, 2), clip: str = "min") -> torch.Tensor:
    rows = [_weighted(img, m, planes) for m in matrix]
    out = torch.stack(rows)
    if clip == "min":
        out = out.clamp(max=1.0)
    elif clip == "max":
        out = out.clamp(min=1.0)
    return out.to(img.dtype)


def _sepia_stored(targets) -> Callable[[Case], torch.Tensor]:
    """R', G', B' stored into planes ``targets`` (in that order: a later store wins)."""
    def output(c: Case) -> torch.Tensor:
        right = _sepia(c.inputs[0]).double()
        out = torch.full_like(right, NAN)
        for k, t in enumerate(targets):
            out[t] = right[k]
        return out.to(c.inputs[0].dtype)

    return output


def _store_advice(targets) -> str:
    wrong = [f"{PLANE_NAMES[k]}' went to plane {t} ({PLANE_NAMES[t]})" for k, t in enumerate(targets) if k != t]
    return "; ".join(wrong) + ": store R' at out_ptr + offsets, G' at + plane, B' at + 2 * plane"


SEPIA_SUSPECTS = tuple(
    [Suspect("no clipping at 1.0", "bright pixels go past 1.0: clip each channel with "
             "tl.minimum(..., 1.0)", lambda c: _sepia(c.inputs[0], clip="none")),
     Suspect("tl.maximum instead of tl.minimum", "clipping at white keeps the smaller value: "
             "tl.minimum(value, 1.0)", lambda c: _sepia(c.inputs[0], clip="max")),
     Suspect("the sepia matrix read by columns",
             "R' = 0.393 R + 0.769 G + 0.189 B: each output channel takes a row of the matrix",
             lambda c: _sepia(c.inputs[0], tuple(zip(*SEPIA_MATRIX))))]
    + [Suspect(f"stores into the wrong channel planes ({''.join(PLANE_NAMES[t] for t in targets)})",
               _store_advice(targets), _sepia_stored(targets))
       for targets in ((a, b, c) for a in range(3) for b in range(3) for c in range(3))
       if targets != (0, 1, 2)]
    + [Suspect(f"channel planes mixed up ({''.join(PLANE_NAMES[k] for k in p)} read as RGB)",
               _plane_advice(p), (lambda p: lambda c: _sepia(c.inputs[0], planes=p))(p))
       for p in _wrong_planes()]
    + [Suspect(f"a channel plane of {name} elements",
               f"a plane holds H * W elements, not {name}: plane = H * W",
               (lambda which: lambda c: _sepia_plane_shift(c, which))(which))
       for name, which in (("H", 1), ("W", 2))]
    + _image_layout_suspects(lambda img: _sepia(img).double())
)


def _sepia_plane_shift(c: Case, which: int) -> torch.Tensor:
    """Sepia with loads and stores a plane of H (or W) elements apart."""
    img = c.inputs[0]
    _, H, W = img.shape
    step = img.shape[which]
    flat = img.double().flatten()
    p = [flat[k * step:k * step + H * W].reshape(H, W) for k in range(3)]
    values = [sum(w * p[k] for k, w in enumerate(row)).clamp(max=1.0) for row in SEPIA_MATRIX]
    out = torch.full((3 * H * W,), NAN, dtype=torch.float64)
    for k, v in enumerate(values):
        out[k * step:k * step + H * W] = v.flatten()
    return out.reshape(3, H, W).to(img.dtype)


def _correlate(img: torch.Tensor, kernel: torch.Tensor, shift=(0, 0), border: float = 0.0) -> torch.Tensor:
    """out[c, y, x] = sum_ij kernel[i, j] * img[c, y + i - K//2 + dy, x + j - K//2 + dx], with
    ``border`` outside the image."""
    C, H, W = img.shape
    K = kernel.shape[-1]
    r = K // 2
    dy, dx = shift
    pad = r + max(abs(dy), abs(dx))
    padded = F.pad(img.double(), (pad, pad, pad, pad), value=border)
    k = kernel.double().cpu()
    out = torch.zeros(C, H, W, dtype=torch.float64, device=img.device)
    for i in range(K):
        for j in range(K):
            y0, x0 = pad + i - r + dy, pad + j - r + dx
            out += k[i, j].item() * padded[:, y0:y0 + H, x0:x0 + W]
    return out


def _filter_with(kernel_fn=None, shift=(0, 0), border=0.0):
    def output(c: Case) -> torch.Tensor:
        img, kernel = c.inputs
        k = kernel_fn(kernel) if kernel_fn else kernel
        return _correlate(img, k, shift, border).to(img.dtype)

    return output


def _last_tap_only(c: Case) -> torch.Tensor:
    img, kernel = c.inputs
    K = kernel.shape[-1]
    only = torch.zeros_like(kernel)
    only[K - 1, K - 1] = kernel[K - 1, K - 1]
    return _correlate(img, only).to(img.dtype)


def _every_channel_from(c: Case, source: int) -> torch.Tensor:
    img, kernel = c.inputs
    one = _correlate(img[source:source + 1], kernel)
    return one.expand(img.shape[0], -1, -1).to(img.dtype)


def _store_without_channel_offset(c: Case) -> torch.Tensor:
    # Every channel's program stores into plane 0; the interpreter runs channel C - 1 last.
    img, kernel = c.inputs
    out = torch.full(img.shape, NAN, dtype=torch.float64)
    out[0] = _correlate(img[-1:], kernel)[0]
    return out.to(img.dtype)


def _drop_last_taps(rows: bool, cols: bool):
    def fn(kernel: torch.Tensor) -> torch.Tensor:
        k = kernel.clone()
        if rows:
            k[-1, :] = 0
        if cols:
            k[:, -1] = 0
        return k

    return fn


def _shift_name(dy: int, dx: int, r: int) -> tuple[str, str]:
    if (dy, dx) == (r, r):
        return ("a window that is not centred" + (" (or off by one)" if r == 1 else ""),
                "tap (i, j) reads the pixel i - K // 2 rows and j - K // 2 columns away: "
                "in_rows = rows[:, None] + (i - K // 2), in_cols = cols[None, :] + (j - K // 2)")
    return (f"a window shifted by ({dy:+d}, {dx:+d}) pixels",
            "off by one: tap (i, j) reads the pixel (i - K // 2, j - K // 2) away from the output "
            "pixel, in both directions")


def _filter_suspects() -> tuple:
    found = [
        Suspect("a flipped filter (a convolution, not a correlation)",
                "tap (i, j) multiplies kernel[i, j] (at kernel_ptr + i * K + j), not "
                "kernel[K - 1 - i, K - 1 - j]", _filter_with(lambda k: k.flip(0, 1))),
        Suspect("a filter flipped top to bottom", "tap row i multiplies kernel row i: "
                "kernel_ptr + i * K + j", _filter_with(lambda k: k.flip(0))),
        Suspect("a filter flipped left to right", "tap column j multiplies kernel column j: "
                "kernel_ptr + i * K + j", _filter_with(lambda k: k.flip(1))),
        Suspect("a transposed filter", "the weight of tap (i, j) is at kernel_ptr + i * K + j "
                "(row i, column j), not j * K + i", _filter_with(lambda k: k.t())),
        Suspect("acc = instead of acc +=", "each tap replaced the sum so far, so only the last "
                "tap remains: acc += pixels * weight", _last_tap_only),
        Suspect("a border of -1 (other=-1.0)", "pixels outside the image count as zero: "
                "other=0.0", _filter_with(border=-1.0)),
        Suspect("loops that skip the last row and column of taps", "range(K) walks all K taps",
                _filter_with(_drop_last_taps(True, True))),
        Suspect("loops that skip the last row of taps", "range(K) walks all K rows of taps",
                _filter_with(_drop_last_taps(True, False))),
        Suspect("loops that skip the last column of taps", "range(K) walks all K columns of taps",
                _filter_with(_drop_last_taps(False, True))),
        Suspect("every channel read from channel 0", "each program reads its own channel's plane: "
                "img_ptr + channel * H * W", lambda c: _every_channel_from(c, 0)),
        Suspect("every channel stored into plane 0", "each program stores into its own channel's "
                "plane: out_ptr + channel * H * W + ...", _store_without_channel_offset),
    ]
    for r in (1, 2):
        shifts = {(r, r)} | {(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)} - {(0, 0)}
        for dy, dx in sorted(shifts):
            name, advice = _shift_name(dy, dx, r)
            found.append(Suspect(name, advice, (lambda dy, dx, r: lambda c: (
                _filter_with(shift=(dy, dx))(c) if c.inputs[1].shape[-1] // 2 == r else None))(dy, dx, r)))
    return tuple(found)


FILTER_SUSPECTS = _filter_suspects()


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 (10 mantissa bits, to nearest even), as a GPU's tensor
    cores read them."""
    bits = t.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
    rounded = torch.where(torch.isfinite(t.float()), rounded, bits)
    return (rounded - ((rounded >> 31) << 32)).to(torch.int32).view(torch.float32)


def _matmul_k_tiles(c: Case) -> list[tuple[int, int]]:
    K = c.inputs[0].shape[1]
    bk = int(c.constants.get("BLOCK_K", 32))
    return [(k0, min(k0 + bk, K)) for k0 in range(0, K, bk)]


def _matmul_first_tile_every_step(c: Case) -> torch.Tensor:
    a, b = c.inputs
    tiles = _matmul_k_tiles(c)
    lo, hi = tiles[0]
    return (len(tiles) * (a[:, lo:hi].double() @ b[lo:hi].double())).to(a.dtype)


def _matmul_last_tile_only(c: Case) -> torch.Tensor:
    a, b = c.inputs
    lo, hi = _matmul_k_tiles(c)[-1]
    return (a[:, lo:hi].double() @ b[lo:hi].double()).to(a.dtype)


def _matmul_tf32(c: Case) -> torch.Tensor | None:
    a, b = c.inputs
    if a.dtype != torch.float32:
        return None
    return (_tf32(a).double() @ _tf32(b).double()).to(a.dtype)


MATMUL_SUSPECTS = (
    Suspect("a K tile that never advances",
            "every step of the K loop loads the first tile: the K offsets must move with the loop, "
            "ks = k0 + tl.arange(0, BLOCK_K)", _matmul_first_tile_every_step),
    Suspect("acc = instead of accumulating",
            "each step replaced the sum so far, so only the last K tile remains: "
            "acc = tl.dot(a, b, acc, ...) (or acc += tl.dot(a, b, ...))", _matmul_last_tile_only),
    Suspect("TF32 in tl.dot",
            "tl.dot rounded the float32 inputs to TF32 (10-bit mantissa): that happens with "
            "input_precision=\"tf32\" and also when input_precision is left out (TF32 is the "
            "default on NVIDIA GPUs). Pass input_precision=INPUT_PRECISION, \"ieee\" unless the "
            "caller allows TF32", _matmul_tf32),
)


def _softmax_padded(value: float) -> Callable[[Case], torch.Tensor]:
    """Softmax with the block's padding lanes loaded as ``value`` instead of -inf."""
    def output(c: Case) -> torch.Tensor:
        x = c.inputs[0]
        n = x.shape[-1]
        pad = (1 << (n - 1).bit_length()) - n
        if pad == 0:
            return None
        xd = x.double()
        m = torch.maximum(xd.max(-1, keepdim=True).values, torch.tensor(value, dtype=torch.float64))
        e = (xd - m).exp()
        total = e.sum(-1, keepdim=True) + pad * math.exp(value) * (-m).exp()
        return (e / total).to(x.dtype)

    return output


SOFTMAX_SUSPECTS = (
    Suspect("padding lanes loaded as 0 (other=0.0, or no other=)",
            "each padded lane adds exp(0 - max) to the row sum: load them as -inf, "
            "other=-float(\"inf\")", _softmax_padded(0.0)),
    Suspect("padding lanes loaded as -1 (other=-1.0)",
            "each padded lane adds exp(-1 - max) to the row sum: load them as -inf, "
            "other=-float(\"inf\")", _softmax_padded(-1.0)),
    Suspect("a missing normalisation",
            "the result is exp(x - max) alone: divide by its sum over the row, "
            "y = numerator / tl.sum(numerator, axis=0)",
            lambda c: (c.inputs[0].double() - c.inputs[0].double().max(-1, keepdim=True).values)
            .exp().to(c.inputs[0].dtype)),
    Suspect("the sum of x instead of the sum of exp",
            "divide by the sum of the numerators: tl.sum(numerator, axis=0)",
            lambda c: ((c.inputs[0].double() - c.inputs[0].double().max(-1, keepdim=True).values).exp()
                       / c.inputs[0].double().sum(-1, keepdim=True)).to(c.inputs[0].dtype)),
)


EXERCISES: dict[int, Exercise] = {
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

from .part_two import PART_TWO; EXERCISES.update(PART_TWO)  # noqa: E402,E702  (6-8: part_two imports this module)
