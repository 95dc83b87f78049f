"""Registration with torch.library, and the ONLY module that touches torch's dispatch internals.

Every public op is a registered PyTorch op (``torch.ops.triton_workshop.*``), so it works under
``torch.compile``; plain eager calls skip the dispatcher (:class:`RegisteredOp`), which costs more
than a small kernel runs. Whether a launcher runs eagerly or is being traced decides how its
kernels launch (:func:`wrap_triton`, :func:`launch_kernel`).

**Autocast.** Each op declares, once, how it follows ``torch.autocast`` (``register_op(...,
autocast=...)``), in the terms of torch's own cast policies: ``"lower_precision_fp"`` (torch's
matmul/linear/conv/attention list: floating-point inputs to the autocast dtype of their device
type, ``torch.get_autocast_dtype``) or ``"fp32"`` (torch's fp32 list: to float32), per device
type where torch's CPU and CUDA lists differ. One :class:`AutocastPolicy` applies it on every
path: torch's dispatcher (an ``Autocast<Device>`` kernel, so ``torch.ops.triton_workshop.*``, the
autograd and ``torch.compile`` see the casts), the eager fast path of :class:`RegisteredOp`, and
the public functions (:func:`follows_autocast`), whose argument checks run on the cast tensors.
As in torch, only floating-point tensors other than float64 on the autocast device type are
cast, and an op's own implementation runs with autocast off (nested ops do not cast again).
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Sequence

import torch
from torch._library.triton import is_wrap_triton_enabled

from . import kernel_analysis, launch, mode, tuned


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
    kernel_analysis.install()  # traced: Inductor analyses each launch (once a signature, so)
    if len(getattr(kernel, "configs", ())) > 1 and hasattr(kernel, "cache"):
        return _TracedAutotuned(kernel)
    return torch.library.wrap_triton(kernel)


class _TracedAutotuned:
    """An autotuned kernel seen by ``torch.compile``: where the config of the call being traced
    is known (a shipped table, or this process's own eager tuning; :mod:`.tuned`), the graph gets
    a kernel of that one config, so Inductor, which times every candidate of an autotuned kernel
    it is given, has nothing to time; otherwise the kernel as it is."""

    __slots__ = ("kernel",)

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch_traced(*args, **kwargs):
            chosen = tuned.single_config(self.kernel, args, kwargs)
            return torch.library.wrap_triton(chosen)[grid](*args, **kwargs)

        return launch_traced



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


def traced() -> bool:
    """Whether the ops called now are recorded rather than run: torch.compile (Dynamo, or
    AOTAutograd tracing a backward formula, where some torch versions read
    ``torch.compiler.is_compiling()`` as False: its dispatch mode is on then), ``torch.jit``
    tracing, or any other dispatch mode."""
    return bool(_is_compiling() or _jit_tracing() or _dispatch_modes())


def any_autocast() -> bool:
    """Whether ``torch.autocast`` is on for any device type (one C call): where a backward that
    calls registered ops would have them cast its operands."""
    return _any_autocast()


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
    autocast: "str | dict[str, str | None] | None" = None,
    opaque: bool = False,
) -> Callable[[Callable], Callable]:
    """Register a launcher as the PyTorch op ``triton_workshop::<name>``.

    On a GPU it becomes a ``torch.library.triton_op``: Inductor sees the Triton kernels inside
    (launched through :func:`wrap_triton`) and can schedule them with the rest of the graph; its
    fake implementation comes from running the launcher on fake tensors. In the interpreter
    ``triton_op`` does not survive ``torch.compile`` (Inductor tries to run the kernel on fake
    storage), so there it is an opaque ``torch.library.custom_op`` with ``fake`` registered as its
    shape function. Autograd is added afterwards with ``op.register_autograd``.

    ``autocast`` is how the op follows ``torch.autocast``, as the torch op it replaces does: None
    (not in torch's autocast lists: dtypes as without autocast), ``"lower_precision_fp"`` or
    ``"fp32"`` for every device type, or a dict from device type (``"cpu"``, ``"cuda"``) to one of
    those or None (see :class:`AutocastPolicy`).

    ``opaque=True`` makes it the opaque ``custom_op`` on a GPU too (``fake`` required): for a
    launcher whose body Inductor should not trace into, such as a loop over chunks that writes
    slices of its outputs in place between products (traced, the loop is unrolled into the
    graph, and the traced in-place slice updates are where results went wrong).
    """
    qualname = f"triton_workshop::{name}"
    policy = AutocastPolicy(autocast)

    def decorate(launcher: Callable) -> "RegisteredOp":
        if mode.INTERPRET or opaque:
            if fake is None:
                raise TypeError(f"register_op({name!r}) needs fake= "
                                f"{'when opaque' if opaque else 'in interpreter mode'}")
            # Opaque to torch.compile: its body only ever runs eagerly, on real tensors.
            schema = torch.library.infer_schema(launcher, mutates_args=tuple(mutates_args))
            op = torch.library.custom_op(qualname, mutates_args=tuple(mutates_args),
                                         schema=schema)(launch_directly(launcher))
            op.register_fake(fake)
        else:
            op = torch.library.triton_op(qualname, mutates_args=tuple(mutates_args))(launcher)
        _register_autocast(name, policy)
        return RegisteredOp(op, launch_directly(launcher), policy, raw_launcher=launcher)

    return decorate


# --------------------------------------------------------------------------------------------
# Autocast.
# --------------------------------------------------------------------------------------------
#: torch's cast policies (``CastPolicy`` in ATen's autocast_mode.h) that ops here follow.
LOWER_PRECISION_FP = "lower_precision_fp"
FP32 = "fp32"
_RULES = (LOWER_PRECISION_FP, FP32)
#: Device types the kernels run on (the interpreter reads CPU and CUDA tensors).
_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")

#: Whether autocast is on for any device type: one C call, the whole cost of the check while
#: autocast is off (torch.compile folds it to a constant and guards on it). Torch builds without
#: it pay for the full check instead.
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


class AutocastPolicy:
    """How one op follows ``torch.autocast``: a rule per device type (``"lower_precision_fp"``:
    floating-point tensors to ``torch.get_autocast_dtype(device_type)``; ``"fp32"``: to float32;
    absent: untouched), applied to the floating-point tensors (not float64) on that device type,
    as torch's autocast casts them. The device type of a call is that of its first tensor."""

    __slots__ = ("rules",)

    def __init__(self, spec: "str | dict[str, str | None] | None" = None):
        if spec is None:
            rules = {}
        elif isinstance(spec, str):
            rules = {device_type: spec for device_type in _AUTOCAST_DEVICE_TYPES}
        elif isinstance(spec, dict):
            rules = {k: v for k, v in spec.items() if v is not None}
            unknown = [k for k in spec if k not in _AUTOCAST_DEVICE_TYPES]
            if unknown:
                raise ValueError(f"autocast names device types {unknown}; expected some of "
                                 f"{list(_AUTOCAST_DEVICE_TYPES)}")
        else:
            raise TypeError(f"autocast must be None, a rule or a dict of rules, got {spec!r}")
        bad = [r for r in rules.values() if r not in _RULES]
        if bad:
            raise ValueError(f"autocast rules must be one of {list(_RULES)}, got {bad}")
        self.rules: dict[str, str] = rules

    def __bool__(self) -> bool:
        return bool(self.rules)

    def __repr__(self) -> str:
        return f"AutocastPolicy({self.rules!r})"

    def dtype_for(self, device_type: str) -> "torch.dtype | None":
        """The dtype this op's floating-point inputs on ``device_type`` are cast to now (None:
        autocast is off for that device type, or the op is not on its lists there)."""
        rule = self.rules.get(device_type)
        # _any_autocast first: one C call while autocast is off everywhere (the usual case).
        if rule is None or not _any_autocast() or not torch.is_autocast_enabled(device_type):
            return None
        if rule == LOWER_PRECISION_FP:
            return torch.get_autocast_dtype(device_type)
        return torch.float32

    def _target(self, values):
        """``(device_type, dtype)`` autocast casts a call with these argument values to now, or
        None: no rule, autocast off, inside an op's own implementation (a launcher runs with
        autocast off, as torch runs an op's kernels below its autocast key), no tensor, or no
        rule for the device type of the first tensor (the call's)."""
        if not self.rules or not _any_autocast() or getattr(_direct, "on", False):
            return None
        for a in values:
            if isinstance(a, _Tensor):
                device_type = _device_type(a)
                dtype = self.dtype_for(device_type)
                return None if dtype is None else (device_type, dtype)
        return None

    def cast(self, args: tuple, kwargs: dict | None = None):
        """``(args, kwargs)`` with the casts autocast asks for now (the same objects when none).

        Cheap while autocast is off everywhere (one C call), and a no-op inside an op's own
        implementation (see :meth:`_target`)."""
        target = self._target((*args, *kwargs.values()) if kwargs else args)
        if target is None:
            return args, kwargs
        return _cast_all(args, kwargs, *target)

    def casts_any(self, args: tuple) -> bool:
        """Whether :meth:`cast` would cast any of ``args`` now (False for the arguments a
        :func:`follows_autocast` public function has already cast)."""
        target = self._target(args)
        return target is not None and any(_needs_cast(a, *target) for a in args)


def _device_type(t: torch.Tensor) -> str:
    # t.device builds a torch.device object: several times the cost of these two flags.
    return "cuda" if t.is_cuda else "cpu" if t.is_cpu else t.device.type


def _needs_cast(a, device_type: str, dtype: torch.dtype) -> bool:
    """torch's eligibility (``is_eligible`` in ATen's autocast_mode.h): a floating-point tensor
    on the autocast device type, never float64; and not already of ``dtype``."""
    if not isinstance(a, _Tensor):
        return False
    a_dtype = a.dtype
    return (a_dtype is not dtype and a_dtype.is_floating_point and a_dtype is not torch.float64
            and _device_type(a) == device_type)


def _cast_all(args, kwargs, device_type: str, dtype: torch.dtype):
    """``(args, kwargs)`` with every eligible tensor cast to ``dtype`` (the same objects where
    nothing is)."""
    cast = None
    for i, a in enumerate(args):
        if _needs_cast(a, device_type, dtype):
            if cast is None:
                cast = list(args)
            cast[i] = a.to(dtype)
    if cast is not None:
        args = tuple(cast)
    if kwargs:
        for k, a in kwargs.items():
            if _needs_cast(a, device_type, dtype):
                kwargs = {**kwargs, k: a.to(dtype)}
    return args, kwargs


_AUTOCAST_LIBRARY = None


def _autocast_dispatch_key(device_type: str) -> str:
    """``"AutocastCPU"``, ``"AutocastCUDA"``: the dispatch key autocast uses for a device type."""
    key_for_device = getattr(torch._C, "_dispatch_key_for_device", None)
    suffix = key_for_device(device_type) if key_for_device else device_type.upper()
    return "Autocast" + suffix


def _register_autocast(name: str, policy: AutocastPolicy) -> None:
    """The policy as the op's ``Autocast<Device>`` kernels, where torch's dispatcher (the
    ``torch.ops`` path, tensor subclasses, ``torch.compile``'s tracing) applies it: what
    ``torch.library.register_autocast`` does, with the dtype read when the op is called (that
    function fixes one dtype when registering; autocast's dtype is the caller's choice)."""
    global _AUTOCAST_LIBRARY
    if not policy:
        return
    if _AUTOCAST_LIBRARY is None:
        _AUTOCAST_LIBRARY = torch.library.Library("triton_workshop", "IMPL")
    overload = getattr(torch.ops.triton_workshop, name).default
    for device_type in policy.rules:
        key = _autocast_dispatch_key(device_type)
        excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

        def kernel(_keyset, *args, _device_type=device_type, _excluded=excluded, **kwargs):
            # Only reached while autocast is on for this device type (the key is excluded
            # otherwise); the op itself then runs with it off, as torch's autocast kernels do.
            dtype = policy.dtype_for(_device_type)
            if dtype is not None:
                args, kwargs = _cast_all(args, kwargs, _device_type, dtype)
            with torch._C._ExcludeDispatchKeyGuard(_excluded):
                return overload(*args, **(kwargs or {}))

        _AUTOCAST_LIBRARY.impl(name, kernel, key, with_keyset=True)


def follows_autocast(op: "RegisteredOp") -> Callable[[Callable], Callable]:
    """Decorate a public function so that its tensor arguments are cast as ``op`` declares for
    ``torch.autocast`` *before* the function checks them: ``linear(bf16 activation, fp32
    weight)`` under autocast is one dtype by the time ``linear`` asks for one dtype (outside
    autocast its check still refuses the mix, as torch's ``F.linear`` does)."""
    policy = op.autocast_policy

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def public(*args, **kwargs):
            if _any_autocast():
                args, kwargs = policy.cast(args, kwargs)
                return fn(*args, **(kwargs or {}))
            return fn(*args, **kwargs)

        public.autocast_policy = policy
        return public

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

    The eager call is written for the host's time (see :meth:`__call__`): a handful of C calls
    decide the path, the launcher runs in this frame (no wrapper), and the autograd Function is
    applied through torch's C entry point (the Python ``Function.apply`` in front of it only
    matters under functorch transforms, which take the dispatcher here).

    In that eager Function ``ctx.eager`` is True, so a ``setup_context`` can do work for the
    backward ahead of time, on the calling thread: CUDA backwards run on autograd's own device
    thread, where the same Python costs several times more (cold caches, a thread hand-off).
    A public function that kept the plans of a call signature applies a subclass of it whose
    forward launches them (:meth:`register_planned_forward`, :attr:`record_planned`): nothing
    is looked up again between the public function and the launch, forward or backward.

    Under ``torch.autocast`` the eager path applies the op's :class:`AutocastPolicy` itself,
    before the autograd Function, where the dispatcher's ``Autocast<Device>`` kernel applies the
    same policy on the other paths.
    """

    def __init__(self, op, launcher: Callable, autocast_policy: AutocastPolicy | None = None,
                 raw_launcher: Callable | None = None):
        self._op = op
        #: The launcher with its kernels launched directly (:func:`launch_directly`).
        self._launcher = launcher
        #: The launcher itself: :meth:`__call__` sets the direct-launch flag around it inline.
        self._raw = raw_launcher if raw_launcher is not None else launcher
        self._function = None
        #: ``self._function.apply`` without the Python layer in front of torch's C entry point.
        self._apply = None
        self.record = None
        self.record_planned = None
        #: How this op follows ``torch.autocast`` (declared by ``register_op(autocast=...)``).
        self.autocast_policy = autocast_policy if autocast_policy is not None else AutocastPolicy()
        self._casts = bool(self.autocast_policy.rules)
        self.__doc__ = launcher.__doc__

    def __getattr__(self, name):
        return getattr(self._op, name)

    def register_autograd(self, backward: Callable, *, setup_context: Callable | None = None):
        self._op.register_autograd(backward, setup_context=setup_context)
        raw = self._raw

        class EagerAutograd(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                ctx.eager = True  # setup_context may prepare the backward's launch (see above)
                if getattr(_direct, "on", False):
                    output = raw(*args)
                else:
                    _direct.on = True
                    try:
                        output = raw(*args)
                    finally:
                        _direct.on = False
                if setup_context is not None:
                    setup_context(ctx, args, output)
                return output

        # The op's backward itself: no frame of ours between autograd and it.
        EagerAutograd.backward = staticmethod(backward)
        EagerAutograd.__name__ = f"{self._op._name}_autograd"
        self._function = EagerAutograd
        self._apply = _c_apply(EagerAutograd)
        #: The eager autograd Function's apply, for a caller that :meth:`eager_path` sent down
        #: the ``RECORD`` path.
        self.record = self._apply

    def register_planned_forward(self, forward: Callable, backward: Callable | None = None
                                 ) -> None:
        """Give :attr:`record_planned`: the eager autograd Function (after
        :meth:`register_autograd`) with ``forward(ctx, *args)`` as its forward, for a public
        function on the ``RECORD`` path that kept its plans for the call's signature (what
        :meth:`__call__` would record, without working anything out again).

        ``forward`` does what the launcher and ``setup_context`` do for such a call: allocate,
        launch the kept plans, fill ``ctx`` for the op's backward. It takes the op's tensor
        arguments at their positions, since the backward is the op's and its gradients match
        the inputs by position (those past ``forward``'s arguments must be None: autograd
        drops them); a later argument stands in for the kept plans. An op whose backward has no
        gradient to spare (all its arguments tensors) gives ``backward``, the op's with one more
        gradient, None, for the plans' argument."""
        base = self._function

        class EagerAutograd(base):  # base's name: the grad_fn's class name is unchanged
            pass

        EagerAutograd.forward = staticmethod(forward)
        if backward is not None:
            EagerAutograd.backward = staticmethod(backward)
        EagerAutograd.__name__ = base.__name__
        #: ``EagerAutograd.apply`` through torch's C entry point, as :attr:`record`.
        self.record_planned = _c_apply(EagerAutograd)

    def eager_path(self, *args) -> int:
        """How :meth:`__call__` would run a call with these positional arguments: ``PLAIN`` (the
        launcher itself, no autograd), ``RECORD`` (the eager autograd Function) or 0 (anything
        else: tracing, a dispatch mode or functorch transform, a tensor subclass, autocast casts
        to apply, or no eager Function). A public function whose checks and launch decisions for
        these arguments are kept may then take that path itself (allocate and launch with
        :meth:`.plans.LaunchPlan.launch_eager`; or :attr:`record`), with nothing in between.

        Under ``torch.autocast`` the arguments its public function has cast already (all
        eligible ones of the autocast dtype) take these paths too: the op then computes what
        it would after casting them (how every training loop under autocast calls it)."""
        if (_is_compiling() or _jit_tracing() or _dispatch_modes()
                or _functorch_stack() is not None
                or (self._casts and self.autocast_policy.casts_any(args))):
            return 0
        grad = _grad_enabled()
        record = False
        for a in args:
            cls = type(a)
            if cls is _Tensor or cls is _Parameter:
                if grad and not record and a.requires_grad:
                    record = True
            elif isinstance(a, _Tensor):
                return 0
        if record:
            return RECORD if self._apply is not None else 0
        return PLAIN

    def __call__(self, *args, **kwargs):
        # One C call each: torch.compile tracing, jit tracing, a dispatch mode (make_fx,
        # FakeTensorMode), a functorch transform. Any of them, or keyword arguments: the
        # dispatcher (and the general path below) decides.
        if (kwargs or _is_compiling() or _jit_tracing() or _dispatch_modes()
                or _functorch_stack() is not None):
            return self._call_general(args, kwargs)
        grad = _grad_enabled()
        record = False
        for a in args:
            cls = type(a)
            if cls is _Tensor or cls is _Parameter:
                if grad and not record and a.requires_grad:
                    record = True
            elif isinstance(a, _Tensor):  # a subclass: only the dispatcher knows what to do
                return self._op(*args)
        if self._casts and _any_autocast():
            # Before the autograd Function, as torch's autocast sits above autograd: the casts
            # are recorded, and gradients reach fp32 leaves in fp32.
            args, _ = self.autocast_policy.cast(args)
        if record:
            if self._apply is not None:
                return self._apply(*args)
            return self._op(*args)
        if getattr(_direct, "on", False):  # nested: an op's launcher calling another op
            return self._raw(*args)
        _direct.on = True
        try:
            return self._raw(*args)
        finally:
            _direct.on = False

    def _call_general(self, args, kwargs):
        """The call with keyword arguments, or while something watches or traces it."""
        kind = _eager_kind(args, kwargs)
        if kind == "other":  # the dispatcher, whose Autocast kernel applies the same policy
            return self._op(*args, **kwargs)
        if self._casts and _any_autocast():
            args, kwargs = self.autocast_policy.cast(args, kwargs)
            kwargs = kwargs or {}
        if kind == "plain":
            return self._launcher(*args, **kwargs)
        if self._function is not None and not kwargs:
            return self._function.apply(*args)
        return self._op(*args, **kwargs)


#: :meth:`RegisteredOp.eager_path`'s answers besides 0.
PLAIN = 1
RECORD = 2


def _c_apply(function_class):
    """``function_class.apply`` as torch's C entry point bound to the class, or the Python
    ``apply`` where this torch lays it out otherwise. The Python layer binds default arguments
    for a separate ``setup_context`` (there is none here: forward takes ctx) and unwraps dead
    functorch wrappers (none: plain tensors, no transform active, checked before)."""
    base = getattr(torch._C, "_FunctionBase", None)
    c_apply = getattr(base, "__dict__", {}).get("apply")
    if c_apply is None or not hasattr(c_apply, "__get__"):
        return function_class.apply
    return c_apply.__get__(None, function_class)


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch._C.is_grad_enabled
_functorch_stack = getattr(torch._C._functorch, "peek_interpreter_stack", lambda: None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
# torch.jit.is_tracing() without its Python wrapper (checked after is_compiling(), which
# torch.compile resolves to True before it could trace this call).
_jit_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)
_Tensor = torch.Tensor
# A module's weights: a subclass that changes nothing torch dispatches on (no __torch_function__
# or __torch_dispatch__ of its own), so as plain as a tensor for the eager fast path.
_Parameter = torch.nn.Parameter


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
            if type(a) is not _Tensor and type(a) is not _Parameter:
                return "other"
            if grad and a.requires_grad:
                kind = "grad"
    return kind
