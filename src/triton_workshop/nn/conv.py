"""``torch.nn.Conv2d`` computed by :func:`triton_workshop.conv2d` (an implicit GEMM in Triton).

A subclass of ``torch.nn.Conv2d``: the same constructor, parameters, initialisation, state_dict and
attributes, so code that inspects a model (``isinstance(m, nn.Conv2d)`` in an init loop, say)
keeps working after :func:`triton_workshop.nn.patch` swaps it in. Only the convolution itself
changes. ``padding_mode`` must be ``"zeros"``: the other modes pad with torch first, and a model
that uses them keeps torch's module (``patch`` says so).
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.conv import conv2d


class Conv2d(nn.Conv2d):
    """``torch.nn.Conv2d`` (``padding_mode="zeros"``) whose forward is
    :func:`triton_workshop.conv2d`: any stride, padding (ints, pairs, ``"same"``, ``"valid"``),
    dilation and groups; fp16, bf16 or fp32 input of the weight's dtype, NCHW or channels-last
    (the output keeps the input's layout)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ) -> None:
        if padding_mode != "zeros":
            raise ValueError(
                f"padding_mode must be 'zeros', got {padding_mode!r} "
                "(use torch.nn.Conv2d for the other modes)"
            )
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
            padding_mode, device, dtype,
        )  # fmt: skip

    def _conv_forward(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)
