"""``RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` computed by
:func:`triton_workshop.ops.rms_norm.rms_norm`.

The constructor, the parameter name (``weight``), the state_dict, ``reset_parameters`` and
``extra_repr`` are torch's, so swapping the import is the whole migration. Two keyword-only
extras, for modules patched in from transformers: ``weight_offset`` (Gemma's ``1 + weight``) and
``casting_mode`` (``"llama"``, ``"gemma"``: where the module rounds, see :mod:`..ops.rms_norm`).
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from ..ops.rms_norm import rms_norm


class RMSNorm(nn.Module):
    """``torch.nn.RMSNorm`` computed by :func:`triton_workshop.ops.rms_norm.rms_norm`."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "weight_offset",
                     "casting_mode"]
    normalized_shape: tuple[int, ...]
    eps: float | None
    elementwise_affine: bool

    def __init__(
        self,
        normalized_shape,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        weight_offset: float = 0.0,
        casting_mode: str = "torch",
    ) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = weight_offset
        self.casting_mode = casting_mode
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory_kwargs))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The identity scale: a weight of ones (``1 - weight_offset`` with an offset, so that
        ``weight_offset + weight`` is 1, as Gemma's zeros are)."""
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps,
                        weight_offset=self.weight_offset, casting_mode=self.casting_mode)

    def extra_repr(self) -> str:
        text = (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
        if self.weight_offset != 0.0:
            text += f", weight_offset={self.weight_offset}"
        if self.casting_mode != "torch":
            text += f", casting_mode={self.casting_mode!r}"
        return text
