"""Registration with torch.library, and the ONLY module that touches torch's dispatch internals.

Every public op is a registered PyTorch op (``torch.ops.triton_workshop.*``), so it works under
``torch.compile``; plain eager calls skip the dispatcher (:class:`RegisteredOp`), which costs more
than a small kernel runs. Whether a launcher runs eagerly or is being traced decides how its
kernels launch (:func:`wrap_triton`, :func:`launch_kernel`).
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Sequence

import torch
from torch._library.triton import is_wrap_triton_enabled

from . import launch, mode


#: Per thread: whether the launcher running now was called directly (not traced), so its
#: kernels launch as they are. A plain flag: torch's own switch is a context manager that costs
#: more per call than the check it enables.
_direct = threading.local()


def launching_directly() -> bool:
    """Whether a launcher running now launches its kernels as they are (eager), rather than
    being traced by torch.compile (then only what Inductor can trace may be launched)."""
    return getattr(_direct, "on", False) or not is_wrap_triton_enabled()


def wrap_triton(kernel):
    """A kernel launch that ``torch.compile`` can trace. For direct eager calls, and where torch
    has switched tracing off, it is the kernel itself (through :class:`FastLaunch` on a GPU):
    the traceable wrapper's dispatch costs more than a small kernel runs."""
    if launching_directly():
        return launch.fast_launcher(kernel) if launch.FAST_LAUNCH else kernel
    return torch.library.wrap_triton(kernel)




def launch_kernel(kernel, grid, tensors: tuple, scalars: tuple, consts: dict,
                  prepared: dict | None) -> None:
    """``kernel[grid](*tensors, *scalars, **consts)`` for a launcher that has a plan.

    ``prepared`` is a dict owned by the launcher's cached plan (see
    :func:`launch.launch_prepared`); eager calls reuse the launch it keeps. ``prepared=None``,
    tracing (torch.compile) and the interpreter launch through :func:`wrap_triton` as usual."""
    if prepared is None or not (launch.FAST_LAUNCH and getattr(_direct, "on", False)):
        wrap_triton(kernel)[grid](*tensors, *scalars, **consts)
        return
    launch.launch_prepared(kernel, grid, tensors, scalars, consts, prepared)


def eager_backward() -> bool:
    """Inside an eager autograd ``backward``: whether it may launch kernels directly (no graph
    being built for a double backward, no dispatch mode or functorch transform watching)."""
    return not (torch.is_grad_enabled() or _dispatch_modes() or _functorch_stack() is not None)


def launch_directly(launcher: Callable) -> Callable:
    """``launcher`` with its kernels launched straight away rather than through the
    traceable wrapper (for code that is not being traced)."""

    @functools.wraps(launcher)
    def direct(*args, **kwargs):
        if getattr(_direct, "on", False):  # nested: an op's launcher calling another op
            return launcher(*args, **kwargs)
        _direct.on = True
        try:
            return launcher(*args, **kwargs)
        finally:
            _direct.on = False

    return direct


def register_op(
    name: str,
    *,
    fake: Callable | None = None,
    mutates_args: Sequence[str] = (),
) -> Callable[[Callable], Callable]:
    """Register a launcher as the PyTorch op ``triton_workshop::<name>``.

    On a GPU it becomes a ``torch.library.triton_op``: Inductor sees the Triton kernels inside
    (launched through :func:`wrap_triton`) and can schedule them with the rest of the graph; its
    fake implementation comes from running the launcher on fake tensors. In the interpreter
    ``triton_op`` does not survive ``torch.compile`` (Inductor tries to run the kernel on fake
    storage), so there it is an opaque ``torch.library.custom_op`` with ``fake`` registered as its
    shape function. Autograd is added afterwards with ``op.register_autograd``.
    """
    qualname = f"triton_workshop::{name}"

    def decorate(launcher: Callable) -> "RegisteredOp":
        if mode.INTERPRET:
            if fake is None:
                raise TypeError(f"register_op({name!r}) needs fake= in interpreter mode")
            # Opaque to torch.compile: its body only ever runs eagerly, on real tensors.
            schema = torch.library.infer_schema(launcher, mutates_args=tuple(mutates_args))
            op = torch.library.custom_op(qualname, mutates_args=tuple(mutates_args),
                                         schema=schema)(launch_directly(launcher))
            op.register_fake(fake)
        else:
            op = torch.library.triton_op(qualname, mutates_args=tuple(mutates_args))(launcher)
        return RegisteredOp(op, launch_directly(launcher))

    return decorate


class RegisteredOp:
    """A registered op that skips the dispatcher when nothing needs it.

    Going through ``torch.library`` costs tens of microseconds a call in eager mode, more than a
    small kernel runs, and twice per training step (forward and backward). The dispatcher is
    needed only while ``torch.compile`` traces and for tensor subclasses (fake tensors, functorch
    wrappers). Plain eager calls run the launcher directly, and when autograd must record the call
    they go through an equivalent ``torch.autograd.Function`` built from the same forward,
    ``setup_context`` and backward as the op's ``register_autograd``. Everything else
    (``_opoverload``, ...) is the underlying op's.

    In that eager Function ``ctx.eager`` is True, so a ``setup_context`` can do work for the
    backward ahead of time, on the calling thread: CUDA backwards run on autograd's own device
    thread, where the same Python costs several times more (cold caches, a thread hand-off).
    """

    def __init__(self, op, launcher: Callable):
        self._op = op
        self._launcher = launcher
        self._function = None
        self.__doc__ = launcher.__doc__

    def __getattr__(self, name):
        return getattr(self._op, name)

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None):
        self._op.register_autograd(backward, setup_context=setup_context)
        launcher = self._launcher

        class EagerAutograd(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                ctx.eager = True  # setup_context may prepare the backward's launch (see above)
                output = launcher(*args)
                if setup_context is not None:
                    setup_context(ctx, args, output)
                return output

            @staticmethod
            def backward(ctx, *grads):
                return backward(ctx, *grads)

        EagerAutograd.__name__ = f"{self._op._name}_autograd"
        self._function = EagerAutograd

    def __call__(self, *args, **kwargs):
        kind = _eager_kind(args, kwargs)
        if kind == "plain":
            return self._launcher(*args, **kwargs)
        if kind == "grad" and self._function is not None and not kwargs:
            return self._function.apply(*args)
        return self._op(*args, **kwargs)


_functorch_stack = getattr(torch._C._functorch, "peek_interpreter_stack", lambda: None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
# torch.jit.is_tracing() without its Python wrapper (checked after is_compiling(), which
# torch.compile resolves to True before it could trace this call).
_jit_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)
_Tensor = torch.Tensor


def _eager_kind(args, kwargs) -> str:
    """"plain" (plain tensors, no autograd), "grad" (plain tensors, autograd records), or
    "other": torch.compile or jit tracing, a functorch transform (vmap, grad, jvp), a dispatch
    mode (make_fx, FakeTensorMode) or a tensor subclass, where only the dispatcher knows what to
    do."""
    if (torch.compiler.is_compiling() or _jit_tracing()
            or _dispatch_modes() or _functorch_stack() is not None):
        return "other"
    grad = torch.is_grad_enabled()
    kind = "plain"
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, _Tensor):
            if type(a) is not _Tensor:
                return "other"
            if grad and a.requires_grad:
                kind = "grad"
    return kind
