"""Image ops: colour transforms on pixel planes, and 2-D filters on tiles with a halo.

An image batch is an ``(N, C, H, W)`` tensor: ``N * C`` planes of ``H * W`` pixels. This file teaches
two ways to cut such a batch into programs.

**Colour transforms** (``greyscale``, ``sepia``) mix the three channels of one pixel and nothing else,
so they are memory-bound: every byte is read once and written once, and the only goal is to keep
the loads wide and in flight. A program owns ``BLOCK_SIZE`` consecutive pixels of one image and
loads the red, green and blue values from three planes ``stride_c`` elements apart. The grid is 1-D
(``N * blocks_per_plane`` programs): grid axes 1 and 2 are limited to 65,535 programs, axis 0 to
2**31 - 1, so the batch goes on axis 0. When the plane is contiguous the pixel offset *is* the flat
index, which keeps the loads vectorised; any other layout (channels-last, a sliced view) is read
in place through its strides, at the cost of a division per pixel, instead of being copied first.

**Filters** (``filter2d``) need a neighbourhood: each output pixel of a ``K x K`` filter reads
``K * K`` inputs. A program owns a ``BLOCK_H x BLOCK_W`` output tile of one plane, on a 3-D grid
``(N * C, cdiv(H_out, BLOCK_H), cdiv(W_out, BLOCK_W))``, and for every tap ``(i, j)`` loads the input
tile shifted by ``(i, j)``. Neighbouring taps, and neighbouring tiles, read almost the same bytes:
those repeats are served by the L1/L2 caches, so each input pixel comes from DRAM about once and
the kernel stays close to memory speed for small ``K``. The zero border of ``padding="same"`` costs
nothing extra: it is the ``other=0.0`` of the masked loads that fall outside the image.

Numerics: float images are computed in fp32 and rounded once on the store. uint8 images are
computed *exactly*, in integer thousandths (the colour weights have three decimals), then rounded
half to even and saturated at 255, so they agree with ``torch.round`` on the exact value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op, wrap_triton

__all__ = ["FILTERS", "filter2d", "get_filter", "greyscale", "sepia"]

COLOR_DTYPES = (*FLOAT_DTYPES, torch.uint8)
PADDINGS = ("same", "valid")

# Colour ops: 1024 pixels a program, 4 warps, 8 pixels a thread. Measured on an H100 (8 x 3 x
# 2160 x 3840 images): fp32 moves ~3.0 TB/s whatever the block (it is DRAM-bound); uint8 reaches
# ~2.8 TB/s contiguous and channels-last does best with small blocks (2.3 TB/s here against
# 2.0 at 4096 / 8 warps), where more programs keep more of the strided loads in flight.
COLOR_BLOCK_SIZE = 1024
COLOR_NUM_WARPS = 4

# filter2d: a 16 x 128 output tile (2048 outputs, 16 a thread with 4 warps). 128 columns make
# each row of a shifted load span four to five 128-byte lines, so the horizontal halo (K - 1
# columns) is a small fraction of what a tile reads. Measured on an H100 against 32 x 64, 64 x 64,
# 32 x 128 and 8 x 256 tiles with 4 or 8 warps: best or within 3% for K = 3, 5, 15, fp32 and fp16,
# and 8 warps cost up to 25% at K = 15 in fp16.
FILTER_BLOCK_H = 16
FILTER_BLOCK_W = 128
FILTER_NUM_WARPS = 4

# In-plane pixel indices are int32 (cheap division for strided layouts); batch offsets are int64.
_MAX_PLANE_PIXELS = 2**31 - 1 - COLOR_BLOCK_SIZE


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
@triton.jit
def _load_rgb_block(
    img_ptr, n_pixels, width, blocks_per_plane,
    stride_n, stride_c, stride_h, stride_w,
    PLANE_CONTIGUOUS: tl.constexpr, IS_UINT8: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """The red, green and blue values of this program's pixels, as int32 (uint8 images) or fp32."""
    pid = tl.program_id(0)
    # int64 before any multiplication by a stride: image * stride_n passes 2**31 for big batches.
    image = (pid // blocks_per_plane).to(tl.int64)
    offs = (pid % blocks_per_plane) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_pixels
    if PLANE_CONTIGUOUS:
        # Consecutive lanes, consecutive addresses: the loads vectorise.
        pixel = offs
    else:
        pixel = (offs // width).to(tl.int64) * stride_h + (offs % width).to(tl.int64) * stride_w
    red_ptr = img_ptr + image * stride_n + pixel
    # Step plane by plane: 2 * stride_c in int32 could wrap for a view into a huge tensor.
    green_ptr = red_ptr + stride_c
    blue_ptr = green_ptr + stride_c
    # Masked-off lanes are never stored, so their `other` value does not matter.
    r = tl.load(red_ptr, mask=mask)
    g = tl.load(green_ptr, mask=mask)
    b = tl.load(blue_ptr, mask=mask)
    if IS_UINT8:
        r = r.to(tl.int32)
        g = g.to(tl.int32)
        b = b.to(tl.int32)
    else:
        r = r.to(tl.float32)
        g = g.to(tl.float32)
        b = b.to(tl.float32)
    return r, g, b, image, offs, mask


@triton.jit
def _mix_rgb(
    r, g, b,
    WR: tl.constexpr, WG: tl.constexpr, WB: tl.constexpr,
    IS_UINT8: tl.constexpr, SATURATE: tl.constexpr,
):
    """(WR * r + WG * g + WB * b) / 1000, the weights given in integer thousandths."""
    if IS_UINT8:
        # Exact: at most 1351 * 255 = 344,505, far inside int32. Rounding the exact value (rather
        # than an fp32 approximation of it) makes ties (x.5) round the same way every time.
        total = r * WR + g * WG + b * WB
        quotient = total // 1000
        remainder = total - quotient * 1000
        round_up = (remainder > 500) | ((remainder == 500) & ((quotient % 2) == 1))
        value = quotient + round_up.to(tl.int32)
        if SATURATE:
            value = tl.minimum(value, 255)
    else:
        value = r * (WR / 1000) + g * (WG / 1000) + b * (WB / 1000)
        if SATURATE:
            value = tl.minimum(value, 1.0)
    return value


@triton.jit
def greyscale_kernel(
    img_ptr, out_ptr, n_pixels, width, blocks_per_plane,
    stride_n, stride_c, stride_h, stride_w,
    PLANE_CONTIGUOUS: tl.constexpr, IS_UINT8: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    r, g, b, image, offs, mask = _load_rgb_block(
        img_ptr, n_pixels, width, blocks_per_plane, stride_n, stride_c, stride_h, stride_w,
        PLANE_CONTIGUOUS, IS_UINT8, BLOCK_SIZE,
    )
    # ITU-R BT.601 luma. The weights sum to 1, so [0, 1] (or [0, 255]) stays in range: no clip.
    grey = _mix_rgb(r, g, b, 299, 587, 114, IS_UINT8, False)
    out_ptrs = out_ptr + image * n_pixels + offs
    tl.store(out_ptrs, grey.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sepia_kernel(
    img_ptr, out_ptr, n_pixels, width, blocks_per_plane,
    stride_n, stride_c, stride_h, stride_w,
    PLANE_CONTIGUOUS: tl.constexpr, IS_UINT8: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    r, g, b, image, offs, mask = _load_rgb_block(
        img_ptr, n_pixels, width, blocks_per_plane, stride_n, stride_c, stride_h, stride_w,
        PLANE_CONTIGUOUS, IS_UINT8, BLOCK_SIZE,
    )
    # Rows of the classic sepia matrix sum to 1.351, 1.203 and 0.937: bright pixels overflow,
    # so red and green saturate at white.
    red = _mix_rgb(r, g, b, 393, 769, 189, IS_UINT8, True)
    green = _mix_rgb(r, g, b, 349, 686, 168, IS_UINT8, True)
    blue = _mix_rgb(r, g, b, 272, 534, 131, IS_UINT8, True)
    out_dtype = out_ptr.dtype.element_ty
    # The output is contiguous (N, 3, H, W); image * 3 is int64 before it meets n_pixels.
    red_out = out_ptr + image * 3 * n_pixels + offs
    green_out = red_out + n_pixels
    blue_out = green_out + n_pixels
    tl.store(red_out, red.to(out_dtype), mask=mask)
    tl.store(green_out, green.to(out_dtype), mask=mask)
    tl.store(blue_out, blue.to(out_dtype), mask=mask)


@triton.jit
def filter2d_kernel(
    img_ptr, weight_ptr, out_ptr,
    channels, height, width, out_height, out_width,
    stride_n, stride_c, stride_h, stride_w,
    weight_stride_0, weight_stride_1,
    K: tl.constexpr, PAD: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
):
    # One plane (image, channel) per index of axis 0; 64-bit because N * C * stride can pass 2**31.
    plane = tl.program_id(0).to(tl.int64)
    image = plane // channels
    channel = plane % channels
    rows = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
    plane_ptr = img_ptr + image * stride_n + channel * stride_c

    # fp32 accumulation whatever the image dtype: K * K products of fp16/bf16 would lose bits.
    acc = tl.zeros((BLOCK_H, BLOCK_W), dtype=tl.float32)
    # The column loop is unrolled (static_range), so the K loads of a row are independent
    # instructions the compiler can issue back to back: measured 1.2x (K = 3) to 1.6x (K = 5)
    # faster on an H100 than two rolled loops. The row loop stays rolled: unrolling both made
    # K = 15 slower than rolled loops (225 copies of the body).
    for i in range(K):
        in_rows = rows + (i - PAD)
        # Rows above or below the image read as zero ("same"); with "valid" only the rows of
        # output lanes past out_height can fall outside, and those are never stored.
        row_mask = (in_rows >= 0) & (in_rows < height)
        row_ptrs = plane_ptr + in_rows.to(tl.int64)[:, None] * stride_h
        for j in tl.static_range(K):
            in_cols = cols + (j - PAD)
            col_mask = (in_cols >= 0) & (in_cols < width)
            # A scalar load of one tap: the same address in every lane, one broadcast from L1.
            tap = tl.load(weight_ptr + i * weight_stride_0 + j * weight_stride_1).to(tl.float32)
            # The tile shifted by (i, j): apart from a halo of K - 1 rows and columns this is
            # what the previous taps and the neighbouring programs read, so it hits in cache.
            x = tl.load(
                row_ptrs + in_cols.to(tl.int64)[None, :] * stride_w,
                mask=row_mask[:, None] & col_mask[None, :],
                other=0.0,
            )
            acc += x.to(tl.float32) * tap

    out_mask = (rows < out_height)[:, None] & (cols < out_width)[None, :]
    out_ptrs = (
        out_ptr
        + plane * out_height * out_width
        + rows.to(tl.int64)[:, None] * out_width
        + cols[None, :]
    )
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


# --------------------------------------------------------------------------------------------
# Launchers, registered as torch ops. Each takes (C, H, W) or (N, C, H, W) and reads the input
# through its strides; outputs are new contiguous tensors.
# --------------------------------------------------------------------------------------------
def _batched(img: torch.Tensor) -> torch.Tensor:
    """An (N, C, H, W) view (no copy) of a (C, H, W) or (N, C, H, W) image."""
    return img if img.dim() == 4 else img.unsqueeze(0)


def _plane_is_contiguous(img4: torch.Tensor) -> bool:
    """Whether pixel (h, w) of each plane sits at h * W + w: then the flat index is the offset.
    Strides of size-1 dimensions never matter (their index is always 0)."""
    _, _, height, width = img4.shape
    _, _, stride_h, stride_w = img4.stride()
    return (width == 1 or stride_w == 1) and (height == 1 or stride_h == width)


def _launch_color(kernel, img: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The shared launch of the colour kernels: empty → grid → launch."""
    img4 = _batched(img)
    batch, _, height, width = img4.shape
    n_pixels = height * width
    if out.numel() == 0:
        return out
    blocks_per_plane = runtime.cdiv(n_pixels, COLOR_BLOCK_SIZE)
    grid = (batch * blocks_per_plane,)
    with runtime.device_guard(img):
        wrap_triton(kernel)[grid](
            img4, out, n_pixels, width, blocks_per_plane,
            *img4.stride(),
            PLANE_CONTIGUOUS=_plane_is_contiguous(img4),
            IS_UINT8=img.dtype == torch.uint8,
            BLOCK_SIZE=COLOR_BLOCK_SIZE,
            num_warps=COLOR_NUM_WARPS,
        )
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
    return _launch_color(greyscale_kernel, img, out)


@register_op("sepia", fake=_sepia_fake)
def _sepia(img: torch.Tensor) -> torch.Tensor:
    out = torch.empty(img.shape, dtype=img.dtype, device=img.device)
    return _launch_color(sepia_kernel, img, out)


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


@register_op("filter2d", fake=_filter2d_fake)
def _filter2d(img: torch.Tensor, kernel: torch.Tensor, padding: str) -> torch.Tensor:
    pad, out_height, out_width = _filter2d_geometry(img, kernel, padding)
    out = torch.empty(
        (*img.shape[:-2], out_height, out_width), dtype=img.dtype, device=img.device
    )
    if out.numel() == 0:
        return out
    img4 = _batched(img)
    batch, channels, height, width = img4.shape
    size = kernel.shape[-1]
    grid = (
        batch * channels,
        runtime.cdiv(out_height, FILTER_BLOCK_H),
        runtime.cdiv(out_width, FILTER_BLOCK_W),
    )
    with runtime.device_guard(img):
        wrap_triton(filter2d_kernel)[grid](
            img4, kernel, out,
            channels, height, width, out_height, out_width,
            *img4.stride(),
            *kernel.stride(),
            K=size, PAD=pad, BLOCK_H=FILTER_BLOCK_H, BLOCK_W=FILTER_BLOCK_W,
            num_warps=FILTER_NUM_WARPS,
        )
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
    if img.shape[-2] * img.shape[-1] > _MAX_PLANE_PIXELS:
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
def _binomial_5x5() -> torch.Tensor:
    row = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
    return torch.outer(row, row) / 256.0


_SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])

#: Named ``K x K`` filters for :func:`filter2d` (float32, on the CPU; see :func:`get_filter`).
FILTERS: dict[str, torch.Tensor] = {
    "sharpen": torch.tensor([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]]),
    "edge": torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 8.0, -1.0], [-1.0, -1.0, -1.0]]),
    "gaussian": _binomial_5x5(),
    "motion_blur": torch.eye(5) / 5.0,
    "sobel_x": _SOBEL_X,
    "sobel_y": _SOBEL_X.T.contiguous(),
}


def get_filter(
    name: str, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A fresh copy of the named filter on ``device`` (the CPU by default) in ``dtype``."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}; valid names: {', '.join(sorted(FILTERS))}")
    return FILTERS[name].to(device=device, dtype=dtype, copy=True)
