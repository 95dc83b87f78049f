"""Softmax kernels: whole rows in registers, or an online max and sum over chunks of a row.

Rows are those of an ``(outer, n_cols, inner)`` view of a tensor of any strides: row ``r`` starts
at ``(r // inner) * stride_outer + (r % inner) * stride_inner`` and steps by ``stride_col``, so any
dim of a transposed or sliced tensor is read without a copy. fp16 and bf16 are widened to ``ACC``
(fp32; fp64 for fp64 tensors) for the arithmetic and rounded once on the store.

* :func:`softmax_fwd_kernel` / :func:`softmax_bwd_kernel`: ``ROWS`` whole rows a program, one read
  (two for the backward) and one write;
* :func:`softmax_fwd_online_kernel` / :func:`softmax_bwd_online_kernel`: one row a program,
  ``BLOCK_N`` columns a step, for rows too long for registers.

The host code that picks between them is in ``__init__.py``; why they are built this way is in
docs/kernels/softmax.md.
"""

import triton
import triton.language as tl


@triton.jit
def _row_start(rows, n_inner, stride_outer, stride_inner, HAS_INNER: tl.constexpr):
    """Offset of the first element of row ``rows`` of an ``(outer, n_cols, inner)`` view.

    ``rows`` is int64, so ``row * stride`` cannot wrap past 2**31. Softmax over the last dim
    (``HAS_INNER`` false) is just ``rows * stride_outer``: no division, and Triton can see that
    a row stride divisible by 16 keeps every row aligned for vector loads.
    """
    if HAS_INNER:
        start = (rows // n_inner) * stride_outer + (rows % n_inner) * stride_inner
    else:
        start = rows * stride_outer
    return start


@triton.jit
def _col_offsets(cols, stride_col, UNIT_STRIDE: tl.constexpr):
    """Offsets of columns ``cols`` within a row. Only a compile-time unit stride tells Triton the
    columns are contiguous, so it loads 16 bytes per instruction: a runtime stride (even one
    equal to 1) hides that, hence the flag for the common case."""
    if UNIT_STRIDE:
        offs = cols
    else:
        offs = cols.to(tl.int64) * stride_col  # a large column stride times a column: int64
    return offs


@triton.jit
def _tile_offsets(rows, cols, n_inner, stride_outer, stride_inner, stride_col,
                  HAS_INNER: tl.constexpr, UNIT_COLS: tl.constexpr):
    """Offsets of a ``rows x cols`` tile of an ``(outer, n_cols, inner)`` view."""
    start = _row_start(rows, n_inner, stride_outer, stride_inner, HAS_INNER)
    return start[:, None] + _col_offsets(cols, stride_col, UNIT_COLS)[None, :]


@triton.jit
def softmax_fwd_kernel(
    x_ptr, y_ptr,
    n_rows, n_cols, n_inner,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    HAS_INNER: tl.constexpr, UNIT_COLS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    """Single-block path: ``ROWS`` whole rows per program, one read and one write."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    x_offs = _tile_offsets(rows, cols, n_inner, x_stride_outer, x_stride_inner, x_stride_col,
                           HAS_INNER, UNIT_COLS)
    # Padding columns read -inf: they cannot win the max and exp(-inf) = 0 adds nothing to the
    # sum. Padding rows past n_rows read 0 so they compute harmless numbers (they are never
    # stored); -inf there would compute -inf - -inf = NaN for nothing.
    pad = tl.where(cols < n_cols, 0.0, float("-inf"))[None, :]
    x = tl.load(x_ptr + x_offs, mask=mask, other=pad).to(ACC)
    # A real row of all -inf gives -inf - -inf = NaN here, as in PyTorch.
    numerator = tl.exp(x - tl.max(x, axis=1)[:, None])
    y = numerator / tl.sum(numerator, axis=1)[:, None]
    y_offs = _tile_offsets(rows, cols, n_inner, y_stride_outer, y_stride_inner, y_stride_col,
                           HAS_INNER, UNIT_COLS)
    tl.store(y_ptr + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_fwd_online_kernel(
    x_ptr, y_ptr,
    n_cols, n_inner,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    HAS_INNER: tl.constexpr, UNIT_COLS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Multi-block path: one row per program, a running max and sum, then a normalising pass."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + _row_start(row, n_inner, x_stride_outer, x_stride_inner, HAS_INNER)
    y_row = y_ptr + _row_start(row, n_inner, y_stride_outer, y_stride_inner, HAS_INNER)

    row_max = tl.full([], float("-inf"), ACC)
    row_sum = tl.full([], 0.0, ACC)  # sum of exp(x - row_max) over the chunks seen so far
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x_offs = _col_offsets(cols, x_stride_col, UNIT_COLS)
        x = tl.load(x_row + x_offs, mask=cols < n_cols, other=float("-inf")).to(ACC)
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        # While every value seen is -inf, shift by 0 instead of -inf: exp(-inf - 0) = 0 keeps the
        # sum at 0, where exp(-inf - -inf) would poison it with NaN before a finite value arrives.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift), axis=0)
        row_max = new_max

    # A row of all -inf ends with row_max = -inf and row_sum = 0: NaN below, as in PyTorch.
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + _col_offsets(cols, x_stride_col, UNIT_COLS), mask=mask, other=0.0)
        y = tl.exp(x.to(ACC) - row_max) / row_sum
        y_offs = _col_offsets(cols, y_stride_col, UNIT_COLS)
        tl.store(y_row + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr,
    n_rows, n_cols, n_inner,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    HAS_INNER: tl.constexpr, UNIT_COLS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    RELOAD: tl.constexpr,
):
    """Single-block backward: ``dx = y * (dy - sum(dy * y))``, two reads and one write.

    ``RELOAD`` (wide tiles): load ``y`` and ``dy`` again after the row sum rather than keep them
    live across it, so a thread needs far fewer registers and more programs share an SM (see
    ``SoftmaxTuning.backward_reload_min_elems``). The second load is a cache hit, not DRAM
    traffic."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    y_offs = _tile_offsets(rows, cols, n_inner, y_stride_outer, y_stride_inner, y_stride_col,
                           HAS_INNER, UNIT_COLS)
    dy_offs = _tile_offsets(rows, cols, n_inner, dy_stride_outer, dy_stride_inner, dy_stride_col,
                            HAS_INNER, UNIT_COLS)
    # Padding reads 0 so it adds nothing to the row sum.
    y = tl.load(y_ptr + y_offs, mask=mask, other=0.0).to(ACC)
    dy = tl.load(dy_ptr + dy_offs, mask=mask, other=0.0).to(ACC)
    dot = tl.sum(y * dy, axis=1)
    if RELOAD:
        # evict_first: this is the last use of the data. The differing cache hint also keeps
        # the compiler from merging the two identical loads back into one (which would bring
        # back the registers this saves).
        y = tl.load(y_ptr + y_offs, mask=mask, other=0.0, eviction_policy="evict_first").to(ACC)
        dy = tl.load(dy_ptr + dy_offs, mask=mask, other=0.0,
                     eviction_policy="evict_first").to(ACC)
    dx = y * (dy - dot[:, None])
    dx_offs = _tile_offsets(rows, cols, n_inner, dx_stride_outer, dx_stride_inner, dx_stride_col,
                            HAS_INNER, UNIT_COLS)
    tl.store(dx_ptr + dx_offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_bwd_online_kernel(
    y_ptr, dy_ptr, dx_ptr,
    n_cols, n_inner,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    HAS_INNER: tl.constexpr, UNIT_COLS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Multi-block backward: one pass for ``sum(dy * y)``, one pass for ``dx``."""
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + _row_start(row, n_inner, y_stride_outer, y_stride_inner, HAS_INNER)
    dy_row = dy_ptr + _row_start(row, n_inner, dy_stride_outer, dy_stride_inner, HAS_INNER)
    dx_row = dx_ptr + _row_start(row, n_inner, dx_stride_outer, dx_stride_inner, HAS_INNER)

    # Per-lane partial sums, reduced once after the loop: no cross-warp reduction per chunk.
    dot_lanes = tl.zeros([BLOCK_N], dtype=ACC)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        y = tl.load(y_row + _col_offsets(cols, y_stride_col, UNIT_COLS), mask=mask, other=0.0)
        dy = tl.load(dy_row + _col_offsets(cols, dy_stride_col, UNIT_COLS), mask=mask, other=0.0)
        dot_lanes += y.to(ACC) * dy.to(ACC)
    dot = tl.sum(dot_lanes, axis=0)

    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        y = tl.load(y_row + _col_offsets(cols, y_stride_col, UNIT_COLS), mask=mask, other=0.0)
        dy = tl.load(dy_row + _col_offsets(cols, dy_stride_col, UNIT_COLS), mask=mask, other=0.0)
        dx = y.to(ACC) * (dy.to(ACC) - dot)
        dx_offs = _col_offsets(cols, dx_stride_col, UNIT_COLS)
        tl.store(dx_row + dx_offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
