"""Exercise 1 (vector addition): its classic mistakes, each with the output it produces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...runtime import cdiv
from .suspects import NAN, Suspect, learner_block

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["VECTOR_SUSPECTS"]


def _add_offsets_step_by_one(case: Case) -> torch.Tensor:
    x, y = case.inputs
    n, block = x.numel(), learner_block(case, 0, 128)
    out = torch.full((n,), NAN, dtype=torch.float64)
    total = x.double().flatten() + y.double().flatten()
    for pid in range(cdiv(n, block)):
        idx = torch.arange(pid, min(pid + block, n))
        out[idx] = total[idx]
    return out.reshape(x.shape).to(x.dtype)


VECTOR_SUSPECTS = (
    Suspect("offsets that step by one program, not one block",
            "offsets = pid + tl.arange(0, BLOCK_SIZE) makes program p start at element p, on top of "
            "its neighbours: multiply, offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
            _add_offsets_step_by_one),
    Suspect("y loaded from x_ptr", "the result is x + x: load y from y_ptr",
            lambda c: (c.inputs[0].double() * 2).to(c.inputs[0].dtype)),
    Suspect("the store of x alone", "the result is x: store x + y",
            lambda c: c.inputs[0].clone()),
)
