"""Image ops against PyTorch references computed in float64 on fresh random data."""

from __future__ import annotations

import contextlib
import dataclasses
import zlib

import pytest
import torch
import torch.nn.functional as F

from triton_workshop import DEVICE, runtime
from triton_workshop.ops import image as image_ops
from triton_workshop.ops.image import FILTERS, filter2d, get_filter, greyscale, sepia

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
COLOR_DTYPES = [*FLOAT_DTYPES, torch.uint8]

# Weights in integer thousandths: the uint8 reference is then exact.
GREY_WEIGHTS = torch.tensor([299, 587, 114])
SEPIA_MATRIX = torch.tensor([[393, 769, 189], [349, 686, 168], [272, 534, 131]])

# Shapes (C/3 first): single pixel, ragged, odd sizes around the block sizes, batched.
COLOR_SHAPES = [(3, 1, 1), (3, 7, 13), (3, 33, 65), (2, 3, 17, 31), (5, 3, 1, 9)]


def tolerance(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 1e-2, "atol": 1e-2}


def seed_of(*parts) -> int:
    """A seed per test case that is the same in every run (``hash`` of a str is salted)."""
    return zlib.crc32(repr(parts).encode())


def random_image(shape, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        img = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    else:
        img = torch.rand(shape, generator=gen).to(dtype)
    return img.to(DEVICE)


def mix_reference(img: torch.Tensor, matrix: torch.Tensor, saturate: bool) -> torch.Tensor:
    """``matrix / 1000`` applied to the channel dimension (-3), in float64 (float images) or
    exactly then rounded half to even (uint8), clipped like the op."""
    rgb = img.cpu().movedim(-3, -1)
    if img.dtype == torch.uint8:
        # Integer thousandths: x / 1000 is exact at ties (q + 0.5), so round() is exact too.
        out = (rgb.long() @ matrix.T).double().div(1000).round()
        if saturate:
            out = out.clamp(0, 255)
    else:
        out = rgb.double() @ (matrix.T.double() / 1000)
        if saturate:
            out = out.clamp(max=1.0)
    return out.movedim(-1, -3)


def greyscale_reference(img):
    return mix_reference(img, GREY_WEIGHTS[None, :], saturate=False).squeeze(-3)


def sepia_reference(img):
    return mix_reference(img, SEPIA_MATRIX, saturate=True)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype
    assert out.shape == ref.shape
    assert out.is_contiguous()
    if dtype == torch.uint8:
        assert torch.equal(out.cpu().long(), ref.long())
    else:
        torch.testing.assert_close(out.cpu().double(), ref.double(), **tolerance(dtype))


# --------------------------------------------------------------------------------------------
# greyscale / sepia
# --------------------------------------------------------------------------------------------
COLOR_OPS = [
    pytest.param(greyscale, greyscale_reference, id="greyscale"),
    pytest.param(sepia, sepia_reference, id="sepia"),
]


@pytest.mark.parametrize("op, reference", COLOR_OPS)
@pytest.mark.parametrize("dtype", COLOR_DTYPES, ids=str)
@pytest.mark.parametrize("shape", COLOR_SHAPES, ids=str)
def test_color_matches_reference(op, reference, dtype, shape):
    img = random_image(shape, dtype, seed=seed_of(op.__name__, str(dtype), shape))
    assert_matches(op(img), reference(img), dtype)


def test_greyscale_output_shape():
    assert greyscale(random_image((3, 4, 5), torch.float32, 0)).shape == (4, 5)
    assert greyscale(random_image((2, 3, 4, 5), torch.float32, 1)).shape == (2, 4, 5)


def test_greyscale_uint8_matches_float_formula():
    """Against the textbook ``(w . rgb).round().clamp(0, 255)``: in float64 the weights are not
    exact, so only at exact ties (x.5) may it round the other way, by one."""
    img = random_image((3, 64, 64), torch.uint8, seed=11)
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64)
    textbook = torch.einsum("c,chw->hw", weights, img.cpu().double()).round().clamp(0, 255)
    out = greyscale(img).cpu().double()
    diff = (out - textbook).abs()
    assert diff.max() <= 1
    ties = (torch.einsum("c,chw->hw", GREY_WEIGHTS, img.cpu().long()) % 1000) == 500
    assert torch.all(diff[~ties] == 0)


def test_uint8_rounds_ties_to_even_and_saturates():
    # Every (R, G, 0) pixel whose exact grey value is a tie q + 0.5: it must go to the even q.
    values = torch.arange(64)
    r, g = torch.meshgrid(values, values, indexing="ij")
    totals = 299 * r + 587 * g
    tie = (totals % 1000) == 500
    assert tie.sum() >= 2
    img = torch.stack([r[tie], g[tie], torch.zeros_like(r[tie])]).to(torch.uint8)[:, None, :]
    quotient = totals[tie] // 1000
    expected = quotient + (quotient % 2)
    assert (quotient % 2 == 0).any() and (quotient % 2 == 1).any()
    assert torch.equal(greyscale(img.to(DEVICE)).cpu().long().flatten(), expected)

    white = torch.full((3, 1, 1), 255, dtype=torch.uint8, device=DEVICE)
    # 1.351 * 255 and 1.203 * 255 saturate; 0.937 * 255 = 238.935 rounds to 239.
    assert sepia(white).cpu().flatten().tolist() == [255, 255, 239]
    white_float = torch.ones((3, 1, 1), device=DEVICE)
    torch.testing.assert_close(sepia(white_float).cpu().flatten(), torch.tensor([1.0, 1.0, 0.937]))


def noncontiguous_views(base_shape, dtype, seed):
    """(name, view): channels-last batch, HWC image seen as CHW, and a strided slice."""
    batch = random_image((2, *base_shape), dtype, seed)
    hwc = random_image((base_shape[1], base_shape[2], base_shape[0]), dtype, seed + 1)
    single = random_image(base_shape, dtype, seed + 2)
    return [
        ("channels_last", batch.contiguous(memory_format=torch.channels_last)),
        ("hwc_permuted", hwc.permute(2, 0, 1)),
        ("sliced", single[:, ::2, 1:]),
        ("sliced_batch", batch[..., ::2, 1:]),
    ]


@pytest.mark.parametrize("op, reference", COLOR_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8], ids=str)
def test_color_noncontiguous(op, reference, dtype):
    # 40 x 60 = 2400 pixels: several blocks a plane.
    for name, view in noncontiguous_views((3, 40, 60), dtype, seed=5):
        assert not view.is_contiguous(), name
        out = op(view)
        assert_matches(out, reference(view), dtype)
        assert torch.equal(out, op(view.contiguous())), name


@pytest.mark.parametrize("op", [greyscale, sepia], ids=["greyscale", "sepia"])
@pytest.mark.parametrize(
    "shape, grey_shape",
    [((3, 0, 5), (0, 5)), ((3, 4, 0), (4, 0)), ((0, 3, 4, 4), (0, 4, 4)), ((2, 3, 0, 0), (2, 0, 0))],
    ids=str,
)
def test_color_empty(op, shape, grey_shape):
    img = torch.empty(shape, device=DEVICE)
    out = op(img)
    assert out.shape == (grey_shape if op is greyscale else shape)
    assert out.dtype == img.dtype


@pytest.mark.parametrize("op", [greyscale, sepia], ids=["greyscale", "sepia"])
@pytest.mark.parametrize(
    "bad, error",
    [
        pytest.param(lambda: [[0.0]], TypeError, id="not_a_tensor"),
        pytest.param(lambda: torch.rand(3, 4, 4, dtype=torch.float64), TypeError, id="float64"),
        pytest.param(lambda: torch.zeros(3, 4, 4, dtype=torch.int32), TypeError, id="int32"),
        pytest.param(lambda: torch.rand(4, 4), ValueError, id="2d"),
        pytest.param(lambda: torch.rand(1, 1, 3, 4, 4), ValueError, id="5d"),
        pytest.param(lambda: torch.rand(4, 4, 4), ValueError, id="4_channels"),
        pytest.param(lambda: torch.rand(2, 1, 4, 4), ValueError, id="1_channel"),
        pytest.param(lambda: torch.rand(3, 4, 4, device="meta"), ValueError, id="meta_device"),
    ],
)
def test_color_bad_input(op, bad, error):
    img = bad()
    if isinstance(img, torch.Tensor) and img.device.type != "meta":
        img = img.to(DEVICE)
    with pytest.raises(error, match="img"):
        op(img)


def test_color_plans_cached_per_shape_dtype_and_tuning():
    """One plan per op, shape, strides, dtype and tuning, reused by the next call. The dtype
    keys the plan even where the arguments agree: its prepared launches are compiled kernels."""
    shape, strides = (2, 3, 17, 31), (1581, 527, 31, 1)
    tuning = image_ops.TUNING
    first = image_ops._color_plan("sepia", shape, strides, torch.float32, tuning)
    assert image_ops._color_plan("sepia", shape, strides, torch.float32, tuning) is first
    assert first.kernel is image_ops.sepia_kernel and first.consts["PLANE_CONTIGUOUS"]
    assert first.grid == (2 * runtime.cdiv(17 * 31, tuning.color_block_size),)
    half = image_ops._color_plan("sepia", shape, strides, torch.float16, tuning)
    assert half is not first and half.prepared is not first.prepared
    assert half.consts == first.consts and half.scalars == first.scalars
    uint8 = image_ops._color_plan("sepia", shape, strides, torch.uint8, tuning)
    assert uint8.consts["IS_UINT8"] and not first.consts["IS_UINT8"]
    grey = image_ops._color_plan("greyscale", shape, strides, torch.float32, tuning)
    assert grey.kernel is image_ops.greyscale_kernel
    channels_last = (1581, 1, 93, 3)
    assert not image_ops._color_plan("sepia", shape, channels_last, torch.float32,
                                     tuning).consts["PLANE_CONTIGUOUS"]


@pytest.mark.parametrize("op, reference", COLOR_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8], ids=str)
def test_color_small_blocks(op, reference, dtype, monkeypatch):
    """A replaced block size (as a sweep sets it) is launched at the next call: 40 x 60 pixels
    in blocks of 64 make 38 programs an image, the last one ragged, contiguous or strided."""
    replace_tuning(monkeypatch, color_block_size=64, color_num_warps=2)
    plan = image_ops._color_plan(op.__name__, (2, 3, 40, 60), (7200, 2400, 60, 1), dtype,
                                 image_ops.TUNING)
    assert plan.grid == (2 * 38,) and plan.consts["BLOCK_SIZE"] == 64
    for name, view in [("contiguous", random_image((2, 3, 40, 60), dtype, seed=51)),
                       *noncontiguous_views((3, 40, 60), dtype, seed=52)]:
        assert_matches(op(view), reference(view), dtype)


@pytest.mark.parametrize("op, reference", COLOR_OPS)
def test_color_torch_compile(op, reference):
    compiled = torch.compile(op, fullgraph=True)
    img = random_image((2, 3, 9, 11), torch.float32, seed=3)
    assert_matches(compiled(img), reference(img), torch.float32)


# --------------------------------------------------------------------------------------------
# filter2d
# --------------------------------------------------------------------------------------------
def filter_reference(img: torch.Tensor, kernel: torch.Tensor, padding: str) -> torch.Tensor:
    x = img.cpu().double()
    batched = x if x.dim() == 4 else x.unsqueeze(0)
    channels = batched.shape[1]
    size = kernel.shape[0]
    weight = kernel.cpu().double().expand(channels, 1, size, size)
    out = F.conv2d(batched, weight, padding=padding, groups=channels)
    return out if x.dim() == 4 else out.squeeze(0)


def random_kernel(size: int, seed: int) -> torch.Tensor:
    # Signed weights, scaled so outputs stay O(1) whatever K is.
    gen = torch.Generator().manual_seed(seed)
    return ((torch.rand(size, size, generator=gen) * 2 - 1) / size).to(DEVICE)


@contextlib.contextmanager
def poisoned_outputs():
    """New float tensors from ``torch.empty`` come filled with NaN: an output element the kernel
    never writes then fails the comparison instead of passing on whatever memory held."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.is_floating_point() and t.device.type != "meta":
            t.fill_(float("nan"))
        return t

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", empty)
        yield


def filter_poisoned(img, kernel, padding="same"):
    with poisoned_outputs():
        return filter2d(img, kernel, padding)


# Launch settings that make a small image span several column strips (32 threads a program) and
# several chunks of rows (8 at least), so the interpreter covers the edges between them.
SMALL_PROGRAMS = dict(filter_num_warps=1, filter_num_warps_by_k=(),
                      filter_vectors_per_thread_by_k=(), filter_min_rows=8)


def replace_tuning(monkeypatch, **changes) -> None:
    """Replace image.TUNING (part of every plan's key) for this test only."""
    monkeypatch.setattr(image_ops, "TUNING", dataclasses.replace(image_ops.TUNING, **changes))


@pytest.fixture
def small_programs(monkeypatch):
    replace_tuning(monkeypatch, **SMALL_PROGRAMS)


def filter_plan(img, size, padding):
    """How ``filter2d(img, kernel of size K, padding)`` cuts its work, under today's tuning."""
    _, out_height, out_width = image_ops._filter2d_geometry(img, torch.empty(size, size), padding)
    planes = img.shape[:-2].numel()
    return image_ops.filter2d_tiling(img.element_size(), size, planes, out_height, out_width,
                                     runtime.num_sms(img.device), image_ops.TUNING)


def test_named_filters_values():
    assert set(FILTERS) == {"sharpen", "edge", "gaussian", "motion_blur", "sobel_x", "sobel_y"}
    for name, kernel in FILTERS.items():
        assert kernel.dtype == torch.float32 and kernel.device.type == "cpu", name
    assert FILTERS["sharpen"].tolist() == [[0, -1, 0], [-1, 5, -1], [0, -1, 0]]
    assert FILTERS["edge"].tolist() == [[-1, -1, -1], [-1, 8, -1], [-1, -1, -1]]
    binomial = torch.tensor([1.0, 4, 6, 4, 1])
    assert torch.equal(FILTERS["gaussian"], torch.outer(binomial, binomial) / 256)
    assert FILTERS["gaussian"].sum().item() == 1.0
    assert torch.equal(FILTERS["motion_blur"], torch.eye(5) / 5)
    assert FILTERS["sobel_x"].tolist() == [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]]
    assert torch.equal(FILTERS["sobel_y"], FILTERS["sobel_x"].T)


def test_get_filter():
    kernel = get_filter("gaussian", device=DEVICE, dtype=torch.float16)
    assert kernel.dtype == torch.float16 and kernel.device.type == DEVICE.type
    copy = get_filter("sharpen")
    copy.zero_()  # a copy: the shared table is untouched
    assert FILTERS["sharpen"][1, 1].item() == 5.0
    with pytest.raises(ValueError, match="sobel_x"):
        get_filter("blurry")


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_named_filters(name, dtype, padding):
    img = random_image((3, 33, 65), dtype, seed=seed_of(name, str(dtype), padding))
    kernel = get_filter(name, device=DEVICE)
    assert_matches(filter2d(img, kernel, padding), filter_reference(img, kernel, padding), dtype)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("size", [1, 3, 7, 11, 15])
def test_kernel_sizes(size, padding):
    # One plane, one strip: K = 15 is 225 taps, and each is a Python step in the interpreter.
    img = random_image((1, 20, 23), torch.float32, seed=size)
    kernel = random_kernel(size, seed=100 + size)
    out = filter_poisoned(img, kernel, padding)
    assert_matches(out, filter_reference(img, kernel, padding), torch.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1), (3, 7, 13), (2, 5, 6), (2, 3, 33, 65), (3, 1, 40, 3), (1, 20, 150)],
    ids=str,
)
def test_filter_shapes(shape, dtype):
    img = random_image(shape, dtype, seed=seed_of(shape, str(dtype)))
    kernel = random_kernel(3, seed=7)
    assert_matches(filter_poisoned(img, kernel), filter_reference(img, kernel, "same"), dtype)
    if min(shape[-2:]) >= 3:
        valid = filter_poisoned(img, kernel, padding="valid")
        assert valid.shape == (*shape[:-2], shape[-2] - 2, shape[-1] - 2)
        assert_matches(valid, filter_reference(img, kernel, "valid"), dtype)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("size", [1, 3, 5, 7])
def test_filter_strips_and_chunks(size, padding, small_programs):
    # 150 columns: a 128-column strip and a ragged one (22 columns, K - 1 fewer for "valid");
    # 29 rows: chunks of max(8, 2 (K - 1)) rows, the last one ragged. Two planes, unbatched.
    img = random_image((2, 29, 150), torch.float32, seed=seed_of("strips", size, padding))
    kernel = random_kernel(size, seed=200 + size)
    plan = filter_plan(img, size, padding)
    assert plan.n_strips == 2 and plan.n_chunks >= 2 and plan.preload_taps
    out = filter_poisoned(img, kernel, padding)
    assert_matches(out, filter_reference(img, kernel, padding), torch.float32)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("size", [3, 5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_filter_half_precision_strips(dtype, size, padding, small_programs):
    # 16-bit pixels: 8 columns a thread, 256-column strips; 300 columns make two, batched.
    img = random_image((1, 2, 21, 300), dtype, seed=seed_of("half", str(dtype), size, padding))
    kernel = random_kernel(size, seed=300 + size)
    plan = filter_plan(img, size, padding)
    assert plan.vec == 8 and plan.n_strips == 2 and plan.n_chunks >= 2
    assert_matches(filter_poisoned(img, kernel, padding), filter_reference(img, kernel, padding), dtype)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_filter_reloaded_taps(dtype, padding, small_programs, monkeypatch):
    # The large-K path (taps reloaded every row, 8 columns a thread: two vectors in fp32, no
    # prefetch), forced at K = 5 where the interpreter runs it quickly.
    replace_tuning(monkeypatch, filter_preload_max_taps=0)
    img = random_image((2, 27, 300), dtype, seed=seed_of("reload", str(dtype), padding))
    kernel = random_kernel(5, seed=400)
    plan = filter_plan(img, 5, padding)
    assert not plan.preload_taps and plan.blocks * plan.vec == 8
    assert plan.n_strips == 2 and plan.n_chunks >= 2
    assert_matches(filter_poisoned(img, kernel, padding), filter_reference(img, kernel, padding), dtype)


def test_filter_plan_follows_tiling_and_is_cached(small_programs):
    """The launch plan carries the tiling's decisions, is reused for the same shapes, strides,
    dtypes and tuning, and is another plan for a kernel of another dtype (its prepared launches
    are compiled for the dtypes)."""
    img = random_image((2, 3, 21, 300), torch.float16, seed=61)
    kernel = random_kernel(5, seed=62)
    tiling = filter_plan(img, 5, "same")
    args = [img.shape, img.stride(), 5, kernel.stride(), img.dtype, kernel.dtype, 2, 21, 300,
            img.device, image_ops.TUNING]
    plan = image_ops._filter2d_plan(*args)
    assert image_ops._filter2d_plan(*args) is plan
    assert plan.kernel is image_ops.filter2d_kernel and plan.grid == (tiling.programs,)
    assert plan.scalars[-3:] == (tiling.n_strips, tiling.n_chunks, tiling.rows_per_program)
    assert (plan.consts["VEC"], plan.consts["BLOCKS"], plan.consts["GROUPS"]) == (
        tiling.vec, tiling.blocks, tiling.groups)
    assert plan.consts["num_warps"] == tiling.num_warps == 1
    assert (plan.consts["LEFT_BLOCKS"], plan.consts["RIGHT_BLOCKS"]) == (1, 1)
    half_kernel = image_ops._filter2d_plan(*args[:5], torch.float16, *args[6:])
    assert half_kernel is not plan and half_kernel.consts == plan.consts
    ref = filter_reference(img, kernel, "same")
    assert_matches(filter_poisoned(img, kernel), ref, torch.float16)
    half = kernel.half()
    assert_matches(filter_poisoned(img, half), filter_reference(img, half, "same"), torch.float16)


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_filter_strided_strips(padding, small_programs):
    """Views whose rows are not contiguous 16-byte-aligned vectors load element by element;
    the window and the strip edges must not care."""
    base = random_image((1, 2, 19, 280), torch.float32, seed=31)
    kernel = random_kernel(5, seed=32)
    views = {
        "every_other_column": base[:, :, :, ::2],  # stride_w = 2: 140 columns, two strips
        "misaligned": base[0, :, 2:, 1:141],  # starts one element past a 16-byte boundary
        "channels_last": base.contiguous(memory_format=torch.channels_last)[:, :, :, :140],
    }
    for name, view in views.items():
        assert not view.is_contiguous(), name
        assert filter_plan(view, 5, padding).n_strips == 2, name
        out = filter_poisoned(view, kernel, padding)
        assert_matches(out, filter_reference(view, kernel, padding), torch.float32)
    # Read in place through the strides, the same arithmetic as on a contiguous copy: equal bits.
    view = views["every_other_column"]
    assert torch.equal(filter2d(view, kernel, padding), filter2d(view.contiguous(), kernel, padding))


def test_filter_valid_image_as_large_as_kernel():
    img = random_image((2, 5, 5), torch.float32, seed=9)
    kernel = random_kernel(5, seed=10)
    out = filter_poisoned(img, kernel, "valid")
    assert out.shape == (2, 1, 1)
    assert_matches(out, filter_reference(img, kernel, "valid"), torch.float32)


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_filter_noncontiguous(padding):
    kernel = get_filter("sobel_x", device=DEVICE)
    # 21 x 140: two tiles across, halos crossing tile edges.
    for name, view in noncontiguous_views((3, 21, 140), torch.float32, seed=21):
        assert not view.is_contiguous(), name
        out = filter2d(view, kernel, padding)
        assert_matches(out, filter_reference(view, kernel, padding), torch.float32)
        assert torch.equal(out, filter2d(view.contiguous(), kernel, padding)), name
    # A transposed kernel is read through its strides too.
    transposed = random_kernel(5, seed=22).T
    img = random_image((2, 12, 17), torch.float32, seed=23)
    assert_matches(filter2d(img, transposed, padding), filter_reference(img, transposed, padding), torch.float32)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("shape", [(3, 0, 5), (3, 6, 0), (0, 3, 8, 8), (2, 0, 8, 8), (3, 0, 0)], ids=str)
def test_filter_empty(shape, padding):
    img = torch.empty(shape, device=DEVICE)
    out = filter2d(img, get_filter("sharpen", device=DEVICE), padding)
    height, width = shape[-2:]
    if padding == "valid":
        height, width = max(height - 2, 0), max(width - 2, 0)
    assert out.shape == (*shape[:-2], height, width)


def _kernel(*shape, **kwargs):
    return lambda: torch.rand(*shape, **kwargs)


@pytest.mark.parametrize(
    "img, kernel, padding, error, match",
    [
        pytest.param(lambda: [[0.0]], _kernel(3, 3), "same", TypeError, "img", id="img_not_tensor"),
        pytest.param(_kernel(3, 8, 8), lambda: [[1.0]], "same", TypeError, "kernel", id="kernel_not_tensor"),
        pytest.param(
            lambda: torch.zeros(3, 8, 8, dtype=torch.uint8), _kernel(3, 3), "same", TypeError, "img", id="img_uint8"
        ),
        pytest.param(
            _kernel(3, 8, 8, dtype=torch.float64), _kernel(3, 3), "same", TypeError, "img", id="img_float64"
        ),
        pytest.param(
            _kernel(3, 8, 8), lambda: torch.ones(3, 3, dtype=torch.int64), "same", TypeError, "kernel", id="kernel_int"
        ),
        pytest.param(_kernel(8, 8), _kernel(3, 3), "same", ValueError, "img", id="img_2d"),
        pytest.param(_kernel(1, 1, 3, 8, 8), _kernel(3, 3), "same", ValueError, "img", id="img_5d"),
        pytest.param(_kernel(3, 8, 8), _kernel(9), "same", ValueError, "kernel", id="kernel_1d"),
        pytest.param(_kernel(3, 8, 8), _kernel(1, 3, 3), "same", ValueError, "kernel", id="kernel_3d"),
        pytest.param(_kernel(3, 8, 8), _kernel(3, 5), "same", ValueError, "kernel", id="kernel_not_square"),
        pytest.param(_kernel(3, 8, 8), _kernel(4, 4), "same", ValueError, "kernel", id="kernel_even"),
        pytest.param(_kernel(3, 8, 8), _kernel(3, 3), "full", ValueError, "padding", id="padding_unknown"),
        pytest.param(_kernel(3, 8, 8), _kernel(3, 3), 1, ValueError, "padding", id="padding_int"),
        pytest.param(_kernel(3, 4, 8), _kernel(5, 5), "valid", ValueError, "kernel", id="valid_too_small"),
        pytest.param(
            _kernel(3, 8, 8), _kernel(3, 3, device="meta"), "same", ValueError, "kernel", id="kernel_meta"
        ),
    ],
)
def test_filter_bad_input(img, kernel, padding, error, match):
    def on_device(t):
        return t.to(DEVICE) if isinstance(t, torch.Tensor) and t.device.type != "meta" else t

    with pytest.raises(error, match=match):
        filter2d(on_device(img()), on_device(kernel()), padding)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device beside the CPU")
def test_filter_devices_differ():
    with pytest.raises(ValueError, match="kernel"):
        filter2d(torch.rand(3, 8, 8, device="cuda"), torch.rand(3, 3))


def test_filter_torch_compile():
    compiled = torch.compile(filter2d, fullgraph=True)
    img = random_image((2, 3, 9, 11), torch.float32, seed=4)
    kernel = get_filter("gaussian", device=DEVICE)
    for padding in ("same", "valid"):
        assert_matches(compiled(img, kernel, padding), filter_reference(img, kernel, padding), torch.float32)


# --------------------------------------------------------------------------------------------
# GPU only: batches past 2**31 elements (64-bit batch offsets).
# --------------------------------------------------------------------------------------------
@pytest.mark.big_memory
@pytest.mark.skipif(not torch.cuda.is_available() or DEVICE.type != "cuda", reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_batches_past_2_31_elements():
    # (684, 3, 1024, 1024) fp16 is 2**31 + 2**22 elements (4 GiB): the last images start past
    # int32. Only those are random (the rest zeros), and only those are compared.
    img = torch.zeros(2**31 // (3 * 1024 * 1024) + 2, 3, 1024, 1024, device="cuda",
                      dtype=torch.float16)
    img[-2:] = random_image((2, 3, 1024, 1024), torch.float16, seed=31)
    tail = img[-2:]
    assert_matches(greyscale(img)[-2:], greyscale_reference(tail), torch.float16)
    assert_matches(sepia(img)[-2:], sepia_reference(tail), torch.float16)
    kernel = random_kernel(5, seed=32)
    assert_matches(filter2d(img, kernel)[-2:], filter_reference(tail, kernel, "same"), torch.float16)
