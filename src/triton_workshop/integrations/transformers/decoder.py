"""The residual add fused into the RMSNorm that reads it, inside transformers' decoder layers.

A Llama decoder layer computes

    h = x + self_attn(input_layernorm(x))
    out = h + mlp(post_attention_layernorm(h))

The add that makes ``h`` and the norm that reads it are one :func:`~triton_workshop.add_rms_norm`
here: one kernel reads the attention's output and the residual once and writes both ``h`` (the
next residual) and the normalised ``h``, where torch writes ``h`` and reads it back (one full
read and write of the hidden states saved per layer, forward and backward).

**Which layers.** As :mod:`.families` recognises modules: a layer is taken only where its class's
forward, decorators included, runs the instructions of one of transformers' reference layers:

* ``LlamaDecoderLayer``: Llama, Mistral, Qwen2, Qwen3 and Gemma have the same code; the add after
  the attention and ``post_attention_layernorm``;
* ``Phi3DecoderLayer``: the same add, of the attention's output after ``resid_attn_dropout``;
* ``GptOssDecoderLayer``: the same add (its MLP also returns the router's scores);
* ``Gemma2DecoderLayer`` (Gemma 3's is the same code): the add of the normalised attention output
  and ``pre_feedforward_layernorm``. ``post_feedforward_layernorm`` comes before its add (a norm,
  then an add: nothing for add_rms_norm to take), so it stays a norm of its own.

The add after the MLP is not fused with the next layer's ``input_layernorm``: a layer's output is
the residual stream itself, which transformers records (``output_hidden_states``), checkpoints
layer by layer and hands to the final norm; fusing across layers would change what a layer
returns.

**At call time** the layer fuses while the norm is still the RMSNorm that ``patch_model`` put on
the kernel (no hook, no forward of its own on the instance) and both terms have one dtype and
shape (under autocast the attention may return another dtype than the residual's: then the add
promotes, as torch's does, and the norm runs apart). The per-instance class keeps the layer's own
decorators (transformers' keyword deprecations) and gets gradient checkpointing as any subclass
of transformers' layers does.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import textwrap
import types
from typing import Callable

import torch
from torch import nn

from ...nn.patch import has_hooks
from ...ops.rms_norm import add_rms_norm
from . import families

#: The norms a fused add can feed, by attribute name (a layer with one and a forward not known
#: here is listed as left unfused).
NORM_ATTRS = ("post_attention_layernorm", "pre_feedforward_layernorm")


def add_then_norm(norm: nn.Module, x: torch.Tensor, residual: torch.Tensor):
    """``(norm(residual + x), residual + x)``: one add_rms_norm while ``norm`` is an RMSNorm on
    the kernel that can take this call; otherwise the add, then the norm's own call."""
    if (families.patched_kind(norm) == "rms_norm" and not has_hooks(norm)
            and families.forward_replaced(norm) is None and x.dtype == residual.dtype
            and x.shape == residual.shape):  # fmt: skip
        recipe = norm._triton_workshop_recipe
        return add_rms_norm(x, residual, norm.weight.shape, norm.weight,
                            getattr(norm, recipe.eps_attr), weight_offset=recipe.weight_offset,
                            casting_mode=recipe.casting_mode)  # fmt: skip
    total = residual + x
    return norm(total), total


# --------------------------------------------------------------------------------------------
# The fused forwards: transformers' own, line for line, but for the add and the norm after it.
# --------------------------------------------------------------------------------------------
def llama_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                        use_cache=False, position_embeddings=None, **kwargs):
    """LlamaDecoderLayer.forward (Mistral's, Qwen2's, Qwen3's, Gemma's)."""
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids,
        cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs,
    )  # fmt: skip
    hidden_states, residual = add_then_norm(self.post_attention_layernorm, hidden_states, residual)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states


def phi3_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                       use_cache=False, position_embeddings=None, **kwargs):
    """Phi3DecoderLayer.forward: Llama's with a dropout on each branch before its add."""
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids,
        cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs,
    )  # fmt: skip
    hidden_states, residual = add_then_norm(self.post_attention_layernorm,
                                            self.resid_attn_dropout(hidden_states), residual)
    hidden_states = self.mlp(hidden_states)
    return residual + self.resid_mlp_dropout(hidden_states)


def gpt_oss_layer_forward(self, hidden_states, attention_mask=None, position_ids=None,
                          cache=None, use_cache=False, position_embeddings=None, **kwargs):
    """GptOssDecoderLayer.forward: Llama's, with the MLP's router scores dropped."""
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids,
        cache=cache, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs,
    )  # fmt: skip
    hidden_states, residual = add_then_norm(self.post_attention_layernorm, hidden_states, residual)
    hidden_states, _ = self.mlp(hidden_states)
    return residual + hidden_states


def gemma2_layer_forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                         position_ids=None, cache=None, **kwargs):
    """Gemma2DecoderLayer.forward (Gemma 3's): the attention's output normalised, then added."""
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states, position_embeddings=position_embeddings,
        attention_mask=attention_mask, position_ids=position_ids, cache=cache, **kwargs,
    )  # fmt: skip
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states, residual = add_then_norm(self.pre_feedforward_layernorm, hidden_states, residual)
    hidden_states = self.mlp(hidden_states)
    hidden_states = self.post_feedforward_layernorm(hidden_states)
    return residual + hidden_states


@dataclasses.dataclass(frozen=True)
class LayerRecipe:
    """A recognised decoder layer: the norm after the fused add, and the class's forward with
    transformers' body replaced by the fused one (its decorators kept)."""

    norm_attr: str
    forward: Callable


#: (family, reference layer class, the norm after the fused add, the fused body).
_LAYERS = (
    ("llama", "LlamaDecoderLayer", "post_attention_layernorm", llama_layer_forward),
    ("phi3", "Phi3DecoderLayer", "post_attention_layernorm", phi3_layer_forward),
    ("gpt_oss", "GptOssDecoderLayer", "post_attention_layernorm", gpt_oss_layer_forward),
    ("gemma2", "Gemma2DecoderLayer", "pre_feedforward_layernorm", gemma2_layer_forward),
)


# --------------------------------------------------------------------------------------------
# Recognising a layer's forward through its decorators.
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _checkpointing_code() -> types.CodeType | None:
    """The code of the wrapper GradientCheckpointingLayer puts around every subclass's forward
    (a subclass made here gets its own, so the ones already there are left out of the chain)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # pragma: no cover - depends on the transformers version
        return None
    probe = type("Probe", (GradientCheckpointingLayer,), {"forward": lambda self: None})
    return probe.forward.__code__


def _decorator_chain(func) -> list[types.FunctionType] | None:
    """``[outermost decorator's wrapper, ..., the function written in the class]`` through
    ``__wrapped__``, less the gradient-checkpointing wrappers on the outside; None where a
    wrapper does not call the next one from its closure (it could not be rebuilt around ours)."""
    chain = []
    while func is not None:
        if not isinstance(func, types.FunctionType):
            return None
        chain.append(func)
        func = getattr(func, "__wrapped__", None)
    checkpointing = _checkpointing_code()
    while len(chain) > 1 and chain[0].__code__ is checkpointing:
        chain.pop(0)
    for wrapper, inner in zip(chain, chain[1:]):
        if not any(_cell_value(c) is inner for c in wrapper.__closure__ or ()):
            return None
    return chain


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _same_value(a, b) -> bool:
    if isinstance(a, types.FunctionType) or isinstance(b, types.FunctionType):
        return families.same_code(a, b)
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value that does not compare is not the same
        return False


def _same_chain(chain, reference_chain) -> bool:
    """The same decorators with the same arguments (their closures) around the same code."""
    if chain is None or reference_chain is None or len(chain) != len(reference_chain):
        return False
    for func, ref in zip(chain, reference_chain):
        if not families.same_code(func, ref):
            return False
        cells, ref_cells = func.__closure__ or (), ref.__closure__ or ()
        if not all(_same_value(_cell_value(a), _cell_value(b)) for a, b in zip(cells, ref_cells)):
            return False
    return True


def _rewrapped(chain: list, body: Callable) -> Callable:
    """``chain``'s decorators rebuilt around ``body`` in place of the function they wrapped."""
    new = body
    for wrapper, inner in zip(reversed(chain[:-1]), reversed(chain[1:])):
        closure = tuple(types.CellType(new) if _cell_value(c) is inner else c
                        for c in wrapper.__closure__)  # fmt: skip
        rebuilt = types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__,
                                     wrapper.__defaults__, closure)  # fmt: skip
        rebuilt.__kwdefaults__ = wrapper.__kwdefaults__
        rebuilt.__dict__.update(wrapper.__dict__)
        rebuilt.__wrapped__ = new
        rebuilt.__qualname__, rebuilt.__doc__ = body.__qualname__, body.__doc__
        rebuilt.__module__ = body.__module__
        new = rebuilt
    return new


@functools.lru_cache(maxsize=None)
def _class_recipe(cls: type) -> LayerRecipe | None:
    chain = _decorator_chain(getattr(cls, "forward", None))
    for family, name, norm_attr, body in _LAYERS:
        reference = families.reference(family, name)
        if reference is None or not _same_chain(chain, _decorator_chain(reference.forward)):
            continue
        body = body_for(body, tuple(inspect.signature(chain[-1]).parameters))
        if body is None:
            continue  # arguments of a transformers version not written for here
        return LayerRecipe(norm_attr, _rewrapped(chain, body))
    return None


#: The name transformers gave a layer's cache argument before it became ``cache``.
_OLD_CACHE_NAME = "past_key_values"


@functools.lru_cache(maxsize=None)
def body_for(body: Callable, names: tuple) -> Callable | None:
    """``body`` with the installed layer's argument names: as written (``cache``), or, for a
    transformers that still calls it ``past_key_values`` (5.17 and before: the same code under
    the old name, passed on to the attention under it too), the same source with that name;
    None for any other difference."""
    if list(inspect.signature(body).parameters) == list(names):
        return body
    if _OLD_CACHE_NAME not in names or "cache" in names:
        return None
    source = re.sub(r"\bcache\b", _OLD_CACHE_NAME, textwrap.dedent(inspect.getsource(body)))
    namespace: dict = {}
    exec(compile(source, inspect.getsourcefile(body), "exec"), body.__globals__, namespace)  # noqa: S102
    renamed = namespace[body.__name__]
    return renamed if list(inspect.signature(renamed).parameters) == list(names) else None


def layer_recipe(layer: nn.Module) -> tuple[LayerRecipe | None, str | None]:
    """The recipe of a decoder layer whose forward is one of the references', (None, why not)
    for a module that looks like one (a ``self_attn``, an ``mlp`` and a norm of
    :data:`NORM_ATTRS`, whatever its class's name) and cannot be taken, or (None, None) for any
    other module."""
    parts = ("self_attn", "mlp")
    if not all(isinstance(getattr(layer, a, None), nn.Module) for a in parts) or not any(
            isinstance(getattr(layer, a, None), nn.Module) for a in NORM_ATTRS):  # fmt: skip
        return None, None
    recipe = _class_recipe(type(layer))
    if recipe is None:
        return None, "its forward is none of the decoder layers known here (Llama's, Phi-3's, " \
                     "GPT-OSS's, Gemma 2's)"
    reason = families.forward_replaced(layer)
    norm = getattr(layer, recipe.norm_attr, None)
    if reason is None and (not isinstance(norm, nn.Module) or has_hooks(norm)
                           or families.forward_replaced(norm)):  # fmt: skip
        reason = f"a hook on its {recipe.norm_attr} (or its own forward) would no longer run"
    return (None, reason) if reason else (recipe, None)


def patch_layer(layer: nn.Module) -> None:
    """The layer's residual add fused into the norm after it (:func:`layer_recipe` says whether
    its class has a recipe)."""
    families.give_class(layer, "add_rms_norm", _layer_members, type(layer))


def _layer_members(cls: type) -> dict:
    """What :func:`patch_layer` adds to a layer of class ``cls`` (its recipe is the class's:
    rebuilt from the class alone when a pickled layer is loaded)."""
    recipe = _class_recipe(cls)
    if recipe is None:  # a layer pickled under another transformers
        raise families.not_rebuilt(cls, "add_rms_norm")
    return dict(forward=recipe.forward, _triton_workshop_recipe=recipe)
