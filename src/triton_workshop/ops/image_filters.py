"""The named ``K x K`` filters of :func:`triton_workshop.filter2d` (sharpen, edge, gaussian, ...):
plain float32 tensors, in a module of their own so that what needs only the numbers (exercise 3's
cases) does not import the image kernels and register their ops, which on a GPU costs seconds."""

from __future__ import annotations

import torch

__all__ = ["FILTERS", "get_filter"]


def _binomial_5x5() -> torch.Tensor:
    row = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
    return torch.outer(row, row) / 256.0


_SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])

#: Named ``K x K`` filters for :func:`filter2d` (float32, on the CPU; see :func:`get_filter`).
FILTERS: dict[str, torch.Tensor] = {
    "sharpen": torch.tensor([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]]),
    "edge": torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 8.0, -1.0], [-1.0, -1.0, -1.0]]),
    "gaussian": _binomial_5x5(),
    "motion_blur": torch.eye(5) / 5.0,
    "sobel_x": _SOBEL_X,
    "sobel_y": _SOBEL_X.T.contiguous(),
}


def get_filter(
    name: str, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A fresh copy of the named filter on ``device`` (the CPU by default) in ``dtype``."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}; valid names: {', '.join(sorted(FILTERS))}")
    return FILTERS[name].to(device=device, dtype=dtype, copy=True)
