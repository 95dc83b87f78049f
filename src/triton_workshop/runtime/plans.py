"""Launch plans: what a launcher works out once per shape, kept ready to launch again.

A launcher's host code turns a call's shapes, strides, dtypes and its family's tuning object into
a :class:`LaunchPlan` (which kernel, its grid, its scalar and constexpr arguments). Working that
out is Python, and on a slow host it costs as much as the launch itself, so plans are cached
(:func:`plan_cache`) under a key that holds everything the plan depends on, the tuning object
included: a test that replaces the tuning gets new plans, never stale ones. A plan's
``prepared`` dict then keeps the eager launches ready to repeat (one per device and pointer
alignment, see :func:`.registry.launch_kernel`), so a repeated call only looks its plan up,
allocates and launches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from . import launch, registry

#: The launch_kernel that :meth:`LaunchPlan.launch` may bypass (a replaced one is always called).
_LAUNCH_KERNEL = registry.launch_kernel


@dataclass(eq=False)
class LaunchPlan:
    """One kernel launch, decided: ``kernel[grid](*tensors, *scalars, **consts)``."""

    kernel: Any
    grid: tuple
    scalars: tuple = ()
    consts: dict = field(default_factory=dict)
    #: Filled by eager launches (see :func:`.registry.launch_kernel`); never read while tracing.
    prepared: dict = field(default_factory=dict)

    def launch(self, *tensors) -> None:
        """``kernel[grid](*tensors, *scalars, **consts)``. An eager repeat of a launch made
        before (same device and pointer alignment) goes straight to Triton's C launcher
        (:func:`.launch.launch_ready`); anything else through :func:`.registry.launch_kernel`,
        looked up at call time, so that a test that records launches can replace it."""
        if (registry.launch_kernel is _LAUNCH_KERNEL and getattr(registry._direct, "on", False)
                and launch.launch_ready(self.prepared, tensors, self.scalars)):
            return
        registry.launch_kernel(self.kernel, self.grid, tensors, self.scalars, self.consts,
                               self.prepared)

    def launch_eager(self, *tensors) -> None:
        """:meth:`launch` from code known to run eagerly and untraced (an eager autograd
        backward, see :func:`.registry.eager_backward`), as if under
        :func:`.registry.launch_directly`, without its wrapper around the caller."""
        if registry.launch_kernel is _LAUNCH_KERNEL and launch.launch_ready(
                self.prepared, tensors, self.scalars):
            return
        direct = registry._direct
        if getattr(direct, "on", False):
            self.launch(*tensors)
            return
        direct.on = True
        try:
            self.launch(*tensors)
        finally:
            direct.on = False


def plan_cache(maxsize: int = 1024) -> Callable[[Callable], Callable]:
    """Cache a plan function on its arguments (shapes, strides, dtypes, the tuning object).

    Under ``torch.compile`` with dynamic shapes the sizes are symbolic and unhashable: then the
    plan is worked out for that call, uncached (only tracing sees it). ``.cache_clear()`` as
    ``functools.lru_cache``'s."""

    def decorate(fn: Callable) -> Callable:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def plan(*args):
            try:
                return cached(*args)
            except TypeError:
                try:  # unhashable arguments (symbolic sizes): worked out uncached
                    hash(args)
                except TypeError:
                    return fn(*args)
                raise  # the plan function's own error

        plan.cache_clear = cached.cache_clear
        plan.cache_info = cached.cache_info
        return plan

    return decorate
