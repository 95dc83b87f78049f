"""Drop-in ``torch.nn`` modules over the Triton ops.

Each module keeps PyTorch's constructor signature and parameter names, so swapping the import is
the whole migration (a ``torch.nn.LayerNorm`` state_dict loads as is). The modules hold parameters
and call the functional op; the kernels live in :mod:`triton_workshop.ops`.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from .ops.layer_norm import layer_norm
from .ops.softmax import softmax


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` computed by :func:`triton_workshop.ops.layer_norm.layer_norm`."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory_kwargs))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory_kwargs))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}"
        )


class Softmax(nn.Module):
    """``torch.nn.Softmax`` computed by :func:`triton_workshop.ops.softmax.softmax`."""

    __constants__ = ["dim"]

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return softmax(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
