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
from ...runtime import FLOAT_DTYPES, RECORD, LaunchPlan, plan_cache, register_op
from .._common import UNKEYABLE, SignatureCache, layout_key
from .kernels import GELU, GELU_TANH, SILU, glu_bwd_kernel, glu_fwd_kernel


@dataclass(frozen=True)
class GluTuning:
    """The launch decisions of the GLU ops: part of every plan's key."""

    #: Elements a program owns: a tile of rows x columns (one long row when the operands are
    #: contiguous). For SiLU 2048 over 8 warps, 8 elements a thread: for fp16/bf16 one 16-byte
    #: load per operand, for fp32 two; more programs in flight. H200, swiglu 8192 x 14336 bf16
    #: in CUDA graphs, three runs: forward 161.4-162.1 us against 163.1-163.6 with 4096
    #: (torch.compile 161.7-162.4), forward + backward 435.5-436.6 against 438.5-439.0; 1024 over
    #: 4 warps within 0.5 us of it, 1024 over 8 and 8192 or more slower.
    tile_elems: int = 2048
    #: The GELU activations' (erf or tanh: more arithmetic an element) tile: 4096, 16 elements
    #: a thread. geglu 8192 x 14336 bf16 on the same H200: forward 162.1 us against 163.7 at
    #: 2048 (torch.compile 161.9), forward + backward 435.1 against 435.9 (docs/results.md,
    #: 2026-11-29).
    gelu_tile_elems: int = 4096
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


def _find_plan(kernel, inputs: tuple, out_dtypes: tuple, activation: int,
               grad_row_stride: int | None = None):
    """``(plan, reshape)``: the launch of ``kernel`` over the inputs (of one shape, not empty)
    seen as rows (:func:`_as_rows`), and whether the inputs must be reshaped into rows at each
    launch (a copy; otherwise the plan launches the tensors themselves: a view starts where its
    tensor starts). Looked up by every shape, stride and dtype the launch reads. The backward's
    gradients are contiguous, or (``grad_row_stride``) rows of that many elements."""
    key = (kernel, inputs[0].shape, *[t.stride() for t in inputs], *[t.dtype for t in inputs],
           *out_dtypes, activation, grad_row_stride)
    return _LAUNCHES.found(TUNING, key, lambda: _new_launch(kernel, inputs, out_dtypes, activation,
                                                            grad_row_stride))


def _new_launch(kernel, inputs: tuple, out_dtypes: tuple, activation: int,
                grad_row_stride: int | None):
    """:func:`_find_plan`'s ``(plan, reshape)``, worked out."""
    views, n_rows, n_cols = _as_rows(*inputs)
    strides = _strides(views)
    if kernel is glu_bwd_kernel:
        strides += (n_cols if grad_row_stride is None else grad_row_stride,)
    return (_plan(kernel, n_rows, n_cols, strides, activation,
                  (*[t.dtype for t in inputs], *out_dtypes), TUNING),
            not _views_of(inputs, n_cols))


def _launch(kernel, inputs: tuple, outputs: tuple, activation: int,
            grad_row_stride: int | None = None) -> None:
    """``kernel`` over the inputs, writing the outputs (contiguous, or rows of
    ``grad_row_stride`` elements: :func:`_find_plan`)."""
    plan, reshape = _find_plan(kernel, inputs, tuple([t.dtype for t in outputs]), activation,
                               grad_row_stride)
    with runtime.device_guard(inputs[0]):
        plan.launch(*(_as_rows(*inputs)[0] if reshape else inputs), *outputs)


def _forward_launch(gate: torch.Tensor, up: torch.Tensor, activation: int):
    """``(plan, reshape, out_dtype)`` of the forward over ``gate`` and ``up`` (plan None: nothing
    to compute): one lookup by every shape, stride and dtype it reads (:func:`_find_plan`'s
    decision, and the output's dtype, without working either out again)."""
    try:
        key = (gate.shape, gate.stride(), up.stride(), gate.dtype, up.dtype, activation)
        ready = _FORWARDS.under(TUNING).get(key)
    except TypeError:  # symbolic sizes: worked out uncached
        key, ready = None, None
    if ready is None:
        out_dtype = _out_dtype(gate, up)
        plan = reshape = None
        if gate.numel():
            plan, reshape = _find_plan(glu_fwd_kernel, (gate, up), (out_dtype,), activation)
        ready = _FORWARDS.remember(key, (plan, reshape, out_dtype))
    return ready


#: The forward's launches by the inputs' layouts (:func:`_forward_launch`).
_FORWARDS = SignatureCache()


def _views_of(tensors, n_cols: int) -> bool:
    """Whether every operand is its rows without a copy (contiguous, or leading dims that
    collapse into one stride)."""
    if all(t.is_contiguous() for t in tensors):
        return True
    try:
        for t in tensors:
            t.view(-1, n_cols)
    except RuntimeError:  # reshape copies this one
        return False
    return True


#: _launch's plans by every layout they were worked out from, with whether the operands must
#: be reshaped into rows (a copy) at each launch.
_LAUNCHES = SignatureCache()


def _strides(views) -> tuple[int, ...]:
    return tuple(s for v in views for s in v.stride())


@plan_cache()
def _plan(kernel, n_rows: int, n_cols: int, strides: tuple, activation: int, dtypes: tuple,
          tuning: GluTuning) -> LaunchPlan:
    """One launch over an ``(n_rows, n_cols)`` view: tiles of the activation's ``tile_elems``
    elements, as many whole columns as fit and as many rows as fill the rest. ``dtypes``
    (of every operand) is in the key: the prepared launches are compiled for them."""
    tile_elems = tuning.tile_elems if activation == SILU else tuning.gelu_tile_elems
    block_n = min(runtime.next_power_of_2(n_cols), tile_elems)
    block_m = max(1, min(tile_elems // block_n, runtime.next_power_of_2(n_rows)))
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
    return _glu_out(gate, up, activation)


def _glu_out(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """:func:`glu_forward`'s launch, for it and for :func:`glu_halves_forward`."""
    plan, reshape, out_dtype = _forward_launch(gate, up, ACTIVATIONS[activation])
    out = torch.empty_like(gate, dtype=out_dtype, memory_format=torch.contiguous_format)
    if plan is None:  # nothing to compute
        return out
    with runtime.device_guard(gate):
        if reshape:
            plan.launch(*_as_rows(gate, up)[0], out)
        else:
            plan.launch(gate, up, out)
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
    _launch(glu_bwd_kernel, (dout, gate, up), (dgate, dup), ACTIVATIONS[activation])
    return dgate, dup


def _glu_setup_context(ctx, inputs, output):
    gate, up, activation = inputs
    # The inputs, not act(gate): the backward recomputes it (one tensor less kept alive).
    ctx.save_for_backward(gate, up)
    ctx.activation = activation
    if getattr(ctx, "eager", False):
        ctx.backward_plan = _planned_backward(gate, up, output, activation)


def _planned_backward(gate, up, output, activation: str):
    """``(plan, dtype)`` of the backward's launch for the usual case of a contiguous gradient of
    the output's dtype (``output`` stands in for it: its shape, strides and dtype), found on the
    calling thread: the backward then only allocates and launches. None where the operands are
    not contiguous (the backward's registered op then works it out)."""
    if not (output.numel() and gate.is_contiguous() and up.is_contiguous()):
        return None
    plan, _ = _find_plan(glu_bwd_kernel, (output, gate, up), (gate.dtype, up.dtype),
                         ACTIVATIONS[activation])
    return plan, output.dtype


def _glu_forward_planned(ctx, gate, up, ready):
    """The eager autograd forward of a kept signature (:func:`_glu`'s ``RECORD`` path; with
    ``ctx`` None its plain launch): :func:`glu_forward` and :func:`_glu_setup_context` with the
    plans kept for it. The backward (:func:`_glu_backward_kept`) reads its plan from
    ``ctx.ready``."""
    out = (torch.empty_like(gate) if ready[4] else
           torch.empty_like(gate, dtype=ready[2], memory_format=torch.contiguous_format))
    guard = runtime.device_guard(gate)
    if guard is _SAME_DEVICE:
        ready[1].launch_eager(gate, up, out)
    else:
        with guard:
            ready[1].launch_eager(gate, up, out)
    if ctx is not None:
        ctx.save_for_backward(gate, up)
        ctx.ready = ready
    return out


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing, not entered (entering it costs two calls).
_SAME_DEVICE = runtime.device_guard(torch.empty(0))


def _glu_backward_planned(plan, dout, gate, up):
    # Contiguous, as gate and up. Autograd runs a CUDA backward on its device thread, already
    # on the output's device: no device guard.
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    plan.launch_eager(dout, gate, up, dgate, dup)
    return dgate, dup


def _glu_backward_autograd(ctx, dout):
    gate, up = ctx.saved_tensors
    planned = getattr(ctx, "backward_plan", None)
    # Autograd hands a backward the gradient of the output's dtype (planned[1]; its engine casts
    # one of another dtype first) and device.
    if planned is not None and dout.is_contiguous() and runtime.eager_backward():
        dgate, dup = _glu_backward_planned(planned[0], dout, gate, up)
    else:
        dgate, dup = glu_backward(dout, gate, up, ctx.activation)
    need_gate, need_up = ctx.needs_input_grad[:2]
    return dgate if need_gate else None, dup if need_up else None, None


def _glu_backward_kept(ctx, dout):
    """:func:`_glu_backward_autograd` after :func:`_glu_forward_planned`, whose plans are kept
    (``ctx.ready``): the launch of :func:`_glu_backward_planned` inline."""
    gate, up = ctx.saved_tensors
    planned = ctx.ready[3]
    if planned is not None and dout.is_contiguous() and runtime.eager_backward():
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        planned[0].launch_eager(dout, gate, up, dgate, dup)
    else:
        dgate, dup = glu_backward(dout, gate, up, ctx.ready[0])
    # Both gradients, computed anyway: autograd drops the one of an input that needs none.
    return dgate, dup, None


glu_forward.register_autograd(_glu_backward_autograd, setup_context=_glu_setup_context)
glu_forward.register_planned_forward(_glu_forward_planned, _glu_backward_kept)


# --------------------------------------------------------------------------------------------
# The halves of one tensor (a fused gate/up projection's output): one gradient, no cat.
# --------------------------------------------------------------------------------------------
def _halves(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = gate_up.shape[-1] // 2
    return gate_up[..., :half], gate_up[..., half:]


def _glu_halves_fake(gate_up, activation):
    gate, up = _halves(gate_up)
    return _glu_forward_fake(gate, up, activation)


@register_op("glu_halves_forward", fake=_glu_halves_fake)
def glu_halves_forward(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` for ``gate, up = gate_up.chunk(2, -1)`` (checked by
    :func:`glu_halves`), each half read in place; the result is contiguous."""
    return _glu_out(*_halves(gate_up), activation)


def _glu_halves_backward_fake(dout, gate_up, activation):
    return torch.empty_like(gate_up, memory_format=torch.contiguous_format)


@register_op("glu_halves_backward", fake=_glu_halves_backward_fake)
def glu_halves_backward(dout: torch.Tensor, gate_up: torch.Tensor,
                        activation: str) -> torch.Tensor:
    """The gradient of ``gate_up``: the kernel writes ``dgate`` and ``dup`` into the two halves
    of one tensor, which autograd's backward of ``chunk`` would otherwise copy together."""
    grad = torch.empty_like(gate_up, memory_format=torch.contiguous_format)
    if grad.numel() == 0:
        return grad
    half = gate_up.shape[-1] // 2
    _launch(glu_bwd_kernel, (dout, *_halves(gate_up)), _halves(grad), ACTIVATIONS[activation],
            grad_row_stride=2 * half)
    return grad


def _glu_halves_setup_context(ctx, inputs, output):
    gate_up, activation = inputs
    ctx.save_for_backward(gate_up)  # act(gate) is recomputed, as for glu_forward
    ctx.activation = activation


def _glu_halves_backward_autograd(ctx, dout):
    (gate_up,) = ctx.saved_tensors
    return glu_halves_backward(dout.contiguous(), gate_up, ctx.activation), None


glu_halves_forward.register_autograd(_glu_halves_backward_autograd,
                                     setup_context=_glu_halves_setup_context)


# --------------------------------------------------------------------------------------------
# Public functions.
# --------------------------------------------------------------------------------------------
def _check(gate, up) -> None:
    """The checks of both functions, once per call signature (all they read is in the key)."""
    _CALLS.checked(_call_key, _check_args, gate, up)


def _call_key(gate, up):
    return layout_key(gate), layout_key(up)


#: swiglu's and geglu's checked call signatures.
_CALLS = SignatureCache()


def _check_args(gate, up) -> bool:
    runtime.check_tensor(gate, "gate", dtypes=FLOAT_DTYPES)
    runtime.check_tensor(up, "up", dtypes=FLOAT_DTYPES)
    runtime.check_same_device(gate=gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(
            f"gate and up must have the same shape (no broadcasting), got gate "
            f"{tuple(gate.shape)} and up {tuple(up.shape)}"
        )
    return True


#: Eager calls' layouts (all the checks read, and the strides) and ``approximate`` (and its
#: type) -> ``(activation, the forward's plan, the output's dtype, the backward's
#: (:func:`_planned_backward`), whether empty_like(gate) makes the output: of its dtype, and
#: gate's strides the contiguous ones)`` for operands that were checked and launch as they are.
_READY = SignatureCache()


#: :func:`_glu`'s ``approximate`` for swiglu (no argument of geglu's can be this object).
_SILU = object()


def _glu(gate, up, approximate) -> torch.Tensor:
    """Both functions: ``approximate`` :data:`_SILU` (this very object) for SiLU, else GELU's
    argument."""
    path = glu_forward.eager_path(gate, up)
    key = None
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            key = (gate.shape, gate.stride(), gate.dtype, gate.device, gate.layout, up.shape,
                   up.stride(), up.dtype, up.device, up.layout, approximate, type(approximate))
            # _READY.under(TUNING) inline: kept under another tuning, nothing is found.
            ready = _READY.get(key) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            key = ready = None
        if ready is not None:
            if path == RECORD:
                return glu_forward.record_planned(gate, up, ready)
            return _glu_forward_planned(None, gate, up, ready)
    _check(gate, up)
    if approximate is _SILU:
        activation = "silu"
    else:
        if not isinstance(approximate, str):
            raise TypeError(f"approximate must be a str, got {type(approximate).__name__}")
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        activation = "gelu_tanh" if approximate == "tanh" else "gelu"
    out = glu_forward(gate, up, activation)
    if key is not None and out.numel():
        plan, reshape, out_dtype = _forward_launch(gate, up, ACTIVATIONS[activation])
        if not reshape:
            _READY.under(TUNING).remember(
                key, (activation, plan, out_dtype, _planned_backward(gate, up, out, activation),
                      out_dtype == gate.dtype and out.stride() == gate.stride()))
    return out


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in one Triton kernel (SwiGLU's gating, as in Llama's MLP).

    ``gate`` and ``up`` of one shape, any strides, fp16/bf16/fp32 (mixed dtypes promote as
    torch's ``*``); fp32 arithmetic, one rounding. Differentiable: the backward saves ``gate``
    and ``up`` and recomputes the SiLU. Traceable by ``torch.compile``."""
    return _glu(gate, up, _SILU)


def glu_halves(gate_up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """``act(gate) * up`` for ``gate, up = gate_up.chunk(2, dim=-1)``: the gated MLP of a model
    whose gate and up projections are one Linear (Phi-3's ``gate_up_proj``), ``activation``
    ``"silu"`` (SwiGLU), ``"gelu"`` or ``"gelu_tanh"`` (GeGLU). Each half is read in place; the
    backward writes ``gate_up``'s gradient as one tensor, where ``swiglu(*gate_up.chunk(2, -1))``
    makes two that autograd then copies together (a pass over the whole gradient). fp16/bf16/
    fp32, fp32 arithmetic; ``gate_up``'s last dimension must be even."""
    runtime.check_tensor(gate_up, "gate_up", dtypes=FLOAT_DTYPES)
    runtime.check_choice(activation, "activation", ACTIVATIONS)
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension must be even (gate and up side by side), got "
                         f"shape {tuple(gate_up.shape)}")
    return glu_halves_forward(gate_up, activation)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """``F.gelu(gate, approximate=approximate) * up`` in one Triton kernel (GeGLU's gating, as
    in Gemma's MLP), ``approximate`` ``"tanh"`` (the default here, as Gemma uses) or
    ``"none"`` (the exact, erf-based GELU). Otherwise as :func:`swiglu`."""
    return _glu(gate, up, approximate)
