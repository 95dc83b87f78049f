"""Layer normalisation over the trailing dims, forward and a deterministic backward, in Triton.

    y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)

Host code: the registered ops, the autograd and :func:`layer_norm`, on the tuning and launch
plans of :mod:`.plans`. The kernels are in :mod:`.kernels`; why they are built as
they are (statistics in registers on shifted values, Chan's update for long rows, partial sums
instead of atomics) is in docs/kernels/layer_norm.md.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from ... import runtime
from ...runtime import (
    RECORD,
    LaunchPlan,
    register_op,
)
from .._common import (
    FLOAT_DTYPES_WITH_FP64,
    UNKEYABLE,
    SignatureCache,
    check_norm_param,
    check_normalized_shape,
    layout_key,
    rows_cols,
    shape_key,
    stats_dtype,
)
from .plans import LayerNormTuning, backward_plan, forward_launch


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = LayerNormTuning()


# --------------------------------------------------------------------------------------------
# Launch plans, registered ops, autograd.
# --------------------------------------------------------------------------------------------
def _layer_norm_forward_fake(x, weight, bias, norm_ndim, eps):
    n_rows, _ = rows_cols(x, norm_ndim)
    stats = stats_dtype(x.dtype)
    return (
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        x.new_empty(n_rows, dtype=stats),
        x.new_empty(n_rows, dtype=stats),
    )


# Autocast as F.layer_norm: on torch's CUDA fp32 list, on no CPU list (there: dtypes as without).
@register_op("layer_norm_forward", fake=_layer_norm_forward_fake, autocast={"cuda": "fp32"})
def layer_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    norm_ndim: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, mean, rstd)`` of layer norm over the last ``norm_ndim`` dims of ``x`` (arguments
    already checked by :func:`layer_norm`); ``mean`` and ``rstd`` have one value per row."""
    n_rows, n_cols = rows_cols(x, norm_ndim)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    stats = stats_dtype(x.dtype)
    mean = x.new_empty(n_rows, dtype=stats)
    rstd = x.new_empty(n_rows, dtype=stats)
    if n_rows == 0:
        return y, mean, rstd
    if n_cols == 0:  # statistics of nothing, as PyTorch: NaN
        return y, mean.fill_(math.nan), rstd.fill_(math.nan)
    x = x.contiguous()
    w = weight.contiguous() if weight is not None else x
    b = bias.contiguous() if bias is not None else x  # never read when HAS_BIAS is off
    plan = _find_forward_plan(n_rows, n_cols, eps, (x.dtype, w.dtype, b.dtype),
                              weight is not None, bias is not None)
    with runtime.device_guard(x):
        plan.launch(x, w, b, y, mean, rstd)
    return y, mean, rstd


def _find_forward_plan(n_rows, n_cols, eps, dtypes, has_weight, has_bias,
                       store_stats: bool = True) -> LaunchPlan:
    """:func:`.plans.forward_launch` under the current :data:`TUNING`: one dict lookup for a shape
    seen before (``store_stats`` off: the launch of a call that keeps no statistics)."""
    return _FORWARD_PLANS.found(
        TUNING, (n_rows, n_cols, eps, dtypes, has_weight, has_bias, store_stats),
        lambda: forward_launch(n_rows, n_cols, eps, dtypes, has_weight, has_bias, TUNING,
                               store_stats))


#: :func:`_find_forward_plan`'s plans by its arguments.
_FORWARD_PLANS = SignatureCache()


def _grad_dtypes(x, weight, bias_dtype) -> tuple[torch.dtype, torch.dtype]:
    """dtypes of ``dweight`` and ``dbias``: the parameters' own when known, else the stats'."""
    stats = stats_dtype(x.dtype)
    return (weight.dtype if weight is not None else stats,
            bias_dtype if bias_dtype is not None else stats)


def _layer_norm_backward_fake(dy, x, weight, mean, rstd, norm_ndim, need_dx, need_dw, need_db,
                              bias_dtype=None):
    _, n_cols = rows_cols(x, norm_ndim)
    dw_dtype, db_dtype = _grad_dtypes(x, weight, bias_dtype)
    return (
        torch.empty(x.shape if need_dx else (0,), dtype=x.dtype, device=x.device),
        x.new_empty(n_cols if need_dw else 0, dtype=dw_dtype),
        x.new_empty(n_cols if need_db else 0, dtype=db_dtype),
    )


@register_op("layer_norm_backward", fake=_layer_norm_backward_fake)
def layer_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    norm_ndim: int,
    need_dx: bool,
    need_dw: bool,
    need_db: bool,
    bias_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dweight, dbias)``; each one not asked for is an empty placeholder. ``dweight`` and
    ``dbias`` come flat (the caller reshapes), ``dweight`` in ``weight``'s dtype, ``dbias`` in
    ``bias_dtype`` (both in the arithmetic type, fp32 or fp64, when unknown)."""
    n_rows, n_cols = rows_cols(x, norm_ndim)
    dw_dtype, db_dtype = _grad_dtypes(x, weight, bias_dtype)
    if n_rows == 0 or n_cols == 0:  # a sum over no rows is 0
        dx = x.new_empty(x.shape if need_dx else (0,))
        dw = x.new_zeros(n_cols if need_dw else 0, dtype=dw_dtype)
        db = x.new_zeros(n_cols if need_db else 0, dtype=db_dtype)
        return dx, dw, db
    dy, x = dy.contiguous(), x.contiguous()
    w = weight.contiguous() if weight is not None else x  # never read when HAS_WEIGHT is off
    plan = _find_backward_plan(n_rows, n_cols, dy.dtype, x.dtype, w.dtype, dw_dtype, db_dtype,
                               weight is not None, (need_dx, need_dw, need_db), x.device)
    with runtime.device_guard(x):
        return _backward_launches(plan, dy, x, w, mean, rstd, n_cols, need_dx, need_dw, need_db,
                                  dw_dtype, db_dtype)


def _find_backward_plan(n_rows, n_cols, dy_dtype, x_dtype, w_dtype, dw_dtype, db_dtype,
                        has_weight, need, device):
    """:func:`.plans.backward_plan` under the current :data:`TUNING`: one dict lookup for a shape seen
    before (found on every eager forward that records)."""
    dtypes = (dy_dtype, x_dtype, w_dtype, dw_dtype, db_dtype)
    return _BACKWARD_PLANS.found(
        TUNING, (n_rows, n_cols, dtypes, has_weight, need, device),
        lambda: backward_plan(n_rows, n_cols, dtypes, has_weight, need, runtime.num_sms(device),
                               TUNING))


#: :func:`_find_backward_plan`'s plans by its arguments.
_BACKWARD_PLANS = SignatureCache()


def _backward_launches(plan, dy, x, w, mean, rstd, n_cols, need_dx, need_dw, need_db, dw_dtype,
                       db_dtype):
    """Allocate and launch the backward of a plan (n_rows > 0, n_cols > 0, contiguous dy, x)."""
    n_partials, launches = plan
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    # The partial sums, flat, in one buffer (an allocation less): n_partials x n_cols of partial
    # dweight (row g: the sum over row group g), then as many of partial dbias, for the sums
    # asked for. Sized by an int (cheaper on the host than a shape).
    partials = x.new_empty((need_dw + need_db) * n_partials * n_cols, dtype=stats_dtype(x.dtype))
    dw = x.new_empty(n_cols if need_dw else 0, dtype=dw_dtype)
    db = x.new_empty(n_cols if need_db else 0, dtype=db_dtype)
    for name, launch in launches.items():
        if name == "fused" or name == "dx_rows":  # "dx_rows": the sums not written
            launch.launch(dy, x, w, mean, rstd, dx, partials)
        elif name == "dx":
            launch.launch(dy, x, w, mean, rstd, dx)
        elif name == "dwdb":
            launch.launch(dy, x, mean, rstd, partials)
        else:  # "sum" (the dbias partials read after the dweight ones: DB_AFTER_DW)
            launch.launch(partials, partials, dw, db)
    return dx, dw, db


def _layer_norm_setup_context(ctx, inputs, output):
    x, weight, bias, norm_ndim, _ = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)  # saved statistics: no gradient flows through them
    # Their incoming gradients would otherwise be materialised as zero tensors (two fill kernels
    # a step) only to be ignored.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, weight, mean, rstd)
    needs = ctx.needs_input_grad
    n_rows, n_cols = rows_cols(x, norm_ndim)
    if getattr(ctx, "eager", False) and n_rows and n_cols and all(
            t is None or t.is_contiguous() for t in (x, weight, bias)):
        # As the kept forward (_layer_norm_forward_kept) fills ctx: the backward is the same.
        ctx.kept = _kept_backward(x, weight, bias, n_rows, n_cols, norm_ndim, needs)
        ctx.bias = bias
    else:  # the op's backward, whatever the gradient
        ctx.kept = (None, needs[0], needs[1], needs[2], norm_ndim,
                    bias.dtype if bias is not None else None)


def _kept_backward(x, weight, bias, n_rows, n_cols, norm_ndim, needs) -> tuple:
    """What the eager backward of contiguous ``x``, ``weight``, ``bias`` needs, worked out on
    the calling thread so that :func:`_layer_norm_backward_kept` only allocates and launches
    (autograd runs a CUDA backward on its device thread, where the same Python costs several
    times more). ``needs``: ``ctx.needs_input_grad`` (x, weight, bias first). A tuple of

    * the launches for a contiguous gradient: ``(rows ("fused" or "dx_rows": dx and the
      partial sums), "dx", "dwdb", "sum", the partial sums' elements)``, None where not
      launched (the partial sums' elements 0 without "sum");
    * ``need_dx``, ``need_dw``, ``need_db``;
    * ``norm_ndim`` and the bias's dtype (None: no bias), for the registered op's backward.

    Kept per signature: the general path (the first call, autocast's casts) asks at each call."""
    need_dx, need_dw, need_db = needs[0], needs[1], needs[2]
    key = (n_rows, n_cols, norm_ndim, x.dtype, weight.dtype if weight is not None else None,
           bias.dtype if bias is not None else None, need_dx, need_dw, need_db, x.device)
    return _KEPT_BACKWARDS.found(TUNING, key, lambda: _make_kept_backward(
        x, weight, bias.dtype if bias is not None else None, n_rows, n_cols, norm_ndim,
        (need_dx, need_dw, need_db)))


def _make_kept_backward(x, weight, bias_dtype, n_rows, n_cols, norm_ndim, need) -> tuple:
    """:func:`_kept_backward`'s tuple, made once."""
    dw_dtype, db_dtype = _grad_dtypes(x, weight, bias_dtype)
    n_partials, launches = _find_backward_plan(
        n_rows, n_cols, x.dtype, x.dtype, (weight if weight is not None else x).dtype, dw_dtype,
        db_dtype, weight is not None, need, x.device)
    need_dx, need_dw, need_db = need
    summed = launches.get("sum")
    return ((launches.get("fused") or launches.get("dx_rows"), launches.get("dx"),
             launches.get("dwdb"), summed,
             (need_dw + need_db) * n_partials * n_cols if summed is not None else 0),
            need_dx, need_dw, need_db, norm_ndim, bias_dtype)


#: :func:`_kept_backward`'s tuples by its arguments.
_KEPT_BACKWARDS = SignatureCache()


def launch_planned_forward(plan, x, weight, bias, n_rows: int):
    """``(y, mean, rstd)`` of contiguous ``x`` (its rows the normalised ones) with a kept forward
    plan (:func:`forward_plan`): the outputs allocated, the plan launched (layer_norm_linear's
    eager path)."""
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    mean = x.new_empty(n_rows, dtype=stats_dtype(x.dtype))
    rstd = mean.new_empty(n_rows)  # mean's dtype, without one to parse (cheaper)
    with runtime.device_guard(x):
        plan.launch_eager(x, weight if weight is not None else x,
                          bias if bias is not None else x, y, mean, rstd)
    return y, mean, rstd


def _layer_norm_forward_kept(ctx, x, weight, bias, ready):
    """The eager autograd forward of a kept signature (:func:`layer_norm`'s ``RECORD`` path):
    :func:`layer_norm_forward` and :func:`_layer_norm_setup_context` with the plans kept for it
    (the backward's by which inputs need a gradient, found at the first such call). Its one
    output is y: the statistics are saved, not returned (two outputs less for autograd to
    wrap, and no gradients of theirs for the backward to be given)."""
    plan, _, n_rows, stats, y_like_x, kept_by_needs, norm_ndim, n_cols = ready
    # x's strides are the contiguous ones (y_like_x): empty_like keeps them, without the memory
    # format to parse.
    y = (torch.empty_like(x) if y_like_x
         else torch.empty_like(x, memory_format=torch.contiguous_format))
    mean = x.new_empty(n_rows, dtype=stats)
    rstd = mean.new_empty(n_rows)  # mean's dtype, without one to parse (cheaper)
    guard = runtime.device_guard(x)
    if guard is _SAME_DEVICE:  # entering the no-op context costs two calls
        plan.launch_eager(x, weight if weight is not None else x,
                          bias if bias is not None else x, y, mean, rstd)
    else:
        with guard:
            plan.launch_eager(x, weight if weight is not None else x,
                              bias if bias is not None else x, y, mean, rstd)
    ctx.save_for_backward(x, weight, mean, rstd)
    needs = ctx.needs_input_grad  # the whole tuple as the key: no slice to build
    kept = kept_by_needs.get(needs)
    if kept is None:
        kept = kept_by_needs[needs] = _kept_backward(x, weight, bias, n_rows, n_cols, norm_ndim,
                                                     needs)
    ctx.kept = kept
    ctx.bias = bias  # dbias is allocated like it (and it stands in for dbias not asked for)
    return y


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing.
_SAME_DEVICE = runtime.device_guard(torch.empty(0))


def _layer_norm_backward_kept(ctx, dy):
    """``(dx, dweight, dbias, None)`` (None where not needed): the kept launches (ctx.kept, see
    :func:`_kept_backward`) for a contiguous ``dy`` in an eager backward, else the registered
    op. Autograd hands a backward the gradient of y's dtype and device (its engine casts one of
    another dtype and refuses another device first), and runs a CUDA backward on its device
    thread, already on x's device. Each gradient comes from one allocation in its final shape;
    one not asked for is None, and a kernel operand that stands in for it has its dtype (the
    same compiled kernel as the op's)."""
    launches, need_dx, need_dw, need_db, norm_ndim, bias_dtype = ctx.kept
    x, weight, mean, rstd = ctx.saved_tensors
    if launches is not None and dy.is_contiguous() and runtime.eager_backward():
        rows, dx_chunked, dwdb, summed, n_partial = launches
        dx = torch.empty_like(x) if need_dx else x  # x stands in for dx: never written
        w = weight if weight is not None else x  # never read when HAS_WEIGHT is off
        if summed is None:  # dx alone: mean stands in for the partial sums (never written)
            if rows is not None:
                rows.launch_eager(dy, x, w, mean, rstd, dx, mean)
            else:
                dx_chunked.launch_eager(dy, x, w, mean, rstd, dx)
            return dx, None, None, None
        # The partial sums, flat (of dweight, then of dbias), in mean's dtype.
        partials = mean.new_empty(n_partial)
        bias = ctx.bias
        dw = torch.empty_like(weight) if need_dw else weight if weight is not None else mean
        db = torch.empty_like(bias) if need_db else bias if bias is not None else mean
        if rows is not None:  # "dx_rows" (need_dx) does not write the partial sums
            rows.launch_eager(dy, x, w, mean, rstd, dx, partials)
        elif dx_chunked is not None:
            dx_chunked.launch_eager(dy, x, w, mean, rstd, dx)
        if dwdb is not None:
            dwdb.launch_eager(dy, x, mean, rstd, partials)
        summed.launch_eager(partials, partials, dw, db)
        return dx if need_dx else None, dw if need_dw else None, db if need_db else None, None
    dx, dw, db = layer_norm_backward(dy, x, weight, mean, rstd, norm_ndim, need_dx, need_dw,
                                     need_db, bias_dtype)
    if norm_ndim > 1:  # the kernels return flat dweight/dbias (empty when not needed)
        norm_shape = x.shape[x.dim() - norm_ndim:]
        dw = dw.view(norm_shape) if need_dw else None
        db = db.view(norm_shape) if need_db else None
    return dx if need_dx else None, dw if need_dw else None, db if need_db else None, None


def _layer_norm_backward_autograd(ctx, dy, _dmean, _drstd):
    if dy is None:  # y did not reach the loss (grads are not materialised, see setup_context)
        return None, None, None, None, None
    return (*_layer_norm_backward_kept(ctx, dy), None)  # no gradient for norm_ndim, eps


layer_norm_forward.register_autograd(
    _layer_norm_backward_autograd, setup_context=_layer_norm_setup_context
)
# The kept Function has a backward of its own: one output, so one gradient.
layer_norm_forward.register_planned_forward(_layer_norm_forward_kept, _layer_norm_backward_kept)


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
# Cast as autocast asks (x to fp32 under CUDA autocast, as F.layer_norm) before the kept path
# below, which takes arguments already cast: a bf16 x otherwise went the general path each call.
@runtime.follows_autocast(layer_norm_forward)
def layer_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``torch.nn.functional.layer_norm`` in Triton: fp16/bf16/fp32 inputs with fp32 statistics
    (fp64 computes in fp64), optional ``weight``/``bias`` of any float dtype, differentiable with
    a deterministic ``dweight``/``dbias``, and traceable by ``torch.compile``."""
    path = layer_norm_forward.eager_path(x, weight, bias)
    if path:  # an eager call of layouts seen before: straight to the launch
        try:  # _READY.under(TUNING) inline: kept under another tuning, nothing is found
            ready = _READY.get(_ready_key(x, normalized_shape, weight, bias, eps)
                               ) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            ready = None
        if ready is not None:
            if path == RECORD:
                return layer_norm_forward.record_planned(x, weight, bias, ready)
            # No autograd: no statistics kept, so the launch that writes none (y stands in for
            # them), and y the one allocation. ready: see _READY.
            y = (torch.empty_like(x) if ready[4]
                 else torch.empty_like(x, memory_format=torch.contiguous_format))
            guard = runtime.device_guard(x)
            if guard is _SAME_DEVICE:
                ready[1].launch_eager(x, weight if weight is not None else x,
                                      bias if bias is not None else x, y, y, y)
            else:
                with guard:
                    ready[1].launch_eager(x, weight if weight is not None else x,
                                          bias if bias is not None else x, y, y, y)
            return y
    norm_ndim, checked_eps = _CALLS.checked(_call_key, _check_args, x, normalized_shape, weight,
                                            bias, eps)
    y, _, _ = layer_norm_forward(x, weight, bias, norm_ndim, checked_eps)
    n_rows, n_cols = rows_cols(x, norm_ndim)
    if path and n_rows and n_cols and all(
            t is None or t.is_contiguous() for t in (x, weight, bias)):
        dtypes = (x.dtype, (weight if weight is not None else x).dtype,
                  (bias if bias is not None else x).dtype)
        plans = [_find_forward_plan(n_rows, n_cols, checked_eps, dtypes, weight is not None,
                                    bias is not None, store_stats) for store_stats in (True, False)]
        _READY.under(TUNING).remember(
            _ready_key(x, normalized_shape, weight, bias, eps),
            (*plans, n_rows, stats_dtype(x.dtype), y.stride() == x.stride(), {}, norm_ndim,
             n_cols))
    return y


def forward_plan(n_rows: int, n_cols: int, eps: float, x, weight, bias) -> LaunchPlan:
    """The forward's plan for checked, contiguous ``x`` (``n_rows`` x ``n_cols``, neither 0)
    and ``weight``, ``bias`` (or None), for a caller that keeps it (:func:`layer_norm`'s eager
    path, layer_norm_linear's). Launched as ``plan.launch_eager(x, weight or x, bias or x, y,
    mean, rstd)``, ``y`` like ``x``, ``mean`` and ``rstd`` one a row (:func:`stats_dtype`)."""
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    return _find_forward_plan(n_rows, n_cols, eps, (x.dtype, w.dtype, b.dtype),
                              weight is not None, bias is not None)


def _ready_key(x, normalized_shape, weight, bias, eps):
    """An eager call's layouts (all the checks read, and the strides) and other arguments.

    The usual call (both parameters, ``normalized_shape`` a tuple of one int, as nn.LayerNorm
    passes it) gets a flat tuple, the tuple itself standing for its :func:`shape_key` (equal
    to it): nested tuples and helper calls made the key cost ~0.7 µs more. Never equal to
    the other calls' keys (another length)."""
    if weight is not None and bias is not None:
        return (x.shape, x.stride(), x.dtype, x.device, x.layout,
                normalized_shape if type(normalized_shape) is tuple and len(normalized_shape) == 1
                and type(normalized_shape[0]) is int else shape_key(normalized_shape),
                weight.shape, weight.stride(), weight.dtype, weight.device, weight.layout,
                bias.shape, bias.stride(), bias.dtype, bias.device, bias.layout, eps, type(eps))
    return (x.shape, x.stride(), x.dtype, x.device, x.layout, shape_key(normalized_shape),
            (weight.stride(), *layout_key(weight)) if weight is not None else None,
            (bias.stride(), *layout_key(bias)) if bias is not None else None, eps, type(eps))


#: Eager calls' :func:`_ready_key` -> ``(the forward's plan, the one that writes no statistics,
#: rows, the statistics' dtype, whether empty_like(x) is laid out as y (x's strides are the
#: contiguous ones), {ctx.needs_input_grad: the backward's kept launches (_kept_backward)},
#: norm_ndim, columns)`` for contiguous operands that were checked.
_READY = SignatureCache()


#: layer_norm's checked call signatures -> ``(norm_ndim, eps)`` as the op takes them.
_CALLS = SignatureCache()


def _call_key(x, normalized_shape, weight, bias, eps):
    """Everything the checks read."""
    return (layout_key(x), shape_key(normalized_shape), layout_key(weight), layout_key(bias),
            eps, type(eps))


def _check_args(x, normalized_shape, weight, bias, eps) -> tuple[int, float]:
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES_WITH_FP64)
    shape = check_normalized_shape(normalized_shape, x)
    check_norm_param(weight, "weight", shape)
    check_norm_param(bias, "bias", shape)
    runtime.check_same_device(x=x, weight=weight, bias=bias)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return len(shape), float(eps)
