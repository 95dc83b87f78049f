"""``patch(model)``: swap torch's modules for triton-workshop's, in place, in one call.

::

    model = build_model().cuda()
    counts = triton_workshop.nn.patch(model)    # {'attention': 12, 'rms_norm': 0, ...}: by kind
    optimizer = torch.optim.AdamW(model.parameters())   # before or after: the same Parameters
    model = torch.compile(model)                # optional, after patch()

A model that will be compiled is patched with ``patch(model, compiled=True)`` (see below).

What is swapped (exact classes only; a subclass may compute something else, so it is listed):

========================================  ===========================================
``torch.nn.LayerNorm`` (by default only   :class:`triton_workshop.nn.LayerNorm`
before a Linear it runs fused with)
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
``layer_norm_linear``. (By default, eagerly, a Linear followed by an activation alone is left on
torch, so that pair does not form: see "Which modules".) The modules themselves stay separate
(each is a correct drop-in when called alone, and the state_dict keeps its keys); the Sequential
decides at each call, and runs them one by one when a hook sits on any of them.

**Which modules.** A module is swapped where a fusion removes work or where the Triton kernel
made training steps faster: attention and RMSNorms always (an RMSNorm is several torch ops;
attention's kernel is the faster one); a ``LayerNorm`` only where it runs fused with the Linear
after it (on its own it is one torch kernel too, and in the GPT-2 training steps measured on an
H200 the faster Triton kernel saved less than the host time it added: eager 0.81x torch with
every LayerNorm swapped against 0.93x without at 4 x 512, 1.00x against 1.10x at 8 x 1024;
``layer_norm="always"`` swaps them all); no ``Conv2d`` by default (nothing
is fused into one, and cuDNN's convolutions won in a training step: ResNet-18 eager ran at 0.79x
torch with its NCHW convolutions swapped on an H200, and the benchmark's 3x3 rows had the Triton
kernel at 0.51x cuDNN NCHW and 0.60x NHWC on an H100; each stays on torch, listed in
``skipped``; ``conv2d="always"`` swaps them); a ``Linear`` only where something runs fused with
it (a training Dropout in its epilogue, with the activation before it, or a LayerNorm before
it, inside a Sequential as above). Eagerly, a Linear followed by an activation alone stays on
torch too: cuBLAS's product and torch's one activation kernel ran faster than the fused kernel,
whose backward recomputes the product to save memory (GPT-2 at 8 x 1024: 1.10x torch without
that fusion, 0.87x with it); under ``compiled=True`` it is fused (1.07x torch.compile with it,
1.03x without), and ``linear="fused"`` or ``"always"`` fuses it too.
A plain ``Linear`` with nothing to fuse is the same matmul either way, and cuBLAS runs it with less
host time a call, so it stays on torch, listed in ``skipped`` (with ``policy=True``; no warning).
``linear=True`` is the default ``"auto"`` rule (as above); ``"fused"`` swaps every Linear
that runs fused with a neighbour, eagerly too (a Linear and its activation alone included);
``linear="always"`` swaps every ``Linear``; ``linear=False`` (or ``"never"``) swaps none. A
swapped attention's projections follow the same rule: on cuBLAS (``F.linear``, its
``out_proj`` left torch's) unless ``linear="always"``. The rule is the same in interpreter
mode, so that a model patched on the CPU has the modules it would have on the GPU.

**Compiled models.** Under ``torch.compile`` Inductor writes its own kernel for a norm and fuses
the residual add before it and the casts around it into that kernel, which a separate Triton
kernel cannot join: in compiled training steps on an H200 the standalone norms on our kernels
made GPT-2 and a LLaMA slower, while attention and the fused Linear+GELU made them faster
(docs/results.md). ``compiled=True`` (for a model about to be compiled) leaves each LayerNorm and
RMSNorm that runs on its own on torch, listed in ``skipped``; the rest is swapped as usual. A plain
``torch.nn.Linear`` it leaves on cuBLAS becomes a :class:`~triton_workshop.nn.CublasLinear` (a
subclass with nothing added; still listed in ``skipped``, its products are cuBLAS's): under autocast
the gradient of its fp32 weight comes out of the GEMM in fp32, where autocast's backward rounds it
to bf16 and casts it back in a pass of its own (:func:`~triton_workshop.autocast_linear`: a
compiled LLaMA 1.5B training step on an H200 took 1.4 ms less, docs/results.md).

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

**Where it is done.** This module walks the model, plans every swap (:func:`plan_patch`) and then
applies the plan (:func:`apply_plan`); its neighbours hold the rest, and every name is importable
from here: :mod:`.swap_rules` (which module becomes which, the refusals), :mod:`.fusion` (the rule
for fusions in a Sequential), :mod:`.patch_report` (the counts, ``skipped``, the warnings) and
:mod:`.patched_attention`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Iterable

import torch
from torch import nn

from .. import runtime
from ..ops.layer_norm_linear import layer_norm_linear
from ..ops.matmul import linear as linear_op
from . import modules as tw
from .cublas_linear import CublasLinear
from .fusion import (
    ACTIVATIONS,
    chain_length,
    dropout_kind,
    fusion_starting,
    has_hooks,
    runtime_kind,
)
from .patch_report import (  # noqa: F401 - re-exported: the names patch's callers import from here
    COUNT_KEYS,
    FUSION_KEYS,
    InterpreterWarning,
    PatchCounts,
    PatchWarning,
    PolicyReason,
    Skipped,
    warn_skipped,
)
from .patched_attention import PatchedMultiheadAttention  # noqa: F401 - re-exported
from .swap_rules import (  # noqa: F401 - re-exported, as above
    check_model,
    decide,
    dtype_device,
    dtype_reason,
    layout_mismatch,
    tw_attention_max_head_dim,
)

#: The values of ``linear=``: True is "auto" ("fused", less a Linear followed by an activation
#: alone in an eager model), False is "never".
LINEAR_POLICIES = ("auto", "fused", "always", "never")
#: The values of ``conv2d=``: True is "auto", False is "never".
CONV2D_POLICIES = ("auto", "always", "never")
#: The values of ``layer_norm=``: True is "fused" (only the LayerNorms that run fused with the
#: Linear after them are swapped), False is "never"; "always" swaps every LayerNorm.
LAYER_NORM_POLICIES = ("fused", "always", "never")


# --------------------------------------------------------------------------------------------
# The Sequential that runs its fusions (the rule: .fusion).
# --------------------------------------------------------------------------------------------
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
            kinds = (runtime_kind(module), runtime_kind(after), runtime_kind(after_next))
            fusion = fusion_starting(*kinds)
            if fusion in ("linear_activation", "linear_dropout"):
                activation, slope = (ACTIVATIONS[type(after)](after)
                                     if kinds[1] == "activation" else (None, 0.01))
                length = chain_length(fusion, kinds[1])
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
# Planning: every decision is taken, and every template built, before anything changes.
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    """What ``patch`` will do: ``swaps`` (module, template, kind, name), the Sequentials that
    become :class:`FusedSequential`, the TransformerEncoders taken off the nested-tensor path,
    the Linears that become :class:`CublasLinear` (``retyped``), and the counts (with
    ``skipped``)."""

    swaps: list = dataclasses.field(default_factory=list)
    sequentials: list = dataclasses.field(default_factory=list)
    encoders: list = dataclasses.field(default_factory=list)
    #: (module, class) pairs: modules whose class becomes a subclass with no state of its own.
    retyped: list = dataclasses.field(default_factory=list)
    counts: PatchCounts = dataclasses.field(
        default_factory=lambda: PatchCounts({key: 0 for key in COUNT_KEYS})
    )

    def skip(self, name: str, kind: str, reason: str) -> None:
        policy = isinstance(reason, PolicyReason)
        self.counts.skipped.append(Skipped(name, kind, str(reason), policy))


def plan_patch(model: nn.Module, *, kinds: Iterable[str], extra=None, linear: str = "auto",
               conv2d: str = "auto", layer_norm: str = "fused", compiled: bool = False) -> Plan:
    """Decide every swap (see :func:`patch`); ``extra(name, module)`` may claim a module first:
    it returns None (not its business), ``(None, None, None)`` (its business: leave the module
    as it is, unlisted), or ``(kind, swaps, reason)`` (a :class:`PolicyReason` for a choice).
    ``linear`` is the rule for plain Linears (:data:`LINEAR_POLICIES`), ``conv2d`` the rule for
    Conv2ds (:data:`CONV2D_POLICIES`), ``layer_norm`` the rule for LayerNorms
    (:data:`LAYER_NORM_POLICIES`); each is read only when its kind is among ``kinds``.
    ``compiled``: the model will run under ``torch.compile``, so the norms that run on their own
    stay on torch for Inductor (:data:`LEFT_TO_INDUCTOR`); eagerly, under ``linear="auto"``, a
    Linear followed by an activation alone (no training Dropout) stays on torch
    (:data:`EAGER_LINEAR_ACTIVATION`)."""
    check_model(model)
    if linear not in LINEAR_POLICIES:
        raise ValueError(f"linear must be one of {LINEAR_POLICIES}, got {linear!r}")
    if conv2d not in CONV2D_POLICIES:
        raise ValueError(f"conv2d must be one of {CONV2D_POLICIES}, got {conv2d!r}")
    if layer_norm not in LAYER_NORM_POLICIES:
        raise ValueError(f"layer_norm must be one of {LAYER_NORM_POLICIES}, got {layer_norm!r}")
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
            decision = decide(module, kinds)
        if decision is None:
            continue
        kind, swaps, reason = decision
        if kind is None:  # claimed by ``extra``: left as it is, not listed
            continue
        if reason is None:
            reason = next(filter(None, (layout_mismatch(t, tpl) for t, tpl in swaps)), None)
        if reason is not None:
            plan.skip(name, kind, reason)
            continue
        plan.swaps.extend((target, template, kind, name) for target, template in swaps)
        plan.counts[kind] = plan.counts.get(kind, 0) + 1
    fused_ids, activation_only = _plan_sequentials(
        model, plan, fuse_activations=compiled or linear != "auto")
    if linear in ("auto", "fused"):
        _keep_on_torch(plan, "linear", lambda m: id(m) in activation_only, EAGER_LINEAR_ACTIVATION)
        if compiled:  # plain torch Linears: their autocast backward without the cast pass
            _keep_as_cublas_linears(plan, lambda m: id(m) not in fused_ids)
        _keep_on_torch(plan, "linear", lambda m: id(m) not in fused_ids, UNFUSED_LINEAR)
    if conv2d == "auto":
        _keep_on_torch(plan, "conv2d", lambda m: True, CUDNN_CONV)
    if layer_norm == "fused" or compiled:
        _keep_on_torch(plan, "layer_norm", lambda m: id(m) not in fused_ids,
                       LEFT_TO_INDUCTOR if compiled else UNFUSED_LAYER_NORM)
    if compiled:
        _keep_on_torch(plan, "rms_norm", lambda m: True, LEFT_TO_INDUCTOR)
    if linear != "always":
        _projections_on_cublas(plan)
    _plan_encoders(model, plan)
    return plan


def _projections_on_cublas(plan: Plan) -> None:
    """The swapped attentions' projections stay plain matmuls on cuBLAS, as a plain Linear does
    under every rule but ``linear='always'``: nothing is fused into them, and each of ours
    would cost more host time a call. Their out_proj stays torch's Linear."""
    kept = []
    for swap in plan.swaps:
        target, template, kind, name = swap
        if kind != "attention":
            kept.append(swap)
        elif isinstance(template, tw.MultiheadAttention):
            template.cublas_projections = True
            kept.append(swap)
        # else: the attention's out_proj, which stays as it is
    plan.swaps[:] = kept


#: Why, eagerly, a Linear followed by an activation alone stays on torch under the default rule.
EAGER_LINEAR_ACTIVATION = PolicyReason(
    "a Linear followed by an activation alone: eagerly, cuBLAS's product and torch's one "
    "activation kernel ran faster than the fused kernel, whose backward recomputes the product "
    "(GPT-2 training steps on an H200); fused under compiled=True or linear='fused'"
)


#: Why a plain Linear stays on torch under the default rule.
UNFUSED_LINEAR = PolicyReason(
    "a plain matmul with nothing fused into it: cuBLAS runs it as fast with less host time "
    "(linear='always' swaps it)"
)

#: Why a plain Linear of a model to compile stays on cuBLAS, and what it becomes.
CUBLAS_LINEAR = PolicyReason(
    "a plain matmul with nothing fused into it: cuBLAS runs it as fast (linear='always' swaps "
    "it); kept as a CublasLinear (compiled=True): under autocast its fp32 weight's gradient comes "
    "out of the GEMM in fp32, without a bf16 rounding and a cast pass"
)


def _keep_on_torch(plan: Plan, kind: str, stays, reason: PolicyReason) -> list[nn.Module]:
    """Take back the planned swaps of ``kind`` whose target ``stays(target)`` says to leave on
    torch, listing each in ``skipped`` with ``reason`` (a rule's choice, not a limitation);
    returns those targets."""
    kept, taken_back = [], []
    for swap in plan.swaps:
        target, _, swap_kind, name = swap
        if swap_kind == kind and stays(target):
            plan.counts[kind] -= 1
            plan.skip(name, kind, reason)
            taken_back.append(target)
        else:
            kept.append(swap)
    plan.swaps[:] = kept
    return taken_back


def _keep_as_cublas_linears(plan: Plan, stays) -> None:
    """:func:`_keep_on_torch` for the plain Linears of a model to compile: each
    ``torch.nn.Linear`` taken back becomes a :class:`CublasLinear` (a subclass stays as it
    is, and so does one already a CublasLinear)."""
    plan.retyped.extend((m, CublasLinear) for m in _keep_on_torch(
        plan, "linear", lambda m: stays(m) and type(m) in (nn.Linear, CublasLinear),
        CUBLAS_LINEAR))


#: Why a LayerNorm stays on torch under ``layer_norm="fused"``.
UNFUSED_LAYER_NORM = PolicyReason(
    "a LayerNorm with no Linear fused after it, under layer_norm='fused': its kernel is faster "
    "but costs more host time a call than torch's, which sets the pace of host-bound steps"
)


#: Why a norm that runs on its own stays on torch under ``compiled=True``.
LEFT_TO_INDUCTOR = PolicyReason(
    "left to torch.compile (compiled=True): Inductor fuses a norm with the adds and casts around "
    "it, which ran faster than a separate kernel in compiled training steps (GPT-2, LLaMA on an "
    "H200)"
)


#: Why a Conv2d stays on torch under the default rule.
CUDNN_CONV = PolicyReason(
    "cuDNN's convolution is the faster one in a training step (ResNet-18 eager: 0.79x torch with "
    "its NCHW convolutions on the Triton kernel, on an H200) and costs less host time a call "
    "(conv2d='always' swaps it)"
)


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


def _plan_sequentials(model: nn.Module, plan: Plan,
                      fuse_activations: bool = True) -> tuple[set[int], set[int]]:
    """Plan the Sequentials that fuse; returns the ids of the modules in a fused chain, and
    (without ``fuse_activations``) those of the Linears followed by an activation alone, whose
    fusion is not planned."""
    in_pairs: set[int] = set()
    activation_only: set[int] = set()
    becomes = {id(target): type(template) for target, template, _, _ in plan.swaps}

    def planned_kind(module):
        if module is None or has_hooks(module):
            return None
        cls = becomes.get(id(module))
        if cls is None:
            return dropout_kind(module, planning=True) or runtime_kind(module)
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
            fusion = fusion_starting(*kinds)
            if fusion == "layer_norm_linear" and (
                tuple(steps[i].normalized_shape) != (steps[i + 1].in_features,)
            ):
                fusion = None
            if fusion == "linear_activation" and not fuse_activations:
                activation_only.add(id(steps[i]))
                fusion = None
            if fusion is None:
                i += 1
                continue
            # Counted when this patch makes it happen (patching twice counts nothing new).
            if type(module) is nn.Sequential or id(steps[i]) in becomes or id(steps[i + 1]) in becomes:
                plan.counts.fused[fusion] += 1
            length = chain_length(fusion, kinds[1])
            in_pairs.update(id(step) for step in steps[i:i + length])
            fused = True
            i += length
        if fused and type(module) is nn.Sequential:
            plan.sequentials.append(module)
    return in_pairs, activation_only


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
    for module, cls in plan.retyped:
        module.__class__ = cls
    warn_skipped(plan.counts.skipped)
    warn_if_interpreted(bool(plan.swaps))
    return plan.counts


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


def _policy(value, name: str, policies: tuple) -> str:
    """``value`` of a rule argument as one of ``policies``: True is the first (the default
    rule), False is "never"."""
    if isinstance(value, bool):
        return policies[0] if value else "never"
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a bool or one of {policies}, got {type(value).__name__}")
    if value not in policies:
        raise ValueError(f"{name} must be a bool or one of {policies}, got {value!r}")
    return value


def conv2d_policy(value) -> str:
    """``conv2d=`` as one of :data:`CONV2D_POLICIES`: True is "auto", False is "never"."""
    return _policy(value, "conv2d", CONV2D_POLICIES)


def layer_norm_policy(value) -> str:
    """``layer_norm=`` as one of :data:`LAYER_NORM_POLICIES`: True is "fused", False is
    "never"."""
    return _policy(value, "layer_norm", LAYER_NORM_POLICIES)


def linear_policy(value) -> str:
    """``linear=`` as one of :data:`LINEAR_POLICIES`: True is "fused", False is "never"."""
    return _policy(value, "linear", LINEAR_POLICIES)


def patch(
    model: nn.Module,
    *,
    layer_norm: bool | str = True,
    rms_norm: bool = True,
    linear: bool | str = True,
    conv2d: bool | str = True,
    attention: bool = True,
    compiled: bool = False,
) -> dict[str, int]:
    """Swap ``model``'s ``torch.nn.LayerNorm``, ``RMSNorm``, ``Linear``, ``Conv2d`` and
    ``MultiheadAttention`` modules (each kind unless its flag is False) for triton-workshop's, in
    place, and fuse adjacent pairs inside ``nn.Sequential`` s (see the module docstring).

    ``linear``: ``True`` / ``"auto"`` (the default) swaps the Linears that run fused with a
    neighbour, eagerly less those followed by an activation alone (see below), ``"fused"`` all
    of those, ``"always"`` every Linear, ``False`` / ``"never"`` none. ``conv2d``: ``True`` /
    ``"auto"`` (the default) leaves every Conv2d on cuDNN (the faster one in a training step,
    listed in ``skipped``), ``"always"`` swaps every Conv2d, ``False`` / ``"never"`` none.
    ``layer_norm``: ``True`` / ``"fused"`` (the default) swaps the LayerNorms that run fused with
    the Linear after them (the others stay on torch, listed in ``skipped``: a LayerNorm on its
    own is one kernel in torch too, and its faster Triton kernel saved less than the host time
    it added in every GPT-2 training step measured; docs/results.md), ``"always"`` every
    LayerNorm, ``False`` / ``"never"`` none. Eagerly, ``linear="auto"`` leaves a Linear followed
    by an activation alone on torch too (cuBLAS and torch's one activation kernel ran faster
    than the fused kernel, whose backward recomputes the product); a Linear with a training
    Dropout after it (and an activation between) runs fused. ``compiled=True`` says the model will run under ``torch.compile``: each
    LayerNorm or RMSNorm that runs on its own then stays on torch (listed in ``skipped``), where
    Inductor fuses it with the residual add before it and the casts around it, faster than a
    separate kernel in compiled training steps; what Inductor cannot fuse as well (attention,
    Linear with an activation, the LayerNorm before a Linear) is swapped as usual.

    Returns the modules swapped per kind (``{"layer_norm": n, "rms_norm": n, "linear": n,
    "conv2d": n, "attention": n}``) as a :class:`PatchCounts` ``dict`` whose ``fused`` attribute
    counts the pairs that run fused and whose ``skipped`` attribute lists the modules left on
    torch, with the reason (those left for a limitation are also named in a
    :class:`PatchWarning`). Raises ``TypeError``/``ValueError`` before changing anything for the
    models it refuses (compiled, scripted, split across device kinds, on a device the kernels
    cannot read). Patching twice changes nothing the second time.
    """
    policy = linear_policy(linear)
    conv_policy = conv2d_policy(conv2d)
    norm_policy = layer_norm_policy(layer_norm)
    flags = {
        "layer_norm": norm_policy != "never",
        "rms_norm": check_flag(rms_norm, "rms_norm"),
        "linear": policy != "never",
        "conv2d": conv_policy != "never",
        "attention": check_flag(attention, "attention"),
    }
    plan = plan_patch(model, kinds=[kind for kind, on in flags.items() if on], linear=policy,
                      conv2d=conv_policy, layer_norm=norm_policy,
                      compiled=check_flag(compiled, "compiled"))
    return apply_plan(plan)
