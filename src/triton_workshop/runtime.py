"""Where kernels run, and what every launcher needs before it launches one.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` *decorates* a function, so the choice between
the interpreter and the GPU compiler has to be made before any kernel module is imported. This module
makes it once, on import (``triton_workshop/__init__.py`` imports it first):

* the user set ``TRITON_INTERPRET=1``: interpreter, even on a GPU machine;
* no CUDA device: interpreter, set for the user, and said once on stderr;
* otherwise: kernels compile for the GPU.

It also holds the argument checks that every launcher runs (clear ``TypeError``/``ValueError`` naming
the argument, before anything launches), the device guard, autotuning that degrades to one config
in the interpreter, and the one helper that registers an op with ``torch.library``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

_QUIET = os.environ.get("TRITON_WORKSHOP_QUIET", "") not in ("", "0")


def _decide_interpreter() -> tuple[bool, str]:
    flag = os.environ.get("TRITON_INTERPRET", "")
    if flag not in ("", "0"):
        return True, "TRITON_INTERPRET=1 is set"
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        return True, "no CUDA device found"
    return False, ""


INTERPRET, INTERPRET_REASON = _decide_interpreter()

#: The device new tensors should live on: the GPU when there is one (the interpreter reads CUDA
#: tensors too), the CPU otherwise.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

if INTERPRET and not _QUIET:
    print(
        f"triton-workshop: interpreter mode ({INTERPRET_REASON}): kernels run on the CPU through "
        "Triton's interpreter; results are exact, speed is not representative.",
        file=sys.stderr,
    )

import triton  # noqa: E402  (after the decision above, on purpose)
import triton.language as tl  # noqa: E402


def _squeeze_interpreter_index() -> bool:
    """Make the interpreter's scalars usable as ``range()`` bounds under NumPy >= 2.4.

    The interpreter holds a scalar as a shape-(1,) array, and Triton <= 3.6 turns it into a Python
    int with ``int(array)``, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted
    to Python scalars"): every loop with a runtime bound then fails. Triton 3.7 squeezes first
    (triton-lang/triton#9172); on older versions the same one-line fix is applied here. Returns
    whether it was applied."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - a Triton without an interpreter module
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or "squeeze" in inspect.getsource(original):
        return False

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


if INTERPRET:
    _squeeze_interpreter_index()

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def mode_description() -> str:
    if INTERPRET:
        return f"interpreter ({INTERPRET_REASON})"
    return f"GPU: {torch.cuda.get_device_name()}"


# --------------------------------------------------------------------------------------------
# Argument checks. Each raises before any kernel launches and names the argument.
# --------------------------------------------------------------------------------------------
def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    t,
    name: str,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | Sequence[int] | None = None,
) -> None:
    """Type, device, dtype and rank of one tensor argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_kernel_device(t, name)
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {t.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")


def check_kernel_device(t: torch.Tensor, name: str) -> None:
    """On the GPU a kernel reads CUDA memory only; the interpreter reads CPU and CUDA tensors."""
    if t.device.type == "cuda":
        return
    if INTERPRET and t.device.type == "cpu":
        return
    where = "a CUDA device" if not INTERPRET else "the CPU or a CUDA device"
    hint = " (move it with .cuda())" if t.device.type == "cpu" else ""
    raise ValueError(f"{name} must be on {where}, got a tensor on {t.device}{hint}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """All named tensors on one device: a kernel cannot read across devices."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(
                f"{name} is on {t.device} but {first_name} is on {first.device}: "
                "all tensors must be on the same device"
            )


def check_same_dtype(**tensors: torch.Tensor) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}: "
                "they must match"
            )


_NO_GUARD = contextlib.nullcontext()


def device_guard(t: torch.Tensor):
    """Launch on the tensor's own device (``cuda:1`` works), not on the current one. Switching
    devices costs microseconds of CPU a call: skipped when the tensor is on the current one."""
    device = t.device
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _NO_GUARD


# --------------------------------------------------------------------------------------------
# Host-side integer helpers. triton.cdiv / triton.next_power_of_2 work too, but newer Triton
# versions route host calls through a constexpr-function wrapper that costs more than the
# arithmetic; these run on every launch. Symbolic sizes (torch.compile) take Triton's path.
# --------------------------------------------------------------------------------------------
def cdiv(a, b):
    """Ceiling division: programs needed for ``a`` items at ``b`` per program."""
    return -(-a // b)


def next_power_of_2(n):
    """Smallest power of two >= ``n`` (0 for 0, like Triton's)."""
    if type(n) is int and n >= 0:
        return 1 << (n - 1).bit_length() if n > 0 else 0
    return triton.next_power_of_2(n)


# --------------------------------------------------------------------------------------------
# Tuning.
# --------------------------------------------------------------------------------------------
def _no_timing(kernel_call, quantiles=None, **kwargs):
    """do_bench for a single candidate: no run, equal timings (the real launch follows)."""
    return [0.0, 0.0, 0.0] if quantiles is not None else 0.0


def autotune(configs: Sequence[triton.Config], key: Sequence[str], **kwargs):
    """``triton.autotune`` on the GPU; in the interpreter only the first config (which must be
    a sensible default), because the interpreter cannot benchmark. ``TRITON_WORKSHOP_AUTOTUNE=0``
    asks for one config on the GPU too (fast test runs: each config is a compile): the first that
    the kernel's ``early_config_prune`` keeps, or the first."""
    configs = list(configs)
    if INTERPRET:
        configs = configs[:1]
    elif os.environ.get("TRITON_WORKSHOP_AUTOTUNE", "1") == "0":
        # The first config the kernel's pruning keeps (configs[0] may not fit every shape: a
        # D = 256 attention tile overflows shared memory), else simply the first.
        prune = dict(kwargs.get("prune_configs_by") or {})
        early = prune.get("early_config_prune")
        if early is None:
            configs = configs[:1]
        else:
            prune["early_config_prune"] = lambda cfgs, named_args, **kw: list(
                early(cfgs, named_args, **kw))[:1]
            kwargs["prune_configs_by"] = prune
            # Triton before ~3.7 still times a lone pruned config; nothing to compare it with.
            if "do_bench" in inspect.signature(triton.autotune).parameters:
                kwargs.setdefault("do_bench", _no_timing)
    return triton.autotune(configs=configs, key=list(key), **kwargs)


def num_sms(device: torch.device | None = None) -> int:
    """Streaming multiprocessors of ``device`` (4 in the interpreter, which has none)."""
    if INTERPRET or not torch.cuda.is_available():
        return 4
    index = device.index if device is not None and device.index is not None else None
    return _num_sms(torch.cuda.current_device() if index is None else index)


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# --------------------------------------------------------------------------------------------
# Launch heuristics for row-wise kernels (softmax, layer norm, ...).
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowTile:
    """How a row-wise kernel is launched: ``rows`` rows of ``block_cols`` lanes per program."""

    block_cols: int
    rows: int
    num_warps: int


def num_warps_for(elements: int) -> int:
    """Warps for a program that touches ``elements`` values at once: about 16 per thread, so
    registers hold the block without spilling and each thread has several loads in flight."""
    if elements >= 32768:
        return 32
    if elements >= 8192:
        return 16
    if elements >= 2048:
        return 8
    return 4


def row_tile(n_cols: int, n_rows: int, *, tile_elems: int, max_rows: int) -> RowTile:
    """Single-block launch: the whole row in ``next_power_of_2(n_cols)`` lanes, and as many rows
    a program as fit in ``tile_elems`` (no more than there are rows). A heuristic on the row
    length, not autotuning, so a new shape launches at once (and the interpreter stays fast)."""
    block_cols = next_power_of_2(n_cols)
    rows = max(1, min(tile_elems // block_cols, max_rows, next_power_of_2(n_rows)))
    return RowTile(block_cols, rows, num_warps_for(rows * block_cols))


def chunk_tile(n_cols: int, chunk_cols: int) -> RowTile:
    """Multi-block launch: one row a program, ``chunk_cols`` lanes a step."""
    block_cols = min(chunk_cols, next_power_of_2(n_cols))
    return RowTile(block_cols, 1, num_warps_for(block_cols))


def acc_dtype(dtype: torch.dtype):
    """The arithmetic type inside the kernels: fp32, or fp64 for fp64 tensors."""
    return tl.float64 if dtype == torch.float64 else tl.float32


# --------------------------------------------------------------------------------------------
# Registration with torch.library, so that every public op works under torch.compile.
# --------------------------------------------------------------------------------------------
from torch._library.triton import is_wrap_triton_enabled  # noqa: E402


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
        return _fast_launcher(kernel) if FAST_LAUNCH else kernel
    return torch.library.wrap_triton(kernel)


# --------------------------------------------------------------------------------------------
# Launching a kernel again without Triton's per-launch Python.
# --------------------------------------------------------------------------------------------
#: ``TRITON_WORKSHOP_FAST_LAUNCH=0`` turns :class:`FastLaunch` off (every launch through Triton).
FAST_LAUNCH = not INTERPRET and os.environ.get("TRITON_WORKSHOP_FAST_LAUNCH", "1") != "0"
#: Launch keys remembered per kernel (a key per shape in practice).
FAST_LAUNCH_CACHE_SIZE = 512


class FastLaunch:
    """``kernel[grid](*args, **kwargs)`` that remembers what Triton decided the first time.

    Each launch through Triton binds and specialises every argument, looks the compiled kernel
    up, and for autotuned kernels builds the tuning key, all in Python: 50-150 µs of CPU a launch
    on the GPU machine's host, more than many of these kernels run. The first launch with a
    given *launch key* goes through Triton as usual; the compiled kernel it used (and, for
    autotuned kernels, the config it chose) is stored under that key, and later launches with
    the same key call the compiled kernel directly.

    The key is stricter than Triton's own specialisation, so it can never pick a kernel Triton
    would not: every non-tensor argument by type and exact value, every tensor by dtype and
    16-byte alignment of its data pointer (all Triton specialises a pointer on), the keyword
    arguments (constexprs, launch options), the device, and the grid (a callable grid by its code
    and the values it closes over). Kernels with tuning hooks (``reset_to_zero``,
    ``restore_value``, pre-hooks) always take Triton's path. Any failure turns the fast path off
    for the process, with a warning, and Triton's path takes over.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        jit = kernel
        while not hasattr(jit, "arg_names") or not hasattr(jit, "params"):
            jit = jit.fn
        self.arg_names = list(jit.arg_names)
        self.defaults = {p.name: p.default for p in jit.params if p.has_default}
        self.autotuned = hasattr(kernel, "configs")
        self.cache: dict = {}
        self._lock = threading.RLock()
        self.usable = not (self.autotuned and (
            kernel.reset_to_zero or kernel.restore_value
            or getattr(kernel, "user_defined_pre_hook", False)
            or getattr(kernel, "user_defined_post_hook", False)
            or any(c.pre_hook for c in kernel.configs)))

    def __getitem__(self, grid):
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **kwargs):
        return self._launch_keyed(grid, args, kwargs)[0]

    def launch_and_prepare(self, grid, args, kwargs) -> "PreparedLaunch | None":
        """Launch ``kernel[grid](*args, **kwargs)`` and return it as a :class:`PreparedLaunch`
        (None where the fast path does not hold this launch)."""
        _, entry = self._launch_keyed(grid, args, kwargs)
        if entry is None:
            return None
        return PreparedLaunch(self.kernel, grid, kwargs, entry)

    def _launch_keyed(self, grid, args, kwargs):
        """The launch; returns ``(what it returned, the cache entry of its key or None)``."""
        if not (FAST_LAUNCH and self.usable):
            return self.kernel[grid](*args, **kwargs), None
        try:
            if callable(grid):
                cells = grid.__closure__ or ()
                grid_key = (grid.__code__, tuple(c.cell_contents for c in cells))
            else:
                grid_key = tuple(grid)
            device = torch.cuda.current_device()
            # Inline, not a function call per argument (most of the key's cost): a positional
            # tensor by dtype and 16-byte alignment, an int by itself, anything else by type and
            # value (so a positional True and 1 are different keys). Keyword arguments (the
            # constexprs) are keyed by value, as Triton's own cache keys them.
            args_key = tuple([a if type(a) is int else (
                (a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else _other_key(a))
                for a in args])
            key = (grid_key, device, args_key, tuple(kwargs.items()))
            entry = self.cache.get(key)
        except TypeError:  # something unhashable: Triton's path
            return self.kernel[grid](*args, **kwargs), None
        if entry is None:
            # One thread at a time through Triton here: _entry reads the autotuner's best_config,
            # which another thread's launch of this kernel could change in between.
            with self._lock:
                if len(self.cache) >= FAST_LAUNCH_CACHE_SIZE:  # many shapes: start over, bounded
                    self.cache.clear()
                compiled = self.kernel[grid](*args, **kwargs)
                try:
                    entry = self.cache[key] = self._entry(compiled, grid, args, kwargs, device)
                except Exception as exc:  # noqa: BLE001 - any surprise: stop using the fast path
                    self._give_up(exc)
            return compiled, entry
        try:
            _run_entry(entry, args)
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)
            return self.kernel[grid](*args, **kwargs), None
        return entry[0], entry

    def _entry(self, compiled, grid, args, kwargs, device):
        """``(compiled kernel, 3-d grid, tail, C launcher, device)`` for a launch just made;
        ``tail``: the values of the parameters after the positional ones (keyword arguments, the
        autotuner's constexprs, defaults), fixed for the key."""
        if type(compiled).__name__ != "CompiledKernel":
            raise TypeError(f"launch returned {type(compiled).__name__}, not a CompiledKernel")
        extra = dict(self.kernel.best_config.all_kwargs()) if self.autotuned else {}
        extra = {k: v for k, v in extra.items() if k in self.arg_names}
        all_args = self._all_args(args, kwargs, extra)
        if callable(grid):
            grid = grid(dict(zip(self.arg_names, all_args)))
        grid3 = (*grid, 1, 1)[:3]
        tail = tuple(all_args[len(args):])
        return compiled, grid3, tail, compiled.run, device  # compiled.run: the C launcher

    def _all_args(self, args, kwargs, extra) -> list:
        """Every kernel parameter's value, in order (what Triton passes its compiled kernel):
        positional arguments, keyword arguments, the autotuner's constexprs, then defaults."""
        values = dict(zip(self.arg_names, args))
        values.update(kwargs)
        values.update(extra)
        return [values[n] if n in values else self.defaults[n] for n in self.arg_names]

    @staticmethod
    def _give_up(exc: BaseException) -> None:
        global FAST_LAUNCH
        FAST_LAUNCH = False
        import warnings

        warnings.warn(f"triton-workshop: fast kernel launches disabled ({type(exc).__name__}: {exc}); "
                      "launching through Triton", RuntimeWarning, stacklevel=3)


def _other_key(a):
    """A launch-key part for an argument that is neither an int nor a tensor: a TMA tensor
    descriptor by everything Triton compiles or fills its CUtensorMap from, except the base's
    address (its dtype and 16-byte alignment, as for a tensor); anything else by type and value."""
    if type(a).__name__ == "TensorDescriptor":
        base = a.base
        return (type(a), base.dtype, base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides),
                tuple(a.block_shape), a.padding)
    return (type(a), a)


def _run_entry(entry, args) -> None:
    """Launch a :class:`FastLaunch` cache entry with the positional arguments ``args``."""
    compiled, grid3, tail, run, device = entry
    stream = _current_raw_stream(device)
    if _RUNTIME_KNOBS is not None and _no_hook(_RUNTIME_KNOBS.launch_enter_hook) \
            and _no_hook(_RUNTIME_KNOBS.launch_exit_hook):
        # What CompiledKernel's runner does when no launch hook is set (Triton >= 3.3), without
        # building a runner closure and its launch metadata every launch. The parameters after
        # the positional ones (``tail``) are part of the entry's key: fixed.
        run(*grid3, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *args, *tail)
    else:
        compiled[grid3](*args, *tail, stream=stream)


def _current_raw_stream(device: int):
    return torch._C._cuda_getCurrentRawStream(device)


class PreparedLaunch:
    """One launch of a compiled kernel, to be repeated with other tensors.

    Made by :func:`launch` for a launcher whose *plan* (a cached description of one shape:
    grid, scalar arguments, constexprs, the tensors' dtypes) fixes everything Triton specialises
    on except the tensors' addresses. Calling it with new tensors of the same dtypes and 16-byte
    alignment, on the same device, runs Triton's C launcher and nothing else: no key over every
    argument (:class:`FastLaunch`'s cost), no binding (Triton's)."""

    __slots__ = ("kernel", "grid", "kwargs", "entry")

    def __init__(self, kernel, grid, kwargs, entry):
        self.kernel, self.grid, self.kwargs, self.entry = kernel, grid, kwargs, entry

    def __call__(self, *args) -> None:
        if FAST_LAUNCH:
            try:
                _run_entry(self.entry, args)
                return
            except Exception as exc:  # noqa: BLE001 - as FastLaunch: Triton's path from now on
                FastLaunch._give_up(exc)
        self.kernel[self.grid](*args, **self.kwargs)


def launch(kernel, grid, tensors: tuple, scalars: tuple, consts: dict, prepared: dict | None) -> None:
    """``kernel[grid](*tensors, *scalars, **consts)`` for a launcher that has a plan.

    ``prepared`` is a dict owned by the launcher's cached plan, which must fix ``grid``,
    ``scalars``, ``consts`` and the dtypes of ``tensors``. The first eager launch per device and
    pointer alignment goes through :class:`FastLaunch` (Triton compiles or finds the kernel);
    later ones reuse it as a :class:`PreparedLaunch`. ``prepared=None``, tracing (torch.compile)
    and the interpreter launch through :func:`wrap_triton` as usual."""
    if prepared is None or not (FAST_LAUNCH and getattr(_direct, "on", False)):
        wrap_triton(kernel)[grid](*tensors, *scalars, **consts)
        return
    # The device of the first tensor is the current one (launchers launch under device_guard);
    # get_device() is cheaper than asking CUDA, on autograd's device thread especially.
    key = (tensors[0].get_device(), *[t.data_ptr() % 16 == 0 for t in tensors])
    launch_ = prepared.get(key)
    if launch_ is not None:
        launch_(*tensors, *scalars)
        return
    launch_ = _fast_launcher(kernel).launch_and_prepare(grid, (*tensors, *scalars), consts)
    if launch_ is not None and len(prepared) < 64:  # a few devices x alignments in practice
        prepared[key] = launch_


_FAST_LAUNCHERS: dict[int, FastLaunch] = {}


def _no_hook(hook) -> bool:
    """No launch hook: None (Triton 3.3-3.6) or an empty ``HookChain`` (later releases)."""
    return hook is None or (type(hook).__name__ == "HookChain" and not hook.calls)


#: ``triton.knobs.runtime`` (launch hooks live there from Triton 3.3 on), else None; looked up
#: once, not on every launch (the hooks themselves are read from it at each launch).
_RUNTIME_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


def _fast_launcher(kernel) -> FastLaunch:
    launcher = _FAST_LAUNCHERS.get(id(kernel))
    if launcher is None or launcher.kernel is not kernel:
        launcher = _FAST_LAUNCHERS[id(kernel)] = FastLaunch(kernel)
    return launcher


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
        if INTERPRET:
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
