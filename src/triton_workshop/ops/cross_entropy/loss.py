"""cross_entropy's registered ops and their autograd: the forward (loss, logsumexp and, where
the eager backward can use it, the gradient), the recomputing backward, and the scaling of a
gradient the forward made. The public function is in the package's ``__init__``.
"""

from __future__ import annotations

import torch

from ... import runtime
from ...runtime import register_op
from .plans import (
    applied_scale,
    backward_plan,
    backward_plan_for,
    count_valid,
    counted,
    forward_plan_for,
    grad_scale,
    launch_backward,
    launch_forward,
    reduce_losses,
    reduce_plan,
    refuse_double_backward,
)
from .tuning import TUNING


# --------------------------------------------------------------------------------------------
# cross_entropy: registered ops and autograd.
#
# Where autograd records an eager call (fp32 or bf16 logits), the forward makes the gradient
# for an incoming gradient of 1 while it reads the logits (a second read of each row, from L2),
# and autograd keeps that gradient instead of the logits: the backward multiplies it in place
# by the incoming gradient, on the device, and leaves a row alone when that is exactly 1 (a
# loss's usual incoming gradient; a mean's 1/n_valid is already in). Forward + backward then
# move 2·N·V elements (read the logits, write the gradient) where recomputing in the backward
# moves 3·N·V; an incoming gradient other than 1 adds a read and a write (4·N·V).
#
# Why a kernel reads the incoming gradient rather than the host checking ``grad == 1``: the
# value lives on the GPU, and reading it waits for everything queued before it (the whole
# forward), which stalls the host at the start of every backward and is refused inside CUDA
# graphs; the kernel's check costs one scalar load a row.
#
# The recompute path stays where it is better:
# * fp16 logits: the gradient of a mean over many tokens (softmax / n_valid, down to 1e-10) is
#   below fp16's range before a loss scaler's factor (GradScaler's 2**16) multiplies it, so
#   storing it first would flush it to zero; recomputed, the factor comes first, as in torch.
# * torch.compile and other traced calls: the traced backward cannot skip a pass or write in
#   place, and 3·N·V beats 4·N·V.
# * no gradient wanted: the forward reads the logits once and writes nothing.
#
# Peak memory is the same N·V gradient either way; what autograd keeps between forward and
# backward is the gradient instead of the logits (which the caller may free).
# --------------------------------------------------------------------------------------------
def _cross_entropy_forward_fake(x, target, ignore_index, reduction, label_smoothing, out_dtype,
                                compute_grad):
    n_rows = x.shape[0]
    return (x.new_empty((n_rows,) if reduction == "none" else (), dtype=out_dtype),
            x.new_empty(n_rows, dtype=torch.float32),
            x.new_empty(x.shape if compute_grad else (0,)))


def _forward_outputs(x, target, ignore_index: int, reduction: str, compute_grad: bool):
    """The forward's outputs for (N, C) logits ``x``: per-row losses and logsumexps (fp32), a
    mean's count of targets (None otherwise) and the gradient (an empty placeholder without
    ``compute_grad``)."""
    n_rows = x.shape[0]
    return (x.new_empty(n_rows, dtype=torch.float32), x.new_empty(n_rows, dtype=torch.float32),
            count_valid(target, ignore_index) if reduction == "mean" else None,
            x.new_empty(x.shape) if compute_grad else x.new_empty(0))


# No autocast policy of its own: under autocast F.cross_entropy (on torch's fp32 lists) casts
# the logits to fp32; this op reads them as they are (its arithmetic is fp32 anyway) and only
# returns the fp32 loss that autocast gives (``out_dtype``), without an fp32 copy of the logits.
@register_op("cross_entropy_forward", fake=_cross_entropy_forward_fake)
def cross_entropy_forward(
    x: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    out_dtype: torch.dtype,
    compute_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, lse, grad)`` of (N, C) logits ``x`` and (N,) targets (arguments already checked
    by :func:`cross_entropy`): ``loss`` reduced and in ``out_dtype``; ``lse`` the per-row
    logsumexp (fp32, 0 for ignored rows); with ``compute_grad`` ``grad`` = d(loss)/d(x) for an
    incoming gradient of 1 (a new contiguous tensor in ``x``'s dtype; ``x`` is only read),
    otherwise an empty placeholder."""
    n_rows = x.shape[0]
    loss_rows, lse, count, grad = _forward_outputs(x, target, ignore_index, reduction,
                                                   compute_grad)
    if n_rows:
        launch_forward(x, target, loss_rows, lse, ignore_index, label_smoothing,
                       grad if compute_grad else None, count if compute_grad else None)
    loss = reduce_losses(loss_rows, target, ignore_index, reduction, out_dtype, count,
                         keep_count=not compute_grad)
    return loss, lse, grad


def _cross_entropy_backward_fake(grad_loss, x, target, lse, ignore_index, reduction,
                                 label_smoothing):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@register_op("cross_entropy_backward", fake=_cross_entropy_backward_fake)
def cross_entropy_backward(
    grad_loss: torch.Tensor,
    x: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
) -> torch.Tensor:
    """The gradient of the loss w.r.t. ``x`` (contiguous, ``x``'s dtype), recomputed from the
    saved per-row ``lse``: one read of ``x`` and one write."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        scale = grad_scale(grad_loss, target, ignore_index, reduction)
        launch_backward(x, target, lse, scale, dx, ignore_index, label_smoothing)
    return dx


def _scale_grad_fake(grad_loss, grad, target, applied, ignore_index):
    return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)


@register_op("cross_entropy_scale_grad", fake=_scale_grad_fake)
def cross_entropy_scale_grad(
    grad_loss: torch.Tensor,
    grad: torch.Tensor,
    target: torch.Tensor,
    applied: torch.Tensor | None,
    ignore_index: int,
) -> torch.Tensor:
    """``grad`` (the forward's gradient, for an incoming gradient of 1) times ``grad_loss``, out
    of place (a backward that builds a graph, or a second one over a retained graph). Where an
    earlier backward multiplied ``grad`` by ``applied`` in place: times ``grad_loss /
    applied``; a row it multiplied by 0, inf or NaN cannot be recovered and becomes NaN."""
    dx = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    if grad.shape[0]:
        launch_backward(grad, target, grad if applied is None else applied, grad_loss, dx,
                        ignore_index, 0.0, from_grad=True, applied=applied is not None)
    return dx


def _cross_entropy_setup_context(ctx, inputs, output):
    x, target, ignore_index, reduction, label_smoothing, _, compute_grad = inputs
    loss, lse, grad = output
    eager = getattr(ctx, "eager", False)
    planned = count = None
    if eager and x.shape[0] and reduction != "none":
        count = counted(loss) if reduction == "mean" and not compute_grad else None
        if compute_grad or reduction == "sum" or count is not None:
            planned = _eager_backward_plan(x, target, lse, grad, loss, ignore_index,
                                           label_smoothing, compute_grad, count)
    _save_for_backward(ctx, x, target, lse, grad, loss, ignore_index, reduction,
                       label_smoothing, compute_grad, eager, planned, count)


def _save_for_backward(ctx, x, target, lse, grad, loss, ignore_index, reduction,
                       label_smoothing, compute_grad, eager, planned, count):
    """What the backward reads, on ``ctx``: ``planned`` is the eager backward's plan (None:
    not an eager call, or no plan for its reduction) for a 0-d incoming gradient of
    ``ctx.scale_dtype``, ``count`` a mean's count of targets."""
    if compute_grad and eager:
        # ``grad`` stays differentiable (see :func:`refuse_double_backward`).
        ctx.mark_non_differentiable(lse)
    else:
        ctx.mark_non_differentiable(lse, grad)
    ctx.set_materialize_grads(False)  # no zeros built for the outputs nobody differentiates
    ctx.loss_args = (ignore_index, reduction, label_smoothing)
    ctx.from_grad = compute_grad
    ctx.backward_plan = planned
    ctx.scale_dtype = loss.dtype
    if compute_grad:
        # The gradient, not the logits: the caller's logits may be freed after the forward.
        ctx.save_for_backward(grad, target)
        ctx.applied = [None]  # see applied_scale
        return
    # The logits themselves: saving a tensor that exists costs no memory.
    ctx.save_for_backward(x, target, lse)
    # A mean's count of targets, from the forward: not counted again in the backward.
    ctx.count = count


def _eager_backward_plan(x, target, lse, grad, loss, ignore_index, label_smoothing,
                         compute_grad, count=None):
    """The first eager backward's plan for a mean or a sum, found on the calling thread: the
    backward then only allocates and launches. Either way for one incoming gradient, 0-d, of
    the loss's dtype, read by the kernel as it is. From the forward's gradient: applied in
    place; recomputed: dx contiguous, a mean's scale divided by ``count`` in the kernel."""
    n_rows, n_cols = x.shape
    if compute_grad:
        return backward_plan(
            n_rows, n_cols,
            (grad.dtype, target.dtype, grad.dtype, loss.dtype, loss.dtype, grad.dtype),
            grad.stride(), target.stride(0), grad.stride(0), 0, n_cols, ignore_index, 0.0,
            True, False, True, False, TUNING)
    return backward_plan(
        n_rows, n_cols,
        (x.dtype, target.dtype, lse.dtype, loss.dtype,
         loss.dtype if count is None else count.dtype, x.dtype),
        x.stride(), target.stride(0), 1, 0, n_cols, ignore_index, label_smoothing,
        False, False, False, count is not None, TUNING)


def _cross_entropy_forward_planned(ctx, x, target, ready):
    """The eager autograd forward of a kept signature (the public function's ``RECORD`` path,
    (N, C) logits): :func:`cross_entropy_forward` and :func:`_cross_entropy_setup_context` with
    the plans kept for it, found at the first such call. ``ready``: ``(ignore_index,
    label_smoothing, reduction, out_dtype, compute_grad, [(forward plan, reduction's plan,
    backward plan)])``. Without the gradient in the forward, a mean or a sum is reduced by one
    kernel (which also keeps a mean's count for the backward): no small torch ops."""
    ignore_index, smoothing, reduction, out_dtype, compute_grad, record = ready
    if compute_grad:
        return _forward_planned_with_grad(ctx, x, target, ready)
    n_rows = x.shape[0]
    lse = x.new_empty(n_rows, dtype=torch.float32)
    if reduction == "none":
        loss = loss_rows = x.new_empty(n_rows, dtype=out_dtype)
        grad = x.new_empty(0)
        count = None
    else:
        # The gradient output is never read (compute_grad off): the loss rows stand in for it.
        loss_rows = grad = x.new_empty(n_rows, dtype=torch.float32)
        loss = x.new_empty((), dtype=out_dtype)
        count = x.new_empty((), dtype=torch.float32) if reduction == "mean" else None
    if record:
        plan, reduce, planned = record[0]
    else:
        plan = forward_plan_for(x, target, loss_rows, lse, ignore_index, smoothing)[0]
        reduce = planned = None
        if reduction != "none":
            reduce = reduce_plan(n_rows, (torch.float32, target.dtype, out_dtype, torch.float32),
                                 target.stride(0), ignore_index, reduction == "mean", True)
            planned = _eager_backward_plan(x, target, lse, grad, loss, ignore_index, smoothing,
                                           False, count)
        record.append((plan, reduce, planned))
    with runtime.device_guard(x):
        plan.launch_eager(x, target, lse, loss_rows, lse, lse)
        if reduce is not None:
            reduce.launch_eager(loss_rows, target, loss, loss if count is None else count)
    _save_for_backward(ctx, x, target, lse, grad, loss, ignore_index, reduction, smoothing,
                       False, True, planned, count)
    return loss, lse, grad


def _forward_planned_with_grad(ctx, x, target, ready):
    """:func:`_cross_entropy_forward_planned` where the forward makes the gradient (a mean
    divides it by the count of targets, so that is counted first)."""
    ignore_index, smoothing, reduction, out_dtype, _, record = ready
    loss_rows, lse, count, grad = _forward_outputs(x, target, ignore_index, reduction, True)
    tensors = (x, target, lse if count is None else count, loss_rows, lse, grad)
    if record:
        plan, _, planned = record[0]
    else:
        plan = forward_plan_for(x, target, loss_rows, lse, ignore_index, smoothing, grad,
                                count)[0]
    with runtime.device_guard(x):
        plan.launch_eager(*tensors)
    loss = reduce_losses(loss_rows, target, ignore_index, reduction, out_dtype, count,
                         keep_count=False)
    if not record:
        planned = None if reduction == "none" else _eager_backward_plan(
            x, target, lse, grad, loss, ignore_index, smoothing, True)
        record.append((plan, None, planned))
    _save_for_backward(ctx, x, target, lse, grad, loss, ignore_index, reduction, smoothing,
                       True, True, planned, count)
    return loss, lse, grad


def _backward_from_grad(ctx, grad_loss):
    """The backward where the forward stored the gradient: the first eager one multiplies it in
    place and hands it out; a backward that builds a graph (create_graph), or any later one
    over a retained graph, makes a new tensor."""
    grad, target = ctx.saved_tensors
    ignore_index = ctx.loss_args[0]
    if ctx.applied[0] is None and runtime.eager_backward():
        if grad.shape[0]:
            plan = ctx.backward_plan
            if plan is None or grad_loss.dtype is not ctx.scale_dtype or grad_loss.dim():
                plan = backward_plan_for(grad, target, grad, grad_loss, grad, ignore_index, 0.0,
                                         from_grad=True)
            # Autograd runs a CUDA backward on its device thread, already on grad's device.
            plan.launch_eager(grad, target, grad, grad_loss, grad_loss, grad)
        ctx.applied[0] = (grad_loss, grad_loss._version)
        return grad.detach()
    return cross_entropy_scale_grad(grad_loss, grad, target,
                                    applied_scale(ctx, 0, "cross_entropy"), ignore_index)


def _cross_entropy_backward_autograd(ctx, grad_loss, _grad_lse, grad_of_grad):
    refuse_double_backward("cross_entropy", grad_of_grad)
    if grad_loss is None or not ctx.needs_input_grad[0]:
        return None, None, None, None, None, None, None
    if ctx.from_grad:
        return _backward_from_grad(ctx, grad_loss), None, None, None, None, None, None
    x, target, lse = ctx.saved_tensors
    if runtime.traced():
        return (_traced_backward(grad_loss, x, target, lse, *ctx.loss_args),
                None, None, None, None, None, None)
    plan = ctx.backward_plan
    if (plan is not None and grad_loss.dtype is ctx.scale_dtype and not grad_loss.dim()
            and runtime.eager_backward()):
        # The kept plan: the incoming gradient as it is (a mean's count divides it in the
        # kernel). Autograd runs a CUDA backward on its device thread, already on x's device.
        dx = torch.empty_like(x, memory_format=torch.contiguous_format)
        count = ctx.count
        plan.launch_eager(x, target, lse, grad_loss, grad_loss if count is None else count, dx)
    else:
        dx = cross_entropy_backward(grad_loss, x, target, lse, *ctx.loss_args)
    return dx, None, None, None, None, None, None


def _traced_backward(grad_loss, x, target, lse, ignore_index, reduction, label_smoothing):
    """:func:`cross_entropy_backward` in torch ops, for a backward that is traced
    (:func:`runtime.traced`: torch.compile's): one pointwise expression of the logits, their
    saved ``lse`` and the targets, which Inductor fuses with the ops around it. A model that returns its logits as well as their loss (a
    causal LM's head) gets a zero gradient for the returned logits added to this one in the
    compiled backward: fused, that add costs one more read; after the kernel, a pass over the
    (tokens x vocabulary) logits of its own. Same arithmetic as the kernel: fp32, one rounding
    to the logits' dtype; an ignored row's gradient is 0."""
    valid = (target != ignore_index).unsqueeze(1)
    scale = grad_scale(grad_loss, target, ignore_index, reduction)
    scale = scale.unsqueeze(1) if scale.dim() else scale
    n_classes = x.shape[1]
    hit = torch.arange(n_classes, device=x.device) == target.unsqueeze(1)
    grad = torch.exp(x.float() - lse.unsqueeze(1)) - hit * (1.0 - label_smoothing)
    if label_smoothing:
        grad = grad - label_smoothing / n_classes
    return torch.where(valid, grad * scale, 0.0).to(x.dtype)


cross_entropy_forward.register_autograd(
    _cross_entropy_backward_autograd, setup_context=_cross_entropy_setup_context
)
cross_entropy_forward.register_planned_forward(_cross_entropy_forward_planned)
