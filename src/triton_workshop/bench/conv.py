"""Convolution benchmarks: a 3×3 convolution (fp16) as an implicit GEMM, compute-bound, in TFLOP/s.

Sizes are ``N×C×H×W`` of the input ``x``; the layer has ``F = C`` filters of 3×3, stride 1,
padding 1 (so ``OH = H``, ``OW = W``), no bias: a ResNet stage's inner convolution. The headline
is ResNet-50's first stage, 32×64×56×56; the sweep varies the batch (8, 32, 64 at 64×56×56) and
the channels (128, 256 at 32×·×28×28, deeper stages). Each size is measured with ``x`` (and the
weight, as ``model.to(memory_format=torch.channels_last)`` leaves it) in NCHW and in channels-last.

**FLOPs** = ``2·N·F·OH·OW·C·KH·KW`` (groups = 1): one multiply and one add per term of the
implicit GEMM ``M = N·OH·OW``, ``N_gemm = F``, ``K = C·KH·KW``. Padding taps are counted (they
are part of the GEMM every implementation runs).

**Peers, in the same run**, both with ``torch.backends.cudnn.benchmark = True`` (cuDNN picks its
fastest algorithm at each shape and layout):

* ``cuDNN NCHW``: ``F.conv2d`` on contiguous NCHW ``x`` and weight;
* ``cuDNN channels_last``: ``F.conv2d`` on channels-last ``x`` and weight.

Each workload's own layout is its correctness reference (fp16 tolerances); the other layout is
measured beside it from a copy of the inputs converted once, before timing (the conversion is not
timed: a network keeps its activations in one layout), so every row compares ours in one layout
with cuDNN in both. No ``torch.compile`` peer: Inductor hands a lone convolution to cuDNN.

**Ceiling**: cuBLAS on the explicit GEMM of the same shape, ``(N·OH·OW × C·KH·KW) @ (C·KH·KW ×
F)`` in fp16, measured in the same run: what "im2col + cuBLAS" costs without the im2col copy.
It is a reference point rather than a hard roof: its left operand is ``KH·KW`` = 9 times the
size of ``x``, and with F = 64 columns that GEMM is bound by reading it, while an implicit GEMM
reads ``x`` itself (the nine taps hit in cache); so ours may exceed 100% of it.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from ..ops.conv import conv2d
from .spec import TFLOPS, Spec, Workload

KERNEL = 3
PADDING = 1
HEADLINE = (32, 64, 56, 56)
SIZES = ((8, 64, 56, 56), HEADLINE, (64, 64, 56, 56), (32, 128, 28, 28), (32, 256, 28, 28))

CUDNN_NCHW = "cuDNN NCHW"
CUDNN_CHANNELS_LAST = "cuDNN channels_last"
CEILING_NAME = "cuBLAS im2col GEMM"

LAYOUTS = {"NCHW": torch.contiguous_format, "channels_last": torch.channels_last}


def output_hw(height: int, width: int) -> tuple[int, int]:
    return (height + 2 * PADDING - KERNEL + 1, width + 2 * PADDING - KERNEL + 1)


def conv_flops(size, dtype) -> int:
    """2·N·F·OH·OW·C·KH·KW with F = C."""
    batch, channels, height, width = size
    oh, ow = output_hw(height, width)
    return 2 * batch * channels * oh * ow * channels * KERNEL * KERNEL


def _inputs(memory_format):
    def make(size, dtype, device):
        batch, channels, height, width = size
        x = torch.randn(size, dtype=dtype, device=device)
        # nn.Conv2d's scale (1/sqrt(fan-in)): outputs O(1), as in a network.
        weight = torch.randn(channels, channels, KERNEL, KERNEL, dtype=dtype, device=device)
        weight /= math.sqrt(channels * KERNEL * KERNEL)
        return (x.contiguous(memory_format=memory_format),
                weight.contiguous(memory_format=memory_format))

    return make


def conv_cudnn(x, weight):
    return F.conv2d(x, weight, padding=PADDING)


#: tensor → {memory format: copy}: conversions live exactly as long as the case's inputs.
_CONVERTED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def in_layout(t: torch.Tensor, memory_format) -> torch.Tensor:
    """``t`` in ``memory_format``, converted on the first call and reused by the timed ones."""
    copies = _CONVERTED.setdefault(t, {})
    if memory_format not in copies:
        copies[memory_format] = t.contiguous(memory_format=memory_format)
    return copies[memory_format]


def cudnn_in(memory_format):
    """cuDNN on inputs held in ``memory_format`` (converted once, untimed)."""

    def fn(x, weight):
        return conv_cudnn(in_layout(x, memory_format), in_layout(weight, memory_format))

    return fn


@contextlib.contextmanager
def cudnn_autotuned():
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


# --------------------------------------------------------------------------------------------
# The ceiling: cuBLAS on the explicit GEMM.
# --------------------------------------------------------------------------------------------
#: x → (a, b): the GEMM's operands live exactly as long as the case's inputs.
_OPERANDS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def gemm_shape(x_shape, weight_shape) -> tuple[int, int, int]:
    """(M, N_gemm, K) = (N·OH·OW, F, C·KH·KW)."""
    batch, _, height, width = x_shape
    filters, channels, kh, kw = weight_shape
    oh, ow = output_hw(height, width)
    return batch * oh * ow, filters, channels * kh * kw


def im2col_gemm(x, weight):
    """``(M × K) @ (K × F)`` with random operands of the convolution's GEMM shape; returns it as
    the (N, F, OH, OW) output it would be (channels-last in memory)."""
    operands = _OPERANDS.get(x)
    if operands is None:
        m, n, k = gemm_shape(x.shape, weight.shape)
        operands = (
            torch.randn(m, k, dtype=x.dtype, device=x.device),
            torch.randn(k, n, dtype=x.dtype, device=x.device) / math.sqrt(k),
        )
        _OPERANDS[x] = operands
    batch, _, height, width = x.shape
    oh, ow = output_hw(height, width)
    out = operands[0] @ operands[1]
    return out.view(batch, oh, ow, weight.shape[0]).permute(0, 3, 1, 2)


# --------------------------------------------------------------------------------------------
# The workloads.
# --------------------------------------------------------------------------------------------
def _workload(layout: str) -> Workload:
    memory_format = LAYOUTS[layout]
    own, other = (
        (CUDNN_NCHW, CUDNN_CHANNELS_LAST) if layout == "NCHW" else (CUDNN_CHANNELS_LAST, CUDNN_NCHW)
    )
    other_format = torch.channels_last if layout == "NCHW" else torch.contiguous_format
    return Workload(
        name=f"conv2d 3x3 {layout}",
        dtype=torch.float16,
        unit=TFLOPS,
        sizes=SIZES,
        quick=(HEADLINE,),
        headlines=(HEADLINE,),
        make_inputs=_inputs(memory_format),
        work=conv_flops,
        work_formula="FLOPs = 2·N·F·OH·OW·C·KH·KW (F = C filters of 3×3, stride 1, pad 1, no bias)",
        ours=lambda x, weight: conv2d(x, weight, padding=PADDING),
        reference=conv_cudnn,
        reference_name=own,
        peers={other: cudnn_in(other_format)},
        compile_peer=False,
        ceiling=im2col_gemm,
        ceiling_name=CEILING_NAME,
        context=cudnn_autotuned,
    )


SPEC = Spec(
    name="conv",
    title="Convolution 3×3 N×C×H×W → C filters, fp16 (TFLOP/s, ceiling = cuBLAS im2col GEMM)",
    workloads=[_workload("NCHW"), _workload("channels_last")],
)
