"""What the attention kernels' launches take from one call: its optional features (key padding
mask, sliding window, soft-capping, sinks, dropout, packed sequences) as pointers, strides,
scalars and compile-time switches (:class:`Features`), the compile-time arguments every kernel
shares (:func:`common_args`, cached per signature), the 1-D grid and the head dim's padding.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton

from ... import runtime

#: Largest head dim: the fp32 accumulators of a 128-row tile of D = 256 already take half the
#: register file of an SM (Hopper's 256 KB).
MAX_HEAD_DIM = 256
#: Smallest padded head dim: ``tl.dot`` needs a reduction dimension of at least 16.
MIN_HEAD_DIM_PAD = 16


def head_dim_pad(head_dim: int) -> int:
    return max(MIN_HEAD_DIM_PAD, triton.next_power_of_2(int(head_dim)))


def _dot_args(dtype: torch.dtype) -> dict:
    # fp32: exact IEEE products, as torch's fp32 math; fp16/bf16 products are exact either way.
    # bf16 in the interpreter: widen before each dot (docs/kernels/attention.md).
    return dict(
        INPUT_PRECISION="ieee",
        DOT_IN_FP32=runtime.INTERPRET and dtype == torch.bfloat16,
    )


@dataclasses.dataclass(frozen=True)
class Features:
    """The optional features of one call, as the registered ops receive them (checked), and what
    each kernel launch takes from them. Absent tensors are passed as None: the kernels then
    compile without them (``KEY_MASK`` etc. are compile-time switches)."""

    key_padding_mask: torch.Tensor | None
    window: int | None
    softcap: float | None
    sinks: torch.Tensor | None
    dropout_p: float
    dropout_seed: torch.Tensor | None
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def may_be_empty(self) -> bool:
        """Whether a query row may see no key at all (its output is then 0)."""
        return self.key_padding_mask is not None or self.window is not None or self.varlen

    def sequences(self, q: torch.Tensor) -> int:
        """Batch entries of the grid: packed sequences, or q's batch."""
        return self.cu_seqlens_q.shape[0] - 1 if self.varlen else q.shape[0]

    def rows(self, q: torch.Tensor, k: torch.Tensor) -> tuple[int, int]:
        """(query, key) rows one batch entry's grid covers: the longest packed sequence, or all."""
        if self.varlen:
            return self.max_seqlen_q, self.max_seqlen_k
        return q.shape[2], k.shape[2]

    def pointers(self, *, sinks: bool) -> tuple:
        mask = self.key_padding_mask
        # Bool tensors are read as bytes (the same storage): one load path on every Triton. In a
        # traced graph (fake tensors) Inductor cannot lower a bool -> uint8 view; a conversion
        # of the (batch, keys) mask there costs one small fused kernel.
        if mask is not None:
            mask = mask.view(torch.uint8) if type(mask) is torch.Tensor else mask.to(torch.uint8)
        tensors = (mask, self.sinks) if sinks else (mask,)
        # The seed first: the kept eager launches of a call with dropout pass each call's seed
        # right after the kernel's own tensors, and the rest (None) as fixed arguments.
        return (self.dropout_seed, *tensors, self.cu_seqlens_q, self.cu_seqlens_k)

    def strides(self, t: torch.Tensor) -> tuple[int, ...]:
        """A (B, H, N, D) tensor's strides for the kernels: packed sequences index their one
        batch entry by sequence, and their rows by ``cu_seqlens`` alone (batch stride 0)."""
        return (0, *t.stride()[1:]) if self.varlen else t.stride()

    def mask_strides(self) -> tuple[int, int]:
        mask = self.key_padding_mask
        return (0, 0) if mask is None else (mask.stride(0), mask.stride(1))

    def scalars(self) -> tuple:
        """window, softcap, dropout_p: placeholders where a feature is off (never read)."""
        return (self.window or 0, 1.0 if self.softcap is None else self.softcap, self.dropout_p)

    def consts(self) -> dict:
        return dict(
            KEY_MASK=self.key_padding_mask is not None,
            WINDOW=self.window is not None,
            SOFTCAP=self.softcap is not None,
            SINKS=self.sinks is not None,
            DROPOUT=self.dropout_p > 0,
            VARLEN=self.varlen,
        )


def common_args(q: torch.Tensor, k: torch.Tensor, causal: bool, features: Features) -> dict:
    """The compile-time arguments every attention kernel takes (one shared dict per signature:
    callers unpack it, never change it)."""
    n_q, n_k = features.rows(q, k)
    return _common_args_for(n_q, n_k, q.shape[3], bool(causal), q.dtype,
                            tuple(features.consts().items()))


@functools.lru_cache(maxsize=1024)
def _common_args_for(n_q: int, n_k: int, head_dim: int, causal: bool, dtype: torch.dtype,
                     feature_consts: tuple) -> dict:
    return dict(
        N_Q_BUCKET=runtime.bucket(n_q),
        N_K_BUCKET=runtime.bucket(n_k),
        HEAD_DIM=int(head_dim),
        HEAD_DIM_PAD=head_dim_pad(head_dim),
        CAUSAL=causal,
        **_dot_args(dtype),
        **dict(feature_consts),
    )


def tile_grid(n_rows: int, n_programs_per_tile: int, block_key: str):
    """1-D grid: every (tile, head, batch); see the kernels' ``program_tile``."""
    return lambda meta: (triton.cdiv(n_rows, meta[block_key]) * n_programs_per_tile,)


def lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[1], q.shape[2])
