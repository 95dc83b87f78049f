"""Exercise 8: flash attention, forward. The online softmax.

attention(q, k, v) = softmax(q k^T / sqrt(D)) v, per batch and head, for q, k, v of shape
(B, H, N, D). Written in PyTorch it builds the (N, N) score matrix in memory, reads it back for the
softmax, writes the probabilities, reads them again for the product with v: for long sequences
that traffic dwarfs the arithmetic. Flash attention never writes the scores: each program owns
BLOCK_M query rows and walks over the keys in blocks of BLOCK_N, keeping everything in registers.

The catch is the softmax: its max and its sum run over *all* keys, but the program sees them one
block at a time. The **online softmax** keeps, per query row, a running max ``m_i``, a running sum
``l_i`` of exp(score - m_i), and an accumulator ``acc`` of exp(score - m_i) * v. When a new block
raises the max to ``m_new``, everything summed so far was weighted by exp(s - m_i) instead of
exp(s - m_new): multiplying by ``alpha = exp(m_i - m_new)`` (<= 1) corrects it, for ``l_i`` and for
``acc`` alike. After the last block, ``acc / l_i`` is the softmax-weighted sum of v: one division
per row, at the end.

Causal attention (each query sees the keys at or before its own position) masks the scores of
later keys to -inf, and stops the loop after the last key any row of the block can see: half the
work of the full product.

Run it: ``python solutions/solution_8.py`` (or ``solution_8``).
"""

import math

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401

BLOCK_M = 32  # query rows per program
BLOCK_N = 16  # keys per step of the loop (BLOCK_M is a multiple of it)
HEAD_DIM_MAX = 128  # tl.dot needs at least 16; registers run out past 128


@triton.jit
def attention_fwd_kernel(q_ptr, k_ptr, v_ptr, out_ptr, seq_len, sm_scale,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)  # which block of query rows
    head = tl.program_id(1)  # which (batch, head): each is a contiguous (seq_len, HEAD_DIM) matrix
    base = head * seq_len * HEAD_DIM
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_mask = rows[:, None] < seq_len
    q = tl.load(q_ptr + base + rows[:, None] * HEAD_DIM + dims[None, :], mask=row_mask, other=0.0)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running max of each row
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)  # running sum of exp(score - m_i) * v

    key_end = seq_len
    if CAUSAL:
        key_end = causal_key_end(pid_m, seq_len, BLOCK_M)
    for start_n in range(0, key_end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        key_mask = keys < seq_len
        # K loaded transposed, (HEAD_DIM, BLOCK_N), so that q @ kt is the (BLOCK_M, BLOCK_N) scores.
        kt = tl.load(k_ptr + base + keys[None, :] * HEAD_DIM + dims[:, None],
                     mask=key_mask[None, :], other=0.0)
        v = tl.load(v_ptr + base + keys[:, None] * HEAD_DIM + dims[None, :],
                    mask=key_mask[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=INPUT_PRECISION) * sm_scale
        valid = key_mask[None, :]
        if CAUSAL:
            valid = valid & causal_mask(rows, keys)
        # -inf never wins the max and exp(-inf) = 0: keys past the end (or the diagonal) count
        # for nothing.
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # What was summed with the old max is too large by exp(m_new - m_i): scale it down.
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + base + rows[:, None] * HEAD_DIM + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_mask)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              causal: bool = False) -> torch.Tensor:
    check_tensors_gpu_ready(q, k, v)
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k and v must have the same shape (B, H, N, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, N, D = q.shape
    if D < 16 or D > HEAD_DIM_MAX or D & (D - 1):
        raise ValueError(f"the head dim must be a power of two from 16 to {HEAD_DIM_MAX}, got {D}")
    out = torch.empty_like(q)
    grid = (cdiv(N, BLOCK_M), B * H)
    attention_fwd_kernel[grid](q, k, v, out, N, 1.0 / math.sqrt(D), HEAD_DIM=D,
                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal,
                               INPUT_PRECISION="ieee")
    return out


# ---- Causal attention ------------------------------------------------------------------------
def attention_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What the checker calls for the causal cases."""
    return attention(q, k, v, causal=True)


@triton.jit
def causal_mask(rows, keys):
    """True where query ``row`` may see ``key``: at or before its own position."""
    return keys[None, :] <= rows[:, None]


@triton.jit
def causal_key_end(pid_m, seq_len, BLOCK_M: tl.constexpr):
    """Past the block's last row every key is masked: the loop stops there."""
    return tl.minimum((pid_m + 1) * BLOCK_M, seq_len)


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
