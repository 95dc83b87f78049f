"""linear_cross_entropy's chunk plan, registered ops and autograd: how the logits are cut
(:func:`chunk_plan`: chunks of tokens, each in blocks of the vocabulary where whole rows would
leave too few tokens a chunk), the chunk loop (one block of logits at a time, turned into its
gradient in place), the gradients of the input, the weight and the bias made in the forward
for a mean or a sum, and the recomputing backward of reduction="none". The public function is
in the package's ``__init__``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ... import runtime
from ...runtime import register_op
from .plans import (
    SCALE_BY_COUNT,
    SCALE_BY_ROW,
    SCALE_NONE,
    applied_scale,
    block_forward_plan_for,
    count_valid,
    launch_block_forward,
    launch_block_grad,
    reduce_losses,
    reduce_plan,
    refuse_double_backward,
    rescale_factor,
)
from .tuning import TUNING, CrossEntropyTuning


# --------------------------------------------------------------------------------------------
# How the logits are cut: chunks of tokens, and blocks of the vocabulary where rows do not fit.
# --------------------------------------------------------------------------------------------
class ChunkPlan(NamedTuple):
    """How linear_cross_entropy cuts the ``tokens x vocabulary`` logits (:func:`chunk_plan`)."""

    #: Tokens a chunk takes (the last chunk may take fewer).
    rows: int
    #: Classes a block of a chunk takes: the whole vocabulary (one block), or a part of it (the
    #: last block may take fewer).
    cols: int
    #: Blocks a chunk is made in: ``ceil(vocabulary / cols)``.
    blocks: int
    #: The most bytes of logits held at once: ``rows x cols`` of the input's dtype.
    chunk_bytes: int


def _floor_pow2(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 1 else 1


def chunk_plan(n_tokens: int, n_vocab: int, itemsize: int,
               tuning: CrossEntropyTuning | None = None) -> ChunkPlan:
    """The chunks of :func:`linear_cross_entropy` for ``n_tokens`` tokens of ``n_vocab`` classes
    of ``itemsize`` bytes, within ``tuning.logits_chunk_bytes`` (see :class:`CrossEntropyTuning`
    for the numbers behind these rules):

    * whole rows where they fit enough tokens: the largest power of two of rows within the
      budget and ``max_chunk_rows``, if that is ``min_chunk_rows`` or more (or all the tokens);
    * otherwise ``min_chunk_rows`` tokens (or all, if fewer) and the vocabulary in as few
      blocks of equal width as the budget allows (the width rounded up to a multiple of 64 where
      that still fits: aligned rows for cuBLAS). Each block's logits are computed twice, once
      for the loss and once for the gradient (the last block's only once), since a block's
      gradient needs the logsumexp of the whole row.
    """
    tuning = TUNING if tuning is None else tuning
    n_tokens, n_vocab = max(1, int(n_tokens)), int(n_vocab)
    elements = max(1, tuning.logits_chunk_bytes // itemsize)  # logits a chunk may hold
    rows = _floor_pow2(min(elements // n_vocab, tuning.max_chunk_rows))
    if rows >= min(n_tokens, tuning.min_chunk_rows):
        rows = min(rows, n_tokens)
        return ChunkPlan(rows, n_vocab, 1, rows * n_vocab * itemsize)
    rows = min(n_tokens, tuning.min_chunk_rows, elements)
    blocks = -(-n_vocab // (elements // rows))
    cols = -(-n_vocab // blocks)  # as even as the blocks can be
    if rows * (-(-cols // 64) * 64) <= elements:
        cols = -(-cols // 64) * 64
    blocks = -(-n_vocab // cols)
    return ChunkPlan(rows, cols, blocks, rows * cols * itemsize)


def chunk_rows(n_vocab: int, itemsize: int, tuning: CrossEntropyTuning | None = None) -> int:
    """Tokens a chunk of linear_cross_entropy takes when there are many
    (:func:`chunk_plan`'s ``rows``)."""
    tuning = TUNING if tuning is None else tuning
    return chunk_plan(tuning.max_chunk_rows, n_vocab, itemsize, tuning).rows


def estimated_peak_bytes(n_tokens: int, hidden: int, n_vocab: int, dtype: torch.dtype, *,
                         bias: bool = False, tuning: CrossEntropyTuning | None = None) -> int:
    """What forward + backward of a mean or a sum hold at most beyond their inputs, by this
    module's accounting: ``grad_weight`` and ``grad_input`` in the input's dtype, ``grad_bias``
    in fp32 (and a block's fp32 sum added into it), one chunk of logits, and each token's fp32
    loss and logsumexp. Not counted: cuBLAS's workspace (made once a device, and kept) and the
    caching allocator's rounding."""
    itemsize = dtype.itemsize
    plan = chunk_plan(n_tokens, n_vocab, itemsize, tuning)
    total = (n_vocab + n_tokens) * hidden * itemsize + plan.chunk_bytes + 2 * n_tokens * 4
    return total + (n_vocab + plan.cols) * 4 if bias else total


# --------------------------------------------------------------------------------------------
# linear_cross_entropy: the chunk loop, registered ops and autograd.
# --------------------------------------------------------------------------------------------
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
    # The placeholder in the dtype _finish_grads returns: no cast of it every call.
    grad_b = (x.new_zeros(weight.shape[0], dtype=torch.float32) if need_b
              else (bias if bias is not None else x).new_empty(0))
    return grad_x, grad_w, grad_b


def _add_products(dlogits, x_chunk, w_block, grads, rows, cols, first_block, first_chunk):
    """A linear layer's backward for one block of a chunk, while its gradient ``dlogits`` is at
    hand: ``grad_x[rows] (+)= dlogits @ W[cols]`` (written by a chunk's first block, added into
    by the others: one rounding a block), ``grad_w[cols] (+)= dlogitsᵀ @ x_chunk`` (written by
    the first chunk, added into by the others: one rounding a chunk), ``grad_b[cols] +=`` the
    fp32 sum of its rows. ``dlogits`` is in the input's dtype: the gradient that the
    reference's ``.float()`` hands back to F.linear."""
    grad_x, grad_w, grad_b = grads
    if grad_x.numel():
        if first_block:
            torch.mm(dlogits, w_block, out=grad_x[rows[0]:rows[1]])
        else:
            grad_x[rows[0]:rows[1]].addmm_(dlogits, w_block)
    if grad_w.numel():
        out = grad_w if cols is None else grad_w[cols[0]:cols[1]]
        if first_chunk:
            torch.mm(dlogits.t(), x_chunk, out=out)
        else:
            out.addmm_(dlogits.t(), x_chunk)
    if grad_b.numel():
        (grad_b if cols is None else grad_b[cols[0]:cols[1]]).add_(
            dlogits.sum(0, dtype=torch.float32))


def _linear_cross_entropy_chunks(x, weight, bias, target, ignore_index, smoothing, lse, grads,
                                 loss_rows=None, count=None, grad_rows=None):
    """The chunk loop (:func:`chunk_plan`). With ``loss_rows`` (the forward): each chunk's loss
    and ``lse`` from its blocks of logits in turn, and, when a gradient is wanted, each block's
    logits turned into their gradient in place (divided by ``count``, a mean's count of targets,
    where given): the last block's while it is at hand, the others' recomputed once the rows'
    ``lse`` is known. Without (the backward of reduction="none"): each block's gradient from the
    saved ``lse``, times ``grad_rows`` (the incoming gradient, one a token). Then, while a
    block's gradient is at hand, the three products of a linear layer's backward."""
    grad_x, grad_w, grad_b = grads
    compute_grad = grad_x.numel() > 0 or grad_w.numel() > 0 or grad_b.numel() > 0
    n_rows, n_vocab = x.shape[0], weight.shape[0]
    plan = chunk_plan(n_rows, n_vocab, x.dtype.itemsize)
    last = plan.blocks - 1
    if plan.blocks == 1:  # whole rows (the usual case): no slices of the weight
        blocks = [(None, weight, bias, 0)]
    else:
        blocks = [((v, min(v + plan.cols, n_vocab)), weight[v:v + plan.cols],
                   None if bias is None else bias[v:v + plan.cols], v)
                  for v in range(0, n_vocab, plan.cols)]
    scale_by = SCALE_BY_ROW if loss_rows is None else \
        SCALE_BY_COUNT if count is not None else SCALE_NONE
    for start in range(0, n_rows, plan.rows):
        end = min(start + plan.rows, n_rows)
        if end - start == n_rows:  # one chunk (the usual case for small batches): no slices
            x_chunk, target_chunk, lse_chunk = x, target, lse
            loss_chunk, scale_chunk = loss_rows, grad_rows
        else:
            x_chunk, target_chunk, lse_chunk = x[start:end], target[start:end], lse[start:end]
            loss_chunk = loss_rows[start:end] if loss_rows is not None else None
            scale_chunk = grad_rows[start:end] if grad_rows is not None and grad_rows.dim() \
                else grad_rows
        rows, first_chunk = (start, end), start == 0
        if loss_rows is not None:
            # The loss: every block's logits in turn, as the reference gets them (F.linear in
            # the input's dtype; the kernel's fp32 read of them is the reference's .float()).
            # With a gradient wanted the last block's become their gradient, and stay.
            for i, (cols, w_block, b_block, col_start) in enumerate(blocks):
                logits = F.linear(x_chunk, w_block, b_block)
                launch_block_forward(logits, target_chunk, loss_chunk, lse_chunk, col_start,
                                     n_vocab, ignore_index, smoothing, i == 0, i == last,
                                     compute_grad, count if compute_grad else None)
                if i < last or not compute_grad:
                    # Freed before the next block's are made: rebinding the name would keep
                    # these alive while F.linear allocates the next, two blocks at once.
                    del logits
            if not compute_grad:
                continue
            order = range(last, -1, -1)  # the block at hand first
        else:
            order = range(plan.blocks)
        for i in order:
            cols, w_block, b_block, col_start = blocks[i]
            if loss_rows is None or i != last:
                logits = F.linear(x_chunk, w_block, b_block)
                launch_block_grad(logits, target_chunk, lse_chunk, col_start, n_vocab,
                                  ignore_index, smoothing,
                                  scale_chunk if loss_rows is None else count, scale_by)
            _add_products(logits, x_chunk, w_block, grads, rows, cols, i == order[0],
                          first_chunk)
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


# Opaque to torch.compile (see register_op): traced into, the chunk loop's in-place updates of
# the gradients' slices gave wrong gradients on an H100 when compiled under a plan of several
# chunks; and a 128k vocabulary's dozens of chunks would be unrolled into the graph.
@register_op("linear_cross_entropy_forward", fake=_linear_forward_fake, opaque=True,
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


@register_op("linear_cross_entropy_backward", fake=_linear_backward_fake, opaque=True)
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


# --------------------------------------------------------------------------------------------
# The eager path of a kept signature whose tokens fit one chunk of whole rows.
# --------------------------------------------------------------------------------------------
def one_chunk(n_tokens: int, n_vocab: int, itemsize: int) -> bool:
    """Whether :func:`chunk_plan` takes all the tokens in one chunk of whole rows (the chunk
    loop's one step: :func:`one_chunk_forward`)."""
    plan = chunk_plan(n_tokens, n_vocab, itemsize)
    return plan.blocks == 1 and plan.rows >= n_tokens


def one_chunk_forward(x, weight, target, bias, ignore_index, reduction, smoothing, need,
                      plans: dict):
    """:func:`linear_cross_entropy_forward`'s outputs (``need`` given: the loss alone, without
    autograd) for tokens that fit one chunk of whole rows (:func:`one_chunk`): the chunk loop's
    one step, with the kernels' plans kept in ``plans`` by whether the block kernel makes the
    gradient. ``lse`` is not returned (None: the gradients are made here), nor a gradient
    that is not needed (None)."""
    n_rows = x.shape[0]
    loss_rows = x.new_empty(n_rows, dtype=torch.float32)
    lse = x.new_empty(n_rows, dtype=torch.float32)
    in_forward = reduction != "none"
    compute_grad = need is not None and in_forward and (
        need[0] or need[1] or (need[2] and bias is not None))
    mean_grad = compute_grad and reduction == "mean"
    loss = x.new_empty((), dtype=torch.float32) if in_forward else loss_rows
    # As the chunk loop makes and reads them (see _linear_cross_entropy_chunks).
    logits = F.linear(x, weight, bias)
    plan = plans.get(compute_grad)
    if plan is None:
        plan = plans[compute_grad] = _one_chunk_plans(
            logits, target, loss_rows, lse, loss, weight.shape[0], ignore_index, reduction,
            smoothing, compute_grad)
    guard = runtime.device_guard(logits)
    if guard is _SAME_DEVICE:  # entering the no-op context costs two calls
        _launch_one_chunk(plan, logits, target, loss_rows, lse, loss, mean_grad)
    else:
        with guard:
            _launch_one_chunk(plan, logits, target, loss_rows, lse, loss, mean_grad)
    if need is None:
        return loss
    grad_x = grad_w = grad_b = None
    if compute_grad:  # the chunk's products (_add_products), each written whole
        if need[0]:
            grad_x = torch.mm(logits, weight)
        if need[1]:
            grad_w = torch.mm(logits.t(), x)
        if need[2] and bias is not None:  # of x's dtype (checked): summed in fp32, one rounding
            grad_b = logits.sum(0)
    return loss, None, grad_x, grad_w, grad_b


def _launch_one_chunk(plans, logits, target, loss_rows, lse, loss, mean_grad: bool) -> None:
    """:func:`one_chunk_forward`'s launches (``plans``: :func:`_one_chunk_plans`)."""
    block, reduce, count = plans
    if mean_grad:
        # A mean's gradient is divided by the count of targets in the block kernel: counted
        # first, into the loss (the mean overwrites it once the block kernel has read it).
        count.launch_eager(loss, target, loss, loss)
    block.launch_eager(logits, target, loss if mean_grad else lse, loss_rows, lse)
    if reduce is not None:  # a mean or a sum: one kernel reduces the rows (and counts a mean's)
        reduce.launch_eager(loss_rows, target, loss, loss)


def _one_chunk_plans(logits, target, loss_rows, lse, loss, n_vocab, ignore_index, reduction,
                     smoothing, compute_grad):
    """:func:`one_chunk_forward`'s plans: the block kernel's, the reduction's (None for
    reduction="none") and, for a mean's gradient, the count's (else None)."""
    mean_grad = compute_grad and reduction == "mean"
    block = block_forward_plan_for(logits, target, loss_rows, lse, 0, n_vocab, ignore_index,
                                   smoothing, True, True, compute_grad,
                                   loss if mean_grad else None)[0]
    n_rows = logits.shape[0]
    dtypes = (torch.float32, target.dtype, torch.float32, torch.float32)
    reduce = None if reduction == "none" else reduce_plan(
        n_rows, dtypes, target.stride(0), ignore_index, reduction == "mean", False)
    count = reduce_plan(n_rows, dtypes, target.stride(0), ignore_index, True, False,
                        True) if mean_grad else None
    return block, reduce, count


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing.
_SAME_DEVICE = runtime.device_guard(torch.empty(0))


def _linear_forward_planned(ctx, x, weight, target, bias, ready):
    """The eager autograd forward of a kept one-chunk signature, for a mean or a sum (the
    public function's ``RECORD`` path): :func:`linear_cross_entropy_forward` and
    :func:`_linear_setup_context` with the kernels' plans kept. ``ready``: ``(ignore_index,
    label_smoothing, reduction, the plans)``. Its outputs are the loss and the gradients that
    are needed (None for ``lse``, not needed after, and for a gradient not wanted)."""
    ignore_index, smoothing, reduction, plans = ready
    need = (x.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
    outputs = one_chunk_forward(x, weight, target, bias, ignore_index, reduction, smoothing,
                                need, plans)
    # As _linear_setup_context for an eager mean or sum: the gradients stay differentiable.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(*outputs[2:])
    ctx.applied = [None, None, None]  # see applied_scale
    return outputs


def _linear_backward_planned(ctx, grad_loss, _grad_lse, *grads_of_grads):
    """:func:`_linear_backward_autograd` after :func:`_linear_forward_planned`: the gradients
    made for what autograd needs (the inputs' requires_grad when recorded), scaled."""
    refuse_double_backward("linear_cross_entropy", *grads_of_grads)
    if grad_loss is None:
        return None, None, None, None, None
    needs = ctx.needs_input_grad
    grad_x, grad_w, grad_b = _linear_scaled_grads(ctx, grad_loss, (needs[0], needs[1], needs[3]))
    return grad_x, grad_w, None, grad_b, None


linear_cross_entropy_forward.register_planned_forward(_linear_forward_planned,
                                                      _linear_backward_planned)
