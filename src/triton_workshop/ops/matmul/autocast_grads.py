"""``autocast_linear``: ``torch.nn.functional.linear`` under ``torch.autocast``, whose backward
writes the gradient of an fp32 weight in fp32 straight from the GEMM.

Under autocast an fp32 Linear runs in bf16 (or fp16): autocast casts x and the weight down, the
product's backward makes the weight's gradient in bf16 (the GEMM's fp32 accumulator rounded), and
the cast's backward turns it back into fp32. That last step is a pass of its own over every
weight gradient, every step: 1.9 ms of a compiled LLaMA 1.5B training step on an H200. With the
gradient written in fp32 by the GEMM (``torch.mm(..., out_dtype=torch.float32)``, which torch
has on CUDA and Inductor lowers) the step took 134.5 ms against 135.9, interleaved in one
process (docs/results.md, 2026-11-29). The gradient is also the unrounded sum: the fp32 weight
gets the GEMM's fp32 accumulator where autocast hands it bf16.

Everything else is autocast's: the same casts in the forward (x, the weight and the bias to the
autocast dtype), the same tensors saved (the cast x and weight), x's gradient in the autocast
dtype (autograd casts it to x's own dtype, as it does for autocast's). Outside autocast, for a
weight already in the autocast dtype, or for tensors autocast does not cast, it is ``F.linear``.
Without the fp32-output GEMM (on the CPU, or a torch without it) the weight's gradient is
autocast's own: the product in the autocast dtype, then cast. The products are cuBLAS's (torch's
GEMMs): nothing is fused into them, and a Triton kernel would not run them faster.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import runtime

#: The dtypes autocast casts (float64 it leaves alone): the library's float dtypes.
_CAST = runtime.FLOAT_DTYPES
#: Whether this torch has ``torch.mm(a, b, out_dtype=...)`` (``aten::mm.dtype``; CUDA only).
_MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()


def autocast_linear(x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as torch runs it, under ``torch.autocast`` too, with the
    gradient of an fp32 ``weight`` made in fp32 by the GEMM (see the module docstring): what
    :class:`triton_workshop.nn.CublasLinear` runs."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if weight.dim() == 1:  # F.linear's vector weight: torch's own call, checks and all
        return F.linear(x, weight, bias)
    _check_shapes(x, weight, bias)
    device_type = x.device.type
    if not torch.is_autocast_enabled(device_type):
        return F.linear(x, weight, bias)
    dtype = torch.get_autocast_dtype(device_type)
    if (weight.dtype is dtype or weight.dtype not in _CAST or x.dtype not in _CAST
            or (bias is not None and bias.dtype not in _CAST)):
        return F.linear(x, weight, bias)  # nothing for autocast to cast back
    return _AutocastLinear.apply(x, weight, bias, dtype)


def _check_shapes(x, weight, bias) -> None:
    """What F.linear would refuse from inside torch, refused here by name."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features) or 1-D, got shape "
                         f"{tuple(weight.shape)}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x's last dimension must be weight's in_features {weight.shape[1]}, "
                         f"got x of shape {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},) (weight's out_features), "
                         f"got {tuple(bias.shape)}")
    runtime.check_same_device(x=x, weight=weight, bias=bias)


def weight_grad(grad_rows: torch.Tensor, x_rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``grad_rowsᵀ @ x_rows`` (the product's weight gradient) in ``dtype``: written so by the
    GEMM where torch can (fp32 from bf16/fp16 on CUDA), else made in the operands' dtype and
    cast (autocast's own backward)."""
    if (_MM_OUT_DTYPE and dtype is torch.float32 and grad_rows.is_cuda
            and grad_rows.dtype in (torch.bfloat16, torch.float16)):
        return torch.mm(grad_rows.t(), x_rows, out_dtype=torch.float32)
    return torch.mm(grad_rows.t(), x_rows).to(dtype)


class _AutocastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        # The casts autocast would make, then the product with autocast off (it would cast again).
        with torch.autocast(x.device.type, enabled=False):
            x_low, weight_low = x.to(dtype), weight.to(dtype)
            out = F.linear(x_low, weight_low, None if bias is None else bias.to(dtype))
        ctx.save_for_backward(x_low, weight_low)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_low, weight_low = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        grad_out = grad_out.to(weight_low.dtype)
        grad_x = grad_w = grad_b = None
        if need_x:  # x's dtype is autograd's business (it casts, as for autocast's F.linear)
            grad_x = grad_out @ weight_low
        if need_w or need_b:
            grad_rows = grad_out.reshape(-1, grad_out.shape[-1])
            if need_w:
                grad_w = weight_grad(grad_rows, x_low.reshape(-1, x_low.shape[-1]),
                                     ctx.weight_dtype)
            if need_b:  # autocast's: a sum in the autocast dtype, then cast (a small pass)
                grad_b = grad_rows.sum(0).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None
