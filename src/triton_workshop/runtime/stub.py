"""Stand-ins for Triton's compiled kernels, so that a machine without a GPU can time the host.

:func:`.launch.stub_launches` (scripts/host_probe.py --stub) puts these in place of what
Triton's compile would give: a ``CompiledKernel`` whose C launcher takes the real launcher's
arguments and does nothing, and a ``JITFunction``-like view of an interpreted kernel. The
kernels then take the GPU's direct launch path in full, all but the launch itself. For
measuring only: nothing here runs a kernel.
"""

from __future__ import annotations

import inspect
import types


class _StubLauncher:
    """Stands in for a compiled kernel's C launcher: takes what Triton's takes, does nothing."""

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                 launch_enter_hook, launch_exit_hook, *args):
        return None


class _StubCompiled:
    """Stands in for Triton's ``CompiledKernel`` (named so, as :class:`.launch.FastLaunch`
    checks the name)."""

    function = 0
    packed_metadata = None
    run = _StubLauncher()

    def __getitem__(self, grid):
        return self.run_hooked

    def run_hooked(self, *args, **kwargs):
        return None


_StubCompiled.__name__ = _StubCompiled.__qualname__ = "CompiledKernel"


class _StubParam:
    def __init__(self, param: inspect.Parameter):
        self.name = param.name
        self.has_default = param.default is not inspect.Parameter.empty
        self.default = param.default if self.has_default else None


class Stub:
    """What :func:`.launch.stub_launches` installs: interpreted kernels look like compiled ones
    (:meth:`jit_of`), and a key's first launch makes a stand-in compiled kernel
    (:meth:`first_launch`)."""

    def __init__(self):
        self.jits: dict = {}

    def jit_of(self, interpreted):
        """A stand-in JITFunction for an interpreted kernel: its parameters, no hooks."""
        jit = self.jits.get(interpreted)
        if jit is None:
            jit = types.SimpleNamespace(
                fn=interpreted, arg_names=list(interpreted.arg_names), debug=None,
                params=[_StubParam(p) for p in inspect.signature(interpreted.fn).parameters.values()],
                pre_run_hooks=[])
            self.jits[interpreted] = jit
        return jit

    @staticmethod
    def first_launch(kernel, grid, args, kwargs):
        if hasattr(kernel, "configs"):  # an autotuner: its first config, as in the interpreter
            kernel.best_config = kernel.configs[0]
        return _StubCompiled()
