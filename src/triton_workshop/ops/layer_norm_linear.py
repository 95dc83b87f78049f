"""LayerNorm followed by Linear, in one op whose backward keeps no normalised activations.

    out = F.linear(F.layer_norm(x, (K,), ln_weight, ln_bias, eps), weight, bias)

for ``x`` of shape (..., K) and ``weight`` (N, K): the block that opens every pre-norm
transformer layer (``ln -> qkv``, ``ln -> mlp.fc1``).

**Forward**: :func:`~triton_workshop.ops.layer_norm.layer_norm_forward` writes the normalised
activations in x's dtype (with one ``mean`` and ``rstd`` per row), and
:func:`~triton_workshop.ops.matmul.launch_matmul` multiplies them by ``weightᵀ`` with ``bias`` in
its epilogue. The normalised activations are a temporary, freed when the forward returns.

**Why not the folded epilogue.** Algebra can move LayerNorm past the product,
``rstd·(x @ W'ᵀ) − rstd·mean·c1 + c2`` with ``W' = W·g`` and ``c1`` its row sums, so that the
normalised activations are never written. But the product then runs over the raw ``x``: its fp32
accumulator holds partial sums of size ``|mean|·|w|·√k`` while the result is of size ``std``, and
the rounding of those sums (``2⁻²⁴ · √K · |mean| / std`` relative) cancels catastrophically on rows
far from zero (a residual stream with an offset: at ``|mean| / std = 1e4`` the error was 0.13-0.38,
against PyTorch's 5e-3). Centring the A tiles inside the main loop would fix the numerics at the
price of the loop every matmul shares. The unfused pair moves one write and one read of M x K
more than the folded form, and on an H100 measured the same within noise at the benchmark sizes
(docs/results.md): the product dominates. Numerics are then exactly the unfused PyTorch pair's:
the normalised activations rounded to x's dtype, a product accumulated in fp32.

**Backward** recomputes ``ln_out = xhat·g + b`` from the saved ``mean``/``rstd``, then

    dW = dYᵀ @ ln_out,   dbias = Σ_rows dY,   d_ln_out = dY @ W,

through :func:`~triton_workshop.ops.matmul.matmul`, and ``(dx, dg, db)`` come from
:func:`~triton_workshop.ops.layer_norm.layer_norm_backward` (deterministic). Saved for backward:
``x``, the parameters and 8 bytes a row, never an M x K activation.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op
from .layer_norm import layer_norm_backward, layer_norm_forward
from .matmul import launch_matmul, matmul

_PARAM_DTYPES = FLOAT_DTYPES + (torch.float64,)


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
    epilogue (see the module docstring)."""
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
    if need_w:
        # The backward may materialise the normalised activations the forward never wrote.
        ln_out = (x2d.float() - mean[:, None]) * rstd[:, None]
        if ln_weight is not None:
            ln_out = ln_out * ln_weight.float()
        if ln_bias is not None:
            ln_out = ln_out + ln_bias.float()
        d_weight = matmul(dy.t(), ln_out.to(x.dtype))
    if need_bias:
        d_bias = dy.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
    if need_x or need_g or need_b:
        d_ln_out = matmul(dy, weight)
        dx, dg, db = layer_norm_backward(
            d_ln_out, x2d, ln_weight, mean, rstd, 1, need_x, need_g, need_b
        )
        dx = dx.view(x.shape) if need_x else None
        d_ln_weight = dg.to(ln_weight.dtype) if need_g else None
        d_ln_bias = db.to(ln_bias.dtype) if need_b else None
    return dx, d_ln_weight, d_ln_bias, d_weight, d_bias, None


layer_norm_linear_forward.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
def _check_args(x, ln_weight, ln_bias, weight, bias, eps) -> None:
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
        runtime.check_tensor(t, name, dtypes=_PARAM_DTYPES, ndim=1)
        if t.shape[0] != size:
            raise ValueError(f"{name} must have shape ({what},) = ({size},), got {tuple(t.shape)}")
    runtime.check_same_device(x=x, ln_weight=ln_weight, ln_bias=ln_bias, weight=weight, bias=bias)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


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
    normalised activations (see the module docstring). Differentiable in all five tensors, and
    traceable by ``torch.compile``.
    """
    _check_args(x, ln_weight, ln_bias, weight, bias, eps)
    out, _, _ = layer_norm_linear_forward(x, ln_weight, ln_bias, weight, bias, float(eps))
    return out
