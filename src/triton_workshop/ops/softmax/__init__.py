"""Softmax: a whole row in registers, and what to do when a row does not fit.

    softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j

Subtracting the row max ``m`` changes nothing mathematically (it cancels in the ratio), but it
makes the largest exponent ``exp(0) = 1``: without it ``exp(89)`` is already ``inf`` in fp32 and a
row holding ``1e4`` would come out as ``inf / inf = NaN``.

Written naively in PyTorch (``x.max``, ``x - m``, ``exp``, ``sum``, ``/``) softmax is five kernels,
each reading and writing the whole tensor: about 8 reads and 5 writes of ``x``'s size. Softmax is
memory-bound, so the best possible kernel reads ``x`` once and writes ``y`` once. Two paths get
there, or close:

* **Single block** (rows of up to :data:`SINGLE_BLOCK_MAX_COLS` elements): a program loads whole
  rows into registers, takes max, exp, sum and the division there, and stores: one read, one
  write. Short rows are packed several to a program (a ``ROWS x BLOCK_N`` tile of about
  :data:`TILE_ELEMS` elements), so 65536 rows of 1024 are 16384 programs with enough bytes each
  to keep the memory system busy, not 65536 tiny ones.
* **Multi block** (longer rows, one row a program, :data:`CHUNK_COLS` elements at a time): the
  *online* softmax (Milakov & Gimelshein, 2018). One pass keeps a running max ``m`` and a running
  sum ``d`` of ``exp(x - m)``; when a chunk raises the max, the sum so far is rescaled by
  ``exp(m_old - m_new)``. A second pass writes ``exp(x - m) / d``. Two reads and one write,
  against three reads and one write for separate max, sum and normalise loops.

The backward needs only the output: with ``y = softmax(x)`` and the incoming gradient ``dy``,
``dx = y * (dy - sum(dy * y))`` per row, the same two paths again (one row sum, then an
elementwise pass).

**Any dim.** Softmax over dim ``d`` of a tensor of shape ``(..., n, ...)`` is softmax over rows of
its ``(outer, n, inner)`` view. Row ``r`` of that view starts at ``(r // inner) * stride_outer +
(r % inner) * stride_inner`` and steps by ``stride_col``; the kernels take these strides, so
``dim=0``, a middle dim, transposed and sliced inputs run without a copy whenever
``reshape(outer, n, inner)`` is a view (otherwise ``reshape`` copies once). Outputs are
contiguous.

fp16 and bf16 are widened to fp32 for the arithmetic and rounded once on the store; fp64 is
computed in fp64 (so ``torch.autograd.gradcheck`` can check the kernels).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import acc_dtype, chunk_tile, register_op, row_tile
from ._common import FLOAT_DTYPES_WITH_FP64, normalize_dim

#: Longest row the single-block forward holds in registers: 32768 fp32 values over 32 warps are
#: 32 registers a thread; past that the multi-block path streams the row instead. Read at every
#: launch, so a test can lower it to exercise the multi-block path on short rows. H100, fp16
#: (scripts/diagnose.py softmax_long): 2048 x 32768 forward 1840 GB/s multi-block, 2643 single;
#: at 65536 columns the single block is slower (1647 against 1798 GB/s).
SINGLE_BLOCK_MAX_COLS = 32768
#: The same for the backward, which reloads y and dy after the row sum (see below), so it holds
#: less: at 1024 x 65536 fwd+bwd went 1739 -> 2187 GB/s with single-block backward rows.
BACKWARD_SINGLE_BLOCK_MAX_COLS = 65536
#: Elements of a row the multi-block path handles per loop step (a power of two).
CHUNK_COLS = 4096
#: Elements a single-block program aims to own: short rows are packed ``TILE_ELEMS // BLOCK_N`` to
#: a program, so each program moves 8-16 KiB, enough to hide memory latency.
TILE_ELEMS = 4096
#: Upper bound on rows packed into one program (rows of 1-32 elements).
MAX_ROWS_PER_PROGRAM = 128
#: Single-block backward tiles of at least this many elements (rows longer than 4096) read ``y``
#: and ``dy`` a second time after the row sum instead of holding them in registers across it.
#: Compiled for sm_90 at 8192 columns (16 warps), holding them costs 45-47 registers a thread,
#: so only 2 programs (32 warps, 2 rows in flight) fit on an SM; re-reading costs 32 registers,
#: so 4 fit (64 warps, 4 rows in flight), the forward's occupancy at that width. The second read
#: hits L1/L2 (the program read the same 32 KiB a moment before): DRAM traffic is unchanged.
BACKWARD_RELOAD_MIN_ELEMS = 8192


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
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
    :data:`BACKWARD_RELOAD_MIN_ELEMS`). The second load is a cache hit, not DRAM traffic."""
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


# --------------------------------------------------------------------------------------------
# Launchers, registered as ops.
# --------------------------------------------------------------------------------------------
def _collapse(shape, strides, dim: int):
    """``(outer, n_cols, inner)`` sizes and ``(outer, inner, col)`` strides of a tensor viewed as
    rows along ``dim``, or None when the dims before or after ``dim`` cannot be merged into one
    stride each (then the caller copies, as ``reshape`` would)."""

    def merge(sizes, steps):
        size, step = 1, 0
        for n, st in zip(reversed(sizes), reversed(steps)):  # innermost first
            if n == 1:
                continue
            if size > 1 and st != step * size:
                return None
            if size == 1:
                step = st
            size *= n
        return size, step

    outer = merge(shape[:dim], strides[:dim])
    inner = merge(shape[dim + 1 :], strides[dim + 1 :])
    if outer is None or inner is None:
        return None
    return (outer[0], shape[dim], inner[0]), (outer[1], inner[1], strides[dim])


def _knobs() -> tuple:
    """The module's launch constants, part of the plan cache's key (tests change them)."""
    return (SINGLE_BLOCK_MAX_COLS, BACKWARD_SINGLE_BLOCK_MAX_COLS, CHUNK_COLS, TILE_ELEMS,
            MAX_ROWS_PER_PROGRAM, BACKWARD_RELOAD_MIN_ELEMS)


@functools.lru_cache(maxsize=1024)
def _plan(shape, dim: int, all_strides, dtype, backward: bool, knobs: tuple):
    """How to launch over tensors of ``shape`` with ``all_strides`` (inputs, then output):
    ``(single_block, grid, scalar args, constexpr args, prepared launches)``, or None if a tensor
    needs a copy. Cached: a training loop calls softmax on the same few shapes, and on a slow
    host the Python that works this out costs as much as the kernel's launch. The plan's own
    dict keeps its launches ready to repeat (:func:`runtime.launch_kernel`)."""
    single_block_max, backward_single_block_max, chunk_cols, tile_elems, max_rows, reload_min = knobs
    if backward:
        single_block_max = backward_single_block_max
    collapsed = [_collapse(shape, st, dim) for st in all_strides]
    if any(c is None for c in collapsed):
        return None
    (outer, n_cols, n_inner), _ = collapsed[0]
    n_rows = outer * n_inner
    strides = [s for _, st in collapsed for s in st]
    consts = dict(
        HAS_INNER=n_inner > 1,
        UNIT_COLS=n_cols == 1 or all(st[2] == 1 for _, st in collapsed),
        ACC=acc_dtype(dtype),
    )
    if n_cols <= single_block_max:
        tile = row_tile(n_cols, n_rows, tile_elems=tile_elems, max_rows=max_rows)
        if backward:
            consts["RELOAD"] = tile.rows * tile.block_cols >= reload_min
        consts.update(BLOCK_N=tile.block_cols, ROWS=tile.rows, num_warps=tile.num_warps)
        grid = (runtime.cdiv(n_rows, tile.rows),)
        return True, grid, (n_rows, n_cols, n_inner, *strides), consts, {}
    tile = chunk_tile(n_cols, chunk_cols)
    consts.update(BLOCK_N=tile.block_cols, num_warps=tile.num_warps)
    return False, (n_rows,), (n_cols, n_inner, *strides), consts, {}


def _find_plan(shape, dim: int, all_strides, dtype, backward: bool):
    key = (shape, dim, all_strides, dtype, backward, _knobs())
    try:
        return _plan(*key)
    except TypeError:  # symbolic sizes under torch.compile are not hashable: no cache
        return _plan.__wrapped__(*key)


def _new_output(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _softmax_forward_fake(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _new_output(x)


def _launch(single_block_kernel, online_kernel, dim: int, *tensors: torch.Tensor,
            backward: bool = False) -> None:
    """Launch one of a kernel pair over ``tensors`` (inputs, then the output) as rows along
    ``dim``: whole rows in registers when they fit, the chunked online kernel otherwise. The
    kernels get the tensors themselves and the rows' strides, no reshaped views."""
    first = tensors[0]
    plan = _find_plan(first.shape, dim, tuple([t.stride() for t in tensors]), first.dtype,
                      backward)
    if plan is None:  # a tensor whose rows are not a strided view: copy it once
        _launch(single_block_kernel, online_kernel, dim,
                *(t.contiguous() for t in tensors[:-1]), tensors[-1], backward=backward)
        return
    with runtime.device_guard(first):
        _launch_plan(plan, single_block_kernel, online_kernel, tensors)


def _launch_plan(plan, single_block_kernel, online_kernel, tensors) -> None:
    single_block, grid, scalars, consts, prepared = plan
    kernel = single_block_kernel if single_block else online_kernel
    runtime.launch_kernel(kernel, grid, tensors, scalars, consts, prepared)


# Autocast as torch.softmax: on torch's CUDA fp32 list, on no CPU list (there: dtype as without).
@register_op("softmax_forward", fake=_softmax_forward_fake, autocast={"cuda": "fp32"})
def softmax_forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of ``x`` over ``dim`` (already checked and made non-negative by :func:`softmax`)."""
    y = _new_output(x)
    if y.numel() == 0:
        return y
    _launch(softmax_fwd_kernel, softmax_fwd_online_kernel, dim, x, y)
    return y


def _softmax_backward_fake(grad_out: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    return _new_output(out)


@register_op("softmax_backward", fake=_softmax_backward_fake)
def softmax_backward(grad_out: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of softmax over ``dim`` given its output ``out`` and the incoming ``grad_out``."""
    dx = _new_output(out)
    if dx.numel() == 0:
        return dx
    _launch(softmax_bwd_kernel, softmax_bwd_online_kernel, dim, out, grad_out, dx, backward=True)
    return dx


def _softmax_setup_context(ctx, inputs, output):
    _, dim = inputs
    ctx.save_for_backward(output)  # the backward needs y only, not x
    ctx.dim = dim
    if getattr(ctx, "eager", False) and output.numel():
        # The backward's plan, found now on the calling thread for the usual case of a gradient
        # laid out like y (y is contiguous): the backward then only allocates and launches.
        ctx.backward_plan = _find_plan(output.shape, dim, (output.stride(),) * 3, output.dtype,
                                       True)


@runtime.launch_directly
def _softmax_backward_planned(plan, grad_out: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    dx = torch.empty_like(out)
    _launch_plan(plan, softmax_bwd_kernel, softmax_bwd_online_kernel, (out, grad_out, dx))
    return dx


def _softmax_backward_autograd(ctx, grad_out):
    (out,) = ctx.saved_tensors
    plan = getattr(ctx, "backward_plan", None)
    if (plan is not None and grad_out.stride() == out.stride() and grad_out.dtype == out.dtype
            and grad_out.device == out.device and runtime.eager_backward()):
        # Autograd runs a CUDA backward on its device thread, already on out's device.
        return _softmax_backward_planned(plan, grad_out, out), None
    return softmax_backward(grad_out, out, ctx.dim), None


softmax_forward.register_autograd(_softmax_backward_autograd, setup_context=_softmax_setup_context)


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)`` in Triton: fp16/bf16/fp32 (fp32 arithmetic) and fp64, any dim,
    any strides, differentiable (a Triton backward), and traceable by ``torch.compile``."""
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES_WITH_FP64)
    dim = normalize_dim(dim, x.dim())
    if x.dim() == 0:  # one element, softmax 1 (NaN for -inf/NaN): the 1-element row of PyTorch
        return softmax_forward(x.reshape(1), 0).reshape(())
    return softmax_forward(x, dim)
