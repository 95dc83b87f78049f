"""Matrix multiplication with the epilogue fused in: ``dropout(act(a @ b + bias))`` in one kernel.

The matmul family's host code: the registered op with its autograd (the backward redraws the
epilogue's dropout mask from its seed; its products, with no epilogue to fuse, are torch's GEMMs)
and the public :func:`matmul` and :func:`linear`. The
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
#
# The backward's products go to torch's own GEMMs (torch.mm / addmm / matmul), not to our
# kernel: they have no epilogue to fuse (dA = dZ Bᵀ, dB = Aᵀ dZ, and the recomputed
# Z = A B + bias), cuBLAS runs them faster than our Triton GEMM (80-90% of it on an H100/H200),
# and a C++ torch call on autograd's device thread costs less host time than a Triton launch
# from Python. The same calls run on the CPU (interpreter mode) and under torch.compile (which
# traces them), so the tests see the GPU's backward.
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


def _preactivation(a, b, bias):
    """``Z = a @ b + bias`` in a's dtype, by torch (see the section's note)."""
    if a.dim() == 2 and b.dim() == 2:
        if bias is None:
            return torch.mm(a, b)
        if bias.dtype is a.dtype:
            return torch.addmm(bias, a, b)  # the bias in the GEMM's epilogue
    # A batch, or a bias of another dtype: added in the promoted dtype, then rounded to a's.
    z = torch.matmul(a, b)
    return z if bias is None else z.add_(bias)


def _preactivation_grad(ctx, grad, a, b, bias, out):
    activation, slope = ctx.activation, ctx.slope
    if activation == "none":
        return grad
    if not _needs_preactivation(activation, slope):
        negative_side = grad * slope if activation == "leaky_relu" else 0.0
        return torch.where(out > 0, grad, negative_side)
    # Recompute Z = A @ B + bias instead of having saved it (docs/kernels/matmul.md, Autograd).
    z = _preactivation(a, b, bias)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    return torch.where(z > 0, grad, grad * slope)


def _matmul_backward(ctx, grad):
    a, b, bias, out, seed = ctx.saved_tensors
    if ctx.dropout_p > 0:
        # The mask is redrawn from the seed, never stored (see dropout_scale_kernel).
        grad = matmul_dropout_backward(grad, seed, ctx.dropout_p)
    grad_z = _preactivation_grad(ctx, grad, a, b, bias, out)
    needs = ctx.needs_input_grad
    grad_a, grad_b = _products(grad_z, a, b, needs[0], needs[1])
    grad_bias = None
    if bias is not None and needs[2]:
        rows = 0 if grad_z.dim() == 2 else tuple(range(grad_z.dim() - 1))
        grad_bias = grad_z.sum(dim=rows, dtype=torch.float32)
        if bias.dtype is not torch.float32:
            grad_bias = grad_bias.to(bias.dtype)
    return grad_a, grad_b, grad_bias, None, None, None, None


def _column_major(t) -> bool:
    stride = t.stride()
    return stride[0] == 1 and stride[1] != 1


# Each gradient is laid out as its operand: for linear's b = weight.t() (column-major) dB is
# computed as (dZᵀ A)ᵀ, the same GEMM with other transpose flags, so that the gradient autograd
# hands the weight is row-major as the weight and is kept without a copy.
def _grad_a(grad_z, a, b):
    """dA = dZ Bᵀ (2-D), laid out as ``a``."""
    return torch.mm(b, grad_z.t()).t() if _column_major(a) else torch.mm(grad_z, b.t())


def _grad_b(grad_z, a, b):
    """dB = Aᵀ dZ (2-D), laid out as ``b``."""
    return torch.mm(grad_z.t(), a).t() if _column_major(b) else torch.mm(a.t(), grad_z)


def _products(grad_z, a, b, need_a: bool, need_b: bool):
    """dA = dZ Bᵀ and dB = Aᵀ dZ, each summed over the batch its operand was broadcast across."""
    if a.dim() == 2 and b.dim() == 2:  # no batch to broadcast or sum over
        return (_grad_a(grad_z, a, b) if need_a else None,
                _grad_b(grad_z, a, b) if need_b else None)
    grad_a = grad_b = None
    if need_a:
        grad_a = torch.matmul(grad_z, b.transpose(-1, -2))
        if grad_a.shape != a.shape:
            grad_a = grad_a.sum_to_size(a.shape)
    if need_b:
        if a.dim() == 3 and (b.dim() == 2 or b.shape[0] == 1):
            # b was shared by every batch: one (K, B*M) @ (B*M, N) product sums over the batch
            # inside the GEMM's fp32 accumulator instead of materialising B partial gradients.
            # Explicit row counts: reshape(-1, 0) is ambiguous when K or N is 0.
            K, N = b.shape[-2:]
            rows = a.shape[0] * a.shape[1]
            grad_b = _grad_b(grad_z.reshape(rows, N), a.reshape(rows, K),
                             b if b.dim() == 2 else b[0])
            if b.dim() == 3:
                grad_b = grad_b.unsqueeze(0)
        else:
            grad_b = torch.matmul(a.transpose(-1, -2), grad_z)
            if grad_b.shape != b.shape:
                grad_b = grad_b.sum_to_size(b.shape)
    return grad_a, grad_b


def _matmul_forward_planned(ctx, a, b, bias, ready, slope):
    """The eager autograd forward of a kept signature (:func:`_launch_ready`'s ``RECORD``
    path): :func:`_matmul` and :func:`_matmul_setup_context` with the product's kept plan."""
    activation, _, shape, plan, keep_output = ready
    out = a.new_empty(shape)
    with runtime.device_guard(a):  # bias and seed placeholders: out (never read)
        plan.launch_eager(a, b, out, bias if bias is not None else out, out)
    ctx.activation = activation
    ctx.slope = slope
    ctx.dropout_p = 0.0
    ctx.save_for_backward(a, b, bias, out if keep_output else None, None)
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
    ``(activation, slope, out's shape, the product's plan, whether the backward keeps the
    output)`` (no plans for the backward: its products are torch's); False where the product
    takes launch_matmul's general path (copies, TMA) or launches nothing (an empty result,
    K = 0)."""
    if not out.numel() or not a.shape[-1]:
        return False
    plan = product_plan(a, b, out, bias, activation, slope)
    if plan is None:
        return False
    keep_output = activation != "none" and not _needs_preactivation(activation, slope)
    return activation, slope, out.shape, plan, keep_output


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
