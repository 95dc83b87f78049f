"""Matrix multiplication with the epilogue fused in: ``dropout(act(a @ b + bias))`` in one kernel.

The matmul family's host code: the registered op with its autograd (the backward redraws the
epilogue's dropout mask from its seed) and the public :func:`matmul` and :func:`linear`. The
tuning object (:class:`MatmulTuning`, :data:`TUNING`) is in :mod:`.tuning`; the launcher other
families call (:func:`launch_matmul`) in :mod:`.product`, with the operands' layout in
:mod:`.operands` and Hopper's TMA path in :mod:`.tma`; dropout's backward in :mod:`.dropout`. The
kernels are in :mod:`.kernels`; why they look as they do (tiles, grouped ordering, ragged shapes,
TF32, the backward, dropout) is told in docs/kernels/matmul.md.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES, register_op
from .._common import (
    UNKEYABLE,
    FamilyPackage,
    SignatureCache,
    dropout_seed,
    join_family,
    layout_key,
)
from . import dropout, kernels, operands, product, tma, tuning
from .dropout import dropout_keep_mask as dropout_keep_mask
from .dropout import dropout_scaled, matmul_dropout_backward
from .kernels import (
    CONFIGS,
    MAX_BLOCK,
    dropout_scale_kernel,
    grouped_tile,
    matmul_kernel,
    matmul_tma_kernel,
    pad_copy_kernel,
    prune_configs,
)
from .product import (
    input_precision,
    launch_matmul,
    out_shape,
    product_plan,
    tf32_enabled,
)
from .tuning import TUNING, MatmulTuning

__all__ = [
    "ACTIVATIONS", "CONFIGS", "MAX_BLOCK", "MatmulTuning", "TUNING", "check_activation",
    "check_dropout_p", "dropout_scale_kernel", "grouped_tile", "input_precision",
    "launch_matmul", "linear", "matmul", "matmul_kernel", "matmul_tma_kernel",
    "pad_copy_kernel", "prune_configs", "tf32_enabled",
]

#: Public activation names; ``None`` means none. Inside the registered op "none" stands for None,
#: because a torch.library schema has no optional string with a meaning of its own.
ACTIVATIONS = ("relu", "leaky_relu", "gelu")
_OP_ACTIVATIONS = ("none",) + ACTIVATIONS
_BIAS_DTYPES = FLOAT_DTYPES + (torch.float64,)


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by the public functions below).
# --------------------------------------------------------------------------------------------
def _activation_torch(z: torch.Tensor, activation: str, slope: float) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(z)
    if activation == "leaky_relu":
        return torch.nn.functional.leaky_relu(z, slope)
    if activation == "gelu":
        return torch.nn.functional.gelu(z, approximate="tanh")
    return z


def _matmul_fake(a, b, bias, activation, slope, dropout_p=0.0, seed=None):
    return a.new_empty(out_shape(a, b))


@register_op("matmul", fake=_matmul_fake, autocast="lower_precision_fp")  # as torch.matmul
def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: str,
    slope: float,
    dropout_p: float = 0.0,
    seed: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    if activation not in _OP_ACTIVATIONS:
        raise ValueError(f"activation must be one of {_OP_ACTIVATIONS}, got {activation!r}")
    if dropout_p > 0 and seed is None:
        raise ValueError("seed must be a tensor (one int64 on a's device) when dropout_p > 0")
    if a.dim() == 2 and b.dim() == 2:  # the common case, without out_shape's batch logic
        M, K = a.shape
        N = b.shape[1]
        shape, batch = (M, N), 1
    else:
        shape = out_shape(a, b)
        M, K = a.shape[-2:]
        N = b.shape[-1]
        batch = 1 if len(shape) == 2 else shape[0]

    if M == 0 or N == 0 or batch == 0:
        return a.new_empty(shape)
    if K == 0:
        # An empty sum is 0, so the result is the epilogue applied to zeros: no kernel needed.
        z = torch.zeros(shape, dtype=torch.float32, device=a.device)
        if bias is not None:
            z = z + bias.to(torch.float32)
        z = _activation_torch(z, activation, slope)
        if dropout_p > 0:
            z = dropout_scaled(z, seed, dropout_p)
        return z.to(a.dtype)

    out = a.new_empty(shape)
    return launch_matmul(a, b, out, bias=bias, activation=activation, slope=slope,
                         dropout_p=dropout_p, seed=seed)


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _needs_preactivation(activation: str, slope: float) -> bool:
    # ReLU and leaky ReLU with slope >= 0 keep the sign of their input: out > 0 exactly when
    # Z > 0, so the output alone tells which branch each element took.
    return activation == "gelu" or (activation == "leaky_relu" and slope < 0)


def _matmul_setup_context(ctx, inputs, output):
    # Five inputs where the caller left dropout's two at their defaults (an eager call), seven
    # otherwise (torch's dispatcher fills the defaults in).
    a, b, bias, activation, slope = inputs[:5]
    dropout_p = inputs[5] if len(inputs) > 5 else 0.0
    seed = inputs[6] if len(inputs) > 6 else None
    ctx.activation = activation
    ctx.slope = slope
    ctx.dropout_p = dropout_p
    # With dropout, the output is still enough for ReLU's and leaky ReLU's gradient: where it is
    # 0 because the element was dropped, the masked gradient is 0 whichever branch is taken.
    keep_output = activation != "none" and not _needs_preactivation(activation, slope)
    ctx.save_for_backward(a, b, bias, output if keep_output else None,
                          seed if dropout_p > 0 else None)


def _preactivation_grad(ctx, grad, a, b, bias, out, z_plan=None):
    activation, slope = ctx.activation, ctx.slope
    if activation == "none":
        return grad
    if not _needs_preactivation(activation, slope):
        negative_side = grad * slope if activation == "leaky_relu" else 0.0
        return torch.where(out > 0, grad, negative_side)
    # Recompute Z = A @ B + bias instead of having saved it (docs/kernels/matmul.md, Autograd).
    if z_plan is not None:
        # The eager forward's plan for it (:func:`_backward_plans`): an allocation and a
        # launch, where the registered op would find its plan again on autograd's device thread.
        z = a.new_empty(grad.shape)  # 2-D, laid out as the forward's output
        z_plan.launch_eager(a, b, z, bias if bias is not None else z, z)
    else:
        z = _matmul(a, b, bias, "none", 0.0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    return torch.where(z > 0, grad, grad * slope)


def _matmul_backward(ctx, grad):
    a, b, bias, out, seed = ctx.saved_tensors
    if ctx.dropout_p > 0:
        # The mask is redrawn from the seed, never stored (see dropout_scale_kernel).
        grad = matmul_dropout_backward(grad, seed, ctx.dropout_p)
    planned = getattr(ctx, "backward_plans", None)
    # Not under autocast: there the registered op casts the backward's operands.
    if planned is not None and not (runtime.eager_backward() and not runtime.any_autocast()):
        planned = None
    grad_z = _preactivation_grad(ctx, grad, a, b, bias, out,
                                 planned[3] if planned is not None else None)
    if planned is not None and grad_z.dtype is a.dtype and grad_z.stride() == planned[0]:
        grad_a, grad_b = _planned_products(ctx, planned, grad_z, a, b)
    else:
        grad_a, grad_b = _products(ctx, grad_z, a, b)
    grad_bias = None
    if bias is not None and ctx.needs_input_grad[2]:
        rows = 0 if grad_z.dim() == 2 else tuple(range(grad_z.dim() - 1))
        grad_bias = grad_z.sum(dim=rows, dtype=torch.float32)
        if bias.dtype is not torch.float32:
            grad_bias = grad_bias.to(bias.dtype)
    return grad_a, grad_b, grad_bias, None, None, None, None


def _planned_products(ctx, planned, grad_z, a, b):
    """The backward's products of a 2-D product with the plans its eager forward found
    (:func:`_backward_plans`): only allocations and launches. Autograd runs a CUDA backward on
    its device thread, already on the operands' device."""
    _, plan_a, plan_b, _ = planned
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        if plan_a is None:
            grad_a = _matmul(grad_z, b.t(), None, "none", 0.0)
        else:
            grad_a = grad_z.new_empty(a.shape)  # out of launch_matmul: bias and seed unused
            plan_a.launch_eager(grad_z, b.t(), grad_a, grad_a, grad_a)
    if ctx.needs_input_grad[1]:
        if plan_b is None:
            grad_b = _matmul(a.t(), grad_z, None, "none", 0.0)
        else:
            grad_b = grad_z.new_empty(b.shape)
            plan_b.launch_eager(a.t(), grad_z, grad_b, grad_b, grad_b)
    return grad_a, grad_b


def _backward_plans(a, b, out, bias, recompute: bool):
    """``(the incoming gradient's strides, dA's plan, dB's plan, the plan recomputing Z = A @ B
    + bias or None)`` of a 2-D product's backward for the usual case of a gradient laid out like
    ``out`` (contiguous, its dtype), a plan None where that product takes launch_matmul's
    general path (copies, TMA). ``recompute``: the activation's gradient needs Z."""
    grad_z = out  # a stand-in: the layout and dtype of the gradient (and of the recomputed Z)
    return (out.stride(),
            product_plan(grad_z, b.t(), out.new_empty(a.shape), None, "none", 0.0),
            product_plan(a.t(), grad_z, out.new_empty(b.shape), None, "none", 0.0),
            product_plan(a, b, out, bias, "none", 0.0) if recompute else None)


def _products(ctx, grad_z, a, b):
    """The backward's products through the registered op (any layout, any path)."""
    grad_a = grad_b = None
    # The op itself, not the public matmul: these operands are the forward's, already checked,
    # and the checks would run again on autograd's device thread, where Python costs the most.
    plain = a.dim() == 2 and b.dim() == 2  # no batch to broadcast or sum over
    if ctx.needs_input_grad[0]:
        grad_a = _matmul(grad_z, b.t() if plain else b.transpose(-1, -2), None, "none", 0.0)
        if not plain:
            grad_a = grad_a.sum_to_size(a.shape)
    if ctx.needs_input_grad[1]:
        if plain:
            grad_b = _matmul(a.t(), grad_z, None, "none", 0.0)
        elif b.dim() == 2 and a.dim() == 3:
            # b was shared by every batch: one (K, B*M) @ (B*M, N) product sums over the batch
            # inside the fp32 accumulator instead of materialising B partial gradients.
            # Explicit row counts: reshape(-1, 0) is ambiguous when K or N is 0.
            K, N = b.shape
            rows = a.shape[0] * a.shape[1]
            grad_b = _matmul(a.reshape(rows, K).t(), grad_z.reshape(rows, N), None, "none", 0.0)
        else:
            grad_b = _matmul(a.transpose(-1, -2), grad_z, None, "none", 0.0).sum_to_size(b.shape)
    return grad_a, grad_b


def _matmul_forward_planned(ctx, a, b, bias, ready, slope):
    """The eager autograd forward of a kept signature (:func:`_launch_ready`'s ``RECORD``
    path): :func:`_matmul` and :func:`_matmul_setup_context` with the plans kept for it (a 2-D
    product's backward plans found at the first such call)."""
    activation, _, shape, plan, backward = ready
    out = a.new_empty(shape)
    with runtime.device_guard(a):  # bias and seed placeholders: out (never read)
        plan.launch_eager(a, b, out, bias if bias is not None else out, out)
    ctx.activation = activation
    ctx.slope = slope
    ctx.dropout_p = 0.0
    keep_output = activation != "none" and not _needs_preactivation(activation, slope)
    ctx.save_for_backward(a, b, bias, out if keep_output else None, None)
    if len(shape) == 2 and a.dim() == 2:
        if not backward:
            backward.append(_backward_plans(a, b, out, bias,
                                            _needs_preactivation(activation, slope)))
        ctx.backward_plans = backward[0]
    return out


_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup_context)
_matmul.register_planned_forward(_matmul_forward_planned)


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------
def check_activation(activation, leaky_relu_slope) -> str:
    if activation is None or activation == "none":
        op_activation = "none"
    elif isinstance(activation, str) and activation in ACTIVATIONS:
        op_activation = activation
    else:
        valid = ", ".join(["None"] + [repr(name) for name in ACTIVATIONS])
        raise ValueError(f"activation must be one of {valid}; got {activation!r}")
    if isinstance(leaky_relu_slope, bool) or not isinstance(leaky_relu_slope, (int, float)):
        raise TypeError(
            f"leaky_relu_slope must be a float, got {type(leaky_relu_slope).__name__}"
        )
    return op_activation


def check_dropout_p(dropout_p) -> float:
    """``dropout_p`` as a float in [0, 1); TypeError/ValueError naming it otherwise."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0 <= dropout_p < 1:  # NaN fails this too
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return float(dropout_p)


def _check_matmul_args(a, b, bias, activation, leaky_relu_slope) -> str:
    runtime.check_tensor(a, "a", dtypes=FLOAT_DTYPES, ndim=(2, 3))
    runtime.check_tensor(b, "b", dtypes=FLOAT_DTYPES, ndim=(2, 3))
    runtime.check_same_dtype(a=a, b=b)
    if bias is not None:
        runtime.check_tensor(bias, "bias", dtypes=_BIAS_DTYPES, ndim=1)
    runtime.check_same_device(a=a, b=b, bias=bias)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"a has K={a.shape[-1]} but b has K={b.shape[-2]}: inner dimensions must match "
            f"(a is {tuple(a.shape)}, b is {tuple(b.shape)})"
        )
    if a.dim() == 3 and b.dim() == 3 and 1 not in (a.shape[0], b.shape[0]):
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"batch sizes differ: a has batch {a.shape[0]} but b has batch {b.shape[0]} "
                "(they must be equal, or one of them 1)"
            )
    _check_bias_shape(bias, b.shape[-1])
    return check_activation(activation, leaky_relu_slope)


def _check_bias_shape(bias, n: int) -> None:
    if bias is not None and bias.shape[0] != n:
        raise ValueError(f"bias must have shape (N,) = ({n},) to match b, got {tuple(bias.shape)}")


@runtime.follows_autocast(_matmul)
def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    leaky_relu_slope: float = 0.01,
) -> torch.Tensor:
    """``activation(a @ b + bias)`` in one Triton kernel.

    ``a`` is (M, K) or (B, M, K), ``b`` is (K, N) or (B, K, N); a 2-D operand or a batch of 1 is
    broadcast against the other's batch. Any strides (transposed, sliced views are read in place).
    fp16, bf16 or fp32, both the same; the result has that dtype, accumulated in fp32 (fp32 inputs
    follow ``torch.backends.cuda.matmul.allow_tf32``). ``bias`` is (N,), any float dtype.
    ``activation`` is None, ``"relu"``, ``"leaky_relu"`` (negative slope ``leaky_relu_slope``) or
    ``"gelu"`` (tanh approximation). Differentiable in ``a``, ``b`` and ``bias``.
    """
    path = _matmul.eager_path(a, b, bias)
    key = ready = None
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            key = (a.shape, a.stride(), a.storage_offset() & 15, a.dtype, a.device, a.layout,
                   b.shape, b.stride(), b.storage_offset() & 15, b.dtype, b.device, b.layout,
                   None if bias is None else (bias.shape, bias.stride(), *layout_key(bias)[1:]),
                   activation, type(activation), leaky_relu_slope, type(leaky_relu_slope),
                   tf32_enabled())
            ready = _READY.under(TUNING).get(key)
        except UNKEYABLE:
            key = ready = None
        if ready:
            return _launch_ready(path, ready, a, b, bias)
    op_activation = _check_matmul_args(a, b, bias, activation, leaky_relu_slope)
    slope = float(leaky_relu_slope)
    out = _matmul(a, b, bias, op_activation, slope)
    if key is not None and ready is None:  # not False: a product of the general path
        _READY.remember(key, _ready(a, b, out, bias, op_activation, slope))
    return out


def _ready(a, b, out, bias, activation: str, slope: float):
    """What a repeated eager product of these operands' layouts needs (:func:`_launch_ready`):
    ``(activation, slope, out's shape, the product's plan, its backward's plans, found at the
    first call that records)``; False where the product takes launch_matmul's general path
    (copies, TMA) or launches nothing (an empty result, K = 0)."""
    if not out.numel() or not a.shape[-1]:
        return False
    plan = product_plan(a, b, out, bias, activation, slope)
    return False if plan is None else (activation, slope, out.shape, plan, [])


def _launch_ready(path, ready, a, b, bias) -> torch.Tensor:
    """The product of checked operands of a kept signature (:func:`_ready`): its plan launched,
    or its autograd Function applied with it (``path`` ``RECORD``)."""
    if path == runtime.RECORD:
        return _matmul.record_planned(a, b, bias, ready, ready[1])
    out = a.new_empty(ready[2])
    with runtime.device_guard(a):  # bias and seed placeholders: out (never read)
        ready[3].launch_eager(a, b, out, bias if bias is not None else out, out)
    return out


#: Eager products' layouts (everything the checks read, the strides and 16-byte offsets the
#: plan depends on), epilogue and TF32 setting -> :func:`_ready`.
_READY = SignatureCache()


@runtime.follows_autocast(_matmul)  # as F.linear
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    leaky_relu_slope: float = 0.01,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``dropout(activation(x @ weight.T + bias))``, like ``torch.nn.functional.linear`` plus an
    activation and dropout, in one kernel.

    ``x`` is (..., in_features), ``weight`` (out_features, in_features). The leading dimensions of
    ``x`` are flattened into M (one large product fills the GPU better than many small ones) and
    ``weight.T`` is read in place, without a copy. A 3-D ``x`` whose leading dimensions cannot be
    merged without a copy (``x.transpose(0, 1)``, say) runs as a batched product against the
    shared weight instead, also without a copy.

    ``dropout_p`` in [0, 1): with ``dropout_p > 0`` each output element is zeroed with that
    probability and the kept ones scaled by ``1 / (1 - dropout_p)``, always (as
    ``F.dropout(training=True)``: whether a model is training is the caller's business). The
    mask comes from Philox, seeded from torch's default generator of x's device at each call, so
    ``torch.manual_seed`` repeats a run; the backward redraws it from the seed instead of keeping
    it. ``dropout_p=0`` is the plain kernel, compiled without dropout.
    """
    path = _matmul.eager_path(x, weight, bias)
    call = key = None
    if not _is_compiling():
        # A call signature seen before was checked then: everything the checks read is in the
        # key (shapes, strides, dtypes, devices, layouts, the activation, the slope, dropout's
        # probability and their types), and what its kept product depends on (the 16-byte
        # offsets, TF32).
        try:
            key = (x.shape, x.stride(), x.storage_offset() & 15, x.dtype, x.device, x.layout,
                   weight.shape, weight.stride(), weight.storage_offset() & 15, weight.dtype,
                   weight.device, weight.layout,
                   None if bias is None else (bias.shape, bias.stride(), *layout_key(bias)[1:]),
                   activation, leaky_relu_slope, type(leaky_relu_slope),
                   dropout_p, type(dropout_p), tf32_enabled())
            call = _LINEAR_CALLS.under(TUNING).get(key)
        except UNKEYABLE:  # not tensors, no strides: checked below
            key = None
    checked = call is None
    if checked:
        call = (*_check_linear(x, weight, bias, activation, leaky_relu_slope, dropout_p), None)
    op_activation, slope, rows_kind, p, ready = call
    rows = x if rows_kind == _ROWS_AS_IS else x[None] if rows_kind == _ROWS_OF_VECTOR \
        else x.flatten(0, -2)
    if ready and path:  # an eager call of a kept signature: straight to the launch
        out = _launch_ready(path, ready, rows, weight.t(), bias)
    else:
        # Dropout's two arguments only when it is on: the call without them is today's op call.
        dropout = (p, dropout_seed(x.device)) if p > 0 else ()
        weight_t = weight.t()
        out = _matmul(rows, weight_t, bias, op_activation, slope, *dropout)
        if key is not None and (checked or (ready is None and path and not p)):
            # Kept: the checks' conclusions, and (eager, no dropout) the product's plans.
            _LINEAR_CALLS.remember(key, (*call[:4], _ready(
                rows, weight_t, out, bias, op_activation, slope) if path and not p else None))
    # 2-D, or 3-D run as a batched product: out has x's lead dims.
    return out if rows_kind == _ROWS_AS_IS else out.reshape(*x.shape[:-1], weight.shape[0])


_is_compiling = torch.compiler.is_compiling
#: linear's checked call signatures (see linear): what the checks concluded, and the kept
#: product's :func:`_ready` (None: not known yet).
_LINEAR_CALLS = SignatureCache()
#: How linear hands x to the product: as it is (2-D, or 3-D whose leading dims cannot merge
#: without a copy: a batched product against the shared weight), as one row, or flattened.
_ROWS_AS_IS, _ROWS_OF_VECTOR, _ROWS_FLATTENED = range(3)


def _check_linear(x, weight, bias, activation, leaky_relu_slope,
                  dropout_p) -> tuple[str, float, int, float]:
    """linear's argument checks; ``(op activation, slope, how x becomes rows, dropout_p)``."""
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=2)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension, got a scalar")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has in_features={x.shape[-1]} but weight has in_features={weight.shape[1]} "
            f"(weight is (out_features, in_features) = {tuple(weight.shape)})"
        )
    runtime.check_same_dtype(x=x, weight=weight)
    if bias is not None:
        runtime.check_tensor(bias, "bias", dtypes=_BIAS_DTYPES, ndim=1)
    runtime.check_same_device(x=x, weight=weight, bias=bias)
    _check_bias_shape(bias, weight.shape[0])
    op_activation = check_activation(activation, leaky_relu_slope)
    p = check_dropout_p(dropout_p)
    if x.dim() == 1:
        rows_kind = _ROWS_OF_VECTOR
    elif x.dim() == 2 or (x.dim() == 3 and x.shape[0] > 1 and x.shape[1] > 1
                          and x.stride(0) != x.stride(1) * x.shape[1]):
        rows_kind = _ROWS_AS_IS  # 2-D; or flattening would copy
    else:
        rows_kind = _ROWS_FLATTENED
    return op_activation, float(leaky_relu_slope), rows_kind, p


# --------------------------------------------------------------------------------------------
# The package's names: the family's modules' too.
# --------------------------------------------------------------------------------------------
#: The module switches these fields replaced, readable under their old names (for scripts that
#: print them); setting one raises, since it would no longer change anything.
_FORMER_SWITCHES = {
    "TMA_MATMUL": ("tma_matmul", lambda t: t.tma_matmul),
    "ALIGN_OPERANDS": ("align_operands", lambda t: t.align_operands),
    "TMA_CONFIG": ("tma_block_m=..., tma_block_n=...", lambda t: t.tma_config()),
}
#: Names the package had before its host code was split into modules, and where each lives now.
#: The package keeps them (tests and scripts read and replace them here).
_MOVED = {
    "_aligned": (operands, "aligned"),
    "_grain": (operands, "grain"),
    "_is_aligned": (operands, "is_aligned"),
    "_pad_copy_plan": (operands, "pad_copy_plan"),
    "_is_hopper": (tma, "is_hopper"),
    "_launch_matmul_tma": (tma, "launch_matmul_tma"),
    "_use_tma": (tma, "use_tma"),
    "wrap_triton": (tma, "wrap_triton"),
    "_new_product_plan": (product, "new_product_plan"),
    "_product_plan": (product, "product_plan"),
}
globals().update({name: getattr(module, moved) for name, (module, moved) in _MOVED.items()})


def __getattr__(name: str):
    if name in _FORMER_SWITCHES:
        return _FORMER_SWITCHES[name][1](TUNING)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _MatmulPackage(FamilyPackage):
    """The family package (:class:`.._common.FamilyPackage`) that refuses its former switches."""

    def __setattr__(self, name: str, value) -> None:
        if name in _FORMER_SWITCHES:
            raise AttributeError(
                f"{name} is now a field of {__name__}.TUNING: set it with monkeypatch.setattr("
                f"matmul, 'TUNING', dataclasses.replace(matmul.TUNING, "
                f"{_FORMER_SWITCHES[name][0]}))")
        super().__setattr__(name, value)


#: The family's modules: a name set on the package is set in each of them that holds it.
join_family(__name__, (tuning, kernels, operands, tma, product, dropout),
            {name: moved for name, (_, moved) in _MOVED.items()}, base=_MatmulPackage)
