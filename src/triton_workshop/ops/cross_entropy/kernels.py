"""Cross-entropy kernels: one row of logits a program, streamed over the vocabulary in chunks.

For a row ``x`` of ``n_cols`` logits, target ``t`` and label smoothing ``eps``:

    lse  = log(sum_c exp(x_c))
    loss = lse - (1 - eps) * x_t - eps / n_cols * sum_c x_c
    dloss/dx_c = softmax(x)_c - eps / n_cols - (1 - eps) * [c == t]

(``eps / n_cols * sum_c (lse - x_c)`` is the smoothing term; torch's definition, rearranged.)
A row whose target is ``ignore_index`` has loss 0 and gradient 0 and is not read at all.

* :func:`cross_entropy_fwd_kernel`: the loss and ``lse`` of each row from one online pass (a
  running max and sum of exponentials, so a row of any length takes registers for one chunk);
  with ``COMPUTE_GRAD`` a second pass overwrites the row with its scaled gradient, in place: the
  fused linear + cross-entropy keeps only one chunk of logits, and that buffer is the gradient's.
* :func:`cross_entropy_bwd_kernel`: the scaled gradient of each row from its saved ``lse``, one
  read and one write (into another tensor, or in place).

Arithmetic is fp32 whatever the logits' dtype; the gradient is rounded once, on the store. The
gradient's scale (``1 / n_valid`` for a mean, the incoming gradient, or both) is read from a
tensor with a row stride, 0 for one scalar: no host sync to learn it. The host code is in
``__init__.py``; why the kernels are built this way is in docs/kernels/cross_entropy.md.
"""

import triton
import triton.language as tl


@triton.jit
def _col_offsets(cols, col_stride, UNIT_COLS: tl.constexpr):
    """Offsets of columns ``cols`` within a row; a compile-time unit stride lets Triton issue
    16-byte loads (a runtime stride of 1 would hide that)."""
    if UNIT_COLS:
        offs = cols
    else:
        offs = cols.to(tl.int64) * col_stride
    return offs


@triton.jit
def _row_logsumexp(x_row, n_cols, col_stride, UNIT_COLS: tl.constexpr, SUM_X: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """``(lse, sum of x)`` of one row, one read. The running sum of ``exp(x - max)`` is rescaled
    whenever a chunk raises the max: one exponential an element. ``sum of x`` (for label
    smoothing) is 0 unless ``SUM_X``."""
    row_max = tl.full([], float("-inf"), tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    x_sum = tl.full([], 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        # Padding reads -inf: it cannot win the max and exp(-inf) adds nothing to the sum.
        x = tl.load(x_row + _col_offsets(cols, col_stride, UNIT_COLS), mask=mask,
                    other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        # While every value seen is -inf, shift by 0: exp(-inf - 0) = 0 keeps the sum at 0 where
        # exp(-inf - -inf) would make it NaN before a finite logit arrives.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift), axis=0)
        row_max = new_max
        if SUM_X:
            x_sum += tl.sum(tl.where(mask, x, 0.0), axis=0)
    # A row of all -inf: -inf + log(0) = -inf, and its loss -inf - -inf = NaN, as torch gives.
    return row_max + tl.log(row_sum), x_sum


@triton.jit
def _store_row_grad(x_row, d_row, n_cols, x_col_stride, target, lse, scale, smoothing,
                    UNIT_COLS: tl.constexpr, BLOCK_N: tl.constexpr):
    """``d_row[c] = scale * (exp(x_c - lse) - eps / n_cols - (1 - eps) * [c == target])``;
    ``d_row`` is contiguous and may be ``x_row`` itself (each element is read before it is
    written, by this program only). A target outside ``[0, n_cols)`` gives a row of NaN (no
    host check: that would wait for the GPU)."""
    in_range = (target >= 0) & (target < n_cols)
    smooth = smoothing / n_cols
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + _col_offsets(cols, x_col_stride, UNIT_COLS), mask=mask,
                    other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) - smooth - tl.where(cols == target, 1.0 - smoothing, 0.0)
        grad = tl.where(in_range, grad * scale, float("nan"))
        tl.store(d_row + cols, grad.to(d_row.dtype.element_ty), mask=mask)


@triton.jit
def _store_zero_row(d_row, n_cols, BLOCK_N: tl.constexpr):
    """The gradient row of an ignored target: zeros, without reading its logits."""
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        tl.store(d_row + cols, tl.zeros([BLOCK_N], d_row.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def cross_entropy_fwd_kernel(
    x_ptr, target_ptr, scale_ptr, loss_ptr, lse_ptr,
    n_cols, x_row_stride, x_col_stride, target_stride, scale_stride,
    ignore_index, smoothing,
    SMOOTHING: tl.constexpr, COMPUTE_GRAD: tl.constexpr, UNIT_COLS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Per row: ``loss`` and ``lse`` (fp32). With ``COMPUTE_GRAD`` (``x`` then contiguous) the
    row is overwritten with its gradient times ``scale``: the second read of the row mostly hits
    L2, which still holds what this program just streamed."""
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2**31
    x_row = x_ptr + row * x_row_stride
    target = tl.load(target_ptr + row * target_stride)
    if target == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        tl.store(lse_ptr + row, 0.0)
        if COMPUTE_GRAD:
            _store_zero_row(x_row, n_cols, BLOCK_N)
    else:
        lse, x_sum = _row_logsumexp(x_row, n_cols, x_col_stride, UNIT_COLS, SMOOTHING, BLOCK_N)
        in_range = (target >= 0) & (target < n_cols)
        # Masked: an out-of-range target must not read outside the row; its loss is NaN.
        x_target = tl.load(x_row + tl.where(in_range, target, 0) * x_col_stride, mask=in_range,
                           other=float("nan")).to(tl.float32)
        if SMOOTHING:
            loss = lse - (1.0 - smoothing) * x_target - smoothing * (x_sum / n_cols)
        else:
            loss = lse - x_target
        tl.store(loss_ptr + row, loss)
        tl.store(lse_ptr + row, lse)
        if COMPUTE_GRAD:
            scale = tl.load(scale_ptr + row * scale_stride).to(tl.float32)
            _store_row_grad(x_row, x_row, n_cols, x_col_stride, target, lse, scale, smoothing,
                            UNIT_COLS, BLOCK_N)


@triton.jit
def cross_entropy_bwd_kernel(
    x_ptr, target_ptr, lse_ptr, scale_ptr, dx_ptr,
    n_cols, x_row_stride, x_col_stride, target_stride, scale_stride, dx_row_stride,
    ignore_index, smoothing,
    UNIT_COLS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Per row: ``dx = scale * dloss/dx`` from the forward's ``lse``: one read of ``x``, one
    write of ``dx`` (which may be ``x`` itself)."""
    row = tl.program_id(0).to(tl.int64)
    dx_row = dx_ptr + row * dx_row_stride
    target = tl.load(target_ptr + row * target_stride)
    if target == ignore_index:
        _store_zero_row(dx_row, n_cols, BLOCK_N)
    else:
        lse = tl.load(lse_ptr + row)
        scale = tl.load(scale_ptr + row * scale_stride).to(tl.float32)
        _store_row_grad(x_ptr + row * x_row_stride, dx_row, n_cols, x_col_stride, target, lse,
                        scale, smoothing, UNIT_COLS, BLOCK_N)
