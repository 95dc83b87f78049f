"""triton-workshop: learn to write GPU kernels in Triton, and use fast fused kernels in PyTorch.

Importing this package decides, once, whether kernels compile for the GPU or run in Triton's
interpreter (see :mod:`triton_workshop.runtime`); import it before defining any ``@triton.jit``
kernel of your own.
"""

import importlib
import os
import sys


def _is_workshop_check() -> bool:
    """Whether this process is the ``workshop check`` console script. That one imports the
    runtime itself, once it has started its child processes (:mod:`.teach.early_start`): each
    child imports torch anyway, and the checking process's own import then overlaps theirs. It
    runs no kernel of its own, so nothing is decorated before the mode is decided."""
    argv = getattr(sys, "argv", None) or [""]
    return os.path.basename(argv[0]) in ("workshop", "triton-workshop") and argv[1:2] == ["check"]


if not _is_workshop_check():
    from . import runtime  # first: sets TRITON_INTERPRET before any kernel is decorated
    from .runtime import DEVICE, INTERPRET
    from .debug import cdiv, ceiling_divide, check_tensors_gpu_ready

# The op families and nn are imported on first use (module __getattr__ below): together they
# take a noticeable share of a learner's `workshop check`, which uses none of them. A family's
# ops join torch.ops.triton_workshop when the family is imported.
_LAZY = {
    "DEVICE": "runtime",
    "INTERPRET": "runtime",
    "cdiv": "debug",
    "ceiling_divide": "debug",
    "check_tensors_gpu_ready": "debug",
    "attention": "ops.attention",
    "autocast_linear": "ops.matmul",
    "conv2d": "ops.conv",
    "cross_entropy": "ops.cross_entropy",
    "linear_cross_entropy": "ops.cross_entropy",
    "add": "ops.elementwise",
    "fused_mul_add_sqrt": "ops.elementwise",
    "geglu": "ops.glu",
    "swiglu": "ops.glu",
    "FILTERS": "ops.image",
    "filter2d": "ops.image",
    "get_filter": "ops.image",
    "greyscale": "ops.image",
    "sepia": "ops.image",
    "layer_norm": "ops.layer_norm",
    "layer_norm_linear": "ops.layer_norm_linear",
    "linear": "ops.matmul",
    "matmul": "ops.matmul",
    "add_rms_norm": "ops.rms_norm",
    "rms_norm": "ops.rms_norm",
    "rope": "ops.rope",
    "softmax": "ops.softmax",
}
#: Subpackages that ``import triton_workshop`` used to bring in, as attributes.
_LAZY_MODULES = ("nn", "ops", "runtime", "debug")


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name in _LAZY_MODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


__version__ = "0.2.0"

__all__ = [
    "DEVICE",
    "INTERPRET",
    "FILTERS",
    "add",
    "add_rms_norm",
    "attention",
    "autocast_linear",
    "conv2d",
    "cross_entropy",
    "filter2d",
    "get_filter",
    "greyscale",
    "layer_norm",
    "layer_norm_linear",
    "linear",
    "linear_cross_entropy",
    "matmul",
    "nn",
    "rms_norm",
    "sepia",
    "softmax",
    "cdiv",
    "ceiling_divide",
    "check_tensors_gpu_ready",
    "fused_mul_add_sqrt",
    "geglu",
    "rope",
    "swiglu",
]
