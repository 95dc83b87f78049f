"""Exercise 6 (layer norm): which of the saved statistics is wrong, in words. The statistics
task's output is (n_rows, 2): each row's mean, then its rstd."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..verdict import close, tolerance_for

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["statistics_in_words"]


def statistics_in_words(out: torch.Tensor, case: Case) -> list[str]:
    """One sentence when only one of the two columns is wrong (the other one is then right, and
    the bug is in the lines that compute or store the wrong one)."""
    ref = case.reference.detach().cpu()
    if out.dim() != 2 or out.shape[-1] != 2:
        return []
    tol = tolerance_for(ref.dtype)
    mean_ok, rstd_ok = (bool(close(out[:, i], ref[:, i], tol).all()) for i in range(2))
    if mean_ok and not rstd_ok:
        return ["the means (column 0) are right, the rstd (column 1) is wrong: look at the "
                "variance, eps and the 1 / sqrt, and at the tl.store into rstd_ptr"]
    if rstd_ok and not mean_ok:
        return ["the rstd (column 1) is right, the means (column 0) are wrong: look at what the "
                "tl.store into mean_ptr stores, and where"]
    return []
