"""GPT-2's ``Conv1D`` on triton-workshop's matmul, and which Conv1Ds ``patch_model`` takes.

:class:`Conv1D` is transformers' class computed by :func:`triton_workshop.linear` (the weight
read transposed in place), with an optional activation and dropout in the matmul's epilogue.
:func:`conv1d_claim` is the ``extra`` that ``patch_model`` hands to
:func:`~triton_workshop.nn.patch.plan_patch`: it takes GPT-2's Conv1Ds (under the same
``linear=`` rule as ``nn.Linear``), and finds the MLPs whose tanh GELU, and the residual
Dropouts, can run in a Conv1D's epilogue (recognised by the forwards of GPT-2's MLP and
attention).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import activations as hf_activations
from transformers.pytorch_utils import Conv1D as HFConv1D

from ...nn.patch import UNFUSED_LINEAR, dtype_device, dtype_reason, has_hooks
from ...ops.matmul import check_activation, check_dropout_p
from ...ops.matmul import linear as linear_op
from . import families


class Conv1D(HFConv1D):
    """transformers' ``Conv1D`` (``y = x @ weight + bias``, weight (nx, nf)) computed by
    :func:`triton_workshop.linear` on the weight read transposed in place (no copy), with an
    optional fused activation (``None``, ``"relu"``, ``"leaky_relu"``, ``"gelu"``: tanh
    approximation) and, while training, dropout with probability ``dropout_p`` after it (the
    ``nn.Dropout`` that followed the module, run in its epilogue). A subclass of transformers'
    class, so its ``isinstance`` checks hold."""

    def __init__(self, nf: int, nx: int, activation: str | None = None,
                 dropout_p: float = 0.0) -> None:
        check_activation(activation, 0.01)
        super().__init__(nf, nx)
        self.activation = activation
        self.dropout_p = check_dropout_p(dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_op(x, self.weight.t(), self.bias, self.activation,
                         dropout_p=self.dropout_p if self.training else 0.0)

    def __repr__(self) -> str:
        extra = f", activation={self.activation!r}" if self.activation else ""
        extra += f", dropout_p={self.dropout_p}" if self.dropout_p else ""
        return f"Conv1D(nf={self.nf}, nx={self.nx}{extra}) [triton-workshop]"


#: The tanh-approximated GELUs of transformers.activations: what the matmul's "gelu" computes.
_GELU_TANH = tuple(
    cls
    for cls in (
        getattr(hf_activations, "NewGELUActivation", None),
        getattr(hf_activations, "GELUTanh", None),
        getattr(hf_activations, "PytorchGELUTanh", None),
        getattr(hf_activations, "FastGELUActivation", None),
    )
    if cls is not None
)


def _gpt2_mlp_forward():
    try:
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    except ImportError:  # pragma: no cover
        return None
    return GPT2MLP.forward


def _gelu_fusible(mlp: nn.Module, gpt2_forward) -> bool:
    """GPT-2's MLP computes ``c_proj(act(c_fc(x)))``: when its forward is that one and ``act`` a
    tanh GELU, c_fc's output feeds the GELU only, so the GELU can run in c_fc's epilogue."""
    if gpt2_forward is None or getattr(type(mlp), "forward", None) is not gpt2_forward:
        return False
    c_fc, act = getattr(mlp, "c_fc", None), getattr(mlp, "act", None)
    return (
        type(c_fc) is HFConv1D
        and type(act) in _GELU_TANH
        and not has_hooks(c_fc)
        and not has_hooks(act)
    )


def _gpt2_residual_dropouts() -> dict:
    """GPT-2's MLP and attention forwards, each to the name of the ``nn.Dropout`` it applies to
    its ``c_proj``'s output and to nothing else: ``dropout(c_proj(h))`` ends both."""
    try:
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP, GPT2Attention
    except ImportError:  # pragma: no cover
        return {}
    return {GPT2MLP.forward: "dropout", GPT2Attention.forward: "resid_dropout"}


def _dropout_fusible(module: nn.Module, forwards: dict) -> str | None:
    """The name of the Dropout that can run in ``module.c_proj``'s epilogue (see
    :func:`_gpt2_residual_dropouts`): a plain ``nn.Dropout`` with 0 < p < 1, no hooks; or None."""
    name = forwards.get(getattr(type(module), "forward", None))
    if name is None or families.forward_replaced(module):
        return None
    c_proj, dropout = getattr(module, "c_proj", None), getattr(module, name, None)
    if type(c_proj) is not HFConv1D or type(dropout) is not nn.Dropout:
        return None
    if has_hooks(c_proj) or has_hooks(dropout) or not 0.0 < dropout.p < 1.0:
        return None
    return name


def conv1d_claim(policy: str, enabled: bool):
    """The ``extra`` of :func:`~triton_workshop.nn.patch.plan_patch`: GPT-2's Conv1D, and the
    modules with a class from a previous patch_model (left alone); also returns the MLPs whose
    GELU runs in their c_fc, and the (module, name) of the Dropouts that run in a c_proj, by the
    id of that Conv1D (filled as the modules are seen)."""
    gpt2_forward = _gpt2_mlp_forward()
    residual_dropouts = _gpt2_residual_dropouts()
    gelu_into: dict[int, nn.Module] = {}  # id(c_fc) -> its MLP
    dropout_into: dict[int, tuple[nn.Module, str]] = {}  # id(c_proj) -> (its module, dropout)

    def claim(name: str, module: nn.Module):
        if families.patched_kind(module) is not None:
            return None, None, None  # patch_model's own per-instance class: leave it
        if not enabled or policy == "never":  # linear=False / "never" rules Conv1D too
            return None
        # An MLP or attention module itself stays; its Conv1Ds come next in named_modules().
        dropout = _dropout_fusible(module, residual_dropouts)
        if dropout is not None:
            dropout_into[id(module.c_proj)] = (module, dropout)
        if _gelu_fusible(module, gpt2_forward):
            gelu_into[id(module.c_fc)] = module
        if type(module) is not HFConv1D:
            if isinstance(module, HFConv1D) and not isinstance(module, Conv1D):
                return "conv1d", None, f"{type(module).__qualname__} is a subclass of Conv1D"
            return None
        fused = id(module) in gelu_into
        owner = dropout_into.get(id(module))
        if not fused and owner is None and policy != "always":
            return "conv1d", None, UNFUSED_LINEAR
        dtype, reason = dtype_device(module)
        reason = reason or dtype_reason(dtype)
        if reason:
            return "conv1d", None, reason
        dropout_p = 0.0
        if owner is not None:
            owner_module, dropout_name = owner
            dropout_p = getattr(owner_module, dropout_name).p
        with torch.device("meta"):
            template = Conv1D(module.nf, module.nx, activation="gelu" if fused else None,
                              dropout_p=dropout_p)
        return "conv1d", [(module, template)], None

    return claim, gelu_into, dropout_into
