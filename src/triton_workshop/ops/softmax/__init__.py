"""Softmax over any dim of a tensor of any strides, forward and backward, in Triton.

    softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j

Host code: the tuning (:class:`SoftmaxTuning`), the cached launch plans, the registered ops, the
autograd and :func:`softmax`. The kernels are in :mod:`.kernels`; why they are built as they are
(one read and one write a row, the online softmax for long rows, strides instead of copies) is in
docs/kernels/softmax.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import runtime
from ...runtime import RECORD, LaunchPlan, acc_dtype, chunk_tile, plan_cache, register_op, row_tile
from .._common import (
    FLOAT_DTYPES_WITH_FP64,
    UNKEYABLE,
    SignatureCache,
    layout_key,
    normalize_dim,
)
from .kernels import (
    softmax_bwd_kernel,
    softmax_bwd_online_kernel,
    softmax_fwd_kernel,
    softmax_fwd_online_kernel,
)


@dataclass(frozen=True)
class SoftmaxTuning:
    """The launch decisions of softmax: part of every plan's key (tests replace :data:`TUNING`
    with ``dataclasses.replace`` to reach the multi-block path on short rows)."""

    #: Longest row the single-block forward holds in registers: 32768 fp32 values over 32 warps
    #: are 32 registers a thread. Past that the multi-block path, which streams the row, is the
    #: faster one (docs/kernels/softmax.md has the measurements).
    single_block_max_cols: int = 32768
    #: The same for the backward, higher: its single-block kernel reloads y and dy after the row
    #: sum (see ``backward_reload_min_elems``), so it holds less a row.
    backward_single_block_max_cols: int = 65536
    #: Elements of a row the multi-block path handles a loop step (a power of two).
    chunk_cols: int = 4096
    #: Elements a single-block program aims to own: short rows are packed ``tile_elems //
    #: BLOCK_N`` to a program, so each program moves 8-16 KiB, enough to hide memory latency.
    tile_elems: int = 4096
    #: Upper bound on rows packed into one program (rows of 1-32 elements).
    max_rows_per_program: int = 128
    #: Single-block backward tiles of at least this many elements (rows longer than 4096) read y
    #: and dy a second time after the row sum instead of holding them in registers across it:
    #: holding them halves the programs an SM can keep resident at 8192 columns, and the second
    #: read hits L1/L2 (DRAM traffic is unchanged). Register counts in docs/kernels/softmax.md.
    backward_reload_min_elems: int = 8192


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = SoftmaxTuning()


# --------------------------------------------------------------------------------------------
# Launch plans, registered ops, autograd.
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


@plan_cache()
def _plan(shape, dim: int, all_strides, dtype, backward: bool,
          tuning: SoftmaxTuning) -> LaunchPlan | None:
    """How to launch over tensors of ``shape`` with ``all_strides`` (inputs, then output), or
    None if a tensor needs a copy. Cached: a training loop calls softmax on the same few shapes,
    and on a slow host the Python that works this out costs as much as the kernel's launch."""
    single_block_max = (tuning.backward_single_block_max_cols if backward
                        else tuning.single_block_max_cols)
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
        tile = row_tile(n_cols, n_rows, tile_elems=tuning.tile_elems,
                        max_rows=tuning.max_rows_per_program)
        if backward:
            consts["RELOAD"] = tile.rows * tile.block_cols >= tuning.backward_reload_min_elems
        consts.update(BLOCK_N=tile.block_cols, ROWS=tile.rows, num_warps=tile.num_warps)
        return LaunchPlan(softmax_bwd_kernel if backward else softmax_fwd_kernel,
                          (runtime.cdiv(n_rows, tile.rows),), (n_rows, n_cols, n_inner, *strides),
                          consts)
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    consts.update(BLOCK_N=tile.block_cols, num_warps=tile.num_warps)
    return LaunchPlan(softmax_bwd_online_kernel if backward else softmax_fwd_online_kernel,
                      (n_rows,), (n_cols, n_inner, *strides), consts)


def _find_plan(shape, dim: int, all_strides, dtype, backward: bool) -> LaunchPlan | None:
    """:func:`_plan` under the current :data:`TUNING`: one dict lookup for a layout seen
    before."""
    return _PLANS.found(TUNING, (shape, dim, all_strides, dtype, backward),
                        lambda: _plan(shape, dim, all_strides, dtype, backward, TUNING))


#: :func:`_find_plan`'s plans by layout (None: a tensor needs a copy).
_PLANS = SignatureCache()


def _new_output(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _softmax_forward_fake(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _new_output(x)


def _launch(dim: int, *tensors: torch.Tensor, backward: bool = False) -> None:
    """Launch the forward (or the backward) over ``tensors`` (inputs, then the output) as rows
    along ``dim``. The kernels get the tensors themselves and the rows' strides, no reshaped
    views."""
    first = tensors[0]
    plan = _find_plan(first.shape, dim, tuple([t.stride() for t in tensors]), first.dtype,
                      backward)
    if plan is None:  # a tensor whose rows are not a strided view: copy it once
        _launch(dim, *(t.contiguous() for t in tensors[:-1]), tensors[-1], backward=backward)
        return
    with runtime.device_guard(first):
        plan.launch(*tensors)


# Autocast as torch.softmax: on torch's CUDA fp32 list, on no CPU list (there: dtype as without).
@register_op("softmax_forward", fake=_softmax_forward_fake, autocast={"cuda": "fp32"})
def softmax_forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of ``x`` over ``dim`` (already checked and made non-negative by :func:`softmax`)."""
    y = _new_output(x)
    if y.numel() == 0:
        return y
    _launch(dim, x, y)
    return y


def _softmax_backward_fake(grad_out: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    return _new_output(out)


@register_op("softmax_backward", fake=_softmax_backward_fake)
def softmax_backward(grad_out: torch.Tensor, out: torch.Tensor, dim: int) -> torch.Tensor:
    """Gradient of softmax over ``dim`` given its output ``out`` and the incoming ``grad_out``."""
    dx = _new_output(out)
    if dx.numel() == 0:
        return dx
    _launch(dim, out, grad_out, dx, backward=True)
    return dx


def _softmax_setup_context(ctx, inputs, output):
    _, dim = inputs
    ctx.save_for_backward(output)  # the backward needs y only, not x
    ctx.dim = dim
    if getattr(ctx, "eager", False) and output.numel():
        ctx.backward_plan = _planned_backward(output, dim)


def _planned_backward(y: torch.Tensor, dim: int) -> LaunchPlan | None:
    """The backward's plan for the usual case of a gradient laid out like ``y`` (contiguous),
    found on the calling thread: the backward then only allocates and launches."""
    return _find_plan(y.shape, dim, (y.stride(),) * 3, y.dtype, True)


def _softmax_forward_planned(ctx, x, ready):
    """The eager autograd forward of a kept signature (:func:`softmax`'s ``RECORD`` path):
    :func:`softmax_forward` and :func:`_softmax_setup_context` with the plans kept for it. The
    backward (:func:`_softmax_backward_kept`) reads ``dim`` and its plan from ``ctx.ready``."""
    y = torch.empty_like(x) if ready[3] else _new_output(x)
    guard = runtime.device_guard(x)
    if guard is _SAME_DEVICE:  # entering the no-op context costs two calls
        ready[1].launch_eager(x, y)
    else:
        with guard:
            ready[1].launch_eager(x, y)
    ctx.save_for_backward(y)
    ctx.ready = ready
    return y


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing.
_SAME_DEVICE = runtime.device_guard(torch.empty(0))


def _softmax_backward_planned(plan, grad_out: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    dx = torch.empty_like(out)
    plan.launch_eager(out, grad_out, dx)
    return dx


def _softmax_backward_autograd(ctx, grad_out):
    (out,) = ctx.saved_tensors
    plan = getattr(ctx, "backward_plan", None)
    # Autograd hands a backward the gradient of out's dtype and device (its engine casts one of
    # another dtype and refuses another device first); it runs a CUDA backward on its device
    # thread, already on out's device.
    if plan is not None and grad_out.stride() == out.stride() and runtime.eager_backward():
        return _softmax_backward_planned(plan, grad_out, out), None
    return softmax_backward(grad_out, out, ctx.dim), None


def _softmax_backward_kept(ctx, grad_out):
    """:func:`_softmax_backward_autograd` after :func:`_softmax_forward_planned`, whose plan is
    there (``ctx.ready``): the launch of :func:`_softmax_backward_planned` inline."""
    (out,) = ctx.saved_tensors
    if grad_out.stride() == out.stride() and runtime.eager_backward():
        dx = torch.empty_like(out)
        ctx.ready[2].launch_eager(out, grad_out, dx)
        return dx, None
    return softmax_backward(grad_out, out, ctx.ready[0]), None


softmax_forward.register_autograd(_softmax_backward_autograd, setup_context=_softmax_setup_context)
softmax_forward.register_planned_forward(_softmax_forward_planned, _softmax_backward_kept)


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
# Cast as autocast asks before the kept path below, which takes arguments already cast.
@runtime.follows_autocast(softmax_forward)
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch.softmax(x, dim)`` in Triton: fp16/bf16/fp32 (fp32 arithmetic) and fp64, any dim,
    any strides, differentiable (a Triton backward), and traceable by ``torch.compile``."""
    path = softmax_forward.eager_path(x)
    if path:  # an eager call of a layout seen before: straight to the launch
        try:  # _READY.under(TUNING) inline: kept under another tuning, nothing is found
            ready = _READY.get((x.shape, x.stride(), x.dtype, x.device, x.layout, dim,
                                type(dim))) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            ready = None
        if ready is not None:
            if path == RECORD:
                return softmax_forward.record_planned(x, ready)
            # ready: (dim, plan, backward's plan, plain allocation)
            y = torch.empty_like(x) if ready[3] else _new_output(x)
            guard = runtime.device_guard(x)
            if guard is _SAME_DEVICE:
                ready[1].launch_eager(x, y)
            else:
                with guard:
                    ready[1].launch_eager(x, y)
            return y
    checked_dim = _CALLS.checked(_call_key, _check_args, x, dim)
    if x.dim() == 0:  # one element, softmax 1 (NaN for -inf/NaN): the 1-element row of PyTorch
        return softmax_forward(x.reshape(1), 0).reshape(())
    y = softmax_forward(x, checked_dim)
    if path and y.numel():
        _keep_ready(x, y, dim, checked_dim)
    return y


def _keep_ready(x, y, dim, checked_dim: int) -> None:
    """Keep the checked ``dim`` and the forward's plan for ``x``'s layout and the ``dim`` passed
    (what :func:`softmax` looks up before its checks), where the plan launches ``x`` as it is;
    and whether ``empty_like(x)`` is laid out as the output (``x``'s strides are the contiguous
    ones: it copies them), the cheaper allocation."""
    plan = _find_plan(x.shape, checked_dim, (x.stride(), y.stride()), x.dtype, False)
    if plan is not None:
        _READY.under(TUNING).remember(
            (x.shape, x.stride(), x.dtype, x.device, x.layout, dim, type(dim)),
            (checked_dim, plan, _planned_backward(y, checked_dim), x.stride() == y.stride()))


#: softmax's checked call signatures -> ``dim``, made non-negative.
_CALLS = SignatureCache()
#: Eager calls' layouts (shape, strides, dtype, device, layout) and ``dim`` -> ``(dim made
#: non-negative, the forward's plan, the backward's (:func:`_planned_backward`), whether
#: ``empty_like(x)`` makes the output)``.
_READY = SignatureCache()


def _call_key(x, dim):
    return layout_key(x), dim, type(dim)


def _check_args(x, dim) -> int:
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES_WITH_FP64)
    return normalize_dim(dim, x.dim())
