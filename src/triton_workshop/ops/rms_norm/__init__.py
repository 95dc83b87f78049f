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
from dataclasses import dataclass
from typing import Optional

import torch

from ... import runtime
from ...runtime import RECORD, LaunchPlan, register_op
from .._common import (
    UNKEYABLE,
    SignatureCache,
    rows_cols,
    shape_key,
    stats_dtype,
)
from ..layer_norm import LayerNormTuning
from .checks import CASTING_MODES as CASTING_MODES
from .checks import checked as _checked
from .plans import BackwardPlan, kept_launches
from .plans import backward_plan as _backward_plan
from .plans import forward_plan as _forward_plan


@dataclass(frozen=True)
class RMSNormTuning(LayerNormTuning):
    """The launch decisions of rms_norm: part of every plan's key (tests replace :data:`TUNING`
    with ``dataclasses.replace`` to reach the chunked paths on short rows). The fields are layer
    norm's (:class:`LayerNormTuning`; H100 measurements in docs/kernels/layer_norm.md): an RMSNorm
    program holds its tiles less the bias terms (``dwdb_stages`` is the column-tiled dweight
    kernel's), so it fits wherever layer norm's does. Overridden: fused backward rows up to 16384
    (not 8192: past it the column-tiled sums read x and dy again; H100, rows of 16384: 55% of
    copy so, 71-78% fused); fused rows past the held width re-read the weight each step rather
    than hold it beside the running sums (fewer spills). The forward keeps rows up to 8192 whole
    (layer norm's 4096): one register tile less per row than layer norm, and on an H200 rows of
    8192 ran 4% faster so, forward (16384 x 8192 fp16: 90.8% of copy against 87-90% chunked) and
    forward + backward (8192 x 8192: 91.8% against 89.6%; with the residual add 93.4% against
    89.6%), the other sizes unchanged; rows of 16384 whole fell to 70% (docs/results.md,
    2026-11-28)."""
    single_block_max_cols: int = 8192
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
                              residual is not None, weight is not None, casting_mode == "llama",
                              True)
    with runtime.device_guard(x):
        plan.launch(x, r, w, y, total if residual is not None else y, rstd)
    return y, total, rstd


def _find_forward_plan(n_rows, n_cols, eps, weight_offset, dtypes, has_residual, has_weight,
                       round_xhat, store_rstd) -> LaunchPlan:
    """:func:`.plans.forward_plan` under the current :data:`TUNING`: one dict lookup for a shape
    seen before."""
    return _FORWARD_PLANS.found(
        TUNING, (n_rows, n_cols, eps, weight_offset, dtypes, has_residual, has_weight, round_xhat,
                 store_rstd),
        lambda: _forward_plan(n_rows, n_cols, eps, weight_offset, dtypes, has_residual,
                              has_weight, round_xhat, store_rstd, TUNING))


#: :func:`_find_forward_plan`'s plans by its arguments.
_FORWARD_PLANS = SignatureCache()


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


def _backward_launches(plan, dy, dsum, x, w, rstd, n_cols, need_dx, need_dw, dw_dtype):
    """Allocate and launch the backward of a plan (n_rows > 0, n_cols > 0, contiguous dy, x,
    dsum) for :func:`rms_norm_backward`; ``dweight`` comes flat."""
    n_partials, launches = plan
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)  # x is contiguous
    dsum = dsum if dsum is not None else dy  # never read without HAS_DSUM
    # Row g of the partial buffer (n_partials x n_cols, flat): the dweight sum of row group g.
    dw_partial = x.new_empty(n_partials * n_cols if need_dw else 0, dtype=stats_dtype(x.dtype))
    dw = x.new_empty(n_cols if need_dw else 0, dtype=dw_dtype)
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
        ctx.backward_plan = _kept_backward(x, weight, y.dtype, ctx.has_residual, n_rows, n_cols,
                                           norm_ndim, weight_offset, casting_mode,
                                           ctx.needs_input_grad)
    else:
        ctx.backward_plan = None


def _kept_backward(x, weight, y_dtype, has_residual, n_rows, n_cols, norm_ndim, weight_offset,
                   casting_mode, needs) -> tuple:
    """What the eager backward of a contiguous x needs, found on the calling thread, so that the
    backward only allocates and launches (:func:`_rms_norm_backward_kept`): ``(the launches
    without the sum's gradient, with it (None without a residual), need_x, need_residual,
    need_dx, need_dw, (norm_ndim, weight_offset, casting_mode) for the op)``, the launches as
    :func:`.plans.kept_launches` gives them. ``needs``: ``ctx.needs_input_grad`` (x, residual,
    weight first). Kept per signature: the general path asks at every call."""
    need_x, need_residual, need_dw = needs[0], needs[1], needs[2]
    key = (n_rows, n_cols, norm_ndim, weight_offset, casting_mode, y_dtype, x.dtype,
           weight.dtype if weight is not None else None, has_residual, need_x, need_residual,
           need_dw, x.device)
    return _KEPT_BACKWARDS.found(TUNING, key, lambda: _make_kept_backward(
        x, weight, y_dtype, has_residual, n_rows, n_cols, norm_ndim, weight_offset,
        casting_mode, need_x, need_residual, need_dw))


def _make_kept_backward(x, weight, y_dtype, has_residual, n_rows, n_cols, norm_ndim,
                        weight_offset, casting_mode, need_x, need_residual, need_dw) -> tuple:
    """:func:`_kept_backward`'s entry, made once."""
    dw_dtype = _dw_dtype(x, weight)
    w_dtype = (weight if weight is not None else x).dtype
    need = (need_x or need_residual, need_dw)
    # Both of add_rms_norm's: with the sum's gradient, and without (a model's last norm, whose
    # sum is unused), which otherwise takes the op's path at twice the host time. Autograd
    # hands the backward gradients of the outputs' dtypes (its engine casts others).
    launches = [kept_launches(_find_backward_plan(
        n_rows, n_cols, weight_offset, (y_dtype, x.dtype, w_dtype, dsum_dtype, dw_dtype),
        weight is not None, casting_mode, need, x.device), n_cols)
        for dsum_dtype in ((None, x.dtype) if has_residual else (None,))]
    return (launches[0], launches[1] if has_residual else None, need_x, need_residual,
            need[0], need_dw, (norm_ndim, weight_offset, casting_mode))


#: :func:`_kept_backward`'s results by its arguments.
_KEPT_BACKWARDS = SignatureCache()


def _rms_norm_backward_kept(ctx, dy, dsum=None):
    """The backward of :func:`_rms_norm_forward_planned`'s Function (inputs x, residual, weight,
    the kept plans; outputs y, and the sum with a residual), and of the op's after an eager
    call (:func:`_rms_norm_backward_autograd`): allocate and launch what :func:`_kept_backward`
    found in the forward, once per signature; the op while a graph is built (a double backward)
    or something watches. Autograd hands it gradients of the outputs' dtypes and device (its
    engine casts another dtype and refuses another device); one laid out otherwise (the
    expanded gradient of a ``sum()``) is copied, as the op would. Autograd runs a CUDA backward
    on its device thread, already on x's device, where each line costs 2-3 times its time on
    the caller's thread (cold caches): nothing is allocated that no kernel writes."""
    plain, with_dsum, need_x, need_residual, need_dx, need_dw, op_args = ctx.backward_plan
    if dy is None:  # y did not reach the loss: the sum's gradient passes through the add
        return dsum if need_x else None, dsum if need_residual else None, None, None
    x, weight, rstd = ctx.saved_tensors
    if not runtime.eager_backward():
        return (*_op_backward(dy, dsum, x, weight, rstd, *op_args, need_x, need_residual,
                              need_dw), None)
    if not dy.is_contiguous():
        dy = dy.contiguous()
    if dsum is None:
        rows, dx_chunked, dw_chunked, sum_partials, partial_size = plain
        dsum = dy  # never read without HAS_DSUM
    else:
        rows, dx_chunked, dw_chunked, sum_partials, partial_size = with_dsum
        if not dsum.is_contiguous():
            dsum = dsum.contiguous()
    w = weight if weight is not None else x  # never read without a weight
    dx = torch.empty_like(x) if need_dx else None  # x is contiguous
    if need_dw:
        # Row g of the partial buffer (flat): the dweight sum of row group g, in rstd's dtype.
        partials = rstd.new_empty(partial_size)
        dw = torch.empty_like(weight)
    else:  # rstd stands in for the partial sums: never written with COMPUTE_DW off
        partials = rstd
        dw = None
    if rows is not None:  # x stands in for dx: never written with COMPUTE_DX off
        rows.launch_eager(dy, x, w, rstd, dsum, x if dx is None else dx, partials)
    elif dx is not None:
        dx_chunked.launch_eager(dy, x, w, rstd, dsum, dx)
    if dw is not None:
        if dw_chunked is not None:
            dw_chunked.launch_eager(dy, x, rstd, partials)
        sum_partials.launch_eager(partials, partials, dw, dw)  # COMPUTE_DB off: one pair read
    # d(x + residual) reaches x and residual alike: the same tensor, as torch's add returns.
    return dx if need_x else None, dx if need_residual else None, dw, None


def _op_backward(dy, dsum, x, weight, rstd, norm_ndim, weight_offset, casting_mode, need_x,
                 need_residual, need_dw):
    """``(dx, dresidual, dweight)`` from the op :func:`rms_norm_backward` (None: not needed)."""
    dx, dw = rms_norm_backward(dy, dsum, x, weight, rstd, norm_ndim, weight_offset, casting_mode,
                               need_x or need_residual, need_dw)
    # d(x + residual) reaches x and residual alike: the same tensor, as torch's add returns.
    return (dx if need_x else None, dx if need_residual else None,
            dw.view(weight.shape) if need_dw else None)


def _rms_norm_backward_autograd(ctx, dy, dsum, _drstd):
    unused = (None,) * 5  # norm_ndim, eps, weight_offset, casting_mode, out_dtype
    if ctx.backward_plan is not None:  # an eager call's: as the planned forward's Function
        return (*_rms_norm_backward_kept(ctx, dy, dsum)[:3], *unused)
    need_x, need_residual, need_dw = ctx.needs_input_grad[:3]
    if dy is None:  # y did not reach the loss: the sum's gradient passes through the add
        return (dsum if need_x else None, dsum if need_residual else None, None, *unused)
    x, weight, rstd = ctx.saved_tensors
    return (*_op_backward(dy, dsum, x, weight, rstd, ctx.norm_ndim, ctx.weight_offset,
                          ctx.casting_mode, need_x, need_residual, need_dw), *unused)


def _rms_norm_forward_planned(ctx, x, residual, weight, ready):
    """The eager autograd forward of a kept signature (the public functions' ``RECORD`` path):
    :func:`rms_norm_forward` and :func:`_rms_norm_setup_context` with the plans kept for it
    (``ready``, see :data:`_READY`; the backward's by which inputs need a gradient, found at the
    first such call). Its outputs are only what the public function returns: ``y`` alone
    without a residual, else ``(y, x + residual)``; ``rstd`` is saved, not returned (no output
    to mark non-differentiable). Only what :func:`_rms_norm_backward_kept` reads is set on
    ``ctx``."""
    kept = ready[4].get(ctx.needs_input_grad)
    if kept is None:
        kept = ready[4][ctx.needs_input_grad] = _kept_backward(
            x, weight, ready[1], residual is not None, ready[3], *ready[5:9], ctx.needs_input_grad)
    ctx.backward_plan = kept
    y = torch.empty_like(x) if ready[10] else torch.empty_like(x, dtype=ready[1])  # x contiguous
    rstd = x.new_empty(ready[3], dtype=ready[2])
    w = weight if weight is not None else x  # never read without a weight
    guard = runtime.device_guard(x)
    if residual is None:  # y stands in for the sum: never written
        if guard is _SAME_DEVICE:  # entering the no-op context costs two calls
            ready[0].launch_eager(x, x, w, y, y, rstd)
        else:
            with guard:
                ready[0].launch_eager(x, x, w, y, y, rstd)
        ctx.save_for_backward(x, weight, rstd)
        return y
    total = torch.empty_like(x)
    if guard is _SAME_DEVICE:
        ready[0].launch_eager(x, residual, w, y, total, rstd)
    else:
        with guard:
            ready[0].launch_eager(x, residual, w, y, total, rstd)
    # An unused output's gradient is None, not zeros materialised to be added.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(total, weight, rstd)
    return y, total


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing.
_SAME_DEVICE = runtime.device_guard(torch.empty(0))


rms_norm_forward.register_autograd(
    _rms_norm_backward_autograd, setup_context=_rms_norm_setup_context
)
# The planned Function has a backward of its own: what it reads was worked out in its forward,
# where the op's backward would look up and check ctx attributes on autograd's device thread.
rms_norm_forward.register_planned_forward(_rms_norm_forward_planned, _rms_norm_backward_kept)


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

#: Whether autocast is on for any device type: one C call (:func:`runtime.any_autocast` without
#: its frame), all the public functions ask while it is off.
_autocast_on = getattr(torch._C, "_is_any_autocast_enabled", None) or runtime.any_autocast
_SIZE = torch.Size


def _shape_in_key(shape):
    """``normalized_shape`` as the call keys hold it: an int or a one-int tuple/Size as given
    (the common case, no conversion), anything else through :func:`shape_key`."""
    if type(shape) is int or ((type(shape) is tuple or type(shape) is _SIZE) and len(shape) == 1
                              and type(shape[0]) is int):
        return shape
    return shape_key(shape)


def _autocast_out_dtype(x: torch.Tensor, casting_mode: str) -> torch.dtype | None:
    if casting_mode != "torch" or x.dtype == torch.float64:  # float64 is never autocast
        return None
    return AUTOCAST.dtype_for("cuda" if x.is_cuda else "cpu")  # checked: CUDA or the CPU


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
    path = rms_norm_forward.eager_path(x, weight)
    key = None
    if path:  # an eager call: its layouts' checks and plans, kept, found in one lookup
        try:
            shape = _shape_in_key(normalized_shape)
            # The layouts (what the checks read, and the strides) and the other arguments;
            # rms_norm's keys are one shorter than add_rms_norm's.
            key = (x.shape, x.stride(), x.dtype, x.device, x.layout, shape,
                   (weight.stride(), weight.shape, weight.dtype, weight.device, weight.layout)
                   if weight is not None else None,
                   eps, type(eps), weight_offset, type(weight_offset), casting_mode,
                   _autocast_out_dtype(x, casting_mode) if _autocast_on() else None)
            ready = _READY.get(key) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            key = ready = None
        if ready is not None:  # seen before: straight to the launch
            if path == RECORD:
                return rms_norm_forward.record_planned(x, None, weight, ready)
            y = torch.empty_like(x) if ready[10] else torch.empty_like(x, dtype=ready[1])
            w = weight if weight is not None else x  # never read without a weight
            # y stands in for the sum and rstd: never written (STORE_RSTD off).
            guard = runtime.device_guard(x)
            if guard is _SAME_DEVICE:  # entering the no-op context costs two calls
                ready[9].launch_eager(x, x, w, y, y, y)
            else:
                with guard:
                    ready[9].launch_eager(x, x, w, y, y, y)
            return y
    return _rms_norm(x, None, normalized_shape, weight, eps, weight_offset, casting_mode,
                     False, key)[0]


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
    path = rms_norm_forward.eager_path(x, residual, weight)
    key = None
    if path:  # as rms_norm's
        try:
            shape = _shape_in_key(normalized_shape)
            key = (x.shape, x.stride(), x.dtype, x.device, x.layout,
                   (residual.stride(), residual.shape, residual.dtype, residual.device,
                    residual.layout), shape,
                   (weight.stride(), weight.shape, weight.dtype, weight.device, weight.layout)
                   if weight is not None else None,
                   eps, type(eps), weight_offset, type(weight_offset), casting_mode,
                   _autocast_out_dtype(x, casting_mode) if _autocast_on() else None)
            ready = _READY.get(key) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            key = ready = None
        if ready is not None:
            if path == RECORD:
                return rms_norm_forward.record_planned(x, residual, weight, ready)
            y = torch.empty_like(x) if ready[10] else torch.empty_like(x, dtype=ready[1])
            total = torch.empty_like(x)
            w = weight if weight is not None else x  # never read without a weight
            guard = runtime.device_guard(x)
            if guard is _SAME_DEVICE:  # y stands in for rstd: never written (STORE_RSTD off)
                ready[9].launch_eager(x, residual, w, y, total, y)
            else:
                with guard:
                    ready[9].launch_eager(x, residual, w, y, total, y)
            return y, total
    return _rms_norm(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
                     True, key)


def _rms_norm(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
              check_residual: bool, key) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, x + residual)`` of both public functions for a call not kept (the sum a placeholder
    without a residual): checked, then the op. ``key``: the call's key in :data:`_READY` (None:
    none, not an eager call); an eager call of contiguous operands is kept there."""
    norm_ndim, eps_, weight_offset_ = _checked(x, residual, normalized_shape, weight, eps,
                                               weight_offset, casting_mode, check_residual)
    out_dtype = _autocast_out_dtype(x, casting_mode)
    y, total, rstd = rms_norm_forward(x, residual, weight, norm_ndim, eps_, weight_offset_,
                                      casting_mode, out_dtype)
    n_rows, n_cols = rows_cols(x, norm_ndim)
    if key is not None and n_rows and n_cols and x.is_contiguous() and (
            residual is None or residual.is_contiguous()) and (
            weight is None or weight.is_contiguous()):
        dtypes = (x.dtype, (weight if weight is not None else x).dtype, y.dtype)
        plans = [_find_forward_plan(n_rows, n_cols, eps_, weight_offset_, dtypes,
                                    residual is not None, weight is not None,
                                    casting_mode == "llama", store_rstd)
                 for store_rstd in (True, False)]
        _READY.under(TUNING).remember(
            key, (plans[0], y.dtype, rstd.dtype, n_rows, {}, n_cols, norm_ndim, weight_offset_,
                  casting_mode, plans[1], y.dtype == x.dtype))
    return y, total


#: Eager calls' keys (built in :func:`rms_norm` and :func:`add_rms_norm`: the layouts, with the
#: strides, and the other arguments) -> ``(the forward's plan, y's dtype, rstd's dtype, rows,
#: {ctx.needs_input_grad: the backward's kept launches (_kept_backward)}, columns, norm_ndim,
#: weight_offset, casting_mode, the forward's plan that writes no rstd, whether y has x's
#: dtype)`` for contiguous operands that were checked.
_READY = SignatureCache()
