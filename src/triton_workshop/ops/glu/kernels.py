"""Gated linear unit kernels: ``act(gate) * up`` and its backward, one pass over memory each.

    forward:   out   = act(gate) * up
    backward:  dgate = dout * up * act'(gate),   dup = dout * act(gate)

``act`` is SiLU (SwiGLU), or GELU, exact or with the tanh approximation (GeGLU). The backward
recomputes ``act`` and ``act'`` from ``gate`` rather than reading a saved activation: a few
more instructions, one tensor less to keep and to read.

Both kernels walk an ``(n_rows, n_cols)`` view of their operands, each with its own row and
column stride, so the two halves of a fused gate/up projection (``x @ w.T`` chunked in two along
the last dim) are read in place, without a copy. Contiguous operands come as one row. Offsets
are 64-bit: past 2**31 elements an int32 offset would wrap. All arithmetic is fp32, rounded once
on the store. The host code is in ``__init__.py``; why it is built this way is in
docs/kernels/glu.md.
"""

import triton
import triton.language as tl

#: The activations, as the ``ACTIVATION`` constexpr names them.
SILU = 0
GELU = 1
GELU_TANH = 2


@triton.jit
def _tanh(x):
    # tanh(x) = 2 sigmoid(2x) - 1: tl.tanh does not exist, and libdevice's import path differs
    # between Triton releases. Saturates to +-1 (exp overflows to inf, 2/inf = 0) without NaN.
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def activation_and_grad(x, ACTIVATION: tl.constexpr):
    """``(act(x), act'(x))`` in fp32 for ``x`` in fp32."""
    if ACTIVATION == 0:  # SiLU: x * s, s = sigmoid(x);  d/dx = s * (1 + x * (1 - s))
        s = tl.sigmoid(x)
        act = x * s
        grad = s * (1.0 + x * (1.0 - s))
    elif ACTIVATION == 1:  # GELU: x * Phi(x);  d/dx = Phi(x) + x * phi(x)
        cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))  # 1 / sqrt(2)
        act = x * cdf
        grad = cdf + x * tl.exp(-0.5 * x * x) * 0.3989422804014327  # 1 / sqrt(2 pi)
    else:  # GELU, tanh approximation: 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
        sqrt_2_over_pi = 0.7978845608028654
        t = _tanh(sqrt_2_over_pi * (x + 0.044715 * x * x * x))
        du = sqrt_2_over_pi * (1.0 + 3.0 * 0.044715 * x * x)
        act = 0.5 * x * (1.0 + t)
        grad = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
    return act, grad


@triton.jit
def _tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's rows, columns (int64) and mask: a 1-D grid of row-block x column-block
    tiles, column blocks fastest (a row's blocks are neighbours in memory)."""
    pid = tl.program_id(0).to(tl.int64)
    n_col_blocks = tl.cdiv(n_cols, BLOCK_N)
    rows = (pid // n_col_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % n_col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows[:, None], cols[None, :], mask


@triton.jit
def glu_fwd_kernel(
    gate_ptr, up_ptr, out_ptr,
    n_rows, n_cols,
    gate_row_stride, gate_col_stride, up_row_stride, up_col_stride,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``out = act(gate) * up`` over one tile; ``out`` is contiguous."""
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    gate = tl.load(gate_ptr + rows * gate_row_stride + cols * gate_col_stride, mask=mask)
    up = tl.load(up_ptr + rows * up_row_stride + cols * up_col_stride, mask=mask)
    act, _ = activation_and_grad(gate.to(tl.float32), ACTIVATION)
    out = act * up.to(tl.float32)
    tl.store(out_ptr + rows * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def glu_bwd_kernel(
    dout_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr,
    n_rows, n_cols,
    dout_row_stride, dout_col_stride, gate_row_stride, gate_col_stride,
    up_row_stride, up_col_stride, grad_row_stride,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``dgate = dout * up * act'(gate)`` and ``dup = dout * act(gate)`` over one tile, with
    ``act`` recomputed; ``dgate`` and ``dup`` are rows of ``grad_row_stride`` elements (the
    row's length for contiguous gradients; twice it for the two halves of one gradient of a
    fused gate/up projection)."""
    rows, cols, mask = _tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    dout = tl.load(dout_ptr + rows * dout_row_stride + cols * dout_col_stride, mask=mask)
    gate = tl.load(gate_ptr + rows * gate_row_stride + cols * gate_col_stride, mask=mask)
    up = tl.load(up_ptr + rows * up_row_stride + cols * up_col_stride, mask=mask)
    dout = dout.to(tl.float32)
    act, act_grad = activation_and_grad(gate.to(tl.float32), ACTIVATION)
    offs = rows * grad_row_stride + cols
    tl.store(dgate_ptr + offs, (dout * up.to(tl.float32) * act_grad).to(dgate_ptr.dtype.element_ty),
             mask=mask)
    tl.store(dup_ptr + offs, (dout * act).to(dup_ptr.dtype.element_ty), mask=mask)
