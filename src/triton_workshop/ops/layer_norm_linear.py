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

So: one small kernel computes ``mean`` and ``rstd`` per row (8 bytes a row), then an unchanged
tensor-core matmul ``x @ W'ᵀ`` runs, and its epilogue applies one row vector pair and two column
vectors to the fp32 accumulator before the single store. ``W'``, ``c1`` and ``c2`` are weight-sized
and recomputed per call with plain torch ops (about three passes over N x K elements, against the
two passes over M x K that fusion saves: a win whenever M is larger than about N; in decoding with
a handful of rows it is not, and the unfused pair is as good).

**Numerics.** The form subtracts two large numbers when ``|mean| >> std``: ``Σ x W'`` and
``mean · c1`` both scale with ``|mean|`` while their difference scales with ``std``. What makes it
safe is that ``c1`` is summed from the same rounded ``W'`` the matmul reads, and that fp16/bf16
products are exact in fp32: the mean part then cancels *exactly* except for the fp32 rounding of
the accumulator. Each of the K additions rounds a partial sum of size ~``|mean|·|w|·√k`` by
``u = 2⁻²⁴``; those errors add up like a random walk, to ~``u·K·|mean|·|w|``, against an output of
size ~``std·√K·|w|``: a relative error of about ``2⁻²⁴ · √K · |mean| / std``. At mean 50, std 1,
K = 1024 that is ~1e-4, below fp16's own output rounding (2⁻¹¹ ≈ 5e-4); ``test_large_mean``
checks it. (fp32 products round too, which adds a term of the same size.) The error of rounding
``W'`` to fp16/bf16 is *not* amplified (``c1`` absorbs it) and is the same as rounding the
normalised activations to fp16 in the unfused pair. Both points matter; a float64 emulation at
fp16, K = 1024, mean 50, std 1 gives a relative error of 1.8e-4 with ``c1`` summed from the
rounded ``W'`` and 1.0e-2 with ``c1`` from the exact ``W·g``. (Measured in the interpreter, same
shapes: fp32 8.8e-6 at mean 50 against 1.6e-7 at mean 0, the ``|mean|/std`` amplification; fp16
2.7e-4 at both means, its output rounding.)

TF32 is the exception: the tensor cores would round ``x`` itself to 10 mantissa bits, an error of
up to ``2⁻¹¹·|mean|`` per element that ``c1`` does not see, so ~``2⁻¹¹·|mean|/std`` relative
(emulated at mean 50, K = 1024: 1.1e-2, against 2.5e-4 when centred). So when fp32 runs in TF32
(:func:`~triton_workshop.ops.matmul.tf32_enabled`, which ``matmul`` follows too) the kernel
centres each A tile in registers (``x - mean``, in fp32) before the dot and drops the ``c1`` term:
TF32 then rounds values of size ``std``, as in the unfused pair. The fp16/bf16 and IEEE-fp32
paths keep the untouched main loop.

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
from .layer_norm import layer_norm_backward
from .matmul import CONFIGS, grouped_tile, matmul, prune_configs, tf32_enabled

_PARAM_DTYPES = FLOAT_DTYPES + (torch.float64,)
#: Columns a step of the statistics kernel reads per row; longer rows are merged chunk by chunk.
STATS_CHUNK_COLS = 1024
#: Elements a statistics program aims to hold (short rows are packed several to a program).
STATS_TILE_ELEMS = 4096


# --------------------------------------------------------------------------------------------
# Kernels.
# --------------------------------------------------------------------------------------------
@triton.jit
def row_stats_kernel(
    x_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, stride_row, stride_col, eps,
    ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """fp32 ``mean`` and ``rstd`` of ``ROWS`` rows, in chunks of ``BLOCK_K`` columns: exact
    two-pass moments of each chunk in registers, merged with Chan's update (a sum of squared
    deviations, never ``E[x²] - E[x]²``, which cancels exactly when |mean| >> std)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
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
    tl.store(rstd_ptr + rows, 1.0 / tl.sqrt(m2 / n_cols + eps), mask=row_mask)


@runtime.autotune(
    configs=CONFIGS,
    key=["M_BUCKET", "N_BUCKET", "K_BUCKET", "INPUT_PRECISION"],
    prune_configs_by={"early_config_prune": prune_configs},
)
@triton.jit(do_not_specialize=["M_BUCKET", "N_BUCKET", "K_BUCKET"])
def layer_norm_linear_kernel(
    a_ptr, b_ptr, c_ptr, mean_ptr, rstd_ptr, c1_ptr, c2_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    M_BUCKET, N_BUCKET, K_BUCKET,
    CENTRE_A: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """``matmul_kernel``'s main loop (2-D, grouped ordering) with the LayerNorm epilogue
    ``rstd·acc − rstd·mean·c1 + c2`` (see the module docstring); ``CENTRE_A`` (TF32 only)
    subtracts ``mean`` from the A tile instead of ``mean·c1`` from the result."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)

    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # Rows past M read mean 0, rstd 0: their results are never stored.
    mean = tl.load(mean_ptr + offs_m, mask=mask_m, other=0.0)
    rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)

    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        # other=0 on the K tail: zeros add nothing, so a ragged K needs no separate path.
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        if CENTRE_A:
            # fp32 only. A's K tail becomes -mean here, but B's tail is 0: still adds nothing.
            a = a - mean[:, None]
        if DOT_IN_FP32:
            # Interpreter only (its bf16 dots are wrong); the GPU keeps native bf16 tensor cores.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # Epilogue on the fp32 accumulator, before the one rounding to the output dtype.
    c2 = tl.load(c2_ptr + offs_n, mask=mask_n, other=0.0)
    if CENTRE_A:
        acc = acc * rstd[:, None] + c2[None, :]
    else:
        c1 = tl.load(c1_ptr + offs_n, mask=mask_n, other=0.0)
        acc = acc * rstd[:, None] - (rstd * mean)[:, None] * c1[None, :] + c2[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# --------------------------------------------------------------------------------------------
# Launcher helpers.
# --------------------------------------------------------------------------------------------
def _n_rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


def _row_stats(x2d: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(mean, rstd)`` of each row of ``x2d``: 8 bytes a row, all the forward keeps."""
    n_rows, n_cols = x2d.shape
    mean = x2d.new_empty(n_rows, dtype=torch.float32)
    rstd = x2d.new_empty(n_rows, dtype=torch.float32)
    if n_rows == 0:
        return mean, rstd
    if n_cols == 0:  # statistics of nothing, as PyTorch's layer_norm: NaN
        return mean.fill_(math.nan), rstd.fill_(math.nan)
    tile = row_tile(min(n_cols, STATS_CHUNK_COLS), n_rows,
                    tile_elems=STATS_TILE_ELEMS, max_rows=64)  # fmt: skip
    wrap_triton(row_stats_kernel)[(triton.cdiv(n_rows, tile.rows),)](
        x2d, mean, rstd, n_rows, n_cols, x2d.stride(0), x2d.stride(1), eps,
        ROWS=tile.rows, BLOCK_K=tile.block_cols, num_warps=tile.num_warps,
    )  # fmt: skip
    return mean, rstd


def _folded_weights(weight, ln_weight, ln_bias, bias, dtype):
    """``W' = W·g`` rounded to ``dtype``, ``c1 = Σ_k W'`` from that rounded ``W'`` (so the mean
    term cancels against what the matmul really multiplies), ``c2 = W b + bias``; c1, c2 fp32."""
    if ln_weight is None:
        w_prime = weight
    else:
        w_prime = (weight.float() * ln_weight.float()).to(dtype)
    c1 = w_prime.sum(dim=1, dtype=torch.float32)
    c2 = weight.new_zeros(weight.shape[0], dtype=torch.float32)
    if ln_bias is not None:
        c2 += torch.mv(weight.float(), ln_bias.float())
    if bias is not None:
        c2 += bias.float()
    return w_prime, c1, c2


def _input_precision(dtype: torch.dtype) -> str:
    # As matmul: fp32 follows PyTorch's TF32 setting; fp16/bf16 products are exact either way.
    return "tf32" if dtype == torch.float32 and tf32_enabled() else "ieee"


def _bucket(n) -> int:
    return triton.next_power_of_2(n) if isinstance(n, int) else n  # symbolic under compile


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
    """``(out, mean, rstd)``: out (..., N) in x's dtype; mean and rstd fp32, one per row."""
    K, N = x.shape[-1], weight.shape[0]
    M = _n_rows(x)
    x2d = x.reshape(M, K)  # a view unless the leading dims cannot be merged
    out = x.new_empty(*x.shape[:-1], N)
    with runtime.device_guard(x):
        mean, rstd = _row_stats(x2d, eps)
        if M == 0 or N == 0:
            return out, mean, rstd
        w_prime, c1, c2 = _folded_weights(weight, ln_weight, ln_bias, bias, x.dtype)
        if K == 0:  # an empty sum: only the bias is left
            out.copy_(c2.expand(out.shape))
            return out, mean, rstd
        out2d = out.view(M, N)
        b = w_prime.t()  # (K, N), K-major, read in place
        precision = _input_precision(x.dtype)

        def grid(meta):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

        wrap_triton(layer_norm_linear_kernel)[grid](
            x2d, b, out2d, mean, rstd, c1, c2,
            M, N, K,
            x2d.stride(0), x2d.stride(1), b.stride(0), b.stride(1),
            out2d.stride(0), out2d.stride(1),
            _bucket(M), _bucket(N), _bucket(K),
            CENTRE_A=precision == "tf32",
            INPUT_PRECISION=precision,
            DOT_IN_FP32=runtime.INTERPRET and x.dtype == torch.bfloat16,
        )  # fmt: skip
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
