"""Hugging Face transformers with triton-workshop's kernels: an attention implementation, and
``patch_model(model)`` for GPT-2 and Llama-style models. Needs ``pip install transformers``
(an optional dependency: nothing else in the package imports this module).

::

    import triton_workshop.integrations.transformers as tw_hf   # registers "triton_workshop"
    model = GPT2LMHeadModel(config)        # or from_pretrained / from_config
    counts = tw_hf.patch_model(model)      # {'conv1d': 48, 'layer_norm': 25, 'attention': 12, ...}

**Attention.** Importing this module registers ``"triton_workshop"`` with transformers'
``AttentionInterface`` (and, for the masks, the same mask builder as ``"sdpa"``, which passes no
mask when there is nothing but causality to mask), so ``attn_implementation="triton_workshop"``
works wherever ``"sdpa"`` does, e.g. ``AutoModelForCausalLM.from_config(config,
attn_implementation="triton_workshop")`` or ``model.set_attn_implementation("triton_workshop")``.
Calls the fused kernel cannot take (an attention mask, i.e. a padded batch or a pattern beyond
causal; dropout > 0 while training; logit soft-capping, sinks or position biases; different head
dims for K and V) are computed by transformers' own SDPA path instead, said once per reason in a
:class:`~triton_workshop.nn.patch.PatchWarning`. Grouped-query attention runs natively (K/V
heads are not repeated).

**patch_model.** One call: the attention implementation above, transformers' ``Conv1D`` (GPT-2's
projections; ``y = x @ weight + bias``) through :func:`triton_workshop.linear` with the weight read
transposed in place, GPT-2's MLP GELU (the tanh approximation it uses) fused into ``c_fc``'s
matmul, and every ``nn.LayerNorm``/``nn.Linear`` (``lm_head`` included, tied weights stay tied)
through :func:`triton_workshop.nn.patch`. Same rules as ``patch``: in place, the same Parameters,
unchanged state_dict keys, unsupported modules listed and left as they were, compiled models
refused before anything changes. Llama's RMSNorm and SwiGLU MLP have no triton-workshop kernel and
stay as they are.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

try:
    import transformers  # noqa: F401
    from transformers import AttentionInterface, PreTrainedModel
    from transformers import activations as _hf_activations
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.pytorch_utils import Conv1D as _HFConv1D
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "triton_workshop.integrations.transformers needs the transformers package "
        f"(pip install transformers): {exc}"
    ) from exc

from .. import runtime
from ..nn.patch import (
    PatchWarning,
    _check_flag,
    _dtype_device,
    _dtype_reason,
    _has_hooks,
    apply_plan,
    plan_patch,
)
from ..ops.attention import MAX_HEAD_DIM, attention
from ..ops.matmul import check_activation
from ..ops.matmul import linear as linear_op

#: The name to pass as ``attn_implementation``.
ATTN_IMPLEMENTATION = "triton_workshop"

__all__ = ["ATTN_IMPLEMENTATION", "Conv1D", "attention_forward", "patch_model", "register"]


# --------------------------------------------------------------------------------------------
# Attention.
# --------------------------------------------------------------------------------------------
_warned: set[str] = set()


def _unsupported(query, key, value, attention_mask, dropout, kwargs) -> str | None:
    """Why this call cannot take the fused kernel, or None."""
    if attention_mask is not None:
        return "an attention mask (a padded batch, or a pattern other than causal)"
    if dropout and dropout > 0.0:
        return f"attention dropout {dropout} (training with attn_pdrop/attention_dropout > 0)"
    for name in ("position_bias", "s_aux", "sinks", "softcap"):
        if kwargs.get(name) is not None:
            return f"{name} (the fused kernel has none)"
    dtypes = {query.dtype, key.dtype, value.dtype}
    if len(dtypes) > 1 or query.dtype not in runtime.FLOAT_DTYPES:
        return f"dtypes {sorted(map(str, dtypes))} (the kernel takes one of fp16, bf16, fp32)"
    kernel_devices = ("cuda", "cpu") if runtime.mode.INTERPRET else ("cuda",)
    if query.device.type not in kernel_devices:
        return f"tensors on {query.device}"
    head_dim = query.shape[-1]
    if key.shape[-1] != head_dim or value.shape[-1] != head_dim or head_dim > MAX_HEAD_DIM:
        return f"head dims q {head_dim}, k {key.shape[-1]}, v {value.shape[-1]}"
    if key.shape[1] == 0 or query.shape[1] % key.shape[1] != 0:
        return f"{query.shape[1]} query heads over {key.shape[1]} key/value heads"
    return None


def attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over :func:`triton_workshop.attention`: q (B, H, Nq, D),
    k and v (B, H_kv, Nk, D); returns ((B, Nq, H, D), None) like ``sdpa_attention_forward``, with
    which it shares its reading of ``is_causal`` (causal unless the module says otherwise, never
    for a single query, which sees the whole cache)."""
    reason = _unsupported(query, key, value, attention_mask, dropout, kwargs)
    if reason is not None:
        if reason not in _warned and not torch.compiler.is_compiling():
            _warned.add(reason)
            warnings.warn(
                f"attn_implementation={ATTN_IMPLEMENTATION!r}: a call with {reason} is computed "
                "by transformers' SDPA path", PatchWarning, stacklevel=2,
            )  # fmt: skip
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            is_causal=is_causal, **kwargs,
        )  # fmt: skip
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = bool(is_causal) and q_len > 1
    if causal and kv_len > q_len:
        # No mask and more keys than queries while causal: the prefill of an empty static cache,
        # whose keys past the queries are unused slots (as sdpa_attention_forward reads it).
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = attention(query, key, value, causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register ``"triton_workshop"`` with transformers' attention and mask interfaces (done on
    import; calling it again is harmless)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


register()


# --------------------------------------------------------------------------------------------
# Conv1D.
# --------------------------------------------------------------------------------------------
class Conv1D(_HFConv1D):
    """transformers' ``Conv1D`` (``y = x @ weight + bias``, weight (nx, nf)) computed by
    :func:`triton_workshop.linear` on the weight read transposed in place (no copy), with an
    optional fused activation (``None``, ``"relu"``, ``"leaky_relu"``, ``"gelu"``: tanh
    approximation). A subclass of transformers' class, so its ``isinstance`` checks hold."""

    def __init__(self, nf: int, nx: int, activation: str | None = None) -> None:
        check_activation(activation, 0.01)
        super().__init__(nf, nx)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_op(x, self.weight.t(), self.bias, self.activation)

    def __repr__(self) -> str:
        extra = f", activation={self.activation!r}" if self.activation else ""
        return f"Conv1D(nf={self.nf}, nx={self.nx}{extra}) [triton-workshop]"


#: The tanh-approximated GELUs of transformers.activations: what the matmul's "gelu" computes.
_GELU_TANH = tuple(
    cls
    for cls in (
        getattr(_hf_activations, "NewGELUActivation", None),
        getattr(_hf_activations, "GELUTanh", None),
        getattr(_hf_activations, "PytorchGELUTanh", None),
        getattr(_hf_activations, "FastGELUActivation", None),
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
        type(c_fc) is _HFConv1D
        and type(act) in _GELU_TANH
        and not _has_hooks(c_fc)
        and not _has_hooks(act)
    )


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that read ``config._attn_implementation`` to pick their attention."""
    return [
        m for m in model.modules()
        if type(m).__name__.endswith("Attention") and getattr(m, "config", None) is not None
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------
# patch_model.
# --------------------------------------------------------------------------------------------
def patch_model(
    model: nn.Module,
    *,
    layer_norm: bool = True,
    linear: bool = True,
    conv1d: bool = True,
    conv2d: bool = True,
    attention: bool = True,
) -> dict[str, int]:
    """Patch a transformers model in place (see the module docstring): returns the counts of
    :func:`triton_workshop.nn.patch` plus ``"conv1d"``; ``"attention"`` counts the attention
    modules now on ``attn_implementation="triton_workshop"``; ``fused["linear_activation"]``
    counts the GELUs fused into a Conv1D. Modules left as they were are in the result's
    ``skipped`` list and a :class:`~triton_workshop.nn.patch.PatchWarning`."""
    flags = {
        name: _check_flag(value, name)
        for name, value in (("layer_norm", layer_norm), ("linear", linear), ("conv1d", conv1d),
                            ("conv2d", conv2d), ("attention", attention))
    }  # fmt: skip
    register()
    gpt2_forward = _gpt2_mlp_forward()
    gelu_into: dict[int, nn.Module] = {}  # id(c_fc) -> its MLP

    def claim(name: str, module: nn.Module):
        if not flags["conv1d"]:
            return None
        if _gelu_fusible(module, gpt2_forward):
            gelu_into[id(module.c_fc)] = module
            return None  # the MLP itself stays; its c_fc comes next in named_modules()
        if type(module) is not _HFConv1D:
            if isinstance(module, _HFConv1D) and not isinstance(module, Conv1D):
                return "conv1d", None, f"{type(module).__qualname__} is a subclass of Conv1D"
            return None
        dtype, reason = _dtype_device(module)
        reason = reason or _dtype_reason(dtype)
        if reason:
            return "conv1d", None, reason
        activation = "gelu" if id(module) in gelu_into else None
        with torch.device("meta"):
            template = Conv1D(module.nf, module.nx, activation=activation)
        return "conv1d", [(module, template)], None

    kinds = [k for k in ("layer_norm", "linear", "conv2d") if flags[k]]
    if flags["attention"]:
        kinds.append("attention")  # torch.nn.MultiheadAttention, where a model has one
    plan = plan_patch(model, kinds=kinds, extra=claim)
    plan.counts.setdefault("conv1d", 0)

    swapped = {id(target): template for target, template, _, _ in plan.swaps}
    fused_mlps = [
        mlp for fc_id, mlp in gelu_into.items()
        if getattr(swapped.get(fc_id), "activation", None) == "gelu"
    ]  # fmt: skip
    plan.counts.fused["linear_activation"] += len(fused_mlps)

    if flags["attention"]:
        _set_attention(model, plan)
    counts = apply_plan(plan)
    for mlp in fused_mlps:
        mlp.act = nn.Identity()  # c_fc applies it now
    return counts


def _set_attention(model: nn.Module, plan) -> None:
    modules = _attention_modules(model)
    config = getattr(model, "config", None)
    if not modules or getattr(config, "_attn_implementation", None) == ATTN_IMPLEMENTATION:
        return  # nothing reads it, or it is set already (patching twice counts nothing new)
    if not isinstance(model, PreTrainedModel):
        plan.skip("", "attention", "not a transformers PreTrainedModel: set "
                  "attn_implementation='triton_workshop' on the model that owns the config")
        return
    try:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    except (ValueError, KeyError, ImportError, NotImplementedError) as exc:
        plan.skip("", "attention", f"transformers refused attn_implementation: {exc}")
        return
    plan.counts["attention"] += len(modules)
