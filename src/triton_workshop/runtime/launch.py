"""Launching kernels, and the ONLY module that touches Triton's private API.

Everything here reaches past Triton's public surface: the compiled kernel's C launcher
(``CompiledKernel.run``), the autotuner's ``best_config``, the JIT function's parameters, launch
hooks in ``triton.knobs``, and one fix to the interpreter. Each use falls back to Triton's own
public launch when what it reads is not what it expects. Also here: :func:`device_guard`, so a
kernel launches on its tensor's own device.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading

import torch
import triton

from . import mode


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


if mode.INTERPRET:
    _squeeze_interpreter_index()


_NO_GUARD = contextlib.nullcontext()


def device_guard(t: torch.Tensor):
    """Launch on the tensor's own device (``cuda:1`` works), not on the current one. Switching
    devices costs microseconds of CPU a call: skipped when the tensor is on the current one."""
    device = t.device
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _NO_GUARD


# --------------------------------------------------------------------------------------------
# Launching a kernel again without Triton's per-launch Python.
# --------------------------------------------------------------------------------------------
#: ``TRITON_WORKSHOP_FAST_LAUNCH=0`` turns :class:`FastLaunch` off (every launch through Triton).
FAST_LAUNCH = not mode.INTERPRET and os.environ.get("TRITON_WORKSHOP_FAST_LAUNCH", "1") != "0"
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


def launch_prepared(kernel, grid, tensors: tuple, scalars: tuple, consts: dict, prepared: dict) -> None:
    """An eager ``kernel[grid](*tensors, *scalars, **consts)`` for a launcher that has a plan.

    ``prepared`` is a dict owned by the launcher's cached plan, which must fix ``grid``,
    ``scalars``, ``consts`` and the dtypes of ``tensors``. The first launch per device and
    pointer alignment goes through :class:`FastLaunch` (Triton compiles or finds the kernel);
    later ones reuse it as a :class:`PreparedLaunch`."""
    # The device of the first tensor is the current one (launchers launch under device_guard);
    # get_device() is cheaper than asking CUDA, on autograd's device thread especially.
    key = (tensors[0].get_device(), *[t.data_ptr() % 16 == 0 for t in tensors])
    launch_ = prepared.get(key)
    if launch_ is not None:
        launch_(*tensors, *scalars)
        return
    launch_ = fast_launcher(kernel).launch_and_prepare(grid, (*tensors, *scalars), consts)
    if launch_ is not None and len(prepared) < 64:  # a few devices x alignments in practice
        prepared[key] = launch_


FAST_LAUNCHERS: dict[int, FastLaunch] = {}


def _no_hook(hook) -> bool:
    """No launch hook: None (Triton 3.3-3.6) or an empty ``HookChain`` (later releases)."""
    return hook is None or (type(hook).__name__ == "HookChain" and not hook.calls)


#: ``triton.knobs.runtime`` (launch hooks live there from Triton 3.3 on), else None; looked up
#: once, not on every launch (the hooks themselves are read from it at each launch).
_RUNTIME_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


def fast_launcher(kernel) -> FastLaunch:
    launcher = FAST_LAUNCHERS.get(id(kernel))
    if launcher is None or launcher.kernel is not kernel:
        launcher = FAST_LAUNCHERS[id(kernel)] = FastLaunch(kernel)
    return launcher

