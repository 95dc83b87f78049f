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
from .._common import SignatureCache
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
    out = _empty_like(x)
    n = out.numel()
    if n == 0:
        return out
    with runtime.device_guard(x):
        _plan(add_kernel, n, out.dtype, TUNING).launch(x, y, out)
    return out


@register_op("fused_mul_add_sqrt", fake=lambda a, b, c: _empty_like(a))
def _fused_mul_add_sqrt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    out = _empty_like(a)
    n = out.numel()
    if n == 0:
        return out
    with runtime.device_guard(a):
        _plan(mul_add_sqrt_kernel, n, out.dtype, TUNING).launch(a, b, c, out)
    return out


def _add_backward(ctx, grad):
    return grad, grad


_add.register_autograd(_add_backward)


def _mul_add_sqrt_setup(ctx, inputs, output):
    a, b, _ = inputs
    ctx.save_for_backward(a, b, output)


def _mul_add_sqrt_backward(ctx, grad):
    a, b, out = ctx.saved_tensors
    # d sqrt(u) = du / (2 sqrt(u)), u = a*b + c
    g = grad / (2 * out)
    return g * b, g * a, g


_fused_mul_add_sqrt.register_autograd(_mul_add_sqrt_backward, setup_context=_mul_add_sqrt_setup)


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` (broadcast and promoted like ``torch.add``) in one Triton kernel."""
    x, y = _prepare(x=x, y=y)
    return _add(x, y)


def fused_mul_add_sqrt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``torch.sqrt(a * b + c)`` in one pass over memory (fp32 arithmetic inside)."""
    a, b, c = _prepare(a=a, b=b, c=c)
    return _fused_mul_add_sqrt(a, b, c)
