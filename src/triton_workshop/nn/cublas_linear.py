"""``CublasLinear``: ``torch.nn.Linear`` on torch's GEMMs, with the autocast backward of
:func:`triton_workshop.autocast_linear` (an fp32 weight's gradient written in fp32 by the GEMM,
not rounded to bf16 and cast back by a pass of its own).

What ``patch(model, compiled=True)`` makes of a plain Linear it leaves on cuBLAS: nothing is
fused into its product, so the product stays cuBLAS's, and only the pass after the weight's
gradient goes (eagerly the Linears it leaves stay ``torch.nn.Linear``, as they were). It is a
subclass of ``torch.nn.Linear`` with nothing added (same constructor, parameters, state_dict,
``isinstance``); outside autocast, or for a weight already in the autocast dtype, it computes
what ``torch.nn.Linear`` computes, the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.matmul import autocast_linear


class CublasLinear(nn.Linear):
    """``torch.nn.Linear`` whose autocast backward writes an fp32 weight's gradient in fp32
    (:func:`triton_workshop.autocast_linear`)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return autocast_linear(input, self.weight, self.bias)
