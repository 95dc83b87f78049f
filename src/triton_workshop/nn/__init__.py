"""Drop-in ``torch.nn`` modules over the Triton ops (``modules``, ``conv``), and ``patch(model)``,
which swaps torch's modules for them in place (``patch``)."""

from .modules import (
    LayerNorm,
    LayerNormLinear,
    Linear,
    MultiheadAttention,
    MultiheadSelfAttention,
    Softmax,
)
from .conv import Conv2d
from .cublas_linear import CublasLinear
from .rms_norm import RMSNorm
from .patch import patch

__all__ = [
    "Conv2d",
    "CublasLinear",
    "LayerNorm",
    "LayerNormLinear",
    "Linear",
    "MultiheadAttention",
    "MultiheadSelfAttention",
    "RMSNorm",
    "Softmax",
    "patch",
]
