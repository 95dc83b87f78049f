"""The argument checks the two cross-entropy losses share: dense tensors, the loss arguments
(target, ignore_index, reduction, label_smoothing), the linear layer's operands, and the key
that a call's checks are kept under.
"""

from __future__ import annotations

import numbers

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES
from .._common import layout_key
from .tuning import REDUCTIONS


def check_dense_tensor(t, name: str, *, dtypes, ndim=None) -> None:
    """``runtime.check_tensor``, and a dense layout: kernels and products here read strided
    memory, so nested and sparse tensors are refused (before their rank is looked at)."""
    runtime.check_tensor(t, name, dtypes=dtypes)
    if t.is_nested or t.layout != torch.strided:
        kind = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise TypeError(f"{name} must be a dense (strided) tensor, got a {kind} tensor")
    if ndim is not None:
        runtime.check_tensor(t, name, ndim=ndim)


def check_loss_args(target, ignore_index, reduction, label_smoothing) -> None:
    """The arguments the two losses share, besides the logits or their factors."""
    check_dense_tensor(target, "target", dtypes=(torch.int64,))
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    runtime.check_choice(reduction, "reduction", REDUCTIONS)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real):
        raise TypeError(f"label_smoothing must be a float, got {type(label_smoothing).__name__}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")


def loss_key(*args):
    """Everything the checks of either loss read: its tensors' layouts (``None`` stays None),
    the other arguments with their types (an int and a bool are different keys)."""
    return tuple([layout_key(a) if a is None or isinstance(a, torch.Tensor) else (a, type(a))
                  for a in args])


def check_linear_args(input, weight, bias) -> None:
    check_dense_tensor(input, "input", dtypes=FLOAT_DTYPES)
    if input.dim() == 0:
        raise ValueError("input must have at least 1 dimension (..., in_features), got a scalar")
    check_dense_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=2)
    runtime.check_same_dtype(input=input, weight=weight)
    if weight.shape[1] != input.shape[-1]:
        raise ValueError(
            f"input has in_features={input.shape[-1]} but weight has in_features="
            f"{weight.shape[1]} (weight is (vocabulary, in_features) = {tuple(weight.shape)})")
    if weight.shape[0] == 0:
        raise ValueError(f"weight must have at least one class (row), got {tuple(weight.shape)}")
    if bias is not None:
        check_dense_tensor(bias, "bias", dtypes=FLOAT_DTYPES, ndim=1)
        runtime.check_same_dtype(input=input, bias=bias)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must have shape (vocabulary,) = ({weight.shape[0]},), got "
                             f"{tuple(bias.shape)}")
    runtime.check_same_device(input=input, weight=weight, bias=bias)
