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
from ...runtime import FLOAT_DTYPES, LaunchPlan, plan_cache, register_op
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


def _add_forward_planned(ctx, x, y, plan):
    """The eager autograd forward of a kept signature (:func:`_run_ready`'s ``RECORD`` path):
    :func:`_add` with its plan kept."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    with runtime.device_guard(x):
        plan.launch_eager(x, y, out)
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
    # d sqrt(u) = du / (2 sqrt(u)), u = a*b + c
    g = grad / (2 * out)
    return g * b, g * a, g


def _mul_add_sqrt_forward_planned(ctx, a, b, c, plan):
    """As :func:`_add_forward_planned`, for :func:`_fused_mul_add_sqrt` and its setup."""
    out = torch.empty_like(a, memory_format=torch.contiguous_format)
    with runtime.device_guard(a):
        plan.launch_eager(a, b, c, out)
    ctx.save_for_backward(a, b, out)
    return out


def _mul_add_sqrt_backward_planned(ctx, grad):
    return (*_mul_add_sqrt_backward(ctx, grad), None)  # None: the plan's


_fused_mul_add_sqrt.register_autograd(_mul_add_sqrt_backward, setup_context=_mul_add_sqrt_setup)
_fused_mul_add_sqrt.register_planned_forward(_mul_add_sqrt_forward_planned,
                                             _mul_add_sqrt_backward_planned)


def _ready_key(kernel, tensors: tuple):
    """An eager call's layouts, as :func:`_call_key` has them, and the kernel."""
    return (kernel, *[(t.shape, t.stride(), t.dtype, t.device, t.layout) for t in tensors])


#: Eager calls' :func:`_ready_key` -> the plan that launches their operands as they are.
_READY = SignatureCache()


def _run_ready(op, kernel, tensors: tuple):
    """``(path, output)``: an eager call of layouts seen before, launched straight away (output
    None: not such a call; ``path`` from :meth:`runtime.RegisteredOp.eager_path`)."""
    path = op.eager_path(*tensors)
    if path:
        try:
            plan = _READY.under(TUNING).get(_ready_key(kernel, tensors))
        except UNKEYABLE:
            plan = None
        if plan is not None:
            if path == runtime.RECORD:
                return path, op.record_planned(*tensors, plan)
            first = tensors[0]
            out = torch.empty_like(first, memory_format=torch.contiguous_format)
            with runtime.device_guard(first):
                plan.launch_eager(*tensors, out)
            return path, out
    return path, None


def _keep_ready(path, kernel, given: tuple, launched: tuple, out: torch.Tensor) -> None:
    """Keep the plan of a call whose operands went to the kernel as they were given."""
    if path and out.numel() and all(a is b for a, b in zip(given, launched)):
        _READY.under(TUNING).remember(_ready_key(kernel, given),
                                      _find_plan(kernel, out.numel(), out.dtype))


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` (broadcast and promoted like ``torch.add``) in one Triton kernel."""
    path, out = _run_ready(_add, add_kernel, (x, y))
    if out is not None:
        return out
    launched = _prepare(x=x, y=y)
    out = _add(*launched)
    _keep_ready(path, add_kernel, (x, y), launched, out)
    return out


def fused_mul_add_sqrt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``torch.sqrt(a * b + c)`` in one pass over memory (fp32 arithmetic inside)."""
    path, out = _run_ready(_fused_mul_add_sqrt, mul_add_sqrt_kernel, (a, b, c))
    if out is not None:
        return out
    launched = _prepare(a=a, b=b, c=c)
    out = _fused_mul_add_sqrt(*launched)
    _keep_ready(path, mul_add_sqrt_kernel, (a, b, c), launched, out)
    return out
