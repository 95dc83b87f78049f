"""``workshop profile OP_OR_EXERCISE [--size ...] [--dtype ...]``: where one kernel's time goes.

On a GPU it runs one op of the library (``matmul``, ``layer_norm``, ...) or the kernel of an
exercise (``6``: the learner's ``exercises/exercise_6.py``, ``--solution`` for the reference) at one
size, and shows:

* per kernel launched: registers per thread, spilled registers, shared memory, warps and pipeline
  stages, whether the tensor cores run (``mma`` instructions in the PTX), the occupancy bound
  those imply and the grid, in waves over the multiprocessors (from the compiled kernel's
  metadata, and the profiler's record of the launch);
* the bytes the op must move and the FLOPs it must do, the achieved GB/s and TFLOP/s, against two
  ceilings measured on the spot: the copy bandwidth and cuBLAS's matmul; the verdict, memory- or
  compute-bound, and a roofline PNG;
* a ``torch.profiler`` trace of one call next to the torch op it replaces (chrome trace JSON, for
  chrome://tracing or https://ui.perfetto.dev);
* the ``ncu`` command line that profiles the same launch in depth.

Without a GPU it says what it would show and why it cannot, with the work it *can* count (bytes,
FLOPs, arithmetic intensity), and exits 2. Every piece that needs no GPU (the work per op, the
occupancy arithmetic, the verdict, the roofline picture, reading a trace) is a plain function
tested on the CPU; :func:`run_profile` strings them together.

The rooms: :mod:`.targets` (what is profiled, its work), :mod:`.roofline`, :mod:`.kernels`
(occupancy, kernel metadata, the trace), :mod:`.cli` (the run).
"""

from .cli import describe_without_gpu, run_profile
from .kernels import (DeviceLimits, KernelInfo, Occupancy, compiled_triton_kernels, export_trace,
                      find_compiled, kernel_info, kernels_by_annotation, ncu_command, occupancy,
                      uses_tensor_cores, waves)
from .roofline import Roofline, roofline_png
from .targets import (DTYPES, EXERCISE_TARGETS, TARGETS, Plan, Target, dtype_name, parse_dtype,
                      parse_size, resolve, work)

__all__ = [
    "TARGETS", "EXERCISE_TARGETS", "Target", "Plan", "Roofline", "DeviceLimits", "Occupancy",
    "KernelInfo", "resolve", "parse_size", "parse_dtype", "work", "occupancy", "waves",
    "roofline_png", "export_trace", "kernels_by_annotation", "kernel_info", "ncu_command",
    "describe_without_gpu", "run_profile", "DTYPES", "compiled_triton_kernels", "dtype_name",
    "find_compiled", "uses_tensor_cores",
]
