"""Exercise 8 (flash attention): the mistakes of the online softmax that only some inputs show,
and the inputs that show them.

A running max started at 0 instead of -inf is harmless while some score of each row is above
about -87: exp(score - 0) stays a normal float32. Once every score of a row is below about -104,
each exp underflows to 0, the running sum stays 0 and the row comes out 0 / 0 = NaN.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .suspects import Suspect

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["FLOAT32_EXP_UNDERFLOW", "RUNNING_MAX_SUSPECTS", "very_negative_row"]

#: Below this, exp of a float32 is 0 (the smallest subnormal is exp(-103.3)).
FLOAT32_EXP_UNDERFLOW = -104.0


def very_negative_row(q: torch.Tensor, k: torch.Tensor, row: int, below: float = -250.0):
    """(q, k) with every scaled score of query ``row`` below ``below``: the keys' first
    component made >= 1 and the row's query pointing the other way along it."""
    k = k.clone()
    k[..., 0] = k[..., 0].abs() + 1
    q = q.clone()
    q[..., row, :] = 0
    q[..., row, 0] = below * math.sqrt(q.shape[-1])
    return q, k


def _running_max_from_zero(case: Case) -> torch.Tensor:
    """The reference, with NaN in each row whose every score underflows exp from 0 (the
    reference itself where no row does: then the bug does not show)."""
    q, k, _ = case.inputs
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    lost = scores.amax(dim=-1) < FLOAT32_EXP_UNDERFLOW
    return case.reference.masked_fill(lost[..., None], float("nan"))


RUNNING_MAX_SUSPECTS = (
    Suspect("running max started at 0",
            "m_i started at 0, not -inf: the first block's exp(score - m_i) then underflows to 0 "
            "wherever every score of a row is below about -104, the running sum stays 0 and the "
            "row is 0 / 0 = NaN. Start it at -inf: m_i = tl.full((BLOCK_M,), float(\"-inf\"), "
            "dtype=tl.float32)", _running_max_from_zero),
)
