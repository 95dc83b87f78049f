"""Cross-entropy over class logits, and a fused linear + cross-entropy for large vocabularies.

    cross_entropy(x, t)                = F.cross_entropy(x, t)
    linear_cross_entropy(h, W, t, b)   = F.cross_entropy(F.linear(h, W, b).float(), t)

with ``ignore_index``, the three reductions and label smoothing as torch defines them.
:func:`cross_entropy` reads the logits once; where autograd records an eager call it also writes
their gradient in the same kernel, so that the backward only scales it. :func:`linear_cross_entropy`
never holds the ``tokens x vocabulary`` logits: it takes the tokens a chunk at a time, whole rows
or (for a large vocabulary) each chunk in a few blocks of the vocabulary, within a budget of
bytes (:func:`chunk_plan`, :class:`CrossEntropyTuning`), and for a mean or a sum computes the
gradients of ``h``, ``W`` and ``b`` in the forward, while each block's logits are at hand.

This module holds the two public functions, their argument checks kept per call signature and
the eager fast path. The family's other modules: :mod:`.tuning` (:data:`TUNING`), :mod:`.plans`
(launch plans, launchers, reductions, shared autograd pieces), :mod:`.loss` (cross_entropy's
registered ops and autograd), :mod:`.linear` (linear_cross_entropy's), :mod:`.checks` and
:mod:`.kernels`. Why the memory goes where it goes is in docs/kernels/cross_entropy.md.
"""

from __future__ import annotations


import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES
from .._common import UNKEYABLE, SignatureCache, join_family, layout_key
from . import checks, linear, loss, plans, tuning
from .checks import check_dense_tensor, check_linear_args, check_loss_args, loss_key
from .kernels import cross_entropy_bwd_kernel, cross_entropy_fwd_kernel  # noqa: F401
from .linear import (
    ChunkPlan,
    chunk_plan,
    chunk_rows,
    estimated_peak_bytes,
    linear_cross_entropy_backward,
    linear_cross_entropy_forward,
)
from .loss import (
    cross_entropy_backward,
    cross_entropy_forward,
    cross_entropy_scale_grad,
)
from .plans import forward_plan, reduce_losses, reduce_plan  # noqa: F401
from .tuning import REDUCTIONS, TUNING, CrossEntropyTuning

__all__ = [
    "REDUCTIONS",
    "TUNING",
    "ChunkPlan",
    "CrossEntropyTuning",
    "chunk_plan",
    "chunk_rows",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "cross_entropy_scale_grad",
    "estimated_peak_bytes",
    "linear_cross_entropy",
    "linear_cross_entropy_backward",
    "linear_cross_entropy_forward",
]


#: What F.cross_entropy's output is under autocast: on torch's fp32 lists (CPU and CUDA).
_AUTOCAST_LOSS = runtime.AutocastPolicy("fp32")


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(input, target, ...)`` in Triton, for (N, C) logits (or one row of (C,))
    and int64 class targets (N,): ``ignore_index``, ``reduction`` "mean"/"sum"/"none" and
    ``label_smoothing`` as torch defines them. fp32/fp16/bf16 logits of any strides, fp32
    arithmetic, the loss in the logits' dtype (fp32 under autocast, as torch's); any number of
    classes (rows are streamed). Differentiable w.r.t. ``input``: called eagerly with fp32 or
    bf16 logits that require grad, the forward also writes the gradient (a new tensor; the
    logits are only read) and the backward scales it in place, skipping the pass when the
    incoming gradient is 1; otherwise (fp16, ``torch.compile``) the backward recomputes the
    softmax from a saved logsumexp a row. A target outside ``[0, C)`` other than
    ``ignore_index`` gives NaN (torch raises; checking would wait for the GPU). Traceable by
    ``torch.compile``.

    ``dtype`` (an addition to torch's arguments): the loss's dtype, by default the logits' (fp32
    under autocast, as torch's). ``dtype=torch.float32`` on bf16 logits gives
    ``F.cross_entropy(input.float(), ...)`` exactly (what transformers' causal-LM loss
    computes) without the fp32 copy of the logits."""
    path = cross_entropy_forward.eager_path(input, target)
    key = None
    if path and dtype is None:  # an eager call of layouts seen before: straight to the launch
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
            plan, reduce, record = ready
            if path == runtime.RECORD:
                return cross_entropy_forward.record_planned(input, target, record)[0]
            # The loss rows stand in for the tensors the plan neither reads nor writes.
            if reduce is None:  # "none": the rows' losses, stored in the loss's dtype
                loss = input.new_empty(input.shape[0], dtype=out_dtype)
                with runtime.device_guard(input):
                    plan.launch_eager(input, target, loss, loss, loss, loss)
                return loss
            loss_rows = input.new_empty(input.shape[0], dtype=torch.float32)
            loss = input.new_empty((), dtype=out_dtype)
            with runtime.device_guard(input):
                plan.launch_eager(input, target, loss_rows, loss_rows, loss_rows, loss_rows)
                reduce.launch_eager(loss_rows, target, loss, loss)
            return loss
    checked_ignore, smoothing = _CALLS.checked(
        loss_key, _check_cross_entropy, input, target, ignore_index, reduction, label_smoothing)
    runtime.check_float_dtype(dtype)
    device_type = "cuda" if input.is_cuda else "cpu"
    out_dtype = dtype or _AUTOCAST_LOSS.dtype_for(device_type) or input.dtype
    # The gradient in the forward only where the eager backward can scale it in place
    # (autograd recording an eager call; see :mod:`.loss`).
    compute_grad = path == runtime.RECORD and _grad_in_forward(input)
    if input.dim() == 1:  # one row, as torch allows: a 0-d loss for every reduction
        loss = cross_entropy_forward(input.unsqueeze(0), target.reshape(1), checked_ignore,
                                     reduction, smoothing, out_dtype, compute_grad)[0]
        return loss.reshape(())
    loss = cross_entropy_forward(input, target, checked_ignore, reduction, smoothing,
                                 out_dtype, compute_grad)[0]
    if key is not None and input.shape[0]:
        _READY.under(TUNING).remember(key, _ready_plans(input, target, checked_ignore, smoothing,
                                                        reduction, out_dtype))
    return loss


def _ready_plans(input, target, ignore_index, smoothing, reduction, out_dtype):
    """What :data:`_READY` keeps for a checked signature of (N, C) logits: the forward's plan
    without autograd (loss rows in ``out_dtype`` for "none", else fp32 rows that one more kernel
    reduces; no logsumexp stored), that reduction's plan (None for "none"), and what the eager
    autograd forward takes."""
    n_rows, n_cols = input.shape
    rows_dtype = out_dtype if reduction == "none" else torch.float32
    plan = forward_plan(n_rows, n_cols, (input.dtype, target.dtype) + (rows_dtype,) * 4,
                        input.stride(), target.stride(0), 0, ignore_index, smoothing, False,
                        False, False, TUNING)
    reduce = None if reduction == "none" else reduce_plan(
        n_rows, (torch.float32, target.dtype, out_dtype, out_dtype), target.stride(0),
        ignore_index, reduction == "mean", False)
    return plan, reduce, (ignore_index, smoothing, reduction, out_dtype,
                          _grad_in_forward(input), [])


def _grad_in_forward(input: torch.Tensor) -> bool:
    """For a call that autograd records eagerly: whether the forward makes the gradient (see
    :mod:`.loss` for when that is better and why not for fp16 logits)."""
    return TUNING.grad_in_forward and input.dtype is not torch.float16


#: Eager calls' layouts, other arguments and loss dtype -> ``(the forward's plan without a
#: gradient, the reduction's plan, what the eager autograd forward takes in place of the op's
#: arguments: (ignore_index, label_smoothing, reduction, out_dtype, compute_grad, [its plans,
#: found at the first call that records]))`` for (N, C) logits that were checked
#: (:func:`_ready_plans`).
_READY = SignatureCache()


#: cross_entropy's checked call signatures -> ``(ignore_index, label_smoothing)`` as the op
#: takes them.
_CALLS = SignatureCache()




def _check_cross_entropy(input, target, ignore_index, reduction, label_smoothing):
    check_dense_tensor(input, "input", dtypes=FLOAT_DTYPES, ndim=(1, 2))
    check_loss_args(target, ignore_index, reduction, label_smoothing)
    if target.dim() != input.dim() - 1 or target.shape[:1] != input.shape[:-1]:
        raise ValueError(
            f"target must have shape {tuple(input.shape[:-1])} (one class index a row of "
            f"input {tuple(input.shape)}), got {tuple(target.shape)}")
    if input.shape[-1] == 0:
        raise ValueError(f"input must have at least one class, got shape {tuple(input.shape)}")
    runtime.check_same_device(input=input, target=target)
    return int(ignore_index), float(label_smoothing)




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
    autocast the product runs in the autocast dtype, as F.linear's). The logits are made a
    chunk at a time, as ``chunk_plan(tokens, V, itemsize)`` cuts them (tokens, and for a large
    vocabulary blocks of it); for a mean or a sum the gradients of ``input``, ``weight`` and
    ``bias`` are computed in the forward, so the backward only scales them.
    Returns the fp32 loss (for "none" of ``target``'s shape). Traceable by ``torch.compile``."""
    path = linear_cross_entropy_forward.eager_path(input, weight, target, bias)
    key = ready = None
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            key = (input.shape, input.stride(), input.dtype, input.device, input.layout,
                   weight.shape, weight.stride(), weight.dtype, weight.device, weight.layout,
                   target.shape, target.stride(), target.dtype, target.device, target.layout,
                   None if bias is None else (bias.shape, bias.stride(), *layout_key(bias)[1:]),
                   ignore_index, type(ignore_index), reduction, type(reduction), label_smoothing,
                   type(label_smoothing))
            ready = _LINEAR_READY.under(TUNING).get(key)
        except UNKEYABLE:
            key = None
    if ready and (path == runtime.PLAIN or reduction != "none"):
        rows = input if input.dim() == 2 else input.reshape(-1, input.shape[-1])
        tokens = target if target.dim() == 1 else target.reshape(-1)
        if path == runtime.RECORD:
            loss = linear_cross_entropy_forward.record_planned(rows, weight, tokens, bias,
                                                               ready)[0]
        else:
            loss = linear.one_chunk_forward(rows, weight, tokens, bias, ready[0], reduction,
                                            ready[1], None, ready[3])
        return loss.view(target.shape) if reduction == "none" else loss
    ignore_index_, label_smoothing_ = _LINEAR_CALLS.checked(
        loss_key, _check_linear_cross_entropy, input, weight, target, bias, ignore_index,
        reduction, label_smoothing)
    grad = torch.is_grad_enabled()
    need = (grad and input.requires_grad, grad and weight.requires_grad,
            grad and bias is not None and bias.requires_grad)
    # Tokens as rows (already so for 2-d input and 1-d target: no reshape calls).
    rows = input if input.dim() == 2 else input.reshape(-1, input.shape[-1])
    loss, *_ = linear_cross_entropy_forward(
        rows, weight, target if target.dim() == 1 else target.reshape(-1), bias, ignore_index_,
        reduction, label_smoothing_, *need)
    if key is not None and ready is None:  # checked: kept where the tokens fit one chunk
        _LINEAR_READY.remember(key, rows.shape[0] > 0 and linear.one_chunk(
            rows.shape[0], weight.shape[0], rows.dtype.itemsize) and (
                ignore_index_, label_smoothing_, reduction, {}))
    return loss.view(target.shape) if reduction == "none" else loss


#: linear_cross_entropy's eager calls' layouts and other arguments -> ``(ignore_index,
#: label_smoothing, reduction, the block kernel's plans by whether it makes the gradient)``
#: where the tokens fit one chunk of whole rows (:func:`.linear.one_chunk`), else False.
_LINEAR_READY = SignatureCache()


#: linear_cross_entropy's checked call signatures -> ``(ignore_index, label_smoothing)`` as
#: the op takes them.
_LINEAR_CALLS = SignatureCache()


def _check_linear_cross_entropy(input, weight, target, bias, ignore_index, reduction,
                                label_smoothing):
    check_linear_args(input, weight, bias)
    check_loss_args(target, ignore_index, reduction, label_smoothing)
    if tuple(target.shape) != tuple(input.shape[:-1]):
        raise ValueError(
            f"target must have shape {tuple(input.shape[:-1])} (one class index a row of input "
            f"{tuple(input.shape)}), got {tuple(target.shape)}")
    runtime.check_same_device(input=input, target=target)
    return int(ignore_index), float(label_smoothing)


#: The family's modules: a name set on the package (``TUNING``, a test's monkeypatch) is set in
#: each of them that holds it, so that it takes effect at the next call wherever it is read.
join_family(__name__, (tuning, plans, loss, linear, checks))
