"""Argument checks that every launcher runs before anything launches: a ``TypeError`` or
``ValueError`` that names the argument and says what was expected."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from . import mode

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


_Tensor = torch.Tensor
_STRIDED = torch.strided

#: How an error names a tensor of another layout than torch.strided.
_LAYOUT_NAMES = {
    torch.sparse_coo: "a sparse COO tensor",
    torch.sparse_csr: "a sparse CSR tensor",
    torch.sparse_csc: "a sparse CSC tensor",
    torch.sparse_bsr: "a sparse BSR tensor",
    torch.sparse_bsc: "a sparse BSC tensor",
    torch._mkldnn: "an mkldnn tensor",
}
if hasattr(torch, "jagged"):
    _LAYOUT_NAMES[torch.jagged] = "a nested (jagged) tensor"


def check_tensor(
    t,
    name: str,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | Sequence[int] | None = None,
) -> None:
    """Type, layout, device, dtype and rank of one tensor argument.

    Kernels read dense memory through strides: nested, sparse and mkldnn tensors are refused
    here, by name, before anything looks at their (absent or meaningless) strides."""
    if not isinstance(t, _Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout is not _STRIDED or t.is_nested:
        check_dense(t, name)
    if not (t.is_cuda or (mode.INTERPRET and t.is_cpu)):
        check_kernel_device(t, name)
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {t.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")


def check_dense(t: torch.Tensor, name: str) -> None:
    """A dense (strided) tensor: nested tensors (which report the strided layout), sparse
    tensors of every layout and mkldnn tensors are refused with a ``TypeError`` naming the
    argument and the layout."""
    if t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got a nested tensor")
    layout = t.layout
    if layout is not _STRIDED:
        what = _LAYOUT_NAMES.get(layout, f"a tensor of layout {layout}")
        raise TypeError(f"{name} must be a dense (strided) tensor, got {what}")


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


def check_float_dtype(dtype, name: str = "dtype") -> None:
    """A dtype argument (an output's or a computation's): None, or one of :data:`FLOAT_DTYPES`.
    Anything else is a ``TypeError`` naming the argument, a non-dtype as a non-float dtype (a
    tensor of the wrong dtype is one too)."""
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be None or one of {_dtype_names(FLOAT_DTYPES)}, got "
                        f"{dtype!r}")


def check_choice(value, name: str, choices) -> None:
    """A string argument that names one of ``choices``: a ``TypeError`` for a non-str, a
    ``ValueError`` listing the choices for another string."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
