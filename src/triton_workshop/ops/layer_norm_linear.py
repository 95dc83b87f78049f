"""LayerNorm followed by Linear, without writing the normalised activations to memory.

    out = F.linear(F.layer_norm(x, (K,), ln_weight, ln_bias, eps), weight, bias)

for ``x`` of shape (..., K) and ``weight`` (N, K): the block that opens every pre-norm
transformer layer (``ln -> qkv``, ``ln -> mlp.fc1``).

**What fusing saves.** Unfused, ``layer_norm`` reads ``x`` (M x K) and writes the normalised
activations (M x K), which the matmul then reads back: two of the three passes over an M x K
tensor exist only to hand a temporary from one kernel to the next. Here the forward reads ``x``
twice (once for the row statistics, once as the matmul's A operand) and writes nothing of size
M x K.

**Why an epilogue and not a prologue.** The obvious fusion normalises each A tile in registers
before the ``tl.dot``. But a tile of A is loaded ``N / BLOCK_N`` times, so the normalisation is
redone that often, and on Hopper an A operand modified in registers can no longer go straight
from shared memory to the tensor cores. Algebra moves everything out of the main loop instead.
With ``xhat = (x - mean) * rstd`` per row, ``g = ln_weight``, ``b = ln_bias``::

    out[m, n] = Σ_k (xhat[m,k] g[k] + b[k]) W[n,k] + bias[n]
              = rstd[m] · Σ_k x[m,k] W'[n,k]  −  rstd[m] · mean[m] · c1[n]  +  c2[n]

    W'[n,k] = W[n,k] · g[k]            (N x K, rounded to x's dtype: the matmul's B operand)
    c1[n]   = Σ_k W'[n,k]              (fp32, summed from the *rounded* W')
    c2[n]   = Σ_k W[n,k] b[k] + bias[n] (fp32)

So a call is two launches. ``prepare_kernel`` does two independent jobs, split between its
programs: the first compute ``mean`` and ``rstd`` per row (one read of ``x``, 8 bytes a row
written), the rest read ``W`` once and write ``W'`` (K contiguous, the layout the matmul reads in
place) with ``c1`` and ``c2`` beside it. Then
:func:`~triton_workshop.ops.matmul.matmul_kernel` computes ``x @ W'ᵀ`` with its ``LN_EPILOGUE``
flag on, and its epilogue applies the row pair ``rstd``, ``rstd·mean`` and the column vector
``c1`` to the fp32 accumulator, then adds ``c2`` as its bias, before the single store. It is the
tuned kernel every matmul runs, main loop untouched: no masks in it (a masked K tail after it,
edge rows wrapped instead of masked), so Hopper keeps its 16-byte asynchronous copies and
pipeline. A kernel of this module's own, masking every load, took 486.5 µs at fp16 8192 x 4096
x 4096 on an H100, 85% of cuBLAS's ``F.linear``; ``matmul_kernel`` reaches 98% at 4096³. As for
any matmul, on the GPU an ``x`` whose rows Triton cannot prove 16-byte aligned (K not a multiple
of 16 elements, say) is first copied into padded rows: one more read and write of ``x``, far
cheaper than the 2-byte loads it avoids. The folding is recomputed
every call (the weights may have changed since the last one): one read and one write of N x K
elements, against the write and read of M x K that fusion saves, so a win whenever M is larger
than about N; in decoding with a handful of rows it is not, and the unfused pair is as good.
Without ``ln_weight``, ``W' = W`` and nothing is written unless ``W`` is not already in that
layout (K contiguous, rows 16-element aligned).

**Numerics.** The form subtracts two large numbers when ``|mean| >> std``: ``Σ x W'`` and
``mean · c1`` both scale with ``|mean|`` while their difference scales with ``std``. What makes it
safe is that ``c1`` is summed from the same rounded ``W'`` the matmul reads, and that fp16/bf16
products are exact in fp32: the mean part then cancels *exactly* except for the fp32 rounding of
the accumulator. Each of the K additions rounds a partial sum of size ~``|mean|·|w|·√k`` by
``u = 2⁻²⁴``; those errors add up like a random walk, to ~``u·K·|mean|·|w|``, against an output of
size ~``std·√K·|w|``: a relative error of about ``2⁻²⁴ · √K · |mean| / std``. At mean 50, std 1,
K = 1024 that is ~1e-4, below fp16's own output rounding (2⁻¹¹ ≈ 5e-4); ``test_large_mean``
checks it. (fp32 products round too, which adds a term of the same size; so does the fp32 sum
that makes ``c1``, which :func:`_fold_weights_tile` takes over the very values it stores, rounded
and widened back, in running tiles and then a tree.) The error of rounding
``W'`` to fp16/bf16 is *not* amplified (``c1`` absorbs it) and is the same as rounding the
normalised activations to fp16 in the unfused pair. Both points matter; a float64 emulation at
fp16, K = 1024, mean 50, std 1 gives a relative error of 1.8e-4 with ``c1`` summed from the
rounded ``W'`` and 1.0e-2 with ``c1`` from the exact ``W·g``. (Measured in the interpreter, same
shapes: fp32 8.8e-6 at mean 50 against 1.6e-7 at mean 0, the ``|mean|/std`` amplification; fp16
2.7e-4 at both means, its output rounding.)

TF32 is the exception: the tensor cores would round ``x`` itself to 10 mantissa bits, an error of
up to ``2⁻¹¹·|mean|`` per element that ``c1`` does not see, so ~``2⁻¹¹·|mean|/std`` relative
(emulated at mean 50, K = 1024: 1.1e-2, against 2.5e-4 when centred). So when fp32 runs in TF32
(:func:`~triton_workshop.ops.matmul.tf32_enabled`, which ``matmul`` follows too) the forward is
*not* fused: :func:`~triton_workshop.ops.layer_norm.layer_norm_forward` writes the normalised
activations (fp32, M x K, with the ``mean`` and ``rstd`` the backward keeps), and ``matmul_kernel``
reads them back, adding ``bias`` in its epilogue. TF32 then rounds values of size ``std``, as in
the unfused pair: accurate, at the price of the one write and read of M x K that fusion saves. (The
alternative, centring each A tile in registers before the dot, is the prologue the previous
paragraph rules out, inside the main loop every matmul shares.) The fp16/bf16 and IEEE-fp32
paths stay fused.

**Backward** materialises what the forward avoided (allowed: the backward needs it anyway):
``ln_out = xhat·g + b`` is recomputed from the saved ``mean``/``rstd``, then

    dW = dYᵀ @ ln_out,   dbias = Σ_rows dY,   d_ln_out = dY @ W,

through :func:`~triton_workshop.ops.matmul.matmul`, and ``(dx, dg, db)`` come from
:func:`~triton_workshop.ops.layer_norm.layer_norm_backward` (deterministic). Saved for backward:
``x``, the parameters and 8 bytes a row, never an M x K activation.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import runtime
from ..runtime import FLOAT_DTYPES, register_op, row_tile, wrap_triton
from .layer_norm import layer_norm_backward, layer_norm_forward
from .matmul import _input_precision, _launch_matmul, matmul

_PARAM_DTYPES = FLOAT_DTYPES + (torch.float64,)
#: Columns a step of the statistics reads per row; longer rows are merged chunk by chunk, the
#: chunks' loads pipelined (the launch's default 3 stages). On an H100 (``diagnose.py
#: ln_prologue``, fp16 x 8192 x 4096 and W 4096 x 4096 in one prepare_kernel launch): 4 rows x
#: 1024-column chunks 60.4 µs, 2 x 2048 62.6, whole rows of 4096 64.5 (one load a row, no
#: pipeline), 2 x 1024 74.1.
STATS_CHUNK_COLS = 1024
#: Elements a statistics program aims to hold (short rows are packed several to a program).
STATS_TILE_ELEMS = 4096
#: The folding's step: columns of a weight row (its running sums are tiles of this width) and
#: elements (rows per program = elements / columns), pipelined ``FOLD_STAGES`` deep. On an H100
#: (``diagnose.py ln_prologue``, fp16 W 4096 x 4096, read and written): 8 x 512 tiles, 8 warps,
#: 30.3 µs (2215 GB/s); the earlier 8 x 256 took 35.1, 4 x 1024 31.0, 16 x 128 45.9.
FOLD_CHUNK_COLS = 512
FOLD_TILE_ELEMS = 4096
FOLD_STAGES = 3


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
@triton.jit
def _row_stats_tile(
    pid, x_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, stride_row, stride_col, eps,
    ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """fp32 ``mean`` and ``rstd`` of the ``ROWS`` rows of tile ``pid``, in chunks of ``BLOCK_K``
    columns: exact two-pass moments of each chunk in registers, merged with Chan's update (a sum
    of squared deviations, never ``E[x²] - E[x]²``, which cancels exactly when |mean| >> std)."""
    rows = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    # Typed tensors from the start: loop-carried values must keep one type.
    count = tl.zeros([ROWS], dtype=tl.float32)
    mean = tl.zeros([ROWS], dtype=tl.float32)
    m2 = tl.zeros([ROWS], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_row + cols[None, :] * stride_col,
                    mask=mask, other=0.0).to(tl.float32)  # fmt: skip
        chunk_count = tl.minimum(n_cols - start, BLOCK_K).to(tl.float32)
        chunk_mean = tl.sum(x, axis=1) / chunk_count
        centred = tl.where(mask, x - chunk_mean[:, None], 0.0)
        total = count + chunk_count
        delta = chunk_mean - mean
        mean += delta * (chunk_count / total)
        m2 += tl.sum(centred * centred, axis=1) + delta * delta * (count * chunk_count / total)
        count = total
    tl.store(mean_ptr + rows, mean, mask=row_mask)
    tl.store(rstd_ptr + rows, 1.0 / tl.sqrt(m2 / n_cols + tl.cast(eps, tl.float32)), mask=row_mask)


@triton.jit
def _fold_weights_tile(
    pid, w_ptr, g_ptr, b_ptr, bias_ptr, w_out_ptr, sums_ptr,
    n_rows, n_cols,
    stride_wn, stride_wk, stride_g, stride_b, stride_bias, stride_out,
    HAS_G: tl.constexpr, HAS_B: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_W: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """Everything the epilogue form needs from the ``ROWS`` weight rows of tile ``pid``, in one
    read of them (``W`` is N x K):

    * ``W'[n, k] = W[n, k] · g[k]``, rounded to ``w_out_ptr``'s dtype and stored with K
      contiguous (the main kernel's B operand, read in place); skipped when ``WRITE_W`` is off
      (no ``g``, and ``W`` already K-contiguous with aligned rows: then ``W' = W``);
    * ``c1[n] = Σ_k W'[n, k]`` in fp32, summed from the *rounded* values just stored, so that
      ``mean · c1`` matches what the tensor cores multiply (module docstring, "Numerics");
    * ``c2[n] = Σ_k W[n, k] · b[k] + bias[n]`` in fp32, from the unrounded ``W``.

    ``c1`` goes to ``sums_ptr[0:n_rows]``, ``c2`` to ``sums_ptr[n_rows:2 n_rows]``. The running
    sums are kept as whole ``ROWS x BLOCK_K`` tiles and reduced once after the loop: a reduction
    every step would cross threads (shuffles, shared memory) inside the loop."""
    rows = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    c1_acc = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    c2_acc = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    # Software-pipelined: the loads of the next STAGES - 1 steps are in flight while this one
    # computes (a memory-bound loop needs bytes in flight, not arithmetic).
    for start in tl.range(0, n_cols, BLOCK_K, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK_K)
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        # other=0 past the edges: a zero weight adds nothing to c1 or c2.
        w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                    mask=mask, other=0.0)  # fmt: skip
        if HAS_G:
            g = tl.load(g_ptr + cols * stride_g, mask=col_mask, other=0.0).to(tl.float32)
            # fp32 product, then one rounding to the operand dtype (exact for fp16/bf16 g:
            # an 11-bit by 11-bit product fits fp32's 24 bits).
            w_folded = (w.to(tl.float32) * g[None, :]).to(w_out_ptr.dtype.element_ty)
        else:
            w_folded = w
        if WRITE_W:
            tl.store(w_out_ptr + rows[:, None] * stride_out + cols[None, :], w_folded, mask=mask)
        c1_acc += w_folded.to(tl.float32)
        if HAS_B:
            b = tl.load(b_ptr + cols * stride_b, mask=col_mask, other=0.0).to(tl.float32)
            c2_acc += w.to(tl.float32) * b[None, :]
    c1 = tl.sum(c1_acc, axis=1)
    c2 = tl.sum(c2_acc, axis=1)
    if HAS_BIAS:
        c2 += tl.load(bias_ptr + rows * stride_bias, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(sums_ptr + rows, c1, mask=row_mask)
    tl.store(sums_ptr + n_rows + rows, c2, mask=row_mask)


@triton.jit
def prepare_kernel(
    x_ptr, mean_ptr, rstd_ptr, w_ptr, g_ptr, b_ptr, bias_ptr, w_out_ptr, sums_ptr,
    stats_programs, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_g, stride_b, stride_bias, stride_out,
    eps,
    HAS_G: tl.constexpr, HAS_B: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE_W: tl.constexpr,
    STATS_ROWS: tl.constexpr, STATS_BLOCK_K: tl.constexpr,
    FOLD_ROWS: tl.constexpr, FOLD_BLOCK_K: tl.constexpr, FOLD_STAGES: tl.constexpr,
):  # fmt: skip
    """Both jobs before the matmul in one launch: programs below ``stats_programs`` take a tile
    of x's rows (:func:`_row_stats_tile`), the rest a tile of the weight's rows
    (:func:`_fold_weights_tile`). Neither needs the other's result, and both are pure memory
    traffic: as two launches, the memory system drained at the end of the first (its last,
    partial wave) and ramped up again in the second. Statistics first, so the folded weights,
    written last, are the freshest data in L2 when the matmul starts reading them."""
    pid = tl.program_id(0)
    if pid < stats_programs:
        _row_stats_tile(pid, x_ptr, mean_ptr, rstd_ptr, M, K, stride_xm, stride_xk, eps,
                        STATS_ROWS, STATS_BLOCK_K)  # fmt: skip
    else:
        _fold_weights_tile(pid - stats_programs, w_ptr, g_ptr, b_ptr, bias_ptr, w_out_ptr,
                           sums_ptr, N, K, stride_wn, stride_wk, stride_g, stride_b, stride_bias,
                           stride_out, HAS_G, HAS_B, HAS_BIAS, WRITE_W,
                           FOLD_ROWS, FOLD_BLOCK_K, FOLD_STAGES)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
def _n_rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


def _concrete(n, bound: int) -> int:
    """``n``, or ``bound`` when it is symbolic (torch.compile with dynamic shapes): a row count
    that only caps a tile size must not make a constexpr symbolic (or add a guard)."""
    return n if type(n) is int else bound


def _operand_ready(w: torch.Tensor) -> bool:
    """Whether ``w`` (N, K) can be the main kernel's B operand as it is: K contiguous, and rows
    a multiple of 16 elements apart. Triton marks an integer argument divisible by 16 (the
    value, not bytes), and only from that can it prove that every row starts 16-byte aligned
    and issue 16-byte loads. Strides, not data_ptr(): fake tensors under torch.compile have no
    data, and PyTorch's allocators align storage to far more than 16 bytes."""
    (rows, cols), (stride_n, stride_k) = w.shape, w.stride()
    return (
        (stride_k == 1 or cols <= 1)
        and (stride_n % 16 == 0 or rows <= 1)
        and w.storage_offset() % 16 == 0
    )


def _prepare(x2d, mean, rstd, eps, weight, ln_weight, ln_bias, bias):
    """One launch of :func:`prepare_kernel`, for either job or both.

    Unless ``x2d`` (M, K) is None: fill fp32 ``mean`` and ``rstd`` of each of its rows (8 bytes
    a row: all the forward keeps). Unless ``weight`` (N, K) is None: return ``(w_prime, sums)``,
    ``w_prime`` (N, K) in weight's dtype with K contiguous and rows padded to 16 elements
    (``weight`` itself when there is no ``ln_weight`` and it is already in that form: nothing is
    written then), ``sums`` (2N,) fp32 = ``[c1, c2]``; else ``(None, None)``. M, N > 0."""
    stats, fold = x2d is not None, weight is not None
    K = x2d.shape[1] if stats else weight.shape[1]
    M = x2d.shape[0] if stats else 0
    N = weight.shape[0] if fold else 0
    if stats and K == 0:  # statistics of nothing, as PyTorch's layer_norm: NaN
        mean.fill_(math.nan)
        rstd.fill_(math.nan)
        stats = False
    w_prime = sums = None
    write = False
    if fold:
        sums = weight.new_empty(2 * N, dtype=torch.float32)
        write = ln_weight is not None or not _operand_ready(weight)
        if write and K % 16 == 0:
            w_prime = weight.new_empty(N, K)
        elif write:
            w_prime = weight.new_empty(N, runtime.cdiv(K, 16) * 16)[:, :K]  # padding never read
        else:
            w_prime = weight
    if not (stats or fold):
        return w_prime, sums
    stats_tile = row_tile(min(max(K, 1), STATS_CHUNK_COLS), _concrete(M, 64),
                          tile_elems=STATS_TILE_ELEMS, max_rows=64)  # fmt: skip
    fold_tile = row_tile(min(max(K, 1), FOLD_CHUNK_COLS), _concrete(N, 64),
                         tile_elems=FOLD_TILE_ELEMS, max_rows=64)  # fmt: skip
    stats_programs = runtime.cdiv(M, stats_tile.rows) if stats else 0
    fold_programs = runtime.cdiv(N, fold_tile.rows) if fold else 0
    # Arguments of a job that does not run are never read (its programs or its flag are off).
    spare = mean if stats else sums
    wrap_triton(prepare_kernel)[(stats_programs + fold_programs,)](
        x2d if stats else spare, mean if stats else spare, rstd if stats else spare,
        weight if fold else spare,
        ln_weight if fold and ln_weight is not None else spare,
        ln_bias if fold and ln_bias is not None else spare,
        bias if fold and bias is not None else spare,
        w_prime if fold else spare, sums if fold else spare,
        stats_programs, M, N, K,
        *(x2d.stride() if stats else (0, 0)),
        *(weight.stride() if fold else (0, 0)),
        ln_weight.stride(0) if fold and ln_weight is not None else 0,
        ln_bias.stride(0) if fold and ln_bias is not None else 0,
        bias.stride(0) if fold and bias is not None else 0,
        w_prime.stride(0) if fold else 0,
        eps,
        HAS_G=fold and ln_weight is not None, HAS_B=fold and ln_bias is not None,
        HAS_BIAS=fold and bias is not None, WRITE_W=write,
        STATS_ROWS=stats_tile.rows, STATS_BLOCK_K=stats_tile.block_cols,
        FOLD_ROWS=fold_tile.rows, FOLD_BLOCK_K=fold_tile.block_cols, FOLD_STAGES=FOLD_STAGES,
        num_warps=max(stats_tile.num_warps if stats else 1, fold_tile.num_warps if fold else 1),
    )  # fmt: skip
    return w_prime, sums


def _row_stats(x2d: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, eps: float) -> None:
    """:func:`_prepare`'s statistics alone."""
    _prepare(x2d, mean, rstd, eps, None, None, None, None)


def _fold_weights(weight, ln_weight, ln_bias, bias):
    """:func:`_prepare`'s weight folding alone: ``(w_prime, sums)``."""
    return _prepare(None, None, None, 0.0, weight, ln_weight, ln_bias, bias)


def _forward_fake(x, ln_weight, ln_bias, weight, bias, eps):
    n_rows = _n_rows(x)
    return (
        x.new_empty(*x.shape[:-1], weight.shape[0]),
        x.new_empty(n_rows, dtype=torch.float32),
        x.new_empty(n_rows, dtype=torch.float32),
    )


# --------------------------------------------------------------------------------------------
# The registered op (inputs already validated by layer_norm_linear).
# --------------------------------------------------------------------------------------------
@register_op("layer_norm_linear_forward", fake=_forward_fake)
def layer_norm_linear_forward(
    x: torch.Tensor,
    ln_weight: Optional[torch.Tensor],
    ln_bias: Optional[torch.Tensor],
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, mean, rstd)``: out (..., N) in x's dtype; mean and rstd fp32, one per row.

    Two launches: row statistics and weight folding in one (prepare_kernel), then the matmul
    with its LayerNorm epilogue (fp32 under TF32: layer_norm, then the matmul; see the module docstring). The launcher runs
    on every call, so it keeps to sizes and strides (no views it can avoid, no torch ops besides
    the allocations)."""
    K, N = x.shape[-1], weight.shape[0]
    M = _n_rows(x)
    x2d = x if x.dim() == 2 else x.reshape(M, K)  # a view unless the leading dims cannot merge
    out = x.new_empty(*x.shape[:-1], N)  # contiguous, so (M, N) with strides (N, 1)
    out2d = out if out.dim() == 2 else out.view(M, N)
    if M > 0 and N > 0 and K > 0 and _input_precision(x.dtype) == "tf32":
        # TF32 would round x itself, which the epilogue form cannot cancel (module docstring).
        ln_out, mean, rstd = layer_norm_forward(x2d, ln_weight, ln_bias, 1, eps)
        _launch_matmul(ln_out, weight.t(), out2d, bias=bias)
        return out, mean, rstd
    mean = x.new_empty(M, dtype=torch.float32)
    rstd = x.new_empty(M, dtype=torch.float32)
    if M == 0:
        return out, mean, rstd
    with runtime.device_guard(x):
        w_prime, sums = _prepare(x2d, mean, rstd, eps, weight if N > 0 else None, ln_weight,
                                 ln_bias, bias)  # fmt: skip
        if N == 0:
            return out, mean, rstd
        if K == 0:  # an empty sum: only the bias is left
            out.copy_(sums[N:].expand(out.shape))
            return out, mean, rstd
        # B = W'ᵀ (K, N), read in place through swapped strides: K-major, as W' is stored.
        # c1 = sums[:N] is read from sums' start; c2 = sums[N:] is the bias.
        _launch_matmul(x2d, w_prime.t(), out2d, bias=sums[N:], ln_epilogue=(mean, rstd, sums))
    return out, mean, rstd


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _setup_context(ctx, inputs, output):
    x, ln_weight, ln_bias, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, ln_weight, ln_bias, weight, mean, rstd)
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, grad_out, _grad_mean, _grad_rstd):
    x, ln_weight, ln_bias, weight, mean, rstd = ctx.saved_tensors
    need_x, need_g, need_b, need_w, need_bias = ctx.needs_input_grad[:5]
    K, N = x.shape[-1], weight.shape[0]
    M = mean.shape[0]
    x2d, dy = x.reshape(M, K), grad_out.reshape(M, N)
    dx = d_ln_weight = d_ln_bias = d_weight = d_bias = None
    if need_w:
        # The backward may materialise the normalised activations the forward never wrote.
        ln_out = (x2d.float() - mean[:, None]) * rstd[:, None]
        if ln_weight is not None:
            ln_out = ln_out * ln_weight.float()
        if ln_bias is not None:
            ln_out = ln_out + ln_bias.float()
        d_weight = matmul(dy.t(), ln_out.to(x.dtype))
    if need_bias:
        d_bias = dy.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
    if need_x or need_g or need_b:
        d_ln_out = matmul(dy, weight)
        dx, dg, db = layer_norm_backward(
            d_ln_out, x2d, ln_weight, mean, rstd, 1, need_x, need_g, need_b
        )
        dx = dx.view(x.shape) if need_x else None
        d_ln_weight = dg.to(ln_weight.dtype) if need_g else None
        d_ln_bias = db.to(ln_bias.dtype) if need_b else None
    return dx, d_ln_weight, d_ln_bias, d_weight, d_bias, None


layer_norm_linear_forward.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# Public function.
# --------------------------------------------------------------------------------------------
def _check_args(x, ln_weight, ln_bias, weight, bias, eps) -> None:
    runtime.check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension (..., in_features), got a scalar")
    runtime.check_tensor(weight, "weight", dtypes=FLOAT_DTYPES, ndim=2)
    runtime.check_same_dtype(x=x, weight=weight)
    K, N = x.shape[-1], weight.shape[0]
    if weight.shape[1] != K:
        raise ValueError(
            f"x has in_features={K} but weight has in_features={weight.shape[1]} "
            f"(weight is (out_features, in_features) = {tuple(weight.shape)})"
        )
    for name, t, size, what in (
        ("ln_weight", ln_weight, K, "in_features"),
        ("ln_bias", ln_bias, K, "in_features"),
        ("bias", bias, N, "out_features"),
    ):
        if t is None:
            continue
        runtime.check_tensor(t, name, dtypes=_PARAM_DTYPES, ndim=1)
        if t.shape[0] != size:
            raise ValueError(f"{name} must have shape ({what},) = ({size},), got {tuple(t.shape)}")
    runtime.check_same_device(x=x, ln_weight=ln_weight, ln_bias=ln_bias, weight=weight, bias=bias)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def layer_norm_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.linear(F.layer_norm(x, (K,), ln_weight, ln_bias, eps), weight, bias)``, fused.

    ``x`` is (..., K); ``weight`` (N, K) of x's dtype (fp16, bf16 or fp32; fp32 follows
    PyTorch's TF32 setting like :func:`~triton_workshop.ops.matmul.matmul`); ``ln_weight`` and
    ``ln_bias`` (K,) and ``bias`` (N,) of any float dtype, each optional (None: 1, 0, 0). Returns
    (..., N) in x's dtype. The normalised activations are never written in the forward (see the
    module docstring for how, and for the numerics). Differentiable in all five tensors, and
    traceable by ``torch.compile``.
    """
    _check_args(x, ln_weight, ln_bias, weight, bias, eps)
    out, _, _ = layer_norm_linear_forward(x, ln_weight, ln_bias, weight, bias, float(eps))
    return out
