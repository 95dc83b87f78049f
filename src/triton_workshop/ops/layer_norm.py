"""Layer normalisation: per-row statistics forward, and a deterministic reduction backward.

    y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)

over the trailing ``normalized_shape`` dims, i.e. over each row of ``x`` viewed as
``(n_rows, n_cols)``.

**Forward.** A row is loaded once into registers; mean and variance are taken in fp32 (fp64 for
fp64 input) with the two-pass formula ``var = mean((x - mean)**2)`` on the values already in
registers, which costs no extra memory traffic and avoids the cancellation of
``E[x**2] - E[x]**2``. One read, one write, plus 8 bytes a row of saved ``mean`` and ``rstd`` that
the backward reuses instead of recomputing. Short rows are packed several to a program, as in
softmax. Rows longer than :data:`SINGLE_BLOCK_MAX_COLS` are streamed in chunks: the first pass
takes exact mean and sum of squared deviations of each chunk and merges them (Chan et al.'s
parallel variance update, as stable as the two-pass formula), the second normalises. Two reads
(the second mostly from L2: the row was just read), one write.

**Backward.** With ``xhat = (x - mean) * rstd`` and ``g = dy * weight``:

    dx      = rstd * (g - mean(g * xhat) * xhat - mean(g))      per row
    dweight = sum over rows of dy * xhat
    dbias   = sum over rows of dy

``dx`` is per row, like the forward. ``dweight`` and ``dbias`` are reductions *across* rows: an
``atomic_add`` from every row into one vector would be fast but not deterministic (float addition
is not associative and the order of atomics changes between runs). Instead each program owns a
group of consecutive rows, accumulates its partial ``dweight``/``dbias`` in fp32 registers while it
computes ``dx`` for those rows (one read of ``x`` and ``dy``), and writes them to row ``pid`` of an
``(n_programs, n_cols)`` buffer; ``torch.sum`` over that small buffer finishes the job. The same
shapes give the same partition and the same summation order: bit-identical gradients every run.
Rows longer than :data:`BACKWARD_SINGLE_BLOCK_MAX_COLS` use two kernels: ``dx`` per row (in one
pass up to :data:`BACKWARD_DX_SINGLE_BLOCK_MAX_COLS`, in two chunked passes beyond), and a
column-tiled kernel that writes the same kind of partial sums.

``x``, ``dy`` and the parameters are made contiguous by the launchers (a copy only when they are
not already); ``weight`` and ``bias`` may have a different float dtype from ``x``: they are read
in their own dtype and widened in the kernel. The output has ``x``'s dtype.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import acc_dtype, chunk_tile, num_warps_for, register_op, row_tile
from ._common import FLOAT_DTYPES_WITH_FP64

#: Longest row the forward keeps whole in registers; longer rows are streamed in
#: :data:`FORWARD_CHUNK_COLS` chunks. Read at every launch, so a test can lower it. Measured on
#: an H100 (fp16, diagnose.py ln_long), the chunked kernel with 8192-column chunks is the faster
#: from 8192 columns on, although it reads each row twice (the second time from L2): 4096 x 16384
#: in 97 µs against 116 (torch.compile 95), 4096 x 12288 78 against 103, 8192 x 8192 92 against
#: 101. A whole row of 8192-16384 values in registers leaves one program an SM.
SINGLE_BLOCK_MAX_COLS = 4096
#: The forward's chunk (a power of two): one chunk holds a whole row of up to 8192 columns.
FORWARD_CHUNK_COLS = 8192
#: The same for the backward, lower: its program also keeps the running dweight/dbias sums and
#: the weight row in registers. Measured on an H100 (fp16, 32M elements): at 8192 columns the
#: fused kernel moves 1860 GB/s against 1420 for the chunked pair, at 12288-16384 it spills and
#: falls to 220-270 GB/s against 1280-1390.
BACKWARD_SINGLE_BLOCK_MAX_COLS = 8192
#: Longer rows up to this length still get ``dx`` from one single-block pass (the fused kernel
#: with the dweight/dbias sums off: x, dy and the weight row only, as in the forward), and the
#: partial sums from the column-tiled kernel; longer still, ``dx`` takes two chunked passes over
#: each row. Compiled for sm_90 (Triton 3.9), fp16 rows of 16384 with 32 warps: 64 registers,
#: no spills. On an H100, fp16 4096 x 16384: dx in 140 µs against 186 for the two passes.
BACKWARD_DX_SINGLE_BLOCK_MAX_COLS = 16384
#: Elements per loop step on the backward's chunked paths (a power of two).
CHUNK_COLS = 4096
#: Elements a single-block program aims to own (short rows are packed several to a program).
TILE_ELEMS = 4096
MAX_ROWS_PER_PROGRAM = 64
#: Backward programs per SM: each accumulates partial dweight/dbias over its group of rows, so
#: there are ``programs x n_cols`` partials to sum at the end. 2 was fastest on an H100 (4 and 8
#: were up to 25% slower: more partials to write and sum, no more bandwidth).
BACKWARD_PROGRAMS_PER_SM = 2
#: Single-block backward tiles of at least this many elements (rows of 4097-8192 columns) are
#: "wide": a program holds the weight row and the running dweight/dbias besides x and dy. With
#: 16 warps that is 16 values of each a thread, 112-115 registers on sm_90: one 512-thread program
#: per SM, so half of a 2-per-SM grid waited for a second wave and an SM had 16 warps and one row
#: in flight. Wide tiles run :data:`BACKWARD_WIDE_NUM_WARPS` warps (64 registers, no spills) and
#: one program per SM (it fills the SM's registers: a second could not be resident anyway).
BACKWARD_WIDE_TILE_ELEMS = 8192
BACKWARD_WIDE_NUM_WARPS = 32
#: The single-block backward's row loop is software-pipelined over this many stages
#: (``cp.async``): the ``x`` and ``dy`` tiles of the next ``stages - 1`` iterations are loaded
#: into shared memory while the program reduces and stores the current one. Without it a
#: persistent program has no load in flight during that time. Used only where those
#: ``stages - 1`` tiles fit in :data:`BACKWARD_PREFETCH_BYTES` (fp16/bf16 rows up to 8192, fp32 up
#: to 4096); otherwise the loop is not pipelined (1 stage): compiled for sm_90 with Triton 3.6,
#: an fp32 row of 8192 pipelined over 2 stages spilled at the 64 registers 32 warps allow.
BACKWARD_STAGES = 3
#: 64 KiB of shared memory a program: fits any GPU with ``cp.async`` (sm_80 and later).
BACKWARD_PREFETCH_BYTES = 64 * 1024
#: Software-pipeline stages of the column-tiled dweight/dbias kernel's row loop.
DWDB_STAGES = 3


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
@triton.jit
def layer_norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, eps: tl.float64,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    """Single-block forward: ``ROWS`` whole rows per program."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]  # int64: rows * n_cols may pass 2**31
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(ACC)
    # Statistics of x - x[row, 0]: with |mean| >> std a plain sum loses the row's digits to its
    # offset (a constant row would get a variance of rounding noise and y != bias). Each shifted
    # value is exact (Sterbenz) and of the size of the spread; masked lanes count as 0.
    shift = tl.load(x_ptr + rows * n_cols, mask=row_mask, other=0.0).to(ACC)
    shifted = tl.where(mask, x - shift[:, None], 0.0)
    mean_shifted = tl.sum(shifted, axis=1) / n_cols
    centred = tl.where(mask, shifted - mean_shifted[:, None], 0.0)
    var = tl.sum(centred * centred, axis=1) / n_cols
    # eps arrives as fp64 and is rounded once to ACC (fp64 rows keep all of it).
    rstd = 1.0 / tl.sqrt(var + tl.full([], eps, ACC))
    mean = shift + mean_shifted
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(ACC)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(ACC)[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _chunk_moments(x_row, start, n_cols, shift, ACC: tl.constexpr, BLOCK_N: tl.constexpr):
    """Count, mean and sum of squared deviations of one chunk of a row, shifted by ``shift``
    (exact, two-pass in registers)."""
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0).to(ACC) - shift, 0.0)
    count = tl.minimum(n_cols - start, BLOCK_N).to(ACC)
    mean = tl.sum(x, axis=0) / count
    centred = tl.where(mask, x - mean, 0.0)
    return count, mean, tl.sum(centred * centred, axis=0)


@triton.jit
def layer_norm_fwd_chunked_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_cols, eps: tl.float64,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Forward for long rows: one row per program, statistics pass then normalising pass."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    y_row = y_ptr + row * n_cols

    # Chan's update merges (count, mean, M2) of the row so far with those of the next chunk; M2
    # is a sum of squared deviations from a mean, never a difference of large sums. All of it
    # on x - x[0], as in the single-block kernel (a row's offset costs no digits).
    shift = tl.load(x_row).to(ACC)
    count, mean, m2 = _chunk_moments(x_row, 0, n_cols, shift, ACC, BLOCK_N)
    for start in range(BLOCK_N, n_cols, BLOCK_N):
        chunk_count, chunk_mean, chunk_m2 = _chunk_moments(x_row, start, n_cols, shift, ACC,
                                                           BLOCK_N)
        total = count + chunk_count
        delta = chunk_mean - mean
        mean += delta * (chunk_count / total)
        m2 += chunk_m2 + delta * delta * (count * chunk_count / total)
        count = total
    rstd = 1.0 / tl.sqrt(m2 / n_cols + tl.full([], eps, ACC))
    tl.store(mean_ptr + row, shift + mean)
    tl.store(rstd_ptr + row, rstd)

    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
        y = ((x - shift) - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(ACC)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layer_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
    n_rows, n_cols, rows_per_program,
    HAS_WEIGHT: tl.constexpr, COMPUTE_DX: tl.constexpr,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr,
):
    """Single-block backward: ``dx`` for a group of rows, and that group's partial
    ``dweight``/``dbias`` (row ``pid`` of the partial buffers), reading ``x`` and ``dy`` once.
    The row loop is pipelined over ``STAGES`` stages (1: not pipelined): the loads of the next
    tiles are in flight while this one is reduced and stored."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    first_row = pid * rows_per_program
    end_row = tl.minimum(first_row + rows_per_program, n_rows)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(ACC)
    # Running sums kept as whole tiles, in the layout x and dy arrive in: reducing them over the
    # rows every iteration would convert layouts through shared memory (barriers) in the loop.
    # One reduction after the loop instead.
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=ACC)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=ACC)
    for tile_start in tl.range(first_row, end_row, ROWS, num_stages=STAGES):
        rows = tile_start + tl.arange(0, ROWS)
        row_mask = rows < end_row
        mask = row_mask[:, None] & col_mask[None, :]
        offs = rows[:, None] * n_cols + cols[None, :]
        # Padding reads 0 and xhat is masked to 0 there, so padding adds nothing to any sum.
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(ACC)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(ACC)
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if COMPUTE_DX:
            g = dy
            if HAS_WEIGHT:
                g = dy * w[None, :]
            mean_g_xhat = tl.sum(g * xhat, axis=1) / n_cols
            mean_g = tl.sum(g, axis=1) / n_cols
            dx = (g - mean_g_xhat[:, None] * xhat - mean_g[:, None]) * rstd[:, None]
            tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * xhat
        if COMPUTE_DB:
            db_acc += dy
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    if COMPUTE_DB:
        tl.store(db_partial_ptr + pid * n_cols + cols, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def layer_norm_bwd_dx_chunked_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr,
    n_cols,
    HAS_WEIGHT: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``dx`` for long rows, one row per program: the two row means, then ``dx``."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    dy_row = dy_ptr + row * n_cols
    dx_row = dx_ptr + row * n_cols
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)

    # Per-lane partial sums, reduced once after the loop.
    g_xhat_lanes = tl.zeros([BLOCK_N], dtype=ACC)
    g_lanes = tl.zeros([BLOCK_N], dtype=ACC)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
        g = tl.load(dy_row + cols, mask=mask, other=0.0).to(ACC)
        if HAS_WEIGHT:
            g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
        g_xhat_lanes += g * tl.where(mask, (x - mean) * rstd, 0.0)
        g_lanes += g
    mean_g_xhat = tl.sum(g_xhat_lanes, axis=0) / n_cols
    mean_g = tl.sum(g_lanes, axis=0) / n_cols

    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
        g = tl.load(dy_row + cols, mask=mask, other=0.0).to(ACC)
        if HAS_WEIGHT:
            g = g * tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
        dx = (g - mean_g_xhat * ((x - mean) * rstd) - mean_g) * rstd
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layer_norm_bwd_dwdb_chunked_kernel(
    dy_ptr, x_ptr, mean_ptr, rstd_ptr, dw_partial_ptr, db_partial_ptr,
    n_rows, n_cols, rows_per_program,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """Partial ``dweight``/``dbias`` for long rows: program ``(g, c)`` sums rows of group ``g``
    over column chunk ``c`` into row ``g`` of the partial buffers, in a fixed order."""
    group = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    first_row = group * rows_per_program
    end_row = tl.minimum(first_row + rows_per_program, n_rows)
    dw_sum = tl.zeros([BLOCK_N], dtype=ACC)
    db_sum = tl.zeros([BLOCK_N], dtype=ACC)
    for row in tl.range(first_row, end_row, num_stages=STAGES):
        x = tl.load(x_ptr + row * n_cols + cols, mask=col_mask, other=0.0).to(ACC)
        dy = tl.load(dy_ptr + row * n_cols + cols, mask=col_mask, other=0.0).to(ACC)
        if COMPUTE_DW:
            dw_sum += dy * (x - tl.load(mean_ptr + row)) * tl.load(rstd_ptr + row)
        if COMPUTE_DB:
            db_sum += dy
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + group * n_cols + cols, dw_sum, mask=col_mask)
    if COMPUTE_DB:
        tl.store(db_partial_ptr + group * n_cols + cols, db_sum, mask=col_mask)


@triton.jit
def layer_norm_bwd_sum_partials_kernel(
    dw_partial_ptr, db_partial_ptr, dw_ptr, db_ptr,
    n_partials, n_cols,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ACC: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Second stage of the ``dweight``/``dbias`` reduction: sum the ``(n_partials, n_cols)``
    buffers over their rows in a fixed order, both in one launch, and store in the parameters'
    dtypes (no separate cast kernels)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    dw_acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=ACC)
    db_acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=ACC)
    for start in range(0, n_partials, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < n_partials)[:, None] & col_mask[None, :]
        offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        if COMPUTE_DW:
            dw_acc += tl.load(dw_partial_ptr + offs, mask=mask, other=0.0)
        if COMPUTE_DB:
            db_acc += tl.load(db_partial_ptr + offs, mask=mask, other=0.0)
    if COMPUTE_DW:
        tl.store(dw_ptr + cols, tl.sum(dw_acc, axis=0).to(dw_ptr.dtype.element_ty), mask=col_mask)
    if COMPUTE_DB:
        tl.store(db_ptr + cols, tl.sum(db_acc, axis=0).to(db_ptr.dtype.element_ty), mask=col_mask)


# --------------------------------------------------------------------------------------------
# Launchers, registered as ops.
# --------------------------------------------------------------------------------------------
def _rows_cols(x: torch.Tensor, norm_ndim: int) -> tuple[int, int]:
    shape = x.shape
    if norm_ndim == 1 and shape[-1]:  # the common case, without slicing the shape twice
        return x.numel() // shape[-1], shape[-1]
    return math.prod(shape[: len(shape) - norm_ndim]), math.prod(shape[len(shape) - norm_ndim :])


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """mean/rstd and the partial sums are kept in the kernels' arithmetic type."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _layer_norm_forward_fake(x, weight, bias, norm_ndim, eps):
    n_rows, _ = _rows_cols(x, norm_ndim)
    stats = _stats_dtype(x.dtype)
    return (
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        x.new_empty(n_rows, dtype=stats),
        x.new_empty(n_rows, dtype=stats),
    )


# Autocast as F.layer_norm: on torch's CUDA fp32 list, on no CPU list (there: dtypes as without).
@register_op("layer_norm_forward", fake=_layer_norm_forward_fake, autocast={"cuda": "fp32"})
def layer_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    norm_ndim: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, mean, rstd)`` of layer norm over the last ``norm_ndim`` dims of ``x`` (arguments
    already checked by :func:`layer_norm`); ``mean`` and ``rstd`` have one value per row."""
    n_rows, n_cols = _rows_cols(x, norm_ndim)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    stats = _stats_dtype(x.dtype)
    mean = x.new_empty(n_rows, dtype=stats)
    rstd = x.new_empty(n_rows, dtype=stats)
    if n_rows == 0:
        return y, mean, rstd
    if n_cols == 0:  # statistics of nothing, as PyTorch: NaN
        return y, mean.fill_(math.nan), rstd.fill_(math.nan)
    x = x.contiguous()
    w = weight.contiguous() if weight is not None else x
    b = bias.contiguous() if bias is not None else x  # never read when HAS_BIAS is off
    kernel, grid, scalars, consts, prepared = _forward_plan(
        n_rows, n_cols, eps, (x.dtype, w.dtype, b.dtype), weight is not None, bias is not None,
        _forward_knobs())
    with runtime.device_guard(x):
        runtime.launch_kernel(kernel, grid, (x, w, b, y, mean, rstd), scalars, consts, prepared)
    return y, mean, rstd


def _forward_knobs() -> tuple:
    return SINGLE_BLOCK_MAX_COLS, FORWARD_CHUNK_COLS, TILE_ELEMS, MAX_ROWS_PER_PROGRAM


@functools.lru_cache(maxsize=1024)
def _forward_plan(n_rows, n_cols, eps, dtypes, has_weight, has_bias, knobs):
    """``(kernel, grid, scalar args, constexpr args, prepared launches)`` of the forward launch
    (``dtypes``: of x, weight and bias as launched). Cached: the same few shapes come back
    every step, and on a slow host working this out costs as much as a launch."""
    single_block_max, chunk_cols, tile_elems, max_rows = knobs
    consts = dict(HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, ACC=acc_dtype(dtypes[0]))
    if n_cols <= single_block_max:
        tile = row_tile(n_cols, n_rows, tile_elems=tile_elems, max_rows=max_rows)
        consts.update(BLOCK_N=tile.block_cols, ROWS=tile.rows, num_warps=tile.num_warps)
        return (layer_norm_fwd_kernel, (runtime.cdiv(n_rows, tile.rows),), (n_rows, n_cols, eps),
                consts, {})
    tile = chunk_tile(n_cols, chunk_cols)
    consts.update(BLOCK_N=tile.block_cols, num_warps=tile.num_warps)
    return layer_norm_fwd_chunked_kernel, (n_rows,), (n_cols, eps), consts, {}


def _grad_dtypes(x, weight, bias_dtype) -> tuple[torch.dtype, torch.dtype]:
    """dtypes of ``dweight`` and ``dbias``: the parameters' own when known, else the stats'."""
    stats = _stats_dtype(x.dtype)
    return (weight.dtype if weight is not None else stats,
            bias_dtype if bias_dtype is not None else stats)


def _layer_norm_backward_fake(dy, x, weight, mean, rstd, norm_ndim, need_dx, need_dw, need_db,
                              bias_dtype=None):
    _, n_cols = _rows_cols(x, norm_ndim)
    dw_dtype, db_dtype = _grad_dtypes(x, weight, bias_dtype)
    return (
        torch.empty(x.shape if need_dx else (0,), dtype=x.dtype, device=x.device),
        x.new_empty(n_cols if need_dw else 0, dtype=dw_dtype),
        x.new_empty(n_cols if need_db else 0, dtype=db_dtype),
    )


#: The partial-sum reduction's tile: BLOCK_P partial rows x BLOCK_N columns a step (narrow, so
#: that even 1024 columns are 32 programs).
SUM_PARTIALS_BLOCK_P = 32
SUM_PARTIALS_BLOCK_N = 32


def _backward_knobs() -> tuple:
    return (BACKWARD_SINGLE_BLOCK_MAX_COLS, CHUNK_COLS, TILE_ELEMS, MAX_ROWS_PER_PROGRAM,
            BACKWARD_PROGRAMS_PER_SM, BACKWARD_WIDE_TILE_ELEMS, BACKWARD_WIDE_NUM_WARPS,
            BACKWARD_STAGES, BACKWARD_PREFETCH_BYTES, BACKWARD_DX_SINGLE_BLOCK_MAX_COLS,
            DWDB_STAGES)


@functools.lru_cache(maxsize=1024)
def _backward_plan(n_rows, n_cols, dtypes, has_weight, need, n_sms, knobs):
    """The backward's launches for one shape: ``(n_partials, launches)`` with ``launches`` a
    dict of kernel name -> ``(kernel, grid, scalar args, constexpr args, prepared launches)``
    in launch order. Cached like the forward's plan. ``dtypes``: of ``dy``, ``x``, the weight
    as launched, ``dweight`` and ``dbias``."""
    _, need_dw, need_db = need
    dy_dtype, dtype = dtypes[:2]
    acc = acc_dtype(dtype)
    n_partials, launches = _backward_main_launches(
        n_rows, n_cols, dy_dtype.itemsize + dtype.itemsize, acc, has_weight, need, n_sms, knobs)
    if need_dw or need_db:
        # The second, small stage of the reduction, in a fixed order: deterministic.
        launches["sum"] = (
            layer_norm_bwd_sum_partials_kernel, (runtime.cdiv(n_cols, SUM_PARTIALS_BLOCK_N),),
            (n_partials, n_cols),
            dict(COMPUTE_DW=need_dw, COMPUTE_DB=need_db, ACC=acc, BLOCK_P=SUM_PARTIALS_BLOCK_P,
                 BLOCK_N=SUM_PARTIALS_BLOCK_N, num_warps=4),
            {})
    return n_partials, launches


def _backward_main_launches(n_rows, n_cols, bytes_per_elem_pair, acc, has_weight, need, n_sms,
                            knobs):
    """``(n_partials, launches)``: the backward's launches before the partial sums: one fused
    kernel for rows that fit a block, else dx and the dweight/dbias partials chunk by chunk.
    ``bytes_per_elem_pair``: bytes of one ``x`` and one ``dy`` element."""
    (single_block_max, chunk_cols, tile_elems, max_rows, programs_per_sm, wide_tile_elems,
     wide_num_warps, stages, prefetch_bytes, dx_single_block_max, dwdb_stages) = knobs
    need_dx, need_dw, need_db = need
    if n_cols <= single_block_max:
        tile = row_tile(n_cols, n_rows, tile_elems=tile_elems, max_rows=max_rows)
        elems = tile.rows * tile.block_cols
        wide = elems >= wide_tile_elems
        # A fixed partition of the rows into groups (it depends only on the shape and the GPU):
        # the same summation order, so the same bits, every run.
        n_programs = min(n_sms * (1 if wide else programs_per_sm), runtime.cdiv(n_rows, tile.rows))
        rows_per_program = runtime.cdiv(n_rows, n_programs)
        n_programs = runtime.cdiv(n_rows, rows_per_program)
        # Pipeline the row loop where the prefetched x and dy tiles fit in shared memory.
        prefetch = (stages - 1) * elems * bytes_per_elem_pair
        consts = dict(
            HAS_WEIGHT=has_weight, COMPUTE_DX=need_dx, COMPUTE_DW=need_dw, COMPUTE_DB=need_db,
            ACC=acc, BLOCK_N=tile.block_cols, ROWS=tile.rows,
            STAGES=stages if prefetch <= prefetch_bytes else 1,
            num_warps=wide_num_warps if wide else tile.num_warps,
        )
        launches = {"fused": (layer_norm_bwd_kernel, (n_programs,),
                              (n_rows, n_cols, rows_per_program), consts, {})}
        return n_programs, launches
    tile = chunk_tile(n_cols, chunk_cols)
    launches = {}
    if need_dx and n_cols <= dx_single_block_max:
        # One read of x and dy for dx (not two): without the running sums a whole row fits.
        # Persistent, one wide program an SM. Not pipelined: on an H100 (fp16 4096 x 16384)
        # 2 stages took 144 µs against 140 for 1, and at 12288 columns 123 against 112.
        block_cols = runtime.next_power_of_2(n_cols)
        rows_per_program = runtime.cdiv(n_rows, min(n_sms, n_rows))
        launches["dx_rows"] = (
            layer_norm_bwd_kernel, (runtime.cdiv(n_rows, rows_per_program),),
            (n_rows, n_cols, rows_per_program),
            dict(HAS_WEIGHT=has_weight, COMPUTE_DX=True, COMPUTE_DW=False, COMPUTE_DB=False,
                 ACC=acc, BLOCK_N=block_cols, ROWS=1, STAGES=1, num_warps=wide_num_warps),
            {})
    elif need_dx:
        launches["dx"] = (layer_norm_bwd_dx_chunked_kernel, (n_rows,), (n_cols,), dict(
            HAS_WEIGHT=has_weight, ACC=acc, BLOCK_N=tile.block_cols, num_warps=tile.num_warps),
            {})
    n_col_blocks = runtime.cdiv(n_cols, tile.block_cols)
    n_groups = min(n_rows, runtime.cdiv(n_sms * programs_per_sm, n_col_blocks))
    rows_per_group = runtime.cdiv(n_rows, n_groups)
    n_groups = runtime.cdiv(n_rows, rows_per_group)
    if need_dw or need_db:
        launches["dwdb"] = (layer_norm_bwd_dwdb_chunked_kernel, (n_groups, n_col_blocks),
                            (n_rows, n_cols, rows_per_group), dict(
            COMPUTE_DW=need_dw, COMPUTE_DB=need_db, ACC=acc, BLOCK_N=tile.block_cols,
            STAGES=dwdb_stages, num_warps=num_warps_for(tile.block_cols)), {})
    return n_groups, launches


@register_op("layer_norm_backward", fake=_layer_norm_backward_fake)
def layer_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    norm_ndim: int,
    need_dx: bool,
    need_dw: bool,
    need_db: bool,
    bias_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dweight, dbias)``; each one not asked for is an empty placeholder. ``dweight`` and
    ``dbias`` come flat (the caller reshapes), ``dweight`` in ``weight``'s dtype, ``dbias`` in
    ``bias_dtype`` (both in the arithmetic type, fp32 or fp64, when unknown)."""
    n_rows, n_cols = _rows_cols(x, norm_ndim)
    dw_dtype, db_dtype = _grad_dtypes(x, weight, bias_dtype)
    if n_rows == 0 or n_cols == 0:  # a sum over no rows is 0
        dx = x.new_empty(x.shape if need_dx else (0,))
        dw = x.new_zeros(n_cols if need_dw else 0, dtype=dw_dtype)
        db = x.new_zeros(n_cols if need_db else 0, dtype=db_dtype)
        return dx, dw, db
    dy, x = dy.contiguous(), x.contiguous()
    w = weight.contiguous() if weight is not None else x  # never read when HAS_WEIGHT is off
    plan = _find_backward_plan(n_rows, n_cols, dy.dtype, x.dtype, w.dtype, dw_dtype, db_dtype,
                               weight is not None, (need_dx, need_dw, need_db), x.device)
    with runtime.device_guard(x):
        return _backward_launches(plan, dy, x, w, mean, rstd, n_cols, need_dx, need_dw, need_db,
                                  dw_dtype, db_dtype)


def _find_backward_plan(n_rows, n_cols, dy_dtype, x_dtype, w_dtype, dw_dtype, db_dtype,
                        has_weight, need, device):
    return _backward_plan(n_rows, n_cols, (dy_dtype, x_dtype, w_dtype, dw_dtype, db_dtype),
                          has_weight, need, runtime.num_sms(device), _backward_knobs())


def _backward_launches(plan, dy, x, w, mean, rstd, n_cols, need_dx, need_dw, need_db, dw_dtype,
                       db_dtype):
    """Allocate and launch the backward of a plan (n_rows > 0, n_cols > 0, contiguous dy, x)."""
    n_partials, launches = plan
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    # Row g of the partial buffers: the dweight/dbias sums of row group g (one allocation).
    n_sums = need_dw + need_db
    partials = x.new_empty((max(n_sums, 1), n_partials if n_sums else 0, n_cols),
                           dtype=_stats_dtype(x.dtype))
    dw_partial, db_partial = partials[0], partials[n_sums - 1 if n_sums else 0]
    dw = x.new_empty(n_cols if need_dw else 0, dtype=dw_dtype)
    db = x.new_empty(n_cols if need_db else 0, dtype=db_dtype)
    operands = {
        "fused": (dy, x, w, mean, rstd, dx, dw_partial, db_partial),
        "dx_rows": (dy, x, w, mean, rstd, dx, dw_partial, db_partial),  # the sums: not written
        "dx": (dy, x, w, mean, rstd, dx),
        "dwdb": (dy, x, mean, rstd, dw_partial, db_partial),
        "sum": (dw_partial, db_partial, dw, db),
    }
    for name, (kernel, grid, scalars, consts, prepared) in launches.items():
        runtime.launch_kernel(kernel, grid, operands[name], scalars, consts, prepared)
    return dx, dw, db


def _layer_norm_setup_context(ctx, inputs, output):
    x, weight, bias, norm_ndim, _ = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)  # saved statistics: no gradient flows through them
    # Their incoming gradients would otherwise be materialised as zero tensors (two fill kernels
    # a step) only to be ignored.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.norm_ndim = norm_ndim
    ctx.bias_dtype = bias.dtype if bias is not None else None
    n_rows, n_cols = _rows_cols(x, norm_ndim)
    if getattr(ctx, "eager", False) and n_rows and n_cols and x.is_contiguous() and (
            weight is None or weight.is_contiguous()):
        # The backward's plan, found now on the calling thread for the usual case of a
        # contiguous gradient of x's dtype: the backward then only allocates and launches.
        dw_dtype, db_dtype = _grad_dtypes(x, weight, ctx.bias_dtype)
        ctx.backward_plan = (_find_backward_plan(
            n_rows, n_cols, x.dtype, x.dtype, (weight if weight is not None else x).dtype,
            dw_dtype, db_dtype, weight is not None, tuple(ctx.needs_input_grad[:3]), x.device),
            n_cols, dw_dtype, db_dtype)


@runtime.launch_directly
def _layer_norm_backward_planned(planned, need, dy, x, weight, mean, rstd):
    plan, n_cols, dw_dtype, db_dtype = planned
    return _backward_launches(plan, dy, x, weight if weight is not None else x, mean, rstd,
                              n_cols, *need, dw_dtype, db_dtype)


def _layer_norm_backward_autograd(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    if dy is None:  # y did not reach the loss (grads are not materialised, see setup_context)
        return None, None, None, None, None
    planned = getattr(ctx, "backward_plan", None)
    if (planned is not None and dy.dtype == x.dtype and dy.is_contiguous()
            and dy.device == x.device and runtime.eager_backward()):
        # Autograd runs a CUDA backward on its device thread, already on x's device.
        dx, dw, db = _layer_norm_backward_planned(
            planned, (need_dx, need_dw, need_db), dy, x, weight, mean, rstd)
    else:
        dx, dw, db = layer_norm_backward(
            dy, x, weight, mean, rstd, ctx.norm_ndim, need_dx, need_dw, need_db, ctx.bias_dtype
        )
    if ctx.norm_ndim > 1:  # the kernels return flat dweight/dbias (empty when not needed)
        norm_shape = x.shape[x.dim() - ctx.norm_ndim :]
        dw = dw.view(norm_shape) if need_dw else None
        db = db.view(norm_shape) if need_db else None
    return dx if need_dx else None, dw if need_dw else None, db if need_db else None, None, None


layer_norm_forward.register_autograd(
    _layer_norm_backward_autograd, setup_context=_layer_norm_setup_context
)


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
def _check_normalized_shape(normalized_shape, x: torch.Tensor) -> tuple[int, ...]:
    # Fast path (every training step calls this): one int, or a 1-tuple/list of an int, equal to
    # the last dimension.
    if type(normalized_shape) is int:
        shape = (normalized_shape,)
    elif type(normalized_shape) in (tuple, list, torch.Size) and len(normalized_shape) == 1 \
            and type(normalized_shape[0]) is int:
        shape = (normalized_shape[0],)
    else:
        shape = None
    if shape is not None and x.dim() >= 1 and x.shape[-1] == shape[0]:
        return shape
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        shape = (int(normalized_shape),)
    elif isinstance(normalized_shape, (tuple, list, torch.Size)) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in normalized_shape
    ):
        shape = tuple(int(d) for d in normalized_shape)
    else:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        )
    if not shape:
        raise ValueError("normalized_shape must name at least one dimension, got ()")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"normalized_shape {list(shape)} must match the trailing dimensions of x, "
            f"got x of shape {tuple(x.shape)}"
        )
    return shape


def _check_param(t, name: str, shape: tuple[int, ...]) -> None:
    if t is None:
        return
    runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES_WITH_FP64)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape normalized_shape {shape}, got {tuple(t.shape)}")


def layer_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``torch.nn.functional.layer_norm`` in Triton: fp16/bf16/fp32 inputs with fp32 statistics
    (fp64 computes in fp64), optional ``weight``/``bias`` of any float dtype, differentiable with
    a deterministic ``dweight``/``dbias``, and traceable by ``torch.compile``."""
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES_WITH_FP64)
    shape = _check_normalized_shape(normalized_shape, x)
    _check_param(weight, "weight", shape)
    _check_param(bias, "bias", shape)
    runtime.check_same_device(x=x, weight=weight, bias=bias)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    y, _, _ = layer_norm_forward(x, weight, bias, len(shape), float(eps))
    return y
