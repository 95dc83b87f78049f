"""``RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` computed by
:func:`triton_workshop.ops.rms_norm.rms_norm`.

A subclass of ``torch.nn.RMSNorm``: the constructor, the parameter name (``weight``), the
state_dict, ``reset_parameters`` and ``extra_repr`` are torch's, so swapping the import is the
whole migration. Two keyword-only extras, for modules patched in from transformers:
``weight_offset`` (Gemma's ``1 + weight``) and ``casting_mode`` (``"llama"``, ``"gemma"``: where
the module rounds, see :mod:`..ops.rms_norm`).
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from ..ops.rms_norm import rms_norm


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` computed by :func:`triton_workshop.ops.rms_norm.rms_norm`: a
    subclass, so that a patched model's norms still answer ``isinstance(module,
    torch.nn.RMSNorm)``."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "weight_offset",
                     "casting_mode"]

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
        # Set before torch's constructor, which calls reset_parameters (it reads the offset).
        self.weight_offset = weight_offset
        self.casting_mode = casting_mode
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)

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
