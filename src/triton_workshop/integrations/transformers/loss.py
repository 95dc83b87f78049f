"""The causal-LM loss through :func:`triton_workshop.ops.cross_entropy.linear_cross_entropy`:
``lm_head`` and the cross-entropy in one op that never writes the (tokens x vocabulary) logits.

The model's own forward still runs (its base model, its ``slice_logits_to_keep``, its extra
losses such as GPT-OSS's router loss); two per-instance changes reroute the last step only when
the call has ``labels``:

* ``lm_head`` (a subclass of its own class) hands back its input, the final hidden states,
  instead of computing the logits, and
* ``loss_function`` (a property of the model's per-instance class) computes transformers'
  ``ForCausalLMLoss`` from those hidden states and ``lm_head``'s weight: the same shift of the
  labels (or the given ``shift_labels``), ``ignore_index``, and ``num_items_in_batch`` (a sum
  divided by it, else a mean).

The output then carries ``logits=None``. Pass ``return_logits=True`` to the call (or patch with
``cross_entropy=False``) where the logits are wanted with the loss: that call takes the model's
own path. A call that torch.compile traces (below), and a model patched with ``compiled=True``,
give ``logits=None`` with a loss too, unless the call passes ``return_logits=True``: an output
of a compiled graph that requires grad gets a zero-filled gradient in its backward, for the
logits a tensor of their size where the step uses only the loss. The model's own path also
runs whenever this one would not be exact: no labels (generation), ``logits_to_keep`` set,
``return_dict=False``, a final-logit soft-capping in the config (Gemma 2/3: the loss of the
capped logits is not the loss of ``lm_head``'s), a loss function other than transformers'
``ForCausalLMLoss``, and a call that ``torch.compile`` traces: the rerouting changes modules in
the middle of the call, which it cannot trace.

Where the model's own path runs with ``ForCausalLMLoss``, its cross-entropy runs on
:func:`~triton_workshop.ops.cross_entropy.cross_entropy` (:func:`logits_loss`): the logits are
made by ``lm_head`` as usual and read once in their own dtype, without the fp32 copy that
``logits.float()`` makes. A model the fused path cannot take (:func:`loss_reason`: soft-capped
logits, a hook on ``lm_head``, ...) but whose forward is known gets that loss alone
(:func:`patch_logits_loss`), and so does every model under ``patch_model(model,
compiled=True)``, since under torch.compile the fused path never runs.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch
from torch import nn

from ...ops.cross_entropy import cross_entropy, linear_cross_entropy
from .families import give_class, original_class

#: (family, class) of the causal-LM heads whose forward is known to call ``lm_head`` once and pass
#: its result unchanged to ``loss_function`` (the soft-capping of Gemma 2/3 is checked per call).
CAUSAL_LM_CLASSES = (
    ("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"), ("gemma", "GemmaForCausalLM"),
    ("gemma2", "Gemma2ForCausalLM"), ("gemma3", "Gemma3ForCausalLM"), ("phi3", "Phi3ForCausalLM"),
    ("gpt_oss", "GptOssForCausalLM"), ("gpt2", "GPT2LMHeadModel"),
)  # fmt: skip


@functools.lru_cache(maxsize=None)
def _known_forwards() -> frozenset:
    forwards = set()
    for family, name in CAUSAL_LM_CLASSES:
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:  # pragma: no cover
            continue
        cls = getattr(module, name, None)
        if cls is not None:
            forwards.add(cls.forward)
    return frozenset(forwards)


#: transformers' ``ForCausalLMLoss`` under "loss", kept by :func:`_causal_lm_loss` (found at
#: patch time): a traced call reads a dict, not an import.
_CAUSAL_LM_LOSS: dict[str, object] = {}


def _causal_lm_loss():
    loss = _CAUSAL_LM_LOSS.get("loss")
    if loss is None:
        from transformers.loss.loss_utils import ForCausalLMLoss

        loss = _CAUSAL_LM_LOSS["loss"] = ForCausalLMLoss
    return loss


def loss_reason(model: nn.Module) -> str | None:
    """Why the loss of ``model`` cannot take the fused path, or None."""
    if type(model).forward not in _known_forwards():
        return (f"{type(model).__name__}'s forward is not one known to pass lm_head's output "
                "unchanged to its loss")  # fmt: skip
    lm_head = getattr(model, "lm_head", None)
    if not isinstance(lm_head, nn.Linear) and type(lm_head).__name__ != "Linear":
        return "lm_head is not a Linear"
    if has_forward_hooks(lm_head):
        return "a hook on lm_head would see no logits"
    if "forward" in vars(lm_head):
        return "lm_head's forward is replaced on the instance"
    if getattr(model.config, "final_logit_softcapping", None) is not None:
        return ("final_logit_softcapping: the loss is that of the capped logits, which "
                "linear_cross_entropy does not compute; the model's own loss runs")
    return None


def has_forward_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


class _Capture:
    """The hidden states lm_head received during one forward with labels."""

    def __init__(self) -> None:
        self.hidden: list[torch.Tensor] = []


def _lm_head_forward(self, input: torch.Tensor) -> torch.Tensor:
    capture = self.__dict__.get("_triton_workshop_capture")
    if capture is None:
        return original_class(self).forward(self, input)
    capture.hidden.append(input)
    return input.new_empty((*input.shape[:-1], 0))  # never read: loss_function takes `input`


def _fused_loss(lm_head: nn.Module, capture: _Capture):
    def loss_function(logits, labels, vocab_size: int, num_items_in_batch=None,
                      ignore_index: int = -100, shift_labels=None, **kwargs):  # fmt: skip
        if len(capture.hidden) != 1:
            raise RuntimeError(
                f"lm_head ran {len(capture.hidden)} times in one forward; the fused loss needs "
                "one call (patch with cross_entropy=False for this model)"
            )
        hidden = capture.hidden[0]
        targets = _shifted_targets(labels, shift_labels, ignore_index, hidden.device)
        loss = linear_cross_entropy(
            hidden.reshape(-1, hidden.shape[-1]), lm_head.weight, targets, lm_head.bias,
            ignore_index=ignore_index, reduction=_reduction(num_items_in_batch),
        )  # fmt: skip
        return _per_item(loss, num_items_in_batch)

    return loss_function


def logits_loss(logits, labels, vocab_size: int, num_items_in_batch=None,
                ignore_index: int = -100, shift_labels=None, **kwargs):  # fmt: skip
    """transformers' ``ForCausalLMLoss`` with its cross-entropy on
    :func:`~triton_workshop.ops.cross_entropy.cross_entropy`: the loss of the logits the model
    made, where the fused path does not run (a call that ``torch.compile`` traces, one that
    asks for the logits). The logits are read in their own dtype and the loss made in fp32, as
    transformers' ``logits.float()`` then ``F.cross_entropy`` make it, without that fp32 copy
    of the (tokens x vocabulary) logits."""
    targets = _shifted_targets(labels, shift_labels, ignore_index, logits.device)
    loss = cross_entropy(logits.view(-1, vocab_size), targets, ignore_index=ignore_index,
                         reduction=_reduction(num_items_in_batch), dtype=torch.float32)
    return _per_item(loss, num_items_in_batch)


def _shifted_targets(labels, shift_labels, ignore_index: int, device) -> torch.Tensor:
    """ForCausalLMLoss's targets: the labels shifted left by one (the last position ignored),
    or the given ``shift_labels``, flattened, on ``device``."""
    if shift_labels is None:
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    return shift_labels.reshape(-1).to(device)


def _reduction(num_items_in_batch) -> str:
    """ForCausalLMLoss's: a sum divided by ``num_items_in_batch`` where given, else a mean."""
    return "sum" if num_items_in_batch is not None else "mean"


def _per_item(loss: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    if num_items_in_batch is None:
        return loss
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _wants_fused_loss(model, bound: inspect.BoundArguments) -> bool:
    args = bound.arguments
    extra = args.get("kwargs", {})
    return (
        args.get("labels") is not None
        and not _nonzero(args.get("logits_to_keep", 0))
        and args.get("return_dict", extra.get("return_dict")) is not False
        and getattr(model.config, "return_dict", True) is not False
        and getattr(model.config, "final_logit_softcapping", None) is None
        and _original_loss_function(model) is _causal_lm_loss()
    )


def _nonzero(logits_to_keep) -> bool:
    if isinstance(logits_to_keep, torch.Tensor):
        return True
    return logits_to_keep != 0


#: original class -> the getter of its ``loss_function`` (a property in transformers), found at
#: patch time: called as a plain function, it is traced by torch.compile as the unpatched
#: model's own lookup is (``inspect`` and descriptor calls are not traceable).
_LOSS_GETTERS: dict[type, object] = {}


def _loss_getter(cls: type):
    descriptor = inspect.getattr_static(cls, "loss_function")
    if isinstance(descriptor, property):
        return descriptor.fget
    return lambda model: descriptor.__get__(model)


def _loss_getter_of(cls: type):
    """``cls``'s getter, kept in :data:`_LOSS_GETTERS` (found at patch time, or at the first
    eager call of a model patched elsewhere, e.g. unpickled)."""
    getter = _LOSS_GETTERS.get(cls)
    if getter is None:
        getter = _LOSS_GETTERS[cls] = _loss_getter(cls)
    return getter


def _original_loss_function(model):
    return _loss_getter_of(original_class(model))(model)


@functools.lru_cache(maxsize=None)
def _signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls.forward)


def _without_logits(out):
    """A model output with a loss as the fused path gives it: ``logits=None``."""
    return type(out)(**{key: value for key, value in out.items() if key != "logits"})


def _loss_only(out):
    """``out`` without its logits where it has a loss (a ModelOutput), else as it is. Under
    torch.compile that matters: an output of the compiled graph that requires grad gets a
    gradient in the backward, for the logits a zero-filled tensor of their size where the step
    uses only the loss."""
    if isinstance(out, dict) and out.get("loss") is not None:
        return _without_logits(out)
    return out


def _logits_loss_forward(self, *args, return_logits: bool = False, **kwargs):
    """The model's own forward (its head, the loss of its logits), its output with a loss
    carrying ``logits=None`` unless ``return_logits``: what ``patch_model(compiled=True)``
    gives a model's forward."""
    out = original_class(self).forward(self, *args, **kwargs)
    return out if return_logits else _loss_only(out)


def _causal_lm_forward(self, *args, return_logits: bool = False, **kwargs):
    base_forward = original_class(self).forward
    if return_logits:
        return base_forward(self, *args, **kwargs)
    if torch.compiler.is_compiling():
        # Traced by torch.compile: the model's own head, and its loss on the logits, which
        # Inductor compiles with the rest of the graph (the capture below changes modules
        # mid-call, which it cannot trace); with a loss, no logits, as below.
        return _loss_only(base_forward(self, *args, **kwargs))
    try:
        bound = _signature(original_class(self)).bind(self, *args, **kwargs)
    except TypeError:  # the model's own forward says what is wrong
        return base_forward(self, *args, **kwargs)
    if not _wants_fused_loss(self, bound):
        return base_forward(self, *args, **kwargs)
    capture = _Capture()
    lm_head = self.lm_head
    lm_head.__dict__["_triton_workshop_capture"] = capture
    self.__dict__["_triton_workshop_loss"] = _fused_loss(lm_head, capture)
    try:
        out = base_forward(self, *args, **kwargs)
    finally:
        lm_head.__dict__.pop("_triton_workshop_capture", None)
        self.__dict__.pop("_triton_workshop_loss", None)
    return _without_logits(out)


def _loss_function(self):
    fused = self.__dict__.get("_triton_workshop_loss")
    if fused is not None:
        return fused
    original = _original_loss_function(self)
    return logits_loss if original is _causal_lm_loss() else original


def _set_loss_function(self, value):
    inspect.getattr_static(original_class(self), "loss_function").__set__(self, value)


#: The patched model's ``loss_function``: :func:`_loss_function`, its setter writing through to
#: the original class's.
_LOSS_FUNCTION = property(_loss_function, _set_loss_function)


@functools.lru_cache(maxsize=None)
def _forward_for(cls: type, impl=_causal_lm_forward):
    """``impl`` (``_causal_lm_forward`` or ``_logits_loss_forward``) showing ``cls.forward``'s
    signature plus ``return_logits``: generate() reads the forward's parameters (it passes
    position_ids only to a forward that names them, which left-padded batches need)."""

    def forward(self, *args, return_logits: bool = False, **kwargs):
        return impl(self, *args, return_logits=return_logits, **kwargs)

    signature = _signature(cls)
    parameters = list(signature.parameters.values())
    extra = inspect.Parameter("return_logits", inspect.Parameter.KEYWORD_ONLY, default=False)
    at = next((i for i, p in enumerate(parameters) if p.kind is p.VAR_KEYWORD), len(parameters))
    forward.__signature__ = signature.replace(parameters=parameters[:at] + [extra] + parameters[at:])
    forward.__doc__ = cls.forward.__doc__
    return forward


def patch_loss(model: nn.Module) -> None:
    """The per-instance classes of the module docstring (checked by :func:`loss_reason`)."""
    _find_loss_functions(model)
    give_class(model.lm_head, "cross_entropy_head", _lm_head_members)
    give_class(model, "cross_entropy", _fused_loss_members, type(model))


def _lm_head_members() -> dict:
    return dict(forward=_lm_head_forward)


def _fused_loss_members(cls: type) -> dict:
    return dict(forward=_forward_for(cls), loss_function=_LOSS_FUNCTION)


def _logits_loss_members(cls: type, loss_only: bool) -> dict:
    members = dict(loss_function=_LOSS_FUNCTION)
    if loss_only:
        members["forward"] = _forward_for(cls, _logits_loss_forward)
    return members


def patch_logits_loss(model: nn.Module, *, loss_only: bool = False) -> None:
    """The loss of a model the fused path does not take, and of every model under
    ``patch_model(compiled=True)`` (checked by :func:`logits_loss_reason`): the model's own head
    and forward, and its ``ForCausalLMLoss`` as :func:`logits_loss`. ``loss_only`` (what
    ``compiled=True`` passes): the forward's output with a loss has ``logits=None``, as the
    fused path's, unless the call passes ``return_logits=True``."""
    _find_loss_functions(model)
    give_class(model, "cross_entropy_logits", _logits_loss_members, type(model), loss_only)


def logits_loss_reason(model: nn.Module) -> str | None:
    """Why the loss of ``model`` cannot run as :func:`logits_loss`, or None."""
    if type(model).forward not in _known_forwards():
        return (f"{type(model).__name__}'s forward is not one known to pass its logits to its "
                "loss_function")  # fmt: skip
    return None


def _find_loss_functions(model: nn.Module) -> None:
    """What :func:`_loss_function` reads, found now, untraced: torch.compile traces neither the
    property lookup of transformers' loss_function nor an import."""
    _loss_getter_of(type(model))
    _causal_lm_loss()
