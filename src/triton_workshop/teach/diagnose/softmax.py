"""Exercise 5 (fused softmax): the classic mistakes (padding lanes loaded as 0 or -1, a missing
normalisation, the wrong sum), each with the output it produces.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch

from .suspects import Suspect

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["SOFTMAX_SUSPECTS"]


def _softmax_padded(value: float) -> Callable[[Case], torch.Tensor]:
    """Softmax with the block's padding lanes loaded as ``value`` instead of -inf."""
    def output(c: Case) -> torch.Tensor:
        x = c.inputs[0]
        n = x.shape[-1]
        pad = (1 << (n - 1).bit_length()) - n
        if pad == 0:
            return None
        xd = x.double()
        m = torch.maximum(xd.max(-1, keepdim=True).values, torch.tensor(value, dtype=torch.float64))
        e = (xd - m).exp()
        total = e.sum(-1, keepdim=True) + pad * math.exp(value) * (-m).exp()
        return (e / total).to(x.dtype)

    return output


SOFTMAX_SUSPECTS = (
    Suspect("padding lanes loaded as 0 (other=0.0, or no other=)",
            "each padded lane adds exp(0 - max) to the row sum: load them as -inf, "
            "other=-float(\"inf\")", _softmax_padded(0.0)),
    Suspect("padding lanes loaded as -1 (other=-1.0)",
            "each padded lane adds exp(-1 - max) to the row sum: load them as -inf, "
            "other=-float(\"inf\")", _softmax_padded(-1.0)),
    Suspect("a missing normalisation",
            "the result is exp(x - max) alone: divide by its sum over the row, "
            "y = numerator / tl.sum(numerator, axis=0)",
            lambda c: (c.inputs[0].double() - c.inputs[0].double().max(-1, keepdim=True).values)
            .exp().to(c.inputs[0].dtype)),
    Suspect("the sum of x instead of the sum of exp",
            "divide by the sum of the numerators: tl.sum(numerator, axis=0)",
            lambda c: ((c.inputs[0].double() - c.inputs[0].double().max(-1, keepdim=True).values).exp()
                       / c.inputs[0].double().sum(-1, keepdim=True)).to(c.inputs[0].dtype)),
)
