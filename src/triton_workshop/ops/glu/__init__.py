"""Gated linear units, ``swiglu`` and ``geglu``, forward and backward in Triton.

    swiglu(gate, up) = F.silu(gate) * up
    geglu(gate, up, approximate) = F.gelu(gate, approximate=approximate) * up

Host code: the tuning (:class:`GluTuning`), the cached launch plans, the registered ops, the
autograd (it saves ``gate`` and ``up`` and recomputes the activation) and the public functions.
The kernels are in :mod:`.kernels`; why one pass each way is the whole story is in
docs/kernels/glu.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES, LaunchPlan, plan_cache, register_op
from .kernels import GELU, GELU_TANH, SILU, glu_bwd_kernel, glu_fwd_kernel


@dataclass(frozen=True)
class GluTuning:
    """The launch decisions of the GLU ops: part of every plan's key."""

    #: Elements a program owns: a tile of rows x columns (one long row when the operands are
    #: contiguous). 4096 over 8 warps is 16 elements a thread: for fp16/bf16 two 16-byte loads in
    #: flight per operand, for fp32 four.
    tile_elems: int = 4096
    num_warps: int = 8


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = GluTuning()

#: The ``activation`` argument of the registered ops -> the kernels' ``ACTIVATION``.
ACTIVATIONS = {"silu": SILU, "gelu": GELU, "gelu_tanh": GELU_TANH}


def _as_rows(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], int, int]:
    """The operands (of one shape) as ``(n_rows, n_cols)`` views, and ``n_rows, n_cols``.

    Contiguous operands are one row of ``numel`` elements (one flat walk). Otherwise each is
    viewed as ``(-1, last dim)`` with its own strides, so a strided slice (the gate half of a fused
    projection) is read in place; ``reshape`` copies only an operand whose leading dims do not
    collapse into one stride."""
    first = tensors[0]
    if all(t.is_contiguous() for t in tensors):
        n = first.numel()
        return [t.view(1, n) for t in tensors], 1, n
    n_cols = first.shape[-1] if first.dim() else 1
    views = [t.reshape(-1, n_cols) for t in tensors]
    return views, views[0].shape[0], n_cols


def _strides(views) -> tuple[int, ...]:
    return tuple(s for v in views for s in v.stride())


@plan_cache()
def _plan(kernel, n_rows: int, n_cols: int, strides: tuple, activation: int, dtypes: tuple,
          tuning: GluTuning) -> LaunchPlan:
    """One launch over an ``(n_rows, n_cols)`` view: tiles of ``tile_elems`` elements, as many
    whole columns as fit (up to ``tile_elems``) and as many rows as fill the rest. ``dtypes``
    (of every operand) is in the key: the prepared launches are compiled for them."""
    block_n = min(runtime.next_power_of_2(n_cols), tuning.tile_elems)
    block_m = max(1, min(tuning.tile_elems // block_n, runtime.next_power_of_2(n_rows)))
    grid = (runtime.cdiv(n_rows, block_m) * runtime.cdiv(n_cols, block_n),)
    return LaunchPlan(kernel, grid, (n_rows, n_cols, *strides),
                      dict(ACTIVATION=activation, BLOCK_M=block_m, BLOCK_N=block_n,
                           num_warps=tuning.num_warps))


def _out_dtype(gate: torch.Tensor, up: torch.Tensor) -> torch.dtype:
    """``act(gate) * up`` promotes as torch's multiplication does (the activation keeps
    ``gate``'s dtype)."""
    return torch.promote_types(gate.dtype, up.dtype)


def _glu_forward_fake(gate, up, activation):
    return torch.empty(gate.shape, dtype=_out_dtype(gate, up), device=gate.device)


# Not on torch's autocast lists (silu, gelu and mul are not): dtypes as without autocast.
@register_op("glu_forward", fake=_glu_forward_fake)
def glu_forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` for ``activation`` in :data:`ACTIVATIONS` (arguments already checked by
    the public functions); the result is contiguous."""
    out = torch.empty(gate.shape, dtype=_out_dtype(gate, up), device=gate.device)
    if out.numel() == 0:
        return out
    (gate2d, up2d), n_rows, n_cols = _as_rows(gate, up)
    plan = _plan(glu_fwd_kernel, n_rows, n_cols, _strides((gate2d, up2d)),
                 ACTIVATIONS[activation], (gate.dtype, up.dtype, out.dtype), TUNING)
    with runtime.device_guard(gate):
        plan.launch(gate2d, up2d, out)
    return out


def _glu_backward_fake(dout, gate, up, activation):
    return torch.empty_like(gate, memory_format=torch.contiguous_format), \
        torch.empty_like(up, memory_format=torch.contiguous_format)


@register_op("glu_backward", fake=_glu_backward_fake)
def glu_backward(dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                 activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dgate, dup)`` of ``act(gate) * up``, in ``gate``'s and ``up``'s dtypes, from the
    output's gradient and the saved inputs (the activation is recomputed)."""
    dgate = torch.empty_like(gate, memory_format=torch.contiguous_format)
    dup = torch.empty_like(up, memory_format=torch.contiguous_format)
    if dgate.numel() == 0:
        return dgate, dup
    (dout2d, gate2d, up2d), n_rows, n_cols = _as_rows(dout, gate, up)
    plan = _plan(glu_bwd_kernel, n_rows, n_cols, _strides((dout2d, gate2d, up2d)),
                 ACTIVATIONS[activation], (dout.dtype, gate.dtype, up.dtype), TUNING)
    with runtime.device_guard(gate):
        plan.launch(dout2d, gate2d, up2d, dgate, dup)
    return dgate, dup


def _glu_setup_context(ctx, inputs, output):
    gate, up, activation = inputs
    # The inputs, not act(gate): the backward recomputes it (one tensor less kept alive).
    ctx.save_for_backward(gate, up)
    ctx.activation = activation


def _glu_backward_autograd(ctx, dout):
    gate, up = ctx.saved_tensors
    dgate, dup = glu_backward(dout, gate, up, ctx.activation)
    need_gate, need_up = ctx.needs_input_grad[:2]
    return dgate if need_gate else None, dup if need_up else None, None


glu_forward.register_autograd(_glu_backward_autograd, setup_context=_glu_setup_context)


# --------------------------------------------------------------------------------------------
# Public functions.
# --------------------------------------------------------------------------------------------
def _check(gate, up) -> None:
    runtime.check_tensor(gate, "gate", dtypes=FLOAT_DTYPES)
    runtime.check_tensor(up, "up", dtypes=FLOAT_DTYPES)
    runtime.check_same_device(gate=gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(
            f"gate and up must have the same shape (no broadcasting), got gate "
            f"{tuple(gate.shape)} and up {tuple(up.shape)}"
        )


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in one Triton kernel (SwiGLU's gating, as in Llama's MLP).

    ``gate`` and ``up`` of one shape, any strides, fp16/bf16/fp32 (mixed dtypes promote as
    torch's ``*``); fp32 arithmetic, one rounding. Differentiable: the backward saves ``gate``
    and ``up`` and recomputes the SiLU. Traceable by ``torch.compile``."""
    _check(gate, up)
    return glu_forward(gate, up, "silu")


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """``F.gelu(gate, approximate=approximate) * up`` in one Triton kernel (GeGLU's gating, as
    in Gemma's MLP), ``approximate`` ``"tanh"`` (the default here, as Gemma uses) or
    ``"none"`` (the exact, erf-based GELU). Otherwise as :func:`swiglu`."""
    _check(gate, up)
    if not isinstance(approximate, str):
        raise TypeError(f"approximate must be a str, got {type(approximate).__name__}")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return glu_forward(gate, up, "gelu_tanh" if approximate == "tanh" else "gelu")
