"""Suspects: the classic mistakes of an exercise, each recognised by its output. A
:class:`Suspect` computes what a kernel with that one bug returns on a case's inputs; when the
learner's result matches it (and not the reference), the bug is named with its fix. The
per-exercise modules beside this one hold each exercise's suspects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ..verdict import Tolerance, close

if TYPE_CHECKING:
    from ..exercises.types import Case

__all__ = ["NAN", "Suspect", "learner_block", "match_suspects"]

NAN = float("nan")  # marks the elements a buggy kernel never writes (the checker's poison)


@dataclass(frozen=True)
class Suspect:
    """A classic mistake, recognised by its output: ``output(case)`` computes what a kernel with
    this bug would return on the case's inputs; when the learner's result matches it (and not
    the reference), the checker names the bug and gives ``advice``.

    ``describe(out, case)``, when given, says what is wrong in words computed from the output
    itself (a list of sentences, empty when it has nothing to say); it is asked whenever the
    output is wrong, whether or not the suspect matches."""

    name: str
    advice: str
    output: Callable[[Case], torch.Tensor]
    describe: Callable[[torch.Tensor, Case], list[str]] | None = None


def learner_block(case, axis: int, default: int) -> int:
    """The learner's tile size along ``axis`` (set on the case by the checker), else ``default``."""
    return int(case.block[axis]) if len(case.block) > axis else default


def _on_cpu(case):
    def cpu(x):
        return x.detach().cpu() if isinstance(x, torch.Tensor) else x

    try:
        return dataclasses.replace(case, inputs=tuple(cpu(x) for x in case.inputs),
                                   reference=cpu(case.reference))
    except TypeError:  # not a dataclass: use it as it is
        return case


def match_suspects(out, case, suspects: Sequence, tol: Tolerance) -> list[str]:
    """The suspects whose output ``out`` matches (and the reference does not). When none
    matches the whole output, one whose output matches every wrong element (and at least some of
    them are numbers, not holes) is named for that part."""
    if not isinstance(out, torch.Tensor) or case is None:
        return []
    out_c = out.detach().cpu()
    ref = case.reference.detach().cpu()
    case = _on_cpu(case)  # suspects compute on the CPU, whatever device the case ran on
    wrong = ~close(out_c, ref, tol)
    finite_wrong = wrong & torch.isfinite(out_c.double())
    found, partial, described = [], [], []
    for suspect in suspects:
        if suspect.describe is not None and bool(wrong.any()):
            try:
                described.extend(s for s in suspect.describe(out_c, case) if s not in described)
            except Exception:  # a description that does not apply to this case
                pass
        try:
            expected = suspect.output(case)
        except Exception:  # a suspect that does not apply to this case
            continue
        if expected is None or tuple(expected.shape) != tuple(out_c.shape):
            continue
        expected = expected.detach().cpu().to(out_c.dtype)
        same = close(out_c, expected, tol)
        differs = ~close(ref, expected, tol)
        if bool(same.all()) and bool(differs.any()):
            found.append(f"this looks like {suspect.name}: {suspect.advice}")
        elif not found and bool(finite_wrong.any()) and 2 * int(finite_wrong.sum()) >= int(wrong.sum()) \
                and bool(same[wrong].all()) and bool(differs[wrong].all()):
            partial.append(f"the wrong elements are what {suspect.name} gives: {suspect.advice}")
    return (found or partial[:1]) + described

