"""Elementwise ops: ``add`` and ``fused_mul_add_sqrt``, one pass over memory each.

Host code: the tuning (:class:`ElementwiseTuning`), the cached launch plans, the registered ops,
their autograd and the public functions, which broadcast and promote like torch. The kernels are
in :mod:`.kernels`; why fusing ``sqrt(a * b + c)`` into one kernel pays is in
docs/kernels/elementwise.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES, RECORD, LaunchPlan, plan_cache, register_op
from .._common import UNKEYABLE, SignatureCache
from .kernels import add_kernel, mul_add_sqrt_kernel


@dataclass(frozen=True)
class ElementwiseTuning:
    """The launch decisions of the elementwise ops: part of every plan's key."""

    #: 4096 fp32 elements a program over 8 warps: 16 elements a thread, four 16-byte loads in
    #: flight per input, enough to cover memory latency without a tail effect on small tensors.
    block_size: int = 4096
    num_warps: int = 8


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = ElementwiseTuning()


@plan_cache()
def _plan(kernel, n_elements: int, dtype: torch.dtype, tuning: ElementwiseTuning) -> LaunchPlan:
    """A 1-D launch over ``n_elements``: ``block_size`` consecutive elements a program. The
    dtype is in the key although no argument depends on it: the plan's prepared launches are
    compiled for one dtype."""
    return LaunchPlan(kernel, (runtime.cdiv(n_elements, tuning.block_size),), (n_elements,),
                      dict(BLOCK_SIZE=tuning.block_size, num_warps=tuning.num_warps))


def _find_plan(kernel, n_elements: int, dtype: torch.dtype) -> LaunchPlan:
    """:func:`_plan` under the current :data:`TUNING`: one dict lookup for a size seen before."""
    return _PLANS.found(TUNING, (kernel, n_elements, dtype),
                        lambda: _plan(kernel, n_elements, dtype, TUNING))


#: :func:`_find_plan`'s plans.
_PLANS = SignatureCache()


def _prepare(**tensors: torch.Tensor) -> list[torch.Tensor]:
    """Validate, then broadcast to one shape and promote to one floating dtype, as torch does.

    The kernels walk flat memory, so operands that are broadcast or strided are made contiguous
    here (one extra copy; contiguous same-shape inputs, the fast path, are passed through). The
    checks run once per call signature (all they read, and the strides, are in the key).
    """
    values = list(tensors.values())
    if _CALLS.checked(_call_key, _check, tensors):
        return values  # the common case, without broadcast_tensors' and to()'s Python overhead
    dtype = values[0].dtype
    for t in values:
        dtype = torch.promote_types(dtype, t.dtype)
    try:
        shaped = torch.broadcast_tensors(*values)
    except RuntimeError:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t in tensors.items())
        raise ValueError(f"shapes do not broadcast: {shapes}") from None
    return [t.to(dtype).contiguous() for t in shaped]


#: The elementwise ops' checked call signatures -> whether the operands go to the kernel as
#: they are (one shape, one dtype, contiguous).
_CALLS = SignatureCache()


def _call_key(tensors: dict):
    """Everything the checks read, and the strides (whether the operands are contiguous)."""
    return tuple([(t.shape, t.stride(), t.dtype, t.device, t.layout) for t in tensors.values()])


def _check(tensors: dict) -> bool:
    """The checks; whether the operands can be launched as they are."""
    for name, t in tensors.items():
        runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES)
    runtime.check_same_device(**tensors)
    first = next(iter(tensors.values()))
    return all(t.shape == first.shape and t.dtype == first.dtype and t.is_contiguous()
               for t in tensors.values())


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register_op("add", fake=lambda x, y: _empty_like(x))
def _add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    n = out.numel()
    if n == 0:
        return out
    with runtime.device_guard(x):
        _find_plan(add_kernel, n, out.dtype).launch(x, y, out)
    return out


@register_op("fused_mul_add_sqrt", fake=lambda a, b, c: _empty_like(a))
def _fused_mul_add_sqrt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(a, memory_format=torch.contiguous_format)
    n = out.numel()
    if n == 0:
        return out
    with runtime.device_guard(a):
        _find_plan(mul_add_sqrt_kernel, n, out.dtype).launch(a, b, c, out)
    return out


def _add_backward(ctx, grad):
    return grad, grad


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing, not entered (entering it costs two calls).
_SAME_DEVICE = runtime.device_guard(torch.empty(0))


def _add_forward_planned(ctx, x, y, ready):
    """The eager autograd forward of a kept signature (:func:`add`'s ``RECORD`` path; with
    ``ctx`` None its plain launch): :func:`_add` with its plan kept. ``ready`` is ``(plan,
    whether empty_like(x) is laid out as the output)``."""
    out = (torch.empty_like(x) if ready[1]
           else torch.empty_like(x, memory_format=torch.contiguous_format))
    guard = runtime.device_guard(x)
    if guard is _SAME_DEVICE:
        ready[0].launch_eager(x, y, out)
    else:
        with guard:
            ready[0].launch_eager(x, y, out)
    return out


def _add_backward_planned(ctx, grad):
    return grad, grad, None  # None: the plan's


_add.register_autograd(_add_backward)
_add.register_planned_forward(_add_forward_planned, _add_backward_planned)


def _mul_add_sqrt_setup(ctx, inputs, output):
    a, b, _ = inputs
    ctx.save_for_backward(a, b, output)


def _mul_add_sqrt_backward(ctx, grad):
    a, b, out = ctx.saved_tensors
    # d sqrt(u) = du / (2 sqrt(u)), u = a*b + c. out + out is 2 * out, exactly (as is any
    # doubling, overflow to inf included), without the Python scalar torch wraps at each call.
    g = grad / (out + out)
    return g * b, g * a, g


def _mul_add_sqrt_forward_planned(ctx, a, b, c, ready):
    """As :func:`_add_forward_planned`, for :func:`_fused_mul_add_sqrt` and its setup."""
    out = (torch.empty_like(a) if ready[1]
           else torch.empty_like(a, memory_format=torch.contiguous_format))
    guard = runtime.device_guard(a)
    if guard is _SAME_DEVICE:
        ready[0].launch_eager(a, b, c, out)
    else:
        with guard:
            ready[0].launch_eager(a, b, c, out)
    if ctx is not None:
        ctx.save_for_backward(a, b, out)
    return out


def _mul_add_sqrt_backward_planned(ctx, grad):
    a, b, out = ctx.saved_tensors
    g = grad / (out + out)  # as _mul_add_sqrt_backward's
    return g * b, g * a, g, None  # None: the plan's


_fused_mul_add_sqrt.register_autograd(_mul_add_sqrt_backward, setup_context=_mul_add_sqrt_setup)
_fused_mul_add_sqrt.register_planned_forward(_mul_add_sqrt_forward_planned,
                                             _mul_add_sqrt_backward_planned)


#: Eager calls' kernel and layouts (each operand's shape, strides, dtype, device and layout)
#: -> ``(the plan that launches the operands as they are, whether empty_like of the first
#: operand is laid out as the output: its strides are the contiguous ones)``.
_READY = SignatureCache()


def _keep_ready(path, key, given: tuple, launched: tuple, out: torch.Tensor) -> None:
    """Keep the plan of a call whose operands went to the kernel as they were given."""
    if path and key is not None and out.numel() and all(a is b for a, b in zip(given, launched)):
        _READY.under(TUNING).remember(
            key, (_find_plan(key[0], out.numel(), out.dtype), given[0].stride() == out.stride()))


# add and fused_mul_add_sqrt each spell their kept path out inline: a shared helper costs a
# frame, half a microsecond of the few the eager call is allowed over torch's.
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` (broadcast and promoted like ``torch.add``) in one Triton kernel."""
    path = _add.eager_path(x, y)
    key = None
    if path:  # an eager call of layouts seen before: straight to the launch
        try:
            key = (add_kernel, x.shape, x.stride(), x.dtype, x.device, x.layout,
                   y.shape, y.stride(), y.dtype, y.device, y.layout)
            # _READY.under(TUNING) inline: kept under another tuning, nothing is found.
            ready = _READY.get(key) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            key = ready = None
        if ready is not None:
            if path == RECORD:
                return _add.record_planned(x, y, ready)
            return _add_forward_planned(None, x, y, ready)
    launched = _prepare(x=x, y=y)
    out = _add(*launched)
    _keep_ready(path, key, (x, y), launched, out)
    return out


def fused_mul_add_sqrt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``torch.sqrt(a * b + c)`` in one pass over memory (fp32 arithmetic inside)."""
    path = _fused_mul_add_sqrt.eager_path(a, b, c)
    key = None
    if path:  # as add's
        try:
            key = (mul_add_sqrt_kernel, a.shape, a.stride(), a.dtype, a.device, a.layout,
                   b.shape, b.stride(), b.dtype, b.device, b.layout,
                   c.shape, c.stride(), c.dtype, c.device, c.layout)
            ready = _READY.get(key) if _READY.tuning is TUNING else None
        except UNKEYABLE:
            key = ready = None
        if ready is not None:
            if path == RECORD:
                return _fused_mul_add_sqrt.record_planned(a, b, c, ready)
            return _mul_add_sqrt_forward_planned(None, a, b, c, ready)
    launched = _prepare(a=a, b=b, c=c)
    out = _fused_mul_add_sqrt(*launched)
    _keep_ready(path, key, (a, b, c), launched, out)
    return out
