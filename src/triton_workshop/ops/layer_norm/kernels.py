"""LayerNorm kernels: per-row statistics forward, and a deterministic reduction backward.

    y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)

over each row of ``x`` viewed as ``(n_rows, n_cols)`` (contiguous: the launchers make it so).
Statistics are taken in ``ACC`` (fp32; fp64 for fp64 rows) on ``x - x[row, 0]``, so a row's
offset costs no digits.

* :func:`layer_norm_fwd_kernel`: ``ROWS`` whole rows a program; one read, one write, and the
  row's ``mean``/``rstd`` saved for the backward;
* :func:`layer_norm_fwd_chunked_kernel`: one long row a program, chunk moments merged by Chan's
  update, then a normalising pass;
* :func:`layer_norm_bwd_kernel`: ``dx`` for a group of rows and that group's partial
  ``dweight``/``dbias`` (no atomics: the same bits every run);
* :func:`layer_norm_bwd_dx_chunked_kernel`, :func:`layer_norm_bwd_dwdb_chunked_kernel`: the same
  for rows too long for one block, ``dx`` and the partial sums apart;
* :func:`layer_norm_bwd_sum_partials_kernel`: the partial sums summed in a fixed order.

The host code that picks between them is in ``__init__.py``; why they are built this way is in
docs/kernels/layer_norm.md.
"""

import triton
import triton.language as tl


@triton.jit
def layer_norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, eps: tl.float64,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    """Single-block forward: ``ROWS`` whole rows per program (``STORE_STATS`` off: no
    ``mean``/``rstd`` written, for a call that keeps none)."""
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
    if STORE_STATS:
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
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
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
    if STORE_STATS:
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
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, partial_ptr,
    n_rows, n_cols, rows_per_program,
    HAS_WEIGHT: tl.constexpr, COMPUTE_DX: tl.constexpr,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr,
):
    """Single-block backward: ``dx`` for a group of rows, and that group's partial
    ``dweight``/``dbias`` (row ``pid`` of each sum's rows in ``partial_ptr``: the dweight rows,
    then the dbias rows; one buffer, as the host's allocations are its cost on small rows),
    reading ``x`` and ``dy`` once. The row loop is pipelined over ``STAGES`` stages (1: not
    pipelined): the loads of the next tiles are in flight while this one is reduced and
    stored."""
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
        tl.store(partial_ptr + pid * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    if COMPUTE_DB:
        db_partial_ptr = partial_ptr
        if COMPUTE_DW:  # the dbias rows follow the dweight rows (one a program)
            db_partial_ptr += tl.num_programs(0).to(tl.int64) * n_cols
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
    dy_ptr, x_ptr, mean_ptr, rstd_ptr, partial_ptr,
    n_rows, n_cols, rows_per_program,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """Partial ``dweight``/``dbias`` for long rows: program ``(g, c)`` sums rows of group ``g``
    over column chunk ``c`` into row ``g`` of each sum's rows in ``partial_ptr`` (laid out as
    :func:`layer_norm_bwd_kernel`'s), in a fixed order."""
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
        tl.store(partial_ptr + group * n_cols + cols, dw_sum, mask=col_mask)
    if COMPUTE_DB:
        db_partial_ptr = partial_ptr
        if COMPUTE_DW:  # the dbias rows follow the dweight rows (one a group)
            db_partial_ptr += tl.num_programs(0).to(tl.int64) * n_cols
        tl.store(db_partial_ptr + group * n_cols + cols, db_sum, mask=col_mask)


@triton.jit
def layer_norm_bwd_sum_partials_kernel(
    dw_partial_ptr, db_partial_ptr, dw_ptr, db_ptr,
    n_partials, n_cols,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
    ACC: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    DB_AFTER_DW: tl.constexpr,
):
    """Second stage of the ``dweight``/``dbias`` reduction: sum the ``(n_partials, n_cols)``
    buffers over their rows in a fixed order, both in one launch, and store in the parameters'
    dtypes (no separate cast kernels). ``DB_AFTER_DW``: the ``dbias`` partials are the rows
    after the ``dweight`` ones in ``dw_partial_ptr``'s buffer (layer_norm's one buffer;
    ``db_partial_ptr`` is then not read)."""
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
            if DB_AFTER_DW:
                db_offs = (rows.to(tl.int64) + n_partials)[:, None] * n_cols + cols[None, :]
                db_acc += tl.load(dw_partial_ptr + db_offs, mask=mask, other=0.0)
            else:
                db_acc += tl.load(db_partial_ptr + offs, mask=mask, other=0.0)
    if COMPUTE_DW:
        tl.store(dw_ptr + cols, tl.sum(dw_acc, axis=0).to(dw_ptr.dtype.element_ty), mask=col_mask)
    if COMPUTE_DB:
        tl.store(db_ptr + cols, tl.sum(db_acc, axis=0).to(db_ptr.dtype.element_ty), mask=col_mask)
