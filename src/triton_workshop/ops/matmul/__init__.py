"""Matrix multiplication with the epilogue fused in: ``dropout(act(a @ b + bias))`` in one kernel.

The matmul family's host code: the registered op with its autograd (the backward redraws the
epilogue's dropout mask from its seed; its products, with no epilogue to fuse, are torch's GEMMs)
and the public :func:`matmul` and :func:`linear`. The
tuning object (:class:`MatmulTuning`, :data:`TUNING`) is in :mod:`.tuning`; the launcher other
families call (:func:`launch_matmul`) in :mod:`.product`, with the operands' layout in
:mod:`.operands` and Hopper's TMA path in :mod:`.tma`; dropout's backward in :mod:`.dropout`, the
backward's products in :mod:`.grads`. The
kernels are in :mod:`.kernels`; why they look as they do (tiles, grouped ordering, ragged shapes,
TF32, the backward, dropout) is told in docs/kernels/matmul.md.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch
import torch.nn.functional as F

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
from . import autocast_grads, dropout, grads, kernels, operands, product, tma, tuning
from .autocast_grads import autocast_linear
from .dropout import dropout_keep_mask as dropout_keep_mask
from .dropout import dropout_scaled, matmul_dropout_backward
from .grads import bias_grad, column_major, products
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
    "ACTIVATIONS", "CONFIGS", "MAX_BLOCK", "MatmulTuning", "TUNING", "autocast_linear",
    "check_activation",
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
# traces them), so the tests see the GPU's backward. The products are in :mod:`.grads`.
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


def _preactivation(a, b, bias, linear: bool = False):
    """``Z = a @ b + bias`` in a's dtype, by torch (see the section's note); for ``linear``
    (a kept linear's operands: ``b`` is the weight) ``Z = a @ b.T + bias``."""
    if linear:
        if bias is None or bias.dtype is a.dtype:
            return F.linear(a, b, bias)
        return F.linear(a, b).add_(bias)
    if a.dim() == 2 and b.dim() == 2:
        if bias is None:
            return torch.mm(a, b)
        if bias.dtype is a.dtype:
            return torch.addmm(bias, a, b)  # the bias in the GEMM's epilogue
    # A batch, or a bias of another dtype: added in the promoted dtype, then rounded to a's.
    z = torch.matmul(a, b)
    return z if bias is None else z.add_(bias)


def _preactivation_grad(activation, slope, grad, a, b, bias, out, linear: bool = False):
    if activation == "none":
        return grad
    if not _needs_preactivation(activation, slope):
        negative_side = grad * slope if activation == "leaky_relu" else 0.0
        return torch.where(out > 0, grad, negative_side)
    # Recompute Z = A @ B + bias instead of having saved it (docs/kernels/matmul.md, Autograd).
    z = _preactivation(a, b, bias, linear)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    return torch.where(z > 0, grad, grad * slope)


def _matmul_backward(ctx, grad):
    a, b, bias, out, seed = ctx.saved_tensors
    if ctx.dropout_p > 0:
        # The mask is redrawn from the seed, never stored (see dropout_scale_kernel).
        grad = matmul_dropout_backward(grad, seed, ctx.dropout_p)
    grad_z = _preactivation_grad(ctx.activation, ctx.slope, grad, a, b, bias, out)
    needs = ctx.needs_input_grad
    grad_a, grad_b = products(grad_z, a, b, needs[0], needs[1])
    grad_bias = bias_grad(grad_z, bias) if bias is not None and needs[2] else None
    return grad_a, grad_b, grad_bias, None, None, None, None


class _Kept:
    """What an eager repeat of a checked call signature needs, kept for it (:func:`_kept`): the
    product's plan, the output's shape, the epilogue, whether the backward keeps the output;
    for :func:`linear` whether x and the weight are launched as they are (``linear``: the plan's
    rows are a 2-D view of x and its ``b`` the weight's transpose, read through its strides),
    how the gradients are laid out, and the epilogue's dropout probability (each call draws its
    own seed)."""

    __slots__ = ("activation", "dropout_p", "grad_w_transposed", "grad_x_transposed",
                 "keep_output", "linear", "plan", "shape", "slope")

    def __init__(self, plan, shape, activation, slope, linear, rows, weight_t, dropout_p=0.0):
        self.plan, self.shape, self.linear = plan, shape, linear
        self.activation, self.slope, self.dropout_p = activation, slope, dropout_p
        self.keep_output = activation != "none" and not _needs_preactivation(activation, slope)
        # As _grad_a and _grad_b lay them out: each gradient as its operand.
        self.grad_x_transposed = linear and column_major(rows)
        self.grad_w_transposed = linear and not column_major(weight_t)


def _kept(a, b, out, bias, activation: str, slope: float, x=None, dropout_p: float = 0.0):
    """The :class:`_Kept` of a product of checked operands that ran (``out``), or False where
    it takes launch_matmul's general path (copies, TMA) or launches nothing (an empty result,
    K = 0). ``x``: linear's input, whose rows ``a`` are (``b`` the weight's transpose)."""
    if not out.numel() or not a.shape[-1]:
        return False
    plan = product_plan(a, b, out, bias, activation, slope, dropout_p)
    if plan is None:
        return False
    # linear's x is launched as it is where its rows are a 2-D view of it (not a copy, not a
    # batch): the kernel reads only its address, the strides are the plan's.
    linear = x is not None and a.dim() == 2 and a.data_ptr() == x.data_ptr()
    shape = (*x.shape[:-1], b.shape[1]) if linear else tuple(out.shape)
    return _Kept(plan, shape, activation, slope, linear, a, b, dropout_p)


def _matmul_forward_planned(ctx, a, b, bias, kept, seed=None):
    """The eager autograd forward of a kept signature (``RECORD``): :func:`_matmul` and
    :func:`_matmul_setup_context` with the kept plan; for a linear one ``a`` is x and ``b`` the
    weight, as the public function got them (:func:`_matmul_backward_planned`). ``seed``: the
    call's dropout seed, with dropout."""
    out = _launch_kept_plan(kept, a, b, bias, seed)
    ctx.kept = kept
    ctx.save_for_backward(a, b, bias, out if kept.keep_output else None, seed)
    return out


def _matmul_backward_planned(ctx, grad):
    """The backward of :func:`_matmul_forward_planned`: the op's, and for a linear signature
    the gradients of x (any rank) and the weight as F.linear's backward makes them."""
    a, b, bias, out, seed = ctx.saved_tensors
    kept = ctx.kept
    linear = kept.linear
    if seed is not None:  # the mask redrawn from the forward's seed, as _matmul_backward does
        rows = grad if grad.dim() == 2 else grad.reshape(-1, grad.shape[-1])
        # The op where a double backward records this backward; else its launch, straight.
        rows = (dropout_scaled(rows, seed, kept.dropout_p, True) if runtime.eager_backward()
                else matmul_dropout_backward(rows, seed, kept.dropout_p))
        grad = rows.view(grad.shape)
    grad_z = _preactivation_grad(kept.activation, kept.slope, grad, a, b, bias, out, linear)
    needs = ctx.needs_input_grad
    if not linear:
        grad_a, grad_b = products(grad_z, a, b, needs[0], needs[1])
        grad_bias = bias_grad(grad_z, bias) if bias is not None and needs[2] else None
        return grad_a, grad_b, grad_bias, None, None
    # Linear: a is x (..., K), b the weight (N, K), grad_z (..., N).
    rows_of = grad_z if grad_z.dim() == 2 else grad_z.reshape(-1, b.shape[0])
    grad_x = grad_w = grad_bias = None
    if needs[0]:
        grad_x = (torch.mm(b.t(), rows_of.t()).t() if kept.grad_x_transposed
                  else torch.mm(rows_of, b))
        if a.dim() != 2:
            grad_x = grad_x.reshape(a.shape)
    if needs[1]:
        x_rows = a if a.dim() == 2 else a.reshape(-1, b.shape[1])
        grad_w = (torch.mm(x_rows.t(), rows_of).t() if kept.grad_w_transposed
                  else torch.mm(rows_of.t(), x_rows))
    if bias is not None and needs[2]:
        grad_bias = bias_grad(rows_of, bias)
    return grad_x, grad_w, grad_bias, None, None


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing.
_SAME_DEVICE = runtime.device_guard(torch.empty(0))

_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup_context)
_matmul.register_planned_forward(_matmul_forward_planned, _matmul_backward_planned)


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
    key = kept = None
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            key = (a.shape, a.stride(), a.storage_offset() & 15, a.dtype, a.device, a.layout,
                   b.shape, b.stride(), b.storage_offset() & 15, b.dtype, b.device, b.layout,
                   None if bias is None else (bias.shape, bias.stride(), *layout_key(bias)[1:]),
                   activation, type(activation), leaky_relu_slope, type(leaky_relu_slope),
                   a.dtype is _FP32 and tf32_enabled())
            # _READY.under(TUNING) inline: kept under another tuning, nothing is found.
            kept = _READY.get(key) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            key = kept = None
        if kept:
            return _launch_kept(path, kept, a, b, bias)
    op_activation = _check_matmul_args(a, b, bias, activation, leaky_relu_slope)
    slope = float(leaky_relu_slope)
    out = _matmul(a, b, bias, op_activation, slope)
    if key is not None and kept is None:  # not False: a product of the general path
        _READY.under(TUNING).remember(key, _kept(a, b, out, bias, op_activation, slope))
    return out


_FP32 = torch.float32


def _launch_kept(path, kept, a, b, bias) -> torch.Tensor:
    """The product of checked operands of a kept signature (:class:`_Kept`; for a linear one
    x and the weight): its plan launched, or (``path`` ``RECORD``) its autograd Function applied
    with it."""
    seed = dropout_seed(a.device) if kept.dropout_p else None  # each call's own mask
    if path == runtime.RECORD:
        return _matmul.record_planned(a, b, bias, kept, seed)
    return _launch_kept_plan(kept, a, b, bias, seed)


def _launch_kept_plan(kept, a, b, bias, seed) -> torch.Tensor:
    """A kept signature's product plan launched into a new output, with the call's dropout
    ``seed`` (or None)."""
    out = a.new_empty(kept.shape)
    guard = runtime.device_guard(a)  # bias and seed placeholders: out (never read)
    if guard is _SAME_DEVICE:  # entering the no-op context costs two calls
        kept.plan.launch_eager(a, b, out, bias if bias is not None else out,
                               out if seed is None else seed)
    else:
        with guard:
            kept.plan.launch_eager(a, b, out, bias if bias is not None else out,
                                   out if seed is None else seed)
    return out


#: Eager products' layouts (everything the checks read, the strides and 16-byte offsets the
#: plan depends on), epilogue and TF32 setting (fp32 operands) -> :func:`_kept`.
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
    if path or not _is_compiling():
        # A call signature seen before was checked then: everything the checks read is in the
        # key (shapes, strides, dtypes, devices, layouts, the activation, the slope, dropout's
        # probability and their types), and what its kept product depends on (the 16-byte
        # offsets, TF32 for fp32 operands).
        try:
            key = (x.shape, x.stride(), x.storage_offset() & 15, x.dtype, x.device, x.layout,
                   weight.shape, weight.stride(), weight.storage_offset() & 15, weight.dtype,
                   weight.device, weight.layout,
                   None if bias is None else (bias.shape, bias.stride(), *layout_key(bias)[1:]),
                   activation, leaky_relu_slope, type(leaky_relu_slope),
                   dropout_p, type(dropout_p), x.dtype is _FP32 and tf32_enabled())
            # _LINEAR_CALLS.under(TUNING) inline: kept under another tuning, nothing is found.
            call = _LINEAR_CALLS.get(key) if _LINEAR_CALLS.tuning is TUNING else None
        except UNKEYABLE:  # not tensors, no strides: checked below
            key = None
        if path and call is not None:
            kept = call[4]
            if kept and kept.linear:  # an eager call of a kept signature: x and weight as is
                return _launch_kept(path, kept, x, weight, bias)
    checked = call is None
    if checked:
        call = (*_check_linear(x, weight, bias, activation, leaky_relu_slope, dropout_p), None)
    op_activation, slope, rows_kind, p, kept = call
    rows = x if rows_kind == _ROWS_AS_IS else x[None] if rows_kind == _ROWS_OF_VECTOR \
        else x.flatten(0, -2)
    weight_t = weight.t()
    if kept and path:  # an eager call of a kept signature whose x is a batch, or copied
        out = _launch_kept(path, kept, rows, weight_t, bias)
    else:
        # Dropout's two arguments only when it is on: the call without them is today's op call.
        dropout = (p, dropout_seed(x.device)) if p > 0 else ()
        out = _matmul(rows, weight_t, bias, op_activation, slope, *dropout)
        if key is not None and (checked or (kept is None and path)):
            # Kept: the checks' conclusions, and (eager) the product's plan.
            _LINEAR_CALLS.under(TUNING).remember(key, (*call[:4], _kept(
                rows, weight_t, out, bias, op_activation, slope, x, p) if path else None))
    # 2-D, or 3-D run as a batched product: out has x's lead dims.
    return out if rows_kind == _ROWS_AS_IS else out.reshape(*x.shape[:-1], weight.shape[0])


_is_compiling = torch.compiler.is_compiling
#: linear's checked call signatures (see linear): what the checks concluded, and the kept
#: product's :class:`_Kept` (None: not known yet; False: none, the general path).
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
join_family(__name__, (tuning, kernels, operands, tma, product, dropout, grads, autocast_grads),
            {name: moved for name, (_, moved) in _MOVED.items()}, base=_MatmulPackage)
