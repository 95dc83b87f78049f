"""Where kernels run, and what every launcher needs before it launches one.

One job per file; this face re-exports what the ops use:

* :mod:`.mode` - interpreter or GPU, decided once, before any kernel is decorated (imported first);
* :mod:`.checks` - argument checks naming the argument, before anything launches;
* :mod:`.tiling` - integer helpers, autotuning, block/warp heuristics;
* :mod:`.launch` - direct launches of compiled kernels, past Triton's per-launch Python; with its
  three neighbours, the only doors to Triton's private API: :mod:`.interpreter` (two fixes to
  the interpreter, applied at import), :mod:`.stub` (stand-in compiled kernels for timing the
  host without a GPU) and :mod:`.parallel_compile` (autotuning candidates compiled at once);
* :mod:`.registry` - the only door to torch's dispatch internals (registered ops, eager fast path,
  autocast);
* :mod:`.plans` - launch plans and their cache: the one way a launcher keeps a launch ready.
"""

from . import mode  # first: sets TRITON_INTERPRET before Triton decorates anything

from .mode import DEVICE, INTERPRET, INTERPRET_REASON, mode_description  # noqa: E402
from .checks import (  # noqa: E402
    FLOAT_DTYPES,
    check_choice,
    check_dense,
    check_float_dtype,
    check_kernel_device,
    check_same_device,
    check_same_dtype,
    check_tensor,
)
from .tiling import (  # noqa: E402
    RowTile,
    acc_dtype,
    autotune,
    bucket,
    cdiv,
    chunk_tile,
    next_power_of_2,
    num_sms,
    num_warps_for,
    row_tile,
    shared_memory_limit,
)
from . import launch  # noqa: E402
from .launch import (  # noqa: E402
    FastLaunch,
    PreparedLaunch,
    device_guard,
    fast_launcher,
    launch_ready,
    stub_launches,
)
from . import registry  # noqa: E402
from .registry import (  # noqa: E402
    PLAIN,
    RECORD,
    AutocastPolicy,
    RegisteredOp,
    any_autocast,
    eager_backward,
    follows_autocast,
    launch_directly,
    launch_kernel,
    launching_directly,
    register_op,
    traced,
    wrap_triton,
)
from . import plans  # noqa: E402
from .plans import LaunchPlan, plan_cache  # noqa: E402

__all__ = [
    "mode", "launch", "registry", "plans", "LaunchPlan", "plan_cache",
    "DEVICE", "INTERPRET", "INTERPRET_REASON", "mode_description",
    "FLOAT_DTYPES", "check_choice", "check_dense", "check_float_dtype", "check_kernel_device",
    "check_same_device", "check_same_dtype", "check_tensor",
    "RowTile", "acc_dtype", "autotune", "bucket", "cdiv", "chunk_tile", "next_power_of_2", "num_sms",
    "num_warps_for", "row_tile", "shared_memory_limit",
    "FastLaunch", "PreparedLaunch", "device_guard", "fast_launcher", "launch_ready",
    "stub_launches",
    "PLAIN", "RECORD", "AutocastPolicy", "RegisteredOp", "any_autocast", "eager_backward",
    "follows_autocast",
    "launch_directly", "launch_kernel", "launching_directly", "register_op", "traced",
    "wrap_triton",
]
