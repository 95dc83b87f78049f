"""Image ops (host code): ``greyscale``, ``sepia`` and ``filter2d``, and the named filters.

An image batch is ``(N, C, H, W)`` (or one ``(C, H, W)`` image): colour transforms mix the three
channels of each pixel; ``filter2d`` applies one ``K x K`` filter to every channel. The kernels
are in :mod:`.kernels`; how they cut a batch into programs, and why: ``docs/kernels/image.md``.
Float images are computed in fp32 and rounded once; uint8 images exactly (see the kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES, register_op
from ..image_filters import FILTERS, get_filter
from .kernels import filter2d_kernel, greyscale_kernel, sepia_kernel

__all__ = [
    "FILTERS", "FilterTiling", "ImageTuning", "TUNING", "filter2d", "filter2d_kernel",
    "filter2d_tiling", "get_filter", "greyscale", "greyscale_kernel", "sepia", "sepia_kernel",
]

COLOR_DTYPES = (*FLOAT_DTYPES, torch.uint8)
PADDINGS = ("same", "valid")


@dataclass(frozen=True)
class ImageTuning:
    """The image ops' launch settings: part of every plan's key, so a replaced object
    (``dataclasses.replace(image.TUNING, ...)``: tests, sweeps) takes effect at the next call.
    The measurements behind the defaults are in docs/kernels/image.md."""

    #: Colour ops: pixels a program and its warps (8 pixels a thread). They are DRAM-bound, so the
    #: block hardly matters for contiguous images; strided ones (channels-last) prefer small
    #: blocks, where more programs keep more of the strided loads in flight.
    color_block_size: int = 1024
    color_num_warps: int = 4
    #: filter2d: warps a program, and 16-byte vectors of output columns a thread (a strip is 256
    #: fp32 or 512 fp16 columns wide at the defaults). Each thread loads its own horizontal halo,
    #: so narrow strips cost nothing, and more programs fill the GPU better.
    filter_num_warps: int = 2
    filter_vectors_per_thread: int = 1
    #: (K, value) pairs that override the two above per filter size: 3 x 3 takes 8 warps; 5 x 5
    #: 4 vectors a thread and 7 x 7 2 (more work per row load hides the shifts; 4 at 7 x 7 would
    #: crowd the registers). Pairs, not a dict: the tuning is part of a hashed plan key.
    filter_num_warps_by_k: tuple[tuple[int, int], ...] = ((3, 8),)
    filter_vectors_per_thread_by_k: tuple[tuple[int, int], ...] = ((5, 4), (7, 2))
    #: Chunks of rows: as tall as gives this many programs an SM, between max(filter_min_rows,
    #: 2 (K - 1)) and filter_max_rows rows: each chunk re-reads and re-multiplies K - 1 rows of
    #: vertical halo, so chunks are tall, yet enough of them to fill the GPU several times over.
    filter_programs_per_sm: int = 32
    filter_min_rows: int = 16
    filter_max_rows: int = 64
    #: Taps stay in registers up to this many (7 x 7); beyond, the K * K taps would crowd out the
    #: K * V accumulators, so they are reloaded from L1 for each row, and a thread owns
    #: filter_large_k_columns columns to share each reload (8: 2 vectors fp32, 1 vector fp16).
    filter_preload_max_taps: int = 49
    filter_large_k_columns: int = 8


TUNING = ImageTuning()


# --------------------------------------------------------------------------------------------
# Launch plans and registered ops. Each op takes (C, H, W) or (N, C, H, W) and reads the input
# through its strides; outputs are new contiguous tensors. A plan is worked out once per shape,
# strides, dtypes and tuning, and keeps its launches ready to repeat.
# --------------------------------------------------------------------------------------------
def _batched(img: torch.Tensor) -> torch.Tensor:
    """An (N, C, H, W) view (no copy) of a (C, H, W) or (N, C, H, W) image."""
    return img if img.dim() == 4 else img.unsqueeze(0)


def _plane_is_contiguous(shape, strides) -> bool:
    """Whether pixel (h, w) of each plane of an (N, C, H, W) array sits at h * W + w: then the
    flat index is the offset. Strides of size-1 dimensions never matter (their index is 0)."""
    _, _, height, width = shape
    _, _, stride_h, stride_w = strides
    return (width == 1 or stride_w == 1) and (height == 1 or stride_h == width)


_COLOR_KERNELS = {"greyscale": greyscale_kernel, "sepia": sepia_kernel}


@runtime.plan_cache()
def _color_plan(op: str, shape, strides, dtype: torch.dtype,
                tuning: ImageTuning) -> runtime.LaunchPlan:
    """The launch of colour op ``op`` on an (N, 3, H, W) image of ``shape`` and ``strides``:
    ``plan.launch(img4, out)``. One program per block of pixels of one image, on grid axis 0
    (the only axis allowed more than 65,535 programs)."""
    batch, _, height, width = shape
    n_pixels = height * width
    blocks_per_plane = runtime.cdiv(n_pixels, tuning.color_block_size)
    return runtime.LaunchPlan(
        _COLOR_KERNELS[op], (batch * blocks_per_plane,),
        scalars=(n_pixels, width, blocks_per_plane, *strides),
        consts=dict(
            PLANE_CONTIGUOUS=_plane_is_contiguous(shape, strides),
            IS_UINT8=dtype == torch.uint8,
            BLOCK_SIZE=tuning.color_block_size,
            num_warps=tuning.color_num_warps,
        ),
    )


def _launch_color(op: str, img: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The shared launch of the colour kernels: empty → plan → launch."""
    if out.numel() == 0:
        return out
    img4 = _batched(img)
    plan = _color_plan(op, img4.shape, img4.stride(), img.dtype, TUNING)
    with runtime.device_guard(img):
        plan.launch(img4, out)
    return out


def _greyscale_shape(img: torch.Tensor) -> tuple[int, ...]:
    return (*img.shape[:-3], *img.shape[-2:])


def _greyscale_fake(img: torch.Tensor) -> torch.Tensor:
    return img.new_empty(_greyscale_shape(img))


def _sepia_fake(img: torch.Tensor) -> torch.Tensor:
    return img.new_empty(img.shape)


@register_op("greyscale", fake=_greyscale_fake)
def _greyscale(img: torch.Tensor) -> torch.Tensor:
    out = torch.empty(_greyscale_shape(img), dtype=img.dtype, device=img.device)
    return _launch_color("greyscale", img, out)


@register_op("sepia", fake=_sepia_fake)
def _sepia(img: torch.Tensor) -> torch.Tensor:
    out = torch.empty(img.shape, dtype=img.dtype, device=img.device)
    return _launch_color("sepia", img, out)


def _filter2d_geometry(img: torch.Tensor, kernel: torch.Tensor, padding: str):
    """(pad, out_height, out_width). An empty image gives an empty output, never a negative size."""
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    size = kernel.shape[-1]
    height, width = img.shape[-2:]
    if padding == "same":
        return size // 2, height, width
    return 0, max(height - size + 1, 0), max(width - size + 1, 0)


def _filter2d_fake(img: torch.Tensor, kernel: torch.Tensor, padding: str) -> torch.Tensor:
    _, out_height, out_width = _filter2d_geometry(img, kernel, padding)
    return img.new_empty((*img.shape[:-2], out_height, out_width))


@dataclass(frozen=True)
class FilterTiling:
    """How filter2d cuts its work: a 1-D grid of ``programs`` = planes x n_chunks x n_strips."""

    vec: int  # columns in 16 bytes: one vector load
    blocks: int  # vectors of output columns a thread owns
    num_warps: int
    groups: int  # threads of a program
    n_strips: int
    n_chunks: int
    rows_per_program: int
    preload_taps: bool
    programs: int


def filter2d_tiling(element_size: int, size: int, planes: int, out_height: int, out_width: int,
                    sms: int, tuning: ImageTuning) -> FilterTiling:  # fmt: skip
    """The :class:`FilterTiling` of a ``size x size`` filter over ``planes`` planes of
    ``element_size``-byte pixels, on a device with ``sms`` SMs."""
    vec = 16 // element_size
    preload = size * size <= tuning.filter_preload_max_taps
    num_warps = dict(tuning.filter_num_warps_by_k).get(size, tuning.filter_num_warps)
    if not preload:
        # Reloaded taps are shared by a thread's columns: more columns, fewer reloads an output.
        blocks = max(1, tuning.filter_large_k_columns // vec)
    else:
        blocks = dict(tuning.filter_vectors_per_thread_by_k).get(
            size, tuning.filter_vectors_per_thread)
    groups = 32 * num_warps
    n_strips = runtime.cdiv(out_width, groups * vec * blocks)
    # Enough programs to fill the GPU several times over, each as tall as that allows: the
    # K - 1 rows above and below a chunk are read and multiplied again by its neighbours.
    fewest = max(tuning.filter_min_rows, 2 * (size - 1))
    rows = runtime.cdiv(planes * n_strips * out_height, sms * tuning.filter_programs_per_sm)
    rows = min(max(rows, fewest), max(tuning.filter_max_rows, fewest), out_height)
    n_chunks = runtime.cdiv(out_height, rows)
    return FilterTiling(
        vec=vec, blocks=blocks, num_warps=num_warps, groups=groups, n_strips=n_strips,
        n_chunks=n_chunks, rows_per_program=rows, preload_taps=preload,
        programs=planes * n_chunks * n_strips,
    )  # fmt: skip


@runtime.plan_cache()
def _filter2d_plan(shape, strides, size, weight_strides, dtype, weight_dtype, pad, out_height,
                   out_width, device, tuning: ImageTuning) -> runtime.LaunchPlan:  # fmt: skip
    """The launch of :func:`filter2d_kernel` on an (N, C, H, W) image of ``shape`` and
    ``strides`` with a ``size x size`` weight of ``weight_strides``: ``plan.launch(img4, weight,
    out)``. The dtypes are part of the key though only the image's pixel size shapes the launch:
    the plan's prepared launches are compiled for them."""
    batch, channels, height, width = shape
    tiling = filter2d_tiling(dtype.itemsize, size, batch * channels, out_height, out_width,
                             runtime.num_sms(device), tuning)
    return runtime.LaunchPlan(
        filter2d_kernel, (tiling.programs,),
        scalars=(channels, height, width, out_height, out_width, *strides, *weight_strides,
                 tiling.n_strips, tiling.n_chunks, tiling.rows_per_program),
        consts=dict(
            K=size, PAD=pad, GROUPS=tiling.groups, VEC=tiling.vec, BLOCKS=tiling.blocks,
            LEFT_BLOCKS=runtime.cdiv(pad, tiling.vec),
            RIGHT_BLOCKS=runtime.cdiv(size - 1 - pad, tiling.vec),
            # Prefetching a row needs its registers; large K has arithmetic enough to hide loads.
            PRELOAD_TAPS=tiling.preload_taps, PREFETCH=tiling.preload_taps,
            num_warps=tiling.num_warps,
        ),
    )  # fmt: skip


@register_op("filter2d", fake=_filter2d_fake)
def _filter2d(img: torch.Tensor, kernel: torch.Tensor, padding: str) -> torch.Tensor:
    pad, out_height, out_width = _filter2d_geometry(img, kernel, padding)
    out = torch.empty(
        (*img.shape[:-2], out_height, out_width), dtype=img.dtype, device=img.device
    )
    if out.numel() == 0:
        return out
    img4 = _batched(img)
    plan = _filter2d_plan(img4.shape, img4.stride(), kernel.shape[-1], kernel.stride(), img.dtype,
                          kernel.dtype, pad, out_height, out_width, img.device, TUNING)
    with runtime.device_guard(img):
        plan.launch(img4, kernel, out)
    return out


# --------------------------------------------------------------------------------------------
# Public API: validate (clear errors naming the argument), then call the registered op.
# --------------------------------------------------------------------------------------------
def _check_rgb(img) -> None:
    runtime.check_tensor(img, "img", dtypes=COLOR_DTYPES, ndim=(3, 4))
    if img.shape[-3] != 3:
        raise ValueError(
            f"img must have 3 colour channels (RGB) in dimension -3, got shape {tuple(img.shape)}"
        )
    # In-plane pixel indices are int32 (cheap division for strided layouts) up to the end of the
    # last program's block; batch offsets are int64.
    if img.shape[-2] * img.shape[-1] > 2**31 - 1 - TUNING.color_block_size:
        raise ValueError(f"img planes of more than 2**31 pixels are not supported, got {tuple(img.shape)}")


def greyscale(img: torch.Tensor) -> torch.Tensor:
    """Luminosity greyscale ``0.299 R + 0.587 G + 0.114 B``.

    ``img`` is ``(3, H, W)`` or ``(N, 3, H, W)``, any strides (channels-last and sliced views are
    read in place). Returns ``(H, W)`` or ``(N, H, W)``, contiguous, in ``img``'s dtype: float32,
    float16 or bfloat16 (values in [0, 1], fp32 arithmetic inside), or uint8 (values in [0, 255],
    computed exactly and rounded to nearest, ties to even, like ``torch.round``).
    """
    _check_rgb(img)
    return _greyscale(img)


def sepia(img: torch.Tensor) -> torch.Tensor:
    """The classic sepia tone, ``out = M @ rgb`` per pixel, clipped at white::

        R' = 0.393 R + 0.769 G + 0.189 B
        G' = 0.349 R + 0.686 G + 0.168 B
        B' = 0.272 R + 0.534 G + 0.131 B

    Shapes and dtypes as :func:`greyscale`; the result has ``img``'s shape (contiguous). Float
    images are clipped at 1.0 (inputs are expected in [0, 1]); uint8 images are computed exactly,
    rounded half to even and saturated at 255.
    """
    _check_rgb(img)
    return _sepia(img)


def filter2d(img: torch.Tensor, kernel: torch.Tensor, padding: str = "same") -> torch.Tensor:
    """Filter every channel of ``img`` with the same ``K x K`` ``kernel`` (cross-correlation, as
    ``F.conv2d`` computes it: the kernel is not flipped).

    ``img`` is ``(C, H, W)`` or ``(N, C, H, W)``, float32/float16/bfloat16, any strides; ``kernel``
    is a square float tensor of odd size on the same device. ``padding="same"`` pads with zeros and
    keeps ``H x W``; ``"valid"`` returns ``(H - K + 1) x (W - K + 1)``. Equal to
    ``F.conv2d(img, kernel.expand(C, 1, K, K), padding=padding, groups=C)``, accumulated in fp32,
    returned contiguous in ``img``'s dtype.
    """
    runtime.check_tensor(img, "img", dtypes=FLOAT_DTYPES, ndim=(3, 4))
    runtime.check_tensor(kernel, "kernel", dtypes=FLOAT_DTYPES, ndim=2)
    runtime.check_same_device(img=img, kernel=kernel)
    rows, cols = kernel.shape
    if rows != cols:
        raise ValueError(f"kernel must be square (K x K), got shape {tuple(kernel.shape)}")
    if rows % 2 == 0:
        raise ValueError(f"kernel size must be odd (it has a centre pixel), got {rows} x {cols}")
    if not isinstance(padding, str) or padding not in PADDINGS:
        raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}")
    height, width = img.shape[-2:]
    if padding == "valid" and img.numel() > 0 and (height < rows or width < rows):
        raise ValueError(
            f"padding='valid' needs img at least as large as kernel: img is {height} x {width}, "
            f"kernel is {rows} x {cols}"
        )
    return _filter2d(img, kernel, padding)


# --------------------------------------------------------------------------------------------
# Named filters.
# --------------------------------------------------------------------------------------------
# The named filters live apart (..image_filters): plain tensors, importable without the kernels.
