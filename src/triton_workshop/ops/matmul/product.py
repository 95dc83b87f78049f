"""The product's launch: :func:`launch_matmul`, ``out = dropout(act(a @ b + bias))`` through
``matmul_kernel`` (the launcher other op families call), and what it decides once per operand
layout: TF32 or IEEE dots, aligned or K-major copies (:mod:`.operands`), Hopper's TMA kernel
(:mod:`.tma`), the kept :class:`~triton_workshop.runtime.LaunchPlan` of an eager product.
"""

from __future__ import annotations

import torch
import triton

from ... import runtime
from .kernels import MAX_BLOCK, matmul_kernel
from .operands import aligned, grain, is_aligned, k_major, needs_copy
from .tma import launch_matmul_tma, use_tma
from .tuning import TUNING, MatmulTuning


def _batch_size(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The batch of the result, or None for a 2-D product. A 2-D operand, or a batch of 1, is
    broadcast (read with batch stride 0) against the other's batch."""
    if a.dim() == 2 and b.dim() == 2:
        return None
    batches = [t.shape[0] for t in (a, b) if t.dim() == 3]
    return max(batches) if min(batches) == 1 else batches[0]


def out_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
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
    ``out_shape`` gives them (``out`` of any strides), no dimension empty, K included. The
    host function other op families call for a product (arguments already checked).

    An eager call whose operands need no copy and no TMA descriptors launches the
    :class:`~runtime.LaunchPlan` kept for its layout (:func:`product_plan`): the decisions below
    are made once per layout, not at every call."""
    # Placeholders (never read) where the epilogue has no bias or no dropout.
    bias_or_out = bias if bias is not None else out
    seed_or_out = seed if dropout_p > 0 else out
    if runtime.launching_directly():
        plan = product_plan(a, b, out, bias, activation, slope, dropout_p)
        if plan is not None:
            with runtime.device_guard(a):
                plan.launch(a, b, out, bias_or_out, seed_or_out)
            return out
    tuning = TUNING
    precision = input_precision(a.dtype)
    if precision == "tf32":
        a, b = k_major(a, b, tuning)
    if tuning.align_operands:
        a, b = aligned(a, tuning=tuning), aligned(b, tuning=tuning)
    if use_tma(a, b, out, precision, tuning, dropout_p > 0):
        return launch_matmul_tma(a, b, out, bias=bias, activation=activation, slope=slope,
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
    a_aligned, b_aligned = is_aligned(a), is_aligned(b)  # once each, for the four grains
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
        A_M_GRAIN=grain(a, -2, a_aligned), A_K_GRAIN=grain(a, -1, a_aligned),
        B_K_GRAIN=grain(b, -2, b_aligned), B_N_GRAIN=grain(b, -1, b_aligned),
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


#: :func:`product_plan`'s plans by operand layout, for the tuning and TF32 setting they were
#: made under (replacing either starts a new dict: never a stale plan).
_PRODUCT_PLANS: dict = {}
_PRODUCT_PLANS_FOR: tuple = ()
#: A layout whose product takes the general path (copies, TMA descriptors) every call.
_GENERAL = object()


def product_plan(a, b, out, bias, activation: str, slope: float, dropout_p: float = 0.0):
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
        plan = new_product_plan(a, b, out, bias, activation, slope, dropout_p, tuning)
        if len(_PRODUCT_PLANS) >= 1024:  # many layouts: start over, bounded
            _PRODUCT_PLANS.clear()
        _PRODUCT_PLANS[key] = plan
    return None if plan is _GENERAL else plan


def new_product_plan(a, b, out, bias, activation, slope, dropout_p, tuning: MatmulTuning):
    """:func:`_kernel_plan` where launch_matmul's general path would launch a, b as they are;
    _GENERAL where it would copy an operand or take the TMA kernel."""
    precision = input_precision(a.dtype)
    if precision == "tf32" and not runtime.INTERPRET:
        if needs_copy(a, -1) or needs_copy(b, -2):
            return _GENERAL
    if tuning.align_operands and (needs_copy(a) or needs_copy(b)):
        return _GENERAL
    if use_tma(a, b, out, precision, tuning, dropout_p > 0):
        return _GENERAL
    return _kernel_plan(a, b, out, bias, activation, slope, dropout_p, precision, tuning)
