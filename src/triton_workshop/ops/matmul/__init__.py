"""Matrix multiplication with the epilogue fused in: ``dropout(act(a @ b + bias))`` in one kernel.

The matmul family's host code: its tuning object (:class:`MatmulTuning`, :data:`TUNING`), the
launcher other families call (:func:`launch_matmul`: TF32 operand layout, aligned copies of ragged
operands, Hopper's TMA path), the registered op with its autograd (the backward redraws the
epilogue's dropout mask from its seed), and the public :func:`matmul` and :func:`linear`. The
kernels are in :mod:`.kernels`; why they look as they do (tiles, grouped ordering, ragged shapes,
TF32, the backward, dropout) is told in docs/kernels/matmul.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import sys
import types
from typing import Optional

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import runtime
from ...runtime import FLOAT_DTYPES, register_op, wrap_triton
from .._common import dropout_seed
from .kernels import (
    CONFIGS,
    MAX_BLOCK,
    dropout_scale_kernel,
    grouped_tile,
    matmul_kernel,
    matmul_tma_kernel,
    pad_copy_kernel,
    prune_configs,
)

__all__ = [
    "ACTIVATIONS", "CONFIGS", "MAX_BLOCK", "MatmulTuning", "TUNING", "check_activation",
    "check_dropout_p", "dropout_scale_kernel", "grouped_tile", "input_precision",
    "launch_matmul", "linear", "matmul", "matmul_kernel", "matmul_tma_kernel",
    "pad_copy_kernel", "prune_configs", "tf32_enabled",
]

#: Public activation names; ``None`` means none. Inside the registered op "none" stands for None,
#: because a torch.library schema has no optional string with a meaning of its own.
ACTIVATIONS = ("relu", "leaky_relu", "gelu")
_OP_ACTIVATIONS = ("none",) + ACTIVATIONS
_BIAS_DTYPES = FLOAT_DTYPES + (torch.float64,)


# --------------------------------------------------------------------------------------------
# Tuning.
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MatmulTuning:
    """The matmul family's launch decisions that are not the autotuner's. Read at each call from
    :data:`TUNING`; a test replaces the whole object
    (``monkeypatch.setattr(matmul, "TUNING", dataclasses.replace(matmul.TUNING, ...))``)."""

    #: Copy operands whose strides Triton cannot prove 16-byte aligned into rows padded to 16
    #: elements before the product (:func:`_aligned`): unaligned, the main loop falls to 2-byte
    #: loads without its software pipeline. Off in the interpreter, which then reads them in
    #: place, so that path stays tested on the CPU.
    align_operands: bool = not runtime.INTERPRET
    #: Whether 2-D fp16/bf16 products run through :func:`matmul_tma_kernel`: None picks it on
    #: Hopper GPUs (compute capability 9.x, where it was measured) for products of at least a wave
    #: of tiles and at least ``tma_min_volume``; True always (tests force it in the interpreter),
    #: False never.
    tma_matmul: bool | None = None
    #: With ``tma_matmul=None``, the smallest product (M*N*K) that takes the TMA kernel. Its
    #: descriptors cost about as much host time again as the rest of a call (built and encoded
    #: for each call's tensors, docs/results.md, the 2026-11-25 run at 1b36eaa), which only a product running
    #: longer than that can earn back; below, matmul_kernel (a model's many mid-size products,
    #: where the host's time per call is what limits an eager step).
    tma_min_volume: int = 2**34
    #: matmul_tma_kernel's config (not autotuned: a persistent grid is the SM count whatever the
    #: config, and this one won or tied at every shape measured; docs/kernels/matmul.md).
    #: 128x256x64 tiles, 3 stages: three stages of operands plus the output tile staged for its
    #: TMA store fit Hopper's 227 KB of shared memory; 4 stages do not.
    tma_block_m: int = 128
    tma_block_n: int = 256
    tma_block_k: int = 64
    #: Tile-rows walked together (grouped ordering: panels shared in L2).
    tma_group_m: int = 8
    tma_num_stages: int = 3
    tma_num_warps: int = 8
    #: Pipeline the tile loop and the K loop as one (the next tile's loads fly during the
    #: epilogue of this one).
    tma_flatten: bool = True
    tma_warp_specialize: bool = False
    #: 32-bit offsets inside an output tile wherever they cannot overflow (fewer registers, see
    #: matmul_kernel's store); False forces 64-bit ones, the path rows of >= 8M elements take.
    int32_tile_offsets: bool = True
    #: pad_copy_kernel's tile and warps: a copy, so a fixed tile rather than autotuning; its
    #: column blocks are whole 16-byte vectors of the padded rows in any dtype.
    pad_block_rows: int = 32
    pad_block_cols: int = 128
    pad_num_warps: int = 4
    #: dropout_scale_kernel's tile and warps (the backward of the epilogue's dropout): an
    #: elementwise pass, so a fixed tile, as the padded copy's.
    dropout_block_rows: int = 32
    dropout_block_cols: int = 128
    dropout_num_warps: int = 4

    def tma_config(self) -> dict:
        """matmul_tma_kernel's config as launch keywords (``BLOCK_M`` ..., ``num_stages``)."""
        return {"BLOCK_M": self.tma_block_m, "BLOCK_N": self.tma_block_n,
                "BLOCK_K": self.tma_block_k, "GROUP_M": self.tma_group_m,
                "num_stages": self.tma_num_stages, "num_warps": self.tma_num_warps,
                "FLATTEN": self.tma_flatten, "WARP_SPECIALIZE": self.tma_warp_specialize}


TUNING = MatmulTuning()

#: The module switches these fields replaced, readable under their old names (for scripts that
#: print them); setting one raises, since it would no longer change anything.
_FORMER_SWITCHES = {
    "TMA_MATMUL": ("tma_matmul", lambda t: t.tma_matmul),
    "ALIGN_OPERANDS": ("align_operands", lambda t: t.align_operands),
    "TMA_CONFIG": ("tma_block_m=..., tma_block_n=...", lambda t: t.tma_config()),
}


def __getattr__(name: str):
    if name in _FORMER_SWITCHES:
        return _FORMER_SWITCHES[name][1](TUNING)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _MatmulModule(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        if name in _FORMER_SWITCHES:
            raise AttributeError(
                f"{name} is now a field of {__name__}.TUNING: set it with monkeypatch.setattr("
                f"matmul, 'TUNING', dataclasses.replace(matmul.TUNING, "
                f"{_FORMER_SWITCHES[name][0]}))")
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _MatmulModule


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
def _batch_size(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The batch of the result, or None for a 2-D product. A 2-D operand, or a batch of 1, is
    broadcast (read with batch stride 0) against the other's batch."""
    if a.dim() == 2 and b.dim() == 2:
        return None
    batches = [t.shape[0] for t in (a, b) if t.dim() == 3]
    return max(batches) if min(batches) == 1 else batches[0]


def _out_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    batch = _batch_size(a, b)
    mn = (a.shape[-2], b.shape[-1])
    return mn if batch is None else (batch, *mn)


def _batch_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.dim() == 3 and t.shape[0] != 1 else 0


#: torch's C getter of the resolved precision (torch >= 2.9), without the Python attribute
#: lookups of ``torch.backends.cuda.matmul`` in front of it (this is read every fp32 product).
_fp32_precision = getattr(torch._C, "_get_fp32_precision_getter", None)


def tf32_enabled() -> bool:
    """Whether PyTorch would use TF32 for an fp32 matmul on CUDA right now.

    torch >= 2.9 keeps the setting as ``torch.backends.cuda.matmul.fp32_precision`` (read here
    already resolved through its parents, so ``torch.backends.fp32_precision = "tf32"`` counts);
    the legacy ``allow_tf32`` is kept in sync when it is *set*, but reading it raises once the two
    APIs were mixed. Older torch has only ``allow_tf32`` (which ``set_float32_matmul_precision``
    also drives).
    """
    if _fp32_precision is not None:
        try:
            return _fp32_precision("cuda", "matmul") == "tf32"
        except (TypeError, RuntimeError):  # another signature: the Python attribute below
            pass
    backend = torch.backends.cuda.matmul
    precision = getattr(backend, "fp32_precision", None)
    if precision is not None:
        return precision == "tf32"
    return bool(backend.allow_tf32)


def _k_major(a: torch.Tensor, b: torch.Tensor, tuning: MatmulTuning
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Operands laid out with K contiguous, as Hopper's TF32 tensor-core instruction reads them.

    With a row-major (K, N) B, Triton re-lays every tile out, and TF32 ran at a fraction of the
    speed it reaches with B = w.t() (K-major; docs/kernels/matmul.md). A copy of B (one read and
    one write, a few percent of a large product's time) is far cheaper than that difference.
    Only on the GPU: the interpreter has no such instruction."""
    if runtime.INTERPRET:
        return a, b
    return _aligned(a, contiguous_dim=-1, tuning=tuning), _aligned(b, contiguous_dim=-2,
                                                                    tuning=tuning)


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


def _is_aligned(t: torch.Tensor) -> bool:
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
def _pad_copy_plan(batch: int, rows: int, cols: int, padded: int, src_strides: tuple,
                   dtype: torch.dtype, tuning: MatmulTuning) -> runtime.LaunchPlan:
    """pad_copy_kernel's launch for one source layout. ``dtype`` is unused here but keys the
    cache: a plan's prepared launches hold a kernel compiled for one dtype."""
    block_r, block_c = tuning.pad_block_rows, tuning.pad_block_cols
    grid = (batch * runtime.cdiv(rows, block_r) * runtime.cdiv(padded, block_c),)
    return runtime.LaunchPlan(pad_copy_kernel, grid, scalars=(rows, cols, padded, *src_strides),
                              consts=dict(BLOCK_R=block_r, BLOCK_C=block_c,
                                          num_warps=tuning.pad_num_warps))


def _aligned(t: torch.Tensor, contiguous_dim: int | None = None,
             tuning: MatmulTuning | None = None) -> torch.Tensor:
    """``t`` itself, or a copy laid out with ``contiguous_dim`` (by default the one already
    contiguous) contiguous and its rows padded to a multiple of 16 elements (see _is_aligned).

    Unaligned, the product falls to 2-byte loads and loses its software pipeline (a ragged fp16
    product ran at a fraction of torch.compile's speed, which pads; docs/kernels/matmul.md).
    The copy costs about one read and one write of the operand. Its padding is zeros, and the
    kernel never lets it reach a stored result anyway (see matmul_kernel)."""
    if not _needs_copy(t, contiguous_dim):
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
    plan = _pad_copy_plan(batch, rows, cols, padded, src_strides, t.dtype,
                          TUNING if tuning is None else tuning)
    with runtime.device_guard(t):
        plan.launch(src, buf)
    view = buf[..., :cols]
    return view if dim == -1 else view.transpose(-1, -2)


def _grain(t: torch.Tensor, dim: int, aligned: bool | None = None) -> int:
    """How far matmul_kernel may read past the end of ``t``'s dim ``dim``: to a whole number of
    16-byte vectors, in elements, where ``dim`` is the contiguous dim of an aligned operand (the
    compiler reads such vectors along it, so wrapping or masking at a finer grain would misalign
    them or break them up); 1, nothing past the end, elsewhere. Those reads stay within the last
    16-byte sector of the row, or its padding."""
    if t.shape[dim] > 1 and t.stride(dim) == 1 and (_is_aligned(t) if aligned is None else aligned):
        return 16 // t.element_size()
    return 1


def input_precision(dtype: torch.dtype) -> str:
    """The ``tl.dot`` precision a product of ``dtype`` operands runs in: "tf32" or "ieee"."""
    if dtype == torch.float32 and tf32_enabled():
        return "tf32"
    # fp32 with TF32 off; fp16 and bf16 dots are exact products either way.
    return "ieee"


def launch_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    slope: float = 0.0,
    dropout_p: float = 0.0,
    seed: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out = dropout(act(a @ b + bias))`` through :func:`matmul_kernel`; returns ``out``.
    Dropout (probability ``dropout_p``, Philox seed ``seed``: one int64 on the device) only where
    ``dropout_p > 0``; otherwise the kernel compiles without it.

    What every caller needs between checked inputs and the launch, written once: the TF32
    operand layout, the aligned copies, the grid, the autotuning buckets, the grains. Shapes as
    ``_out_shape`` gives them (``out`` of any strides), no dimension empty, K included. The
    host function other op families call for a product (arguments already checked).

    An eager call whose operands need no copy and no TMA descriptors launches the
    :class:`~runtime.LaunchPlan` kept for its layout (:func:`_product_plan`): the decisions below
    are made once per layout, not at every call."""
    # Placeholders (never read) where the epilogue has no bias or no dropout.
    bias_or_out = bias if bias is not None else out
    seed_or_out = seed if dropout_p > 0 else out
    if runtime.launching_directly():
        plan = _product_plan(a, b, out, bias, activation, slope, dropout_p)
        if plan is not None:
            with runtime.device_guard(a):
                plan.launch(a, b, out, bias_or_out, seed_or_out)
            return out
    tuning = TUNING
    precision = input_precision(a.dtype)
    if precision == "tf32":
        a, b = _k_major(a, b, tuning)
    if tuning.align_operands:
        a, b = _aligned(a, tuning=tuning), _aligned(b, tuning=tuning)
    if _use_tma(a, b, out, precision, tuning):
        return _launch_matmul_tma(a, b, out, bias=bias, activation=activation, slope=slope,
                                  dropout_p=dropout_p, seed=seed, tuning=tuning)
    plan = _kernel_plan(a, b, out, bias, activation, slope, dropout_p, precision, tuning)
    with runtime.device_guard(a):
        # Traced (torch.compile): the plan's launch goes through wrap_triton, as Inductor needs.
        plan.launch(a, b, out, bias_or_out, seed_or_out)
    return out


def _kernel_plan(a, b, out, bias, activation: str, slope: float, dropout_p: float,
                 precision: str, tuning: MatmulTuning) -> runtime.LaunchPlan:
    """matmul_kernel's launch over these operands as they lie (already aligned or copied)."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = out.shape[0] if out.dim() == 3 else 1
    # 32-bit offsets inside a tile when the largest tile of any config cannot overflow them
    # (the config itself is only chosen at launch).
    int32_tile_offsets = tuning.int32_tile_offsets and bool(
        MAX_BLOCK * (out.stride(-2) + out.stride(-1)) < 2**31)
    a_aligned, b_aligned = _is_aligned(a), _is_aligned(b)  # once each, for the four grains
    # matmul_kernel is autotuned: its config, and with it the grid, is chosen at the first
    # launch of each bucket; the grid is a function of that config (FastLaunch keys it by the
    # ints it closes over, and a prepared launch keeps the grid the config gave).
    grid = _grid(batch, M, N)
    scalars = (
        M, N, K,
        _batch_stride(a), a.stride(-2), a.stride(-1),
        _batch_stride(b), b.stride(-2), b.stride(-1),
        out.stride(0) if out.dim() == 3 else 0, out.stride(-2), out.stride(-1),
        bias.stride(0) if bias is not None else 0,
        slope, dropout_p,
        runtime.bucket(M), runtime.bucket(N), runtime.bucket(K),
    )  # fmt: skip
    consts = dict(
        A_M_GRAIN=_grain(a, -2, a_aligned), A_K_GRAIN=_grain(a, -1, a_aligned),
        B_K_GRAIN=_grain(b, -2, b_aligned), B_N_GRAIN=_grain(b, -1, b_aligned),
        INT32_TILE_OFFSETS=int32_tile_offsets,
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        DROPOUT=dropout_p > 0,
        INPUT_PRECISION=precision,
        DOT_IN_FP32=runtime.INTERPRET and a.dtype == torch.bfloat16,
    )
    return runtime.LaunchPlan(matmul_kernel, grid, scalars, consts)


def _grid(batch: int, M: int, N: int):
    def grid(meta):
        return (batch * triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    return grid


#: :func:`_product_plan`'s plans by operand layout, for the tuning and TF32 setting they were
#: made under (replacing either starts a new dict: never a stale plan).
_PRODUCT_PLANS: dict = {}
_PRODUCT_PLANS_FOR: tuple = ()
#: A layout whose product takes the general path (copies, TMA descriptors) every call.
_GENERAL = object()


def _product_plan(a, b, out, bias, activation: str, slope: float, dropout_p: float = 0.0):
    """The cached :func:`_kernel_plan` of an eager product whose operands are launched as they
    lie, or None (the general path: operand copies, the TMA kernel, or an unusual argument).

    The key holds everything the plan depends on: the operands' shapes, strides, storage
    offsets modulo 16 (the 16-byte alignment judged from them), dtypes and device, the bias's
    stride and dtype, the epilogue (dropout's probability, whose being 0 or not compiles the
    kernel with or without it, included), the tuning object and the TF32 setting."""
    global _PRODUCT_PLANS, _PRODUCT_PLANS_FOR
    dtype = a.dtype
    tuning = TUNING
    tf32 = dtype is torch.float32 and tf32_enabled()
    if _PRODUCT_PLANS_FOR != (tuning, tf32):
        _PRODUCT_PLANS, _PRODUCT_PLANS_FOR = {}, (tuning, tf32)
    try:
        key = (a.shape, a.stride(), a.storage_offset() & 15, b.shape, b.stride(),
               b.storage_offset() & 15, out.shape, out.stride(), dtype, b.dtype, out.dtype,
               a.get_device(), None if bias is None else (bias.stride(0), bias.dtype),
               activation, slope, dropout_p)
        plan = _PRODUCT_PLANS.get(key)
    except (TypeError, RuntimeError):  # symbolic sizes, a tensor without strides: not planned
        return None
    if plan is None:
        plan = _new_product_plan(a, b, out, bias, activation, slope, dropout_p, tuning)
        if len(_PRODUCT_PLANS) >= 1024:  # many layouts: start over, bounded
            _PRODUCT_PLANS.clear()
        _PRODUCT_PLANS[key] = plan
    return None if plan is _GENERAL else plan


def _new_product_plan(a, b, out, bias, activation, slope, dropout_p, tuning: MatmulTuning):
    """:func:`_kernel_plan` where launch_matmul's general path would launch a, b as they are;
    _GENERAL where it would copy an operand or take the TMA kernel."""
    precision = input_precision(a.dtype)
    if precision == "tf32" and not runtime.INTERPRET:
        if _needs_copy(a, -1) or _needs_copy(b, -2):
            return _GENERAL
    if tuning.align_operands and (_needs_copy(a) or _needs_copy(b)):
        return _GENERAL
    if _use_tma(a, b, out, precision, tuning):
        return _GENERAL
    return _kernel_plan(a, b, out, bias, activation, slope, dropout_p, precision, tuning)


def _needs_copy(t: torch.Tensor, contiguous_dim: int | None = None) -> bool:
    """Whether :func:`_aligned` would copy ``t`` (rather than return it)."""
    dim = contiguous_dim if contiguous_dim is not None else _contiguous_dim(t)
    if dim is None:
        dim = -1
    return not (_is_aligned(t) and (t.stride(dim) == 1 or t.shape[dim] == 1))


# --------------------------------------------------------------------------------------------
# Hopper's path: the persistent TMA kernel.
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can describe the 2-D ``t`` as it lies: one dim of unit stride,
    the other's stride a multiple of 16 bytes, the start 16-byte aligned."""
    size = t.element_size()
    if t.data_ptr() % 16 != 0:
        return False
    return (t.stride(1) == 1 and t.stride(0) * size % 16 == 0) or (
        t.stride(0) == 1 and t.stride(1) * size % 16 == 0)


def _use_tma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, precision: str,
             tuning: MatmulTuning) -> bool:
    """Whether this (aligned) product goes to :func:`matmul_tma_kernel` (see
    :attr:`MatmulTuning.tma_matmul`)."""
    if tuning.tma_matmul is False or out.dim() != 2 or a.dim() != 2 or b.dim() != 2:
        return False
    if a.dtype not in (torch.float16, torch.bfloat16) or precision != "ieee":
        return False
    if not runtime.launching_directly():
        return False  # torch.compile traces matmul_kernel (no descriptors to trace)
    if tuning.tma_matmul is None:
        if runtime.INTERPRET or a.device.type != "cuda" or not _is_hopper(a.device.index or 0):
            return False
        M, N = out.shape
        if M * N * a.shape[1] < tuning.tma_min_volume:
            return False
        tiles = runtime.cdiv(M, tuning.tma_block_m) * runtime.cdiv(N, tuning.tma_block_n)
        if tiles < runtime.num_sms(a.device) or a.shape[1] < 4 * tuning.tma_block_k:
            return False
    return _tma_ready(a) and _tma_ready(b) and out.stride(1) == 1


def _descriptor(t: torch.Tensor, block: tuple[int, int]):
    """A TMA descriptor of the 2-D ``t`` over its memory as it lies: dims ordered so that the
    contiguous one is last, ``block`` given in ``t``'s (rows, cols) order."""
    if t.stride(1) == 1:
        return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block))
    return TensorDescriptor(t, [t.shape[1], t.shape[0]], [t.stride(1), t.stride(0)],
                            [block[1], block[0]])  # fmt: skip


def _launch_matmul_tma(a, b, out, *, bias=None, activation="none", slope=0.0, dropout_p=0.0,
                       seed=None, tuning: MatmulTuning | None = None):
    """``out = dropout(act(a @ b + bias))`` through :func:`matmul_tma_kernel` (see ``_use_tma``):
    ``a``, ``b`` 2-D and TMA-ready, ``out`` 2-D with a unit stride."""
    cfg = (TUNING if tuning is None else tuning).tma_config()
    bm, bn, bk = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    M, K = a.shape
    N = b.shape[1]
    c_tma = out.stride(1) == 1 and _tma_ready(out)
    sms = runtime.num_sms(a.device)
    grid = (min(sms, runtime.cdiv(M, bm) * runtime.cdiv(N, bn)),)
    # A plain launch, not a LaunchPlan: its arguments are TMA descriptors built around each
    # call's tensors, which a plan's prepared launch (keyed by tensor addresses) cannot hold; it
    # only runs for products of a wave of tiles or more, where the host's work is small beside it.
    with runtime.device_guard(a):
        wrap_triton(matmul_tma_kernel)[grid](
            _descriptor(a, (bm, bk)), _descriptor(b, (bk, bn)),
            _descriptor(out, (bm, bn)) if c_tma else None,
            out, bias if bias is not None else out, seed if dropout_p > 0 else out,
            M, N, K, out.stride(0), bias.stride(0) if bias is not None else 0, slope, dropout_p,
            A_K_MAJOR=a.stride(1) == 1, B_K_MAJOR=b.stride(1) != 1,  # as _descriptor lays them
            C_TMA=c_tma,
            HAS_BIAS=bias is not None,
            ACTIVATION=activation, DROPOUT=dropout_p > 0, INPUT_PRECISION="ieee",
            DOT_IN_FP32=runtime.INTERPRET and a.dtype == torch.bfloat16,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_SMS=sms, **cfg,
        )  # fmt: skip
    return out


def _activation_torch(z: torch.Tensor, activation: str, slope: float) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(z)
    if activation == "leaky_relu":
        return torch.nn.functional.leaky_relu(z, slope)
    if activation == "gelu":
        return torch.nn.functional.gelu(z, approximate="tanh")
    return z


def _matmul_fake(a, b, bias, activation, slope, dropout_p=0.0, seed=None):
    return a.new_empty(_out_shape(a, b))


# --------------------------------------------------------------------------------------------
# Dropout's backward: the output gradient through the mask the epilogue drew.
# --------------------------------------------------------------------------------------------
@runtime.plan_cache()
def _dropout_scale_plan(rows: int, cols: int, rows_per_batch: int, src_strides: tuple,
                        dropout_p: float, dtype: torch.dtype,
                        tuning: MatmulTuning) -> runtime.LaunchPlan:
    """dropout_scale_kernel's launch for one gradient layout. ``dtype`` is unused here but keys
    the cache: a plan's prepared launches hold a kernel compiled for one dtype."""
    block_r, block_c = tuning.dropout_block_rows, tuning.dropout_block_cols
    grid = (runtime.cdiv(rows, block_r) * runtime.cdiv(cols, block_c),)
    return runtime.LaunchPlan(dropout_scale_kernel, grid,
                              scalars=(rows, cols, rows_per_batch, *src_strides, dropout_p),
                              consts=dict(BLOCK_R=block_r, BLOCK_C=block_c,
                                          num_warps=tuning.dropout_num_warps))


def _dropout_scaled(src: torch.Tensor, seed: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """``src * keep / (1 - p)`` for ``src`` shaped as matmul's output, (M, N) or (B, M, N) of
    any strides, ``keep`` the mask the epilogue draws for ``seed``; contiguous."""
    out = src.new_empty(src.shape)
    if out.numel() == 0:
        return out
    rows_per_batch, cols = src.shape[-2:]
    src_strides = (src.stride(0) if src.dim() == 3 else 0, src.stride(-2), src.stride(-1))
    plan = _dropout_scale_plan(out.numel() // cols, cols, rows_per_batch, src_strides,
                               dropout_p, src.dtype, TUNING)
    with runtime.device_guard(src):
        plan.launch(src, out, seed)
    return out


def _dropout_grad_fake(grad, seed, dropout_p):
    return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)


@register_op("matmul_dropout_backward", fake=_dropout_grad_fake)
def _matmul_dropout_backward(grad: torch.Tensor, seed: torch.Tensor,
                             dropout_p: float) -> torch.Tensor:
    return _dropout_scaled(grad, seed, dropout_p)


def _dropout_grad_setup_context(ctx, inputs, output):
    _, seed, ctx.dropout_p = inputs
    ctx.save_for_backward(seed)


def _dropout_grad_backward(ctx, grad):
    # Linear in its input: its own backward is the same masking (a double backward).
    (seed,) = ctx.saved_tensors
    return _matmul_dropout_backward(grad, seed, ctx.dropout_p), None, None


_matmul_dropout_backward.register_autograd(_dropout_grad_backward,
                                           setup_context=_dropout_grad_setup_context)


def dropout_keep_mask(seed: torch.Tensor, shape: tuple, dropout_p: float) -> torch.Tensor:
    """The mask (True = kept) that :func:`linear` with ``dropout_p`` applies for ``seed`` to an
    output of ``shape`` (..., N), its leading dims counted as rows (see kernels.dropout_factor),
    drawn by the backward's kernel. For tests: a reference then applies the very same mask."""
    shape = tuple(shape)
    ones = torch.ones((math.prod(shape[:-1]), shape[-1]), device=seed.device)
    return (_dropout_scaled(ones, seed, dropout_p) != 0).reshape(shape)


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by the public functions below).
# --------------------------------------------------------------------------------------------
@register_op("matmul", fake=_matmul_fake, autocast="lower_precision_fp")  # as torch.matmul
def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: str,
    slope: float,
    dropout_p: float = 0.0,
    seed: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    if activation not in _OP_ACTIVATIONS:
        raise ValueError(f"activation must be one of {_OP_ACTIVATIONS}, got {activation!r}")
    if dropout_p > 0 and seed is None:
        raise ValueError("seed must be a tensor (one int64 on a's device) when dropout_p > 0")
    if a.dim() == 2 and b.dim() == 2:  # the common case, without _out_shape's batch logic
        M, K = a.shape
        N = b.shape[1]
        shape, batch = (M, N), 1
    else:
        shape = _out_shape(a, b)
        M, K = a.shape[-2:]
        N = b.shape[-1]
        batch = 1 if len(shape) == 2 else shape[0]

    if M == 0 or N == 0 or batch == 0:
        return a.new_empty(shape)
    if K == 0:
        # An empty sum is 0, so the result is the epilogue applied to zeros: no kernel needed.
        z = torch.zeros(shape, dtype=torch.float32, device=a.device)
        if bias is not None:
            z = z + bias.to(torch.float32)
        z = _activation_torch(z, activation, slope)
        if dropout_p > 0:
            z = _dropout_scaled(z, seed, dropout_p)
        return z.to(a.dtype)

    out = a.new_empty(shape)
    return launch_matmul(a, b, out, bias=bias, activation=activation, slope=slope,
                         dropout_p=dropout_p, seed=seed)


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _needs_preactivation(activation: str, slope: float) -> bool:
    # ReLU and leaky ReLU with slope >= 0 keep the sign of their input: out > 0 exactly when
    # Z > 0, so the output alone tells which branch each element took.
    return activation == "gelu" or (activation == "leaky_relu" and slope < 0)


def _matmul_setup_context(ctx, inputs, output):
    # Five inputs where the caller left dropout's two at their defaults (an eager call), seven
    # otherwise (torch's dispatcher fills the defaults in).
    a, b, bias, activation, slope = inputs[:5]
    dropout_p = inputs[5] if len(inputs) > 5 else 0.0
    seed = inputs[6] if len(inputs) > 6 else None
    ctx.activation = activation
    ctx.slope = slope
    ctx.dropout_p = dropout_p
    # With dropout, the output is still enough for ReLU's and leaky ReLU's gradient: where it is
    # 0 because the element was dropped, the masked gradient is 0 whichever branch is taken.
    keep_output = activation != "none" and not _needs_preactivation(activation, slope)
    ctx.save_for_backward(a, b, bias, output if keep_output else None,
                          seed if dropout_p > 0 else None)


def _preactivation_grad(ctx, grad, a, b, bias, out):
    activation, slope = ctx.activation, ctx.slope
    if activation == "none":
        return grad
    if not _needs_preactivation(activation, slope):
        negative_side = grad * slope if activation == "leaky_relu" else 0.0
        return torch.where(out > 0, grad, negative_side)
    # Recompute Z = A @ B + bias instead of having saved it (docs/kernels/matmul.md, Autograd).
    z = _matmul(a, b, bias, "none", 0.0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh")
    return torch.where(z > 0, grad, grad * slope)


def _matmul_backward(ctx, grad):
    a, b, bias, out, seed = ctx.saved_tensors
    if ctx.dropout_p > 0:
        # The mask is redrawn from the seed, never stored (see dropout_scale_kernel).
        grad = _matmul_dropout_backward(grad, seed, ctx.dropout_p)
    grad_z = _preactivation_grad(ctx, grad, a, b, bias, out)
    grad_a = grad_b = grad_bias = None
    # The op itself, not the public matmul: these operands are the forward's, already checked,
    # and the checks would run again on autograd's device thread, where Python costs the most.
    plain = a.dim() == 2 and b.dim() == 2  # no batch to broadcast or sum over
    if ctx.needs_input_grad[0]:
        grad_a = _matmul(grad_z, b.t() if plain else b.transpose(-1, -2), None, "none", 0.0)
        if not plain:
            grad_a = grad_a.sum_to_size(a.shape)
    if ctx.needs_input_grad[1]:
        if plain:
            grad_b = _matmul(a.t(), grad_z, None, "none", 0.0)
        elif b.dim() == 2 and a.dim() == 3:
            # b was shared by every batch: one (K, B*M) @ (B*M, N) product sums over the batch
            # inside the fp32 accumulator instead of materialising B partial gradients.
            # Explicit row counts: reshape(-1, 0) is ambiguous when K or N is 0.
            K, N = b.shape
            rows = a.shape[0] * a.shape[1]
            grad_b = _matmul(a.reshape(rows, K).t(), grad_z.reshape(rows, N), None, "none", 0.0)
        else:
            grad_b = _matmul(a.transpose(-1, -2), grad_z, None, "none", 0.0).sum_to_size(b.shape)
    if bias is not None and ctx.needs_input_grad[2]:
        rows = 0 if grad_z.dim() == 2 else tuple(range(grad_z.dim() - 1))
        grad_bias = grad_z.sum(dim=rows, dtype=torch.float32)
        if bias.dtype is not torch.float32:
            grad_bias = grad_bias.to(bias.dtype)
    return grad_a, grad_b, grad_bias, None, None, None, None


_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup_context)


# --------------------------------------------------------------------------------------------
# Public API.
# --------------------------------------------------------------------------------------------
def check_activation(activation, leaky_relu_slope) -> str:
    if activation is None or activation == "none":
        op_activation = "none"
    elif isinstance(activation, str) and activation in ACTIVATIONS:
        op_activation = activation
    else:
        valid = ", ".join(["None"] + [repr(name) for name in ACTIVATIONS])
        raise ValueError(f"activation must be one of {valid}; got {activation!r}")
    if isinstance(leaky_relu_slope, bool) or not isinstance(leaky_relu_slope, (int, float)):
        raise TypeError(
            f"leaky_relu_slope must be a float, got {type(leaky_relu_slope).__name__}"
        )
    return op_activation


def check_dropout_p(dropout_p) -> float:
    """``dropout_p`` as a float in [0, 1); TypeError/ValueError naming it otherwise."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0 <= dropout_p < 1:  # NaN fails this too
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return float(dropout_p)


def _check_matmul_args(a, b, bias, activation, leaky_relu_slope) -> str:
    runtime.check_tensor(a, "a", dtypes=FLOAT_DTYPES, ndim=(2, 3))
    runtime.check_tensor(b, "b", dtypes=FLOAT_DTYPES, ndim=(2, 3))
    runtime.check_same_dtype(a=a, b=b)
    if bias is not None:
        runtime.check_tensor(bias, "bias", dtypes=_BIAS_DTYPES, ndim=1)
    runtime.check_same_device(a=a, b=b, bias=bias)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"a has K={a.shape[-1]} but b has K={b.shape[-2]}: inner dimensions must match "
            f"(a is {tuple(a.shape)}, b is {tuple(b.shape)})"
        )
    if a.dim() == 3 and b.dim() == 3 and 1 not in (a.shape[0], b.shape[0]):
        if a.shape[0] != b.shape[0]:
            raise ValueError(
                f"batch sizes differ: a has batch {a.shape[0]} but b has batch {b.shape[0]} "
                "(they must be equal, or one of them 1)"
            )
    _check_bias_shape(bias, b.shape[-1])
    return check_activation(activation, leaky_relu_slope)


def _check_bias_shape(bias, n: int) -> None:
    if bias is not None and bias.shape[0] != n:
        raise ValueError(f"bias must have shape (N,) = ({n},) to match b, got {tuple(bias.shape)}")


@runtime.follows_autocast(_matmul)
def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    leaky_relu_slope: float = 0.01,
) -> torch.Tensor:
    """``activation(a @ b + bias)`` in one Triton kernel.

    ``a`` is (M, K) or (B, M, K), ``b`` is (K, N) or (B, K, N); a 2-D operand or a batch of 1 is
    broadcast against the other's batch. Any strides (transposed, sliced views are read in place).
    fp16, bf16 or fp32, both the same; the result has that dtype, accumulated in fp32 (fp32 inputs
    follow ``torch.backends.cuda.matmul.allow_tf32``). ``bias`` is (N,), any float dtype.
    ``activation`` is None, ``"relu"``, ``"leaky_relu"`` (negative slope ``leaky_relu_slope``) or
    ``"gelu"`` (tanh approximation). Differentiable in ``a``, ``b`` and ``bias``.
    """
    op_activation = _check_matmul_args(a, b, bias, activation, leaky_relu_slope)
    return _matmul(a, b, bias, op_activation, float(leaky_relu_slope))


@runtime.follows_autocast(_matmul)  # as F.linear
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    leaky_relu_slope: float = 0.01,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``dropout(activation(x @ weight.T + bias))``, like ``torch.nn.functional.linear`` plus an
    activation and dropout, in one kernel.

    ``x`` is (..., in_features), ``weight`` (out_features, in_features). The leading dimensions of
    ``x`` are flattened into M (one large product fills the GPU better than many small ones) and
    ``weight.T`` is read in place, without a copy. A 3-D ``x`` whose leading dimensions cannot be
    merged without a copy (``x.transpose(0, 1)``, say) runs as a batched product against the
    shared weight instead, also without a copy.

    ``dropout_p`` in [0, 1): with ``dropout_p > 0`` each output element is zeroed with that
    probability and the kept ones scaled by ``1 / (1 - dropout_p)``, always (as
    ``F.dropout(training=True)``: whether a model is training is the caller's business). The
    mask comes from Philox, seeded from torch's default generator of x's device at each call, so
    ``torch.manual_seed`` repeats a run; the backward redraws it from the seed instead of keeping
    it. ``dropout_p=0`` is the plain kernel, compiled without dropout.
    """
    call = key = None
    if not _is_compiling():
        # A call signature seen before was checked then: everything the checks read is in the
        # key (shapes, strides, dtypes, devices, layouts, the activation, the slope, dropout's
        # probability and their types).
        try:
            key = (x.shape, x.stride(), x.dtype, x.device, x.layout,
                   weight.shape, weight.stride(), weight.dtype, weight.device, weight.layout,
                   None if bias is None else (bias.shape, bias.dtype, bias.device, bias.layout),
                   activation, leaky_relu_slope, type(leaky_relu_slope),
                   dropout_p, type(dropout_p))
            call = _LINEAR_CALLS.get(key)
        except (AttributeError, TypeError, RuntimeError):  # not tensors, no strides: checked below
            key = None
    if call is None:
        call = _check_linear(x, weight, bias, activation, leaky_relu_slope, dropout_p)
        if key is not None:
            if len(_LINEAR_CALLS) >= 1024:
                _LINEAR_CALLS.clear()
            _LINEAR_CALLS[key] = call
    op_activation, slope, rows_kind, p = call
    # Dropout's two arguments only when it is on: the call without them is today's op call.
    dropout = (p, dropout_seed(x.device)) if p > 0 else ()
    if rows_kind == _ROWS_AS_IS:  # 2-D, or 3-D run as a batched product: out has x's lead dims
        return _matmul(x, weight.t(), bias, op_activation, slope, *dropout)
    rows = x[None] if rows_kind == _ROWS_OF_VECTOR else x.flatten(0, -2)
    out = _matmul(rows, weight.t(), bias, op_activation, slope, *dropout)
    return out.reshape(*x.shape[:-1], weight.shape[0])


_is_compiling = torch.compiler.is_compiling
#: linear's checked call signatures (see linear): what the checks concluded.
_LINEAR_CALLS: dict = {}
#: How linear hands x to the product: as it is (2-D, or 3-D whose leading dims cannot merge
#: without a copy: a batched product against the shared weight), as one row, or flattened.
_ROWS_AS_IS, _ROWS_OF_VECTOR, _ROWS_FLATTENED = range(3)


def _check_linear(x, weight, bias, activation, leaky_relu_slope,
                  dropout_p) -> tuple[str, float, int, float]:
    """linear's argument checks; ``(op activation, slope, how x becomes rows, dropout_p)``."""
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=2)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension, got a scalar")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has in_features={x.shape[-1]} but weight has in_features={weight.shape[1]} "
            f"(weight is (out_features, in_features) = {tuple(weight.shape)})"
        )
    runtime.check_same_dtype(x=x, weight=weight)
    if bias is not None:
        runtime.check_tensor(bias, "bias", dtypes=_BIAS_DTYPES, ndim=1)
    runtime.check_same_device(x=x, weight=weight, bias=bias)
    _check_bias_shape(bias, weight.shape[0])
    op_activation = check_activation(activation, leaky_relu_slope)
    p = check_dropout_p(dropout_p)
    if x.dim() == 1:
        rows_kind = _ROWS_OF_VECTOR
    elif x.dim() == 2 or (x.dim() == 3 and x.shape[0] > 1 and x.shape[1] > 1
                          and x.stride(0) != x.stride(1) * x.shape[1]):
        rows_kind = _ROWS_AS_IS  # 2-D; or flattening would copy
    else:
        rows_kind = _ROWS_FLATTENED
    return op_activation, float(leaky_relu_slope), rows_kind, p
