"""conv2d's argument checks: the tensors, stride, padding, dilation and groups against each
other, with errors that name them; the shape checks cached per signature (a network calls with
the same few every step)."""

from __future__ import annotations

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES

PADDING_MODES = ("same", "valid")

#: Grid axis 1 (the group in the GEMM kernel) is limited to 65,535 programs by CUDA.
MAX_GRID_AXIS_1 = 65_535


def _pair(value, name: str, *, minimum: int) -> list[int]:
    """An int or a sequence of 1 or 2 ints, as torch accepts them, checked against ``minimum``."""
    if type(value) is int and value >= minimum:  # the common case, first (bool is not int here)
        return [value, value]
    if type(value) is tuple and len(value) == 2:  # nn.Conv2d keeps its arguments as such pairs
        first, second = value
        if type(first) is int and type(second) is int and min(first, second) >= minimum:
            return [first, second]
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, (tuple, list)) or len(items) not in (1, 2):
        raise TypeError(f"{name} must be an int or a tuple of 2 ints, got {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise TypeError(f"{name} must be an int or a tuple of 2 ints, got {value!r}")
    pair = [items[0], items[-1]]
    if min(pair) < minimum:
        rule = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return pair


def _padding_amounts(padding, kernel_size, dilation, stride) -> list[int]:
    """[top, bottom, left, right] (``kernel_size``: the weight's (KH, KW))."""
    if type(padding) is int and padding >= 0:
        return [padding, padding, padding, padding]
    if isinstance(padding, str):
        if padding not in PADDING_MODES:
            raise ValueError(
                f"padding must be an int, a pair or one of {PADDING_MODES}, got {padding!r}"
            )
        if padding == "valid":
            return [0, 0, 0, 0]
        if stride != [1, 1]:
            raise ValueError(f"padding='same' requires stride 1 (as in torch), got stride {stride}")
        amounts = []
        for d, k in zip(dilation, kernel_size):
            total = d * (k - 1)
            # torch pads the extra row/column of an odd total on the bottom/right.
            amounts += [total // 2, total - total // 2]
        return amounts
    p = _pair(padding, "padding", minimum=0)
    return [p[0], p[0], p[1], p[1]]


#: Where the kernels can read tensors (see runtime.check_kernel_device).
_KERNEL_DEVICE_TYPES = ("cuda", "cpu") if runtime.INTERPRET else ("cuda",)


def _tensors_pass(x, weight, bias) -> bool:
    """Whether the tensor checks of :func:`check_conv_args` pass, in a fraction of their time
    (every call pays this; the full checks, with their messages, run only when it says no)."""
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    dtype, device = x.dtype, x.device
    if (
        dtype not in FLOAT_DTYPES
        or weight.dtype != dtype
        or device.type not in _KERNEL_DEVICE_TYPES
        or weight.device != device
        or x.dim() not in (3, 4)
        or weight.dim() != 4
    ):
        return False
    return bias is None or (
        isinstance(bias, torch.Tensor)
        and bias.dtype == dtype
        and bias.device == device
        and bias.dim() == 1
    )


def is_plain(value) -> bool:
    """An int or a pair of ints, exactly (no bool, float or int subclass inside)."""
    return type(value) is int or (
        type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int
    )


def check_conv_args(x, weight, bias, stride, padding, dilation, groups):
    """Every argument check, before any launch. Returns (stride, padding [top, bottom, left,
    right], dilation) as tuples."""
    if not _tensors_pass(x, weight, bias):
        runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES, ndim=(3, 4))
        runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=4)
        runtime.check_same_dtype(x=x, weight=weight)
        if bias is not None:
            runtime.check_tensor(bias, "bias", dtypes=FLOAT_DTYPES, ndim=1)
            runtime.check_same_dtype(x=x, bias=bias)
        runtime.check_same_device(x=x, weight=weight, bias=bias)
    key = (x.shape, weight.shape, None if bias is None else bias.shape, stride, padding, dilation,
           groups)
    # The shape checks depend on nothing else, and a network calls with the same few shapes
    # every step: cached, for plain ints and pairs of them only (True and 1.0 hash and compare
    # equal to 1, and must still be refused), and not while torch.compile traces this (it would
    # warn that it ignores the cache). The plan cache also skips symbolic (unhashable) sizes.
    if (type(groups) is int and is_plain(stride) and is_plain(dilation)
            and (type(padding) is str or is_plain(padding))
            and not torch.compiler.is_compiling()):  # fmt: skip
        return checked_geometry(*key)
    return checked_geometry.__wrapped__(*key)


@runtime.plan_cache()
def checked_geometry(x_shape, w_shape, bias_shape, stride, padding, dilation, groups):
    """The checks of the shapes against each other and the conv arguments (errors name them),
    and the arguments in the op's form: see :func:`check_conv_args`."""
    if type(groups) is not int and (isinstance(groups, bool) or not isinstance(groups, int)):
        raise TypeError(f"groups must be an int, got {type(groups).__name__}")
    if groups < 1:
        raise ValueError(f"groups must be positive, got {groups}")
    n_filters, group_c, kh, kw = w_shape
    channels, height, width = x_shape[-3:]
    if n_filters % groups != 0:
        raise ValueError(
            f"weight has {n_filters} filters, which groups={groups} does not divide "
            "(each group needs the same number of filters)"
        )
    if group_c * groups != channels:
        raise ValueError(
            f"x has {channels} channels but weight expects weight.shape[1] * groups = "
            f"{group_c} * {groups} = {group_c * groups} (weight is {tuple(w_shape)})"
        )
    if group_c != 1 and groups > MAX_GRID_AXIS_1:
        raise ValueError(
            f"groups must be at most {MAX_GRID_AXIS_1} unless depthwise, got {groups}"
        )
    if bias_shape is not None and bias_shape[0] != n_filters:
        raise ValueError(
            f"bias must have shape ({n_filters},) to match weight, got {tuple(bias_shape)}"
        )
    if kh == 0 or kw == 0:
        raise ValueError(f"weight must have a non-empty kernel, got shape {tuple(w_shape)}")

    stride = _pair(stride, "stride", minimum=1)
    dilation = _pair(dilation, "dilation", minimum=1)
    padding = _padding_amounts(padding, (kh, kw), dilation, stride)
    if (height + padding[0] + padding[1] < dilation[0] * (kh - 1) + 1
            or width + padding[2] + padding[3] < dilation[1] * (kw - 1) + 1):  # fmt: skip
        for axis, size, k, d, before, after in (
            ("height", height, kh, dilation[0], padding[0], padding[1]),
            ("width", width, kw, dilation[1], padding[2], padding[3]),
        ):
            if size + before + after < d * (k - 1) + 1:
                raise ValueError(
                    f"weight's dilated kernel {axis} {d * (k - 1) + 1} is larger than x's padded "
                    f"{axis} {size} + {before + after}: the output would be empty"
                )
    # Tuples: the cache hands the same ones to every call, so they must not be mutable.
    return tuple(stride), tuple(padding), tuple(dilation)


def plain_arguments(stride, padding, dilation, groups) -> bool:
    """Whether the conv arguments are exactly what :func:`checked_geometry` caches (ints and
    pairs of ints; a padding string): only those key conv2d's kept signatures, so that a bool,
    a float or a pair holding one, equal to a kept int, is still refused by the checks."""
    return (type(groups) is int
            and (type(stride) is int or type(stride) is tuple and len(stride) == 2
                 and type(stride[0]) is int and type(stride[1]) is int)
            and (type(padding) is int or type(padding) is str or type(padding) is tuple
                 and len(padding) == 2 and type(padding[0]) is int and type(padding[1]) is int)
            and (type(dilation) is int or type(dilation) is tuple and len(dilation) == 2
                 and type(dilation[0]) is int and type(dilation[1]) is int))
