"""``patch(model)``: swap torch's modules for triton-workshop's, in place, in one call.

::

    model = build_model().cuda()
    counts = triton_workshop.nn.patch(model)    # {'layer_norm': 25, 'linear': 49, ...}
    optimizer = torch.optim.AdamW(model.parameters())   # before or after: the same Parameters
    model = torch.compile(model)                # optional, after patch()

What is swapped (exact classes only; a subclass may compute something else, so it is listed):

========================================  ===========================================
``torch.nn.LayerNorm``                    :class:`triton_workshop.nn.LayerNorm`
``torch.nn.RMSNorm``                      :class:`triton_workshop.nn.RMSNorm`
``torch.nn.Linear`` (see below: only      :class:`triton_workshop.nn.Linear`
where a fusion removes work, by default)
``torch.nn.Conv2d`` (``padding_mode``     :class:`triton_workshop.nn.Conv2d`
``"zeros"``)
``torch.nn.MultiheadAttention`` (packed   :class:`PatchedMultiheadAttention`: triton-workshop's
in-projection, no ``add_bias_kv`` /       attention, and torch's computation for the calls the
``add_zero_attn``)                        fused path cannot take (masks, dropout while training)
========================================  ===========================================

and, inside a plain ``nn.Sequential`` (whose forward feeds each module's output to the next one
only), adjacent modules run fused: ``Linear`` then ``ReLU`` / ``LeakyReLU`` / ``GELU(approximate=
"tanh")`` as one matmul with the activation in its epilogue (the pre-activations never go to
memory); ``Linear`` [then such an activation] then ``nn.Dropout`` as one matmul with the
activation and the dropout in its epilogue (:func:`~triton_workshop.linear`'s ``dropout_p``: no
separate pass over the output, no mask kept for the backward), while the Dropout is in training
mode; in eval mode it is the identity and the Linear runs with its activation alone; and
``LayerNorm`` then ``Linear`` (not followed by an activation or a training Dropout) as
:func:`~triton_workshop.layer_norm_linear`. Linear+activation(+dropout) wins where both could
apply. Counted in the result's ``fused``: ``linear_activation``, ``linear_dropout`` (a chain that
ends in a Dropout, with or without an activation: what runs fused while training) and
``layer_norm_linear``. The modules themselves stay separate (each is a correct drop-in when called
alone, and the state_dict keeps its keys); the Sequential decides at each call, and runs them one
by one when a hook sits on any of them.

**Which Linears.** A module is swapped where a fusion removes work or where the Triton kernel is
the faster one: norms, convolutions and attention always; a ``Linear`` only where something runs
fused with it (an activation in its epilogue, a LayerNorm before it, inside a Sequential as above).
A plain ``Linear`` with nothing to fuse is the same matmul either way, and cuBLAS runs it with less
host time a call, so it stays on torch, listed in ``skipped`` (with ``policy=True``; no warning).
``linear="always"`` swaps every ``Linear``; ``linear=True`` is the default ``"fused"`` rule;
``linear=False`` (or ``"never"``) swaps none. The rule is the same in interpreter mode, so that a
model patched on the CPU has the modules it would have on the GPU.

**Interpreter mode.** Without a GPU the kernels run in Triton's interpreter, 50-90x slower than
torch on the CPU: ``patch`` says so once a process in an :class:`InterpreterWarning` (a
:class:`PatchWarning`) the first time it puts a model on the kernels there.

**torch.nn.TransformerEncoder.** Its eval-mode fast path packs a padded batch into a nested
tensor, which the swapped attention cannot read: an encoder whose layers' attention is swapped
is kept off that path (``use_nested_tensor = False`` on the instance); its padding masks then go
to torch's attention (:class:`PatchedMultiheadAttention`) with the same result.

**In place, sharing everything.** A swapped module is the *same object*, turned into the new
class: its Parameters (so optimisers and tied weights), buffers, hooks, ``training`` flag, extra
attributes, and every reference to it (a module used at two places in the tree) carry over. The
state_dict keys do not change, so checkpoints load either way.

**What stays on torch, and why.** A module of a kind asked for that cannot be swapped keeps
working as before; it is listed, with the reason, in one :class:`PatchWarning` and in the
returned counts' ``skipped`` list: subclasses, dtypes the kernels do not take (float64, ...),
``padding_mode`` other than zeros, parameters split across devices, unsupported attention
configurations.

**Refused with an error, before anything changes** (never half a patch): a model that is not an
``nn.Module``; a model or submodule already compiled (``torch.compile``'s ``OptimizedModule``,
``module.compile()``) or scripted (patch first, then compile); parameters on several kinds of
device (cpu and cuda, say); a model whose parameters are all on a device the kernels cannot read
(cpu without the interpreter: move it to the GPU first). Several CUDA devices work (each module
runs on its own). A meta-device model is patched (the modules carry over ``to_empty`` and
``load_state_dict(assign=True)``).
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Callable, Iterable

import torch
from torch import nn

from .. import runtime
from ..ops.layer_norm_linear import layer_norm_linear
from ..ops.matmul import linear as linear_op
from . import modules as tw
from .conv import Conv2d

#: The keys of the counts ``patch`` returns, always all present: modules swapped, per kind.
COUNT_KEYS = ("layer_norm", "rms_norm", "linear", "conv2d", "attention")
#: The keys of ``PatchCounts.fused``: chains that run fused inside a Sequential, per fusion
#: (``linear_dropout``: Linear → [activation] → Dropout, fused while the Dropout trains).
FUSION_KEYS = ("layer_norm_linear", "linear_activation", "linear_dropout")

_FLOAT_DTYPES = runtime.FLOAT_DTYPES

# nn.MultiheadAttention's out_proj: nn.Linear in all but name (no forward of its own).
_LINEAR_CLASSES = (nn.Linear, nn.modules.linear.NonDynamicallyQuantizableLinear)


#: The values of ``linear=``: True is "fused", False is "never".
LINEAR_POLICIES = ("fused", "always", "never")


class PatchWarning(UserWarning):
    """What ``patch`` left on torch (and why), and calls a patched module handed to torch."""


class InterpreterWarning(PatchWarning):
    """The patched model will run its kernels in Triton's interpreter (no GPU): correct, but
    50-90x slower than torch on the CPU. Said once a process."""


class PolicyReason(str):
    """A reason for leaving a module on torch that is a choice (cuBLAS is as fast or faster
    there), not a limitation: listed in ``skipped`` with ``policy=True``, not warned about."""


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A module ``patch`` left on torch: where it is, what it is, and why."""

    name: str
    kind: str
    reason: str
    #: True where the module was left by the ``linear=`` rule (a choice), not for a limitation.
    policy: bool = False

    def __str__(self) -> str:
        return f"{self.name or '<model>'} ({self.kind}): {self.reason}"


class PatchCounts(dict):
    """``dict[str, int]``: modules swapped per kind (:data:`COUNT_KEYS`). Two attributes say
    more: ``fused``, the adjacent chains that run fused inside Sequentials (:data:`FUSION_KEYS`;
    each swapped module of a chain is also counted as swapped), and ``skipped``, the list of
    :class:`Skipped` modules (also said in a :class:`PatchWarning`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fused: dict[str, int] = {key: 0 for key in FUSION_KEYS}
        self.skipped: list[Skipped] = []

    def __reduce__(self):  # pickles as a plain dict
        return (dict, (dict(self),))

    def describe(self) -> str:
        """One line: modules swapped per kind, then the pairs run fused."""
        text = ", ".join(f"{k} {v}" for k, v in self.items() if v)
        fused = ", ".join(f"{k} {v}" for k, v in self.fused.items() if v)
        return text + (f" (fused: {fused})" if fused else "")


# --------------------------------------------------------------------------------------------
# The modules patch swaps in that nn/ does not already have.
# --------------------------------------------------------------------------------------------
class PatchedMultiheadAttention(tw.MultiheadAttention):
    """:class:`triton_workshop.nn.MultiheadAttention` that hands the calls its fused path cannot
    take to torch's own ``nn.MultiheadAttention.forward`` on the same parameters (a
    ``key_padding_mask``, an ``attn_mask`` that is not the causal hint, dropout while training),
    saying so once per module and reason in a :class:`PatchWarning`. The rest runs in Triton."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        reason = None
        if key_padding_mask is not None:
            reason = "a key_padding_mask"
        elif attn_mask is not None and not is_causal:
            reason = "an attn_mask other than the causal hint"
        elif self.training and self.dropout > 0.0:
            reason = f"dropout={self.dropout} while training"
        if reason is None:
            return super().forward(
                query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal,
            )  # fmt: skip
        self._warn_fallback(reason)
        return nn.MultiheadAttention.forward(
            self, query, key, value, key_padding_mask, need_weights, attn_mask,
            average_attn_weights, is_causal,
        )  # fmt: skip

    def _warn_fallback(self, reason: str) -> None:
        if torch.compiler.is_compiling():
            return
        warned = self.__dict__.setdefault("_fallback_warned", set())
        if reason not in warned:
            warned.add(reason)
            warnings.warn(
                f"MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}) got "
                f"{reason}: torch's MultiheadAttention computes these calls (Triton's fused "
                "attention takes no masks other than causal, and no dropout)",
                PatchWarning,
                stacklevel=3,
            )


class FusedSequential(nn.Sequential):
    """``nn.Sequential`` that runs adjacent ``Linear`` → [activation] → [``Dropout``] and
    ``LayerNorm`` → ``Linear`` chains of triton-workshop modules as one fused op (see the module
    docstring). Anything else, and any chain with a hook on one of its modules, runs module by
    module as ``nn.Sequential``."""

    def forward(self, input):
        steps = list(self._modules.values())
        i = 0
        while i < len(steps):
            module = steps[i]
            after = steps[i + 1] if i + 1 < len(steps) else None
            after_next = steps[i + 2] if i + 2 < len(steps) else None
            kinds = (_runtime_kind(module), _runtime_kind(after), _runtime_kind(after_next))
            fusion = _fusion(*kinds)
            if fusion in ("linear_activation", "linear_dropout"):
                activation, slope = (_ACTIVATIONS[type(after)](after)
                                     if kinds[1] == "activation" else (None, 0.01))
                length = _chain_length(fusion, kinds[1])
                dropout_p = float(steps[i + length - 1].p) if fusion == "linear_dropout" else 0.0
                input = linear_op(input, module.weight, module.bias, activation,
                                  leaky_relu_slope=slope, dropout_p=dropout_p)
                i += length
            elif fusion == "layer_norm_linear" and module.normalized_shape == (after.in_features,):
                input = layer_norm_linear(input, module.weight, module.bias, after.weight,
                                          after.bias, module.eps)
                i += 2
            else:
                input = module(input)
                i += 1
        return input


# --------------------------------------------------------------------------------------------
# Fusions inside a Sequential: one rule, used when planning (on the kinds modules will have) and
# at every call (on the kinds they have).
# --------------------------------------------------------------------------------------------
def _gelu_tanh(module):
    return ("gelu", 0.01) if module.approximate == "tanh" else (None, 0.0)


_ACTIVATIONS: dict[type, Callable[[nn.Module], tuple[str | None, float]]] = {
    nn.ReLU: lambda m: ("relu", 0.01),
    nn.LeakyReLU: lambda m: ("leaky_relu", float(m.negative_slope)),
    nn.GELU: _gelu_tanh,
}


def has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
    )  # fmt: skip


def _dropout_kind(module, planning: bool = False) -> str | None:
    """"dropout" for an ``nn.Dropout`` (exactly: its subclasses and the other dropouts draw other
    masks) that the matmul epilogue can take: 0 < p < 1, and training (when ``planning``, in
    either mode: the model may train later)."""
    if type(module) is not nn.Dropout or not 0.0 < module.p < 1.0:
        return None
    return "dropout" if planning or module.training else None


def _runtime_kind(module) -> str | None:
    """The part a module can play in a fusion now: "layer_norm", "linear" (no activation of its
    own), "activation" (one the matmul epilogue computes), "dropout" (a training one, see
    :func:`_dropout_kind`), or None."""
    if module is None or has_hooks(module):
        return None
    cls = type(module)
    if cls is nn.Dropout:
        return _dropout_kind(module)
    if cls is tw.LayerNorm:
        return "layer_norm" if len(module.normalized_shape) == 1 else None
    if cls is tw.Linear:
        return "linear" if module.activation is None else None
    if cls in _ACTIVATIONS and _ACTIVATIONS[cls](module)[0] is not None:
        return "activation"
    return None


def _fusion(kind: str | None, next_kind: str | None, kind_after: str | None) -> str | None:
    """Which fusion starts at a module of ``kind`` followed by ``next_kind`` then ``kind_after``.
    Linear → activation (→ dropout) wins over LayerNorm → Linear: it saves the wider tensor
    (the MLP's 4·E activations, written and read twice, and dropout's pass and mask) and
    ``layer_norm_linear`` has no epilogue beyond the bias."""
    if kind == "linear" and (next_kind == "dropout"
                             or (next_kind == "activation" and kind_after == "dropout")):
        return "linear_dropout"
    if kind == "linear" and next_kind == "activation":
        return "linear_activation"
    if kind == "layer_norm" and next_kind == "linear" and kind_after not in ("activation",
                                                                             "dropout"):
        return "layer_norm_linear"
    return None


def _chain_length(fusion: str, next_kind: str | None) -> int:
    """How many modules the fusion starting here takes: 3 for Linear → activation → Dropout."""
    return 3 if fusion == "linear_dropout" and next_kind == "activation" else 2


# --------------------------------------------------------------------------------------------
# Planning: every decision is taken, and every template built, before anything changes.
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    """What ``patch`` will do: ``swaps`` (module, template, kind, name), the Sequentials that
    become :class:`FusedSequential`, the TransformerEncoders taken off the nested-tensor path,
    and the counts (with ``skipped``)."""

    swaps: list = dataclasses.field(default_factory=list)
    sequentials: list = dataclasses.field(default_factory=list)
    encoders: list = dataclasses.field(default_factory=list)
    counts: PatchCounts = dataclasses.field(
        default_factory=lambda: PatchCounts({key: 0 for key in COUNT_KEYS})
    )

    def skip(self, name: str, kind: str, reason: str) -> None:
        policy = isinstance(reason, PolicyReason)
        self.counts.skipped.append(Skipped(name, kind, str(reason), policy))


def _kernel_device_types() -> tuple[str, ...]:
    return ("cuda", "cpu") if runtime.mode.INTERPRET else ("cuda",)


def _compiled_class():
    # Only a program that imported torch._dynamo can hold an OptimizedModule; importing it here
    # otherwise would cost seconds (and, before the mode decision, break the interpreter).
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def check_model(model) -> None:
    """The refusals of the module docstring: a ``TypeError``/``ValueError`` that says what to do,
    raised before anything is changed."""
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
    "linear": (_LINEAR_CLASSES, _plan_linear, (tw.Linear,)),
    "conv2d": ((nn.Conv2d,), _plan_conv2d, (Conv2d,)),
    "attention": ((nn.MultiheadAttention,), _plan_attention, (tw.MultiheadAttention,)),
}


def plan_patch(model: nn.Module, *, kinds: Iterable[str], extra=None, linear: str = "fused") -> Plan:
    """Decide every swap (see :func:`patch`); ``extra(name, module)`` may claim a module first:
    it returns None (not its business), ``(None, None, None)`` (its business: leave the module
    as it is, unlisted), or ``(kind, swaps, reason)`` (a :class:`PolicyReason` for a choice). ``linear`` is the rule for plain Linears (:data:`LINEAR_POLICIES`; only read
    when ``"linear"`` is among ``kinds``)."""
    check_model(model)
    if linear not in LINEAR_POLICIES:
        raise ValueError(f"linear must be one of {LINEAR_POLICIES}, got {linear!r}")
    kinds = set(kinds)
    plan = Plan()
    owned: list[str] = []  # prefixes of subtrees that belong to a module taken whole
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in owned):
            continue
        if isinstance(module, (nn.MultiheadAttention, tw.MultiheadAttention)):
            # Its out_proj is read by the attention's own forward, never called on its own:
            # it is swapped with the attention or not at all.
            owned.append(f"{name}." if name else "")
        decision = extra(name, module) if extra is not None else None
        if decision is None:
            decision = _decide(module, kinds)
        if decision is None:
            continue
        kind, swaps, reason = decision
        if kind is None:  # claimed by ``extra``: left as it is, not listed
            continue
        if reason is None:
            reason = next(filter(None, (_layout_mismatch(t, tpl) for t, tpl in swaps)), None)
        if reason is not None:
            plan.skip(name, kind, reason)
            continue
        plan.swaps.extend((target, template, kind, name) for target, template in swaps)
        plan.counts[kind] = plan.counts.get(kind, 0) + 1
    fused_ids = _plan_sequentials(model, plan)
    if linear == "fused":
        _keep_unfused_linears_on_torch(plan, fused_ids)
    _plan_encoders(model, plan)
    return plan


#: Why a plain Linear stays on torch under the default rule.
UNFUSED_LINEAR = PolicyReason(
    "a plain matmul with nothing fused into it: cuBLAS runs it as fast with less host time "
    "(linear='always' swaps it)"
)


def _keep_unfused_linears_on_torch(plan: Plan, fused_ids: set[int]) -> None:
    kept = []
    for swap in plan.swaps:
        target, _, kind, name = swap
        if kind == "linear" and id(target) not in fused_ids:
            plan.counts["linear"] -= 1
            plan.skip(name, "linear", UNFUSED_LINEAR)
        else:
            kept.append(swap)
    plan.swaps[:] = kept


def _plan_encoders(model: nn.Module, plan: Plan) -> None:
    """torch.nn.TransformerEncoders whose layers' attention becomes ours leave the nested-tensor
    fast path (see the module docstring)."""
    becoming = {id(target) for target, _, kind, _ in plan.swaps if kind == "attention"}
    for module in model.modules():
        if not isinstance(module, nn.TransformerEncoder) or not getattr(module, "use_nested_tensor", False):
            continue
        attentions = [getattr(layer, "self_attn", None) for layer in module.layers]
        if any(id(a) in becoming or isinstance(a, tw.MultiheadAttention) for a in attentions):
            plan.encoders.append(module)


def _decide(module: nn.Module, kinds: set[str]):
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


def _layout_mismatch(module: nn.Module, template: nn.Module) -> str | None:
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


def _plan_sequentials(model: nn.Module, plan: Plan) -> set[int]:
    """Plan the Sequentials that fuse; returns the ids of the modules in a fused chain."""
    in_pairs: set[int] = set()
    becomes = {id(target): type(template) for target, template, _, _ in plan.swaps}

    def planned_kind(module):
        if module is None or has_hooks(module):
            return None
        cls = becomes.get(id(module))
        if cls is None:
            return _dropout_kind(module, planning=True) or _runtime_kind(module)
        if cls is tw.LayerNorm:
            return "layer_norm" if len(module.normalized_shape) == 1 else None
        if cls is tw.Linear:
            return "linear"
        return None

    for module in model.modules():
        if type(module) not in (nn.Sequential, FusedSequential):
            continue
        steps = list(module._modules.values())
        fused = False
        i = 0
        while i < len(steps):
            kinds = [planned_kind(steps[j]) if j < len(steps) else None for j in (i, i + 1, i + 2)]
            fusion = _fusion(*kinds)
            if fusion == "layer_norm_linear" and (
                tuple(steps[i].normalized_shape) != (steps[i + 1].in_features,)
            ):
                fusion = None
            if fusion is None:
                i += 1
                continue
            # Counted when this patch makes it happen (patching twice counts nothing new).
            if type(module) is nn.Sequential or id(steps[i]) in becomes or id(steps[i + 1]) in becomes:
                plan.counts.fused[fusion] += 1
            length = _chain_length(fusion, kinds[1])
            in_pairs.update(id(step) for step in steps[i:i + length])
            fused = True
            i += length
        if fused and type(module) is nn.Sequential:
            plan.sequentials.append(module)
    return in_pairs


# --------------------------------------------------------------------------------------------
# Applying: pure attribute moves, nothing that can fail half-way.
# --------------------------------------------------------------------------------------------
#: A swapped module keeps these of its own (its state, its hooks); everything else comes from
#: the template (the attributes the new class's constructor sets).
_KEPT = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules", "training")


def _become(module: nn.Module, template: nn.Module) -> None:
    """Turn ``module`` into an instance of ``type(template)`` in place: the template's attributes,
    with the module's parameters, buffers, children, hooks, mode and extra attributes."""
    state = dict(template.__dict__)
    for key, value in module.__dict__.items():
        ours = state.get(key)
        if "hook" in key and isinstance(value, dict) and isinstance(ours, dict):
            # The module's own hook dicts stay (its RemovableHandles point at them), joined by
            # the hooks the new class's constructor registers (ids are global: no clashes).
            for hook_id, hook in ours.items():
                value.setdefault(hook_id, hook)
            state[key] = value
        elif key not in state or key in _KEPT or "hook" in key:
            state[key] = value
    module.__dict__.clear()
    module.__dict__.update(state)
    module.__class__ = type(template)


def apply_plan(plan: Plan) -> PatchCounts:
    for module, template, _, _ in plan.swaps:
        _become(module, template)
    for sequential in plan.sequentials:
        sequential.__class__ = FusedSequential
    for encoder in plan.encoders:
        encoder.use_nested_tensor = False
    warn_skipped(plan.counts.skipped)
    warn_if_interpreted(bool(plan.swaps))
    return plan.counts


def warn_skipped(skipped: list[Skipped], stacklevel: int = 4) -> None:
    """One :class:`PatchWarning` naming the modules left on torch for a limitation (those left
    by choice, ``policy=True``, are in the list only)."""
    limited = [s for s in skipped if not s.policy]
    if limited:
        lines = "\n  ".join(str(s) for s in limited)
        warnings.warn(
            f"patch left {len(limited)} module(s) on torch (they work as before):\n  {lines}",
            PatchWarning,
            stacklevel=stacklevel,
        )


_interpreter_warning_given = False


def warn_if_interpreted(changed: bool, stacklevel: int = 4) -> None:
    """An :class:`InterpreterWarning`, once a process, when a model was just put on kernels that
    run in Triton's interpreter."""
    global _interpreter_warning_given
    if not changed or not runtime.mode.INTERPRET or _interpreter_warning_given:
        return
    _interpreter_warning_given = True
    warnings.warn(
        f"the patched model runs its kernels in Triton's interpreter ({runtime.mode.INTERPRET_REASON})"
        ": the results are right, but it runs 50-90x slower than torch on the CPU. On a machine "
        "with a GPU, move the model there (model.to('cuda')) and patch it there",
        InterpreterWarning,
        stacklevel=stacklevel,
    )


def check_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def linear_policy(value) -> str:
    """``linear=`` as one of :data:`LINEAR_POLICIES`: True is "fused", False is "never"."""
    if isinstance(value, bool):
        return "fused" if value else "never"
    if not isinstance(value, str):
        raise TypeError(f"linear must be a bool or one of {LINEAR_POLICIES}, got {type(value).__name__}")
    if value not in LINEAR_POLICIES:
        raise ValueError(f"linear must be a bool or one of {LINEAR_POLICIES}, got {value!r}")
    return value


def patch(
    model: nn.Module,
    *,
    layer_norm: bool = True,
    rms_norm: bool = True,
    linear: bool | str = True,
    conv2d: bool = True,
    attention: bool = True,
) -> dict[str, int]:
    """Swap ``model``'s ``torch.nn.LayerNorm``, ``RMSNorm``, ``Linear``, ``Conv2d`` and
    ``MultiheadAttention`` modules (each kind unless its flag is False) for triton-workshop's, in
    place, and fuse adjacent pairs inside ``nn.Sequential`` s (see the module docstring).

    ``linear``: ``True`` / ``"fused"`` (the default) swaps the Linears that run fused with a
    neighbour, ``"always"`` every Linear, ``False`` / ``"never"`` none.

    Returns the modules swapped per kind (``{"layer_norm": n, "rms_norm": n, "linear": n,
    "conv2d": n, "attention": n}``) as a :class:`PatchCounts` ``dict`` whose ``fused`` attribute
    counts the pairs that run fused and whose ``skipped`` attribute lists the modules left on
    torch, with the reason (those left for a limitation are also named in a
    :class:`PatchWarning`). Raises ``TypeError``/``ValueError`` before changing anything for the
    models it refuses (compiled, scripted, split across device kinds, on a device the kernels
    cannot read). Patching twice changes nothing the second time.
    """
    policy = linear_policy(linear)
    flags = {
        "layer_norm": check_flag(layer_norm, "layer_norm"),
        "rms_norm": check_flag(rms_norm, "rms_norm"),
        "linear": policy != "never",
        "conv2d": check_flag(conv2d, "conv2d"),
        "attention": check_flag(attention, "attention"),
    }
    plan = plan_patch(model, kinds=[kind for kind, on in flags.items() if on], linear=policy)
    return apply_plan(plan)
