"""What several op families share: dtype sets, the checking of a ``dim`` argument, and the
shared memory of a pipelined GEMM config."""

from __future__ import annotations

import operator

import torch

from ..runtime import FLOAT_DTYPES

#: The float dtypes of the row-wise ops (softmax, layer_norm): fp64 too, computed in fp64.
FLOAT_DTYPES_WITH_FP64 = FLOAT_DTYPES + (torch.float64,)


class DimError(ValueError, IndexError):
    """``dim`` out of range: a ``ValueError`` like every bad argument here, and an ``IndexError``
    like PyTorch raises (the same double parentage as numpy's ``AxisError``)."""


def normalize_dim(dim, ndim: int, name: str = "dim") -> int:
    """``dim`` as an index in ``[0, ndim)``, accepting negatives like PyTorch; a 0-d tensor has
    one position (``dim`` 0 or -1)."""
    if isinstance(dim, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}") from None
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise DimError(f"{name} must be in [{-size}, {size - 1}] for a {ndim}-d tensor, got {dim}")
    return dim % size


def gemm_shared_memory_bytes(config, element_size: int) -> int:
    """Shared memory a software-pipelined GEMM config (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``,
    ``num_stages``) keeps: one A and one B slice per stage. Config pruning compares it with
    :func:`runtime.shared_memory_limit` (a config over it fails to launch)."""
    kw = config.kwargs
    return config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * element_size
