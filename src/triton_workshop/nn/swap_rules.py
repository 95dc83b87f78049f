"""Which torch module becomes which of triton-workshop's, and why one cannot: ``patch``'s rules.

Per kind (``_RULES``): the torch classes swapped (exactly: a subclass may compute something
else), a planner that builds the replacement as a template on the meta device or says why not
(dtypes the kernels do not take, ``padding_mode``, attention configurations), and our own classes
(never listed). :func:`decide` applies them to one module; :func:`layout_mismatch` checks that a
template fits the module it replaces; :func:`check_model` holds the refusals of the whole model
(compiled, scripted, split across device kinds, on a device the kernels cannot read). Nothing
here changes a module: :mod:`.patch` walks the model and applies.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import torch
from torch import nn

from .. import runtime
from . import modules as tw
from .conv import Conv2d
from .cublas_linear import CublasLinear
from .patched_attention import PatchedMultiheadAttention

_FLOAT_DTYPES = runtime.FLOAT_DTYPES

# nn.MultiheadAttention's out_proj: nn.Linear in all but name (no forward of its own).
_LINEAR_CLASSES = (nn.Linear, nn.modules.linear.NonDynamicallyQuantizableLinear)


def _kernel_device_types() -> tuple[str, ...]:
    return ("cuda", "cpu") if runtime.mode.INTERPRET else ("cuda",)


def _compiled_class():
    # Only a program that imported torch._dynamo can hold an OptimizedModule; importing it here
    # otherwise would cost seconds (and, before the mode decision, break the interpreter).
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def check_model(model) -> None:
    """The refusals of :mod:`.patch`'s docstring: a ``TypeError``/``ValueError`` that says what
    to do, raised before anything is changed."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    optimized = _compiled_class()
    for name, module in model.named_modules(remove_duplicate=False):
        where = f"submodule {name!r}" if name else "model"
        if optimized is not None and isinstance(module, optimized):
            raise ValueError(
                f"{where} is already compiled (torch.compile returned an OptimizedModule): patch "
                "the module first, then compile it: patch(model); model = torch.compile(model)"
            )
        if getattr(module, "_compiled_call_impl", None) is not None:
            raise ValueError(
                f"{where} is already compiled (module.compile()): patch it first, then compile"
            )
        if isinstance(getattr(module, "_c", None), torch._C.ScriptModule):  # scripted
            raise ValueError(
                f"{where} is a TorchScript module: patch the Python module before torch.jit.script"
            )
    device_types = sorted({t.device.type for t in _tensors(model)})
    if len(device_types) > 1:
        raise ValueError(
            f"model has parameters or buffers on several kinds of device ({', '.join(device_types)})"
            ": move it to one (model.to('cuda')) before patch(), so that every module can be "
            "swapped (patch would otherwise swap some and leave others)"
        )
    kernel_types = _kernel_device_types() + ("meta",)
    if device_types and device_types[0] not in kernel_types:
        raise ValueError(
            f"model is on {device_types[0]}, where the Triton kernels cannot run here (they need "
            "CUDA tensors): move it first, model.to('cuda'), then patch(model)"
        )


def _tensors(module: nn.Module) -> Iterable[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _own_tensors(module: nn.Module) -> list[torch.Tensor]:
    return [t for t in _tensors(module) if t is not None]


def dtype_device(module: nn.Module) -> tuple[torch.dtype | None, str | None]:
    """The one dtype and device of a module's parameters, or a reason why there is not one."""
    tensors = _own_tensors(module)
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        return None, f"its parameters are on several devices ({', '.join(map(str, devices))})"
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        return None, f"its parameters have several dtypes ({', '.join(map(str, dtypes))})"
    return (dtypes.pop() if dtypes else None), None


def dtype_reason(dtype: torch.dtype | None, allowed=_FLOAT_DTYPES) -> str | None:
    if dtype is None or dtype in allowed:
        return None
    names = ", ".join(str(d).replace("torch.", "") for d in allowed)
    return f"dtype {str(dtype).replace('torch.', '')}: the kernels take {names}"


def _template_linear(module: nn.Module, dtype) -> nn.Module:
    return tw.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                     device="meta", dtype=dtype)


def _plan_layer_norm(module: nn.LayerNorm, dtype):
    # layer_norm also takes float64 rows; its parameters may have any float dtype.
    reason = dtype_reason(dtype, _FLOAT_DTYPES + (torch.float64,))
    if reason:
        return None, reason
    template = tw.LayerNorm(
        module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine,
        bias=module.bias is not None, device="meta", dtype=dtype,
    )  # fmt: skip
    return [(module, template)], None


def _plan_rms_norm(module: nn.Module, dtype):
    from .rms_norm import RMSNorm

    reason = dtype_reason(dtype, _FLOAT_DTYPES + (torch.float64,))
    if reason:
        return None, reason
    template = RMSNorm(
        module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine,
        device="meta", dtype=dtype,
    )  # fmt: skip
    return [(module, template)], None


def _plan_linear(module: nn.Linear, dtype):
    reason = dtype_reason(dtype)
    if reason:
        return None, reason
    return [(module, _template_linear(module, dtype))], None


def _plan_conv2d(module: nn.Conv2d, dtype):
    if module.padding_mode != "zeros":
        return None, (f"padding_mode={module.padding_mode!r}: conv2d pads with zeros only")
    reason = dtype_reason(dtype)
    if reason:
        return None, reason
    template = Conv2d(
        module.in_channels, module.out_channels, module.kernel_size, module.stride,
        module.padding, module.dilation, module.groups, module.bias is not None, "zeros",
        device="meta", dtype=dtype,
    )  # fmt: skip
    return [(module, template)], None


def _plan_attention(module: nn.MultiheadAttention, dtype):
    if not module._qkv_same_embed_dim:
        return None, "kdim/vdim differ from embed_dim (separate q/k/v projection weights)"
    if module.bias_k is not None or module.add_zero_attn:
        return None, "add_bias_kv / add_zero_attn are not supported by the fused attention"
    reason = dtype_reason(dtype)
    if reason:
        return None, reason
    has_bias = module.in_proj_bias is not None
    if (module.out_proj.bias is not None) != has_bias or type(module.out_proj) not in _LINEAR_CLASSES:
        return None, "its out_proj is not the plain Linear it builds (bias differs, or replaced)"
    if module.embed_dim // module.num_heads > tw_attention_max_head_dim():
        return None, f"head dim {module.embed_dim // module.num_heads} is above the kernels' maximum"
    template = PatchedMultiheadAttention(
        module.embed_dim, module.num_heads, dropout=module.dropout, bias=has_bias,
        batch_first=module.batch_first, device="meta", dtype=dtype,
    )  # fmt: skip
    # out_proj first becomes a triton-workshop Linear; the attention then keeps it as its child.
    return [(module.out_proj, _template_linear(module.out_proj, dtype)), (module, template)], None


def tw_attention_max_head_dim() -> int:
    from ..ops.attention import MAX_HEAD_DIM

    return MAX_HEAD_DIM


def _rms_norm_classes() -> tuple[type, ...]:
    from .rms_norm import RMSNorm

    return (RMSNorm,)


#: kind -> (torch classes swapped exactly, planner, our classes (never listed)); a callable
#: instead of our classes is called when first needed (a module imported on use).
_RULES = {
    "layer_norm": ((nn.LayerNorm,), _plan_layer_norm, (tw.LayerNorm,)),
    "rms_norm": ((nn.RMSNorm,), _plan_rms_norm, _rms_norm_classes),
    "linear": (_LINEAR_CLASSES + (CublasLinear,), _plan_linear, (tw.Linear,)),
    "conv2d": ((nn.Conv2d,), _plan_conv2d, (Conv2d,)),
    "attention": ((nn.MultiheadAttention,), _plan_attention, (tw.MultiheadAttention,)),
}


def decide(module: nn.Module, kinds: set[str]):
    """``(kind, swaps, reason)`` for a module of one of ``kinds``: ``swaps`` the (module,
    template) pairs, or None with the reason it stays on torch; None for any other module."""
    cls = type(module)
    for kind, (torch_classes, planner, ours) in _RULES.items():
        if kind not in kinds:
            continue
        if cls in torch_classes:
            dtype, reason = dtype_device(module)
            if reason:
                return kind, None, reason
            swaps, reason = planner(module, dtype)
            return kind, swaps, reason
        if not isinstance(module, torch_classes):
            continue
        if not isinstance(ours, tuple):
            ours = ours()
        if not isinstance(module, ours):
            return kind, None, (
                f"{cls.__module__}.{cls.__qualname__} is a subclass of "
                f"{torch_classes[0].__qualname__}: its forward may compute something else"
            )
    return None


def layout_mismatch(module: nn.Module, template: nn.Module) -> str | None:
    """The template must find, under its names, the module's parameters, buffers and children;
    and the module must run its class's forward (one set on the instance would outlive the swap
    and keep computing with torch: a silent non-swap)."""
    if "forward" in vars(module):
        return "its forward is replaced on the instance (a wrapper or hook library): patch first"
    for attr in ("_parameters", "_buffers", "_modules"):
        missing = set(getattr(template, attr)) - set(getattr(module, attr))
        if missing:
            return f"it has no {', '.join(sorted(missing))} (changed after construction?)"
    return None
