"""LayerNorm followed by Linear, in one op whose backward keeps no normalised activations.

    out = F.linear(F.layer_norm(x, (K,), ln_weight, ln_bias, eps), weight, bias)

for ``x`` of shape (..., K) and ``weight`` (N, K): the block that opens every pre-norm
transformer layer. No kernels of its own: the forward is
:func:`~triton_workshop.ops.layer_norm.layer_norm_forward` then
:func:`~triton_workshop.ops.matmul.launch_matmul` (the bias in its epilogue); the backward
recomputes the normalised rows from the saved ``mean``/``rstd``. Why it is not a folded epilogue
(it cancels at large ``|mean| / std``) is in docs/kernels/layer_norm_linear.md.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op
from . import layer_norm as layer_norm_family
from . import matmul as matmul_family
from ._common import (
    FLOAT_DTYPES_WITH_FP64,
    UNKEYABLE,
    SignatureCache,
    layout_key,
)
from .layer_norm import launch_planned_forward, layer_norm_backward, layer_norm_forward
from .matmul import launch_matmul, matmul, product_plan, tf32_enabled


def _n_rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


def _forward_fake(x, ln_weight, ln_bias, weight, bias, eps):
    n_rows = _n_rows(x)
    return (
        x.new_empty(*x.shape[:-1], weight.shape[0]),
        x.new_empty(n_rows, dtype=torch.float32),
        x.new_empty(n_rows, dtype=torch.float32),
    )


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by layer_norm_linear).
# --------------------------------------------------------------------------------------------
@register_op("layer_norm_linear_forward", fake=_forward_fake,
             autocast="lower_precision_fp")  # as the F.linear it ends in
def layer_norm_linear_forward(
    x: torch.Tensor,
    ln_weight: Optional[torch.Tensor],
    ln_bias: Optional[torch.Tensor],
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, mean, rstd)``: out (..., N) in x's dtype; mean and rstd one per row (fp32, fp64
    for fp64 x). Two launches: layer_norm's forward, then the product with ``bias`` in its
    epilogue (docs/kernels/layer_norm_linear.md)."""
    K, N = x.shape[-1], weight.shape[0]
    M = _n_rows(x)
    x2d = x if x.dim() == 2 else x.reshape(M, K)  # a view unless the leading dims cannot merge
    out = x.new_empty(*x.shape[:-1], N)  # contiguous, so (M, N) with strides (N, 1)
    out2d = out if out.dim() == 2 else out.view(M, N)
    ln_out, mean, rstd = layer_norm_forward(x2d, ln_weight, ln_bias, 1, eps)
    if M == 0 or N == 0:
        return out, mean, rstd
    if K == 0:  # an empty sum: only the bias is left
        out.copy_(bias.expand(out.shape) if bias is not None else torch.zeros_like(out))
        return out, mean, rstd
    with runtime.device_guard(x):
        launch_matmul(ln_out, weight.t(), out2d, bias=bias)
    return out, mean, rstd


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _setup_context(ctx, inputs, output):
    x, ln_weight, ln_bias, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, ln_weight, ln_bias, weight, mean, rstd)
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, grad_out, _grad_mean, _grad_rstd):
    x, ln_weight, ln_bias, weight, mean, rstd = ctx.saved_tensors
    need_x, need_g, need_b, need_w, need_bias = ctx.needs_input_grad[:5]
    K, N = x.shape[-1], weight.shape[0]
    M = mean.shape[0]
    x2d, dy = x.reshape(M, K), grad_out.reshape(M, N)
    dx = d_ln_weight = d_ln_bias = d_weight = d_bias = None
    # The products the eager forward planned, for an incoming gradient laid out like its output
    # (not under autocast: there the public matmul casts its operands).
    planned = getattr(ctx, "backward_plans", None)
    if planned is not None and not (dy.dtype is x.dtype and dy.stride() == planned[0]
                                    and runtime.eager_backward() and not runtime.any_autocast()):
        planned = None
    if need_w:
        # The backward may materialise the normalised activations the forward never wrote.
        ln_out = (x2d.float() - mean.unsqueeze(1)) * rstd.unsqueeze(1)
        if ln_weight is not None:
            ln_out = ln_out * ln_weight.float()
        if ln_bias is not None:
            ln_out = ln_out + ln_bias.float()
        d_weight = _product(planned and planned[1], dy.t(), ln_out.to(x.dtype))
    if need_bias:
        d_bias = dy.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
    if need_x or need_g or need_b:
        d_ln_out = _product(planned and planned[2], dy, weight)
        dx, dg, db = layer_norm_backward(
            d_ln_out, x2d, ln_weight, mean, rstd, 1, need_x, need_g, need_b
        )
        dx = dx.view(x.shape) if need_x else None
        d_ln_weight = dg.to(ln_weight.dtype) if need_g else None
        d_ln_bias = db.to(ln_bias.dtype) if need_b else None
    return dx, d_ln_weight, d_ln_bias, d_weight, d_bias, None


def _product(plan, a, b):
    """``matmul(a, b)``; with ``plan`` (kept by the eager forward for these layouts) only the
    allocation and the launch. Autograd runs a CUDA backward on its device thread, already on
    the operands' device."""
    if plan is None:
        return matmul(a, b)
    out = a.new_empty(a.shape[0], b.shape[1])
    plan.launch_eager(a, b, out, out, out)  # no bias, no dropout: out stands in (never read)
    return out


def _backward_plans(dy, ln_out, weight):
    """``(dy's strides, dW's plan, d(ln_out)'s plan)`` of the backward's products, as the public
    matmul launches them (its default slope), for an incoming gradient ``dy`` (M, N) laid out
    like the forward's output; a plan None where the product takes launch_matmul's general
    path."""
    slope = 0.01  # matmul's leaky_relu_slope default: part of the launch, unused by "none"
    return (dy.stride(),
            product_plan(dy.t(), ln_out, dy.new_empty(weight.shape), None, "none", slope),
            product_plan(dy, weight, ln_out.new_empty(ln_out.shape), None, "none", slope))


def _forward_planned(ctx, x, ln_weight, ln_bias, weight, bias, ready):
    """The eager autograd forward of a kept signature (:func:`_launch_ready`'s ``RECORD``
    path): :func:`layer_norm_linear_forward` and :func:`_setup_context` with the plans kept
    (the backward's products', found at the first such call)."""
    out, ln_out, mean, rstd = _launch_ready(ready, x, ln_weight, ln_bias, weight, bias)
    ctx.save_for_backward(x, ln_weight, ln_bias, weight, mean, rstd)
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.mark_non_differentiable(mean, rstd)
    backward = ready[-1]
    if not backward:
        backward.append(_backward_plans(out.view(ln_out.shape[0], -1), ln_out, weight))
    ctx.backward_plans = backward[0]
    return out, mean, rstd


layer_norm_linear_forward.register_autograd(_backward, setup_context=_setup_context)
layer_norm_linear_forward.register_planned_forward(_forward_planned)


def _launch_ready(ready, x, ln_weight, ln_bias, weight, bias):
    """``(out, ln_out, mean, rstd)`` of checked operands of a kept signature (:func:`_ready`):
    layer_norm's launch, then the product's."""
    n_rows, n_cols, out_shape, ln_plan, plan, _ = ready
    x2d = x if x.dim() == 2 else x.view(n_rows, n_cols)  # contiguous
    out = x.new_empty(out_shape)
    out2d = out if out.dim() == 2 else out.view(n_rows, -1)
    ln_out, mean, rstd = launch_planned_forward(ln_plan, x2d, ln_weight, ln_bias, n_rows)
    with runtime.device_guard(x):
        plan.launch_eager(ln_out, weight.t(), out2d, bias if bias is not None else out2d, out2d)
    return out, ln_out, mean, rstd


def _ready(x, ln_weight, ln_bias, weight, bias, eps: float, out):
    """What a repeated eager call of these layouts needs (:func:`_launch_ready`): ``(rows,
    columns, out's shape, layer_norm's plan, the product's plan, [the backward's plans])``, or
    False where the call launches otherwise (a copy of a strided operand, an empty result,
    launch_matmul's general path)."""
    K, N = x.shape[-1], weight.shape[0]
    M = _n_rows(x)
    if not (M and N and K and x.is_contiguous()) or any(
            t is not None and not t.is_contiguous() for t in (ln_weight, ln_bias)):
        return False
    x2d = x.view(M, K)
    ln_out = torch.empty_like(x2d)  # its layout
    plan = product_plan(ln_out, weight.t(), out.view(M, N), bias, "none", 0.0)
    if plan is None:
        return False
    return (M, K, out.shape, layer_norm_family.forward_plan(M, K, eps, x2d, ln_weight, ln_bias),
            plan, [])


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
def _call_key(x, ln_weight, ln_bias, weight, bias, eps):
    """Everything the checks read."""
    return (layout_key(x), layout_key(ln_weight), layout_key(ln_bias), layout_key(weight),
            layout_key(bias), eps, type(eps))


def _check_args(x, ln_weight, ln_bias, weight, bias, eps) -> bool:
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension (..., in_features), got a scalar")
    runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=2)
    runtime.check_same_dtype(x=x, weight=weight)
    K, N = x.shape[-1], weight.shape[0]
    if weight.shape[1] != K:
        raise ValueError(
            f"x has in_features={K} but weight has in_features={weight.shape[1]} "
            f"(weight is (out_features, in_features) = {tuple(weight.shape)})"
        )
    for name, t, size, what in (
        ("ln_weight", ln_weight, K, "in_features"),
        ("ln_bias", ln_bias, K, "in_features"),
        ("bias", bias, N, "out_features"),
    ):
        if t is None:
            continue
        runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES_WITH_FP64, ndim=1)
        if t.shape[0] != size:
            raise ValueError(f"{name} must have shape ({what},) = ({size},), got {tuple(t.shape)}")
    runtime.check_same_device(x=x, ln_weight=ln_weight, ln_bias=ln_bias, weight=weight, bias=bias)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return True


@runtime.follows_autocast(layer_norm_linear_forward)
def layer_norm_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.linear(F.layer_norm(x, (K,), ln_weight, ln_bias, eps), weight, bias)``, fused.

    ``x`` is (..., K); ``weight`` (N, K) of x's dtype (fp16, bf16 or fp32; fp32 follows
    PyTorch's TF32 setting like :func:`~triton_workshop.ops.matmul.matmul`); ``ln_weight`` and
    ``ln_bias`` (K,) and ``bias`` (N,) of any float dtype, each optional (None: 1, 0, 0). Returns
    (..., N) in x's dtype, with the numerics of the unfused PyTorch pair; the backward saves no
    normalised activations (docs/kernels/layer_norm_linear.md). Differentiable in all five tensors, and
    traceable by ``torch.compile``.
    """
    path = layer_norm_linear_forward.eager_path(x, ln_weight, ln_bias, weight, bias)
    key = ready = None
    if path:  # an eager call of layouts seen before: straight to the launches
        try:
            key = (x.shape, x.stride(), x.dtype, x.device, x.layout, _strided_key(ln_weight),
                   _strided_key(ln_bias), _strided_key(weight), weight.storage_offset() & 15,
                   _strided_key(bias), eps, type(eps), tf32_enabled(),
                   layer_norm_family.TUNING, matmul_family.TUNING)
            ready = _READY.get(key)
        except UNKEYABLE:
            key = None
        if ready:
            if path == runtime.RECORD:
                return layer_norm_linear_forward.record_planned(x, ln_weight, ln_bias, weight,
                                                                bias, ready)[0]
            return _launch_ready(ready, x, ln_weight, ln_bias, weight, bias)[0]
    _CALLS.checked(_call_key, _check_args, x, ln_weight, ln_bias, weight, bias, eps)
    out, _, _ = layer_norm_linear_forward(x, ln_weight, ln_bias, weight, bias, float(eps))
    if key is not None and ready is None:  # not False: a call that launches otherwise
        _READY.remember(key, _ready(x, ln_weight, ln_bias, weight, bias, float(eps), out))
    return out


def _strided_key(t):
    """A tensor's layout and strides (None for None)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.layout)


#: layer_norm_linear's checked call signatures.
_CALLS = SignatureCache()
#: Eager calls' layouts (the checks' and the plans'), eps, the TF32 setting and the tuning
#: objects of layer_norm and matmul -> :func:`_ready`.
_READY = SignatureCache()
