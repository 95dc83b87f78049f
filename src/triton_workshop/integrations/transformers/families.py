"""What ``patch_model`` recognises in a transformers model, and the per-instance classes it gives
the modules it recognised.

**Recognised by what the code computes, not by name.** A module is taken only where its class's
forward is, instruction for instruction, one that this file knows the meaning of: the bytecode,
names and constants of transformers' own reference implementations (``LlamaRMSNorm.forward``,
``GemmaRMSNorm``, ``GptOssRMSNorm``, ``LlamaMLP.forward``, ``Phi3MLP.forward``, the three
``apply_rotary_pos_emb``). The families' copies (Mistral, Qwen2/3, Gemma 2/3, ...) match theirs
exactly; a class changed in a later transformers, or a user's subclass, does not match, and
stays on torch, listed.

**Per instance.** A recognised module gets a class made for it: a subclass of its own class with
the same name, module and qualified name (so ``isinstance``, transformers' registries keyed on
the class name, and ``repr`` see no difference) whose forward calls the kernel. Nothing is
changed in transformers' modules: another model of the same class is untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types
from typing import Callable

import torch
from torch import nn

from ...nn.patch import has_hooks

# The ops the patched forwards call, imported with the module rather than inside those forwards:
# torch 2.11's Dynamo cannot trace an import of a family package whose module class is the
# family's own (matmul's: it is "not a Python module" there).
from ...ops.glu import geglu, glu_halves, swiglu
from ...ops.matmul import autocast_linear
from ...ops.rms_norm import rms_norm
from ...ops.rope import rope


# --------------------------------------------------------------------------------------------
# Same code.
# --------------------------------------------------------------------------------------------
def _code_key(code: types.CodeType, doc: str | None = None):
    consts = tuple(
        _code_key(c) if isinstance(c, types.CodeType) else c
        for c in code.co_consts
        if not (doc is not None and c == doc)
    )  # fmt: skip
    return (code.co_code, code.co_names, consts, code.co_varnames, code.co_argcount,
            code.co_kwonlyargcount, code.co_freevars)  # fmt: skip


def same_code(func, reference) -> bool:
    """Whether ``func`` runs the instructions of ``reference`` (docstrings and line numbers
    aside): then it computes what ``reference`` computes, given the same globals."""
    func, reference = getattr(func, "__func__", func), getattr(reference, "__func__", reference)
    if not isinstance(func, types.FunctionType) or not isinstance(reference, types.FunctionType):
        return False
    return _code_key(func.__code__, func.__doc__) == _code_key(reference.__code__, reference.__doc__)


def _modeling(family: str):
    try:
        return importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ImportError:  # pragma: no cover - depends on the transformers version
        return None


def reference(family: str, *path: str):
    """``transformers.models.<family>.modeling_<family>.<path...>``, or None where the installed
    transformers lacks it."""
    obj = _modeling(family)
    for name in path:
        obj = getattr(obj, name, None)
    return obj


def _module_globals(cls: type) -> dict:
    return vars(importlib.import_module(cls.__module__))


# --------------------------------------------------------------------------------------------
# Per-instance classes.
# --------------------------------------------------------------------------------------------
#: Marks the classes made here: (their kind, the class they were made from).
PATCHED_ATTR = "_triton_workshop_patched"
#: What a class made here was built from: ``(members, args)`` (see :func:`give_class`).
_BUILT_FROM = "_triton_workshop_built_from"


@functools.lru_cache(maxsize=None)
def _subclass(cls: type, kind: str, members: Callable, args: tuple) -> type:
    namespace = dict(members(*args))
    namespace.update(__module__=cls.__module__, __qualname__=cls.__qualname__,
                     __reduce_ex__=_reduce_patched)
    namespace[PATCHED_ATTR] = (kind, cls)
    namespace[_BUILT_FROM] = (members, args)
    return type(cls.__name__, (cls,), namespace)


def patched_kind(module: nn.Module) -> str | None:
    """The kind of change a module already has from ``patch_model``, or None."""
    mark = getattr(type(module), PATCHED_ATTR, None)
    return mark[0] if mark else None


def original_class(module: nn.Module) -> type:
    """The class a module had before :func:`give_class` (the parent of its current class)."""
    return getattr(type(module), PATCHED_ATTR)[1]


def give_class(module: nn.Module, kind: str, members: Callable, *args) -> None:
    """Make ``module`` an instance of a subclass of its class with ``members(*args)`` (a dict of
    methods and constants) added; one such class per original class, members and args.
    ``members`` is a module-level function and ``args`` are picklable, so that a patched module
    pickles (``torch.save(model)``, a process spawned with it): as its original class and these,
    from which unpickling builds the same class again (:func:`_rebuild_patched`)."""
    module.__class__ = _subclass(type(module), kind, members, tuple(args))


def _reduce_patched(self, protocol):
    """Pickle (and deepcopy) a patched module as the importable class it was made from and the
    steps that made its class, not as the made class, which no import can find."""
    steps = []
    cls = type(self)
    while _BUILT_FROM in vars(cls):
        kind, parent = vars(cls)[PATCHED_ATTR]
        steps.append((kind, *vars(cls)[_BUILT_FROM]))
        cls = parent
    return _rebuild_patched, (cls, tuple(reversed(steps))), self.__getstate__()


def _rebuild_patched(cls: type, steps: tuple) -> nn.Module:
    """An empty instance of the class ``steps`` make from ``cls`` (its state is set next)."""
    for kind, members, args in steps:
        cls = _subclass(cls, kind, members, args)
    return cls.__new__(cls)


def forward_replaced(module: nn.Module) -> str | None:
    if "forward" in vars(module):
        return "its forward is replaced on the instance (a wrapper or hook library)"
    return None


# --------------------------------------------------------------------------------------------
# RMSNorm.
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NormRecipe:
    """How an RMSNorm class computes: the kernel's casting mode and weight offset, and the
    attribute that holds eps."""

    casting_mode: str
    weight_offset: float
    eps_attr: str


def _norm_references() -> list[tuple[type, NormRecipe]]:
    refs = [
        ("llama", "LlamaRMSNorm", NormRecipe("llama", 0.0, "variance_epsilon")),
        # (weight * x).to(dtype): all in fp32, one rounding at the end
        ("gpt_oss", "GptOssRMSNorm", NormRecipe("gemma", 0.0, "variance_epsilon")),
        ("gemma", "GemmaRMSNorm", NormRecipe("gemma", 1.0, "eps")),
    ]
    return [(cls, recipe) for family, name, recipe in refs
            if (cls := reference(family, name)) is not None]  # fmt: skip


def norm_recipe(module: nn.Module) -> NormRecipe | None:
    """The recipe of a transformers RMSNorm whose code is one of the references', else None."""
    cls = type(module)
    if not isinstance(getattr(module, "weight", None), torch.Tensor) or module.weight.dim() != 1:
        return None
    for norm_class, recipe in _norm_references():
        if not same_code(cls.forward, norm_class.forward):
            continue
        if hasattr(norm_class, "_norm") and not same_code(getattr(cls, "_norm", None),
                                                          norm_class._norm):  # fmt: skip
            continue
        if isinstance(getattr(module, recipe.eps_attr, None), (int, float)):
            return recipe
    return None


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    recipe = self._triton_workshop_recipe
    return rms_norm(
        hidden_states, self.weight.shape, self.weight, getattr(self, recipe.eps_attr),
        weight_offset=recipe.weight_offset, casting_mode=recipe.casting_mode,
    )  # fmt: skip


def _rms_norm_members(recipe: NormRecipe) -> dict:
    return dict(forward=_rms_norm_forward, _triton_workshop_recipe=recipe)


def patch_rms_norm(module: nn.Module, recipe: NormRecipe) -> None:
    give_class(module, "rms_norm", _rms_norm_members, recipe)


# --------------------------------------------------------------------------------------------
# Gated MLPs.
# --------------------------------------------------------------------------------------------
def _activation_glu(act: nn.Module) -> tuple[str, str | None] | None:
    """("swiglu", None) or ("geglu", approximate) for an activation the GLU kernels compute."""
    from transformers import activations as hf_act

    cls = type(act)
    if cls is nn.SiLU or cls is getattr(hf_act, "SiLUActivation", None):
        return "swiglu", None
    if cls is nn.GELU:
        return "geglu", act.approximate
    gelu_tanh = getattr(hf_act, "GELUTanh", None)
    if cls is gelu_tanh:
        fn = getattr(act, "act", None)
        if isinstance(fn, functools.partial) and fn.func is nn.functional.gelu:
            return ("geglu", "tanh") if fn.keywords == {"approximate": "tanh"} else None
        # the Python formula of the same tanh approximation (use_gelu_tanh_python=True)
        if getattr(fn, "__func__", None) is getattr(gelu_tanh, "_gelu_tanh_python", None):
            return "geglu", "tanh"
        return None
    if cls in tuple(filter(None, (getattr(hf_act, "NewGELUActivation", None),
                                  getattr(hf_act, "FastGELUActivation", None)))):  # fmt: skip
        return "geglu", "tanh"
    if cls is getattr(hf_act, "GELUActivation", None) and getattr(act, "act", None) is nn.functional.gelu:
        return "geglu", "none"
    return None


@dataclasses.dataclass(frozen=True)
class MLPRecipe:
    layout: str  # "gate_up_down" (Llama) or "fused_gate_up" (Phi-3)
    act_attr: str
    glu: str  # "swiglu" or "geglu"
    approximate: str | None

    @property
    def activation(self) -> str:
        """The gate's activation as :func:`~triton_workshop.ops.glu.glu_halves` names it."""
        if self.glu == "swiglu":
            return "silu"
        return "gelu_tanh" if self.approximate == "tanh" else "gelu"


def mlp_recipe(module: nn.Module) -> tuple[MLPRecipe | None, str | None]:
    """The recipe of a gated MLP whose forward is Llama's or Phi-3's, or (None, why not) for a
    module that looks like one but cannot be taken, or (None, None) for any other module."""
    cls = type(module)
    layouts = (("gate_up_down", reference("llama", "LlamaMLP"), "act_fn"),
               ("fused_gate_up", reference("phi3", "Phi3MLP"), "activation_fn"))  # fmt: skip
    for layout, mlp_class, act_attr in layouts:
        if mlp_class is None or not same_code(getattr(cls, "forward", None), mlp_class.forward):
            continue
        act = getattr(module, act_attr, None)
        if not isinstance(act, nn.Module):
            return None, f"its {act_attr} is not a module"
        if has_hooks(act) or has_hooks(module):
            return None, "a hook on the MLP or its activation would no longer run"
        glu = _activation_glu(act)
        if glu is None:
            return None, f"activation {type(act).__name__}: no fused GLU kernel computes it"
        return MLPRecipe(layout, act_attr, *glu), None
    return None, None


def _glu(recipe: MLPRecipe, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if recipe.glu == "swiglu":
        return swiglu(gate, up)
    return geglu(gate, up, approximate=recipe.approximate)


def _project(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)``; for a plain ``torch.nn.Linear`` with no hook and its class's forward, the
    same product through :func:`~triton_workshop.autocast_linear`, whose backward under
    autocast writes the fp32 weight's gradient in fp32 from the GEMM (no cast pass). The module
    itself stays as it is (``patch`` keeps the Linears it leaves on torch unchanged)."""
    if type(linear) is nn.Linear and not has_hooks(linear) and "forward" not in vars(linear):
        return autocast_linear(x, linear.weight, linear.bias)
    return linear(x)


def _gated_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    recipe = self._triton_workshop_recipe
    gate, up = _project(self.gate_proj, x), _project(self.up_proj, x)
    return _project(self.down_proj, _glu(recipe, gate, up))


def _fused_gate_up_mlp_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # The projection's two halves read in place, their gradient written as one tensor (a
    # chunk's backward would copy two together).
    gate_up = _project(self.gate_up_proj, hidden_states)
    return _project(self.down_proj, glu_halves(gate_up, self._triton_workshop_recipe.activation))


def _mlp_members(recipe: MLPRecipe) -> dict:
    forward = _gated_mlp_forward if recipe.layout == "gate_up_down" else _fused_gate_up_mlp_forward
    return dict(forward=forward, _triton_workshop_recipe=recipe)


def patch_mlp(module: nn.Module, recipe: MLPRecipe) -> None:
    give_class(module, recipe.glu, _mlp_members, recipe)


# --------------------------------------------------------------------------------------------
# RoPE: the attention's forward with its module's apply_rotary_pos_emb replaced.
# --------------------------------------------------------------------------------------------
def _attention_dtype(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> torch.dtype | None:
    """The dtype the attention reads the rotated q and k in, where the rotation would write them
    wider: under autocast, q and k in the autocast dtype with transformers' fp32 cos/sin (the
    products promote to fp32, and every attention a model runs, ours or its own, casts them
    back to the autocast dtype first). The rotation then writes them in it: the same values the
    attention reads, half the bytes, no cast pass (the KV cache keeps them so). None elsewhere:
    the rotation's own dtype, as transformers'."""
    device_type = q.device.type
    if not torch.is_autocast_enabled(device_type):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    if q.dtype is dtype and k.dtype is dtype and (cos.dtype is not dtype or sin.dtype is not dtype):
        return dtype
    return None


def _rope_full_table(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' rotate-half ``apply_rotary_pos_emb`` (Llama's; Phi-3's partial rotary is
    the same call with a narrower table)."""
    return rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim,
                dtype=_attention_dtype(q, k, cos, sin))


def _rope_half_table(q, k, cos, sin, unsqueeze_dim=1):
    """GPT-OSS's ``apply_rotary_pos_emb``: its table holds each frequency once (head_dim / 2
    wide) and rotates the two halves; the same rotation as rotate-half over the table repeated."""
    return rope(q, k, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1),
                unsqueeze_dim=unsqueeze_dim, dtype=_attention_dtype(q, k, cos, sin))


def _rope_references() -> list[tuple[Callable, tuple[str, Callable], Callable]]:
    """(reference apply_rotary_pos_emb, (its helper's name, reference helper), our version)."""
    refs = []
    for family, helper, ours in (("llama", "rotate_half", _rope_full_table),
                                 ("phi3", "rotate_half", _rope_full_table),
                                 ("gpt_oss", "_apply_rotary_emb", _rope_half_table)):  # fmt: skip
        module = _modeling(family)
        if module is not None and hasattr(module, "apply_rotary_pos_emb"):
            refs.append((module.apply_rotary_pos_emb, (helper, getattr(module, helper)), ours))
    return refs


def rebind_globals(func: Callable, module_globals: dict, overrides: dict) -> Callable | None:
    """``func`` rebuilt so that the functions it runs that were defined in ``module_globals``
    (itself, or a function inside a decorator's closure) see ``overrides`` in place of those
    globals; None when none of them reads any of the names."""
    names = set(overrides)
    new_globals = {**module_globals, **overrides}

    def rebuilt(f):
        closure, changed = f.__closure__, False
        if closure:
            cells = []
            for cell in closure:
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    cells.append(cell)
                    continue
                new = rebuilt(value) if isinstance(value, types.FunctionType) else None
                cells.append(types.CellType(new) if new is not None else cell)
                changed |= new is not None
            closure = tuple(cells)
        reads = f.__globals__ is module_globals and names & set(f.__code__.co_names)
        if not reads and not changed:
            return None
        g = new_globals if f.__globals__ is module_globals else f.__globals__
        new = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, closure)
        new.__kwdefaults__ = f.__kwdefaults__
        new.__dict__.update(f.__dict__)
        new.__qualname__, new.__doc__, new.__module__ = f.__qualname__, f.__doc__, f.__module__
        return new

    return rebuilt(getattr(func, "__func__", func))


def attention_forward_with_rope(attention: nn.Module) -> Callable | None:
    """The attention class's forward, calling our RoPE, or None where it cannot be built."""
    return _forward_with_rope(type(attention))


@functools.lru_cache(maxsize=None)
def _forward_with_rope(cls: type) -> Callable | None:
    namespace = _module_globals(cls)
    theirs = namespace.get("apply_rotary_pos_emb")
    for reference_rope, (helper, reference_helper), ours in _rope_references():
        if same_code(theirs, reference_rope) and same_code(namespace.get(helper), reference_helper):
            return rebind_globals(cls.forward, namespace, {"apply_rotary_pos_emb": ours})
    return None


def _rope_members(cls: type) -> dict:
    forward = _forward_with_rope(cls)
    if forward is None:  # a module pickled under another transformers
        raise not_rebuilt(cls, "rope")
    return dict(forward=forward)


def not_rebuilt(cls: type, kind: str) -> RuntimeError:
    """The error of a patched module that cannot be unpickled here: its class has no recipe
    under the installed transformers."""
    return RuntimeError(
        f"a {cls.__qualname__} patched for {kind} cannot be loaded here: this transformers' "
        f"{cls.__qualname__} is not one patch_model knows; load the model with the transformers "
        "it was saved under, or save its state_dict and patch the model again")


def patch_rope(attention: nn.Module) -> None:
    """The attention's forward calling our RoPE (:func:`attention_forward_with_rope` says
    whether there is one)."""
    give_class(attention, "rope", _rope_members, type(attention))
