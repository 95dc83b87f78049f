"""Drop-in ``torch.nn`` modules over the Triton ops (``modules``)."""

from .modules import (
    LayerNorm,
    LayerNormLinear,
    Linear,
    MultiheadAttention,
    MultiheadSelfAttention,
    Softmax,
)

__all__ = [
    "LayerNorm",
    "LayerNormLinear",
    "Linear",
    "MultiheadAttention",
    "MultiheadSelfAttention",
    "Softmax",
]
