"""transpose_copy and to_channels_last against torch: ragged tiles, strides, dtypes, empty, int64.

Every case compares bit for bit (a copy has no rounding) on data that is never all zeros, and
sizes are chosen around the 64 x 64 tile: exact multiples, one past, one short, single rows.
"""

from __future__ import annotations

import dataclasses

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
    # The tuning is part of the plan's key: a replaced one takes effect at the next call.
    monkeypatch.setattr(layout, "TUNING", dataclasses.replace(layout.TUNING, int32_limit=16))
    plan = layout.transpose_plan((3, 65, 70), (4550, 70, 1), torch.float32, layout.TUNING)
    assert plan.consts["INT64"]
    expect_transpose(arange_tensor((3, 65, 70)))
    x = arange_tensor((2, 16, 9, 7), torch.float16)
    assert torch.equal(to_channels_last(x), x)


@pytest.mark.parametrize("tile", [(16, 32), (32, 16)], ids=["16x32", "32x16"])
def test_other_tiles(tile, monkeypatch):
    """A replaced tile (as a sweep sets it) is launched, and ragged shapes still copy exactly."""
    block_r, block_c = tile
    tuning = dataclasses.replace(layout.TUNING, block_r=block_r, block_c=block_c, num_warps=2)
    monkeypatch.setattr(layout, "TUNING", tuning)
    plan = layout.transpose_plan((2, 33, 47), (1551, 47, 1), torch.float32, tuning)
    assert plan.grid == (2 * runtime.cdiv(33, block_r) * runtime.cdiv(47, block_c),)
    assert (plan.consts["BLOCK_R"], plan.consts["BLOCK_C"], plan.consts["num_warps"]) == (*tile, 2)
    expect_transpose(arange_tensor((2, 33, 47)))
    x = arange_tensor((2, 5, 7, 9))
    assert torch.equal(to_channels_last(x), x.contiguous(memory_format=torch.channels_last))


def test_plans_cached_per_shape_dtype_and_tuning():
    """One plan per shape, strides, dtype and tuning. The dtype changes no argument, yet it must
    key the plan: its prepared launches are compiled kernels, one dtype each."""
    shape, strides = (2, 40, 30), (1200, 30, 1)
    first = layout.transpose_plan(shape, strides, torch.float16, layout.TUNING)
    assert layout.transpose_plan(shape, strides, torch.float16, layout.TUNING) is first
    other_dtype = layout.transpose_plan(shape, strides, torch.float32, layout.TUNING)
    assert other_dtype is not first and other_dtype.prepared is not first.prepared
    assert (other_dtype.grid, other_dtype.scalars, other_dtype.consts) == (
        first.grid, first.scalars, first.consts)
    tuning = dataclasses.replace(layout.TUNING, block_c=32)
    assert layout.transpose_plan(shape, strides, torch.float16, tuning) is not first
    for dtype in (torch.float16, torch.float32):  # both dtypes, one shape: each its own launch
        expect_transpose(arange_tensor(shape, dtype))


def test_channels_last_copy_plan():
    """The transpose behind the channels-last copy, or None where H and W do not merge into one
    axis of pixels (Tensor.contiguous copies those) or there is nothing to copy."""
    tuning = layout.TUNING
    plan = layout.channels_last_copy_plan((2, 3, 4, 5), (60, 20, 5, 1), torch.float32, tuning)
    assert plan is layout.transpose_plan((2, 3, 20), (60, 20, 1), torch.float32, tuning)
    stepped = layout.channels_last_copy_plan((2, 3, 4, 5), (120, 40, 10, 2), torch.float32, tuning)
    assert stepped.scalars == (3, 20, 120, 40, 2)
    for shape, strides in [((2, 3, 4, 5), (90, 30, 7, 1)), ((0, 3, 4, 5), (60, 20, 5, 1))]:
        assert layout.channels_last_copy_plan(shape, strides, torch.float32, tuning) is None
    x = arange_tensor((2, 3, 4, 10))[..., ::2]
    copied = layout.copy_to_channels_last(x, stepped)
    assert torch.equal(copied, x) and copied.is_contiguous(memory_format=torch.channels_last)


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
