"""The rule for fusions inside a Sequential: which adjacent modules run as one fused op.

One rule, used when ``patch`` plans (on the kinds the modules will have) and at every call of a
:class:`~triton_workshop.nn.patch.FusedSequential` (on the kinds they have): ``Linear`` →
[activation] → [``Dropout``] as one matmul with its epilogue, and ``LayerNorm`` → ``Linear`` as
``layer_norm_linear``. A module with a hook takes part in no fusion (the hook must see it run).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from . import modules as tw


def _gelu_tanh(module):
    return ("gelu", 0.01) if module.approximate == "tanh" else (None, 0.0)


#: The activations the matmul epilogue computes: class -> (its name there, leaky_relu's slope);
#: a name of None where this instance computes something else (an exact GELU).
ACTIVATIONS: dict[type, Callable[[nn.Module], tuple[str | None, float]]] = {
    nn.ReLU: lambda m: ("relu", 0.01),
    nn.LeakyReLU: lambda m: ("leaky_relu", float(m.negative_slope)),
    nn.GELU: _gelu_tanh,
}


def has_hooks(module: nn.Module) -> bool:
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
    )  # fmt: skip


def dropout_kind(module, planning: bool = False) -> str | None:
    """"dropout" for an ``nn.Dropout`` (exactly: its subclasses and the other dropouts draw other
    masks) that the matmul epilogue can take: 0 < p < 1, and training (when ``planning``, in
    either mode: the model may train later)."""
    if type(module) is not nn.Dropout or not 0.0 < module.p < 1.0:
        return None
    return "dropout" if planning or module.training else None


def runtime_kind(module) -> str | None:
    """The part a module can play in a fusion now: "layer_norm", "linear" (no activation of its
    own), "activation" (one the matmul epilogue computes), "dropout" (a training one, see
    :func:`dropout_kind`), or None."""
    if module is None or has_hooks(module):
        return None
    cls = type(module)
    if cls is nn.Dropout:
        return dropout_kind(module)
    if cls is tw.LayerNorm:
        return "layer_norm" if len(module.normalized_shape) == 1 else None
    if cls is tw.Linear:
        return "linear" if module.activation is None else None
    if cls in ACTIVATIONS and ACTIVATIONS[cls](module)[0] is not None:
        return "activation"
    return None


def fusion_starting(kind: str | None, next_kind: str | None, kind_after: str | None) -> str | None:
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


def chain_length(fusion: str, next_kind: str | None) -> int:
    """How many modules the fusion starting here takes: 3 for Linear → activation → Dropout."""
    return 3 if fusion == "linear_dropout" and next_kind == "activation" else 2
