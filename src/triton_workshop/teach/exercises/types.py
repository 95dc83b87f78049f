"""What an exercise is made of: :class:`Exercise` (its lesson and tasks), :class:`Task` (one
launcher the learner writes, its cases, its tiling and its suspects), :class:`Case` (inputs and
the reference), :class:`StretchTask` (an optional task past the core).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..diagnose.suspects import Suspect

__all__ = ["Case", "Exercise", "StretchTask", "Suspect", "Task", "is_stretch"]


@dataclass
class Case:
    label: str
    inputs: tuple
    reference: torch.Tensor
    kwargs: dict = field(default_factory=dict)
    dtype_note: str = ""
    tolerance: tuple[float, float] | None = None  # (rtol, atol) when the dtype's default is too loose
    block: tuple = ()  # the learner's tile sizes, set by the checker before suspects are asked
    constants: dict = field(default_factory=dict)  # the Task's constants, read from the module


@dataclass
class Task:
    """One launcher an exercise asks for."""

    function: str  # name of the launcher in the learner's module
    make_cases: Callable[[torch.Generator, torch.device], list[Case]]
    block_attrs: Sequence[str]  # module constants giving the tile each program owns
    default_block: Sequence[int]
    program_axes: Sequence[str]
    leading_axis: str | None = None  # a grid axis over the leading dim (channels), if any
    matmul_operands: bool = False
    suspects: Sequence[Suspect] = ()  # classic mistakes recognised by their output
    constants: Sequence[str] = ()  # more module constants the suspects need (case.constants)


@dataclass
class Exercise:
    number: int
    name: str
    title: str
    lesson: str
    tasks: list[Task]

    @property
    def stem(self) -> str:
        return f"exercise_{self.number}"


@dataclass
class StretchTask(Task):
    """An optional task past the core of an exercise: checked like any other, but an exercise
    whose core passes counts as done in ``workshop progress``."""


def is_stretch(task: Task) -> bool:
    return isinstance(task, StretchTask)
