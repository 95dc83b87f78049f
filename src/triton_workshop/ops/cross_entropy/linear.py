"""linear_cross_entropy's registered ops and their autograd: the chunk loop over tokens (one
chunk of logits at a time, turned into its gradient in place), the gradients of the input, the
weight and the bias made in the forward for a mean or a sum, and the recomputing backward of
reduction="none". The public function is in the package's ``__init__``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import runtime
from ...runtime import register_op
from .plans import (
    applied_scale,
    count_valid,
    launch_backward,
    launch_forward,
    reduce_losses,
    refuse_double_backward,
    rescale_factor,
)
from .tuning import TUNING, CrossEntropyTuning


# --------------------------------------------------------------------------------------------
# linear_cross_entropy: the chunk loop, registered ops and autograd.
# --------------------------------------------------------------------------------------------
def chunk_rows(n_vocab: int, itemsize: int, tuning: CrossEntropyTuning | None = None) -> int:
    """Tokens a chunk of linear_cross_entropy takes: the largest power of two whose logits
    (``rows x n_vocab`` of ``itemsize`` bytes) fit ``tuning.logits_chunk_bytes``, at most
    ``tuning.max_chunk_rows``, at least 1 (see :class:`CrossEntropyTuning` for why)."""
    tuning = TUNING if tuning is None else tuning
    rows = min(tuning.logits_chunk_bytes // max(1, int(n_vocab) * itemsize),
               tuning.max_chunk_rows)
    return 1 << (rows.bit_length() - 1) if rows > 1 else 1


def new_grads(x, weight, bias, need):
    """Gradient buffers, or empty placeholders where not needed: ``grad_x`` is written chunk by
    chunk, ``grad_weight`` accumulated in its own dtype (as cuBLAS adds into it, one rounding a
    chunk; the first chunk's product is written, so it needs no zeros unless there are no
    tokens), ``grad_bias`` accumulated in fp32 (only V values). Nothing else of their size is
    ever made: the backward scales these in place."""
    need_x, need_w, need_b = need
    # Allocated like x and weight, or by an int: cheaper on the host than by a shape.
    grad_x = (torch.empty_like(x, memory_format=torch.contiguous_format) if need_x
              else x.new_empty(0))
    if not need_w:
        grad_w = weight.new_empty(0)
    elif x.shape[0]:
        grad_w = torch.empty_like(weight, memory_format=torch.contiguous_format)
    else:
        grad_w = torch.zeros_like(weight, memory_format=torch.contiguous_format)
    grad_b = (x.new_zeros(weight.shape[0], dtype=torch.float32) if need_b
              else x.new_empty(0, dtype=torch.float32))
    return grad_x, grad_w, grad_b


def _linear_cross_entropy_chunks(x, weight, bias, target, ignore_index, smoothing, lse, grads,
                                 loss_rows=None, count=None, grad_rows=None):
    """The chunk loop. With ``loss_rows`` (the forward): each chunk's loss and ``lse``, and its
    logits turned into gradients in place when a gradient is wanted (divided by ``count``, a
    mean's count of targets, where given). Without (the backward of reduction="none"): each
    chunk's gradients from the saved ``lse``, times ``grad_rows`` (the incoming gradient, one
    a token). Then, while the chunk's gradient is at hand, the three products of a linear
    layer's backward."""
    grad_x, grad_w, grad_b = grads
    need_x, need_w, need_b = grad_x.numel() > 0, grad_w.numel() > 0, grad_b.numel() > 0
    compute_grad = need_x or need_w or need_b
    n_rows = x.shape[0]
    step = chunk_rows(weight.shape[0], x.dtype.itemsize)
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        if end - start == n_rows:  # one chunk (the usual case for small batches): no slices
            x_chunk, target_chunk, lse_chunk = x, target, lse
            loss_chunk, scale_chunk = loss_rows, grad_rows
        else:
            x_chunk, target_chunk, lse_chunk = x[start:end], target[start:end], lse[start:end]
            loss_chunk = loss_rows[start:end] if loss_rows is not None else None
            scale_chunk = grad_rows[start:end] if grad_rows is not None and grad_rows.dim() \
                else grad_rows
        # The logits as the reference gets them (F.linear in the input's dtype); the kernels
        # read them as fp32, which is what the reference's .float() gives, exactly.
        logits = F.linear(x_chunk, weight, bias)
        if loss_rows is not None:
            launch_forward(logits, target_chunk, loss_chunk, lse_chunk, ignore_index, smoothing,
                           logits if compute_grad else None, count if compute_grad else None)
        else:
            launch_backward(logits, target_chunk, lse_chunk, scale_chunk, logits,
                            ignore_index, smoothing)
        if compute_grad:
            # ``logits`` now holds d(loss)/d(logits) in the input's dtype: the gradient that
            # the reference's .float() hands back to F.linear.
            if need_x:
                torch.mm(logits, weight, out=grad_x[start:end])
            if need_w and start == 0:
                torch.mm(logits.t(), x_chunk, out=grad_w)
            elif need_w:
                grad_w.addmm_(logits.t(), x_chunk)
            if need_b:
                grad_b.add_(logits.sum(0, dtype=torch.float32))
        # Freed before the next chunk's are made: rebinding the name would keep these alive
        # while F.linear allocates the next, two chunks of logits at once.
        del logits


def _finish_grads(grads, x, bias):
    """The gradients as returned: ``grad_bias`` (or its placeholder) in bias's dtype, x's when
    there is no bias (what the fake functions promise)."""
    grad_x, grad_w, grad_b = grads
    dtype = (bias if bias is not None else x).dtype
    return grad_x, grad_w, grad_b if grad_b.dtype == dtype else grad_b.to(dtype)


def _linear_forward_fake(x, weight, target, bias, ignore_index, reduction, label_smoothing,
                         need_x, need_w, need_b):
    n_rows, in_forward = x.shape[0], reduction != "none"
    return (
        x.new_empty((n_rows,) if reduction == "none" else (), dtype=torch.float32),
        x.new_empty(n_rows, dtype=torch.float32),
        x.new_empty(x.shape if need_x and in_forward else (0,)),
        weight.new_empty(weight.shape if need_w and in_forward else (0,)),
        (bias if bias is not None else x).new_empty(
            weight.shape[0] if need_b and in_forward else 0),
    )


@register_op("linear_cross_entropy_forward", fake=_linear_forward_fake,
             autocast="lower_precision_fp")  # as the F.linear it starts with
def linear_cross_entropy_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    need_x: bool,
    need_w: bool,
    need_b: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, lse, grad_x, grad_weight, grad_bias)`` for (N, H) ``x``, (V, H) ``weight``, (N,)
    ``target`` (checked by :func:`linear_cross_entropy`). ``loss`` is fp32; ``lse`` per row. For
    a mean or a sum the gradients asked for (``need_*``) are computed here, for a unit incoming
    gradient; otherwise (and for reduction="none") they are empty placeholders."""
    n_rows = x.shape[0]
    loss_rows = x.new_empty(n_rows, dtype=torch.float32)
    lse = x.new_empty(n_rows, dtype=torch.float32)
    in_forward = reduction != "none"
    grads = new_grads(x, weight, bias, (need_x and in_forward, need_w and in_forward,
                                        need_b and in_forward and bias is not None))
    count = count_valid(target, ignore_index) if reduction == "mean" else None
    _linear_cross_entropy_chunks(x, weight, bias, target, ignore_index, label_smoothing, lse,
                                 grads, loss_rows=loss_rows, count=count)
    return (reduce_losses(loss_rows, target, ignore_index, reduction, count=count), lse,
            *_finish_grads(grads, x, bias))


def _linear_backward_fake(grad_loss, x, weight, target, bias, lse, ignore_index,
                          label_smoothing, need_x, need_w, need_b):
    return (
        x.new_empty(x.shape if need_x else (0,)),
        weight.new_empty(weight.shape if need_w else (0,)),
        (bias if bias is not None else x).new_empty(weight.shape[0] if need_b else 0),
    )


@register_op("linear_cross_entropy_backward", fake=_linear_backward_fake)
def linear_cross_entropy_backward(
    grad_loss: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    lse: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    need_x: bool,
    need_w: bool,
    need_b: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of reduction="none": a per-row incoming gradient must scale each row of
    d(loss)/d(logits) before the rows are summed into ``grad_weight``, so the logits are
    recomputed chunk by chunk (one more product a chunk), with the saved ``lse``."""
    grads = new_grads(x, weight, bias, (need_x, need_w, need_b and bias is not None))
    _linear_cross_entropy_chunks(x, weight, bias, target, ignore_index, label_smoothing, lse,
                                 grads, grad_rows=grad_loss.float())
    return _finish_grads(grads, x, bias)


def _linear_setup_context(ctx, inputs, output):
    x, weight, target, bias, ignore_index, reduction, label_smoothing, *need = inputs
    _, lse, grad_x, grad_w, grad_b = output
    if reduction != "none" and getattr(ctx, "eager", False):
        # The gradients stay differentiable (see :func:`refuse_double_backward`).
        ctx.mark_non_differentiable(lse)
    else:
        ctx.mark_non_differentiable(lse, grad_x, grad_w, grad_b)
    ctx.set_materialize_grads(False)
    ctx.reduction, ctx.need = reduction, tuple(need)
    if reduction == "none":
        ctx.save_for_backward(x, weight, target, bias, lse)
        ctx.loss_args = (ignore_index, label_smoothing)
    else:  # the gradients are already computed: keep them, not the inputs
        ctx.save_for_backward(grad_x, grad_w, grad_b)
        ctx.applied = [None, None, None]  # see applied_scale


def _linear_scaled_grads(ctx, grad_loss, wanted):
    """The forward's gradients (for an incoming gradient of 1) times the incoming scalar. The
    first eager backward multiplies them in place and hands them out, as Liger-Kernel does: a
    scaled copy would hold grad_weight twice at the peak (501 MiB more at 128256 x 2048 in
    bf16). A backward that builds a graph (create_graph), or a later one over a retained graph,
    multiplies out of place, by ``grad_loss / (the scale applied)``."""
    saved = ctx.saved_tensors
    eager = runtime.eager_backward()
    out = []
    for i, (g, want) in enumerate(zip(saved, wanted)):
        if not want:
            out.append(None)
            continue
        applied = applied_scale(ctx, i, "linear_cross_entropy")
        if applied is None and eager:
            # Through .data: the product in place is this op's own bookkeeping (ctx.applied),
            # not a change that should make autograd refuse a backward over a retained graph.
            g.data.mul_(grad_loss)
            ctx.applied[i] = (grad_loss, grad_loss._version)
            out.append(g.detach())
        else:
            out.append(g * (grad_loss if applied is None else rescale_factor(grad_loss, applied)))
    return out


def _linear_backward_autograd(ctx, grad_loss, _grad_lse, *grads_of_grads):
    refuse_double_backward("linear_cross_entropy", *grads_of_grads)
    need_x, need_w, _, need_b = ctx.needs_input_grad[:4]
    if grad_loss is None or not (need_x or need_w or need_b):
        return (None,) * 10
    if ctx.reduction != "none" and any(
            wanted and not computed
            for wanted, computed in zip((need_x, need_w, need_b), ctx.need)):
        raise RuntimeError(
            "linear_cross_entropy_forward was called with need_x/need_w/need_b "
            f"{ctx.need} but autograd needs {(need_x, need_w, need_b)}: call "
            "linear_cross_entropy(), which sets them from requires_grad")
    if ctx.reduction == "none":
        x, weight, target, bias, lse = ctx.saved_tensors
        grad_x, grad_w, grad_b = linear_cross_entropy_backward(
            grad_loss, x, weight, target, bias, lse, *ctx.loss_args, need_x, need_w, need_b)
    else:
        grad_x, grad_w, grad_b = _linear_scaled_grads(ctx, grad_loss, (need_x, need_w, need_b))
    return (grad_x if need_x else None, grad_w if need_w else None, None,
            grad_b if need_b else None, None, None, None, None, None, None)


linear_cross_entropy_forward.register_autograd(
    _linear_backward_autograd, setup_context=_linear_setup_context
)
