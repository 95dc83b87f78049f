"""RMS normalisation over the trailing dims, alone or after a fused residual add, forward and a
deterministic backward, in Triton.

    y = x * rstd * (weight_offset + weight),   rstd = 1 / sqrt(mean(x**2) + eps)

Host code: the tuning (:class:`RMSNormTuning`), the cached launch plans (the backward's are
worked out in :mod:`.plans`), the registered ops, the autograd, and the public functions
:func:`rms_norm` and :func:`add_rms_norm`. The kernels are in :mod:`.kernels`; why they are
built as they are is in docs/kernels/rms_norm.md.

``casting_mode`` says where the result is rounded, so that a patched model keeps its own module's
numbers:

* ``"torch"`` (default): ``torch.nn.functional.rms_norm``: everything in fp32 (fp64 for fp64),
  one rounding to ``x``'s dtype;
* ``"llama"``: transformers' LlamaRMSNorm: ``x * rstd`` rounded to ``x``'s dtype, then times the
  weight (``weight_offset + weight`` in the weight's dtype); the output has the promoted dtype of
  ``x`` and the weight, as ``weight * hidden_states.to(input_dtype)`` has;
* ``"gemma"``: transformers' GemmaRMSNorm: everything in fp32, ``(weight_offset + weight)`` too,
  one rounding to ``x``'s dtype. (For fp16/bf16/fp32 the same arithmetic as ``"torch"``; fp64
  rows compute in fp64 here where GemmaRMSNorm's ``x.float()`` would drop to fp32.)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import torch

from ... import runtime
from ...runtime import (
    LaunchPlan,
    acc_dtype,
    chunk_tile,
    plan_cache,
    register_op,
    row_tile,
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
from ..layer_norm import LayerNormTuning
from .kernels import rms_norm_fwd_chunked_kernel, rms_norm_fwd_kernel
from .plans import BackwardPlan
from .plans import backward_plan as _backward_plan

CASTING_MODES = ("torch", "llama", "gemma")


@dataclass(frozen=True)
class RMSNormTuning(LayerNormTuning):
    """The launch decisions of rms_norm: part of every plan's key (tests replace :data:`TUNING`
    with ``dataclasses.replace`` to reach the chunked paths on short rows). The fields are layer
    norm's (:class:`LayerNormTuning`; H100 measurements in docs/kernels/layer_norm.md): an RMSNorm
    program holds its tiles less the bias terms (``dwdb_stages`` is the column-tiled dweight
    kernel's), so it fits wherever layer norm's does. Overridden: fused backward rows up to 16384
    (not 8192: past it the column-tiled sums read x and dy again; H100, rows of 16384: 55% of
    copy so, 71-78% fused); fused rows past the held width re-read the weight each step rather
    than hold it beside the running sums (fewer spills)."""
    backward_single_block_max_cols: int = 16384
    backward_weight_held_max_cols: int = 8192


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = RMSNormTuning()


# --------------------------------------------------------------------------------------------
# Launch plans, registered ops, autograd.
# --------------------------------------------------------------------------------------------
def _out_dtype(x: torch.Tensor, weight: torch.Tensor | None, casting_mode: str,
               out_dtype: torch.dtype | None) -> torch.dtype:
    """y's dtype: ``out_dtype`` when given (autocast), else ``x``'s, or under llama casting the
    promotion of ``x``'s and the weight's (``weight * hidden_states.to(input_dtype)``)."""
    if out_dtype is not None:
        return out_dtype
    if casting_mode == "llama" and weight is not None:
        return torch.promote_types(x.dtype, weight.dtype)
    return x.dtype


def _rms_norm_forward_fake(x, residual, weight, norm_ndim, eps, weight_offset, casting_mode,
                           out_dtype=None):
    n_rows, _ = rows_cols(x, norm_ndim)
    return (
        x.new_empty(x.shape, dtype=_out_dtype(x, weight, casting_mode, out_dtype)),
        x.new_empty(x.shape if residual is not None else (0,)),
        x.new_empty(n_rows, dtype=stats_dtype(x.dtype)),
    )


# Autocast is applied by the public functions (see _autocast_out_dtype), not by a cast of the
# inputs: computing in fp32 from fp16 inputs read as they are is what torch's cast-then-compute
# gives, without the copies.
@register_op("rms_norm_forward", fake=_rms_norm_forward_fake)
def rms_norm_forward(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    norm_ndim: int,
    eps: float,
    weight_offset: float,
    casting_mode: str,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, x + residual, rstd)`` of RMS norm over the last ``norm_ndim`` dims of ``x`` (or of
    ``x + residual``; without a residual the sum is an empty placeholder), arguments already
    checked by :func:`rms_norm` / :func:`add_rms_norm`; ``rstd`` has one value per row."""
    n_rows, n_cols = rows_cols(x, norm_ndim)
    # Allocated like a contiguous x (a shape argument costs more host time than a template);
    # a 1-d size as an int, for the same reason.
    x = x.contiguous()
    y = torch.empty_like(x, dtype=_out_dtype(x, weight, casting_mode, out_dtype),
                         memory_format=torch.contiguous_format)
    total = (torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None
             else x.new_empty(0))
    rstd = x.new_empty(n_rows, dtype=stats_dtype(x.dtype))
    if n_rows == 0:
        return y, total, rstd
    if n_cols == 0:  # the mean of no squares, as PyTorch: NaN
        return y, total, rstd.fill_(math.nan)
    r = residual.contiguous() if residual is not None else x  # never read without a residual
    w = weight.contiguous() if weight is not None else x  # never read without a weight
    plan = _find_forward_plan(n_rows, n_cols, eps, weight_offset, (x.dtype, w.dtype, y.dtype),
                              residual is not None, weight is not None, casting_mode == "llama")
    with runtime.device_guard(x):
        plan.launch(x, r, w, y, total if residual is not None else y, rstd)
    return y, total, rstd


def _find_forward_plan(n_rows, n_cols, eps, weight_offset, dtypes, has_residual, has_weight,
                       round_xhat) -> LaunchPlan:
    """:func:`_forward_plan` under the current :data:`TUNING`: one dict lookup for a shape seen
    before."""
    return _FORWARD_PLANS.found(
        TUNING, (n_rows, n_cols, eps, weight_offset, dtypes, has_residual, has_weight, round_xhat),
        lambda: _forward_plan(n_rows, n_cols, eps, weight_offset, dtypes, has_residual,
                              has_weight, round_xhat, TUNING))


#: :func:`_find_forward_plan`'s plans by its arguments.
_FORWARD_PLANS = SignatureCache()


@plan_cache()
def _forward_plan(n_rows, n_cols, eps, weight_offset, dtypes, has_residual, has_weight,
                  round_xhat, tuning: RMSNormTuning) -> LaunchPlan:
    """The forward's launch (``dtypes``: of x, the weight as launched, y). Cached: the same few
    shapes come back every step."""
    consts = dict(HAS_RESIDUAL=has_residual, HAS_WEIGHT=has_weight, ROUND_XHAT=round_xhat,
                  ACC=acc_dtype(dtypes[0]))
    if n_cols <= tuning.single_block_max_cols:
        tile = row_tile(n_cols, n_rows, tile_elems=tuning.tile_elems,
                        max_rows=tuning.max_rows_per_program)
        consts.update(BLOCK_N=tile.block_cols, ROWS=tile.rows, num_warps=tile.num_warps)
        return LaunchPlan(rms_norm_fwd_kernel, (runtime.cdiv(n_rows, tile.rows),),
                          (n_rows, n_cols, eps, weight_offset), consts)
    tile = chunk_tile(n_cols, tuning.forward_chunk_cols)
    consts.update(BLOCK_N=tile.block_cols, num_warps=tile.num_warps)
    return LaunchPlan(rms_norm_fwd_chunked_kernel, (n_rows,), (n_cols, eps, weight_offset),
                      consts)


def _dw_dtype(x: torch.Tensor, weight: torch.Tensor | None) -> torch.dtype:
    return weight.dtype if weight is not None else stats_dtype(x.dtype)


def _rms_norm_backward_fake(dy, dsum, x, weight, rstd, norm_ndim, weight_offset, casting_mode,
                            need_dx, need_dw):
    _, n_cols = rows_cols(x, norm_ndim)
    return (x.new_empty(x.shape if need_dx else (0,)),
            x.new_empty(n_cols if need_dw else 0, dtype=_dw_dtype(x, weight)))


@register_op("rms_norm_backward", fake=_rms_norm_backward_fake)
def rms_norm_backward(
    dy: torch.Tensor,
    dsum: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    norm_ndim: int,
    weight_offset: float,
    casting_mode: str,
    need_dx: bool,
    need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dweight)``; one not asked for is an empty placeholder. ``x`` is what was normalised
    (``x + residual`` for :func:`add_rms_norm`), ``dsum`` the gradient that reached that sum
    directly (added to ``dx``). ``dweight`` comes flat (the caller reshapes), in the weight's
    dtype."""
    n_rows, n_cols = rows_cols(x, norm_ndim)
    dw_dtype = _dw_dtype(x, weight)
    if n_rows == 0 or n_cols == 0:  # a sum over no rows is 0
        dx = x.new_empty(x.shape if need_dx else (0,))
        if need_dx and dsum is not None:
            dx.copy_(dsum)
        return dx, x.new_zeros(n_cols if need_dw else 0, dtype=dw_dtype)
    dy, x = dy.contiguous(), x.contiguous()
    dsum = dsum.contiguous() if dsum is not None else None
    w = weight.contiguous() if weight is not None else x  # never read without a weight
    dtypes = (dy.dtype, x.dtype, w.dtype, dsum.dtype if dsum is not None else None, dw_dtype)
    plan = _find_backward_plan(n_rows, n_cols, weight_offset, dtypes, weight is not None,
                               casting_mode, (need_dx, need_dw), x.device)
    with runtime.device_guard(x):
        return _backward_launches(plan, dy, dsum, x, w, rstd, n_cols, need_dx, need_dw, dw_dtype)


def _find_backward_plan(n_rows, n_cols, weight_offset, dtypes, has_weight, casting_mode, need,
                        device) -> BackwardPlan:
    """``dtypes``: of dy, x, the weight as launched, dsum (None: there is none), dweight. One
    dict lookup for a shape seen before (found on every eager forward that records)."""
    return _BACKWARD_PLANS.found(
        TUNING, (n_rows, n_cols, weight_offset, dtypes, has_weight, casting_mode, need, device),
        lambda: _backward_plan(n_rows, n_cols, weight_offset, dtypes, has_weight,
                               dtypes[3] is not None, casting_mode == "llama", need,
                               runtime.num_sms(device), TUNING))


#: :func:`_find_backward_plan`'s plans by its arguments.
_BACKWARD_PLANS = SignatureCache()


def _backward_launches(plan, dy, dsum, x, w, rstd, n_cols, need_dx, need_dw, dw_dtype,
                       weight_shaped: bool = False):
    """Allocate and launch the backward of a plan (n_rows > 0, n_cols > 0, contiguous dy, x,
    dsum). ``dweight`` comes flat, or with ``weight_shaped`` in the shape of ``w`` (the
    contiguous weight)."""
    n_partials, launches = plan
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)  # x is contiguous
    dsum = dsum if dsum is not None else dy  # never read without HAS_DSUM
    # Row g of the partial buffer (n_partials x n_cols, flat): the dweight sum of row group g.
    dw_partial = x.new_empty(n_partials * n_cols if need_dw else 0, dtype=stats_dtype(x.dtype))
    if not need_dw:
        dw = x.new_empty(0, dtype=dw_dtype)
    elif weight_shaped:
        dw = torch.empty_like(w)
    else:
        dw = x.new_empty(n_cols, dtype=dw_dtype)
    for name, launch in launches.items():
        if name == "fused" or name == "dx_rows":  # "dx_rows": the partial sums not written
            launch.launch(dy, x, w, rstd, dsum, dx, dw_partial)
        elif name == "dx":
            launch.launch(dy, x, w, rstd, dsum, dx)
        elif name == "dw":
            launch.launch(dy, x, rstd, dw_partial)
        else:  # "sum"; COMPUTE_DB off: the second pair is not read
            launch.launch(dw_partial, dw_partial, dw, dw)
    return dx, dw


def _rms_norm_setup_context(ctx, inputs, output):
    x, residual, weight, norm_ndim, _, weight_offset, casting_mode = inputs[:7]
    y, total, rstd = output
    # Saved statistics (and, without a residual, the empty placeholder for the sum): no gradient
    # flows through them. One call: each call replaces what the one before marked.
    ctx.mark_non_differentiable(*((rstd,) if residual is not None else (rstd, total)))
    # Gradients of unused outputs would otherwise be materialised as zero tensors only to be
    # ignored (rstd's) or added (an unused sum's).
    ctx.set_materialize_grads(False)
    normalised = total if residual is not None else x
    ctx.save_for_backward(normalised, weight, rstd)
    ctx.norm_ndim, ctx.weight_offset, ctx.casting_mode = norm_ndim, weight_offset, casting_mode
    ctx.has_residual = residual is not None
    n_rows, n_cols = rows_cols(x, norm_ndim)
    if getattr(ctx, "eager", False) and n_rows and n_cols and normalised.is_contiguous() and (
            weight is None or weight.is_contiguous()):
        need = (ctx.needs_input_grad[0] or ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        ctx.backward_plan = _planned_backward(x, weight, y.dtype, ctx.has_residual, n_rows,
                                              n_cols, weight_offset, casting_mode, need)


def _planned_backward(x, weight, y_dtype, has_residual, n_rows, n_cols, weight_offset,
                      casting_mode, need):
    """The backward's plan for the usual case (contiguous gradients of the outputs' dtypes, the
    sum's gradient present when there is a sum), found on the calling thread: the backward then
    only allocates and launches."""
    dw_dtype = _dw_dtype(x, weight)
    dtypes = (y_dtype, x.dtype, (weight if weight is not None else x).dtype,
              x.dtype if has_residual else None, dw_dtype)
    return (_find_backward_plan(n_rows, n_cols, weight_offset, dtypes, weight is not None,
                                casting_mode, need, x.device), n_cols, need, dw_dtype, y_dtype)


def _rms_norm_forward_planned(ctx, x, residual, weight, ready):
    """The eager autograd forward of a kept signature (:func:`_rms_norm`'s ``RECORD`` path):
    :func:`rms_norm_forward` and :func:`_rms_norm_setup_context` with the plans kept for it
    (the backward's by which inputs need a gradient, found at the first such call)."""
    norm_ndim, _, weight_offset, y_dtype, n_rows, plan, casting_mode, backward_plans = ready
    y = torch.empty_like(x, dtype=y_dtype, memory_format=torch.contiguous_format)
    rstd = x.new_empty(n_rows, dtype=stats_dtype(x.dtype))
    has_residual = residual is not None
    w = weight if weight is not None else x  # never read without a weight
    with runtime.device_guard(x):
        if has_residual:
            total = torch.empty_like(x, memory_format=torch.contiguous_format)
            plan.launch_eager(x, residual, w, y, total, rstd)
        else:  # y stands in for the sum: never written
            total = x.new_empty(0)
            plan.launch_eager(x, x, w, y, y, rstd)
    # As _rms_norm_setup_context marks them.
    ctx.mark_non_differentiable(*((rstd,) if has_residual else (rstd, total)))
    ctx.set_materialize_grads(False)
    normalised = total if has_residual else x
    ctx.save_for_backward(normalised, weight, rstd)
    ctx.norm_ndim, ctx.weight_offset, ctx.casting_mode = norm_ndim, weight_offset, casting_mode
    ctx.has_residual = has_residual
    need = (ctx.needs_input_grad[0] or ctx.needs_input_grad[1], ctx.needs_input_grad[2])
    planned = backward_plans.get(need)
    if planned is None:
        planned = backward_plans[need] = _planned_backward(
            x, weight, y_dtype, has_residual, *rows_cols(x, norm_ndim), weight_offset,
            casting_mode, need)
    ctx.backward_plan = planned
    return y, total, rstd


@runtime.launch_directly
def _rms_norm_backward_planned(planned, dy, dsum, x, weight, rstd):
    """``(dx, dweight)``, dweight in the weight's shape."""
    plan, n_cols, need, dw_dtype, _ = planned
    return _backward_launches(plan, dy, dsum, x, weight if weight is not None else x, rstd,
                              n_cols, *need, dw_dtype, weight_shaped=True)


def _takes_planned_backward(planned, dy, dsum, x, has_residual) -> bool:
    return (planned is not None and dy.dtype == planned[-1] and dy.is_contiguous()
            and dy.device == x.device and (dsum is not None) == has_residual
            and (dsum is None or (dsum.dtype == x.dtype and dsum.is_contiguous()))
            and runtime.eager_backward())


def _rms_norm_backward_autograd(ctx, dy, dsum, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_x, need_residual, need_dw = ctx.needs_input_grad[:3]
    need_dx = need_x or need_residual
    unused = (None,) * 5  # norm_ndim, eps, weight_offset, casting_mode, out_dtype
    if dy is None:  # y did not reach the loss: the sum's gradient passes through the add
        return (dsum if need_x else None, dsum if need_residual else None, None, *unused)
    planned = getattr(ctx, "backward_plan", None)
    if _takes_planned_backward(planned, dy, dsum, x, ctx.has_residual):
        # Autograd runs a CUDA backward on its device thread, already on x's device.
        dx, dw = _rms_norm_backward_planned(planned, dy, dsum, x, weight, rstd)
    else:
        dx, dw = rms_norm_backward(dy, dsum, x, weight, rstd, ctx.norm_ndim, ctx.weight_offset,
                                   ctx.casting_mode, need_dx, need_dw)
        dw = dw.view(weight.shape) if need_dw else None
    # d(x + residual) reaches x and residual alike: the same tensor, as torch's add returns.
    return (dx if need_x else None, dx if need_residual else None,
            dw if need_dw else None, *unused)


rms_norm_forward.register_autograd(
    _rms_norm_backward_autograd, setup_context=_rms_norm_setup_context
)
rms_norm_forward.register_planned_forward(_rms_norm_forward_planned)


# --------------------------------------------------------------------------------------------
# Public functions.
# --------------------------------------------------------------------------------------------
#: How torch.nn.functional.rms_norm follows autocast in the installed torch: from torch 2.12 on
#: torch's CUDA fp32 list (before: on no list; never on a CPU list). The fp32 rule's effect, fp32
#: arithmetic and an fp32 result, is had by reading the fp16/bf16 inputs as they are (the
#: kernels compute in fp32 anyway) and writing y in fp32: no cast copies of x and the weight.
#: Only "torch" casting follows it: the transformers modules that "llama" and "gemma" reproduce
#: cast explicitly, and autocast leaves their arithmetic as it is.
AUTOCAST = runtime.AutocastPolicy({"cuda": "fp32"} if torch.__version__ >= (2, 12) else None)


def _autocast_out_dtype(x: torch.Tensor, casting_mode: str) -> torch.dtype | None:
    if casting_mode != "torch" or x.dtype == torch.float64:  # float64 is never autocast
        return None
    return AUTOCAST.dtype_for("cuda" if x.is_cuda else "cpu")  # checked: CUDA or the CPU


def _check_dense(t: torch.Tensor | None, name: str) -> None:
    if t is not None and (t.is_nested or t.layout != torch.strided):
        got = "a nested tensor" if t.is_nested else f"layout {t.layout}"
        raise TypeError(f"{name} must be a dense (strided) tensor, got {got}")


def _check_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def _checked(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
             check_residual: bool) -> tuple[int, float, float]:
    """``(norm_ndim, eps, weight_offset)`` as the op takes them, from :func:`_check_arguments`
    once per call signature."""
    return _CALLS.checked(_call_key, _check_arguments, x, residual, normalized_shape, weight, eps,
                          weight_offset, casting_mode, check_residual)


def _call_key(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
              check_residual):
    """Everything the checks read."""
    return (layout_key(x), layout_key(residual) if check_residual else check_residual,
            shape_key(normalized_shape), layout_key(weight), eps, type(eps), weight_offset,
            type(weight_offset), casting_mode)


#: rms_norm's and add_rms_norm's checked call signatures -> :func:`_checked`'s result.
_CALLS = SignatureCache()


def _check_arguments(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
                     check_residual: bool) -> tuple[int, float, float]:
    """Every argument checked before anything launches; ``(norm_ndim, eps, weight_offset)``
    as the op takes them."""
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES_WITH_FP64)
    _check_dense(x, "x")
    if check_residual:
        runtime.check_tensor(residual, "residual", dtypes=FLOAT_DTYPES_WITH_FP64)
        _check_dense(residual, "residual")
        if residual.shape != x.shape:
            raise ValueError(f"residual must have the shape of x {tuple(x.shape)}, got "
                             f"{tuple(residual.shape)}")
        runtime.check_same_dtype(x=x, residual=residual)
    shape = check_normalized_shape(normalized_shape, x)
    check_norm_param(weight, "weight", shape)
    _check_dense(weight, "weight")
    runtime.check_same_device(x=x, residual=residual, weight=weight)
    if eps is None:  # as torch: the epsilon of the arithmetic type (fp32 for fp16/bf16 rows)
        eps = torch.finfo(stats_dtype(x.dtype)).eps
    eps = _check_real(eps, "eps")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    weight_offset = _check_real(weight_offset, "weight_offset")
    if not math.isfinite(weight_offset):
        raise ValueError(f"weight_offset must be finite, got {weight_offset}")
    if not isinstance(casting_mode, str):
        raise TypeError(f"casting_mode must be a str, got {type(casting_mode).__name__}")
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {list(CASTING_MODES)}, got "
                         f"{casting_mode!r}")
    return len(shape), eps, weight_offset


def _rms_norm(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
              check_residual: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, x + residual)`` of both public functions (the sum a placeholder without a
    residual)."""
    path = rms_norm_forward.eager_path(x, residual, weight)
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            out_dtype = _autocast_out_dtype(x, casting_mode)
            ready = _READY.under(TUNING).get(_ready_key(
                x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
                check_residual, out_dtype))
        except UNKEYABLE:
            ready = None
        if ready is not None:
            if path == runtime.RECORD:
                y, total, _ = rms_norm_forward.record_planned(x, residual, weight, ready)
                return y, total
            y_dtype, n_rows, plan = ready[3:6]
            y = torch.empty_like(x, dtype=y_dtype, memory_format=torch.contiguous_format)
            rstd = x.new_empty(n_rows, dtype=stats_dtype(x.dtype))
            w = weight if weight is not None else x  # never read without a weight
            with runtime.device_guard(x):
                if residual is None:  # y stands in for the sum: never written
                    plan.launch_eager(x, x, w, y, y, rstd)
                    return y, None
                total = torch.empty_like(x, memory_format=torch.contiguous_format)
                plan.launch_eager(x, residual, w, y, total, rstd)
                return y, total
    norm_ndim, eps_, weight_offset_ = _checked(x, residual, normalized_shape, weight, eps,
                                               weight_offset, casting_mode, check_residual)
    out_dtype = _autocast_out_dtype(x, casting_mode)
    y, total, _ = rms_norm_forward(x, residual, weight, norm_ndim, eps_, weight_offset_,
                                   casting_mode, out_dtype)
    n_rows, n_cols = rows_cols(x, norm_ndim)
    if path and n_rows and n_cols and x.is_contiguous() and (
            residual is None or residual.is_contiguous()) and (
            weight is None or weight.is_contiguous()):
        w = weight if weight is not None else x
        plan = _find_forward_plan(n_rows, n_cols, eps_, weight_offset_,
                                  (x.dtype, w.dtype, y.dtype), residual is not None,
                                  weight is not None, casting_mode == "llama")
        _READY.under(TUNING).remember(
            _ready_key(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
                       check_residual, out_dtype),
            (norm_ndim, eps_, weight_offset_, y.dtype, n_rows, plan, casting_mode, {}))
    return y, total


def _ready_key(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
               check_residual, out_dtype):
    """An eager call's layouts (all the checks read, and the strides) and other arguments."""
    return (x.shape, x.stride(), x.dtype, x.device, x.layout,
            (residual.stride(), *layout_key(residual)) if check_residual else None,
            shape_key(normalized_shape),
            (weight.stride(), *layout_key(weight)) if weight is not None else None,
            eps, type(eps), weight_offset, type(weight_offset), casting_mode, out_dtype)


#: Eager calls' :func:`_ready_key` -> ``(norm_ndim, eps, weight_offset, y's dtype, rows, the
#: forward's plan, casting_mode, the backward's plans by which inputs need a gradient)`` for
#: contiguous operands that were checked.
_READY = SignatureCache()


def rms_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    weight_offset: float = 0.0,
    casting_mode: str = "torch",
) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` in Triton: fp16/bf16/fp32 inputs with fp32 statistics
    (fp64 computes in fp64), an optional ``weight`` of any float dtype, ``eps`` None for the
    epsilon of the arithmetic type as torch's; differentiable with a deterministic ``dweight``,
    traceable by ``torch.compile``, and following ``torch.autocast`` as torch's does.

    ``weight_offset`` scales by ``weight_offset + weight`` (Gemma's ``1 + weight`` with 1.0; it
    shifts a weight, so without one it has nothing to shift). ``casting_mode`` ``"llama"`` or
    ``"gemma"`` rounds as transformers' LlamaRMSNorm or GemmaRMSNorm does (module docstring)."""
    return _rms_norm(x, None, normalized_shape, weight, eps, weight_offset, casting_mode)[0]


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
    *,
    weight_offset: float = 0.0,
    casting_mode: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual, ...), x + residual)`` in one pass: ``x`` and ``residual`` read
    once, the sum (rounded to ``x``'s dtype, as torch's ``x + residual``) and the normalised
    output written once. ``residual`` has ``x``'s shape and dtype. Gradients reach ``x`` and
    ``residual`` through both outputs. Arguments otherwise as :func:`rms_norm`'s; under autocast
    the sum keeps ``x``'s dtype (an add is on no autocast list) while the norm follows
    ``F.rms_norm``."""
    return _rms_norm(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
                     check_residual=True)
