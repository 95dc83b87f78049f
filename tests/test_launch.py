"""runtime.launch: direct launches of compiled kernels (FastLaunch, PreparedLaunch), checked
against the installed Triton's real objects.

Everything Triton does in Python here is real: ``triton.jit`` / ``triton.autotune`` objects,
``JITFunction.run`` binding and specialising the arguments, Triton's compiler building the kernel
for an H100 (sm_90, ``GPUTarget``), the ``CompiledKernel`` it returns. Only the CUDA driver is
replaced (:class:`_RecordingDriver`), because there may be no GPU: it names sm_90 as the target,
"loads" the binary, and its launcher (with the real ``CudaLauncher``'s signature) records what it
is called with instead of launching. So a direct launch can be compared, argument for argument,
with the call Triton's own launch makes, and a change in any of these objects shows up here.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import warnings

import pytest
import torch

import triton_workshop  # first: it chooses the mode before Triton decorates anything
from triton_workshop import runtime
from triton_workshop.runtime import launch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver as triton_driver
from triton.runtime.jit import JITFunction

try:
    from triton.backends.nvidia.driver import CudaLauncher
except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
    CudaLauncher = None

STREAM = 7          # the raw CUDA stream the recording driver and torch report
FUNCTION = 0xF00D   # the CUfunction handle the recording driver "loads"


# --------------------------------------------------------------------------------------------
# Kernels (plain functions: each test decorates its own, so Triton's caches start empty).
# --------------------------------------------------------------------------------------------
def _axpy(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, SCALE: tl.constexpr = 2):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * SCALE + y, mask=mask)


def _scale(x_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


class _RecordingDriver:
    """Triton's ``driver.active`` for an H100 that is not there: what JITFunction.run and
    CompiledKernel ask the CUDA driver, answered; launches recorded in ``launches``."""

    def __init__(self):
        self.launches: list[tuple] = []
        self.launchers: list = []
        driver = self

        class RecordingLauncher:
            def __init__(self, src, metadata):
                self.metadata = metadata
                driver.launchers.append(self)

            def __call__(self, *args):
                driver.launches.append(args)

        if CudaLauncher is not None:  # the real launcher's signature, which launch checks
            RecordingLauncher.__call__.__signature__ = inspect.signature(CudaLauncher.__call__)
        self.launcher_cls = RecordingLauncher
        self.utils = self

    # driver.active
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return STREAM

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    # driver.active.utils
    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536,
                "warpSize": 32}

    def load_binary(self, name, kernel, shared, device):
        assert kernel, "no binary was compiled"
        return None, FUNCTION, 32, 0, 1024  # module, function, registers, spills, max threads

    def unload_module(self, module):
        pass


class _Launch:
    """One recorded launcher call, split as the launcher's parameters are."""

    def __init__(self, args: tuple):
        self.args = args
        self.grid, self.stream, self.function, self.packed_metadata = args[:3], args[3], args[4], args[5]
        self.launch_metadata, self.hooks, self.kernel_args = args[6], args[7:9], args[9:]

    def same_kernel_args(self, other: "_Launch") -> bool:
        """The same arguments; a tensor (as Triton passes it) and its address (as a direct
        launch passes it: the C launcher takes an int as the address itself) are the same."""
        def address(a):
            return a.data_ptr() if isinstance(a, torch.Tensor) else a

        return len(self.kernel_args) == len(other.kernel_args) and all(
            a is b or (address(a) == address(b) if isinstance(a, torch.Tensor)
                       or isinstance(b, torch.Tensor) else type(a) is type(b) and a == b)
            for a, b in zip(self.kernel_args, other.kernel_args))


class _Sm90:
    """The fixture's handle: decorate kernels for the GPU, count launches through Triton."""

    def __init__(self, monkeypatch, driver: _RecordingDriver):
        self.monkeypatch, self.driver = monkeypatch, driver
        self.through_triton: list[str] = []  # one entry per JITFunction.run launch

    def jit(self, fn, **options):
        """``triton.jit(fn)`` as on a GPU machine (the interpreter is chosen at decoration)."""
        with self.monkeypatch.context() as m:
            m.setenv("TRITON_INTERPRET", "0")
            jit = triton.jit(fn, **options) if options else triton.jit(fn)
        assert type(jit).__name__ == "JITFunction", type(jit)
        run = jit.run

        def counted_run(*args, **kwargs):
            if not kwargs.get("warmup"):
                self.through_triton.append(fn.__name__)
            return run(*args, **kwargs)

        jit.run = counted_run
        return jit

    @property
    def launches(self) -> list[_Launch]:
        return [_Launch(a) for a in self.driver.launches]


# triton.language as it is before any kernel has run in the interpreter. A call of a jit function
# outside a kernel's run (InterpretedFunction.__call__, Triton 3.6-3.9) patches triton.language
# for the interpreter and never restores it; a real compile after that fails in the code
# generator, whenever a test in this process ran such a call first and the Triton cache is cold.
_LANGUAGE = (tl, tl.core, tl.core.tensor, tl.math, tl.core.tensor_descriptor_base)
_PRISTINE = [(obj, dict(vars(obj))) for obj in _LANGUAGE]


def _restore_language(monkeypatch) -> None:
    for obj, attrs in _PRISTINE:
        for name in set(vars(obj)) - set(attrs):
            monkeypatch.delattr(obj, name)
        for name, value in attrs.items():
            if vars(obj).get(name, _PRISTINE) is not value:
                monkeypatch.setattr(obj, name, value)


@pytest.fixture
def sm90(monkeypatch):
    """Real Triton objects compiled for sm_90, launched against :class:`_RecordingDriver`."""
    _restore_language(monkeypatch)
    driver = _RecordingDriver()
    monkeypatch.setattr(triton_driver, "_active", driver)
    # Where Triton was imported before this package chose interpreter mode, launch routed every
    # JITFunction to the interpreter; these compile for the GPU: Triton's own methods back.
    for name, method in getattr(JITFunction, "_triton_workshop_compiled", {}).items():
        monkeypatch.setattr(JITFunction, name, method)
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: STREAM, raising=False)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns while it is unset
    return _Sm90(monkeypatch, driver)


def _tensors(n=100, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for _ in range(3)]


def _autotuned(sm90, configs=None, **options):
    configs = configs or [triton.Config({"BLOCK": 64}, num_warps=2)]
    return triton.autotune(configs=configs, key=["n"], **options)(sm90.jit(_axpy))


# --------------------------------------------------------------------------------------------
# What the fast path reads from Triton, on the installed Triton's own objects.
# --------------------------------------------------------------------------------------------
def test_knobs_have_what_a_direct_launch_reads():
    assert launch._KNOBS_PROBLEM == ""
    knobs = triton.knobs
    assert isinstance(knobs.runtime.debug, bool)
    assert isinstance(knobs.compilation.instrumentation_mode, str)
    assert knobs.runtime.add_stages_inspection_hook is None
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        assert type(hook) is launch._HOOK_CHAIN and hook.calls == []


@pytest.mark.skipif(CudaLauncher is None, reason="this Triton has no NVIDIA backend")
def test_cuda_launcher_takes_what_a_direct_launch_passes():
    launch._check_launcher(object.__new__(CudaLauncher))  # no GPU needed: its signature only

    class Reordered:
        def __call__(self, gridX, gridY, gridZ, function, stream, *args):
            pass

    with pytest.raises(launch._Drift, match="Reordered takes"):
        launch._check_launcher(Reordered())
    with pytest.raises(launch._Drift):
        launch._check_launcher(lambda *args: None)  # no parameters to check at all


def test_jit_function_and_autotuner_have_what_fast_launch_reads(sm90):
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    assert fast.usable and fast.reason == "" and not fast.autotuned
    assert fast.jit is jit
    assert fast.arg_names == ["x_ptr", "y_ptr", "out_ptr", "n", "BLOCK", "SCALE"]
    assert fast.defaults == {"SCALE": 2}
    assert jit.pre_run_hooks == [] and jit.debug is None

    tuner = _autotuned(sm90)
    fast = launch.FastLaunch(tuner)
    assert fast.usable and fast.autotuned and fast.jit is tuner.fn
    assert tuner.reset_to_zero == [] and tuner.restore_value == []
    assert tuner.user_defined_pre_hook is False and tuner.user_defined_post_hook is False
    assert tuner.configs[0].pre_hook is None
    assert tuner.configs[0].all_kwargs()["BLOCK"] == 64


def test_compiled_kernel_for_sm90_has_what_a_direct_launch_reads(sm90):
    jit = sm90.jit(_axpy)
    x, y, out = _tensors()
    compiled = launch.FastLaunch(jit)[(4,)](x, y, out, 100, BLOCK=32)
    assert isinstance(compiled, triton.compiler.CompiledKernel)
    assert type(compiled).__name__ == "CompiledKernel"
    assert compiled.metadata.target == GPUTarget("cuda", 90, 32)
    assert compiled.asm["ptx"].count(".target sm_90") == 1
    (made,) = sm90.launches
    # What Triton's own launch handed its launcher is what a direct launch passes.
    assert made.grid == (4, 1, 1) and made.stream == STREAM
    assert made.function == compiled.function == FUNCTION
    assert made.packed_metadata is compiled.packed_metadata
    assert compiled.run is sm90.driver.launchers[-1]
    # Every parameter in order, the constexprs and the default included.
    assert made.same_kernel_args(_Launch((0,) * 9 + (x, y, out, 100, 32, 2)))
    assert all(type(h) is launch._HOOK_CHAIN for h in made.hooks)
    assert callable(compiled.__getitem__)  # the runner, taken while a launch hook is set


# --------------------------------------------------------------------------------------------
# Direct launches: the same launcher call as Triton's, for the same key only.
# --------------------------------------------------------------------------------------------
def test_direct_launch_passes_the_launcher_what_triton_passes(sm90):
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors()
    first = fast[(4,)](x, y, out, 100, BLOCK=32)
    again = fast[(4,)](x, y, out, 100, BLOCK=32)
    assert again is first
    assert sm90.through_triton == ["_axpy"]  # the second launch did not go through Triton
    by_triton, direct = sm90.launches
    assert direct.args[:6] == by_triton.args[:6]
    assert direct.same_kernel_args(by_triton)
    assert direct.launch_metadata is None and direct.hooks == (None, None)  # no hook set


def test_autotuned_kernel_with_a_grid_function(sm90):
    tuner = _autotuned(sm90)
    fast = launch.FastLaunch(tuner)
    x, y, out = _tensors(1000)
    n = 1000

    def grid(meta):
        return (runtime.cdiv(n, meta["BLOCK"]),)

    fast[grid](x, y, out, n)
    fast[grid](x, y, out, n)
    assert sm90.through_triton == ["_axpy"]
    by_triton, direct = sm90.launches
    assert by_triton.grid == direct.grid == (16, 1, 1)  # BLOCK = 64, the autotuner's config
    assert direct.args[:6] == by_triton.args[:6] and direct.same_kernel_args(by_triton)
    assert direct.kernel_args[4:] == (64, 2)


def test_a_new_key_goes_through_triton(sm90):
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors(128)
    fast[(4,)](x, y, out, 100, BLOCK=32)
    fast[(4,)](y, x, out, 100, BLOCK=32)  # other tensors, same key: direct
    assert sm90.through_triton == ["_axpy"]
    fast[(4,)](x, y, out, 101, BLOCK=32)           # another int value
    fast[(4,)](x, y, out, 100, BLOCK=64)           # another constexpr
    fast[(4,)](x, y, out, 100, BLOCK=32, SCALE=3)  # a default overridden
    h = [t.half() for t in (x, y, out)]
    fast[(4,)](*h, 100, BLOCK=32)                  # another dtype
    fast[(4,)](x[1:], y, out, 100, BLOCK=32)       # a pointer not 16-byte aligned
    fast[(4,)](x, y, out, True, BLOCK=32)          # a bool, not the int 1
    fast[(8,)](x, y, out, 100, BLOCK=32)           # another grid
    assert sm90.through_triton == ["_axpy"] * 8
    fast[(4,)](x, y, out, 100, BLOCK=64)  # and each of those keys is direct from then on
    fast[(4,)](*h, 100, BLOCK=32)
    assert sm90.through_triton == ["_axpy"] * 8
    assert len(fast.cache) == 8
    last_two = sm90.launches[-2:]
    # A direct launch passes a tensor as its address (see launch.launch_ready).
    assert last_two[0].kernel_args[4] == 64 and last_two[1].kernel_args[0] == h[0].data_ptr()


def test_a_float_argument_is_keyed_by_value(sm90):
    jit = sm90.jit(_scale)
    fast = launch.FastLaunch(jit)
    x = torch.randn(64)
    fast[(2,)](x, 64, 0.5, BLOCK=32)
    fast[(2,)](x, 64, 0.5, BLOCK=32)
    fast[(2,)](x, 64, 1.5, BLOCK=32)
    assert sm90.through_triton == ["_scale", "_scale"]
    assert [launch_.kernel_args[2] for launch_ in sm90.launches] == [0.5, 0.5, 1.5]


def test_launch_kernel_keeps_a_prepared_launch_per_device_and_alignment(sm90, monkeypatch):
    monkeypatch.setattr(runtime.registry._direct, "on", True, raising=False)
    jit = sm90.jit(_axpy)
    prepared: dict = {}
    x, y, out = _tensors(128)
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    runtime.launch_kernel(jit, (4,), (y, x, out), (100,), {"BLOCK": 32}, prepared)
    assert sm90.through_triton == ["_axpy"] and len(prepared) == 1
    (prepared_launch,) = prepared.values()
    assert isinstance(prepared_launch, launch.PreparedLaunch)
    by_triton, direct = sm90.launches
    assert direct.args[:6] == by_triton.args[:6]
    assert direct.kernel_args[:3] == tuple(t.data_ptr() for t in (y, x, out))
    assert direct.kernel_args[3:] == (100, 32, 2)
    # A pointer that is not 16-byte aligned is another specialisation: Triton, then its own.
    runtime.launch_kernel(jit, (4,), (x[1:], y, out), (100,), {"BLOCK": 32}, prepared)
    runtime.launch_kernel(jit, (4,), (y[1:], x, out), (100,), {"BLOCK": 32}, prepared)
    assert sm90.through_triton == ["_axpy"] * 2 and len(prepared) == 2


def test_launch_kernel_without_a_plan_or_when_traced(sm90, monkeypatch):
    jit = sm90.jit(_axpy)
    x, y, out = _tensors()
    monkeypatch.setattr(runtime.registry._direct, "on", True, raising=False)
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, None)  # FastLaunch's key
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, None)
    assert sm90.through_triton == ["_axpy"] and len(sm90.launches) == 2
    seen = []
    monkeypatch.setattr(runtime.registry._direct, "on", False)  # as while torch.compile traces
    monkeypatch.setattr(runtime.registry, "wrap_triton", lambda kernel: seen.append(kernel) or kernel)
    prepared: dict = {}
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert seen == [jit] and not prepared


# --------------------------------------------------------------------------------------------
# Settings that change what Triton compiles or does around a launch.
# --------------------------------------------------------------------------------------------
def test_debug_switched_on_after_the_first_launch_goes_through_triton(sm90, monkeypatch):
    monkeypatch.setattr(runtime.registry._direct, "on", True, raising=False)
    jit = sm90.jit(_axpy)
    fast = launch.fast_launcher(jit)  # the one launch_kernel's plans use
    x, y, out = _tensors()
    plain = fast[(4,)](x, y, out, 100, BLOCK=32)
    prepared: dict = {}
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert fast[(4,)](x, y, out, 100, BLOCK=32) is plain
    assert len(sm90.through_triton) == 1
    monkeypatch.setattr(triton.knobs.runtime, "debug", True)
    debug = fast[(4,)](x, y, out, 100, BLOCK=32)
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    # Triton compiled (and launched) the kernel with its device-side checks.
    assert debug is not plain and debug.metadata.debug and not plain.metadata.debug
    assert len(sm90.through_triton) == 3
    assert sm90.launches[-1].function == FUNCTION and len(fast.cache) == 1
    monkeypatch.setattr(triton.knobs.runtime, "debug", False)
    assert fast[(4,)](x, y, out, 100, BLOCK=32) is plain  # the entry of before, direct again
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert len(sm90.through_triton) == 3


def _set_instrumentation(m, jit):
    m.setattr(triton.knobs.compilation, "instrumentation_mode", "fpsan")


def _set_stages_hook(m, jit):
    m.setattr(triton.knobs.runtime, "add_stages_inspection_hook", lambda *a, **k: ("custom", "0"))


def _set_kernel_debug(m, jit):
    m.setattr(jit, "debug", True)


def _set_pre_run_hook(m, jit):
    m.setattr(jit, "pre_run_hooks", [lambda *a, **k: None])


def _set_debug_env(m, jit):
    m.setenv("TRITON_DEBUG", "1")


def _set_asan(m, jit):
    m.setenv("TRITON_ENABLE_ASAN", "1")


def _set_override_arch(m, jit):
    m.setenv("TRITON_OVERRIDE_ARCH", "sm80")


# Read by Triton at every launch: checked at every direct launch too.
PER_LAUNCH = {"instrumentation": _set_instrumentation, "stages-hook": _set_stages_hook,
              "kernel-debug": _set_kernel_debug, "pre-run-hook": _set_pre_run_hook}
# Read when Triton compiles: checked at the first launch of each key.
AT_COMPILE = {"TRITON_DEBUG": _set_debug_env, "asan": _set_asan,
              "override-arch": _set_override_arch}


def _stub_triton_run(sm90, monkeypatch, jit, compiled):
    """Triton's launch replaced by one that counts and returns ``compiled`` (as it would,
    found in its cache): the compilers behind these settings are not what is tested."""
    def run(*args, grid, warmup, **kwargs):
        sm90.through_triton.append("stub")
        return compiled

    monkeypatch.setattr(jit, "run", run)


@pytest.mark.parametrize("setting", list(PER_LAUNCH), ids=list(PER_LAUNCH))
def test_a_setting_read_at_every_launch_turns_direct_launches_off(sm90, monkeypatch, setting):
    monkeypatch.setattr(runtime.registry._direct, "on", True, raising=False)
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors()
    compiled = fast[(4,)](x, y, out, 100, BLOCK=32)
    prepared: dict = {}
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert len(prepared) == 1 and sm90.through_triton == ["_axpy"] * 2
    _stub_triton_run(sm90, monkeypatch, jit, compiled)
    with monkeypatch.context() as m:
        PER_LAUNCH[setting](m, jit)
        assert launch.compile_settings_reason(jit)
        fast[(4,)](x, y, out, 100, BLOCK=32)
        runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
        fast[(4,)](x, y, out, 100, BLOCK=64)  # a new key is not cached while it is on
        fast[(4,)](x, y, out, 100, BLOCK=64)
        assert sm90.through_triton[2:] == ["stub"] * 4
    assert launch.compile_settings_reason(jit) == ""
    n = len(sm90.launches)
    fast[(4,)](x, y, out, 100, BLOCK=32)
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert len(sm90.through_triton) == 6 and len(sm90.launches) == n + 2  # direct again
    assert launch.FAST_LAUNCH is True


@pytest.mark.parametrize("setting", list(AT_COMPILE), ids=list(AT_COMPILE))
def test_a_compile_setting_keeps_new_keys_on_tritons_path(sm90, monkeypatch, setting):
    monkeypatch.setattr(runtime.registry._direct, "on", True, raising=False)
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors()
    compiled = fast[(4,)](x, y, out, 100, BLOCK=32)
    _stub_triton_run(sm90, monkeypatch, jit, compiled)
    AT_COMPILE[setting](monkeypatch, jit)
    assert launch.compile_settings_reason(jit)
    fast[(4,)](x, y, out, 100, BLOCK=32)  # a key made before: Triton would reuse its kernel too
    prepared: dict = {}
    for _ in range(2):
        fast[(4,)](x, y, out, 100, BLOCK=64)
        runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert sm90.through_triton == ["_axpy"] + ["stub"] * 4
    assert len(fast.cache) == 1 and not prepared


def test_pre_run_hooks_are_called_at_every_launch(sm90):
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors()
    fast[(4,)](x, y, out, 100, BLOCK=32)
    calls = []
    jit.add_pre_run_hook(lambda *args, **kwargs: calls.append(args[3]))
    fast[(4,)](x, y, out, 100, BLOCK=32)
    fast[(4,)](x, y, out, 100, BLOCK=32)
    assert calls == [100, 100]  # Triton's own launch called them
    assert len(sm90.through_triton) == 3 and len(sm90.launches) == 3


def test_a_launch_hook_is_called_through_the_compiled_kernels_runner(sm90, monkeypatch):
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors()
    fast[(4,)](x, y, out, 100, BLOCK=32)

    def hook(metadata):
        pass

    enter = triton.knobs.runtime.launch_enter_hook
    monkeypatch.setattr(enter, "calls", [hook])
    fast[(4,)](x, y, out, 100, BLOCK=32)
    assert sm90.through_triton == ["_axpy"]  # not Triton's launch: the kernel's runner
    by_triton, runner = sm90.launches
    assert runner.hooks[0] is enter and runner.hooks[0].calls == [hook]
    assert runner.launch_metadata is not None  # what the hook is handed
    assert runner.args[:6] == by_triton.args[:6] and runner.same_kernel_args(by_triton)


def test_a_launch_hook_set_as_a_plain_function_goes_through_the_runner(sm90, monkeypatch):
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors()
    fast[(4,)](x, y, out, 100, BLOCK=32)

    def hook(metadata):
        pass

    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", hook)  # not a HookChain
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast[(4,)](x, y, out, 100, BLOCK=32)
    assert sm90.through_triton == ["_axpy"] and launch.FAST_LAUNCH is True
    assert sm90.launches[-1].hooks[0] is hook


# --------------------------------------------------------------------------------------------
# Kernels that always take Triton's path, and mismatches that turn the fast path off.
# --------------------------------------------------------------------------------------------
def _heuristics(sm90):
    return triton.heuristics({"BLOCK": lambda args: 32})(sm90.jit(_axpy))


def _reset_to_zero(sm90):
    return _autotuned(sm90, reset_to_zero=["out_ptr"])


def _config_pre_hook(sm90):
    return _autotuned(sm90, [triton.Config({"BLOCK": 64}, pre_hook=lambda nargs: None)])


def _tuner_pre_hook(sm90):
    return _autotuned(sm90, pre_hook=lambda kwargs, reset_only=False: None)


DECLINED = {"heuristics": (_heuristics, "Heuristics"),
            "reset_to_zero": (_reset_to_zero, "tuning hooks"),
            "config-pre-hook": (_config_pre_hook, "tuning hooks"),
            "tuner-pre-hook": (_tuner_pre_hook, "tuning hooks")}


@pytest.mark.parametrize("kind", list(DECLINED), ids=list(DECLINED))
def test_kernels_with_python_at_each_launch_take_tritons_path_quietly(sm90, kind):
    make, reason = DECLINED[kind]
    kernel = make(sm90)
    x, y, out = _tensors()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast = launch.FastLaunch(kernel)
        assert not fast.usable and reason in fast.reason
        for _ in range(2):
            fast[(4,)](x, y, out, 100)  # BLOCK: from the heuristic or the config
    assert sm90.through_triton == ["_axpy"] * 2 and len(sm90.launches) == 2
    assert launch.FAST_LAUNCH is True


def test_library_kernels_are_all_fit_for_direct_launches():
    """Every kernel object of the package: on a GPU FastLaunch takes each (no heuristics or
    tuning hooks), in the interpreter none (nothing is compiled)."""
    import triton_workshop.ops as ops

    kernels = {}
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"triton_workshop.ops.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, triton.runtime.jit.KernelInterface):
                kernels[f"{info.name}.{name}"] = value
    assert len(kernels) >= 20, sorted(kernels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reasons = {name: launch.FastLaunch(k).reason for name, k in kernels.items()}
    if triton_workshop.INTERPRET:
        assert all("interpreter" in r for r in reasons.values()), reasons
    else:
        assert all(r == "" for r in reasons.values()), reasons


def _drop_tuner_attribute(sm90, monkeypatch):
    tuner = _autotuned(sm90)
    monkeypatch.delattr(tuner, "user_defined_pre_hook")
    return tuner


def _reorder_arg_names(sm90, monkeypatch):
    jit = sm90.jit(_axpy)
    monkeypatch.setattr(jit, "arg_names", list(reversed(jit.arg_names)))
    return jit


def _pre_run_hooks_tuple(sm90, monkeypatch):
    jit = sm90.jit(_axpy)
    monkeypatch.setattr(jit, "pre_run_hooks", ())
    return jit


def _no_configs(sm90, monkeypatch):
    tuner = _autotuned(sm90)
    monkeypatch.setattr(tuner, "configs", [])
    monkeypatch.setattr(tuner, "best_config", triton.Config({"BLOCK": 64}), raising=False)
    return tuner


def _knob_missing(sm90, monkeypatch):
    monkeypatch.setattr(launch, "_KNOBS_PROBLEM", "triton.knobs.runtime.debug is missing")
    return sm90.jit(_axpy)


CONSTRUCTOR_DRIFT = {"autotuner-attribute": _drop_tuner_attribute,
                     "arg-names": _reorder_arg_names, "pre-run-hooks": _pre_run_hooks_tuple,
                     "no-configs": _no_configs, "knob": _knob_missing}


@pytest.mark.parametrize("drift", list(CONSTRUCTOR_DRIFT), ids=list(CONSTRUCTOR_DRIFT))
def test_a_mismatch_in_the_constructor_falls_back_to_triton(sm90, monkeypatch, drift):
    kernel = CONSTRUCTOR_DRIFT[drift](sm90, monkeypatch)
    with pytest.warns(RuntimeWarning, match="fast kernel launches disabled"):
        fast = launch.FastLaunch(kernel)
    assert not fast.usable and launch.FAST_LAUNCH is False
    if drift != "no-configs":  # (an autotuner without configs cannot launch at all)
        x, y, out = _tensors()
        extra = {} if hasattr(kernel, "configs") else {"BLOCK": 32}
        fast[(4,)](x, y, out, 100, **extra)
        fast[(4,)](x, y, out, 100, **extra)
        assert len(sm90.through_triton) == 2 and len(sm90.launches) == 2


def test_a_launcher_of_another_signature_falls_back_at_the_first_launch(sm90):
    class Launcher:
        def __init__(self, src, metadata):
            pass

        def __call__(self, gridX, gridY, gridZ, stream, function, launch_metadata, *args):
            sm90.driver.launches.append((gridX, gridY, gridZ, stream, function, None, *args))

    sm90.driver.launcher_cls = Launcher
    jit = sm90.jit(_axpy)
    fast = launch.FastLaunch(jit)
    x, y, out = _tensors()
    with pytest.warns(RuntimeWarning, match="launcher Launcher takes"):
        fast[(4,)](x, y, out, 100, BLOCK=32)
    fast[(4,)](x, y, out, 100, BLOCK=32)
    assert launch.FAST_LAUNCH is False and not fast.cache
    assert len(sm90.through_triton) == 2


def test_a_compiled_kernel_without_a_loaded_function_falls_back(sm90, monkeypatch):
    monkeypatch.setattr(sm90.driver, "load_binary", lambda *a: (None, None, 32, 0, 1024))
    jit = sm90.jit(_axpy)
    x, y, out = _tensors()
    with pytest.warns(RuntimeWarning, match="no loaded function"):
        launch.FastLaunch(jit)[(4,)](x, y, out, 100, BLOCK=32)
    assert launch.FAST_LAUNCH is False


def test_a_failing_direct_launch_falls_back_to_triton(sm90, monkeypatch):
    monkeypatch.setattr(runtime.registry._direct, "on", True, raising=False)
    jit = sm90.jit(_axpy)
    x, y, out = _tensors()
    prepared: dict = {}
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    (prepared_launch,) = prepared.values()

    def broken(*args):
        raise RuntimeError("launcher changed")

    prepared_launch.entry = (*prepared_launch.entry[:3], broken, *prepared_launch.entry[4:])
    with pytest.warns(RuntimeWarning, match="fast kernel launches disabled.*launcher changed"):
        runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert launch.FAST_LAUNCH is False
    assert len(sm90.through_triton) == 2 and len(sm90.launches) == 2  # launched by Triton
    runtime.launch_kernel(jit, (4,), (x, y, out), (100,), {"BLOCK": 32}, prepared)
    assert len(sm90.through_triton) == 3


def test_fast_launch_is_off_in_the_interpreter():
    if triton_workshop.INTERPRET:
        assert launch.FAST_LAUNCH is False
        from triton_workshop.ops.elementwise import add_kernel

        assert "interpreter" in launch.FastLaunch(add_kernel).reason
    else:
        assert launch.FAST_LAUNCH is (os.environ.get("TRITON_WORKSHOP_FAST_LAUNCH", "1") != "0")


# --------------------------------------------------------------------------------------------
# Autotuning: the candidates compile in parallel before they are timed.
# --------------------------------------------------------------------------------------------
def test_tuner_compiles_every_candidate_before_timing_the_first(sm90, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 1), (64, 2), (128, 4))]
    jit = sm90.jit(_axpy)
    compiled_when_timed = []

    def timing(kernel_call, quantiles=None, **kwargs):
        compiled_when_timed.append(sum(len(cache[0]) for cache in jit.device_caches.values()))
        kernel_call()
        block = sm90.launches[-1].kernel_args[4]
        return [float(block)] * 3  # the smallest block "wins"

    tuner = triton.autotune(configs=configs, key=["n"], do_bench=timing, cache_results=True)(jit)
    tuner = launch.parallel_compile_tuner(tuner)
    assert isinstance(tuner, triton.runtime.autotuner.Autotuner)
    tuner.cache_results = True  # as on a GPU (Triton turns it off in interpreter mode)
    x, y, out = _tensors(1000)
    grid = lambda meta: (runtime.cdiv(1000, meta["BLOCK"]),)  # noqa: E731
    tuner[grid](x, y, out, 1000)
    assert compiled_when_timed == [3, 3, 3]  # all three were ready before the first timing
    assert tuner.best_config.kwargs == {"BLOCK": 32}
    assert sm90.launches[-1].grid == (32, 1, 1)
    # A new process would find the result on disk: a fresh tuner over the same kernel times nothing.
    again = launch.parallel_compile_tuner(triton.autotune(
        configs=configs, key=["n"], do_bench=lambda *a, **k: pytest.fail("timed again"),
        cache_results=True)(jit))
    again.cache_results = True
    again[grid](x, y, out, 1000)
    assert again.best_config.kwargs == {"BLOCK": 32}


def test_without_a_disk_cache_the_candidates_compile_when_pruned(sm90):
    jit = sm90.jit(_axpy)
    counts = []

    def timing(kernel_call, quantiles=None, **kwargs):
        counts.append(sum(len(cache[0]) for cache in jit.device_caches.values()))
        kernel_call()
        return [1.0] * 3

    configs = [triton.Config({"BLOCK": b}) for b in (32, 64)]
    tuner = launch.parallel_compile_tuner(triton.autotune(configs=configs, key=["n"], do_bench=timing)(jit))
    tuner.cache_results = False
    x, y, out = _tensors(100)
    tuner[lambda meta: (runtime.cdiv(100, meta["BLOCK"]),)](x, y, out, 100)
    assert counts == [2, 2]


def test_compile_in_parallel_compiles_each_call_once_without_launching(sm90):
    from triton_workshop.runtime.parallel_compile import compile_in_parallel

    jit = sm90.jit(_axpy)
    x, y, out = _tensors(100)
    calls = [((x, y, out, 100), {"grid": (1,), "BLOCK": b}) for b in (32, 64, 48)]
    launched = len(sm90.launches)
    assert compile_in_parallel(jit, calls) == 3
    blocks = {k for cache in jit.device_caches.values() for k in cache[0]}
    assert len(blocks) == 2  # BLOCK = 48 fails to compile, quietly: its launch will say why
    assert len(sm90.launches) == launched  # compiled, nothing launched
    assert compile_in_parallel(jit, calls[:1]) == 0  # one call: nothing to gain


def test_compile_in_parallel_leaves_an_interpreted_kernel_alone():
    from triton_workshop.runtime.parallel_compile import compile_in_parallel

    assert compile_in_parallel(lambda *a, **k: pytest.fail("called"), [((), {}), ((), {})]) == 0


def test_compile_ahead_is_only_a_head_start(sm90):
    # A candidate that cannot compile does not stop the others; nothing raises here.
    jit = sm90.jit(_axpy)
    tuner = triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 48})],
                            key=["n"])(jit)
    x, y, out = _tensors(100)
    tuner.nargs = dict(zip(tuner.arg_names, (x, y, out, 100)))
    assert launch.compile_ahead(tuner, tuner.configs, {"grid": (1,), "warmup": False}) == 2
    blocks = {k for cache in jit.device_caches.values() for k in cache[0]}
    assert len(blocks) == 1  # BLOCK = 48 is not a power of two: only 64 compiled
