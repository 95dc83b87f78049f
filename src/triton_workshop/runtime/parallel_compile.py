"""Autotuning: compile every candidate config at once, in threads, before they are timed.

:func:`parallel_compile_tuner` hooks a ``triton.autotune`` Autotuner's two steps before timing
(``prune_configs``, ``check_disk_cache``) so that :func:`compile_ahead` hands the candidates to
Triton's ``AsyncCompileMode`` (a private module of Triton's); where either is missing, the
autotuner compiles one candidate at a time, as before. :func:`.tiling.autotune` applies it to
every autotuned kernel of the package.
"""

from __future__ import annotations

import functools
import os


def _async_compile_mode():
    """Triton's ``AsyncCompileMode`` (compiles handed to an executor), or None where the installed
    release lacks it."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # pragma: no cover - a Triton without it tunes as before
        return None
    return AsyncCompileMode


def compile_ahead(tuner, configs, call_kwargs: dict) -> int:
    """Compile ``tuner``'s candidate ``configs`` for the call being tuned, in parallel threads.

    Triton's autotuner compiles each candidate when it first times it, one after the other, and
    a cold first step of a model spends most of its time there (a dozen candidates for each new
    shape). Compiling releases the GIL for most of its work (MLIR passes, LLVM, ptxas in a child
    process), so the candidates compile side by side; the timing then finds them ready. Returns
    how many were handed to the threads (0: nothing done, the autotuner compiles as before).
    Whatever fails here (a tile that does not fit) fails again when timed, where the autotuner
    handles it."""
    jit = tuner.fn
    if not hasattr(jit, "params"):
        return 0
    args = list((tuner.nargs or {}).values())  # the call's positional arguments, in order
    kwargs = {k: v for k, v in call_kwargs.items() if k != "warmup"}
    return compile_in_parallel(jit, [(args, {**kwargs, **config.all_kwargs()}) for config in configs])


def compile_in_parallel(jit, calls) -> int:
    """Compile the ``@triton.jit`` function ``jit`` for each ``(args, kwargs)`` of ``calls`` (the
    arguments of a launch, ``grid`` among the kwargs) at once, in threads, without launching:
    the launches that follow find their kernels compiled. Returns how many were handed to the
    threads (0: nothing done where Triton lacks ``AsyncCompileMode``, where ``jit`` runs in the
    interpreter, or for fewer than two). What fails to compile here fails again at its launch,
    where the caller sees it."""
    from triton.runtime.jit import JITFunction  # an interpreted function has nothing to compile

    async_mode = _async_compile_mode()
    if async_mode is None or len(calls) < 2 or not isinstance(jit, JITFunction):
        return 0
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(len(calls), os.cpu_count() or 1, 16))
    try:
        with ThreadPoolExecutor(workers) as pool, async_mode(pool, ignore_errors=True):
            for args, kwargs in calls:
                jit.run(*args, warmup=True, **kwargs)
    except Exception:  # noqa: BLE001 - only a head start: each launch compiles what is missing
        return 0
    return len(calls)


def parallel_compile_tuner(tuner):
    """``tuner`` (a ``triton.autotune`` Autotuner) made to compile its candidates in parallel
    before timing them (:func:`compile_ahead`); unchanged where Triton's autotuner does not have
    the two steps this hooks into (``prune_configs`` then ``check_disk_cache``)."""
    base = type(tuner)
    if not (hasattr(base, "prune_configs") and hasattr(base, "check_disk_cache")):
        return tuner
    tuner.__class__ = _parallel_class(base)  # same object and state: torch.compile still sees it
    return tuner


@functools.lru_cache(maxsize=None)
def _parallel_class(base):
    class ParallelCompileAutotuner(base):
        # Triton's run() prunes the candidates of a key it has not tuned, then times them; with
        # cache_results it first asks check_disk_cache, which times only when no earlier run's
        # result is on disk: then compile there, not before.
        def prune_configs(self, kwargs, *rest, **more):
            configs = super().prune_configs(kwargs, *rest, **more)
            if getattr(self, "cache_results", False):
                self._tuning_kwargs = kwargs
            else:
                compile_ahead(self, configs, kwargs)
            return configs

        def check_disk_cache(self, tuning_key, configs, bench_fn):
            def compile_then_time():
                compile_ahead(self, configs, getattr(self, "_tuning_kwargs", None) or {})
                return bench_fn()

            return super().check_disk_cache(tuning_key, configs, compile_then_time)

    ParallelCompileAutotuner.__qualname__ = f"ParallelCompile{base.__name__}"
    return ParallelCompileAutotuner
