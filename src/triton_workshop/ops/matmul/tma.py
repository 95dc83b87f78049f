"""Hopper's path for large 2-D fp16/bf16 products: whether a product takes the persistent TMA
kernel (:func:`use_tma`, see ``MatmulTuning.tma_matmul``) and its launch over TMA descriptors
(:func:`launch_matmul_tma`).
"""

from __future__ import annotations

import functools

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import runtime
from ...runtime import wrap_triton
from .kernels import matmul_tma_kernel
from .tuning import TUNING, MatmulTuning


@functools.lru_cache(maxsize=None)
def is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can describe the 2-D ``t`` as it lies: one dim of unit stride,
    the other's stride a multiple of 16 bytes, the start 16-byte aligned."""
    size = t.element_size()
    if t.data_ptr() % 16 != 0:
        return False
    return (t.stride(1) == 1 and t.stride(0) * size % 16 == 0) or (
        t.stride(0) == 1 and t.stride(1) * size % 16 == 0)


def use_tma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, precision: str,
            tuning: MatmulTuning, dropout: bool = False) -> bool:
    """Whether this (aligned) product goes to :func:`matmul_tma_kernel` (see
    :attr:`MatmulTuning.tma_matmul`); ``dropout``: its epilogue has dropout."""
    if tuning.tma_matmul is False or out.dim() != 2 or a.dim() != 2 or b.dim() != 2:
        return False
    if a.dtype not in (torch.float16, torch.bfloat16) or precision != "ieee":
        return False
    if not runtime.launching_directly():
        return False  # torch.compile traces matmul_kernel (no descriptors to trace)
    if tuning.tma_matmul is None:
        # Dropout's epilogue draws a random number for each element of the 128 x 256 output
        # tile, and staging them takes the kernel's shared memory to 336 KB, more than a Hopper
        # SM has (227 KB): Triton refuses the launch. matmul_kernel's autotuned tiles take it.
        if dropout:
            return False
        if runtime.INTERPRET or a.device.type != "cuda" or not is_hopper(a.device.index or 0):
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


def launch_matmul_tma(a, b, out, *, bias=None, activation="none", slope=0.0, dropout_p=0.0,
                      seed=None, tuning: MatmulTuning | None = None):
    """``out = dropout(act(a @ b + bias))`` through :func:`matmul_tma_kernel` (see ``use_tma``):
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
