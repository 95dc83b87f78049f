"""Tiling policy: host-side integer helpers, autotuning that degrades to one config where it
cannot time, the multiprocessor count, and the block/warp heuristics of row-wise kernels."""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Sequence

import torch
import triton
import triton.language as tl
import triton.testing

from . import launch, mode, tuned

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
#: What the installed Triton's ``triton.autotune`` accepts (options arrived across releases).
_AUTOTUNE_PARAMETERS = frozenset(inspect.signature(triton.autotune).parameters)


def _no_timing(kernel_call, quantiles=None, **kwargs):
    """do_bench for a single candidate: no run, equal timings (the real launch follows)."""
    return [0.0, 0.0, 0.0] if quantiles is not None else 0.0


def autotune(configs: Sequence[triton.Config], key: Sequence[str], **kwargs):
    """``triton.autotune`` on the GPU; in the interpreter only the first config (which must be
    a sensible default), because the interpreter cannot benchmark. ``TRITON_WORKSHOP_AUTOTUNE=0``
    asks for one config on the GPU too (fast test runs: each config is a compile): the first that
    the kernel's ``early_config_prune`` keeps, or the first."""
    configs = list(configs)
    if mode.INTERPRET:
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
            if "do_bench" in _AUTOTUNE_PARAMETERS:
                kwargs.setdefault("do_bench", _no_timing)
    # Tuning results kept on disk beside Triton's compiled kernels (keyed by the kernel's source,
    # the configs and the tuning key): a model's second run skips the benchmarking, not only
    # the compiles. Triton releases without the option tune again in each process.
    if "cache_results" in _AUTOTUNE_PARAMETERS:
        kwargs.setdefault("cache_results", True)
    # Timing a candidate: fewer repetitions than Triton's default (25 ms warm-up, 100 ms of runs),
    # still hundreds of runs of a kernel of tens of microseconds; a cold model start times dozens.
    if "do_bench" in _AUTOTUNE_PARAMETERS:
        kwargs.setdefault("do_bench", _quick_timing)
    decorate = triton.autotune(configs=configs, key=list(key), **kwargs)
    if mode.INTERPRET or len(configs) < 2:
        return decorate

    def tuned_kernel(fn):
        # The shipped table first (runtime.tuned), then candidates compiled in parallel.
        tuner = tuned.table_tuner(launch.parallel_compile_tuner(decorate(fn)))
        tuned.register(tuner)
        return tuner

    return tuned_kernel


def _quick_timing(kernel_call, quantiles=None, **kwargs):
    if tuned.take_table_pick():  # the table named the one candidate: nothing to compare
        return _no_timing(kernel_call, quantiles)
    return triton.testing.do_bench(kernel_call, warmup=10, rep=40, quantiles=quantiles)


def num_sms(device: torch.device | None = None) -> int:
    """Streaming multiprocessors of ``device`` (4 in the interpreter, which has none)."""
    if mode.INTERPRET:
        return 4
    if device is not None and device.index is not None and device.type == "cuda":
        return _num_sms(device.index)  # a CUDA tensor's device: CUDA is there, no need to ask
    if not torch.cuda.is_available():
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




def bucket(n):
    """``n`` rounded up to a power of two: an autotuning key that a new length in the same bucket
    reuses (a batch of ragged sequence lengths does not retune for every length). Symbolic sizes
    (torch.compile) pass through: Inductor tunes user kernels itself, so the key is not needed
    there, and rounding would add a guard."""
    return next_power_of_2(n) if isinstance(n, int) else n


def shared_memory_limit() -> int:
    """Shared memory a program may take on the current device (the opt-in limit: 227 KB on an
    H100); the H100's figure where there is no GPU (the interpreter, a CPU compile for sm_90)."""
    if mode.INTERPRET or not torch.cuda.is_available():
        return 227 * 1024
    return _shared_memory_limit(torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _shared_memory_limit(index: int) -> int:
    props = torch.cuda.get_device_properties(index)
    return getattr(props, "shared_memory_per_block_optin", 227 * 1024)
