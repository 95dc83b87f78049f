"""Hugging Face transformers on triton-workshop's kernels: an attention implementation, and
``patch_model(model)``, one call for Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma 2/Gemma 3 (text),
Phi-3, GPT-OSS and GPT-2. Needs ``pip install transformers`` (an optional dependency: nothing
else in the package imports this module).

::

    import triton_workshop.integrations.transformers as tw_hf   # registers "triton_workshop"
    model = AutoModelForCausalLM.from_pretrained(...)           # or from_config
    counts = tw_hf.patch_model(model)   # {'rms_norm': 5, 'rope': 2, 'swiglu': 2, 'attention': 2,
                                        #  'cross_entropy': 1, 'add_rms_norm': 2, ...};
                                        # counts.skipped: what stayed

**Attention.** Importing this module registers ``"triton_workshop"`` with transformers'
``AttentionInterface`` (and, for the masks, :func:`attention_mask`: ``"sdpa"``'s mask builder,
which passes no mask when there is nothing but causality to mask, under torch.compile too), so
``attn_implementation="triton_workshop"`` works wherever ``"sdpa"`` does. The module's sliding
window, logit soft-capping (``softcap``), attention sinks (GPT-OSS's ``s_aux``), dropout and
padding reach the kernel's keywords: a mask is read back into ``causal`` / ``window`` /
``key_padding_mask`` and used only where those rebuild it exactly (a single query takes any mask
as a key mask). A call the kernel cannot take (a mask
pattern it cannot express, a feature this installation's kernel lacks, position biases, head dims
that differ, a mask under ``torch.compile``) is computed by the model's own implementation that
supports it, never one that drops a feature: transformers' SDPA path, or the model's eager
attention for soft-capping and sinks (which SDPA rejects or ignores). Each such reason is said
once in a :class:`~triton_workshop.nn.patch.PatchWarning`. Grouped-query attention runs natively.

**patch_model.** Per instance: nothing in transformers' modules changes, and another model of the
same class (even one built from the same config object: the patched model gets its own copy of
its config) computes as before. What it changes, each counted under its kind:

* ``rms_norm``: every RMSNorm whose code is Llama's, Gemma's (``1 + weight``) or GPT-OSS's, through
  :func:`~triton_workshop.ops.rms_norm.rms_norm` with that module's rounding; and
  ``torch.nn.RMSNorm``.
* ``add_rms_norm``: the decoder layers whose residual add runs in the RMSNorm that reads it,
  through :func:`~triton_workshop.ops.rms_norm.add_rms_norm` (one kernel writes the sum and the
  normalised sum; see :mod:`.decoder`): the add after the attention, in Llama's, Mistral's,
  Qwen2/3's, Gemma's, Phi-3's and GPT-OSS's layers with ``post_attention_layernorm``, in Gemma
  2/3's with ``pre_feedforward_layernorm``. Within a layer: the add after the MLP stays a torch
  op (the layer's output is the residual stream transformers records and checkpoints).
* ``rope``: the attention's ``apply_rotary_pos_emb`` (rotate-half, partial rotary, GPT-OSS's half
  table) through :func:`~triton_workshop.ops.rope.rope`, by giving the attention module a forward
  that calls ours. Under autocast, bf16/fp16 q and k with fp32 cos/sin are rotated into the
  autocast dtype (``rope(..., dtype=)``), the dtype every attention casts them to first.
* ``swiglu`` / ``geglu``: gated MLPs (Llama-style ``gate_proj``/``up_proj``/``down_proj``, Phi-3's
  fused ``gate_up_proj``) with the activation and product in one kernel; their plain Linears'
  products through :func:`~triton_workshop.autocast_linear` (the modules unchanged; one with a
  hook is called as it is). GPT-OSS's mixture of experts stays on torch (listed).
* ``cross_entropy``: the causal-LM loss when called with ``labels`` (see :mod:`.loss`; the output
  then has ``logits=None``; ``return_logits=True`` gives the model's own head, its logits' loss
  still on our kernel). Under ``compiled=True``, and for a model the fused loss cannot take
  (Gemma 2's soft-capped logits): the model's own head, the loss of its logits on
  :func:`~triton_workshop.ops.cross_entropy.cross_entropy`; under ``compiled=True`` the output
  with a loss has ``logits=None`` too (``return_logits=True`` keeps them), so that a compiled
  step's backward makes no zero gradient for logits it never used.
* ``attention``: the attention modules on ``attn_implementation="triton_workshop"``.
* ``layer_norm``, ``linear``, ``conv2d`` as :func:`triton_workshop.nn.patch` (same ``linear=``
  rule: a plain Linear stays on cuBLAS unless ``linear="always"``, under ``compiled=True`` as a
  :class:`~triton_workshop.nn.CublasLinear`), and ``conv1d``: GPT-2's
  ``Conv1D`` through :func:`triton_workshop.linear`, the MLP's GELU fused into ``c_fc``, and the
  residual dropouts (``resid_pdrop > 0``) of the MLP and the attention into their ``c_proj``'s
  epilogue while the model trains (``fused["linear_dropout"]``).

Modules recognised by what their code computes (:mod:`.families`); a module of a kind asked for
that cannot be taken is listed in the result's ``skipped`` and a ``PatchWarning``; in place, the
same Parameters and state_dict keys; compiled models refused before anything changes. A patched
model deep-copies and pickles (``torch.save(model)``, a process spawned with it) with its patch:
a module's class is saved as the transformers class it was made from, and loading makes it again.

Here: the attention implementation and ``patch_model`` itself; beside it, :mod:`.conv1d`
(GPT-2's Conv1D), :mod:`.module_plans` (the plan for RMSNorms, MLPs and decoder layers),
:mod:`.families`, :mod:`.decoder` and :mod:`.loss`.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import warnings

import torch
from torch import nn

try:
    import transformers  # noqa: F401
    from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "triton_workshop.integrations.transformers needs the transformers package "
        f"(pip install transformers): {exc}"
    ) from exc

from ... import runtime
from ...nn.patch import (
    PatchWarning,
    apply_plan,
    check_flag,
    conv2d_policy,
    layer_norm_policy,
    linear_policy,
    plan_patch,
    warn_if_interpreted,
)
from ...ops import attention as attention_ops
from ...ops.attention import MAX_HEAD_DIM, attention
from . import decoder, families, loss  # noqa: F401 - decoder: a name of the package, as before
from .conv1d import Conv1D, conv1d_claim
from .module_plans import plan_decoder_layers, plan_module

#: The name to pass as ``attn_implementation``.
ATTN_IMPLEMENTATION = "triton_workshop"

__all__ = ["ATTN_IMPLEMENTATION", "Conv1D", "attention_forward", "attention_mask", "patch_model",
           "register"]

#: The kinds ``patch_model`` counts, beyond :func:`triton_workshop.nn.patch`'s.
EXTRA_COUNT_KEYS = ("conv1d", "rope", "swiglu", "geglu", "cross_entropy", "add_rms_norm")


# --------------------------------------------------------------------------------------------
# Attention.
# --------------------------------------------------------------------------------------------
_warned: set[str] = set()


#: The keywords :func:`triton_workshop.attention` takes in this installation, read once (an
#: ``inspect.signature`` at every attention call cost tens of µs of the step's host time, and
#: torch.compile would trace through it).
_KERNEL_KEYWORDS = frozenset(inspect.signature(attention_ops.attention).parameters)


def kernel_keywords() -> frozenset[str]:
    """The keywords :func:`triton_workshop.attention` takes in this installation."""
    return _KERNEL_KEYWORDS


def _sinks(kwargs) -> torch.Tensor | None:
    return kwargs.get("s_aux") if kwargs.get("s_aux") is not None else kwargs.get("sinks")


def _unsupported(query, key, value, kwargs) -> str | None:
    """Why this call cannot take the fused kernel whatever its mask, or None."""
    if kwargs.get("position_bias") is not None:
        return "position_bias (the fused kernel has none)"
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


def _pattern(n_q: int, n_k: int, causal: bool, window: int | None, device) -> torch.Tensor | None:
    """The (Nq, Nk) keys each query sees under the kernel's ``causal`` (key j <= query i, the
    top-left alignment of SDPA's is_causal) and ``window`` (i - j < window), or None for all."""
    if not causal and window is None:
        return None
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    seen = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if causal:
        seen &= j <= i
    if window is not None:
        seen &= (i - j) < window
    return seen


def _read_mask(mask: torch.Tensor, batch: int, n_q: int, n_k: int, causal: bool, window):
    """``(causal, window, key_padding_mask)`` that rebuild ``mask`` (a boolean (B or 1, 1, Nq,
    Nk) mask, True = attend) exactly, or a reason why none does."""
    if mask.dtype != torch.bool:
        return f"a {mask.dtype} attention mask (the kernel reads boolean ones)"
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] not in (1, batch) or tuple(
        mask.shape[2:]) != (n_q, n_k):  # fmt: skip
        return f"an attention mask of shape {tuple(mask.shape)}"
    if torch.compiler.is_compiling():
        return "an attention mask under torch.compile (reading it back would break the graph)"
    rows = mask[:, 0]
    if n_q == 1:  # one query: any mask is a key mask
        padding, causal, window = rows[:, 0], False, None
    else:
        padding = rows.any(dim=1)  # the keys some query sees
        expected = padding[:, None, :]
        seen = _pattern(n_q, n_k, causal, window, mask.device)
        if seen is not None:
            expected = expected & seen
        if not torch.equal(rows, expected.expand_as(rows)):
            return "an attention mask the kernel's causal/window/key-padding cannot express"
    padding = None if bool(padding.all()) else padding.expand(batch, n_k)
    return causal, window, padding


def _kernel_arguments(query, key, value, attention_mask, dropout, is_causal, module, kwargs):
    """The kernel's (q, k, v, keywords) for this call, or a reason it cannot take it."""
    reason = _unsupported(query, key, value, kwargs)
    if reason is not None:
        return reason
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    keywords = {}
    if attention_mask is None:
        causal = bool(is_causal) and q_len > 1
        if causal and kv_len > q_len:
            # No mask and more keys than queries while causal: the prefill of an empty static
            # cache, whose keys past the queries are unused slots (as sdpa_attention_forward).
            key, value = key[:, :, :q_len], value[:, :, :q_len]
    else:
        read = _read_mask(attention_mask, query.shape[0], q_len, kv_len, bool(is_causal),
                          kwargs.get("sliding_window"))  # fmt: skip
        if isinstance(read, str):
            return read
        causal, window, padding = read
        if window is not None:
            keywords["window"] = int(window)
        if padding is not None:
            keywords["key_padding_mask"] = padding
    if kwargs.get("softcap") is not None:
        keywords["softcap"] = float(kwargs["softcap"])
    if _sinks(kwargs) is not None:
        keywords["sinks"] = _sinks(kwargs)
    if dropout:
        keywords["dropout_p"] = float(dropout)
    missing = sorted(set(keywords) - kernel_keywords())
    if missing:
        return f"{', '.join(missing)} (not a keyword of this installation's attention kernel)"
    return query, key, value, dict(keywords, causal=causal)


def _eager_for(module: nn.Module, kwargs):
    """The module's own eager attention where it computes every feature of the call, or None."""
    eager = vars(importlib.import_module(type(module).__module__)).get("eager_attention_forward")
    if eager is None:
        return None
    if kwargs.get("softcap") is not None and "softcap" not in inspect.signature(eager).parameters:
        return None
    sinks = _sinks(kwargs)
    if sinks is not None and not (sinks is getattr(module, "sinks", None)
                                  and "sinks" in eager.__code__.co_names):  # fmt: skip
        return None
    return eager


def _additive_mask(mask, query, key, is_causal):
    """What the eager attentions add to the scores: 0 where a key is seen, the dtype's minimum
    elsewhere, from sdpa_mask's boolean mask, or from SDPA's is_causal where no mask was built."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if mask is None:
        causal = is_causal and q_len > 1
        mask = _pattern(q_len, kv_len, causal, None, query.device)
        if mask is None:
            return None
    if mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.finfo(query.dtype).min)


def _fallback(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    if kwargs.get("softcap") is None and _sinks(kwargs) is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            is_causal=is_causal, **kwargs,
        )  # fmt: skip
    eager = _eager_for(module, kwargs)
    if eager is None:
        raise NotImplementedError(
            f"{type(module).__name__}: no implementation of this model computes this call with "
            "its soft-capping/sinks and the kernel cannot take it either"
        )
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    mask = _additive_mask(attention_mask, query, key, is_causal)
    return eager(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)


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
    call = _kernel_arguments(query, key, value, attention_mask, dropout, is_causal, module, kwargs)
    if isinstance(call, str):
        if call not in _warned and not torch.compiler.is_compiling():
            _warned.add(call)
            where = ("the model's eager attention" if kwargs.get("softcap") is not None
                     or _sinks(kwargs) is not None else "transformers' SDPA path")  # fmt: skip
            warnings.warn(
                f"attn_implementation={ATTN_IMPLEMENTATION!r}: a call with {call} is computed by "
                f"{where}", PatchWarning, stacklevel=2,
            )  # fmt: skip
        return _fallback(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                         kwargs)  # fmt: skip
    query, key, value, keywords = call
    out = attention(query, key, value, scale=scaling, **keywords)
    return out.transpose(1, 2).contiguous(), None


def _plain_causal(args, kwargs) -> bool:
    """Whether sdpa_mask is asked for nothing but causality over as many keys as queries: no
    padding mask, no window, the plain causal pattern, skipping allowed (what transformers' own
    skip tests, from the arguments alone, never from a tensor's values). Transformers passes
    every argument by keyword; a positional call is not read (the mask is built)."""
    if args:
        return False
    if "q_length" in kwargs:
        q_length = kwargs["q_length"]
    elif isinstance(kwargs.get("cache_position"), torch.Tensor):  # older transformers (5.17)
        q_length = kwargs["cache_position"].shape[0]
    else:
        return False
    return (kwargs.get("mask_function", causal_mask_function) is causal_mask_function
            and kwargs.get("attention_mask") is None and kwargs.get("local_size") is None
            and bool(kwargs.get("allow_is_causal_skip", True))
            and q_length == kwargs.get("kv_length"))  # fmt: skip


def attention_mask(*args, **kwargs) -> torch.Tensor | None:
    """The mask builder of ``"triton_workshop"``: ``sdpa_mask``, which builds no mask where
    causality is all there is to mask (the kernel's ``causal=True``), also while torch.compile
    traces the model. Transformers' own (5.17 on torch 2.11, for one) builds the full (B, 1, N, N)
    mask under compile, where it cannot read a padding mask's values; with no padding mask at all
    there is none to read, and the mask would only send the call to a masked SDPA (three times
    as slow as its causal kernel on an H200). torch.export keeps the mask: an exported graph is
    not re-specialised when its shapes change."""
    if torch.compiler.is_compiling() and not _exporting() and _plain_causal(args, kwargs):
        return None
    return sdpa_mask(*args, **kwargs)


def _exporting() -> bool:
    """Whether torch.export traces the call. Read from the flag export sets: inside a
    torch.compile trace, ``torch.compiler.is_exporting()`` is a constant True in some torch
    versions (2.11, for one). A torch without the flag counts as exporting: the mask is kept."""
    return bool(getattr(torch.compiler, "_is_exporting_flag", True))


def register() -> None:
    """Register ``"triton_workshop"`` with transformers' attention and mask interfaces (done on
    import; calling it again is harmless)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, attention_mask)


register()


# --------------------------------------------------------------------------------------------
# patch_model.
# --------------------------------------------------------------------------------------------
def _attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules that read ``config._attn_implementation`` to pick their attention."""
    return [
        (name, m) for name, m in model.named_modules()
        if type(m).__name__.endswith("Attention") and getattr(m, "config", None) is not None
    ]  # fmt: skip


def _always_falls_back(module: nn.Module) -> str | None:
    """A feature every call of this attention module has that the kernel here lacks."""
    needs = []
    if getattr(module, "attn_logit_softcapping", None) is not None:
        needs.append("softcap")
    if isinstance(getattr(module, "sinks", None), torch.Tensor):
        needs.append("sinks")
    missing = [n for n in needs if n not in kernel_keywords()]
    if missing:
        return (f"{', '.join(missing)}: not a keyword of this installation's attention kernel; "
                "the model's own attention computes it")  # fmt: skip
    return None


def _plan_attention(model, flags, plan, changes):
    """RoPE per attention module (into ``changes``); returns what sets the model's attention
    implementation, or None."""
    modules = _attention_modules(model)
    on_kernel = []
    for name, module in modules:
        if flags["rope"] and families.patched_kind(module) is None:
            forward = families.attention_forward_with_rope(module)
            if forward is not None and not families.forward_replaced(module):
                changes.append(lambda m=module: families.patch_rope(m))
                plan.counts["rope"] += 1
            elif "apply_rotary_pos_emb" in vars(importlib.import_module(type(module).__module__)):
                plan.skip(name, "rope", families.forward_replaced(module) or (
                    "its apply_rotary_pos_emb or its forward is none of those known here"))
        if flags["attention"]:
            reason = _always_falls_back(module)
            if reason:
                plan.skip(name, "attention", reason)
            else:
                on_kernel.append(module)
    if not flags["attention"] or not on_kernel:
        return None
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == ATTN_IMPLEMENTATION:
        return None  # set already (patching twice counts nothing new)
    if not isinstance(model, PreTrainedModel):
        plan.skip("", "attention", "not a transformers PreTrainedModel: set "
                  "attn_implementation='triton_workshop' on the model that owns the config")
        return None
    return lambda: _set_attention(model, plan, len(on_kernel))


def _own_config(model: PreTrainedModel) -> None:
    """Give ``model`` (and each submodule holding it or one of its sub-configs) its own copy of
    its config, so that setting its attention changes no other model built from that config."""
    memo: dict = {}
    fresh = copy.deepcopy(model.config, memo)
    for module in model.modules():
        for key, value in list(vars(module).items()):
            if isinstance(value, PretrainedConfig) and id(value) in memo:
                module.__dict__[key] = memo[id(value)]
    model.config = fresh


def _set_attention(model, plan, n_modules: int) -> None:
    previous = model.config
    _own_config(model)
    try:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    except (ValueError, KeyError, ImportError, NotImplementedError) as exc:
        plan.skip("", "attention", f"transformers refused attn_implementation: {exc}")
        model.config = previous
        return
    plan.counts["attention"] += n_modules


def patch_model(
    model: nn.Module,
    *,
    layer_norm: bool | str = True,
    rms_norm: bool = True,
    linear: bool | str = True,
    conv1d: bool = True,
    conv2d: bool | str = True,
    attention: bool = True,
    rope: bool = True,
    mlp: bool = True,
    cross_entropy: bool = True,
    add_rms_norm: bool = True,
    compiled: bool = False,
) -> dict[str, int]:
    """Patch a transformers model in place (see the module docstring): returns the counts of
    :func:`triton_workshop.nn.patch` plus ``conv1d``, ``rope``, ``swiglu``, ``geglu``,
    ``cross_entropy`` and ``add_rms_norm`` (decoder layers whose residual add runs in the
    RMSNorm after it: needs ``rms_norm`` too); ``attention`` counts the attention modules now on
    ``attn_implementation="triton_workshop"``; ``fused["linear_activation"]`` counts the GELUs
    fused into a Conv1D, ``fused["linear_dropout"]`` the residual dropouts (GPT-2's, p > 0)
    fused into one (applied while the model trains). ``linear`` as in ``nn.patch``: ``True``/``"auto"`` (default),
    ``"fused"``, ``"always"``, ``False``/``"never"``; it also rules GPT-2's Conv1D, whose tanh
    GELU (transformers' several-op GELU) and residual Dropouts run fused under "auto" too.
    ``layer_norm`` as in ``nn.patch``: by default (``"fused"``) a LayerNorm that runs on its own
    stays on torch (GPT-2's all do). Modules left as they were
    are in the result's ``skipped`` list (and, unless left by the ``linear`` rule, in a
    :class:`~triton_workshop.nn.patch.PatchWarning`). ``compiled=True``, for a model about to
    be compiled, leaves the norms that run on their own (RMSNorms, with their residual adds, and
    LayerNorms) on torch, where Inductor fuses them with the ops around them, as
    :func:`triton_workshop.nn.patch` does; they are listed in ``skipped``. Its loss is the
    model's own head, then :func:`~triton_workshop.ops.cross_entropy.cross_entropy` on the
    logits (the fused loss cannot be traced; see :mod:`.loss`)."""
    flags = {
        name: check_flag(value, name)
        for name, value in (("rms_norm", rms_norm),
                            ("conv1d", conv1d), ("attention", attention),
                            ("rope", rope), ("mlp", mlp), ("cross_entropy", cross_entropy),
                            ("add_rms_norm", add_rms_norm), ("compiled", compiled))
    }  # fmt: skip
    policy = linear_policy(linear)
    conv_policy = conv2d_policy(conv2d)
    norm_policy = layer_norm_policy(layer_norm)
    flags["layer_norm"] = norm_policy != "never"
    flags["conv2d"] = conv_policy != "never"
    register()
    claim, gelu_into, dropout_into = conv1d_claim(policy, flags["conv1d"])
    kinds = [k for k in ("layer_norm", "rms_norm", "conv2d") if flags[k]]
    if policy != "never":
        kinds.append("linear")
    if flags["attention"]:
        kinds.append("attention")  # torch.nn.MultiheadAttention, where a model has one
    plan = plan_patch(model, kinds=kinds, extra=claim, linear=policy, conv2d=conv_policy,
                      layer_norm=norm_policy, compiled=flags["compiled"])
    for key in EXTRA_COUNT_KEYS:
        plan.counts.setdefault(key, 0)

    swapped = {id(target): template for target, template, _, _ in plan.swaps}
    fused_mlps = [
        mlp for fc_id, mlp in gelu_into.items()
        if getattr(swapped.get(fc_id), "activation", None) == "gelu"
    ]  # fmt: skip
    plan.counts.fused["linear_activation"] += len(fused_mlps)
    fused_dropouts = [
        owner for c_proj_id, owner in dropout_into.items()
        if getattr(swapped.get(c_proj_id), "dropout_p", 0.0) > 0
    ]  # fmt: skip
    plan.counts.fused["linear_dropout"] += len(fused_dropouts)

    changes, norms = [], set()
    for name, module in model.named_modules():
        plan_module(name, module, flags, plan, changes, norms)
    if flags["rms_norm"] and flags["add_rms_norm"]:
        plan_decoder_layers(model, plan, changes, norms, flags["compiled"])
    set_attention = _plan_attention(model, flags, plan, changes)
    if flags["cross_entropy"] and hasattr(model, "lm_head") and families.patched_kind(model) is None:
        # The fused loss where it is exact and runs (eagerly), else the loss of the logits the
        # model makes, on our cross-entropy (under compile, or e.g. Gemma 2's capped logits).
        fused = not flags["compiled"] and loss.loss_reason(model) is None
        reason = None if fused else loss.logits_loss_reason(model)
        if reason:
            plan.skip("lm_head", "cross_entropy", reason)
        else:
            changes.append(lambda: loss.patch_loss(model) if fused else loss.patch_logits_loss(
                model, loss_only=flags["compiled"]))
            plan.counts["cross_entropy"] += 1

    # Applying: the attention setting first (transformers may refuse it: listed, before the
    # warning), then nn.patch's swaps, then the per-instance classes (over the swapped classes).
    if set_attention is not None:
        set_attention()
    counts = apply_plan(plan)
    for mlp_module in fused_mlps:
        mlp_module.act = nn.Identity()  # c_fc applies it now
    for owner, dropout in fused_dropouts:
        setattr(owner, dropout, nn.Identity())  # c_proj applies it now, while training
    for change in changes:
        change()
    warn_if_interpreted(bool(changes) or counts["attention"] > 0, stacklevel=3)
    return counts
