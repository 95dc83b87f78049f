"""Launching kernels: the direct launch of compiled kernels, past Triton's per-launch Python.

Everything here reaches past Triton's public surface: the compiled kernel's C launcher
(``CompiledKernel.run``), the autotuner's ``best_config``, the JIT function's parameters and
launch hooks in ``triton.knobs``. Each use falls back to Triton's own public launch when what it
reads is not what it expects, and while a setting that changes what Triton compiles or does
around a launch is on (debug, instrumentation, pre-run hooks, ...). tests/test_launch.py runs the
direct launches against the installed Triton's own objects (a kernel compiled for sm_90, no GPU
needed), so that a change in Triton shows there. Also here: :func:`device_guard`, so a kernel
launches on its tensor's own device, and :func:`stub_launches`, the no-GPU host timing switch.

Its neighbours, the other doors to Triton's private API, hold what is not on the launch path
(re-exported here, their old home): :mod:`.interpreter` (two fixes to the interpreter, applied
at import), :mod:`.stub` (the stand-ins :func:`stub_launches` installs) and
:mod:`.parallel_compile` (autotuning candidates compiled in parallel).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading

import torch
import triton

# Importing .interpreter applies its fixes. EARLY_JIT_FUNCTIONS, compile_ahead and
# parallel_compile_tuner are re-exported: this module was their home, and callers import them here.
from . import mode
from .interpreter import EARLY_JIT_FUNCTIONS  # noqa: F401
from .parallel_compile import compile_ahead, parallel_compile_tuner  # noqa: F401
from .stub import Stub

_NO_GUARD = contextlib.nullcontext()


#: The current CUDA device as an int: torch's C getter (a CUDA tensor exists, so CUDA is
#: initialised), without ``torch.cuda.current_device``'s Python in front of it.
_cuda_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def device_guard(t: torch.Tensor):
    """Launch on the tensor's own device (``cuda:1`` works), not on the current one. Switching
    devices costs microseconds of CPU a call: skipped when the tensor is on the current one
    (two flags and an int compared; no ``torch.device`` built)."""
    if t.is_cuda:
        index = t.get_device()
        if index != _cuda_device():
            return torch.cuda.device(index)
    return _NO_GUARD


# --------------------------------------------------------------------------------------------
# Launching a kernel again without Triton's per-launch Python.
# --------------------------------------------------------------------------------------------
#: ``TRITON_WORKSHOP_FAST_LAUNCH=0`` turns :class:`FastLaunch` off (every launch through Triton).
FAST_LAUNCH = not mode.INTERPRET and os.environ.get("TRITON_WORKSHOP_FAST_LAUNCH", "1") != "0"
#: Launch keys remembered per kernel (a key per shape in practice).
FAST_LAUNCH_CACHE_SIZE = 512

#: ``triton.knobs`` and its ``runtime`` / ``compilation`` groups (Triton >= 3.3), looked up once,
#: not on every launch (the settings themselves are read from them at each launch).
_KNOBS = getattr(triton, "knobs", None)
_RUNTIME_KNOBS = getattr(_KNOBS, "runtime", None)
_COMPILATION_KNOBS = getattr(_KNOBS, "compilation", None)
_HOOK_CHAIN = getattr(_KNOBS, "HookChain", None)

#: What a direct launch reads from ``triton.knobs`` at every launch. Triton 3.6-3.9 have all of
#: them; where one is missing the fast path is off (see :func:`_knobs_problem`).
_KNOBS_READ = (("runtime", "debug"), ("runtime", "launch_enter_hook"),
               ("runtime", "launch_exit_hook"), ("runtime", "add_stages_inspection_hook"),
               ("compilation", "instrumentation_mode"))

#: The parameters of the backend's C launcher (``CompiledKernel.run``) before the kernel's own
#: arguments, as :func:`_run_entry` passes them: Triton 3.7+ names them all; Triton 3.6 names the
#: first five and takes packed metadata, launch metadata and the two launch hooks in ``*args``,
#: in the same order.
_LAUNCHER_SIGNATURES = (
    ("gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata", "launch_metadata",
     "launch_enter_hook", "launch_exit_hook"),
    ("gridX", "gridY", "gridZ", "stream", "function"),
)


def _current_device() -> int:
    return torch.cuda.current_device()


def _launch_through_triton(kernel, grid, args, kwargs):
    """The first launch of a key: Triton binds, specialises, compiles or finds the kernel
    (and autotunes), launches it and returns the compiled kernel."""
    return kernel[grid](*args, **kwargs)


class _Drift(Exception):
    """Triton's objects are not what this module was written against."""


def _knobs_problem() -> str:
    """Which setting a direct launch reads is missing from ``triton.knobs`` ('' when none)."""
    for group, name in _KNOBS_READ:
        if not hasattr(getattr(_KNOBS, group, None), name):
            return f"triton.knobs.{group}.{name} is missing"
    if _HOOK_CHAIN is None:
        return "triton.knobs.HookChain is missing"
    return ""


_KNOBS_PROBLEM = _knobs_problem()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0", "false", "False")


def compile_settings_reason(jit) -> str:
    """The setting under which ``jit``'s launches must go through Triton ('' when none).

    Checked at the first launch of each key (when Triton compiles or looks the kernel up):
    everything that changes the code Triton compiles or what it does around a launch. Triton's
    own cache of compiled kernels keys on debug and instrumentation only; the compile-only
    settings (address sanitizer, IR override, another architecture) are here too, so that a
    kernel built or run under them always goes through Triton. The settings Triton reads at
    every launch are checked again at every direct launch (:func:`_run_entry`)."""
    runtime_knobs, compilation = _RUNTIME_KNOBS, _COMPILATION_KNOBS
    checks = (
        ("triton.knobs.runtime.debug", runtime_knobs.debug),
        ("TRITON_DEBUG", _env_flag("TRITON_DEBUG")),
        ("the kernel's debug=True", jit.debug),
        ("triton.knobs.compilation.instrumentation_mode", compilation.instrumentation_mode),
        ("TRITON_INSTRUMENTATION_MODE", os.environ.get("TRITON_INSTRUMENTATION_MODE")),
        ("triton.knobs.compilation.enable_asan", getattr(compilation, "enable_asan", False)),
        ("triton.knobs.compilation.override", getattr(compilation, "override", False)),
        ("triton.knobs.runtime.override_arch", getattr(runtime_knobs, "override_arch", None)),
        ("triton.knobs.runtime.add_stages_inspection_hook",
         runtime_knobs.add_stages_inspection_hook is not None),
        ("the kernel's pre-run hooks", jit.pre_run_hooks),
    )
    return next((name for name, on in checks if on), "")


_LAUNCHERS_CHECKED: set = set()


def _check_launcher(run) -> None:
    """Raise :class:`_Drift` unless ``run`` (``CompiledKernel.run``, the backend's launcher)
    takes its arguments as :func:`_run_entry` passes them. Once per launcher class."""
    cls = type(run)
    if cls in _LAUNCHERS_CHECKED:
        return
    try:
        params = list(inspect.signature(cls.__call__).parameters.values())[1:]  # without self
    except (TypeError, ValueError) as exc:
        raise _Drift(f"the launcher {cls.__name__} has no signature to check") from exc
    named = tuple(p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    rest = [p.kind for p in params if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if named not in _LAUNCHER_SIGNATURES or rest != [inspect.Parameter.VAR_POSITIONAL]:
        raise _Drift(f"the launcher {cls.__name__} takes ({', '.join(named)}, ...), not "
                     f"({', '.join(_LAUNCHER_SIGNATURES[0])}, *args)")
    _LAUNCHERS_CHECKED.add(cls)


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
    and the values it closes over).

    Triton's path is taken, always, for kernels whose arguments come from Python at each launch
    (tuning hooks ``reset_to_zero``, ``restore_value``, pre- and post-hooks, ``Heuristics``);
    and for as long as a setting changes what Triton compiles or does around a launch
    (:func:`compile_settings_reason`: debug, instrumentation, the kernel's pre-run hooks, ...);
    with a launch hook set, the compiled kernel's own runner calls it. Triton's objects are
    checked against what this class reads from them when it is made and when a key is first
    seen (:class:`_Drift`); any mismatch or failure turns the fast path off for the process,
    with a warning, and Triton's path takes over.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.cache: dict = {}
        self._lock = threading.RLock()
        self.jit = None
        self.arg_names: list = []
        self.defaults: dict = {}
        self.autotuned = False
        try:
            #: Why this kernel always launches through Triton ('' when it need not).
            self.reason = self._inspect(kernel)
        except Exception as exc:  # noqa: BLE001 - whatever Triton changed: its own path from now on
            self.reason = f"{type(exc).__name__}: {exc}"
            self._give_up(exc)
        self.usable = not self.reason

    def _inspect(self, kernel) -> str:
        """Read what the fast path needs from ``kernel`` (an ``Autotuner`` over a
        ``JITFunction``, or the ``JITFunction``); return why it cannot be used ('' when it can).
        Raises :class:`_Drift` (or AttributeError, ...) where Triton's objects differ."""
        if _KNOBS_PROBLEM:
            raise _Drift(_KNOBS_PROBLEM)
        chain = [kernel]
        while not (hasattr(chain[-1], "params") and hasattr(chain[-1], "arg_names")):
            if type(chain[-1]).__name__ == "InterpretedFunction":
                if _STUB is None:
                    return "the interpreter runs it: there is no compiled kernel to call"
                chain[-1] = _STUB.jit_of(chain[-1])
                break
            if len(chain) > 4:
                raise _Drift(f"no JITFunction under {type(kernel).__name__}")
            chain.append(chain[-1].fn)
        jit, wrappers = chain[-1], chain[:-1]
        if wrappers and (len(wrappers) > 1 or not hasattr(wrappers[0], "configs")):
            return (f"{' over '.join(type(w).__name__ for w in wrappers)} computes arguments "
                    "in Python at each launch")
        names = list(jit.arg_names)
        params = list(jit.params)
        if [p.name for p in params] != names or not all(isinstance(n, str) for n in names):
            raise _Drift(f"{type(jit).__name__}.params do not match its arg_names")
        defaults = {p.name: p.default for p in params if p.has_default}
        if not isinstance(jit.pre_run_hooks, list) or jit.debug not in (None, True, False):
            raise _Drift(f"{type(jit).__name__}.pre_run_hooks or .debug changed type")
        if not callable(getattr(kernel, "__getitem__", None)):
            raise _Drift(f"{type(kernel).__name__} cannot be launched as kernel[grid]")
        if wrappers:
            tuner = kernel
            configs = list(tuner.configs)
            if not configs or not all(callable(c.all_kwargs) for c in configs):
                raise _Drift(f"{type(tuner).__name__}.configs are not triton.Config objects")
            hooks = (tuner.reset_to_zero, tuner.restore_value, tuner.user_defined_pre_hook,
                     tuner.user_defined_post_hook, *(c.pre_hook for c in configs))
            if any(hooks):
                return "its tuning hooks run in Python at each launch"
        self.jit, self.arg_names, self.defaults = jit, names, defaults
        self.autotuned = bool(wrappers)
        return ""

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
            device = _current_device()
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
                compiled = _launch_through_triton(self.kernel, grid, args, kwargs)
                entry = self._new_entry(compiled, grid, args, kwargs, device)
                if entry is not None:
                    self.cache[key] = entry
            return compiled, entry
        try:
            if _run_entry(entry, args):
                return entry[0], entry
        except Exception as exc:  # noqa: BLE001 - any surprise: stop using the fast path
            self._give_up(exc)
        return self.kernel[grid](*args, **kwargs), None

    def _new_entry(self, compiled, grid, args, kwargs, device):
        """The cache entry for a launch Triton has just made, or None where later launches with
        its key go through Triton too (a setting of :func:`compile_settings_reason`, a config
        with a pre-hook, no compiled kernel returned, or anything unexpected)."""
        if compiled is None or compile_settings_reason(self.jit):
            return None  # None: a jit_cache_hook told Triton not to compile, nothing launched
        try:
            if self.autotuned and self.kernel.best_config.pre_hook is not None:
                return None
            return self._entry(compiled, grid, args, kwargs, device)
        except Exception as exc:  # noqa: BLE001 - any surprise: stop using the fast path
            self._give_up(exc)
            return None

    def _entry(self, compiled, grid, args, kwargs, device):
        """``(compiled kernel, 3-d grid, tail, C launcher, device, JIT function)`` for a launch
        just made; ``tail``: the values of the parameters after the positional ones (keyword
        arguments, the autotuner's constexprs, defaults), fixed for the key. Raises
        :class:`_Drift` where the compiled kernel is not what :func:`_run_entry` calls."""
        if type(compiled).__name__ != "CompiledKernel":
            raise _Drift(f"launch returned {type(compiled).__name__}, not a CompiledKernel")
        run = compiled.run  # the C launcher (loaded by the launch just made)
        _check_launcher(run)
        if compiled.function is None or not hasattr(compiled, "packed_metadata"):
            raise _Drift("the CompiledKernel has no loaded function or packed metadata")
        extra = dict(self.kernel.best_config.all_kwargs()) if self.autotuned else {}
        extra = {k: v for k, v in extra.items() if k in self.arg_names}
        all_args = self._all_args(args, kwargs, extra)
        if callable(grid):
            grid = grid(dict(zip(self.arg_names, all_args)))
        grid3 = (*grid, 1, 1)[:3]
        tail = tuple(all_args[len(args):])
        return compiled, grid3, tail, run, device, self.jit

    def _all_args(self, args, kwargs, extra) -> list:
        """Every kernel parameter's value, in order (what Triton passes its compiled kernel):
        positional arguments, keyword arguments, the autotuner's constexprs, then defaults."""
        values = dict(zip(self.arg_names, args))
        values.update(kwargs)
        values.update(extra)
        missing = [n for n in self.arg_names if n not in values and n not in self.defaults]
        if missing:
            raise _Drift(f"no value for parameter(s) {', '.join(missing)}")
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


def _run_entry(entry, args) -> bool:
    """Launch a :class:`FastLaunch` cache entry with the positional arguments ``args``; False
    (nothing launched) where a setting Triton reads at every launch says its own path must
    take this one."""
    compiled, grid3, tail, run, device, jit = entry
    runtime_knobs = _RUNTIME_KNOBS
    # What Triton's JITFunction.run reads at every launch besides the arguments: debug and
    # instrumentation are part of its cache key (another kernel would be compiled), a stages
    # hook too (Triton 3.7+), and it calls the kernel's pre-run hooks first.
    if (runtime_knobs.debug or jit.debug or jit.pre_run_hooks
            or _COMPILATION_KNOBS.instrumentation_mode
            or runtime_knobs.add_stages_inspection_hook is not None):
        return False
    stream = torch._C._cuda_getCurrentRawStream(device)
    try:
        hooked = runtime_knobs.launch_enter_hook.calls or runtime_knobs.launch_exit_hook.calls
    except AttributeError:  # a hook set as a plain function (or None), not added to the chain
        hooked = (runtime_knobs.launch_enter_hook is not None
                  or runtime_knobs.launch_exit_hook is not None)
    if hooked:  # the runner builds the hooks' launch metadata and hands them to the launcher
        compiled[grid3](*args, *tail, stream=stream)
    else:
        # What CompiledKernel's runner does when no launch hook is set, without building a
        # runner closure and its launch metadata every launch. The parameters after the
        # positional ones (``tail``) are part of the entry's key: fixed. Tensors go as their
        # addresses (see launch_ready: no driver call per pointer to validate it).
        run(*grid3, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args], *tail)
    return True


def launch_ready(prepared: dict, tensors: tuple, scalars: tuple) -> bool:
    """Launch ``tensors`` with the :class:`PreparedLaunch` of ``prepared`` (a plan's, see
    :func:`launch_prepared`) that matches their device and alignment, straight through Triton's
    C launcher; False (nothing launched) where there is none yet, or a setting or launch hook
    asks for Triton's own path (:func:`_run_entry`): the caller then launches as usual.

    The eager hot path of every planned launch: one dict lookup, the settings Triton reads at
    each launch, the current stream, the C launcher."""
    if not FAST_LAUNCH:
        return False
    # _ready_key inline (this runs at every launch). The addresses go to the C launcher as
    # ints: given a tensor, it calls data_ptr() again and asks the driver to validate the
    # address (cuPointerGetAttribute), one driver call per pointer, every launch; given an int
    # it takes the value. These tensors passed the op's checks at their signature's first call.
    bits = 0
    ptrs = []
    for t in tensors:
        ptr = t.data_ptr()
        bits |= ptr
        ptrs.append(ptr)
    ready = prepared.get(tensors[0].get_device() if bits & 15 == 0 else _ready_key(tensors))
    if ready is None:
        return False
    compiled, grid3, tail, run, device, jit = ready.entry
    runtime_knobs = _RUNTIME_KNOBS
    try:
        hooked = runtime_knobs.launch_enter_hook.calls or runtime_knobs.launch_exit_hook.calls
    except AttributeError:  # a launch hook set as a plain function: _run_entry's path
        return False
    # What Triton reads at every launch besides the arguments (see _run_entry).
    if (hooked or runtime_knobs.debug or jit.debug or jit.pre_run_hooks
            or _COMPILATION_KNOBS.instrumentation_mode
            or runtime_knobs.add_stages_inspection_hook is not None):
        return False
    try:
        run(*grid3, torch._C._cuda_getCurrentRawStream(device), compiled.function,
            compiled.packed_metadata, None, None, None, *ptrs, *scalars, *tail)
    except Exception as exc:  # noqa: BLE001 - as PreparedLaunch: Triton's path from now on
        FastLaunch._give_up(exc)
        return False
    return True


class PreparedLaunch:
    """One launch of a compiled kernel, to be repeated with other tensors.

    Made by :func:`launch_prepared` for a launcher whose *plan* (a cached description of one
    shape: grid, scalar arguments, constexprs, the tensors' dtypes) fixes everything Triton
    specialises on except the tensors' addresses. Calling it with new tensors of the same dtypes
    and 16-byte alignment, on the same device, runs Triton's C launcher and nothing else: no key
    over every argument (:class:`FastLaunch`'s cost), no binding (Triton's). Where a setting of
    :func:`_run_entry` is on, it launches through Triton."""

    __slots__ = ("kernel", "grid", "kwargs", "entry")

    def __init__(self, kernel, grid, kwargs, entry):
        self.kernel, self.grid, self.kwargs, self.entry = kernel, grid, kwargs, entry

    def __call__(self, *args) -> None:
        if FAST_LAUNCH:
            try:
                if _run_entry(self.entry, args):
                    return
            except Exception as exc:  # noqa: BLE001 - as FastLaunch: Triton's path from now on
                FastLaunch._give_up(exc)
        self.kernel[self.grid](*args, **self.kwargs)


def _ready_key(tensors: tuple):
    """The key of a :class:`PreparedLaunch` in a plan's ``prepared`` dict: the device, and the
    16-byte alignment of each tensor's data (all Triton specialises a pointer on). The usual
    case, every pointer aligned, is the device index alone (an int: never equal to the tuple of
    a mixed case)."""
    # The device of the first tensor is the current one (launchers launch under device_guard);
    # get_device() is cheaper than asking CUDA, on autograd's device thread especially.
    device = tensors[0].get_device()
    flags = tuple([t.data_ptr() & 15 == 0 for t in tensors])
    return device if all(flags) else (device, *flags)


def launch_prepared(kernel, grid, tensors: tuple, scalars: tuple, consts: dict, prepared: dict) -> None:
    """An eager ``kernel[grid](*tensors, *scalars, **consts)`` for a launcher that has a plan.

    ``prepared`` is a dict owned by the launcher's cached plan, which must fix ``grid``,
    ``scalars``, ``consts`` and the dtypes of ``tensors``. The first launch per device and
    pointer alignment goes through :class:`FastLaunch` (Triton compiles or finds the kernel);
    later ones reuse it as a :class:`PreparedLaunch`."""
    key = _ready_key(tensors)
    launch_ = prepared.get(key)
    if launch_ is not None:
        launch_(*tensors, *scalars)
        return
    launch_ = fast_launcher(kernel).launch_and_prepare(grid, (*tensors, *scalars), consts)
    if launch_ is not None and len(prepared) < 64:  # a few devices x alignments in practice
        prepared[key] = launch_


FAST_LAUNCHERS: dict[int, FastLaunch] = {}


def fast_launcher(kernel) -> FastLaunch:
    launcher = FAST_LAUNCHERS.get(id(kernel))
    if launcher is None or launcher.kernel is not kernel:
        launcher = FAST_LAUNCHERS[id(kernel)] = FastLaunch(kernel)
    return launcher


# --------------------------------------------------------------------------------------------
# Host time without a GPU.
# --------------------------------------------------------------------------------------------
#: The stand-ins of :func:`stub_launches` (None: kernels launch for real).
_STUB: "Stub | None" = None


def stub_launches() -> None:
    """Measure the host's time of eager calls on a machine without a GPU (scripts/host_probe.py
    --stub): from now on, in this process, kernels take the GPU's direct launch path
    (:class:`FastLaunch`, plans' prepared launches, the C launcher's arguments), but the first
    launch of a key makes a stand-in for the compiled kernel instead of going to Triton, and the
    C launcher does nothing. Outputs are never written. Irreversible: for measuring only."""
    global _STUB, FAST_LAUNCH, _current_device, _launch_through_triton
    _STUB = Stub()
    FAST_LAUNCH = True
    torch._C._cuda_getCurrentRawStream = lambda device: 0  # stream 0 (a CPU build has none)
    _current_device = lambda: 0  # noqa: E731
    _launch_through_triton = _STUB.first_launch
    FAST_LAUNCHERS.clear()  # made before the stub: without a fast path
