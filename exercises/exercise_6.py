"""Exercise 6: layer norm, forward and backward. Row statistics, saved for the backward pass.

y = (x - mean) * rstd * weight + bias over each row of a 2-D matrix, where ``mean`` is the row's
mean and ``rstd = 1 / sqrt(var + eps)``, with ``var`` the *biased* variance (divided by n_cols, as
``F.layer_norm`` does). Like softmax (exercise 5) it is one read and one write per element: each
program loads whole rows, reduces them in registers and stores the result once.

Each program owns BLOCK_ROWS rows, a (BLOCK_ROWS, BLOCK_COLS) tile: with short rows one row per
program would leave most lanes idle. That gives the tile two axes, and the reductions must run
along the row: ``axis=1``. ``keep_dims=True`` keeps the statistics as a (BLOCK_ROWS, 1) column,
ready to broadcast against the tile. (A shape error where mean is stored means a sum ran down the
columns, ``axis=0``, giving a (1, BLOCK_COLS) row instead.)

The forward also saves ``mean`` and ``rstd`` (one float32 each per row). The backward needs
x̂ = (x - mean) * rstd again; reading two floats per row is much cheaper than reducing the row a
second time. Given dy = dL/dy, with means taken along the row and ``wdy = weight * dy``::

    dx = rstd * (wdy - x̂ * mean(x̂ * wdy) - mean(wdy))

The two mean terms are there because moving one x moves the row's mean and variance too.
``dweight = sum over rows of dy * x̂`` and ``dbias = sum over rows of dy`` reduce the *other* way,
down the columns (``axis=0``); each program adds up its own rows, and the host sums those partial
rows (a fixed order: the same result every run, which atomics would not give).

Replace each ``...`` marked ``# TODO n`` with code, in order, then run
``python exercises/exercise_6.py`` (or ``exercise_6``): the checker tries ragged row lengths, rows
with a tiny variance, a large eps and float16, and checks y, the saved statistics and dx one by
one. TODO 12-13 are a stretch (dweight and dbias): the core is done when every other line passes.
Stuck? ``print_if(f"mean={mean}", "=0")`` prints program 0's statistics (interpreter mode), and
``solutions/solution_6.py`` has an answer.
"""

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401

BLOCK_ROWS = 4  # rows per program
MAX_COLS = 4096  # the longest row one program holds in registers (longer rows need a loop)


@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, n_cols, eps,
                          BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    row_mask = rows[:, None] < n_rows  # (BLOCK_ROWS, 1)
    mask = row_mask & (cols[None, :] < n_cols)
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    mean = ...  # TODO 1: each row's mean: tl.sum(x, axis=1, keep_dims=True) / n_cols (a column)
    xc = ...  # TODO 2: x - mean, with the padding lanes zeroed: tl.where(mask, x - mean, 0.0)
    var = ...  # TODO 3: the biased variance: the row sum of xc * xc divided by n_cols (not n_cols - 1)
    rstd = ...  # TODO 4: 1 / sqrt(var + eps), eps inside the square root (tl.sqrt)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = ...  # TODO 5: normalise, then scale and shift: xc * rstd * w + b (w and b as rows: w[None, :])
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    ...  # TODO 6: save mean and rstd for the backward: tl.store at mean_ptr / rstd_ptr + rows[:, None], mask=row_mask


def _warps(elements: int) -> int:
    """More warps for bigger tiles: about 16 values per thread, so the tile stays in registers
    (ignored by the interpreter)."""
    return 16 if elements >= 8192 else 8 if elements >= 2048 else 4


def _check_rows(x: torch.Tensor, **vectors: torch.Tensor) -> None:
    check_tensors_gpu_ready(x, *vectors.values())
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D matrix (rows, cols), got shape {tuple(x.shape)}")
    if x.shape[1] > MAX_COLS:
        raise ValueError(f"rows of more than {MAX_COLS} columns need a chunked kernel, got "
                         f"{x.shape[1]} (triton_workshop.layer_norm has one)")
    for name, t in vectors.items():
        if t.shape != (x.shape[1],):
            raise ValueError(f"{name} must have shape ({x.shape[1]},), got {tuple(t.shape)}")


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                       eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y, and the mean and rstd of each row (float32) that the backward needs."""
    _check_rows(x, weight=weight, bias=bias)
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    mean = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    BLOCK_COLS = triton.next_power_of_2(n_cols)
    grid = ...  # TODO 7: a 1-tuple: one program per BLOCK_ROWS rows (cdiv rounds up)
    layer_norm_fwd_kernel[grid](x, weight, bias, y, mean, rstd, n_rows, n_cols, eps,
                                BLOCK_ROWS=BLOCK_ROWS, BLOCK_COLS=BLOCK_COLS,
                                num_warps=_warps(BLOCK_ROWS * BLOCK_COLS))
    return y, mean, rstd


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float = 1e-5) -> torch.Tensor:
    return layer_norm_forward(x, weight, bias, eps)[0]


def layer_norm_statistics(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                          eps: float = 1e-5) -> torch.Tensor:
    """The saved statistics side by side, (n_rows, 2): column 0 the mean, column 1 rstd."""
    _, mean, rstd = layer_norm_forward(x, weight, bias, eps)
    return torch.stack((mean, rstd), dim=1)


@triton.jit
def layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr,
                          dw_partial_ptr, db_partial_ptr, n_rows, n_cols,
                          BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
                          WEIGHT_GRADS: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    row_mask = rows[:, None] < n_rows
    col_mask = cols < n_cols
    mask = row_mask & col_mask[None, :]
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + rows[:, None], mask=row_mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows[:, None], mask=row_mask, other=0.0)
    xhat = ...  # TODO 8: the normalised input (x - mean) * rstd, 0 on the padding (tl.where)
    wdy = w[None, :] * dy
    c1 = ...  # TODO 9: the mean along each row of xhat * wdy (axis=1, keep_dims=True)
    c2 = ...  # TODO 10: the mean along each row of wdy
    dx = ...  # TODO 11: (wdy - (xhat * c1 + c2)) * rstd
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if WEIGHT_GRADS:
        dw_rows = ...  # TODO 12 (stretch): this program's part of dweight: dy * xhat summed down the columns (axis=0)
        db_rows = ...  # TODO 13 (stretch): its share of dbias: dy summed down the columns
        tl.store(dw_partial_ptr + pid * n_cols + cols, dw_rows, mask=col_mask)
        tl.store(db_partial_ptr + pid * n_cols + cols, db_rows, mask=col_mask)


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                        mean: torch.Tensor, rstd: torch.Tensor, weight_grads: bool = False):
    """dx; with ``weight_grads`` also dweight and dbias: (dx, dweight, dbias)."""
    _check_rows(x, weight=weight)
    check_tensors_gpu_ready(dy, mean, rstd)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {tuple(x.shape)}, got {tuple(dy.shape)}")
    for name, t in (("mean", mean), ("rstd", rstd)):
        if t.shape != (x.shape[0],) or t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 of shape ({x.shape[0]},), "
                             f"got {t.dtype} {tuple(t.shape)}")
    n_rows, n_cols = x.shape
    dx = torch.empty_like(x)
    n_programs = cdiv(n_rows, BLOCK_ROWS)
    if weight_grads:
        dw_partial = torch.empty((n_programs, n_cols), dtype=torch.float32, device=x.device)
        db_partial = torch.empty((n_programs, n_cols), dtype=torch.float32, device=x.device)
    else:  # never touched: WEIGHT_GRADS=False compiles the stores out
        dw_partial = db_partial = dx
    BLOCK_COLS = triton.next_power_of_2(n_cols)
    layer_norm_bwd_kernel[(n_programs,)](dy, x, weight, mean, rstd, dx, dw_partial, db_partial,
                                         n_rows, n_cols, BLOCK_ROWS=BLOCK_ROWS,
                                         BLOCK_COLS=BLOCK_COLS, WEIGHT_GRADS=weight_grads,
                                         num_warps=_warps(BLOCK_ROWS * BLOCK_COLS))
    if not weight_grads:
        return dx
    return dx, dw_partial.sum(0).to(weight.dtype), db_partial.sum(0).to(weight.dtype)


def layer_norm_weight_grads(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                            mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """dweight and dbias side by side, (2, n_cols): row 0 dweight, row 1 dbias."""
    _, dweight, dbias = layer_norm_backward(dy, x, weight, mean, rstd, weight_grads=True)
    return torch.stack((dweight, dbias))


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
