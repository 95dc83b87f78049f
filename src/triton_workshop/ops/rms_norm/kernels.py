"""RMSNorm kernels: a one-read forward (with an optional fused residual add), and a deterministic
two-stage backward.

    y = x * rstd * (weight_offset + weight),   rstd = 1 / sqrt(mean(x**2) + eps)

over each row of ``x`` viewed as ``(n_rows, n_cols)`` (contiguous: the launchers make it so).
With a residual, ``x`` is first replaced by ``x + residual`` rounded to ``x``'s dtype (as torch
adds them), which is also written out: the next residual stream. Statistics in ``ACC`` (fp32;
fp64 for fp64 rows). A sum of squares has no cancellation to guard against (every term is
non-negative), so unlike layer norm one pass over registers is exact enough and long rows need no
moment merging.

``ROUND_XHAT`` is the rounding of transformers' LlamaRMSNorm: ``x * rstd`` rounded to ``x``'s dtype
and ``weight_offset + weight`` to the weight's before their product. Without it everything stays
in ``ACC`` and the output is rounded once (torch's ``F.rms_norm``, GemmaRMSNorm).

* :func:`rms_norm_fwd_kernel`: ``ROWS`` whole rows a program; one read, one write, ``rstd`` kept
  for the backward (``STORE_RSTD``; a call that records no gradient has no use for it);
* :func:`rms_norm_fwd_chunked_kernel`: one long row a program, a sum-of-squares pass then a
  normalising pass;
* :func:`rms_norm_bwd_kernel`: ``dx`` for a group of rows and that group's partial ``dweight``
  (no atomics: the same bits every run);
* :func:`rms_norm_bwd_dx_chunked_kernel`, :func:`rms_norm_bwd_dw_chunked_kernel`: the same for
  rows too long for one block, ``dx`` and the partial sums apart.

The partial sums are summed by layer norm's ``layer_norm_bwd_sum_partials_kernel`` (the same
fixed-order column sum). The host code is in ``__init__.py``; why the kernels are built this way
is in docs/kernels/rms_norm.md.
"""

import triton
import triton.language as tl


@triton.jit
def _load_input(x_ptr, residual_ptr, sum_ptr, offs, mask,
                HAS_RESIDUAL: tl.constexpr, STORE_SUM: tl.constexpr, ACC: tl.constexpr):
    """The values a row normalises, in ``ACC``: ``x``, or ``x + residual`` rounded to ``x``'s dtype
    (stored to ``sum_ptr`` when ``STORE_SUM``). Masked lanes are 0 and add nothing to a sum."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # Rounded before normalising, as torch's `x + residual` then rms_norm: the normalised
        # values and the returned sum are the same numbers.
        x = (x.to(ACC) + tl.load(residual_ptr + offs, mask=mask, other=0.0).to(ACC)).to(
            x_ptr.dtype.element_ty)
        if STORE_SUM:
            tl.store(sum_ptr + offs, x, mask=mask)
    return x.to(ACC)


@triton.jit
def _inverse_rms(sum_squares, n_cols, eps, ACC: tl.constexpr):
    # eps arrives as fp64 and is rounded once to ACC (fp64 rows keep all of it).
    return 1.0 / tl.sqrt(sum_squares / n_cols + tl.full([], eps, ACC))


@triton.jit
def _effective_weight(w_ptr, cols, mask, weight_offset, ROUND_XHAT: tl.constexpr,
                      ACC: tl.constexpr):
    """``weight_offset + weight`` in ``ACC`` (padding: 0 + offset, multiplied by padding only)."""
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC) + tl.full([], weight_offset, ACC)
    if ROUND_XHAT:  # `offset + weight` is a tensor of the weight's dtype in torch
        w = w.to(w_ptr.dtype.element_ty).to(ACC)
    return w


@triton.jit
def _rounded_xhat(xhat, x_ptr, ROUND_XHAT: tl.constexpr):
    """``x * rstd`` as the weight multiplies it: rounded to ``x``'s dtype under llama casting."""
    if ROUND_XHAT:
        return xhat.to(x_ptr.dtype.element_ty).to(xhat.dtype)
    return xhat


@triton.jit
def rms_norm_fwd_kernel(
    x_ptr, residual_ptr, w_ptr, y_ptr, sum_ptr, rstd_ptr,
    n_rows, n_cols, eps: tl.float64, weight_offset: tl.float64,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, ROUND_XHAT: tl.constexpr,
    STORE_RSTD: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    """Single-block forward: ``ROWS`` whole rows per program, each read once and written once."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]  # int64: rows * n_cols may pass 2**31
    x = _load_input(x_ptr, residual_ptr, sum_ptr, offs, mask, HAS_RESIDUAL, True, ACC)
    if HAS_WEIGHT:
        # Loaded before the row's sum, not after: its load then overlaps x's instead of adding
        # a trip to memory (L2) between the reduction and the store.
        w = _effective_weight(w_ptr, cols, col_mask, weight_offset, ROUND_XHAT, ACC)[None, :]
    rstd = _inverse_rms(tl.sum(x * x, axis=1), n_cols, eps, ACC)
    y = _rounded_xhat(x * rstd[:, None], x_ptr, ROUND_XHAT)
    if HAS_WEIGHT:
        y = y * w
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_RSTD:
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def rms_norm_fwd_chunked_kernel(
    x_ptr, residual_ptr, w_ptr, y_ptr, sum_ptr, rstd_ptr,
    n_cols, eps: tl.float64, weight_offset: tl.float64,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, ROUND_XHAT: tl.constexpr,
    STORE_RSTD: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Forward for long rows: one row per program, a sum-of-squares pass then a normalising
    pass (the second read mostly from L2: the row was just read)."""
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    # Per-lane partial sums, reduced once after the loop.
    square_lanes = tl.zeros([BLOCK_N], dtype=ACC)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = _load_input(x_ptr, residual_ptr, sum_ptr, row_start + cols, mask, HAS_RESIDUAL, True,
                        ACC)
        square_lanes += x * x
    rstd = _inverse_rms(tl.sum(square_lanes, axis=0), n_cols, eps, ACC)
    if STORE_RSTD:
        tl.store(rstd_ptr + tl.program_id(0), rstd)

    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        # The sum is recomputed from x and residual (the same bits) rather than read back from
        # sum_ptr: a program's own stores need no ordering against its loads that way.
        x = _load_input(x_ptr, residual_ptr, sum_ptr, row_start + cols, mask, HAS_RESIDUAL, False,
                        ACC)
        y = _rounded_xhat(x * rstd, x_ptr, ROUND_XHAT)
        if HAS_WEIGHT:
            y = y * _effective_weight(w_ptr, cols, mask, weight_offset, ROUND_XHAT, ACC)
        tl.store(y_ptr + row_start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dsum_ptr, dx_ptr, dw_partial_ptr,
    n_rows, n_cols, rows_per_program, weight_offset: tl.float64,
    HAS_WEIGHT: tl.constexpr, HAS_DSUM: tl.constexpr, ROUND_XHAT: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, RELOAD_WEIGHT: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr,
):
    """Single-block backward: ``dx`` for a group of rows (plus the gradient that reached the
    residual sum directly, ``HAS_DSUM``), and that group's partial ``dweight`` (row ``pid`` of the
    partial buffer), reading ``x`` and ``dy`` once. The row loop is pipelined over ``STAGES``
    stages (1: not pipelined). ``RELOAD_WEIGHT``: the weight row is read at every step (from
    L1/L2) instead of held in registers across the loop, for rows so long that holding it beside
    the running ``dweight`` sums spills."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    first_row = pid * rows_per_program
    end_row = tl.minimum(first_row + rows_per_program, n_rows)
    if HAS_WEIGHT and not RELOAD_WEIGHT:
        w = _effective_weight(w_ptr, cols, col_mask, weight_offset, ROUND_XHAT, ACC)
    # The running sum kept as a whole tile, in the layout x and dy arrive in: reduced once after
    # the loop instead of converting layouts through shared memory every iteration.
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=ACC)
    for tile_start in tl.range(first_row, end_row, ROWS, num_stages=STAGES):
        rows = tile_start + tl.arange(0, ROWS)
        row_mask = rows < end_row
        mask = row_mask[:, None] & col_mask[None, :]
        offs = rows[:, None] * n_cols + cols[None, :]
        # Padding reads 0, so xhat and dy are 0 there and add nothing to any sum.
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(ACC)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(ACC)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        xhat = x * rstd[:, None]
        if COMPUTE_DX:
            g = dy
            if HAS_WEIGHT:
                if RELOAD_WEIGHT:
                    g = dy * _effective_weight(w_ptr, cols, col_mask, weight_offset, ROUND_XHAT,
                                               ACC)[None, :]
                else:
                    g = dy * w[None, :]
            mean_g_xhat = tl.sum(g * xhat, axis=1) / n_cols
            dx = (g - mean_g_xhat[:, None] * xhat) * rstd[:, None]
            if HAS_DSUM:
                dx += tl.load(dsum_ptr + offs, mask=mask, other=0.0).to(ACC)
            tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += dy * _rounded_xhat(xhat, x_ptr, ROUND_XHAT)
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_mask)


@triton.jit
def _x_and_g_chunk(dy_ptr, x_ptr, w_ptr, row_start, cols, mask, weight_offset,
                   HAS_WEIGHT: tl.constexpr, ROUND_XHAT: tl.constexpr, ACC: tl.constexpr):
    """One chunk of a row's ``x`` and ``g = dy * (weight_offset + weight)``, in ``ACC``."""
    x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(ACC)
    g = tl.load(dy_ptr + row_start + cols, mask=mask, other=0.0).to(ACC)
    if HAS_WEIGHT:
        g = g * _effective_weight(w_ptr, cols, mask, weight_offset, ROUND_XHAT, ACC)
    return x, g


@triton.jit
def rms_norm_bwd_dx_chunked_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dsum_ptr, dx_ptr,
    n_cols, weight_offset: tl.float64,
    HAS_WEIGHT: tl.constexpr, HAS_DSUM: tl.constexpr, ROUND_XHAT: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``dx`` for long rows, one row per program: the row's ``mean(g * xhat)``, then ``dx``."""
    row_start = tl.program_id(0).to(tl.int64) * n_cols
    rstd = tl.load(rstd_ptr + tl.program_id(0))
    g_x_lanes = tl.zeros([BLOCK_N], dtype=ACC)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x, g = _x_and_g_chunk(dy_ptr, x_ptr, w_ptr, row_start, cols, cols < n_cols,
                              weight_offset, HAS_WEIGHT, ROUND_XHAT, ACC)
        g_x_lanes += g * x
    # mean(g * xhat) * rstd, with xhat = x * rstd.
    coeff = tl.sum(g_x_lanes, axis=0) / n_cols * rstd * rstd

    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x, g = _x_and_g_chunk(dy_ptr, x_ptr, w_ptr, row_start, cols, mask, weight_offset,
                              HAS_WEIGHT, ROUND_XHAT, ACC)
        dx = (g - coeff * x) * rstd
        if HAS_DSUM:
            dx += tl.load(dsum_ptr + row_start + cols, mask=mask, other=0.0).to(ACC)
        tl.store(dx_ptr + row_start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_bwd_dw_chunked_kernel(
    dy_ptr, x_ptr, rstd_ptr, dw_partial_ptr,
    n_rows, n_cols, rows_per_program,
    ROUND_XHAT: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """Partial ``dweight`` for long rows: program ``(g, c)`` sums rows of group ``g`` over column
    chunk ``c`` into row ``g`` of the partial buffer, in a fixed order."""
    group = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    first_row = group * rows_per_program
    end_row = tl.minimum(first_row + rows_per_program, n_rows)
    dw_sum = tl.zeros([BLOCK_N], dtype=ACC)
    for row in tl.range(first_row, end_row, num_stages=STAGES):
        x = tl.load(x_ptr + row * n_cols + cols, mask=col_mask, other=0.0).to(ACC)
        dy = tl.load(dy_ptr + row * n_cols + cols, mask=col_mask, other=0.0).to(ACC)
        dw_sum += dy * _rounded_xhat(x * tl.load(rstd_ptr + row), x_ptr, ROUND_XHAT)
    tl.store(dw_partial_ptr + group * n_cols + cols, dw_sum, mask=col_mask)
