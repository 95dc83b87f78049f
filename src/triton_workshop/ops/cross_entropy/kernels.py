"""Cross-entropy kernels: one row of logits a program, streamed over the vocabulary in chunks.

For a row ``x`` of ``n_cols`` logits, target ``t`` and label smoothing ``eps``:

    lse  = log(sum_c exp(x_c))
    loss = lse - (1 - eps) * x_t - eps / n_cols * sum_c x_c
    dloss/dx_c = softmax(x)_c - eps / n_cols - (1 - eps) * [c == t]

(``eps / n_cols * sum_c (lse - x_c)`` is the smoothing term; torch's definition, rearranged.)
A row whose target is ``ignore_index`` has loss 0 and gradient 0 and is not read at all.

* :func:`cross_entropy_fwd_kernel`: the loss and ``lse`` of each row from one online pass (a
  running max and sum of exponentials, so a row of any length takes registers for one chunk);
  with ``COMPUTE_GRAD`` a second pass writes the row's gradient (times ``1 / n_valid`` for a
  mean) into a gradient row, which may be the logits row itself (the fused linear +
  cross-entropy keeps only one chunk of logits, and that buffer becomes the gradient's).
* :func:`cross_entropy_bwd_kernel`: the gradient of each row times the incoming gradient, either
  recomputed from the logits and the saved ``lse`` (one read, one write), or from the gradient
  the forward stored (in place, a row whose incoming gradient is exactly 1 is not touched).
* :func:`linear_ce_block_fwd_kernel` and :func:`linear_ce_block_grad_kernel`: the fused linear +
  cross-entropy's, over a chunk of logits that holds either whole rows or one block of columns
  of each row (a 128k vocabulary split in a few blocks, so that a chunk holds many tokens
  within a small memory budget). The forward merges the blocks' logsumexps into each row's;
  the gradient of a block is written over its logits once the row's ``lse`` is complete.

Arithmetic is fp32 whatever the logits' dtype; a gradient is rounded on its store. Scales (the
count of targets of a mean, the incoming gradient) are read from device tensors with a row
stride, 0 for one scalar: no host sync to learn them. The host code is in ``__init__.py``; why
the kernels are built this way is in docs/kernels/cross_entropy.md.
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
def _mean_scale(count_ptr, MEAN: tl.constexpr):
    """What a gradient is multiplied by: 1 / the number of counted rows for a mean (a row is
    being scaled, so it was counted and the count is at least 1), else 1."""
    if MEAN:
        scale = 1.0 / tl.load(count_ptr).to(tl.float32)
    else:
        scale = 1.0
    return scale


@triton.jit
def _store_row_grad(x_row, d_row, n_cols, x_col_stride, target, in_range, lse, scale,
                    smoothing, n_classes, UNIT_COLS: tl.constexpr, REVERSE: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """``d_row[c] = scale * (exp(x_c - lse) - eps / n_classes - (1 - eps) * [c == target])``
    for the ``n_cols`` columns at hand: a whole row (``n_classes == n_cols``) or one block of a
    row of ``n_classes`` (``target`` then counted from the block's first column, outside
    ``[0, n_cols)`` where another block holds it). ``d_row`` is contiguous and may be ``x_row``
    itself (each element is read before it is written, by this program only). A target that is
    no class (not ``in_range``) gives a row of NaN (no host check: that would wait for the
    GPU). ``REVERSE``: the chunks last to first, for a row this program has just streamed first
    to last: the chunks read last are the likeliest to be still in L2 when a long row and its
    neighbours' do not all fit there."""
    smooth = smoothing / n_classes
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    for step in range(n_chunks):
        if REVERSE:
            start = (n_chunks - 1 - step) * BLOCK_N
        else:
            start = step * BLOCK_N
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
def _store_scaled_row(g_row, d_row, n_cols, factor, BLOCK_N: tl.constexpr):
    """``d_row = factor * g_row`` (both contiguous; ``d_row`` may be ``g_row``), in fp32."""
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        g = tl.load(g_row + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(d_row + cols, (g * factor).to(d_row.dtype.element_ty), mask=mask)


@triton.jit
def cross_entropy_fwd_kernel(
    x_ptr, target_ptr, count_ptr, loss_ptr, lse_ptr, grad_ptr,
    n_cols, x_row_stride, x_col_stride, target_stride, grad_row_stride,
    ignore_index, smoothing,
    SMOOTHING: tl.constexpr, COMPUTE_GRAD: tl.constexpr, MEAN: tl.constexpr,
    STORE_LSE: tl.constexpr, UNIT_COLS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Per row: ``loss`` and ``lse`` (fp32). With ``COMPUTE_GRAD`` the row's gradient is written
    to ``grad`` (contiguous rows; ``x`` itself where the caller owns the logits), divided by
    the count of targets at ``count_ptr`` for a ``MEAN``: the second read of the row, backwards,
    mostly hits L2, which still holds what this program just streamed. Without ``STORE_LSE``
    ``lse`` is not written (a forward without autograd: ``lse_ptr`` may stand for any tensor);
    ``loss`` is stored in its own dtype."""
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2**31
    x_row = x_ptr + row * x_row_stride
    target = tl.load(target_ptr + row * target_stride)
    if target == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        if STORE_LSE:
            tl.store(lse_ptr + row, 0.0)
        if COMPUTE_GRAD:
            _store_zero_row(grad_ptr + row * grad_row_stride, n_cols, BLOCK_N)
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
        tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
        if STORE_LSE:
            tl.store(lse_ptr + row, lse)
        if COMPUTE_GRAD:
            scale = _mean_scale(count_ptr, MEAN)
            _store_row_grad(x_row, grad_ptr + row * grad_row_stride, n_cols, x_col_stride,
                            target, in_range, lse, scale, smoothing, n_cols, UNIT_COLS, True,
                            BLOCK_N)


@triton.jit
def cross_entropy_bwd_kernel(
    x_ptr, target_ptr, lse_ptr, scale_ptr, count_ptr, dx_ptr,
    n_cols, x_row_stride, x_col_stride, target_stride, lse_stride, scale_stride, dx_row_stride,
    ignore_index, smoothing,
    FROM_GRAD: tl.constexpr, APPLIED: tl.constexpr, IN_PLACE: tl.constexpr, MEAN: tl.constexpr,
    UNIT_COLS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Per row: ``dx = scale * dloss/dx``, ``scale`` the incoming gradient (and ``1 / n_valid``
    for a mean, already in it where the forward made the gradient).

    * ``FROM_GRAD`` off: recomputed from the logits ``x`` and the forward's ``lse``: one read of
      ``x``, one write of ``dx`` (which may be ``x`` itself).
    * ``FROM_GRAD``: ``x`` is the gradient the forward stored (contiguous). With ``APPLIED``,
      ``lse_ptr`` holds the incoming gradient an earlier backward already multiplied it by in
      place: ``dx = x * scale / applied`` (``x`` unchanged where the two are equal; a row that an
      applied 0, inf or NaN has wiped becomes NaN, where it cannot be recovered). ``IN_PLACE``
      (``dx`` is ``x``; read only with ``FROM_GRAD``): a row whose factor is exactly 1, the
      usual incoming gradient of a loss, is neither read nor written, and ignored rows keep
      their zeros, whatever ``scale``.

    ``MEAN``: ``scale`` is also divided by the count of targets at ``count_ptr`` (the eager
    backward of a mean hands the incoming gradient over as it is; ``count_ptr`` is otherwise
    never read).
    """
    row = tl.program_id(0).to(tl.int64)
    dx_row = dx_ptr + row * dx_row_stride
    target = tl.load(target_ptr + row * target_stride)
    if target == ignore_index:
        if FROM_GRAD:
            if not IN_PLACE:  # in place: the stored gradient's row holds its zeros already
                _store_zero_row(dx_row, n_cols, BLOCK_N)
        else:
            _store_zero_row(dx_row, n_cols, BLOCK_N)
    else:
        scale = tl.load(scale_ptr + row * scale_stride).to(tl.float32)
        if MEAN:
            scale = scale / tl.load(count_ptr).to(tl.float32)
        if FROM_GRAD:
            if APPLIED:
                applied = tl.load(lse_ptr + row * lse_stride).to(tl.float32)
                # abs(NaN) < inf is False: NaN counts as unrecoverable, as inf and 0 do.
                recoverable = (applied != 0.0) & (tl.abs(applied) < float("inf"))
                ratio = scale / tl.where(recoverable, applied, 1.0)
                factor = tl.where(scale == applied, 1.0,
                                  tl.where(recoverable, ratio, float("nan")))
            else:
                factor = scale
            if IN_PLACE:
                if factor != 1.0:
                    _store_scaled_row(dx_row, dx_row, n_cols, factor, BLOCK_N)
            else:
                _store_scaled_row(x_ptr + row * x_row_stride, dx_row, n_cols, factor, BLOCK_N)
        else:
            lse = tl.load(lse_ptr + row * lse_stride)
            in_range = (target >= 0) & (target < n_cols)
            _store_row_grad(x_ptr + row * x_row_stride, dx_row, n_cols, x_col_stride, target,
                            in_range, lse, scale, smoothing, n_cols, UNIT_COLS, False, BLOCK_N)


@triton.jit
def cross_entropy_reduce_kernel(
    loss_ptr, target_ptr, out_ptr, count_ptr,
    n_rows, target_stride, ignore_index,
    MEAN: tl.constexpr, KEEP_COUNT: tl.constexpr, COUNT_ONLY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program: the sum of the ``n_rows`` per-row losses (fp32, ignored rows hold 0), for a
    ``MEAN`` divided by the number of targets other than ``ignore_index`` (0 / 0 = NaN where
    there is none, as torch gives), stored in ``out``'s dtype. ``KEEP_COUNT``: that count also
    goes to ``count_ptr`` (fp32) for the backward. ``COUNT_ONLY``: the count alone, to
    ``count_ptr`` (the losses and ``out`` are not touched): a mean's divisor counted before the
    losses exist, for a gradient made with them. In a fixed order: the same sum every run."""
    total = tl.zeros([BLOCK], tl.float32)
    valid = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        mask = rows < n_rows
        if not COUNT_ONLY:
            total += tl.load(loss_ptr + rows, mask=mask, other=0.0).to(tl.float32)
        if MEAN or COUNT_ONLY:
            target = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=mask,
                             other=ignore_index)
            valid += tl.where(mask & (target != ignore_index), 1, 0)
    if COUNT_ONLY:
        tl.store(count_ptr, tl.sum(valid, axis=0).to(tl.float32))
    else:
        result = tl.sum(total, axis=0)
        if MEAN:
            count = tl.sum(valid, axis=0).to(tl.float32)
            # No targets: NaN (0 / 0, as torch gives), without dividing by 0.
            result = tl.where(count > 0, result / tl.maximum(count, 1.0), float("nan"))
            if KEEP_COUNT:
                tl.store(count_ptr, count)
        tl.store(out_ptr, result.to(out_ptr.dtype.element_ty))


# --------------------------------------------------------------------------------------------
# linear_cross_entropy's kernels: a chunk of logits may hold a block of each row's columns.
# --------------------------------------------------------------------------------------------
@triton.jit
def _merge_lse(a, b):
    """``log(exp(a) + exp(b))`` of two fp32 logsumexps: -inf where both are (a block of -inf
    logits), shifted by 0 then so that no -inf - -inf makes a NaN."""
    top = tl.maximum(a, b)
    shift = tl.where(top == float("-inf"), 0.0, top)
    return shift + tl.log(tl.exp(a - shift) + tl.exp(b - shift))


@triton.jit
def linear_ce_block_fwd_kernel(
    x_ptr, target_ptr, count_ptr, loss_ptr, lse_ptr,
    n_cols, col_start, n_classes, x_row_stride, target_stride, ignore_index, smoothing,
    FIRST: tl.constexpr, LAST: tl.constexpr, SMOOTHING: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr, MEAN: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One block of columns ``[col_start, col_start + n_cols)`` of each row of ``n_classes``
    logits (contiguous rows; the whole row when the block is all of it, ``FIRST`` and
    ``LAST``), the blocks launched in column order. Per row, ``lse`` holds the logsumexp of the
    blocks seen so far and ``loss`` what the loss adds to it (``-(1 - eps) * x_t - eps / C *
    sum x``): the ``FIRST`` block writes them, the others merge into them. The ``LAST`` block
    leaves the row's loss and ``lse``, and with ``COMPUTE_GRAD`` turns its own logits into
    their gradient in place (divided by the count of targets at ``count_ptr`` for a ``MEAN``):
    the second read of a row, backwards, mostly from L2. The other blocks' gradients are
    :func:`linear_ce_block_grad_kernel`'s, from the finished ``lse``. An ignored row's loss and
    lse are 0 and its logits are not read."""
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2**31
    x_row = x_ptr + row * x_row_stride
    target = tl.load(target_ptr + row * target_stride)
    if target == ignore_index:
        if LAST:
            tl.store(loss_ptr + row, 0.0)
            tl.store(lse_ptr + row, 0.0)
            if COMPUTE_GRAD:
                _store_zero_row(x_row, n_cols, BLOCK_N)
    else:
        local = target - col_start  # the target's column in this block, if it is here
        here = (local >= 0) & (local < n_cols)
        x_target = tl.load(x_row + tl.where(here, local, 0), mask=here,
                           other=0.0).to(tl.float32)
        if not FIRST:
            prev_lse = tl.load(lse_ptr + row)
            prev_acc = tl.load(loss_ptr + row)
        block_lse, x_sum = _row_logsumexp(x_row, n_cols, 1, True, SMOOTHING, BLOCK_N)
        if SMOOTHING:
            part = -(1.0 - smoothing) * x_target - smoothing * (x_sum / n_classes)
        else:
            part = -x_target
        if FIRST:
            lse = block_lse
            acc = part
        else:
            lse = _merge_lse(prev_lse, block_lse)
            acc = prev_acc + part
        # Every warp of the program reads the scalars above (each thread computes the row's lse
        # for itself); the stores below write over some of them: the running lse and loss, and
        # in place the target's logit. Without a barrier a warp that reads late can read what
        # another has already written: on an H100 about one row in 2000 then had a warp merge
        # the finished lse with its block again and write its part of the gradient from that.
        tl.debug_barrier()
        if LAST:
            in_range = (target >= 0) & (target < n_classes)
            # A target that is no class: NaN (torch raises; checking would wait for the GPU).
            tl.store(loss_ptr + row, tl.where(in_range, lse + acc, float("nan")))
            tl.store(lse_ptr + row, lse)
            if COMPUTE_GRAD:
                scale = _mean_scale(count_ptr, MEAN)
                _store_row_grad(x_row, x_row, n_cols, 1, local, in_range, lse, scale,
                                smoothing, n_classes, True, True, BLOCK_N)
        else:
            tl.store(loss_ptr + row, acc)
            tl.store(lse_ptr + row, lse)


@triton.jit
def linear_ce_block_grad_kernel(
    x_ptr, target_ptr, lse_ptr, scale_ptr,
    n_cols, col_start, n_classes, x_row_stride, target_stride, scale_stride, ignore_index,
    smoothing,
    SCALE_BY: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """In place, one block of columns ``[col_start, col_start + n_cols)`` of each row of
    ``n_classes`` logits (contiguous rows) becomes its gradient, from the row's finished
    ``lse``, times a scale: ``SCALE_BY`` 0 none (a sum), 1 the inverse of the count of targets
    at ``scale_ptr`` (a mean), 2 the incoming gradient of each row (reduction="none"'s backward,
    ``scale_stride`` 0 for one value). An ignored row's block becomes zeros, unread."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    target = tl.load(target_ptr + row * target_stride)
    if target == ignore_index:
        _store_zero_row(x_row, n_cols, BLOCK_N)
    else:
        if SCALE_BY == 1:
            scale = 1.0 / tl.load(scale_ptr).to(tl.float32)
        elif SCALE_BY == 2:
            scale = tl.load(scale_ptr + row * scale_stride).to(tl.float32)
        else:
            scale = 1.0
        in_range = (target >= 0) & (target < n_classes)
        _store_row_grad(x_row, x_row, n_cols, 1, target - col_start, in_range,
                        tl.load(lse_ptr + row), scale, smoothing, n_classes, True, False,
                        BLOCK_N)
