"""2-D convolution (``conv2d``, as ``torch.nn.functional.conv2d``): host code.

An implicit GEMM on the tensor cores for every convolution, a direct kernel for depthwise ones
(both in :mod:`.kernels`). This module holds what runs on the host: the tuning object, the
cached launch plans, the registered op, autograd and the public function. Why the kernels are
built as they are (the im2col matrix never built, the two K loops, channels-last as the fast
layout, groups, numerics, gradients): ``docs/kernels/conv.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from ... import runtime
from ...runtime import register_op
from .. import layout
from .._common import UNKEYABLE, SignatureCache
from .checks import check_conv_args, plain_arguments
from .kernels import (
    DEPTHWISE_CONFIGS,
    GEMM_CONFIGS,
    conv2d_depthwise_kernel,
    conv2d_implicit_gemm_kernel,
    prune_depthwise_configs,
    prune_gemm_configs,
)

__all__ = [
    "DEPTHWISE_CONFIGS", "GEMM_CONFIGS", "ConvPlan", "ConvTuning", "TUNING", "conv2d",
    "conv2d_depthwise_kernel", "conv2d_implicit_gemm_kernel", "prune_depthwise_configs",
    "prune_gemm_configs", "tf32_enabled", "uses_channel_tiles",
]

#: Channels per group from which the K loop is tiled by channel (see docs/kernels/conv.md). Every
#: config's BLOCK_K (32 or 64) divides a multiple of 64, and a multiple of 32 fills a 32-wide step.
_CHANNEL_TILE_MULTIPLE = 32


@dataclass(frozen=True)
class ConvTuning:
    """What conv2d's launch plans depend on besides a call's tensors and arguments: part of every
    plan's key, so a replaced object (``dataclasses.replace(conv.TUNING, ...)``) takes effect at
    the next call. The transpose of an NCHW input is planned with ``layout.TUNING``."""

    #: Copy NCHW inputs of the implicit GEMM to channels-last first (one tiled transpose), and let
    #: the kernel write the NCHW output itself. On the GPU the NHWC gather loads 16-byte vectors
    #: and the NCHW one element by element, which costs far more than the copy. The interpreter
    #: reads NCHW in place (no copy to pay for there), which keeps the NCHW gather tested on CPU.
    nchw_via_channels_last: bool = not runtime.INTERPRET


TUNING = ConvTuning()


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
#: ``torch.backends.cudnn.conv`` (torch >= 2.9; None before), looked up once: every fp32 call
#: reads the TF32 switch (it is part of the launch plan's key), so that read must stay cheap.
_CUDNN_CONV = getattr(torch.backends.cudnn, "conv", None)


def tf32_enabled() -> bool:
    """Whether PyTorch would use TF32 for an fp32 convolution on CUDA right now.

    torch >= 2.9 keeps it as ``torch.backends.cudnn.conv.fp32_precision`` ("tf32", "ieee", or
    "none" = inherit from ``torch.backends.cudnn`` and then ``torch.backends``); setting the legacy
    ``torch.backends.cudnn.allow_tf32`` updates it. Older torch has only ``allow_tf32``.
    """
    precision = getattr(_CUDNN_CONV, "fp32_precision", None)
    if precision is None:
        return bool(torch.backends.cudnn.allow_tf32)
    for parent in (torch.backends.cudnn, torch.backends):
        if precision != "none":
            break
        precision = getattr(parent, "fp32_precision", "none")
    return precision == "tf32"


def _input_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and tf32_enabled():
        return "tf32"
    return "ieee"  # exact fp32 products; fp16/bf16 products are exact either way


def uses_channel_tiles(group_c: int) -> bool:
    """Which way the GEMM kernel walks K (see docs/kernels/conv.md)."""
    return group_c % _CHANNEL_TILE_MULTIPLE == 0


def _output_size(size, pad_before, pad_after, dilation, kernel, stride):
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def _output_shape(x, weight, stride, padding, dilation) -> tuple:
    n, _, h, w = x.shape
    f, _, kh, kw = weight.shape
    oh = _output_size(h, padding[0], padding[1], dilation[0], kh, stride[0])
    ow = _output_size(w, padding[2], padding[3], dilation[1], kw, stride[1])
    return (n, f, oh, ow)


def _is_channels_last(x: torch.Tensor) -> bool:
    # Tensors that are both (one channel, or 1x1 images) count as contiguous NCHW.
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def _pixel_major(t: torch.Tensor) -> bool:
    """Neighbouring pixels are closer in memory than neighbouring channels (NCHW-like)."""
    return t.stride(3) < t.stride(1)


def _empty_output(x: torch.Tensor, shape) -> torch.Tensor:
    """The output in the input's memory format, as torch.nn.functional.conv2d gives it."""
    if _is_channels_last(x):
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    return x.new_empty(shape)


def _conv2d_fake(x, weight, bias, stride, padding, dilation, groups):
    return _empty_output(x, _output_shape(x, weight, stride, padding, dilation))


# --------------------------------------------------------------------------------------------
# Launch plans. Everything that depends only on the shapes, strides, dtype, conv arguments and
# tuning (output shape and memory format, K loop, weight layout, the kernels' scalar and
# constexpr arguments, the transpose of an NCHW input) is worked out once per combination and
# kept with its launches ready to repeat: a call only looks its plan up, allocates the output,
# copies what must be copied and launches. (The host cost this saves: docs/kernels/conv.md.)
# The kernels are autotuned, yet planned: the grid is a function of the config the autotuner
# picks at launch, so nothing in the plan depends on that choice.
# --------------------------------------------------------------------------------------------
@dataclass(eq=False)
class ConvPlan(runtime.LaunchPlan):
    """How one combination of shapes, strides, arguments and tuning is launched: the kernel's
    launch (``kernel`` None when nothing is launched) and what the call does around it.

    ``out_shape``, ``out_strides``: the output, in the input's memory format (as torch lays it
    out). ``zero_fill``: no input channels, so the output is the bias (or zero), no launch.
    ``weight_strides``: the layout the kernel reads the weight in; a weight with other strides
    goes through ``relayout`` (a copy, or Tensor.contiguous finding it already fits).
    ``to_channels_last``: x is copied to channels-last first (the GPU's NCHW path), through
    ``layout.copy_to_channels_last(x, x_copy)`` (``x_copy`` None: through Tensor.contiguous);
    ``x_strides`` are the strides of x as the kernel reads it.
    """

    out_shape: tuple = ()
    out_strides: tuple = ()
    zero_fill: bool = False
    weight_strides: Optional[tuple] = None
    relayout: Optional[Callable] = None
    to_channels_last: bool = False
    x_strides: Optional[tuple] = None
    x_copy: Optional[runtime.LaunchPlan] = None


def _no_launch(out_shape, out_strides, *, zero_fill=False) -> ConvPlan:
    return ConvPlan(None, None, out_shape=out_shape, out_strides=out_strides, zero_fill=zero_fill)


def _meta(shape, strides=None, memory_format=torch.contiguous_format) -> torch.Tensor:
    """A storage-less tensor: its strides and contiguity are torch's own, found without copying
    torch's rules for size-0 and size-1 dims (and it takes the symbolic sizes of torch.compile)."""
    if strides is not None:
        return torch.empty_strided(shape, strides, device="meta")
    return torch.empty(shape, device="meta", memory_format=memory_format)


def _weight_channels_last(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous(memory_format=torch.channels_last)


def _weight_along_filters(weight: torch.Tensor) -> torch.Tensor:
    return weight.permute(2, 3, 1, 0).contiguous()  # (KH, KW, Cg, F): rows along F


def _weight_contiguous(weight: torch.Tensor) -> torch.Tensor:
    return weight.contiguous()


@runtime.plan_cache()
def _plan(x_shape, x_strides, w_shape, dtype, geometry, groups, has_bias, precision, interpret,
          tuning: ConvTuning, layout_tuning) -> ConvPlan:  # fmt: skip
    """The :class:`ConvPlan` of a convolution. ``geometry``: (stride, padding [top, bottom, left,
    right], dilation) flattened; ``precision``: the fp32 dot's (the TF32 switch when the plan was
    made); ``interpret``: whether kernels run in Triton's interpreter; ``tuning``: conv's,
    ``layout_tuning``: the transpose's (for an NCHW input copied to channels-last)."""
    stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, dilation_h, dilation_w = geometry
    batch, _, h, w = x_shape
    n_filters, group_c, kh, kw = w_shape
    oh = _output_size(h, pad_top, pad_bottom, dilation_h, kh, stride_h)
    ow = _output_size(w, pad_left, pad_right, dilation_w, kw, stride_w)
    out_shape = (batch, n_filters, oh, ow)
    x_meta = _meta(x_shape, x_strides)
    out_format = torch.channels_last if _is_channels_last(x_meta) else torch.contiguous_format
    out_strides = _meta(out_shape, memory_format=out_format).stride()
    if batch * n_filters * oh * ow == 0:
        return _no_launch(out_shape, out_strides)
    if group_c == 0:
        return _no_launch(out_shape, out_strides, zero_fill=True)

    ohw = oh * ow
    m = batch * ohw
    # y's pixel (oh * OW + ow) stride: the output is allocated as planned, so H and W always merge.
    stride_yn, stride_yc, _, stride_yp = out_strides
    conv_args = (stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w)
    x_pixel_major = _pixel_major(x_meta)
    # The grids close over the plan's ints only: runtime.FastLaunch keys a grid by its closure.
    if group_c == 1:

        def depthwise_grid(meta):
            return (runtime.cdiv(m, meta["BLOCK_M"]), runtime.cdiv(n_filters, meta["BLOCK_F"]))

        return ConvPlan(
            conv2d_depthwise_kernel, depthwise_grid,
            scalars=(h, w, ow, ohw, m, n_filters, n_filters // groups, *x_strides,
                     stride_yn, stride_yc, stride_yp, *conv_args, runtime.bucket(m)),
            consts=dict(
                KH=int(kh), KW=int(kw),  # constexprs: int() pins symbolic sizes
                HAS_BIAS=has_bias,
                PIXEL_MAJOR=x_pixel_major,
            ),
            out_shape=out_shape, out_strides=out_strides,
            # A one-channel weight (F, 1, KH, KW) is contiguous in either memory format: read as is.
            weight_strides=_meta(w_shape).stride(), relayout=_weight_contiguous,
        )  # fmt: skip

    copy_x, x_copy = False, None
    if tuning.nchw_via_channels_last and x_pixel_major:
        # One tiled transpose of x (a read and a write at the memory bandwidth) costs far less
        # than gathering NCHW element by element, and the kernel writes the NCHW output itself.
        copy_x = not x_meta.is_contiguous(memory_format=torch.channels_last)
        if copy_x:
            x_copy = layout.channels_last_copy_plan(x_shape, x_strides, dtype, layout_tuning)
        x_strides = x_meta.contiguous(memory_format=torch.channels_last).stride()
        x_pixel_major = False
    channel_tiled = uses_channel_tiles(group_c)
    if channel_tiled:
        # The weight in channels-last memory, (F, KH, KW, Cg): K-major rows, see the kernel. A
        # network converted with .to(memory_format=torch.channels_last) already has it (no copy);
        # otherwise a copy of a few kilobytes per call.
        weight_strides = _meta(w_shape, memory_format=torch.channels_last).stride()
        relayout = _weight_channels_last
        stride_wf, stride_wk = kh * kw * group_c, 1
    else:
        # (KH, KW, Cg, F) contiguous: the strides, in (F, Cg, KH, KW) order, of a weight already
        # laid out that way.
        weight_strides = _meta((kh, kw, group_c, n_filters)).permute(3, 2, 0, 1).stride()
        relayout = _weight_along_filters
        stride_wf, stride_wk = 1, n_filters
    group_f = n_filters // groups

    def gemm_grid(meta):
        tiles = runtime.cdiv(m, meta["BLOCK_M"]) * runtime.cdiv(group_f, meta["BLOCK_N"])
        return (tiles, groups)

    return ConvPlan(
        conv2d_implicit_gemm_kernel, gemm_grid,
        scalars=(h, w, ow, ohw, m, group_c, group_f, *x_strides, stride_wf, stride_wk,
                 stride_yn, stride_yc, stride_yp, *conv_args, runtime.bucket(m)),
        consts=dict(
            KH=int(kh), KW=int(kw),  # constexprs: int() pins symbolic sizes
            HAS_BIAS=has_bias,
            CHANNEL_TILED=channel_tiled,
            EVEN_CHANNELS=bool(group_c % 64 == 0),
            X_PIXEL_MAJOR=x_pixel_major,
            Y_PIXEL_MAJOR=stride_yp < stride_yc,
            INPUT_PRECISION=precision,
            DOT_IN_FP32=interpret and dtype == torch.bfloat16,
        ),
        out_shape=out_shape, out_strides=out_strides,
        weight_strides=weight_strides, relayout=relayout,
        to_channels_last=copy_x, x_strides=x_strides, x_copy=x_copy,
    )  # fmt: skip


def _find_plan(x, weight, stride, padding, dilation, groups, has_bias) -> ConvPlan:
    """The plan of this call: the tuning objects and the TF32 switch are read now, so a change
    of either finds (or makes) another plan."""
    return _plan(x.shape, x.stride(), weight.shape, x.dtype, (*stride, *padding, *dilation), groups,
                 has_bias, _input_precision(x.dtype), runtime.INTERPRET, TUNING, layout.TUNING)


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by conv2d below). padding is
# [top, bottom, left, right]: padding="same" with an even dilated kernel pads one more on the
# bottom/right, like torch.
# Per call: the plan, the output, the copies the plan asks for (a bias with a stride, a weight
# not in the kernel's layout, x to channels-last) and the launch; everything else is planned.
# --------------------------------------------------------------------------------------------
@register_op("conv2d", fake=_conv2d_fake, autocast="lower_precision_fp")  # as F.conv2d
def _conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> torch.Tensor:
    plan = _find_plan(x, weight, stride, padding, dilation, groups, bias is not None)
    out = torch.empty_strided(plan.out_shape, plan.out_strides, dtype=x.dtype, device=x.device)
    if plan.kernel is None:
        if plan.zero_fill:
            # No input channels: every window sums nothing, so the output is the bias (or zero).
            out.zero_()
            if bias is not None:
                out += bias.view(1, -1, 1, 1)
        return out
    if bias is None:
        bias = out  # never read when HAS_BIAS is False
    elif bias.stride(0) != 1:
        bias = bias.contiguous()
    if weight.stride() != plan.weight_strides:
        weight = plan.relayout(weight)
    with runtime.device_guard(x):
        if plan.to_channels_last:
            x = layout.copy_to_channels_last(x, plan.x_copy)
        plan.launch(x, weight, out, bias)
    return out


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _conv2d_setup_context(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups = inputs
    ctx.stride, ctx.padding, ctx.dilation, ctx.groups = stride, padding, dilation, groups
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _conv2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad
    return (*_gradients(grad, x, weight, ctx.stride, ctx.padding, ctx.dilation, ctx.groups,
                        needs[0], needs[1], ctx.has_bias and needs[2]), None, None, None, None)


def _gradients(grad, x, weight, stride, padding, dilation, groups, need_x, need_w, need_b):
    """``(grad_x, grad_weight, grad_bias)``, None where not needed."""
    if grad.numel() == 0 or x.numel() == 0 or weight.numel() == 0:
        # Some dimension is 0 (no filters, no images, no pixels, no channels): every sum behind
        # a gradient is empty, so the gradients are zeros. cuDNN/ATen's grad helpers refuse
        # several of these shapes (zero filters), so answer before reaching them.
        grad_x = torch.zeros_like(x) if need_x else None
        grad_w = torch.zeros_like(weight) if need_w else None
        # The bias still reached every output.
        grad_bias = grad.sum(dim=(0, 2, 3), dtype=torch.float32).to(grad.dtype) if need_b else None
        return grad_x, grad_w, grad_bias
    # All three gradients in one call of ATen's convolution backward (cuDNN on the GPU), as
    # torch's own Conv2d takes them: one call costs the host what torch's costs, where gathering
    # grad_x with the Triton kernel (a flipped, re-laid-out weight, a plan, a launch) cost
    # several times as much on every convolution of a step, for no faster kernel.
    top, bottom, left, right = padding
    if top == bottom and left == right:
        x_in, pad_hw = x, [top, left]
    else:  # "same" with an even kernel: ATen takes one padding per axis, so pad x explicitly
        x_in, pad_hw = torch.nn.functional.pad(x, (left, right, top, bottom)), [0, 0]
    grad_x, grad_w, grad_bias = _CONVOLUTION_BACKWARD(
        grad, x_in, weight, [weight.shape[0]] if need_b else None, list(stride), pad_hw,
        list(dilation), False, [0, 0], groups, [need_x, need_w, need_b])
    if need_x and x_in is not x:
        grad_x = grad_x[:, :, top:top + x.shape[2], left:left + x.shape[3]]
    return grad_x, grad_w, grad_bias


_CONVOLUTION_BACKWARD = torch.ops.aten.convolution_backward.default


def _conv2d_forward_planned(ctx, x, weight, bias, ready):
    """The eager autograd forward of a kept signature (:func:`conv2d`'s ``RECORD`` path): the
    kept launch, as :func:`conv2d` makes it, then what :func:`_conv2d_backward_kept` reads (the
    convolution backward's arguments for these inputs needing a gradient, made once)."""
    plan, out_shape, out_strides, relayout, copy_bias, copy_x, backwards = ready[:7]
    out = x.new_empty_strided(out_shape, out_strides)
    w = weight if relayout is None else relayout(weight)
    b = out if bias is None else bias.contiguous() if copy_bias else bias  # out: never read
    guard = runtime.device_guard(x)
    if guard is _SAME_DEVICE:  # entering the no-op context costs two calls
        plan.launch_eager(x if copy_x is None else _channels_last(x, copy_x), w, out, b)
    else:
        with guard:
            plan.launch_eager(x if copy_x is None else _channels_last(x, copy_x), w, out, b)
    ctx.save_for_backward(x, weight)
    needs = ctx.needs_input_grad
    kept = backwards.get(needs)
    if kept is None:
        stride, padding, dilation, groups = ready[7]
        top, bottom, left, right = padding
        kept = backwards[needs] = (
            [*stride], [top, left] if top == bottom and left == right else None, [*dilation],
            groups, [out_shape[1]] if needs[2] else None, [needs[0], needs[1], needs[2]],
            padding)
    ctx.kept = kept
    return out


def _conv2d_backward_kept(ctx, grad):
    """The backward of :func:`_conv2d_forward_planned`'s Function (inputs x, weight, bias, the
    kept plans): ATen's convolution backward with the arguments kept (a non-empty convolution
    by then), or :func:`_gradients` for a padding ATen cannot take."""
    x, weight = ctx.saved_tensors
    stride, pad_hw, dilation, groups, bias_sizes, mask, padding = ctx.kept
    if pad_hw is None:
        return (*_gradients(grad, x, weight, stride, padding, dilation, groups, *mask), None)
    return (*_CONVOLUTION_BACKWARD(grad, x, weight, bias_sizes, stride, pad_hw, dilation, False,
                                   _NO_OUTPUT_PADDING, groups, mask), None)


_NO_OUTPUT_PADDING = [0, 0]


def _channels_last(x, copy_x) -> torch.Tensor:
    """A channels-last copy of x (:attr:`ConvPlan.to_channels_last`): ``copy_x`` is ``(the
    plan's transpose (None: Tensor.contiguous), x's shape, the copy's strides)``."""
    transpose, shape, strides = copy_x
    if transpose is None:
        return x.contiguous(memory_format=torch.channels_last)
    y = x.new_empty_strided(shape, strides)
    transpose.launch_eager(x, y)
    return y


#: What :func:`runtime.device_guard` gives for a tensor on the current device (a CPU tensor is
#: one): the context that switches nothing.
_SAME_DEVICE = runtime.device_guard(torch.empty(0))

_conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup_context)
_conv2d.register_planned_forward(_conv2d_forward_planned, _conv2d_backward_kept)


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------
@runtime.follows_autocast(_conv2d)
def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> torch.Tensor:
    """``torch.nn.functional.conv2d`` as an implicit GEMM in Triton (same signature, same result).

    ``x`` is (N, C, H, W) or unbatched (C, H, W); ``weight`` (F, C / groups, KH, KW); ``bias`` (F,)
    or None. ``stride``, ``dilation``: int or pair, positive. ``padding``: int or pair (>= 0),
    ``"valid"`` (none) or ``"same"`` (stride 1 only; an odd total pads the extra row/column on the
    bottom/right, like torch). fp16, bf16 or fp32, all the same dtype; the result has that dtype,
    accumulated in fp32 (fp32 follows ``torch.backends.cudnn.allow_tf32``). Any strides are read in
    place; the output is channels-last when ``x`` is, which is also the fast layout (see
    docs/kernels/conv.md). Differentiable in ``x``, ``weight`` and ``bias``: the gradients come
    from PyTorch's own convolution backward (cuDNN on the GPU), as torch's Conv2d takes them.
    """
    path = _conv2d.eager_path(x, weight, bias)
    key = ready = None
    if path and plain_arguments(stride, padding, dilation, groups):
        try:  # an eager call of a signature seen before: straight to the launch
            key = (x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(),
                   weight.dtype, weight.device,
                   None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
                   stride, padding, dilation, groups, x.dtype is _FP32 and tf32_enabled())
            tunings = _READY.tuning  # kept under other tuning objects: nothing is found
            if tunings is not None and tunings[0] is TUNING and tunings[1] is layout.TUNING:
                ready = _READY.get(key)
        except UNKEYABLE:
            key = None
        if ready:
            if path == runtime.RECORD:
                return _conv2d.record_planned(x, weight, bias, ready)
            plan, out_shape, out_strides, relayout, copy_bias, copy_x = ready[:6]
            out = x.new_empty_strided(out_shape, out_strides)
            if relayout is not None:
                weight = relayout(weight)
            b = out if bias is None else bias.contiguous() if copy_bias else bias  # out: unread
            guard = runtime.device_guard(x)
            if guard is _SAME_DEVICE:
                plan.launch_eager(x if copy_x is None else _channels_last(x, copy_x), weight,
                                  out, b)
            else:
                with guard:
                    plan.launch_eager(x if copy_x is None else _channels_last(x, copy_x), weight,
                                      out, b)
            return out
    checked = check_conv_args(x, weight, bias, stride, padding, dilation, groups)
    if x.dim() == 3:
        return _conv2d(x.unsqueeze(0), weight, bias, *checked, groups).squeeze(0)
    out = _conv2d(x, weight, bias, *checked, groups)
    if key is not None and ready is None:  # not False: a call that launches otherwise
        tunings = _READY.tuning
        if tunings is None or tunings[0] is not TUNING or tunings[1] is not layout.TUNING:
            _READY.clear()
            _READY.tuning = (TUNING, layout.TUNING)
        _READY.remember(key, _ready(x, weight, bias, *checked, groups))
    return out


def _ready(x, weight, bias, stride, padding, dilation, groups):
    """What :func:`conv2d` keeps for a repeated eager call of these layouts and arguments:
    ``(the plan, out's shape and strides (tuples of ints: cheaper to pass than a torch.Size),
    the weight's relayout (None: read in place), whether the bias is copied, x's channels-last
    copy (:func:`_channels_last`; None: read in place), {needs_input_grad: the backward's
    arguments}, (stride, padding, dilation, groups) checked)``; False for a call that launches
    nothing (an empty output or input)."""
    plan = _find_plan(x, weight, stride, padding, dilation, groups, bias is not None)
    if plan.kernel is None or not x.numel():
        return False
    copy_x = None
    if plan.to_channels_last:
        copy_x = (plan.x_copy, tuple(x.shape),
                  _meta(x.shape).contiguous(memory_format=torch.channels_last).stride())
    return (plan, tuple(plan.out_shape), tuple(plan.out_strides),
            None if weight.stride() == plan.weight_strides else plan.relayout,
            bias is not None and bias.stride(0) != 1, copy_x, {},
            (stride, padding, dilation, groups))


_FP32 = torch.float32
#: Eager calls' layouts (shapes, strides, dtypes, devices), plain conv arguments and TF32 switch
#: (fp32) -> :func:`_ready`, under the tuning objects of conv and layout in ``_READY.tuning``.
_READY = SignatureCache()
