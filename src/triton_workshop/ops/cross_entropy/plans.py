"""The cross-entropy family's launches and what its two losses' host code shares.

Cached launch plans of the two row kernels and of linear_cross_entropy's two block kernels, and
their launchers; the reductions of per-row
losses (with the count of targets a mean divides by, kept on the device); and the pieces of
autograd both losses use where their gradients are made in the forward: the factor that
rescales a gradient already scaled once, the record of that scale, and the refusal of a double
backward. The kernels are in :mod:`.kernels`.
"""

from __future__ import annotations

import threading

import torch

from ... import runtime
from ...runtime import LaunchPlan, chunk_tile, plan_cache
from .kernels import (
    cross_entropy_bwd_kernel,
    cross_entropy_fwd_kernel,
    cross_entropy_reduce_kernel,
    linear_ce_block_fwd_kernel,
    linear_ce_block_grad_kernel,
)
from .tuning import TUNING, CrossEntropyTuning


# --------------------------------------------------------------------------------------------
# Launch plans: one program a row of logits.
# --------------------------------------------------------------------------------------------
def _stride0(t: torch.Tensor) -> int:
    """The row stride of a per-row tensor; 0 for a scalar, which every row then reads."""
    return t.stride(0) if t.dim() else 0


@plan_cache()
def forward_plan(n_rows, n_cols, dtypes, x_strides, target_stride, grad_row_stride,
                 ignore_index, smoothing, compute_grad, mean, store_lse,
                 tuning: CrossEntropyTuning) -> LaunchPlan:
    """The loss of each row (and, with ``compute_grad``, its gradient, divided by the count of
    targets for a ``mean``; with ``store_lse`` its logsumexp). Cached: the same few shapes come
    back every step. ``dtypes``: of the launch's tensors, part of the key because a plan keeps
    its compiled launch (the kernel is compiled per dtype)."""
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    num_warps = tile.num_warps if compute_grad else tuning.forward_num_warps or tile.num_warps
    return LaunchPlan(
        cross_entropy_fwd_kernel, (n_rows,),
        (n_cols, *x_strides, target_stride, grad_row_stride, ignore_index, smoothing),
        dict(SMOOTHING=smoothing > 0, COMPUTE_GRAD=compute_grad, MEAN=compute_grad and mean,
             STORE_LSE=store_lse, UNIT_COLS=x_strides[1] == 1, BLOCK_N=tile.block_cols,
             num_warps=num_warps))


@plan_cache()
def backward_plan(n_rows, n_cols, dtypes, x_strides, target_stride, lse_stride, scale_stride,
                  dx_row_stride, ignore_index, smoothing, from_grad, applied, in_place, mean,
                  tuning: CrossEntropyTuning) -> LaunchPlan:
    """The scaled gradient of each row: from its saved ``lse``, or (``from_grad``) from the
    gradient the forward stored, ``in_place`` or not, knowing the scale it holds (``applied``)
    or not; for a ``mean`` the scale divided by a count of targets the launch is given."""
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    return LaunchPlan(
        cross_entropy_bwd_kernel, (n_rows,),
        (n_cols, *x_strides, target_stride, lse_stride, scale_stride, dx_row_stride,
         ignore_index, smoothing),
        dict(FROM_GRAD=from_grad, APPLIED=applied, IN_PLACE=in_place, MEAN=mean,
             UNIT_COLS=x_strides[1] == 1, BLOCK_N=tile.block_cols, num_warps=tile.num_warps))


def launch_forward(x, target, loss_rows, lse, ignore_index, smoothing, grad=None, count=None):
    """Per-row loss and lse of ``x`` (n_rows > 0). With ``grad`` (contiguous rows, possibly
    ``x`` itself) each row's gradient is written there, divided by ``count`` (a mean's count
    of targets) where given. ``lse`` stands in for the tensors not given: never read."""
    plan, tensors = forward_plan_for(x, target, loss_rows, lse, ignore_index, smoothing, grad,
                                     count)
    with runtime.device_guard(x):
        plan.launch(*tensors)


def forward_plan_for(x, target, loss_rows, lse, ignore_index, smoothing, grad=None, count=None
                     ) -> tuple[LaunchPlan, tuple]:
    """The plan of :func:`launch_forward`'s launch, and the tensors it launches."""
    compute_grad = grad is not None
    tensors = (x, target, lse if count is None else count, loss_rows, lse,
               grad if compute_grad else lse)
    plan = forward_plan(x.shape[0], x.shape[1], tuple([t.dtype for t in tensors]), x.stride(),
                        target.stride(0), grad.stride(0) if compute_grad else 0, ignore_index,
                        smoothing, compute_grad, count is not None, True, TUNING)
    return plan, tensors


def backward_plan_for(x, target, lse, scale, dx, ignore_index, smoothing, from_grad=False,
                      applied=False) -> LaunchPlan:
    """The plan of :func:`launch_backward`'s launch (``dx`` contiguous rows; ``scale`` stands
    in for the count, never read)."""
    tensors = (x, target, lse, scale, scale, dx)
    return backward_plan(x.shape[0], x.shape[1], tuple([t.dtype for t in tensors]), x.stride(),
                         target.stride(0), _stride0(lse), _stride0(scale), dx.stride(0),
                         ignore_index, smoothing, from_grad, applied,
                         from_grad and dx is x, False, TUNING)


def launch_backward(x, target, lse, scale, dx, ignore_index, smoothing, from_grad=False,
                    applied=False):
    """``dx = scale * dloss/dx`` (n_rows > 0; ``dx`` contiguous, possibly ``x`` itself): from
    the logits ``x`` and ``lse``, or (``from_grad``) from the stored gradient ``x``, ``lse``
    then being the scale it holds where ``applied`` (see the kernel)."""
    plan = backward_plan_for(x, target, lse, scale, dx, ignore_index, smoothing, from_grad, applied)
    with runtime.device_guard(x):
        plan.launch(x, target, lse, scale, scale, dx)


# --------------------------------------------------------------------------------------------
# linear_cross_entropy's launches: a chunk of logits, whole rows or a block of columns of each.
# --------------------------------------------------------------------------------------------
#: What linear_ce_block_grad_kernel multiplies a gradient by (its ``SCALE_BY``).
SCALE_NONE, SCALE_BY_COUNT, SCALE_BY_ROW = 0, 1, 2


@plan_cache()
def block_forward_plan(n_rows, n_cols, dtypes, row_stride, target_stride, col_start, n_classes,
                       ignore_index, smoothing, first, last, compute_grad, mean,
                       tuning: CrossEntropyTuning) -> LaunchPlan:
    """linear_ce_block_fwd_kernel over ``n_rows`` rows of one block of ``n_cols`` columns."""
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    return LaunchPlan(
        linear_ce_block_fwd_kernel, (n_rows,),
        (n_cols, col_start, n_classes, row_stride, target_stride, ignore_index, smoothing),
        dict(FIRST=first, LAST=last, SMOOTHING=smoothing > 0,
             COMPUTE_GRAD=last and compute_grad, MEAN=last and compute_grad and mean,
             BLOCK_N=tile.block_cols, num_warps=tile.num_warps))


@plan_cache()
def block_grad_plan(n_rows, n_cols, dtypes, row_stride, target_stride, scale_stride, col_start,
                    n_classes, ignore_index, smoothing, scale_by,
                    tuning: CrossEntropyTuning) -> LaunchPlan:
    """linear_ce_block_grad_kernel over ``n_rows`` rows of one block of ``n_cols`` columns."""
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    return LaunchPlan(
        linear_ce_block_grad_kernel, (n_rows,),
        (n_cols, col_start, n_classes, row_stride, target_stride, scale_stride, ignore_index,
         smoothing),
        dict(SCALE_BY=scale_by, BLOCK_N=tile.block_cols, num_warps=tile.num_warps))


def launch_block_forward(logits, target, loss_rows, lse, col_start, n_classes, ignore_index,
                         smoothing, first, last, compute_grad, count=None):
    """The loss pass over one block of a chunk (``logits``: contiguous rows, columns
    ``[col_start, col_start + logits.shape[1])`` of ``n_classes``); with ``compute_grad`` the
    ``last`` block's logits become their gradient, divided by ``count`` where given (a mean).
    ``lse`` stands in for a count not given: never read."""
    plan, tensors = block_forward_plan_for(logits, target, loss_rows, lse, col_start, n_classes,
                                           ignore_index, smoothing, first, last, compute_grad,
                                           count)
    with runtime.device_guard(logits):
        plan.launch(*tensors)


def block_forward_plan_for(logits, target, loss_rows, lse, col_start, n_classes, ignore_index,
                           smoothing, first, last, compute_grad, count=None
                           ) -> tuple[LaunchPlan, tuple]:
    """The plan of :func:`launch_block_forward`'s launch, and the tensors it launches."""
    tensors = (logits, target, lse if count is None else count, loss_rows, lse)
    plan = block_forward_plan(logits.shape[0], logits.shape[1],
                              tuple([t.dtype for t in tensors]), logits.stride(0),
                              target.stride(0), col_start, n_classes, ignore_index, smoothing,
                              first, last, compute_grad, count is not None, TUNING)
    return plan, tensors


def launch_block_grad(logits, target, lse, col_start, n_classes, ignore_index, smoothing,
                      scale=None, scale_by=SCALE_NONE):
    """One block of a chunk's logits becomes its gradient in place, from the rows' ``lse``,
    times ``scale`` as ``scale_by`` says (``lse`` stands in for no scale: never read)."""
    scale = lse if scale is None else scale
    tensors = (logits, target, lse, scale)
    plan = block_grad_plan(logits.shape[0], logits.shape[1], tuple([t.dtype for t in tensors]),
                           logits.stride(0), target.stride(0), _stride0(scale), col_start,
                           n_classes, ignore_index, smoothing, scale_by, TUNING)
    with runtime.device_guard(logits):
        plan.launch(*tensors)


@plan_cache()
def reduce_plan(n_rows, dtypes, target_stride, ignore_index, mean, keep_count,
                count_only=False) -> LaunchPlan:
    """cross_entropy_reduce_kernel: the sum (or a ``mean``) of ``n_rows`` per-row losses, in one
    program; ``dtypes``: of its four tensors (the loss rows, the targets, the loss, the count).
    ``count_only``: the count of targets alone (fp32), to the launch's fourth tensor."""
    block = min(4096, max(16, 1 << (n_rows - 1).bit_length()))
    return LaunchPlan(cross_entropy_reduce_kernel, (1,), (n_rows, target_stride, ignore_index),
                      dict(MEAN=mean and not count_only,
                           KEEP_COUNT=mean and keep_count and not count_only,
                           COUNT_ONLY=count_only, BLOCK=block,
                           num_warps=4 if block <= 1024 else 8))


def count_valid(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The targets that count (a device tensor: the mean's divisor, without a host sync)."""
    return (target != ignore_index).sum()


def reduce_losses(loss_rows: torch.Tensor, target, ignore_index: int, reduction: str,
                  out_dtype: torch.dtype | None = None, count: torch.Tensor | None = None,
                  keep_count: bool = True) -> torch.Tensor:
    """torch's reductions of the per-row losses (ignored rows hold 0): a mean over no target is
    0 / 0 = NaN, as torch gives (``count``: a mean's count of targets when already counted).
    With ``out_dtype`` (cross_entropy), the loss in that dtype, and (``keep_count``) a mean's
    count kept for the backward of the call (:func:`counted`)."""
    if reduction == "none":
        loss = loss_rows
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        if count is None:
            count = count_valid(target, ignore_index)
        loss = loss_rows.sum() / count
    if out_dtype is None:
        return loss
    if loss.dtype != out_dtype:
        loss = loss.to(out_dtype)
    if keep_count and reduction == "mean" and runtime.launching_directly():  # eager
        _LAST_COUNT.kept = (loss, count)
    return loss


#: The count of targets of this thread's last mean, with the loss it divided: an eager
#: autograd forward's setup_context takes it for the backward (:func:`counted`).
_LAST_COUNT = threading.local()


def counted(loss: torch.Tensor):
    """The count of targets that ``loss`` (a mean just computed on this thread) was divided
    by, or None where it is not the last one kept."""
    kept = getattr(_LAST_COUNT, "kept", None)
    _LAST_COUNT.kept = None
    return kept[1] if kept is not None and kept[0] is loss else None


def grad_scale(grad_loss: torch.Tensor, target, ignore_index: int, reduction: str):
    """What each row's gradient is multiplied by: the incoming gradient (one a row for "none"),
    divided by the count of targets for a mean."""
    scale = grad_loss.float()
    return scale / count_valid(target, ignore_index) if reduction == "mean" else scale


# --------------------------------------------------------------------------------------------
# What both losses' autograd shares: gradients made in the forward, scaled in the backward.
# --------------------------------------------------------------------------------------------
def rescale_factor(grad_loss: torch.Tensor, applied: torch.Tensor) -> torch.Tensor:
    """What turns a gradient already multiplied by ``applied`` into one multiplied by
    ``grad_loss``: 1 where they are equal, NaN where ``applied`` (0, inf, NaN) has wiped what
    was there. Device tensors throughout: no host sync."""
    recoverable = (applied != 0) & applied.isfinite()
    nan = torch.full_like(grad_loss, float("nan"))
    return torch.where(grad_loss == applied, torch.ones_like(grad_loss),
                       torch.where(recoverable, grad_loss / applied, nan))


def applied_scale(ctx, i: int, what: str):
    """The incoming gradient that saved gradient ``i`` was multiplied by in place, or None
    while it holds the forward's gradient for an incoming gradient of 1. ``ctx.applied[i]``
    keeps that tensor (a reference: a copy would cost a launch every backward) and its
    version, so that a caller who changes it in place before a second backward is refused."""
    if ctx.applied[i] is None:
        return None
    applied, version = ctx.applied[i]
    if applied._version != version:
        raise RuntimeError(
            f"{what}: the incoming gradient of the first backward was modified in place before "
            "this one; the saved gradient holds that first scale, and a backward through the "
            "graph again needs it unchanged")
    return applied


def refuse_double_backward(what: str, *grads_of_grads) -> None:
    """A gradient made in the forward is an output of the forward's node (kept differentiable
    in eager calls): a backward that builds a graph (create_graph) multiplies it by the incoming
    gradient, so differentiating that result leads back here, with a gradient for it. Refused:
    the second derivative is not implemented, and dropping it would be silently wrong."""
    if any(g is not None for g in grads_of_grads):
        raise RuntimeError(f"{what}: differentiating its gradient again (double backward) is "
                           "not supported")
