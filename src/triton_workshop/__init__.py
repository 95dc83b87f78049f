"""triton-workshop: learn to write GPU kernels in Triton, and use fast fused kernels in PyTorch.

Importing this package decides, once, whether kernels compile for the GPU or run in Triton's
interpreter (see :mod:`triton_workshop.runtime`); import it before defining any ``@triton.jit``
kernel of your own.
"""

from . import runtime  # first: sets TRITON_INTERPRET before any kernel is decorated
from .runtime import DEVICE, INTERPRET
from .debug import cdiv, ceiling_divide, check_tensors_gpu_ready
from .ops.attention import attention
from .ops.conv import conv2d
from .ops.cross_entropy import cross_entropy, linear_cross_entropy
from .ops.elementwise import add, fused_mul_add_sqrt
from .ops.glu import geglu, swiglu
from .ops.image import FILTERS, filter2d, get_filter, greyscale, sepia
from .ops.layer_norm import layer_norm
from .ops.layer_norm_linear import layer_norm_linear
from .ops.matmul import linear, matmul
from .ops.rms_norm import add_rms_norm, rms_norm
from .ops.rope import rope
from .ops.softmax import softmax
from . import nn

__version__ = "0.2.0"

__all__ = [
    "DEVICE",
    "INTERPRET",
    "FILTERS",
    "add",
    "add_rms_norm",
    "attention",
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
