"""The product's operands as the kernel reads them best: whether Triton can read an operand with
16-byte loads (:func:`is_aligned`), a copy with its rows padded to 16 elements where it cannot
(:func:`aligned`, through ``pad_copy_kernel``), K-major operands for TF32 (:func:`k_major`), and
how far the kernel may read past an edge (:func:`grain`). Why: docs/kernels/matmul.md.
"""

from __future__ import annotations

import torch

from ... import runtime
from .kernels import pad_copy_kernel
from .tuning import TUNING, MatmulTuning

#: Triton specialises an integer argument (a stride) as "divisible by 16" when its *value* is,
#: i.e. in elements, whatever the dtype; no weaker divisibility is ever assumed.
_STRIDE_UNIT = 16


def _contiguous_dim(t: torch.Tensor) -> int | None:
    """Which of the last two dims is contiguous (-1 or -2): the one with unit stride, else one of
    size 1 (a single row or column, whatever its stride); None when neither is."""
    for dim in (-1, -2):
        if t.stride(dim) == 1 and t.shape[dim] > 1:
            return dim
    for dim in (-1, -2):
        if t.shape[dim] == 1:
            return dim
    return None


def is_aligned(t: torch.Tensor) -> bool:
    """Whether Triton can read ``t`` with 16-byte loads, judging from the launch arguments alone.

    It specialises a pointer on ``data_ptr % 16`` bytes but a stride only on ``stride % 16``
    *elements*: an fp16 row of 7784 elements, 16-byte aligned, still compiles to 2-byte loads.
    So: one contiguous dim, and every other stride a multiple of 16 elements. A matrix with no
    unit stride (``b[:, ::2]``) is gathered element by element and fails this, as does an
    overlapping view with two. The storage offset stands in for data_ptr(): fake tensors under
    torch.compile have no data pointer, and PyTorch's allocators hand out storage aligned to far
    more than 16 bytes."""
    dim = _contiguous_dim(t)
    if dim is None or (t.storage_offset() * t.element_size()) % 16 != 0:
        return False
    contiguous = t.dim() + dim
    shape, strides = t.shape, t.stride()
    for d in range(t.dim()):  # a loop, not all(<generator>): this runs several times a call
        if d != contiguous and shape[d] > 1 and strides[d] % _STRIDE_UNIT != 0:
            return False
    return True


@runtime.plan_cache()
def pad_copy_plan(batch: int, rows: int, cols: int, padded: int, src_strides: tuple,
                  dtype: torch.dtype, tuning: MatmulTuning) -> runtime.LaunchPlan:
    """pad_copy_kernel's launch for one source layout. ``dtype`` is unused here but keys the
    cache: a plan's prepared launches hold a kernel compiled for one dtype."""
    block_r, block_c = tuning.pad_block_rows, tuning.pad_block_cols
    grid = (batch * runtime.cdiv(rows, block_r) * runtime.cdiv(padded, block_c),)
    return runtime.LaunchPlan(pad_copy_kernel, grid, scalars=(rows, cols, padded, *src_strides),
                              consts=dict(BLOCK_R=block_r, BLOCK_C=block_c,
                                          num_warps=tuning.pad_num_warps))


def aligned(t: torch.Tensor, contiguous_dim: int | None = None,
            tuning: MatmulTuning | None = None) -> torch.Tensor:
    """``t`` itself, or a copy laid out with ``contiguous_dim`` (by default the one already
    contiguous) contiguous and its rows padded to a multiple of 16 elements (see is_aligned).

    Unaligned, the product falls to 2-byte loads and loses its software pipeline (a ragged fp16
    product ran at a fraction of torch.compile's speed, which pads; docs/kernels/matmul.md).
    The copy costs about one read and one write of the operand. Its padding is zeros, and the
    kernel never lets it reach a stored result anyway (see matmul_kernel)."""
    if not needs_copy(t, contiguous_dim):
        return t
    dim = contiguous_dim if contiguous_dim is not None else _contiguous_dim(t)
    if dim is None:
        dim = -1  # strided both ways: make rows contiguous
    src = t if dim == -1 else t.transpose(-1, -2)  # (..., rows, cols), cols to become contiguous
    rows, cols = src.shape[-2:]
    padded = runtime.cdiv(cols, _STRIDE_UNIT) * _STRIDE_UNIT
    buf = t.new_empty((*src.shape[:-1], padded))
    batch = src.shape[0] if src.dim() == 3 else 1
    src_strides = (src.stride(0) if src.dim() == 3 else 0, src.stride(-2), src.stride(-1))
    plan = pad_copy_plan(batch, rows, cols, padded, src_strides, t.dtype,
                         TUNING if tuning is None else tuning)
    with runtime.device_guard(t):
        plan.launch(src, buf)
    view = buf[..., :cols]
    return view if dim == -1 else view.transpose(-1, -2)


def grain(t: torch.Tensor, dim: int, aligned: bool | None = None) -> int:
    """How far matmul_kernel may read past the end of ``t``'s dim ``dim``: to a whole number of
    16-byte vectors, in elements, where ``dim`` is the contiguous dim of an aligned operand (the
    compiler reads such vectors along it, so wrapping or masking at a finer grain would misalign
    them or break them up); 1, nothing past the end, elsewhere. Those reads stay within the last
    16-byte sector of the row, or its padding."""
    if t.shape[dim] > 1 and t.stride(dim) == 1 and (is_aligned(t) if aligned is None else aligned):
        return 16 // t.element_size()
    return 1


def needs_copy(t: torch.Tensor, contiguous_dim: int | None = None) -> bool:
    """Whether :func:`aligned` would copy ``t`` (rather than return it)."""
    dim = contiguous_dim if contiguous_dim is not None else _contiguous_dim(t)
    if dim is None:
        dim = -1
    return not (is_aligned(t) and (t.stride(dim) == 1 or t.shape[dim] == 1))


def k_major(a: torch.Tensor, b: torch.Tensor, tuning: MatmulTuning
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands laid out with K contiguous, as Hopper's TF32 tensor-core instruction reads them.

    With a row-major (K, N) B, Triton re-lays every tile out, and TF32 ran at a fraction of the
    speed it reaches with B = w.t() (K-major; docs/kernels/matmul.md). A copy of B (one read and
    one write, a few percent of a large product's time) is far cheaper than that difference.
    Only on the GPU: the interpreter has no such instruction."""
    if runtime.INTERPRET:
        return a, b
    return aligned(a, contiguous_dim=-1, tuning=tuning), aligned(b, contiguous_dim=-2,
                                                                 tuning=tuning)
