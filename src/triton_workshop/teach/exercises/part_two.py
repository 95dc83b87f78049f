"""Exercises 6-8, the workshop's second part: layer norm forward and backward, making matmul fast,
flash attention. What each launcher must compute, the inputs it is checked on, and the classic
mistakes (:class:`~..diagnose.Suspect`) recognised by their output.

Each suspect's ``output(case)`` recomputes, in float64, what a kernel with that one bug returns on
the case's inputs (NaN where it writes nothing); the checker names the suspect whose output the
learner's matches. Some bugs depend on the tiling (the rows a layer-norm program owns, the blocks
of the attention loop): those suspects read the learner's tile sizes from the case
(``case.block``, ``case.constants``, set by the checker) and fall back on the template's, the
constants below, which ``tests/test_part_two.py`` keeps equal to the templates'.

A task that reports several outputs (layer norm's y, mean and rstd; the backward's dx, dweight and
dbias) is split into one task per output: the exercise file has a small launcher for each (given
code) that returns that output alone. :class:`StretchTask` marks the optional tasks past an
exercise's core (dweight/dbias, causal attention); ``workshop progress`` reports them apart.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F

from ... import runtime
from ..diagnose.fast_matmul import tuning_configs_verdict
from ..diagnose.flash_attention import RUNNING_MAX_SUSPECTS, very_negative_row
from ..diagnose.layer_norm import statistics_in_words
from .part_one import FP16_ONE_ROUNDING
from .types import Case, Exercise, StretchTask, Suspect, Task, is_stretch

__all__ = [
    "PART_TWO", "StretchTask", "is_stretch",
    "layer_norm_reference", "layer_norm_statistics_reference", "layer_norm_grads_reference",
    "grouped_tile_order", "row_major_tile_order", "tile_visit_counts", "every_tile_once",
    "attention_reference", "online_softmax_attention",
    "LAYER_NORM_BLOCK_ROWS", "LAYER_NORM_MAX_COLS", "ATTENTION_BLOCK_M", "ATTENTION_BLOCK_N",
    "ATTENTION_HEAD_DIM_MAX", "MATMUL_FIRST_BLOCK", "MATMUL_FIRST_GROUP",
]

#: The templates' tiling (kept equal to the exercise files by the tests).
LAYER_NORM_BLOCK_ROWS = 4  # exercise 6: rows per program
LAYER_NORM_MAX_COLS = 4096  # exercise 6: the longest row a program holds
MATMUL_FIRST_BLOCK = (32, 32)  # exercise 7: BLOCK_M, BLOCK_N of the first config (the interpreter's)
MATMUL_FIRST_GROUP = 4  # exercise 7: GROUP_SIZE_M of that config
ATTENTION_BLOCK_M = 32  # exercise 8: query rows per program
ATTENTION_BLOCK_N = 16  # exercise 8: keys per step of the loop
ATTENTION_HEAD_DIM_MAX = 128  # exercise 8: the widest head the launcher accepts


def _randn(gen, *shape, dtype=torch.float32, device="cpu", scale=1.0, shift=0.0):
    """Fresh normal values, drawn on the CPU (same numbers on any machine) and moved."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale + shift
    return x.to(device=device, dtype=dtype)


def _learner_block(case: Case, axis: int, default: int) -> int:
    """The learner's tile size along ``axis`` of the task's block (set on the case by the
    checker from the module's constants), else the template's."""
    block = getattr(case, "block", ()) or ()
    return int(block[axis]) if len(block) > axis else default


def _learner_constant(case: Case, name: str, default: int) -> int:
    return int((getattr(case, "constants", None) or {}).get(name, default))


def _dtype_label(dtype: torch.dtype) -> str:
    return "" if dtype == torch.float32 else " " + str(dtype).replace("torch.", "")


def _nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


# ============================================================================================
# Exercise 6: layer norm.
# ============================================================================================
def _row_statistics(x: torch.Tensor, eps: float, *, unbiased=False, eps_outside=False):
    """mean and rstd of each row in float64, with the two classic slips as switches."""
    x = x.double()
    mean = x.mean(dim=1, keepdim=True)
    var = ((x - mean) ** 2).sum(dim=1, keepdim=True) / (x.shape[1] - (1 if unbiased else 0))
    rstd = 1.0 / (var.sqrt() + eps) if eps_outside else 1.0 / (var + eps).sqrt()
    return mean, rstd


def layer_norm_reference(x, weight, bias, eps=1e-5, *, unbiased=False, eps_outside=False):
    """``F.layer_norm`` over the last dim, in float64, rounded to x's dtype."""
    mean, rstd = _row_statistics(x, eps, unbiased=unbiased, eps_outside=eps_outside)
    y = (x.double() - mean) * rstd * weight.double() + bias.double()
    return y.to(x.dtype)


def layer_norm_statistics_reference(x, eps=1e-5, *, unbiased=False, eps_outside=False,
                                    std_saved=False):
    """(n_rows, 2) float32: each row's mean and rstd (or, ``std_saved``, sqrt(var + eps))."""
    mean, rstd = _row_statistics(x, eps, unbiased=unbiased, eps_outside=eps_outside)
    second = 1.0 / rstd if std_saved else rstd
    return torch.cat((mean, second), dim=1).float()


def _layer_norm_wrong_axis(x, weight, bias, eps=1e-5, block_rows=LAYER_NORM_BLOCK_ROWS):
    """What the template's kernel computes with both row sums taken down the columns
    (``axis=0``): each column's statistics over the block_rows rows of its program's tile (rows
    past the end load as 0), still divided by n_cols."""
    n_rows, n_cols = x.shape
    x64 = x.double()
    pad = (-n_rows) % block_rows
    tiles = torch.cat((x64, x64.new_zeros(pad, n_cols))).view(-1, block_rows, n_cols)
    valid = (torch.arange(n_rows + pad, device=x.device) < n_rows).view(-1, block_rows, 1)
    mean = tiles.sum(dim=1, keepdim=True) / n_cols
    xc = torch.where(valid, tiles - mean, torch.zeros_like(tiles))
    var = (xc * xc).sum(dim=1, keepdim=True) / n_cols
    y = xc / (var + eps).sqrt() * weight.double() + bias.double()
    return y.reshape(-1, n_cols)[:n_rows].to(x.dtype)


def layer_norm_grads_reference(dy, x, weight, eps=1e-5):
    """dx, dweight, dbias of ``F.layer_norm(x, (n_cols,), weight, bias, eps)``, by float64
    autograd."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    b64 = torch.zeros_like(w64, requires_grad=True)
    # backward() of a scalar, not backward(dy): the same gradients (the sum's is exactly dy), but
    # a tensor passed to backward makes torch import sympy (for symbolic shapes), a slow import
    # that every check of this exercise would wait for.
    (F.layer_norm(x64, (x.shape[1],), w64, b64, eps) * dy.double()).sum().backward()
    return x64.grad, w64.grad, b64.grad


def _layer_norm_inputs(gen, device):
    """(label, x, weight, bias, eps): ragged row lengths, a row shorter than a block, rows with a
    tiny variance (where eps matters), a large eps, float16."""
    # The long rows (here and in the backward's cases) are few: each block of rows is a program
    # the interpreter runs one after another, and the rows' length is what those cases are for.
    specs = [((37, 100), torch.float32, 1.0, 0.0, 1e-5),
             ((16, 1500), torch.float32, 1.0, 0.5, 1e-5),
             ((5, 3), torch.float32, 1.0, 0.0, 1e-5),
             ((16, 77), torch.float32, 0.01, 0.0, 1e-5),  # var ~1e-4: eps inside the sqrt matters
             ((19, 256), torch.float32, 1.0, 0.0, 0.1),  # a large eps
             ((33, 70), torch.float16, 1.0, 0.0, 1e-5)]
    for (rows, cols), dtype, scale, shift, eps in specs:
        assert cols <= LAYER_NORM_MAX_COLS
        x = _randn(gen, rows, cols, dtype=dtype, device=device, scale=scale, shift=shift)
        weight = _randn(gen, cols, dtype=dtype, device=device)
        bias = _randn(gen, cols, dtype=dtype, device=device)
        label = f"{rows}x{cols}" + (f" x{scale:g}" if scale != 1.0 else "") + (
            f" eps={eps:g}" if eps != 1e-5 else "") + _dtype_label(dtype)
        yield label, x, weight, bias, eps


def _layer_norm_cases(gen, device):
    return [Case(label, (x, w, b), layer_norm_reference(x, w, b, eps), {"eps": eps})
            for label, x, w, b, eps in _layer_norm_inputs(gen, device)]


def _layer_norm_statistics_cases(gen, device):
    return [Case(label, (x, w, b), layer_norm_statistics_reference(x, eps).to(device), {"eps": eps})
            for label, x, w, b, eps in _layer_norm_inputs(gen, device)]


def _backward_inputs(gen, device):
    """(label, dy, x, weight, mean, rstd, dx, dweight, dbias): mean and rstd are exact statistics
    rounded to float32, as a correct forward saves them; the backward is checked on its own."""
    specs = [((37, 100), torch.float32), ((16, 1000), torch.float32), ((6, 9), torch.float32),
             ((19, 256), torch.float32), ((33, 70), torch.float16)]
    for (rows, cols), dtype in specs:
        x = _randn(gen, rows, cols, dtype=dtype, device=device)
        weight = _randn(gen, cols, dtype=dtype, device=device)
        dy = _randn(gen, rows, cols, dtype=dtype, device=device)
        stats = layer_norm_statistics_reference(x).to(device)
        mean, rstd = stats[:, 0].contiguous(), stats[:, 1].contiguous()
        dx, dweight, dbias = layer_norm_grads_reference(dy, x, weight)
        yield f"{rows}x{cols}" + _dtype_label(dtype), dy, x, weight, mean, rstd, dx, dweight, dbias


def _layer_norm_backward_cases(gen, device):
    return [Case(label, (dy, x, w, mean, rstd), dx.to(x.dtype))
            for label, dy, x, w, mean, rstd, dx, _, _ in _backward_inputs(gen, device)]


def _layer_norm_weight_grads_cases(gen, device):
    return [Case(label, (dy, x, w, mean, rstd), torch.stack((dw, db)).to(w.dtype))
            for label, dy, x, w, mean, rstd, _, dw, db in _backward_inputs(gen, device)]


def _eps(case: Case) -> float:
    return float(case.kwargs.get("eps", 1e-5))


def _statistics_as_constants(case: Case) -> torch.Tensor:
    """dx with mean and rstd treated as constants: rstd * weight * dy."""
    dy, _, weight, _, rstd = case.inputs
    return (dy.double() * weight.double() * rstd.double()[:, None]).to(case.reference.dtype)


def _dweight_from_x(case: Case) -> torch.Tensor:
    """dweight summed from dy * x (the input, not the normalised x̂)."""
    dy, x, _, _, _ = case.inputs
    return torch.stack(((dy.double() * x.double()).sum(0), dy.double().sum(0))).to(
        case.reference.dtype)


_UNBIASED_ADVICE = ("the variance was divided by n_cols - 1 (unbiased, torch.var's default); "
                    "layer norm uses the biased variance: divide the sum of squares by n_cols")
_EPS_ADVICE = ("eps was added outside the square root, 1 / (sqrt(var) + eps); layer norm adds it "
               "inside: rstd = 1 / tl.sqrt(var + eps)")

LAYER_NORM_SUSPECTS = (
    Suspect("unbiased variance", _UNBIASED_ADVICE,
            lambda c: layer_norm_reference(*c.inputs, _eps(c), unbiased=True)),
    Suspect("eps outside the square root", _EPS_ADVICE,
            lambda c: layer_norm_reference(*c.inputs, _eps(c), eps_outside=True)),
    Suspect("wrong reduction axis",
            "the statistics were reduced down the columns (axis=0) instead of along each row: "
            "use tl.sum(..., axis=1, keep_dims=True), so each row gets its own mean and variance",
            lambda c: _layer_norm_wrong_axis(
                *c.inputs, _eps(c), block_rows=_learner_block(c, 0, LAYER_NORM_BLOCK_ROWS))),
)

LAYER_NORM_STATISTICS_SUSPECTS = (
    Suspect("statistics not saved",
            "mean and rstd were never stored: the forward must tl.store them (one float32 each "
            "per row, at mean_ptr + rows / rstd_ptr + rows, masked) for the backward to read",
            lambda c: _nan_like(c.reference), describe=statistics_in_words),
    Suspect("unbiased variance", _UNBIASED_ADVICE,
            lambda c: layer_norm_statistics_reference(c.inputs[0], _eps(c), unbiased=True).to(
                c.reference.device)),
    Suspect("eps outside the square root", _EPS_ADVICE,
            lambda c: layer_norm_statistics_reference(c.inputs[0], _eps(c), eps_outside=True).to(
                c.reference.device)),
    Suspect("standard deviation saved instead of rstd",
            "the second statistic is sqrt(var + eps); save its reciprocal, rstd = 1 / sqrt(var + "
            "eps), which the backward multiplies by",
            lambda c: layer_norm_statistics_reference(c.inputs[0], _eps(c), std_saved=True).to(
                c.reference.device)),
)

LAYER_NORM_BACKWARD_SUSPECTS = (
    Suspect("mean and rstd treated as constants",
            "dx = rstd * weight * dy misses that moving one x moves its row's mean and variance: "
            "subtract xhat * mean(xhat * wdy) + mean(wdy) (means along the row) before scaling "
            "by rstd",
            _statistics_as_constants),
)

LAYER_NORM_WEIGHT_GRADS_SUSPECTS = (
    Suspect("dweight from x instead of x̂",
            "dweight sums dy * xhat, the normalised input (x - mean) * rstd, not dy * x",
            _dweight_from_x),
)


# ============================================================================================
# Exercise 7: grouped program ordering and autotuning.
# ============================================================================================
def grouped_tile_order(num_pid_m: int, num_pid_n: int, group_size_m: int, *,
                       shorten_last_group: bool = True) -> torch.Tensor:
    """(programs, 2) int32: the (pid_m, pid_n) tile of each program id in grouped order.

    Programs walk down GROUP_SIZE_M rows of tiles, column after column, so that programs running
    at the same time share rows of A and columns of B in the L2 cache. The last group has fewer
    rows when num_pid_m is not a multiple of GROUP_SIZE_M; ``shorten_last_group=False`` is the bug
    that forgets it.
    """
    order = []
    per_group = group_size_m * num_pid_n
    for pid in range(num_pid_m * num_pid_n):
        first_pid_m = (pid // per_group) * group_size_m
        rows = min(num_pid_m - first_pid_m, group_size_m) if shorten_last_group else group_size_m
        order.append((first_pid_m + (pid % per_group) % rows, (pid % per_group) // rows))
    return torch.tensor(order, dtype=torch.int32).view(-1, 2)


def row_major_tile_order(num_pid_m: int, num_pid_n: int) -> torch.Tensor:
    """(programs, 2) int32: exercise 4's order, row after row of tiles."""
    pid = torch.arange(num_pid_m * num_pid_n, dtype=torch.int32)
    return torch.stack((pid // num_pid_n, pid % num_pid_n), dim=1)


def tile_visit_counts(order: torch.Tensor, num_pid_m: int, num_pid_n: int) -> torch.Tensor:
    """(num_pid_m, num_pid_n) int32: how many programs compute each tile. Tiles outside the grid
    count nowhere (they are part of no output)."""
    order = order.detach().cpu().long()
    inside = ((order[:, 0] >= 0) & (order[:, 0] < num_pid_m)
              & (order[:, 1] >= 0) & (order[:, 1] < num_pid_n))
    flat = order[inside, 0] * num_pid_n + order[inside, 1]
    counts = torch.bincount(flat, minlength=num_pid_m * num_pid_n)
    return counts.view(num_pid_m, num_pid_n).to(torch.int32)


def every_tile_once(order: torch.Tensor, num_pid_m: int, num_pid_n: int) -> list[str]:
    """What is wrong with a program -> tile order, one sentence per kind of problem; empty when
    every tile is computed by exactly one program."""
    order = order.detach().cpu().long()
    problems = []
    outside = [(p, tuple(t)) for p, t in enumerate(order.tolist())
               if not (0 <= t[0] < num_pid_m and 0 <= t[1] < num_pid_n)]
    if outside:
        shown = ", ".join(f"program {p} -> tile {t}" for p, t in outside[:4])
        problems.append(f"{len(outside)} program(s) compute a tile outside the {num_pid_m} x "
                        f"{num_pid_n} grid of tiles ({shown}{' ...' if len(outside) > 4 else ''})")
    counts = tile_visit_counts(order, num_pid_m, num_pid_n)
    for count, what in ((0, "never computed"), (2, "computed more than once")):
        hit = (counts == 0).nonzero() if count == 0 else (counts >= 2).nonzero()
        if len(hit):
            shown = ", ".join(str(tuple(t)) for t in hit[:4].tolist())
            problems.append(f"{len(hit)} tile(s) {what}: {shown}{' ...' if len(hit) > 4 else ''}")
    return problems


_TILE_CASES = ((5, 3, 2), (8, 8, 4), (7, 4, 3), (1, 6, 4), (6, 1, 8), (9, 5, 4))


def _tile_cases(output):
    def make(gen, device):
        return [Case(f"{m}x{n} tiles, GROUP_SIZE_M={g}", (m, n, g), output(m, n, g).to(device))
                for m, n, g in _TILE_CASES]

    return make


def _unshortened(m, n, g):
    return grouped_tile_order(m, n, g, shorten_last_group=False)


_LAST_GROUP_ADVICE = (
    "the last group was given GROUP_SIZE_M rows of tiles although fewer are left when num_pid_m "
    "is not a multiple of GROUP_SIZE_M: its programs step past the last row (and those tiles are "
    "lost) while other tiles are never computed. Shorten it: group_size_m = "
    "tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)")

def _tiles_from_counts(counts: torch.Tensor) -> torch.Tensor:
    """A (programs, 2) order with each tile listed as often as ``counts`` says."""
    m, n = counts.shape
    tiles = [(i, j) for i in range(m) for j in range(n) for _ in range(max(0, int(counts[i, j])))]
    return torch.tensor(tiles, dtype=torch.long).view(-1, 2)


# What the counts or the order show, in words ("never computed", "computed more than once"),
# beside the element-by-element "got 2, expected 1"; said whatever the bug.
def _in_words(order: torch.Tensor, case: Case) -> list[str]:
    problems = every_tile_once(order, *case.inputs[:2])
    return ["every tile must be computed by exactly one program: " + "; ".join(problems)] \
        if problems else []


TILE_VISITS_SUSPECTS = (
    Suspect("last group not shortened", _LAST_GROUP_ADVICE,
            lambda c: tile_visit_counts(_unshortened(*c.inputs), *c.inputs[:2]).to(
                c.reference.device),
            describe=lambda out, c: _in_words(_tiles_from_counts(out), c)),
)

TILE_ORDER_SUSPECTS = (
    Suspect("row-major order",
            "every tile is computed, but in exercise 4's order, row after row: GROUP_SIZE_M has no "
            "effect. Walk down the group's rows first: pid_m = first_pid_m + (pid % "
            "num_pid_in_group) % group_size_m, pid_n = (pid % num_pid_in_group) // group_size_m",
            lambda c: row_major_tile_order(*c.inputs[:2]).to(c.reference.device)),
    Suspect("last group not shortened", _LAST_GROUP_ADVICE,
            lambda c: _unshortened(*c.inputs).to(c.reference.device), describe=_in_words),
)


def _fast_matmul_cases(gen, device):
    cases = []
    # 150 (and 130) rows are 5 tile rows: with GROUP_SIZE_M = 4 the last group is short; two
    # tile columns are enough beside them (each tile is a program the interpreter runs in turn).
    # A long K in float16 shows a float16 accumulator (exercise 4's kernel pasted with its
    # accumulator's dtype changed): a float32 one rounds once, on the store.
    shapes = [((67, 45, 83), torch.float32), ((150, 33, 40), torch.float32),
              ((64, 64, 64), torch.float32), ((130, 40, 36), torch.float16),
              ((40, 1100, 36), torch.float16)]
    if not runtime.INTERPRET:  # bf16 tl.dot is wrong in the interpreter (triton#11584)
        shapes.append(((77, 90, 130), torch.bfloat16))
    for (m, k, n), dtype in shapes:
        a = _randn(gen, m, k, dtype=dtype, device=device)
        b = _randn(gen, k, n, dtype=dtype, device=device)
        tolerance = FP16_ONE_ROUNDING if dtype == torch.float16 and k >= 1024 else None
        cases.append(Case(f"{m}x{k} @ {k}x{n} {str(dtype).replace('torch.', '')}", (a, b),
                          (a.double() @ b.double()).to(dtype), tolerance=tolerance))
    return cases


# ============================================================================================
# Exercise 8: flash attention.
# ============================================================================================
def attention_reference(q, k, v, causal=False, *, allowed=None):
    """softmax(q k^T / sqrt(D)) v in float64, rounded to q's dtype. ``allowed`` (query, key) ->
    bool replaces the causal mask (a row with no key allowed comes out NaN, as 0 / 0)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    n_q, n_k = scores.shape[-2:]
    rows = torch.arange(n_q, device=q.device)[:, None]
    keys = torch.arange(n_k, device=q.device)[None, :]
    if allowed is None and causal:
        allowed = keys <= rows
    elif allowed is not None:
        allowed = allowed(rows, keys)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.double()).to(q.dtype)


def online_softmax_attention(q, k, v, *, block_n=ATTENTION_BLOCK_N, rescale_acc=True,
                             divide=True):
    """Flash attention's loop in float64: keys in blocks of ``block_n``, a running max, a running
    sum and an accumulator rescaled whenever the max grows; one division at the end. The switches
    are the two classic slips: the accumulator left unscaled, the division forgotten."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    q64, k64, v64 = q.double(), k.double(), v.double()
    running_max = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64, device=q.device)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros_like(q64)
    for start in range(0, k.shape[-2], block_n):
        scores = q64 @ k64[..., start:start + block_n, :].transpose(-1, -2) * scale
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        alpha = torch.exp(running_max - new_max)
        p = torch.exp(scores - new_max[..., None])
        running_sum = running_sum * alpha + p.sum(dim=-1)
        if rescale_acc:
            acc = acc * alpha[..., None]
        acc = acc + p @ v64[..., start:start + block_n, :]
        running_max = new_max
    out = acc / running_sum[..., None] if divide else acc
    return out.to(q.dtype)


def _attention_inputs(gen, device, shapes):
    for (b, h, n, d), dtype in shapes:
        q, k, v = (_randn(gen, b, h, n, d, dtype=dtype, device=device) for _ in range(3))
        yield f"{b}x{h}x{n}x{d}" + _dtype_label(dtype), q, k, v


# B * H differs from the number of query blocks in most shapes: a grid with its two axes swapped
# leaves programs without work and rows unwritten.
def _attention_cases(gen, device):
    shapes = [((1, 3, 37, 16), torch.float32), ((2, 1, 64, 32), torch.float32),
              ((1, 1, 5, 16), torch.float32), ((1, 2, 50, 16), torch.float16)]
    if not runtime.INTERPRET:
        shapes.append(((1, 2, 70, 64), torch.bfloat16))
    cases = [Case(label, (q, k, v), attention_reference(q, k, v))
             for label, q, k, v in _attention_inputs(gen, device, shapes)]
    for label, q, k, v in _attention_inputs(gen, device, [((1, 1, 40, 16), torch.float32)]):
        row = 7
        q, k = very_negative_row(q, k, row)
        # Scores of magnitude ~250 carry fp32 rounding of ~250 * 2**-24 into each exponent, so
        # the row's weights differ from the reference's by ~1.5e-5 relative, whatever the order
        # of the sums: the tolerance says so (fp32's default would fail a right kernel).
        cases.append(Case(f"{label}, every score of row {row} < -200", (q, k, v),
                          attention_reference(q, k, v), tolerance=(1e-4, 1e-5)))
    return cases


def _causal_cases(gen, device):
    shapes = [((1, 3, 37, 16), torch.float32), ((1, 1, 70, 32), torch.float32),
              ((1, 2, 45, 16), torch.float16)]
    return [Case(label, (q, k, v), attention_reference(q, k, v, causal=True))
            for label, q, k, v in _attention_inputs(gen, device, shapes)]


def _block_end(rows, n_keys, block_m=ATTENTION_BLOCK_M):
    """The causal loop's end for each query row: one past the last row of its block (or the
    keys' end): keys from there on are never loaded."""
    return torch.clamp((rows // block_m + 1) * block_m, max=n_keys)


def _causal_variant(allowed, *, per_block=False):
    """A suspect's output: the kernel's loop with ``allowed(rows, keys)`` in place of the causal
    mask, over the keys it loads. A row with no allowed key in the first key block comes out NaN:
    there the running max is still -inf, and exp(-inf - (-inf)) is NaN, which sticks.
    ``per_block``: ``allowed(rows, keys, block_m)`` also takes the learner's BLOCK_M."""
    def output(case):
        q, k, _ = case.inputs
        n_q, n_keys = q.shape[-2], k.shape[-2]
        block_m = _learner_block(case, 0, ATTENTION_BLOCK_M)
        block_n = _learner_constant(case, "BLOCK_N", ATTENTION_BLOCK_N)

        def mask(r, keys):
            ok = allowed(r, keys, block_m) if per_block else allowed(r, keys)
            return ok & (keys < _block_end(r, n_keys, block_m))

        out = attention_reference(*case.inputs, allowed=mask)
        rows = torch.arange(n_q, device=q.device)[:, None]
        first_block = torch.arange(min(block_n, n_keys), device=q.device)[None, :]
        lost = ~mask(rows, first_block).any(dim=-1)
        return out.masked_fill(lost[:, None], float("nan"))
    return output


ATTENTION_SUSPECTS = (
    Suspect("accumulator not rescaled",
            "when a block of keys raises the running max, what acc summed so far was weighted "
            "with the old max: multiply acc by alpha = exp(m_i - m_new) before adding p @ v, "
            "as l_i is",
            lambda c: online_softmax_attention(
                *c.inputs, block_n=_learner_constant(c, "BLOCK_N", ATTENTION_BLOCK_N),
                rescale_acc=False)),
    Suspect("final division missing",
            "acc holds sum(p * v) with unnormalised weights: divide by the running sum at the "
            "end, out = acc / l_i[:, None]",
            lambda c: online_softmax_attention(*c.inputs, divide=False)),
    *RUNNING_MAX_SUSPECTS,
)

CAUSAL_SUSPECTS = (
    Suspect("causal mask off by one (diagonal excluded)",
            "a query must see its own key: keep keys <= rows (not <), so row 0 is not left with "
            "no key at all (0 / 0 = NaN)",
            _causal_variant(lambda r, k: k < r)),
    Suspect("causal mask off by one (one key too many)",
            "each query sees the key right after it: the mask is keys <= rows, not rows + 1",
            _causal_variant(lambda r, k: k <= r + 1)),
    Suspect("causal mask reversed",
            "each query sees the keys at or *after* it: the mask is keys[None, :] <= rows[:, None] "
            "(keys at or before the query)",
            _causal_variant(lambda r, k: k >= r)),
    Suspect("causal mask not applied",
            "within a block of query rows every row sees every loaded key, its block's future ones "
            "included: causal_mask must be False where the key comes after the row",
            _causal_variant(lambda r, k: torch.ones_like(k >= r))),
    Suspect("diagonal block skipped",
            "the loop stops before the query block's own keys, so no row sees the keys of its own "
            "block (the first block's rows see none: 0 / 0 = NaN). The loop must run to the end "
            "of the block: causal_key_end = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)",
            _causal_variant(lambda r, k, block_m: k < (r // block_m) * block_m, per_block=True)),
)


# ============================================================================================
# The exercises.
# ============================================================================================
PART_TWO: dict[int, Exercise] = {
    6: Exercise(
        6, "layer_norm", "Layer norm, forward and backward",
        "row statistics along axis 1, saved for the backward; dx through the mean and variance",
        [
            Task("layer_norm", _layer_norm_cases, ["BLOCK_ROWS", "MAX_COLS"],
                 [LAYER_NORM_BLOCK_ROWS, LAYER_NORM_MAX_COLS], ["pid (row block)", "column"],
                 suspects=LAYER_NORM_SUSPECTS),
            Task("layer_norm_statistics", _layer_norm_statistics_cases,
                 ["BLOCK_ROWS", "_statistics_per_row"], [LAYER_NORM_BLOCK_ROWS, 2],
                 ["pid (row block)", "mean | rstd"], suspects=LAYER_NORM_STATISTICS_SUSPECTS),
            Task("layer_norm_backward", _layer_norm_backward_cases, ["BLOCK_ROWS", "MAX_COLS"],
                 [LAYER_NORM_BLOCK_ROWS, LAYER_NORM_MAX_COLS], ["pid (row block)", "column"],
                 suspects=LAYER_NORM_BACKWARD_SUSPECTS),
            StretchTask("layer_norm_weight_grads", _layer_norm_weight_grads_cases,
                        ["_dweight_and_dbias", "MAX_COLS"], [2, LAYER_NORM_MAX_COLS],
                        ["dweight | dbias", "column"], suspects=LAYER_NORM_WEIGHT_GRADS_SUSPECTS),
        ],
    ),
    7: Exercise(
        7, "fast_matmul", "Making matmul fast",
        "grouped program ordering (GROUP_SIZE_M) for the L2 cache, @triton.autotune, do_bench",
        [
            Task("tile_visits", _tile_cases(lambda m, n, g: tile_visit_counts(
                     grouped_tile_order(m, n, g), m, n)),
                 ["_one_tile_row", "_one_tile_column"], [1, 1],
                 ["tile row (pid_m)", "tile column (pid_n)"], suspects=TILE_VISITS_SUSPECTS),
            Task("tile_order", _tile_cases(grouped_tile_order),
                 ["_one_program", "_pid_m_and_pid_n"], [1, 2], ["program id", "pid_m | pid_n"],
                 suspects=TILE_ORDER_SUSPECTS),
            Task("matmul", _fast_matmul_cases, ["BLOCK_M", "BLOCK_N"], list(MATMUL_FIRST_BLOCK),
                 ["tile row (pid_m)", "tile column (pid_n)"], matmul_operands=True),
        ],
    ),
    8: Exercise(
        8, "flash_attention", "Flash attention",
        "the online softmax: a running max and sum, rescaling, one division at the end; causal",
        [
            Task("attention", _attention_cases, ["BLOCK_M", "HEAD_DIM_MAX"],
                 [ATTENTION_BLOCK_M, ATTENTION_HEAD_DIM_MAX],
                 ["pid_0 (query block)", "head dim"], leading_axis="batch x head (pid_1)",
                 suspects=ATTENTION_SUSPECTS),
            StretchTask("attention_causal", _causal_cases, ["BLOCK_M", "HEAD_DIM_MAX"],
                        [ATTENTION_BLOCK_M, ATTENTION_HEAD_DIM_MAX],
                        ["pid_0 (query block)", "head dim"], leading_axis="batch x head (pid_1)",
                        suspects=CAUSAL_SUSPECTS),
        ],
    ),
}

# The key block of the attention loop is no grid axis: the checker hands it to the suspects as
# case.constants (set as an attribute: a checker without that field ignores it).
for _task in PART_TWO[8].tasks:
    _task.constants = ("BLOCK_N",)

# Exercise 7's tuning list: the interpreter launches only its first config, so each config is
# launched once on its own (a check of the module, not of a case; a loop without it ignores it).
PART_TWO[7].tasks[2].module_check = tuning_configs_verdict
