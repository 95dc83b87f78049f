"""Image benchmarks: colour transforms and 2-D filters on fp32 RGB images, memory-bound.

``greyscale`` and ``sepia`` mix the three channels of each pixel: one read of the image, one write
of the result. Eager PyTorch writes them as the weighted sums below, one kernel per multiply and
add, each a full pass over a plane; ``torch.compile`` fuses them into one.

``filter2d`` filters every channel with one ``K x K`` kernel; its vendor peer is cuDNN's depthwise
convolution, ``F.conv2d(..., groups=C)``, with ``cudnn.benchmark`` on (cuDNN picks its fastest
algorithm at each shape) and TF32 off (true fp32, like ours). Each input pixel is needed by
``K * K`` outputs, but the neighbours' reads hit in cache, so the minimum DRAM traffic, and the
bytes counted, stay one read of the image and one write of the output.

A 3 x 8192 x 8192 fp32 image is 768 MiB.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..ops.image import filter2d, greyscale, sepia
from .spec import GBPS, Spec, Workload

COLOUR_SIZES = tuple((3, n, n) for n in (1024, 2048, 4096, 8192))
FILTER_SIZES = tuple((3, n, n) for n in (2048, 4096, 8192))
QUICK = ((3, 4096, 4096),)
HEADLINE = ((3, 8192, 8192),)


def _image(size, dtype, device) -> torch.Tensor:
    return torch.rand(size, dtype=dtype, device=device)  # pixel values in [0, 1)


def greyscale_eager(img):
    # ITU-R BT.601 luma, the weights of ops.image.greyscale.
    return 0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2]


def sepia_eager(img):
    r, g, b = img[0], img[1], img[2]
    return torch.stack(
        [
            0.393 * r + 0.769 * g + 0.189 * b,
            0.349 * r + 0.686 * g + 0.168 * b,
            0.272 * r + 0.534 * g + 0.131 * b,
        ]
    ).clamp_max(1.0)  # sepia saturates at white, as ops.image.sepia does


def filter2d_cudnn(img, kernel):
    channels, size = img.shape[0], kernel.shape[-1]
    weight = kernel.expand(channels, 1, size, size)
    return F.conv2d(img[None], weight, padding=size // 2, groups=channels)[0]


@contextlib.contextmanager
def cudnn_fp32_autotuned():
    """cuDNN at its best for fp32: algorithm search on, TF32 off (ours computes in true fp32)."""
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = True, False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved


def greyscale_bytes(size, dtype) -> int:
    """3 planes read, 1 plane written."""
    _, height, width = size
    return 4 * height * width * dtype.itemsize


def sepia_bytes(size, dtype) -> int:
    """3 planes read, 3 planes written."""
    _, height, width = size
    return 6 * height * width * dtype.itemsize


def filter_bytes(k: int):
    def count(size, dtype) -> int:
        """The image read once, the output written once, the K x K kernel read once."""
        channels, height, width = size
        return (2 * channels * height * width + k * k) * dtype.itemsize

    return count


def _filter_inputs(k: int):
    def make(size, dtype, device):
        return _image(size, dtype, device), torch.randn(k, k, dtype=dtype, device=device) / k

    return make


def _filter_workload(k: int) -> Workload:
    return Workload(
        name=f"filter2d {k}x{k}",
        dtype=torch.float32,
        unit=GBPS,
        sizes=FILTER_SIZES,
        quick=QUICK,
        headlines=HEADLINE,
        make_inputs=_filter_inputs(k),
        work=filter_bytes(k),
        work_formula=f"bytes = (2·C·H·W + {k}·{k})·itemsize (image read once, output written once)",
        ours=lambda img, kernel: filter2d(img, kernel, padding="same"),
        reference=filter2d_cudnn,
        reference_name="cuDNN (F.conv2d)",
        context=cudnn_fp32_autotuned,
    )


SPEC = Spec(
    name="image",
    title="Image: greyscale, sepia, filter2d (fp32, 3×H×W)",
    workloads=[
        Workload(
            name="greyscale",
            dtype=torch.float32,
            unit=GBPS,
            sizes=COLOUR_SIZES,
            quick=QUICK,
            headlines=HEADLINE,
            make_inputs=lambda size, dtype, device: (_image(size, dtype, device),),
            work=greyscale_bytes,
            work_formula="bytes = 4·H·W·itemsize (3 planes read, 1 written)",
            ours=greyscale,
            reference=greyscale_eager,
        ),
        Workload(
            name="sepia",
            dtype=torch.float32,
            unit=GBPS,
            sizes=COLOUR_SIZES,
            quick=QUICK,
            headlines=HEADLINE,
            make_inputs=lambda size, dtype, device: (_image(size, dtype, device),),
            work=sepia_bytes,
            work_formula="bytes = 6·H·W·itemsize (3 planes read, 3 written)",
            ours=sepia,
            reference=sepia_eager,
        ),
        _filter_workload(3),
        _filter_workload(5),
    ],
)
