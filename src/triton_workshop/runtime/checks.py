"""Argument checks that every launcher runs before anything launches: a ``TypeError`` or
``ValueError`` that names the argument and says what was expected."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from . import mode

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    t,
    name: str,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | Sequence[int] | None = None,
) -> None:
    """Type, device, dtype and rank of one tensor argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_kernel_device(t, name)
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {t.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")


def check_kernel_device(t: torch.Tensor, name: str) -> None:
    """On the GPU a kernel reads CUDA memory only; the interpreter reads CPU and CUDA tensors."""
    # The flags, not t.device: building a torch.device costs more than the check (every call).
    if t.is_cuda or (mode.INTERPRET and t.is_cpu):
        return
    where = "a CUDA device" if not mode.INTERPRET else "the CPU or a CUDA device"
    hint = " (move it with .cuda())" if t.device.type == "cpu" else ""
    raise ValueError(f"{name} must be on {where}, got a tensor on {t.device}{hint}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """All named tensors on one device: a kernel cannot read across devices."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    if not items:
        return
    first_name, first = items[0]
    first_index = first.get_device()  # an int (-1 off CUDA): cheaper than comparing devices
    for name, t in items[1:]:
        if t.get_device() == first_index and t.is_cuda == first.is_cuda and first_index >= 0:
            continue
        if t.device != first.device:
            raise ValueError(
                f"{name} is on {t.device} but {first_name} is on {first.device}: "
                "all tensors must be on the same device"
            )


def check_same_dtype(**tensors: torch.Tensor) -> None:
    items = [(n, t) for n, t in tensors.items() if t is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}: "
                "they must match"
            )

