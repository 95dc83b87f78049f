"""Cross-entropy over class logits, and a fused linear + cross-entropy for large vocabularies.

    cross_entropy(x, t)                = F.cross_entropy(x, t)
    linear_cross_entropy(h, W, t, b)   = F.cross_entropy(F.linear(h, W, b).float(), t)

with ``ignore_index``, the three reductions and label smoothing as torch defines them.
:func:`linear_cross_entropy` never holds the ``tokens x vocabulary`` logits: it takes the tokens
a chunk at a time (``chunk rows x V`` logits at most, :class:`CrossEntropyTuning`), and for a
mean or a sum computes the gradients of ``h``, ``W`` and ``b`` in the forward, while the chunk's
logits are at hand. Host code: the tuning, the cached launch plans, the registered ops, their
autograd and the two public functions. The kernels are in :mod:`.kernels`; why the memory goes
where it goes is in docs/kernels/cross_entropy.md.
"""

from __future__ import annotations

import numbers
import threading
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ... import runtime
from ...runtime import FLOAT_DTYPES, LaunchPlan, chunk_tile, plan_cache, register_op
from .._common import UNKEYABLE, SignatureCache, layout_key
from .kernels import cross_entropy_bwd_kernel, cross_entropy_fwd_kernel

__all__ = [
    "CrossEntropyTuning", "REDUCTIONS", "TUNING", "chunk_rows", "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_forward", "linear_cross_entropy", "linear_cross_entropy_backward",
    "linear_cross_entropy_forward",
]

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class CrossEntropyTuning:
    """The launch decisions of the cross-entropy family: part of every plan's key (tests replace
    :data:`TUNING` with ``dataclasses.replace`` to cut a vocabulary into many chunks and a batch
    of tokens into many chunks of logits)."""

    #: Elements of a row a loop step takes (a power of two): a row of any length is streamed,
    #: so only one chunk is held in registers. H100, 8192 x 128256 bf16: 2048 to 16384 within
    #: 4% of each other (forward ~2.85 TB/s, backward ~2.8 TB/s); 32768 is slower.
    chunk_cols: int = 4096
    #: linear_cross_entropy: the most bytes one chunk of logits may take (``rows x V`` in the
    #: input's dtype). The chunk's rows are the largest power of two that fits (at least 1):
    #: 1024 rows of a 128256-word vocabulary in bf16, big enough for full-speed products.
    logits_chunk_bytes: int = 256 * 1024 * 1024


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = CrossEntropyTuning()


# --------------------------------------------------------------------------------------------
# Launch plans: one program a row of logits.
# --------------------------------------------------------------------------------------------
def _stride0(t: torch.Tensor) -> int:
    """The row stride of a per-row tensor; 0 for a scalar, which every row then reads."""
    return t.stride(0) if t.dim() else 0


@plan_cache()
def _forward_plan(n_rows, n_cols, dtypes, x_strides, target_stride, scale_stride, ignore_index,
                  smoothing, compute_grad, tuning: CrossEntropyTuning) -> LaunchPlan:
    """The loss of each row (and, with ``compute_grad``, its gradient in place). Cached: the same
    few shapes come back every step. ``dtypes``: of the launch's tensors, part of the key because
    a plan keeps its compiled launch (the kernel is compiled per dtype)."""
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    return LaunchPlan(
        cross_entropy_fwd_kernel, (n_rows,),
        (n_cols, *x_strides, target_stride, scale_stride, ignore_index, smoothing),
        dict(SMOOTHING=smoothing > 0, COMPUTE_GRAD=compute_grad, UNIT_COLS=x_strides[1] == 1,
             BLOCK_N=tile.block_cols, num_warps=tile.num_warps))


@plan_cache()
def _backward_plan(n_rows, n_cols, dtypes, x_strides, target_stride, scale_stride, dx_row_stride,
                   ignore_index, smoothing, tuning: CrossEntropyTuning) -> LaunchPlan:
    """The scaled gradient of each row from its saved ``lse``."""
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    return LaunchPlan(
        cross_entropy_bwd_kernel, (n_rows,),
        (n_cols, *x_strides, target_stride, scale_stride, dx_row_stride, ignore_index, smoothing),
        dict(UNIT_COLS=x_strides[1] == 1, BLOCK_N=tile.block_cols, num_warps=tile.num_warps))


def _launch_forward(x, target, scale, loss_rows, lse, ignore_index, smoothing, compute_grad):
    """Per-row loss and lse of ``x`` (n_rows > 0); with ``compute_grad`` (``x`` contiguous) the
    rows of ``x`` become their gradients times ``scale`` (a scalar or one value a row)."""
    tensors = (x, target, scale, loss_rows, lse)
    plan = _forward_plan(x.shape[0], x.shape[1], tuple([t.dtype for t in tensors]), x.stride(),
                         target.stride(0), _stride0(scale), ignore_index, smoothing, compute_grad,
                         TUNING)
    with runtime.device_guard(x):
        plan.launch(*tensors)


def _launch_backward(x, target, lse, scale, dx, ignore_index, smoothing):
    """``dx = scale * dloss/dx`` (n_rows > 0, ``dx`` contiguous, possibly ``x`` itself)."""
    tensors = (x, target, lse, scale, dx)
    plan = _backward_plan(x.shape[0], x.shape[1], tuple([t.dtype for t in tensors]), x.stride(),
                          target.stride(0), _stride0(scale), dx.stride(0), ignore_index,
                          smoothing, TUNING)
    with runtime.device_guard(x):
        plan.launch(*tensors)


def _count_valid(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The targets that count (a device tensor: the mean's divisor, without a host sync)."""
    return (target != ignore_index).sum()


def _reduce(loss_rows: torch.Tensor, target, ignore_index: int, reduction: str,
            out_dtype: torch.dtype | None = None, count: torch.Tensor | None = None
            ) -> torch.Tensor:
    """torch's reductions of the per-row losses (ignored rows hold 0): a mean over no target is
    0 / 0 = NaN, as torch gives (``count``: a mean's count of targets when already counted).
    With ``out_dtype`` (cross_entropy), the loss in that dtype, and a mean's count kept for the
    backward of the call (:func:`_counted`)."""
    if reduction == "none":
        loss = loss_rows
    elif reduction == "sum":
        loss = loss_rows.sum()
    else:
        if count is None:
            count = _count_valid(target, ignore_index)
        loss = loss_rows.sum() / count
    if out_dtype is None:
        return loss
    if loss.dtype != out_dtype:
        loss = loss.to(out_dtype)
    if reduction == "mean" and runtime.launching_directly():  # eager, not traced
        _LAST_COUNT.kept = (loss, count)
    return loss


#: The count of targets of this thread's last mean, with the loss it divided: an eager
#: autograd forward's setup_context takes it for the backward (:func:`_counted`).
_LAST_COUNT = threading.local()


def _counted(loss: torch.Tensor):
    """The count of targets that ``loss`` (a mean just computed on this thread) was divided
    by, or None where it is not the last one kept."""
    kept = getattr(_LAST_COUNT, "kept", None)
    _LAST_COUNT.kept = None
    return kept[1] if kept is not None and kept[0] is loss else None


def _grad_scale(grad_loss: torch.Tensor, target, ignore_index: int, reduction: str):
    """What each row's gradient is multiplied by: the incoming gradient (one a row for "none"),
    divided by the count of targets for a mean."""
    scale = grad_loss.float()
    return scale / _count_valid(target, ignore_index) if reduction == "mean" else scale


# --------------------------------------------------------------------------------------------
# cross_entropy: registered ops and autograd.
# --------------------------------------------------------------------------------------------
def _cross_entropy_forward_fake(x, target, ignore_index, reduction, label_smoothing, out_dtype):
    n_rows = x.shape[0]
    return (x.new_empty((n_rows,) if reduction == "none" else (), dtype=out_dtype),
            x.new_empty(n_rows, dtype=torch.float32))


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, lse)`` of (N, C) logits ``x`` and (N,) targets (arguments already checked by
    :func:`cross_entropy`): ``loss`` reduced and in ``out_dtype``, ``lse`` the per-row
    logsumexp (fp32, 0 for ignored rows) that the backward reads."""
    n_rows = x.shape[0]
    loss_rows = x.new_empty(n_rows, dtype=torch.float32)
    lse = x.new_empty(n_rows, dtype=torch.float32)
    if n_rows:
        _launch_forward(x, target, lse, loss_rows, lse, ignore_index, label_smoothing,
                        compute_grad=False)  # ``lse`` stands in for the scale: never read
    return _reduce(loss_rows, target, ignore_index, reduction, out_dtype), lse


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
        scale = _grad_scale(grad_loss, target, ignore_index, reduction)
        _launch_backward(x, target, lse, scale, dx, ignore_index, label_smoothing)
    return dx


def _cross_entropy_setup_context(ctx, inputs, output):
    x, target, ignore_index, reduction, label_smoothing, _ = inputs
    _, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # lse's gradient is never used: no zeros built for it
    # The logits themselves, not their gradient: saving a tensor that exists costs no memory,
    # and the gradient is written once, in the backward (docs/kernels/cross_entropy.md).
    ctx.save_for_backward(x, target, lse)
    ctx.loss_args = (ignore_index, reduction, label_smoothing)
    n_rows, n_cols = x.shape
    if getattr(ctx, "eager", False) and n_rows and reduction != "none":
        # The backward's plan, found now on the calling thread (a mean or a sum: one scale for
        # every row, a 0-d tensor; dx contiguous): the backward then only allocates and launches.
        ctx.backward_plan = _backward_plan(
            n_rows, n_cols, (x.dtype, target.dtype, lse.dtype, torch.float32, x.dtype),
            x.stride(), target.stride(0), 0, n_cols, ignore_index, label_smoothing, TUNING)
        # A mean's count of targets, from the forward: not counted again in the backward.
        ctx.count = _counted(output[0]) if reduction == "mean" else None


def _cross_entropy_backward_planned(plan, grad_loss, x, target, lse, ignore_index, reduction,
                                    count=None):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    if count is not None:
        scale = grad_loss.float() / count
    else:
        scale = _grad_scale(grad_loss, target, ignore_index, reduction)
    plan.launch_eager(x, target, lse, scale, dx)
    return dx


def _cross_entropy_backward_autograd(ctx, grad_loss, _grad_lse):
    if grad_loss is None or not ctx.needs_input_grad[0]:
        return None, None, None, None, None, None
    x, target, lse = ctx.saved_tensors
    plan = getattr(ctx, "backward_plan", None)
    if plan is not None and runtime.eager_backward():
        # Autograd runs a CUDA backward on its device thread, already on x's device.
        dx = _cross_entropy_backward_planned(plan, grad_loss, x, target, lse,
                                             *ctx.loss_args[:2], getattr(ctx, "count", None))
    else:
        dx = cross_entropy_backward(grad_loss, x, target, lse, *ctx.loss_args)
    return dx, None, None, None, None, None


cross_entropy_forward.register_autograd(
    _cross_entropy_backward_autograd, setup_context=_cross_entropy_setup_context
)


# --------------------------------------------------------------------------------------------
# linear_cross_entropy: the chunk loop, registered ops and autograd.
# --------------------------------------------------------------------------------------------
def chunk_rows(n_vocab: int, itemsize: int, tuning: CrossEntropyTuning | None = None) -> int:
    """Tokens a chunk of linear_cross_entropy takes: the largest power of two whose logits
    (``rows x n_vocab`` of ``itemsize`` bytes) fit ``tuning.logits_chunk_bytes``, at least 1."""
    tuning = TUNING if tuning is None else tuning
    rows = tuning.logits_chunk_bytes // max(1, int(n_vocab) * itemsize)
    return 1 << (rows.bit_length() - 1) if rows > 1 else 1


def _new_grads(x, weight, bias, need):
    """Gradient buffers, or empty placeholders where not needed: ``grad_x`` is written chunk by
    chunk, ``grad_weight`` accumulated in its own dtype (as cuBLAS adds into it, one rounding a
    chunk; the first chunk's product is written, so it needs no zeros unless there are no
    tokens), ``grad_bias`` accumulated in fp32 (only V values)."""
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


def _linear_cross_entropy_chunks(x, weight, bias, target, ignore_index, smoothing, lse, scale,
                                 grads, loss_rows=None):
    """The chunk loop. With ``loss_rows`` (the forward): each chunk's loss and ``lse``, and its
    logits turned into scaled gradients in place when a gradient is wanted. Without (the backward
    of reduction="none"): each chunk's gradients from the saved ``lse``. Then, while the chunk's
    gradient is at hand, the three products of a linear layer's backward."""
    grad_x, grad_w, grad_b = grads
    need_x, need_w, need_b = grad_x.numel() > 0, grad_w.numel() > 0, grad_b.numel() > 0
    compute_grad = need_x or need_w or need_b
    n_rows = x.shape[0]
    step = chunk_rows(weight.shape[0], x.dtype.itemsize)
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        if end - start == n_rows:  # one chunk (the usual case for small batches): no slices
            x_chunk, target_chunk, lse_chunk, row_scale = x, target, lse, scale
            loss_chunk = loss_rows
        else:
            x_chunk, target_chunk, lse_chunk = x[start:end], target[start:end], lse[start:end]
            row_scale = scale[start:end] if scale.dim() else scale
            loss_chunk = loss_rows[start:end] if loss_rows is not None else None
        # The logits as the reference gets them (F.linear in the input's dtype); the kernels
        # read them as fp32, which is what the reference's .float() gives, exactly.
        logits = F.linear(x_chunk, weight, bias)
        if loss_rows is not None:
            _launch_forward(logits, target_chunk, row_scale, loss_chunk, lse_chunk,
                            ignore_index, smoothing, compute_grad)
        else:
            _launch_backward(logits, target_chunk, lse_chunk, row_scale, logits,
                             ignore_index, smoothing)
        if not compute_grad:
            continue
        # ``logits`` now holds d(loss)/d(logits) in the input's dtype: the gradient that the
        # reference's .float() hands back to F.linear.
        if need_x:
            torch.mm(logits, weight, out=grad_x[start:end])
        if need_w and start == 0:
            torch.mm(logits.t(), x_chunk, out=grad_w)
        elif need_w:
            grad_w.addmm_(logits.t(), x_chunk)
        if need_b:
            grad_b.add_(logits.sum(0, dtype=torch.float32))


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
    bias: Optional[torch.Tensor],
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
    grads = _new_grads(x, weight, bias, (need_x and in_forward, need_w and in_forward,
                                         need_b and in_forward and bias is not None))
    count = _count_valid(target, ignore_index) if reduction == "mean" else None
    if any(g.numel() for g in grads):
        scale = loss_rows.new_ones(())
        if count is not None:
            scale = scale / count
    else:  # no gradient computed: the kernel reads no scale (lse stands in for it)
        scale = lse
    _linear_cross_entropy_chunks(x, weight, bias, target, ignore_index, label_smoothing, lse,
                                 scale, grads, loss_rows=loss_rows)
    return (_reduce(loss_rows, target, ignore_index, reduction, count=count), lse,
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
    bias: Optional[torch.Tensor],
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
    grads = _new_grads(x, weight, bias, (need_x, need_w, need_b and bias is not None))
    _linear_cross_entropy_chunks(x, weight, bias, target, ignore_index, label_smoothing, lse,
                                 grad_loss.float(), grads)
    return _finish_grads(grads, x, bias)


def _linear_setup_context(ctx, inputs, output):
    x, weight, target, bias, ignore_index, reduction, label_smoothing, *need = inputs
    _, lse, grad_x, grad_w, grad_b = output
    ctx.mark_non_differentiable(lse, grad_x, grad_w, grad_b)
    ctx.set_materialize_grads(False)
    ctx.reduction, ctx.need = reduction, tuple(need)
    if reduction == "none":
        ctx.save_for_backward(x, weight, target, bias, lse)
        ctx.loss_args = (ignore_index, label_smoothing)
    else:  # the gradients are already computed: keep them, not the inputs
        ctx.save_for_backward(grad_x, grad_w, grad_b)


def _linear_backward_autograd(ctx, grad_loss, *_unused):
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
        # Computed for a unit gradient of the loss; the incoming one is a scalar. Out of place:
        # the saved gradients stay as they are for a second backward (retain_graph).
        grad_x, grad_w, grad_b = (g * grad_loss if n else None
                                  for g, n in zip(ctx.saved_tensors, (need_x, need_w, need_b)))
    return (grad_x if need_x else None, grad_w if need_w else None, None,
            grad_b if need_b else None, None, None, None, None, None, None)


linear_cross_entropy_forward.register_autograd(
    _linear_backward_autograd, setup_context=_linear_setup_context
)


# --------------------------------------------------------------------------------------------
# Public functions.
# --------------------------------------------------------------------------------------------
def _check_dense_tensor(t, name: str, *, dtypes, ndim=None) -> None:
    """``runtime.check_tensor``, and a dense layout: kernels and products here read strided
    memory, so nested and sparse tensors are refused (before their rank is looked at)."""
    runtime.check_tensor(t, name, dtypes=dtypes)
    if t.is_nested or t.layout != torch.strided:
        kind = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise TypeError(f"{name} must be a dense (strided) tensor, got a {kind} tensor")
    if ndim is not None:
        runtime.check_tensor(t, name, ndim=ndim)


def _check_loss_args(target, ignore_index, reduction, label_smoothing) -> None:
    """The arguments the two losses share, besides the logits or their factors."""
    _check_dense_tensor(target, "target", dtypes=(torch.int64,))
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if not isinstance(reduction, str):
        raise TypeError(f"reduction must be a str, got {type(reduction).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real):
        raise TypeError(f"label_smoothing must be a float, got {type(label_smoothing).__name__}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


#: What F.cross_entropy's output is under autocast: on torch's fp32 lists (CPU and CUDA).
_AUTOCAST_LOSS = runtime.AutocastPolicy("fp32")


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``F.cross_entropy(input, target, ...)`` in Triton, for (N, C) logits (or one row of (C,))
    and int64 class targets (N,): ``ignore_index``, ``reduction`` "mean"/"sum"/"none" and
    ``label_smoothing`` as torch defines them. fp32/fp16/bf16 logits of any strides, fp32
    arithmetic, the loss in the logits' dtype (fp32 under autocast, as torch's); any number of
    classes (rows are streamed). Differentiable w.r.t. ``input``: the backward recomputes the
    softmax from a saved logsumexp a row. A target outside ``[0, C)`` other than
    ``ignore_index`` gives NaN (torch raises; checking would wait for the GPU). Traceable by
    ``torch.compile``."""
    path = cross_entropy_forward.eager_path(input, target)
    key = None
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            out_dtype = _AUTOCAST_LOSS.dtype_for("cuda" if input.is_cuda else "cpu") \
                or input.dtype
            key = (input.shape, input.stride(), input.dtype, input.device, input.layout,
                   target.shape, target.stride(), target.dtype, target.device, target.layout,
                   ignore_index, type(ignore_index), reduction, type(reduction), label_smoothing,
                   type(label_smoothing), out_dtype)
            ready = _READY.under(TUNING).get(key)
        except UNKEYABLE:
            ready = None
        if ready is not None:
            checked_ignore, smoothing, plan = ready
            if path == runtime.RECORD:
                return cross_entropy_forward.record(input, target, checked_ignore, reduction,
                                                    smoothing, out_dtype)[0]
            n_rows = input.shape[0]
            loss_rows = input.new_empty(n_rows, dtype=torch.float32)
            lse = input.new_empty(n_rows, dtype=torch.float32)
            with runtime.device_guard(input):  # lse stands in for the scale: never read
                plan.launch_eager(input, target, lse, loss_rows, lse)
            return _reduce(loss_rows, target, checked_ignore, reduction, out_dtype)
    checked_ignore, smoothing = _CALLS.checked(
        _loss_key, _check_cross_entropy, input, target, ignore_index, reduction, label_smoothing)
    device_type = "cuda" if input.is_cuda else "cpu"
    out_dtype = _AUTOCAST_LOSS.dtype_for(device_type) or input.dtype
    if input.dim() == 1:  # one row, as torch allows: a 0-d loss for every reduction
        loss, _ = cross_entropy_forward(input.unsqueeze(0), target.reshape(1), checked_ignore,
                                        reduction, smoothing, out_dtype)
        return loss.reshape(())
    loss = cross_entropy_forward(input, target, checked_ignore, reduction, smoothing,
                                 out_dtype)[0]
    if key is not None and input.shape[0]:
        # As cross_entropy_forward launches it: lse (a row stride of 1) stands in for the scale.
        plan = _forward_plan(input.shape[0], input.shape[1],
                             (input.dtype, target.dtype, torch.float32, torch.float32,
                              torch.float32), input.stride(), target.stride(0), 1,
                             checked_ignore, smoothing, False, TUNING)
        _READY.under(TUNING).remember(key, (checked_ignore, smoothing, plan))
    return loss


#: Eager calls' layouts, other arguments and loss dtype -> ``(ignore_index, label_smoothing,
#: the forward's plan)`` for (N, C) logits that were checked.
_READY = SignatureCache()


#: cross_entropy's checked call signatures -> ``(ignore_index, label_smoothing)`` as the op
#: takes them.
_CALLS = SignatureCache()


def _loss_key(*args):
    """Everything the checks of either loss read: its tensors' layouts (``None`` stays None),
    the other arguments with their types (an int and a bool are different keys)."""
    return tuple([layout_key(a) if a is None or isinstance(a, torch.Tensor) else (a, type(a))
                  for a in args])


def _check_cross_entropy(input, target, ignore_index, reduction, label_smoothing):
    _check_dense_tensor(input, "input", dtypes=FLOAT_DTYPES, ndim=(1, 2))
    _check_loss_args(target, ignore_index, reduction, label_smoothing)
    if target.dim() != input.dim() - 1 or target.shape[:1] != input.shape[:-1]:
        raise ValueError(
            f"target must have shape {tuple(input.shape[:-1])} (one class index a row of "
            f"input {tuple(input.shape)}), got {tuple(target.shape)}")
    if input.shape[-1] == 0:
        raise ValueError(f"input must have at least one class, got shape {tuple(input.shape)}")
    runtime.check_same_device(input=input, target=target)
    return int(ignore_index), float(label_smoothing)


def _check_linear_args(input, weight, bias) -> None:
    _check_dense_tensor(input, "input", dtypes=FLOAT_DTYPES)
    if input.dim() == 0:
        raise ValueError("input must have at least 1 dimension (..., in_features), got a scalar")
    _check_dense_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=2)
    runtime.check_same_dtype(input=input, weight=weight)
    if weight.shape[1] != input.shape[-1]:
        raise ValueError(
            f"input has in_features={input.shape[-1]} but weight has in_features="
            f"{weight.shape[1]} (weight is (vocabulary, in_features) = {tuple(weight.shape)})")
    if weight.shape[0] == 0:
        raise ValueError(f"weight must have at least one class (row), got {tuple(weight.shape)}")
    if bias is not None:
        _check_dense_tensor(bias, "bias", dtypes=FLOAT_DTYPES, ndim=1)
        runtime.check_same_dtype(input=input, bias=bias)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must have shape (vocabulary,) = ({weight.shape[0]},), got "
                             f"{tuple(bias.shape)}")
    runtime.check_same_device(input=input, weight=weight, bias=bias)


@runtime.follows_autocast(linear_cross_entropy_forward)
def linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(input, weight, bias).float(), target, ...)`` without the
    ``tokens x vocabulary`` logits: ``input`` (..., H) and ``target`` (...) are flattened to
    tokens, ``weight`` is (V, H), ``bias`` (V,) or None, all of one dtype (fp32/fp16/bf16; under
    autocast the product runs in the autocast dtype, as F.linear's). The tokens are taken
    ``chunk_rows(V, itemsize)`` at a time; for a mean or a sum the gradients of ``input``,
    ``weight`` and ``bias`` are computed in the forward, so the backward only scales them.
    Returns the fp32 loss (for "none" of ``target``'s shape). Traceable by ``torch.compile``."""
    ignore_index, label_smoothing = _LINEAR_CALLS.checked(
        _loss_key, _check_linear_cross_entropy, input, weight, target, bias, ignore_index,
        reduction, label_smoothing)
    grad = torch.is_grad_enabled()
    need = (grad and input.requires_grad, grad and weight.requires_grad,
            grad and bias is not None and bias.requires_grad)
    # Tokens as rows (already so for 2-d input and 1-d target: no reshape calls).
    rows = input if input.dim() == 2 else input.reshape(-1, input.shape[-1])
    loss, *_ = linear_cross_entropy_forward(
        rows, weight, target if target.dim() == 1 else target.reshape(-1), bias, ignore_index,
        reduction, label_smoothing, *need)
    return loss.view(target.shape) if reduction == "none" else loss


#: linear_cross_entropy's checked call signatures -> ``(ignore_index, label_smoothing)`` as
#: the op takes them.
_LINEAR_CALLS = SignatureCache()


def _check_linear_cross_entropy(input, weight, target, bias, ignore_index, reduction,
                                label_smoothing):
    _check_linear_args(input, weight, bias)
    _check_loss_args(target, ignore_index, reduction, label_smoothing)
    if tuple(target.shape) != tuple(input.shape[:-1]):
        raise ValueError(
            f"target must have shape {tuple(input.shape[:-1])} (one class index a row of input "
            f"{tuple(input.shape)}), got {tuple(target.shape)}")
    runtime.check_same_device(input=input, target=target)
    return int(ignore_index), float(label_smoothing)
