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


def _find_forward_plan(n_rows, n_cols, eps, dtypes, has_weight, has_bias) -> LaunchPlan:
    """:func:`.plans.forward_launch` under the current :data:`TUNING`: one dict lookup for a shape seen
    before."""
    return _FORWARD_PLANS.found(
        TUNING, (n_rows, n_cols, eps, dtypes, has_weight, has_bias),
        lambda: forward_launch(n_rows, n_cols, eps, dtypes, has_weight, has_bias, TUNING))


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
    ctx.norm_ndim = norm_ndim
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.backward_plan = None  # always set: the backward reads it without getattr's default
    n_rows, n_cols = rows_cols(x, norm_ndim)
    if getattr(ctx, "eager", False) and n_rows and n_cols and x.is_contiguous() and (
            weight is None or weight.is_contiguous()):
        ctx.backward_plan = _planned_backward(x, weight, ctx.bias_dtype, n_rows, n_cols,
                                              tuple(ctx.needs_input_grad[:3]), norm_ndim)


def _planned_backward(x, weight, bias_dtype, n_rows, n_cols, need, norm_ndim):
    """The backward for the usual case of a contiguous gradient of x's dtype (x and the weight
    contiguous), worked out on the calling thread: the backward then only allocates and
    launches (:func:`_layer_norm_backward_planned`). A tuple of

    * the launches, in order, as ``(plan, operands)``: 0 ``"fused"``/``"dx_rows"``, 1 ``"dx"``,
      2 ``"dwdb"``, 3 ``"sum"`` (the operands of :func:`_backward_launches`);
    * the partial sums' elements (0: no dweight, no dbias);
    * the gradients' shape, the normalised one (an int for one dim: cheaper to pass);
    * where dbias (or its placeholder) comes from: 0 like the weight, 1 like ``mean`` (the
      arithmetic type), else allocated in its dtype, which follows;
    * ``need_dx``, ``need_dw``, ``need_db``.

    Kept by its arguments (one lookup: the general eager path, autocast's, works it out at
    every call)."""
    dw_dtype, db_dtype = _grad_dtypes(x, weight, bias_dtype)
    w_dtype = weight.dtype if weight is not None else None
    # The normalised shape stands for n_cols too (its product).
    grad_shape = n_cols if norm_ndim == 1 else tuple(x.shape[x.dim() - norm_ndim:])
    return _PLANNED_BACKWARDS.found(
        TUNING, (n_rows, grad_shape, x.dtype, w_dtype, dw_dtype, db_dtype, need, x.device),
        lambda: _plan_backward(n_rows, n_cols, grad_shape, x.dtype, w_dtype, dw_dtype,
                               db_dtype, need, x.device))


def _plan_backward(n_rows, n_cols, grad_shape, dtype, w_dtype, dw_dtype, db_dtype, need,
                   device):
    """:func:`_planned_backward`'s tuple (``w_dtype``: None without a weight)."""
    n_partials, launches = _find_backward_plan(
        n_rows, n_cols, dtype, dtype, w_dtype if w_dtype is not None else dtype, dw_dtype,
        db_dtype, w_dtype is not None, need, device)
    operands = {"fused": 0, "dx_rows": 0, "dx": 1, "dwdb": 2, "sum": 3}
    need_dx, need_dw, need_db = need
    db_like = 0 if db_dtype == w_dtype else 1 if db_dtype == stats_dtype(dtype) else 2
    return (tuple([(launch, operands[name]) for name, launch in launches.items()]),
            (need_dw + need_db) * n_partials * n_cols, grad_shape, db_like, db_dtype,
            need_dx, need_dw, need_db)


#: :func:`_planned_backward`'s tuples by its arguments.
_PLANNED_BACKWARDS = SignatureCache()


def launch_planned_forward(plan, x, weight, bias, n_rows: int):
    """``(y, mean, rstd)`` of contiguous ``x`` (its rows the normalised ones) with a kept forward
    plan: the outputs allocated, the plan launched (the eager paths of :func:`layer_norm` and
    of layer_norm_linear)."""
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    mean = x.new_empty(n_rows, dtype=stats_dtype(x.dtype))
    rstd = mean.new_empty(n_rows)  # mean's dtype, without one to parse (cheaper)
    with runtime.device_guard(x):
        plan.launch_eager(x, weight if weight is not None else x,
                          bias if bias is not None else x, y, mean, rstd)
    return y, mean, rstd


def _layer_norm_forward_planned(ctx, x, weight, bias, ready, _eps):
    """The eager autograd forward of a kept signature (:func:`layer_norm`'s ``RECORD`` path):
    :func:`layer_norm_forward` and :func:`_layer_norm_setup_context` with the plans kept for
    it (the backward's by which inputs need a gradient, found at the first such call)."""
    norm_ndim, _, n_rows, plan, backward_plans = ready[:5]
    y, mean, rstd = launch_planned_forward(plan, x, weight, bias, n_rows)
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.norm_ndim = norm_ndim
    ctx.bias_dtype = bias_dtype = bias.dtype if bias is not None else None
    need = ctx.needs_input_grad  # the whole tuple as the key: no slice to build
    planned = backward_plans.get(need)
    if planned is None:
        planned = backward_plans[need] = _planned_backward(
            x, weight, bias_dtype, n_rows, x.numel() // n_rows, tuple(need[:3]), norm_ndim)
    ctx.backward_plan = planned
    return y, mean, rstd


def _layer_norm_backward_planned(planned, dy, x, weight, mean, rstd):
    """The eager backward with the plan worked out in the forward (:func:`_planned_backward`;
    contiguous ``dy`` of x's dtype and device): autograd's gradients from allocations and
    ``launch_eager`` launches only. On autograd's device thread an allocation costs
    microseconds, so fewer than :func:`_backward_launches` makes: none for what is not asked
    for, and each from a tensor of its dtype (no dtype to parse) in its final shape (no
    reshape)."""
    launches, n_partial, grad_shape, db_like, db_dtype, need_dx, need_dw, need_db = planned
    dx = torch.empty_like(x) if need_dx else x  # x: a placeholder of dx's dtype, never written
    if n_partial:
        partials = mean.new_empty(n_partial)  # mean: of the partial sums' dtype
        # A sum not asked for gets a placeholder of its dtype (as the registered op passes,
        # so the same compiled kernel), never written.
        if need_dw:  # dweight in the weight's dtype
            dw = weight.new_empty(grad_shape)
        else:
            dw = weight if weight is not None else mean
        if db_like == 0:
            db = weight.new_empty(grad_shape) if need_db else weight
        elif db_like == 1:
            db = mean.new_empty(grad_shape) if need_db else mean
        else:
            db = x.new_empty(grad_shape if need_db else 0, dtype=db_dtype)
    else:
        partials = dw = db = mean  # never read or written
    w = weight if weight is not None else x  # never read when HAS_WEIGHT is off
    for launch, operands in launches:
        if operands == 0:  # "fused", "dx_rows" (the sums not written)
            launch.launch_eager(dy, x, w, mean, rstd, dx, partials)
        elif operands == 3:  # "sum"
            launch.launch_eager(partials, partials, dw, db)
        elif operands == 1:  # "dx"
            launch.launch_eager(dy, x, w, mean, rstd, dx)
        else:  # "dwdb"
            launch.launch_eager(dy, x, mean, rstd, partials)
    return dx if need_dx else None, dw if need_dw else None, db if need_db else None, None, None


def _layer_norm_backward_autograd(ctx, dy, _dmean, _drstd):
    if dy is None:  # y did not reach the loss (grads are not materialised, see setup_context)
        return None, None, None, None, None
    x, weight, mean, rstd = ctx.saved_tensors
    planned = ctx.backward_plan
    if (planned is not None and dy.dtype is x.dtype and dy.is_contiguous()
            and dy.device == x.device and runtime.eager_backward()):
        # Autograd runs a CUDA backward on its device thread, already on x's device.
        return _layer_norm_backward_planned(planned, dy, x, weight, mean, rstd)
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx, dw, db = layer_norm_backward(
        dy, x, weight, mean, rstd, ctx.norm_ndim, need_dx, need_dw, need_db, ctx.bias_dtype
    )
    if ctx.norm_ndim > 1:  # the kernels return flat dweight/dbias (empty when not needed)
        norm_shape = x.shape[x.dim() - ctx.norm_ndim :]
        dw = dw.view(norm_shape) if need_dw else None
        db = db.view(norm_shape) if need_db else None
    return dx if need_dx else None, dw if need_dw else None, db if need_db else None, None, None


layer_norm_forward.register_autograd(
    _layer_norm_backward_autograd, setup_context=_layer_norm_setup_context
)
layer_norm_forward.register_planned_forward(_layer_norm_forward_planned)


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
        try:
            ready = _READY.under(TUNING).get(_ready_key(x, normalized_shape, weight, bias, eps))
        except UNKEYABLE:
            ready = None
        if ready is not None:
            if path == RECORD:
                return layer_norm_forward.record_planned(x, weight, bias, ready, eps)[0]
            _, _, n_rows, plan, _, stats, y_like_x = ready
            # x's strides are the contiguous ones (y_like_x): empty_like keeps them, without
            # the memory format to parse.
            y = (torch.empty_like(x) if y_like_x
                 else torch.empty_like(x, memory_format=torch.contiguous_format))
            # No autograd: the statistics are not kept, and the kernels only write them (never
            # read them back), so one buffer takes both: an allocation less.
            unkept = x.new_empty(n_rows, dtype=stats)
            with runtime.device_guard(x):
                plan.launch_eager(x, weight if weight is not None else x,
                                  bias if bias is not None else x, y, unkept, unkept)
            return y
    norm_ndim, checked_eps = _CALLS.checked(_call_key, _check_args, x, normalized_shape, weight,
                                            bias, eps)
    y, _, _ = layer_norm_forward(x, weight, bias, norm_ndim, checked_eps)
    n_rows, n_cols = rows_cols(x, norm_ndim)
    if path and n_rows and n_cols and x.is_contiguous() and all(
            t is None or t.is_contiguous() for t in (weight, bias)):
        plan = forward_plan(n_rows, n_cols, checked_eps, x, weight, bias)
        _READY.under(TUNING).remember(
            _ready_key(x, normalized_shape, weight, bias, eps),
            (norm_ndim, checked_eps, n_rows, plan, {}, stats_dtype(x.dtype),
             y.stride() == x.stride()))
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


#: Eager calls' :func:`_ready_key` -> ``(norm_ndim, eps, rows, the forward's plan, the
#: backward's by which inputs need a gradient, the statistics' dtype, whether x's strides are
#: the contiguous ones)`` for contiguous operands that were checked.
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
