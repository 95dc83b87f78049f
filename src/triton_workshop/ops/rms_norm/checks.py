"""rms_norm's and add_rms_norm's argument checks: every argument checked before anything
launches, with errors that name it, once per call signature (:func:`checked`).
"""

from __future__ import annotations

import math
import numbers

import torch

from ... import runtime
from .._common import (
    FLOAT_DTYPES_WITH_FP64,
    SignatureCache,
    check_norm_param,
    check_normalized_shape,
    layout_key,
    shape_key,
    stats_dtype,
)

CASTING_MODES = ("torch", "llama", "gemma")


def _check_dense(t: torch.Tensor | None, name: str) -> None:
    if t is not None and (t.is_nested or t.layout != torch.strided):
        got = "a nested tensor" if t.is_nested else f"layout {t.layout}"
        raise TypeError(f"{name} must be a dense (strided) tensor, got {got}")


def _check_real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def checked(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
             check_residual: bool) -> tuple[int, float, float]:
    """``(norm_ndim, eps, weight_offset)`` as the op takes them, from :func:`_check_arguments`
    once per call signature."""
    return _CALLS.checked(_call_key, _check_arguments, x, residual, normalized_shape, weight, eps,
                          weight_offset, casting_mode, check_residual)


def _call_key(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
              check_residual):
    """Everything the checks read."""
    return (layout_key(x), layout_key(residual) if check_residual else check_residual,
            shape_key(normalized_shape), layout_key(weight), eps, type(eps), weight_offset,
            type(weight_offset), casting_mode)


#: rms_norm's and add_rms_norm's checked call signatures -> :func:`checked`'s result.
_CALLS = SignatureCache()


def _check_arguments(x, residual, normalized_shape, weight, eps, weight_offset, casting_mode,
                     check_residual: bool) -> tuple[int, float, float]:
    """Every argument checked before anything launches; ``(norm_ndim, eps, weight_offset)``
    as the op takes them."""
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES_WITH_FP64)
    _check_dense(x, "x")
    if check_residual:
        runtime.check_tensor(residual, "residual", dtypes=FLOAT_DTYPES_WITH_FP64)
        _check_dense(residual, "residual")
        if residual.shape != x.shape:
            raise ValueError(f"residual must have the shape of x {tuple(x.shape)}, got "
                             f"{tuple(residual.shape)}")
        runtime.check_same_dtype(x=x, residual=residual)
    shape = check_normalized_shape(normalized_shape, x)
    check_norm_param(weight, "weight", shape)
    _check_dense(weight, "weight")
    runtime.check_same_device(x=x, residual=residual, weight=weight)
    if eps is None:  # as torch: the epsilon of the arithmetic type (fp32 for fp16/bf16 rows)
        eps = torch.finfo(stats_dtype(x.dtype)).eps
    eps = _check_real(eps, "eps")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    weight_offset = _check_real(weight_offset, "weight_offset")
    if not math.isfinite(weight_offset):
        raise ValueError(f"weight_offset must be finite, got {weight_offset}")
    runtime.check_choice(casting_mode, "casting_mode", CASTING_MODES)
    return len(shape), eps, weight_offset
