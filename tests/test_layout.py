"""transpose_copy and to_channels_last against torch: ragged tiles, strides, dtypes, empty, int64.

Every case compares bit for bit (a copy has no rounding) on data that is never all zeros, and
sizes are chosen around the 64 x 64 tile: exact multiples, one past, one short, single rows.
"""

from __future__ import annotations

import pytest
import torch

from triton_workshop import runtime
from triton_workshop.ops import layout
from triton_workshop.ops.layout import to_channels_last, transpose_copy

DEVICE = runtime.DEVICE


def arange_tensor(shape, dtype=torch.float32) -> torch.Tensor:
    """Distinct values (1, 2, 3, ...) where the dtype can hold them: a misplaced element shows."""
    n = 1
    for s in shape:
        n *= s
    values = torch.arange(1, n + 1, dtype=torch.float64)
    if dtype == torch.bool:
        return (values % 3 == 0).reshape(shape).to(DEVICE)
    if not dtype.is_floating_point:
        values = values % 100 if dtype in (torch.int8, torch.uint8) else values
    elif dtype in (torch.float16, torch.bfloat16):
        values = values % 251  # exact in both
    return values.to(dtype).reshape(shape).to(DEVICE)


def expect_transpose(x: torch.Tensor) -> None:
    y = transpose_copy(x)
    assert y.is_contiguous()
    assert y.dtype == x.dtype and y.device == x.device
    assert torch.equal(y, x.transpose(-1, -2))


@pytest.mark.parametrize(
    "shape",
    [(1, 64, 64), (2, 64, 128), (3, 65, 63), (2, 1, 130), (2, 130, 1), (1, 1, 1), (5, 7, 3),
     (2, 100, 36)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_ragged_shapes(shape):
    expect_transpose(arange_tensor(shape))


def test_two_dimensional():
    expect_transpose(arange_tensor((70, 33)))


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
     torch.int8, torch.uint8, torch.bool],
    ids=str,
)
def test_dtypes(dtype):
    expect_transpose(arange_tensor((2, 67, 45), dtype))


@pytest.mark.parametrize(
    "make_view",
    [
        lambda t: t.transpose(1, 2),        # source already column-major: a plain copy
        lambda t: t[:, 3:60:2, 1:],         # stepped rows, offset start
        lambda t: t[1::2],                  # every other batch
        lambda t: t.permute(2, 0, 1)[:, :, 5:50],  # batch stride 1
        lambda t: t[:, :1].expand(4, 40, 70),      # stride 0: a broadcast row
    ],
    ids=["transposed", "stepped", "batch-step", "permuted", "expanded"],
)
def test_strided_views(make_view):
    base = arange_tensor((4, 70, 70))
    view = make_view(base)
    assert not view.is_contiguous()
    expect_transpose(view)


@pytest.mark.parametrize("shape", [(0, 5, 6), (3, 0, 6), (3, 5, 0), (0, 4)], ids=str)
def test_empty(shape):
    x = torch.empty(shape, device=DEVICE)
    y = transpose_copy(x)
    assert y.shape == x.transpose(-1, -2).shape and y.is_contiguous()


def test_int64_offsets_path(monkeypatch):
    """Large tensors switch the kernel to 64-bit offsets: forced here with a small limit."""
    monkeypatch.setattr(layout, "_INT32_LIMIT", 16)  # read at every launch
    expect_transpose(arange_tensor((3, 65, 70)))
    x = arange_tensor((2, 16, 9, 7), torch.float16)
    assert torch.equal(to_channels_last(x), x)


def test_gradient():
    x = arange_tensor((2, 5, 7)).requires_grad_()
    y = transpose_copy(x)
    grad = arange_tensor((2, 7, 5)) * 0.5
    y.backward(grad)
    assert torch.equal(x.grad, grad.transpose(-1, -2))


@pytest.mark.parametrize(
    "x, match, error",
    [
        ([[1.0]], "x must be a torch.Tensor", TypeError),
        (torch.ones(3), "x must have 2 or 3 dimensions", ValueError),
        (torch.ones(1, 2, 3, 4), "x must have 2 or 3 dimensions", ValueError),
        (torch.ones(2, 3, dtype=torch.complex64), "x must be a real or bool tensor", TypeError),
    ],
    ids=["list", "1d", "4d", "complex"],
)
def test_bad_arguments(x, match, error):
    if isinstance(x, torch.Tensor):
        x = x.to(DEVICE)  # fails for the reason named, not for its device
    with pytest.raises(error, match=match):
        transpose_copy(x)


def test_compile_fullgraph():
    x = arange_tensor((2, 65, 33))
    compiled = torch.compile(lambda t: transpose_copy(t) * 2, fullgraph=True)
    assert torch.equal(compiled(x), x.transpose(-1, -2) * 2)


# --------------------------------------------------------------------------------------------
# to_channels_last: the NCHW -> NHWC copy of the convolution launcher.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make_input",
    [
        lambda: arange_tensor((2, 64, 56, 3), torch.float16),
        lambda: arange_tensor((3, 5, 7, 9)),
        lambda: arange_tensor((2, 70, 1, 1)),
        lambda: arange_tensor((2, 3, 1, 9)),
        lambda: arange_tensor((2, 3, 9, 1)),
        lambda: arange_tensor((3, 12, 6, 5))[1:, 2:9],         # sliced N and C: still mergeable
        lambda: arange_tensor((2, 8, 6, 10))[:, :, :, ::2],     # stepped W: H, W still merge
        lambda: arange_tensor((2, 8, 6, 10))[:, :, :, 1:9],     # sliced W: not mergeable
        lambda: arange_tensor((0, 8, 6, 10)),
    ],
    ids=["fp16-64ch", "ragged", "1x1", "h1", "w1", "sliced-nc", "stepped-w", "sliced-w", "empty"],
)
def test_to_channels_last(make_input):
    x = make_input()
    y = to_channels_last(x)
    expected = x.contiguous(memory_format=torch.channels_last)
    assert y.shape == x.shape and torch.equal(y, x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert y.stride() == expected.stride()


def test_to_channels_last_keeps_channels_last_input():
    x = arange_tensor((2, 8, 5, 6)).contiguous(memory_format=torch.channels_last)
    assert to_channels_last(x) is x
