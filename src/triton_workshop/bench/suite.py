"""The suite: every op family ``workshop bench`` measures, in the order it runs, and the names
that pick them (``workshop bench NAME``, ``layer-norm`` = ``layer_norm``).

A new spec module joins the suite by adding its ``SPEC`` to :data:`SPECS` (a plain tuple).
Whole models are a family of their own with their own options, ``workshop bench models``
(:mod:`.models`); :data:`MODELS` is its name here, listed with the others.
"""

from __future__ import annotations

from typing import Sequence

from . import (
    attention, conv, cross_entropy, elementwise, glu, image, layer_norm, matmul, rms_norm, rope,
    softmax,
)
from .spec import Spec

__all__ = ["MODELS", "SPECS", "SPEC_NAMES", "load_spec", "resolve_names"]

#: The suite, in the order it runs; ``workshop bench NAME`` picks specs by ``Spec.name``.
SPECS: tuple[Spec, ...] = (
    elementwise.SPEC,
    image.SPEC,
    softmax.SPEC,
    layer_norm.SPEC,
    rms_norm.SPEC,
    rope.SPEC,
    glu.SPEC,
    cross_entropy.SPEC,
    cross_entropy.LINEAR_SPEC,
    matmul.SPEC,
    conv.SPEC,
    attention.SPEC,
)
SPEC_NAMES = tuple(spec.name for spec in SPECS)

#: ``workshop bench models``: whole training steps, run on their own (not part of "all").
MODELS = "models"


def load_spec(name: str) -> Spec:
    """The suite's spec called ``name`` (KeyError if there is none)."""
    return {spec.name: spec for spec in SPECS}[name]


def resolve_names(names: Sequence[str]) -> list[str]:
    """Spec names as typed (``layer-norm`` = ``layer_norm``), in suite order; all when none."""
    if not names:
        return list(SPEC_NAMES)
    wanted = [n.strip().lower().replace("-", "_") for n in names]
    if MODELS in wanted:
        raise ValueError(f"{MODELS!r} runs on its own, with its own options: "
                         f"workshop bench {MODELS} [--quick] (see workshop bench {MODELS} --help)")
    unknown = [n for n, w in zip(names, wanted) if w not in SPEC_NAMES]
    if unknown:
        raise ValueError(
            f"unknown benchmark {', '.join(map(repr, unknown))}; valid names: "
            f"{', '.join((*SPEC_NAMES, MODELS))}"
        )
    return [n for n in SPEC_NAMES if n in wanted]
