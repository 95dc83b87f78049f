"""conv2d against F.conv2d in float64: values, layouts, gradients, errors, torch.compile.

Every test draws fresh seeded random data (never all zeros: a kernel that skips a tap or a channel
block must fail). The reference is F.conv2d in float64 on the *same rounded* inputs, so the only
error allowed is the kernel's own: fp32 accumulation plus one rounding of the output.

Shapes are small for the interpreter (N <= 2, H, W <= 12, F <= 8, C <= 8), except the few cases with
32 or 64 channels per group on tiny images: the channel-tiled K loop, the one the GPU runs for real
networks, is only taken from 32 channels per group up. bf16 runs everywhere: on the GPU with native
bf16 dots, in the interpreter through the kernel's fp32-upcast path (DOT_IN_FP32).
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch
import torch.nn.functional as F

from triton_workshop import runtime
from triton_workshop.ops import conv as conv_module
from triton_workshop.ops import layout as layout_module
from triton_workshop.ops.conv import checks as conv_checks
from triton_workshop.ops.conv import kernels as conv_kernels
from triton_workshop.ops.conv import (
    DEPTHWISE_CONFIGS,
    GEMM_CONFIGS,
    conv2d,
    prune_gemm_configs,
    tf32_enabled,
    uses_channel_tiles,
)

DEVICE = runtime.DEVICE
# torch's own reference warns that padding="same" with an even kernel copies its input.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
#: Relative to the largest |reference| value: fp32 with TF32 off is exact fp32 accumulation;
#: fp16/bf16 are dominated by the one rounding of the output (2**-11 and 2**-8 relative).
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def nchw_via_channels_last(monkeypatch, on: bool) -> None:
    """Take the GPU's NCHW path (x copied to channels-last first) or the interpreter's (NCHW read
    in place), whichever machine runs the test."""
    tuning = dataclasses.replace(conv_module.TUNING, nchw_via_channels_last=on)
    monkeypatch.setattr(conv_module, "TUNING", tuning)


@pytest.fixture(autouse=True)
def ieee_fp32():
    """Exact fp32 (TF32 off) for the comparisons, restored afterwards. Set through the legacy
    flag, which keeps torch.backends.cudnn.conv.fp32_precision in sync."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def randn(shape, dtype=torch.float32, *, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    t = torch.where(t == 0, torch.ones_like(t), t)
    return t.to(dtype).to(DEVICE)


def reference(x, w, b=None, **kwargs):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), **kwargs)


def check(out, ref, dtype):
    assert out.shape == ref.shape
    assert out.dtype == dtype
    assert not torch.isnan(out).any(), "NaN: some outputs were never written"
    scale = max(ref.abs().max().item(), 1.0)
    torch.testing.assert_close(out.double(), ref, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def make(n, c, h, w, f, kh, kw, groups=1, dtype=torch.float32, bias=True, seed=0):
    x = randn((n, c, h, w), dtype, seed=seed)
    weight = randn((f, c // groups, kh, kw), dtype, seed=seed + 1)
    b = randn((f,), dtype, seed=seed + 2) if bias else None
    return x, weight, b


# (N, C, H, W, F, KH, KW, conv kwargs): each case exercises one geometry, all on fresh data.
CASES = [
    ("3x3-pad1", (2, 8, 12, 12, 8, 3, 3), dict(padding=1)),
    ("3x3-pad0", (2, 8, 12, 12, 8, 3, 3), dict()),
    ("1x1", (2, 8, 10, 12, 8, 1, 1), dict()),
    ("1x1-stride2", (2, 8, 9, 11, 6, 1, 1), dict(stride=2)),
    ("5x3-pad(1,2)", (2, 6, 11, 12, 8, 5, 3), dict(padding=(1, 2))),
    ("3x3-stride2-pad1", (2, 8, 12, 12, 8, 3, 3), dict(stride=2, padding=1)),
    ("3x3-stride(2,1)", (1, 8, 11, 9, 5, 3, 3), dict(stride=(2, 1), padding=(0, 1))),
    ("3x3-dil2", (2, 5, 12, 12, 7, 3, 3), dict(dilation=2, padding=1)),
    ("5x3-dil(2,1)-stride2", (2, 8, 12, 11, 6, 5, 3), dict(dilation=(2, 1), stride=2)),
    ("same-3x3", (2, 8, 12, 12, 8, 3, 3), dict(padding="same")),
    ("same-4x2-even", (2, 8, 12, 11, 8, 4, 2), dict(padding="same")),
    ("same-3x3-dil2", (1, 8, 9, 12, 8, 3, 3), dict(padding="same", dilation=2)),
    ("valid", (2, 8, 12, 12, 8, 3, 3), dict(padding="valid")),
    ("ragged", (2, 3, 7, 11, 5, 3, 3), dict(padding=1)),
    ("rgb-stem-7x7", (1, 3, 12, 12, 8, 7, 7), dict(stride=2, padding=3)),
    ("groups2", (2, 8, 12, 12, 8, 3, 3), dict(groups=2, padding=1)),
    ("groups2-stride2", (2, 6, 11, 10, 4, 3, 3), dict(groups=2, stride=2)),
    ("groups2-one-filter-each", (2, 8, 9, 9, 2, 3, 3), dict(groups=2, padding=1)),
    ("depthwise", (2, 8, 12, 12, 8, 3, 3), dict(groups=8, padding=1)),
    ("depthwise-5x3-stride2-dil2", (2, 8, 12, 12, 8, 5, 3), dict(groups=8, stride=2, dilation=2)),
    ("depthwise-multiplier2", (2, 4, 12, 12, 8, 3, 3), dict(groups=4, padding="same")),
    ("kernel-covers-input", (1, 4, 3, 5, 4, 3, 5), dict()),
    ("single-pixel-output", (2, 8, 12, 12, 8, 1, 1), dict(stride=13)),
    # Channel-tiled K loop (32 / 64 channels per group): the path real networks take on the GPU.
    ("channel-tiled-32", (1, 32, 6, 6, 8, 3, 3), dict(padding=1)),
    ("channel-tiled-64-groups2", (1, 128, 5, 6, 8, 3, 3), dict(groups=2, padding=1)),
    ("channel-tiled-96-stride2", (1, 96, 7, 7, 4, 3, 3), dict(stride=2, padding=1)),
]
CASE_IDS = [c[0] for c in CASES]


def groups_of(kwargs):
    return kwargs.get("groups", 1)


@pytest.mark.parametrize("name, shape, kwargs", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_torch_fp32(name, shape, kwargs, bias):
    x, w, b = make(*shape, groups=groups_of(kwargs), bias=bias, seed=seed_of(name, bias))
    out = conv2d(x, w, b, **kwargs)
    check(out, reference(x, w, b, **kwargs), torch.float32)
    assert out.is_contiguous()


@pytest.mark.parametrize("via_channels_last", [True, False], ids=["via-nhwc", "in-place"])
@pytest.mark.parametrize("name, shape, kwargs", [c for c in CASES if c[0] in (
    "3x3-pad1", "groups2-stride2", "channel-tiled-32")], ids=lambda c: c if isinstance(c, str) else None)
def test_nchw_both_paths(name, shape, kwargs, via_channels_last, monkeypatch):
    """NCHW inputs: read in place, or converted to channels-last first (the GPU's choice)."""
    nchw_via_channels_last(monkeypatch, via_channels_last)
    x, w, b = make(*shape, groups=groups_of(kwargs), bias=True, seed=seed_of(name, via_channels_last))
    out = conv2d(x, w, b, **kwargs)
    check(out, reference(x, w, b, **kwargs), torch.float32)
    assert out.is_contiguous()


HALF_CASES = [c for c in CASES if c[0] in ("3x3-pad1", "5x3-pad(1,2)", "same-4x2-even", "groups2",
                                           "depthwise", "rgb-stem-7x7", "channel-tiled-32")]


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=DTYPE_IDS[1:])
@pytest.mark.parametrize("name, shape, kwargs", HALF_CASES, ids=[c[0] for c in HALF_CASES])
def test_matches_torch_half(name, shape, kwargs, dtype):
    x, w, b = make(*shape, groups=groups_of(kwargs), dtype=dtype, seed=seed_of(name, dtype))
    check(conv2d(x, w, b, **kwargs), reference(x, w, b, **kwargs), dtype)


@pytest.mark.parametrize(
    "name, shape, kwargs",
    [
        ("flat-k", (2, 8, 12, 12, 8, 3, 3), dict(padding=1)),
        ("flat-k-stride2-groups2", (2, 8, 11, 12, 8, 3, 3), dict(stride=2, groups=2)),
        ("channel-tiled", (1, 64, 6, 7, 8, 3, 3), dict(padding=1)),
        ("depthwise", (2, 8, 12, 12, 8, 3, 3), dict(groups=8, padding=1)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_channels_last(name, shape, kwargs, dtype):
    """Channels-last in, channels-last out (as torch), read in place through the strides."""
    x, w, b = make(*shape, groups=groups_of(kwargs), dtype=dtype, seed=seed_of(name, "cl"))
    x_cl = x.to(memory_format=torch.channels_last)
    out = conv2d(x_cl, w, b, **kwargs)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    assert out.stride() == F.conv2d(x_cl, w, b, **kwargs).stride()
    check(out, reference(x, w, b, **kwargs), dtype)


@pytest.mark.parametrize("via_channels_last", [True, False], ids=["via-nhwc", "in-place"])
@pytest.mark.parametrize("columns", [slice(None, None, 2), slice(3, 15)], ids=["stepped", "sliced"])
def test_strided_view_input(columns, via_channels_last, monkeypatch):
    """A non-contiguous view (a channel slice; every other column, where H and W still merge into
    one run of pixels, or a column slice, where they do not) is read in place or converted."""
    nchw_via_channels_last(monkeypatch, via_channels_last)
    x, w, b = make(2, 8, 12, 12, 8, 3, 3, seed=11)
    big = randn((2, 12, 12, 24), seed=12)
    view = big[:, 2:10, :, columns]
    assert not view.is_contiguous()
    out = conv2d(view, w, b, padding=1)
    check(out, reference(view, w, b, padding=1), torch.float32)
    assert out.is_contiguous()


@pytest.mark.parametrize(
    "make_weight",
    [
        lambda w: w.to(memory_format=torch.channels_last),
        lambda w: w,
        lambda w: torch.stack([w, w], dim=2).flatten(1, 2)[:, ::2],  # neither layout
    ],
    ids=["channels-last", "contiguous", "strided"],
)
def test_channel_tiled_weight_layout(make_weight):
    """Any weight layout: channels-last is read in place, anything else copied to it."""
    x, w, b = make(1, 32, 6, 6, 8, 3, 3, seed=13)
    check(conv2d(x, make_weight(w), b, padding=1), reference(x, w, b, padding=1), torch.float32)


def test_strided_bias():
    x, w, _ = make(2, 8, 7, 7, 6, 3, 3, bias=False, seed=23)
    b = randn((12,), seed=24)[::2]
    assert b.stride(0) == 2
    check(conv2d(x, w, b, padding=1), reference(x, w, b, padding=1), torch.float32)


class LaunchRecorder:
    """Stands in for runtime.registry.launch_kernel (every planned launch goes through it): records each launch's
    kernel, arguments (tensors, then scalars), constexprs and plan parts, then launches it for
    real."""

    def __init__(self, real):
        self.real = real
        self.launches = []
        self.plans = []  # (grid, scalars, consts, prepared) as passed: the plan's own objects

    def __call__(self, kernel, grid, tensors, scalars, consts, prepared):
        self.launches.append((kernel, (*tensors, *scalars), consts))
        self.plans.append((grid, scalars, consts, prepared))
        return self.real(kernel, grid, tensors, scalars, consts, prepared)

    def of(self, kernel):
        return [launch for launch in self.launches if launch[0] is kernel]

    def plans_of(self, kernel):
        """The plan parts of ``kernel``'s launches (on the GPU an NCHW x adds the transpose's)."""
        return [plan for launch, plan in zip(self.launches, self.plans) if launch[0] is kernel]


@pytest.fixture
def recorder(monkeypatch):
    recorder = LaunchRecorder(runtime.registry.launch_kernel)
    monkeypatch.setattr(runtime.registry, "launch_kernel", recorder)
    return recorder


def test_nchw_output_written_by_the_kernel(monkeypatch, recorder):
    """NCHW on the GPU path: x goes to channels-last (layout's tiled transpose, launched from the
    plan), the kernel writes the NCHW result itself (the tensor returned is the one the kernel
    wrote: no copy back) and reads a channels-last weight in place."""
    nchw_via_channels_last(monkeypatch, True)
    x, w, b = make(2, 64, 4, 8, 8, 3, 3, seed=25)  # OH * OW = 32: whole 16-pixel runs
    w_cl = w.to(memory_format=torch.channels_last)
    out = conv2d(x, w_cl, b, padding=1)
    check(out, reference(x, w, b, padding=1), torch.float32)
    assert out.is_contiguous()
    assert [launch[0] for launch in recorder.launches] == [
        layout_module.transpose_kernel, conv_module.conv2d_implicit_gemm_kernel]
    [(kernel, args, kwargs)] = recorder.of(conv_module.conv2d_implicit_gemm_kernel)
    assert args[0].is_contiguous(memory_format=torch.channels_last)
    assert args[1].data_ptr() == w_cl.data_ptr()
    assert args[2].data_ptr() == out.data_ptr()
    assert not kwargs["X_PIXEL_MAJOR"] and kwargs["Y_PIXEL_MAJOR"]
    assert kwargs["CHANNEL_TILED"] and kwargs["EVEN_CHANNELS"]


def test_channels_last_in_place(recorder):
    """Channels-last x and weight: one launch, both read where they are."""
    x, w, b = make(1, 32, 5, 6, 8, 3, 3, seed=26)
    x_cl, w_cl = (t.to(memory_format=torch.channels_last) for t in (x, w))
    out = conv2d(x_cl, w_cl, b, padding=1)
    check(out, reference(x, w, b, padding=1), torch.float32)
    [(_, args, kwargs)] = recorder.launches
    assert args[0].data_ptr() == x_cl.data_ptr() and args[1].data_ptr() == w_cl.data_ptr()
    assert not kwargs["X_PIXEL_MAJOR"] and not kwargs["Y_PIXEL_MAJOR"]


# --------------------------------------------------------------------------------------------
# Launch plans: worked out once per shapes, strides, dtype and arguments, then reused.
# --------------------------------------------------------------------------------------------
def plan_misses() -> int:
    return conv_module._plan.cache_info().misses


def clear_plans() -> None:
    """Forget every plan, and the eager calls kept with theirs (which launch without looking
    a plan up)."""
    conv_module._plan.cache_clear()
    conv_module._READY.clear()


def test_plan_reused_across_calls(recorder):
    """The second call with the same shapes (new tensors) takes the plan kept for its call
    signature (no plan made, no check run again) and launches with the plan's own objects:
    nothing is rebuilt."""
    clear_plans()
    conv_checks.checked_geometry.cache_clear()
    for seed in (40, 41):
        x, w, b = make(1, 32, 5, 6, 8, 3, 3, seed=seed)
        check(conv2d(x, w, b, padding=1), reference(x, w, b, padding=1), torch.float32)
    assert plan_misses() == 1
    geometry = conv_checks.checked_geometry.cache_info()
    assert (geometry.misses, geometry.hits) == (1, 0)
    first, second = recorder.plans_of(conv_module.conv2d_implicit_gemm_kernel)
    assert all(a is b for a, b in zip(first, second))  # grid, scalars, consts, prepared
    assert isinstance(first[3], dict)  # the plan's prepared launches (filled on the GPU only)


# (what changes, conv2d arguments): each one launches differently, so each needs a plan of its own.
PLAN_VARIANTS = [
    ("stride", dict(stride=2)),
    ("padding", dict(padding=0)),
    ("asymmetric-same", dict(padding="same", kernel=(4, 2))),
    ("dilation", dict(dilation=2)),
    ("groups", dict(groups=2)),
    ("depthwise", dict(groups=8)),
    ("channel-tiled", dict(channels=32)),
    ("no-bias", dict(bias=False)),
    ("fp16", dict(dtype=torch.float16)),
    ("bf16", dict(dtype=torch.bfloat16)),
    ("channels-last-x", dict(channels_last=True)),
    ("strided-view-x", dict(view=True)),
    ("tf32", dict(tf32=True)),
]


@pytest.mark.parametrize("variant, change", PLAN_VARIANTS, ids=[v[0] for v in PLAN_VARIANTS])
def test_plan_per_launch_setting(variant, change, recorder):
    """Against a base layer planned first, each change of stride, padding, dilation, groups,
    channels, bias, dtype, x's layout or the TF32 switch makes a new plan, and both results
    match torch (the output in x's memory format)."""

    def run(stride=1, padding=1, dilation=1, groups=1, channels=8, kernel=(3, 3), bias=True,
            dtype=torch.float32, channels_last=False, view=False, tf32=False):
        torch.backends.cudnn.allow_tf32 = tf32
        x, w, b = make(2, channels, 9, 8, 8, *kernel, groups=groups, dtype=dtype, bias=bias,
                       seed=seed_of(variant, stride, padding, groups, str(dtype)))
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        if view:
            x = torch.cat([x, x], dim=3)[..., ::2]  # every other column: H and W still merge
        kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        out = conv2d(x, w, b, **kwargs)
        ref = reference(x, w, b, **kwargs)
        if tf32:  # TF32 products on the GPU: 10-bit mantissas (the interpreter stays exact)
            scale = max(ref.abs().max().item(), 1.0)
            torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2 * scale)
        else:
            check(out, ref, dtype)
        assert out.stride() == F.conv2d(x, w, b, **kwargs).stride()
        return recorder.plans[-1]

    clear_plans()
    base = run()
    changed = run(**change)
    assert plan_misses() == 2
    assert changed[3] is not base[3]  # another plan's prepared launches
    if variant == "tf32":
        assert base[2]["INPUT_PRECISION"] == "ieee" and changed[2]["INPUT_PRECISION"] == "tf32"
    again = run()  # the base layer's plan is still there
    assert plan_misses() == 2 and again[3] is base[3]


def test_plan_keyed_on_resolved_arguments(recorder):
    """padding="same" on a 3x3 kernel is padding 1, and stride (1, 1) is stride 1: one plan."""
    x, w, b = make(1, 8, 7, 6, 4, 3, 3, seed=42)
    conv2d(x, w, b, padding=1)
    misses = plan_misses()
    for kwargs in (dict(padding="same"), dict(padding=(1, 1), stride=(1, 1), dilation=(1, 1))):
        check(conv2d(x, w, b, **kwargs), reference(x, w, b, **kwargs), torch.float32)
    assert plan_misses() == misses
    assert len({id(plan[3]) for plan in recorder.plans_of(conv_module.conv2d_implicit_gemm_kernel)}) == 1


@pytest.mark.parametrize("k_loop", ["channel-tiled", "flat-k", "depthwise"])
def test_plan_reads_weight_in_place_when_laid_out(k_loop, recorder):
    """The weight's layout is not part of the plan: one already in the kernel's layout is read in
    place (a channels-last weight for channel tiles, one contiguous along F for flat K, any
    contiguous one for depthwise), any other is copied to it, on the same plan."""
    channels, groups = {"channel-tiled": (32, 1), "flat-k": (8, 1), "depthwise": (8, 8)}[k_loop]
    x, w, b = make(1, channels, 5, 6, 8, 3, 3, groups=groups, seed=seed_of("weight", k_loop))
    in_layout = {
        "channel-tiled": w.to(memory_format=torch.channels_last),
        "flat-k": w.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1),
        "depthwise": w,
    }[k_loop]
    other = w.transpose(2, 3).contiguous().transpose(2, 3)  # same values, H and W swapped in memory
    clear_plans()
    ref = reference(x, w, b, padding=1, groups=groups)
    for weight in (in_layout, other):
        check(conv2d(x, weight, b, padding=1, groups=groups), ref, torch.float32)
    assert plan_misses() == 1  # one plan for both
    kernel = (conv_module.conv2d_depthwise_kernel if k_loop == "depthwise"
              else conv_module.conv2d_implicit_gemm_kernel)
    (_, in_place, _), (_, copied, _) = recorder.of(kernel)
    assert in_place[1].data_ptr() == in_layout.data_ptr()
    assert copied[1].data_ptr() != other.data_ptr()
    if k_loop == "flat-k":  # the (KH, KW, Cg, F) copy
        assert copied[1].shape == (3, 3, channels, 8) and copied[1].is_contiguous()
    else:
        assert copied[1].stride() == in_layout.stride()


def test_plan_grids_close_over_ints():
    """runtime.FastLaunch keys a callable grid by its code and closure: the plan's grids close
    over plain ints only (hashable, and the same for every call of the plan)."""
    geometry = (1, 1, 1, 1, 1, 1, 1, 1)
    for w_shape, groups, names in (((8, 4, 3, 3), 2, ("BLOCK_M", "BLOCK_N")),
                                   ((8, 1, 3, 3), 8, ("BLOCK_M", "BLOCK_F"))):
        plan = conv_module._plan((2, 8, 9, 8), (576, 72, 8, 1), w_shape, torch.float16, geometry,
                                 groups, True, "ieee", runtime.INTERPRET, conv_module.TUNING,
                                 layout_module.TUNING)
        cells = [c.cell_contents for c in plan.grid.__closure__]
        assert all(type(v) is int for v in cells), cells
        hash(tuple(cells))
        assert all(type(v) is int for v in plan.grid(dict.fromkeys(names, 16)))
        assert all(type(v) in (int, bool, str) for v in (*plan.scalars, *plan.consts.values()))


@pytest.mark.parametrize(
    "make_x",
    [
        lambda x: x,
        lambda x: torch.cat([x, x], dim=3)[..., ::2],  # H and W merge: one transpose
        lambda x: torch.cat([x, x], dim=3)[..., 2:9],  # they do not: Tensor.contiguous
        lambda x: x[..., :1],  # W = 1
        lambda x: x[:, :, :1],  # H = 1
    ],
    ids=["contiguous", "stepped", "sliced", "one-column", "one-row"],
)
def test_planned_channels_last_copy_matches_layout(make_x, monkeypatch):
    """The NCHW -> channels-last copy the plan launches is layout.to_channels_last's: the same
    strides (the ones the kernel is told) and the same values; and the conv is right."""
    nchw_via_channels_last(monkeypatch, True)
    x0, w, b = make(2, 32, 6, 7, 4, 1, 1, seed=43)
    x = make_x(x0)
    plan = conv_module._find_plan(x, w, (1, 1), (0, 0, 0, 0), (1, 1), 1, True)
    assert plan.to_channels_last
    expected = layout_module.to_channels_last(x)
    copied = layout_module.copy_to_channels_last(x, plan.x_copy)
    assert copied.stride() == expected.stride() == plan.x_strides, (
        copied.stride(), expected.stride(), plan.x_strides, x.stride())
    assert torch.equal(copied, expected), (copied - expected).abs().max()
    assert (plan.x_copy is None) == (x.stride(2) != x.size(3) * x.stride(3) and x.size(2) > 1
                                        and x.size(3) > 1)
    check(conv2d(x, w, b), reference(x, w, b), torch.float32)


def test_plan_keyed_on_tuning(monkeypatch, recorder):
    """conv's and layout's tuning objects are part of the plan's key: replacing either (as a
    sweep does) makes a new plan that uses it, and the result is still right; putting the old
    objects back finds the old plan."""
    nchw_via_channels_last(monkeypatch, True)
    x, w, b = make(2, 32, 7, 9, 8, 3, 3, seed=44)  # NCHW: the transpose is planned too
    ref = reference(x, w, b, padding=1)
    conv_module._plan.cache_clear()
    base = conv_module._find_plan(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1, True)
    small_tiles = dataclasses.replace(layout_module.TUNING, block_r=16, block_c=32)
    monkeypatch.setattr(layout_module, "TUNING", small_tiles)
    retiled = conv_module._find_plan(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1, True)
    assert retiled is not base
    assert (retiled.x_copy.consts["BLOCK_R"], retiled.x_copy.consts["BLOCK_C"]) == (16, 32)
    assert base.x_copy.consts["BLOCK_R"] == 64
    check(conv2d(x, w, b, padding=1), ref, torch.float32)
    [transpose] = recorder.of(layout_module.transpose_kernel)
    assert transpose[2]["BLOCK_R"] == 16
    nchw_via_channels_last(monkeypatch, False)
    in_place = conv_module._find_plan(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1, True)
    assert not in_place.to_channels_last and in_place.x_copy is None
    assert in_place.consts["X_PIXEL_MAJOR"]
    check(conv2d(x, w, b, padding=1), ref, torch.float32)
    monkeypatch.undo()
    nchw_via_channels_last(monkeypatch, True)
    assert conv_module._find_plan(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1, True) is base


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
@pytest.mark.parametrize("channels, groups", [(8, 1), (32, 1), (8, 8)],
                         ids=["flat-k", "channel-tiled", "depthwise"])
def test_plan_with_symbolic_sizes(channels, groups, channels_last, monkeypatch):
    """Under torch.compile's dynamic shapes the sizes are symbolic and cannot key the cache: the
    plan is made uncached, and matches the plan of the concrete sizes (except the autotuning
    bucket of the pixel count, which symbolic sizes pass through unrounded)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)

    nchw_via_channels_last(monkeypatch, True)  # the transpose's plan too
    x = torch.empty(2, channels, 9, 7)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w = torch.empty(8, channels // groups, 3, 3)
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
    x_sym = mode.from_tensor(x, symbolic_context=dynamic)
    assert not isinstance(x_sym.shape[0], int)
    args = ((1, 1), (1, 1, 1, 1), (1, 1), groups, True)
    cached = conv_module._plan.cache_info().currsize
    with mode:
        symbolic = conv_module._find_plan(x_sym, mode.from_tensor(w), *args)
    assert conv_module._plan.cache_info().currsize == cached
    concrete = conv_module._find_plan(x, w, *args)
    assert [int(v) for v in symbolic.out_shape] == list(concrete.out_shape)
    assert [int(v) for v in symbolic.out_strides] == list(concrete.out_strides)
    assert [int(v) for v in symbolic.scalars[:-1]] == list(concrete.scalars[:-1])
    assert symbolic.consts == concrete.consts
    assert symbolic.to_channels_last == concrete.to_channels_last
    if concrete.x_copy is not None:
        assert [int(v) for v in symbolic.x_copy.scalars] == list(concrete.x_copy.scalars)
        assert symbolic.x_copy.consts == concrete.x_copy.consts


def test_cached_argument_checks_still_refuse():
    """The checked arguments are cached for plain ints and pairs of ints only: a bool or float
    equal to a cached int is still refused, and a bad call raises every time (never cached)."""
    x, w = _x(), _w()
    conv2d(x, w, stride=1, padding=(1, 1), dilation=1, groups=1)  # cached
    for kwargs, error in [
        (dict(stride=True), TypeError),
        (dict(stride=1.0), TypeError),
        (dict(padding=(1.0, 1)), TypeError),
        (dict(padding=(True, 1)), TypeError),
        (dict(dilation=[True, 1]), TypeError),
        (dict(groups=True), TypeError),
        (dict(padding="full"), ValueError),
        (dict(padding="full"), ValueError),
        (dict(padding=(0, -1)), ValueError),
        (dict(padding=(0, -1)), ValueError),
    ]:
        with pytest.raises(error):
            conv2d(x, w, **{"stride": 1, "padding": (1, 1), **kwargs})
    # A list is not cached (unhashable) but accepted as before.
    check(conv2d(x, w, padding=[1, 1]), reference(x, w, padding=1), torch.float32)



# Every GEMM config the GPU may pick, on layers that take each K-loop branch: whole and partial
# channel blocks, several blocks per tap, tiles taller/wider than the layer, non-square dilated
# strided kernels (the tap counters). The interpreter normally runs configs[0] only.
CONFIG_CASES = [
    ("64ch-5x3-dil-stride", (1, 64, 9, 8, 12, 5, 3),
     dict(stride=(2, 1), padding=(2, 1), dilation=(1, 2))),
    ("96ch-groups2", (1, 192, 5, 6, 16, 3, 3), dict(groups=2, padding=1)),
    ("flat-k-rgb", (2, 3, 7, 9, 5, 3, 3), dict(padding=1)),
]


@pytest.mark.parametrize(
    "config", GEMM_CONFIGS, ids=lambda c: "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}".format(**c.kwargs)
)
@pytest.mark.parametrize("via_channels_last", [True, False], ids=["via-nhwc", "in-place"])
def test_every_gemm_config(config, via_channels_last, monkeypatch):
    monkeypatch.setattr(conv_module.conv2d_implicit_gemm_kernel, "configs", [config])
    # On the GPU a launch with the same shapes would otherwise repeat the kernel compiled for the
    # first config (the plan's prepared launch, FastLaunch's cache): through Triton every time.
    monkeypatch.setattr(runtime.launch, "FAST_LAUNCH", False)
    nchw_via_channels_last(monkeypatch, via_channels_last)
    for name, shape, kwargs in CONFIG_CASES:
        x, w, b = make(*shape, groups=groups_of(kwargs), seed=seed_of(name, str(config)))
        check(conv2d(x, w, b, **kwargs), reference(x, w, b, **kwargs), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_unbatched(dtype):
    x, w, b = make(1, 6, 9, 10, 4, 3, 3, dtype=dtype, seed=14)
    out = conv2d(x[0], w, b, stride=2, padding=1)
    ref = reference(x[0], w, b, stride=2, padding=1)
    assert out.shape == (4, 5, 5)
    check(out, ref, dtype)


@pytest.mark.parametrize("groups", [1, 4], ids=["dense", "depthwise"])
def test_empty_batch(groups):
    x = torch.empty(0, 4, 9, 10, device=DEVICE)
    w = randn((8, 4 // groups, 3, 3), seed=15)
    out = conv2d(x, w, stride=2, padding=1, groups=groups)
    assert out.shape == F.conv2d(x, w, stride=2, padding=1, groups=groups).shape == (0, 8, 5, 5)


# --------------------------------------------------------------------------------------------
# Gradients.
# --------------------------------------------------------------------------------------------
GRAD_CASES = [
    ("3x3-pad1", (2, 6, 9, 10, 5, 3, 3), dict(padding=1)),
    ("5x3-pad(2,0)-dil2", (2, 4, 12, 11, 6, 5, 3), dict(padding=(2, 0), dilation=2)),
    ("pad-larger-than-reach", (1, 4, 6, 7, 3, 3, 1), dict(padding=3)),
    ("same-4x4-even", (2, 4, 8, 9, 4, 4, 4), dict(padding="same")),
    ("stride2-fallback", (2, 4, 11, 10, 6, 3, 3), dict(stride=2, padding=1)),
    ("groups2", (2, 8, 8, 8, 6, 3, 3), dict(groups=2, padding=1)),
    ("depthwise", (2, 6, 8, 8, 6, 3, 3), dict(groups=6, padding=1)),
    ("depthwise-multiplier2", (1, 3, 8, 8, 6, 3, 3), dict(groups=3, padding="same")),
]


@pytest.mark.parametrize("name, shape, kwargs", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients(name, shape, kwargs):
    x, w, b = make(*shape, groups=groups_of(kwargs), seed=seed_of(name, "grad"))
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    out = conv2d(*leaves, **kwargs)
    grad_out = randn(out.shape, seed=seed_of(name, "dy"))
    out.backward(grad_out)

    ref_leaves = [t.double().requires_grad_() for t in (x, w, b)]
    ref = F.conv2d(*ref_leaves, **kwargs)
    ref.backward(grad_out.double())
    check(out.detach(), ref.detach(), torch.float32)
    for mine, theirs, label in zip(leaves, ref_leaves, ("x", "weight", "bias")):
        assert mine.grad is not None, label
        assert mine.grad.dtype == torch.float32
        check(mine.grad, theirs.grad, torch.float32)


def test_gradients_fp16_channels_last():
    x, w, b = make(2, 32, 6, 6, 8, 3, 3, dtype=torch.float16, seed=16)
    leaves = [
        x.to(memory_format=torch.channels_last).requires_grad_(),
        w.clone().requires_grad_(),
        b.clone().requires_grad_(),
    ]
    out = conv2d(*leaves, padding=1)
    grad_out = randn(out.shape, torch.float16, seed=17)
    out.backward(grad_out)
    ref_leaves = [t.double().requires_grad_() for t in (x, w, b)]
    F.conv2d(*ref_leaves, padding=1).backward(grad_out.double())
    for mine, theirs in zip(leaves, ref_leaves):
        check(mine.grad, theirs.grad, torch.float16)


# (name, x's shape (N, C, H, W), F, (KH, KW), conv kwargs, x channels-last, bias, which of x,
# weight, bias need a gradient): repeated calls of one signature take the kept eager path.
KEPT_CASES = [
    ("3x3-pad1", (2, 8, 6, 7), 8, (3, 3), dict(padding=1), False, True, (True, True, True)),
    ("module-tuples", (1, 4, 6, 6), 6, (3, 3),
     dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1), False, True,
     (True, True, True)),
    ("channels-last", (1, 32, 5, 6), 8, (3, 3), dict(padding=1), True, True, (True, True, True)),
    ("no-bias-stride2", (2, 6, 7, 8), 4, (3, 3), dict(stride=2), False, False, (True, True, False)),
    ("weight-only", (1, 4, 6, 6), 4, (3, 3), dict(padding=1), False, True, (False, True, False)),
    ("x-only-groups2", (1, 8, 6, 6), 6, (3, 3), dict(groups=2, padding=1), False, True,
     (True, False, False)),
    ("depthwise", (2, 6, 6, 6), 6, (3, 3), dict(groups=6, padding="same"), False, True,
     (True, True, True)),
    ("same-4x2-even", (1, 4, 7, 6), 4, (4, 2), dict(padding="same"), False, True,
     (True, True, True)),
]


@pytest.mark.parametrize("name, x_shape, filters, kernel, kwargs, channels_last, bias, needs",
                         KEPT_CASES, ids=[c[0] for c in KEPT_CASES])
def test_kept_signature_repeats_right(name, x_shape, filters, kernel, kwargs, channels_last,
                                      bias, needs, monkeypatch):
    """Repeated eager calls of one call signature, each on fresh random values: every call
    after the first launches the plan kept for the signature (and records with the kept
    forward and backward), and the values and gradients still match float64 torch."""
    recorded = []
    real = conv_module._conv2d.record_planned
    monkeypatch.setattr(conv_module._conv2d, "record_planned",
                        lambda *args: recorded.append(1) or real(*args))
    groups = kwargs.get("groups", 1)
    for step in range(3):
        x, w, b = make(*x_shape, filters, *kernel, groups=groups, bias=bias,
                       seed=seed_of(name, "kept", step))
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        # No autograd.
        out = conv2d(x, w, b, **kwargs)
        check(out, reference(x, w, b, **kwargs), torch.float32)
        assert out.stride() == F.conv2d(x, w, b, **kwargs).stride()
        # Forward and backward.
        inputs = [t for t in (x, w, b) if t is not None]
        leaves = [t.detach().clone(memory_format=torch.preserve_format).requires_grad_(need)
                  for t, need in zip(inputs, needs)]
        out = conv2d(*leaves, **kwargs)
        dy = randn(out.shape, seed=seed_of(name, "kept-dy", step))
        refs = [t.double().requires_grad_(need) for t, need in zip(inputs, needs)]
        ref = F.conv2d(*refs, **kwargs)
        check(out.detach(), ref.detach(), torch.float32)
        wanted = [i for i, need in enumerate(needs[:len(inputs)]) if need]
        got = torch.autograd.grad(out, [leaves[i] for i in wanted], dy)
        want = torch.autograd.grad(ref, [refs[i] for i in wanted], dy.double())
        for i, mine, theirs in zip(wanted, got, want):
            assert mine.shape == inputs[i].shape and mine.dtype == torch.float32
            check(mine, theirs, torch.float32)
    assert len(recorded) == 3  # every call that recorded: the signature was kept before it


def test_gradient_unbatched_and_input_only():
    x, w, _ = make(1, 4, 7, 7, 4, 3, 3, bias=False, seed=18)
    x0 = x[0].clone().requires_grad_()
    conv2d(x0, w, padding=1).square().sum().backward()
    x_ref = x[0].double().requires_grad_()
    F.conv2d(x_ref, w.double(), padding=1).square().sum().backward()
    check(x0.grad, x_ref.grad, torch.float32)


# --------------------------------------------------------------------------------------------
# Errors: raised before any launch, naming the argument.
# --------------------------------------------------------------------------------------------
def _x():
    return randn((1, 4, 6, 6), seed=19)


def _w():
    return randn((4, 4, 3, 3), seed=20)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(x=[1.0]), TypeError, "x must be a torch.Tensor"),
        (dict(weight="w"), TypeError, "weight must be a torch.Tensor"),
        (dict(bias=3.0), TypeError, "bias must be a torch.Tensor"),
        (dict(x=torch.ones(4, 6)), ValueError, "x must have 3 or 4 dimensions"),
        (dict(x=torch.ones(1, 1, 4, 6, 6)), ValueError, "x must have 3 or 4 dimensions"),
        (dict(weight=torch.ones(4, 4, 3)), ValueError, "weight must have 4 dimensions"),
        (dict(x=torch.ones(1, 4, 6, 6, dtype=torch.float64)), TypeError, "x must have dtype"),
        (dict(x=torch.ones(1, 4, 6, 6, dtype=torch.int32)), TypeError, "x must have dtype"),
        (dict(weight=torch.ones(4, 4, 3, 3, dtype=torch.float16)), TypeError, "weight has dtype"),
        (dict(bias=torch.ones(4, dtype=torch.float16)), TypeError, "bias has dtype"),
        (dict(bias=torch.ones(5)), ValueError, r"bias must have shape \(4,\)"),
        (dict(bias=torch.ones(4, 1)), ValueError, "bias must have 1 dimensions"),
        (dict(weight=torch.ones(4, 3, 3, 3)), ValueError, "x has 4 channels but weight expects"),
        (dict(weight=torch.ones(3, 2, 3, 3), groups=2), ValueError, "groups=2 does not divide"),
        (dict(groups=0), ValueError, "groups must be positive"),
        (dict(groups=1.0), TypeError, "groups must be an int"),
        (dict(stride=0), ValueError, "stride must be positive"),
        (dict(stride=(1, -1)), ValueError, "stride must be positive"),
        (dict(stride=(1, 2, 3)), TypeError, "stride must be an int or a tuple"),
        (dict(stride=1.5), TypeError, "stride must be an int"),
        (dict(dilation=0), ValueError, "dilation must be positive"),
        (dict(padding=-1), ValueError, "padding must be non-negative"),
        (dict(padding=(0, -2)), ValueError, "padding must be non-negative"),
        (dict(padding="full"), ValueError, "padding must be an int, a pair or one of"),
        (dict(padding="same", stride=2), ValueError, "padding='same' requires stride 1"),
        (dict(weight=torch.ones(4, 4, 7, 3)), ValueError, "weight's dilated kernel height 7"),
        (dict(dilation=4), ValueError, "weight's dilated kernel height 9"),
        (dict(weight=torch.ones(4, 4, 3, 0)), ValueError, "weight must have a non-empty kernel"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = dict(x=_x(), weight=_w(), bias=None)
    # On the kernels' device, so that each case fails for the reason it names, not the device.
    args.update({k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
    with pytest.raises(error, match=match):
        conv2d(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device type")
def test_devices_mismatched():
    # In the interpreter the CPU is a kernel device too (mismatch); on a GPU it is not at all.
    with pytest.raises(ValueError, match="weight (is|must be) on"):
        conv2d(_x().cuda(), _w().cpu())


@pytest.mark.skipif(runtime.INTERPRET, reason="the interpreter reads CPU tensors too")
def test_cpu_tensor_rejected_on_gpu():
    with pytest.raises(ValueError, match="x must be on"):
        conv2d(_x().cpu(), _w().cpu())


# --------------------------------------------------------------------------------------------
# torch.compile, precision switch, configs.
# --------------------------------------------------------------------------------------------
def test_compile_fullgraph_matches_eager():
    x, w, b = make(2, 8, 10, 9, 8, 3, 3, groups=2, seed=21)
    x_cl = x.to(memory_format=torch.channels_last)

    def block(x, w, b):
        return torch.relu(conv2d(x, w, b, stride=(1, 2), padding=1, groups=2))

    compiled = torch.compile(block, fullgraph=True)
    for inp in (x, x_cl):
        eager = block(inp, w, b)
        out = compiled(inp, w, b)
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
        assert out.stride() == eager.stride()


def test_compile_fullgraph_backward():
    x, w, b = make(1, 4, 8, 8, 4, 3, 3, seed=22)
    compiled = torch.compile(lambda x, w, b: conv2d(x, w, b, padding="same").sum(), fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    compiled(*leaves).backward()
    eager = [t.clone().requires_grad_() for t in (x, w, b)]
    conv2d(*eager, padding="same").sum().backward()
    for mine, theirs in zip(leaves, eager):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-6, atol=1e-6)


def test_tf32_follows_cudnn_flag():
    assert not tf32_enabled()  # the fixture turned it off
    assert conv_module._input_precision(torch.float32) == "ieee"
    torch.backends.cudnn.allow_tf32 = True
    assert tf32_enabled()
    assert conv_module._input_precision(torch.float32) == "tf32"
    assert conv_module._input_precision(torch.float16) == "ieee"


def test_k_loop_mode():
    assert uses_channel_tiles(32) and uses_channel_tiles(64) and uses_channel_tiles(96)
    assert not any(uses_channel_tiles(c) for c in (1, 3, 4, 8, 16, 48))


def test_default_configs():
    """configs[0] is what the interpreter runs and must be a sound default on the GPU too."""
    first = GEMM_CONFIGS[0]
    tile = (first.kwargs["BLOCK_M"], first.kwargs["BLOCK_N"], first.kwargs["BLOCK_K"])
    assert tile == (128, 64, 64)
    assert conv_kernels.gemm_shared_memory_bytes(first, 4) <= 227 * 1024
    for config in GEMM_CONFIGS:
        assert min(config.kwargs.values()) >= 16  # tl.dot's smallest tile
    assert DEPTHWISE_CONFIGS[0].kwargs == {"BLOCK_M": 64, "BLOCK_F": 64}


def test_prune_configs_for_bench_shape():
    """The workshop's benchmark layer (fp16, 64 -> 64 channels, 3x3) keeps 64-wide filter tiles
    whose BLOCK_K divides the 64 channels; pipelines that overflow shared memory are dropped."""
    x = torch.empty(1, dtype=torch.float16)
    args = dict(x_ptr=x, GROUP_C=64, GROUP_F=64, KH=3, KW=3, M_BUCKET=131072)
    kept = prune_gemm_configs(GEMM_CONFIGS, args, CHANNEL_TILED=True)
    assert kept[0] is GEMM_CONFIGS[0]
    assert all(c.kwargs["BLOCK_N"] <= 64 and 64 % c.kwargs["BLOCK_K"] == 0 for c in kept)
    args32 = dict(args, x_ptr=torch.empty(1, dtype=torch.float32))
    oversized = conv_kernels.gemm_config(256, 64, 64, 4, 8)  # 320 KB in fp32
    kept32 = prune_gemm_configs([*GEMM_CONFIGS, oversized], args32, CHANNEL_TILED=True)
    assert all(conv_kernels.gemm_shared_memory_bytes(c, 4) <= 227 * 1024 for c in kept32)
    assert oversized not in kept32 and kept32 == kept
    tiny = prune_gemm_configs(GEMM_CONFIGS, dict(args, GROUP_C=3, GROUP_F=8, M_BUCKET=16),
                              CHANNEL_TILED=False)
    assert tiny and all(c.kwargs["BLOCK_N"] == 16 for c in tiny)


@pytest.mark.big_memory
@pytest.mark.skipif(runtime.INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
def test_offsets_past_2_31_elements(layout):
    # x and the output have 2**31 + 2**17 fp16 elements (4 GiB): the element offsets
    # (n * stride_n + ...) pass int32 in the last images. Only those are random and compared.
    n = 2**31 // (16 * 64 * 64) + 2
    x = torch.zeros(n, 16, 64, 64, device="cuda", dtype=torch.float16)
    gen = torch.Generator(device="cuda").manual_seed(31)
    x[-2:].normal_(generator=gen)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, 16, 3, 3, device="cuda", generator=gen).half() / 12
    out = conv2d(x, w, padding=1)
    ref = F.conv2d(x[-2:].float(), w.float(), padding=1)
    torch.testing.assert_close(out[-2:].float(), ref, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# Images of one row or one column. On the GPU Triton passes an integer argument equal to 1 as a
# constant, so H = 1 or W = 1 reaches the kernel as a Python int: the channel-tiled kernel's
# `H.to(...)` failed to compile there (found by the GPU run of the plan tests, 2026-11-25).
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("channels", [32, 3], ids=["channel-tiled", "flat-k"])
@pytest.mark.parametrize("hw, kernel, padding", [((1, 9), (3, 3), 1), ((9, 1), (3, 3), 1),
                                                 ((1, 9), (1, 3), (0, 1)), ((1, 1), (1, 1), 0)],
                         ids=["one-row", "one-column", "one-row-1x3", "one-pixel"])
def test_single_row_or_column_images(layout, channels, hw, kernel, padding):
    x, w, b = make(2, channels, *hw, 8, *kernel, dtype=torch.float16, seed=seed_of(layout, hw))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    check(conv2d(x, w, b, padding=padding), reference(x, w, b, padding=padding), torch.float16)


_SM90_COMPILE = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import torch
torch.cuda.is_available = lambda: True  # compile for the GPU: no kernel is launched
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_workshop.ops import conv

fn = conv.conv2d_implicit_gemm_kernel.fn
consts = dict(KH=3, KW=3, HAS_BIAS=True, CHANNEL_TILED=True, EVEN_CHANNELS=False,
              X_PIXEL_MAJOR=False, Y_PIXEL_MAJOR=False, INPUT_PRECISION="ieee", DOT_IN_FP32=False,
              BLOCK_M=128, BLOCK_N=64, BLOCK_K=32)
for ones in (("H",), ("W", "OW"), ("H", "W", "OW", "OHW")):  # as a launch specialises them
    sig, c = {}, dict(consts, **dict.fromkeys(ones, 1))
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in c else ("*fp16" if name.endswith("_ptr") else "i32")
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=c),
                   target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests launch the real thing")
def test_channel_tiled_kernel_compiles_with_unit_height_or_width(tmp_path):
    """The same on a machine without a GPU: the kernel compiled for an H100 with H, W (and OW,
    OH * OW) passed as the constant 1, as a launch on a one-row or one-column image passes them."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SM90_COMPILE], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
