"""``patch_model``'s plan for the transformers modules it recognises: RMSNorms, gated MLPs, layers.

What :mod:`.families` and :mod:`.decoder` recognise, turned into entries of the plan: a change to
apply (a per-instance class) and a count, or a ``skipped`` entry with the reason (a dtype the
kernels do not take, a forward replaced on the instance, code that is none of those known here,
mixture-of-experts experts). Nothing here changes a module; ``patch_model`` applies the changes
after ``nn.patch``'s swaps.
"""

from __future__ import annotations

import torch

from ... import runtime
from ...nn.patch import LEFT_TO_INDUCTOR, dtype_device, dtype_reason
from . import decoder, families


def plan_module(name, module, flags, plan, changes, norms: set[int]) -> None:
    """Plan the transformers-specific change of one module (RMSNorm, gated MLP, experts); the ids
    of the RMSNorms put on the kernel go into ``norms``."""
    if families.patched_kind(module) is not None:
        return  # patched before: nothing new
    recipe = families.norm_recipe(module)
    if recipe is not None or type(module).__name__.endswith("RMSNorm"):
        if not flags["rms_norm"]:
            return
        if flags["compiled"]:  # Inductor fuses it with the add before it and its casts
            plan.skip(name, "rms_norm", LEFT_TO_INDUCTOR)
            return
        dtype, reason = dtype_device(module)
        reason = reason or families.forward_replaced(module) or dtype_reason(
            dtype, runtime.FLOAT_DTYPES + (torch.float64,))  # fmt: skip
        if recipe is None:
            reason = "its code is none of the RMSNorms known here (Llama's, Gemma's, GPT-OSS's)"
        if reason:
            plan.skip(name, "rms_norm", reason)
            return
        changes.append(lambda: families.patch_rms_norm(module, recipe))
        plan.counts["rms_norm"] += 1
        norms.add(id(module))
        return
    if not flags["mlp"]:
        return
    mlp, reason = families.mlp_recipe(module)
    if mlp is None and reason is None:
        if type(module).__name__.endswith("Experts"):
            plan.skip(name, "swiglu", "mixture-of-experts experts: their gated matmuls stay on torch")
        return
    dtype, dtype_why = dtype_device(module)
    reason = reason or dtype_why or families.forward_replaced(module) or dtype_reason(dtype)
    if reason:
        plan.skip(name, mlp.glu if mlp else "swiglu", reason)
        return
    changes.append(lambda: families.patch_mlp(module, mlp))
    plan.counts[mlp.glu] += 1


def plan_decoder_layers(model, plan, changes, norms: set[int], compiled: bool = False) -> None:
    """The decoder layers whose residual add runs in the RMSNorm after it (see :mod:`.decoder`):
    where the layer's forward is known and that norm is on the kernel (``norms``, or from an
    earlier patch_model). ``compiled``: the norms were left to Inductor by choice, and their
    adds with them."""
    for name, layer in model.named_modules():
        if families.patched_kind(layer) is not None:
            continue
        recipe, reason = decoder.layer_recipe(layer)
        if recipe is None and reason is None:
            continue
        if reason is None:
            norm = getattr(layer, recipe.norm_attr)
            if id(norm) not in norms and families.patched_kind(norm) != "rms_norm":
                reason = (LEFT_TO_INDUCTOR if compiled
                          else f"its {recipe.norm_attr} stays on torch")
        if reason:
            plan.skip(name, "add_rms_norm", reason)
            continue
        changes.append(lambda m=layer: decoder.patch_layer(m))
        plan.counts["add_rms_norm"] += 1
