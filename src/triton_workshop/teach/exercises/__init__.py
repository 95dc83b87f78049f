"""The exercise registry: :data:`EXERCISES`, number -> :class:`Exercise`, parts one and two as data.

* :mod:`.types`: what an exercise is made of (Exercise, Task, Case, StretchTask);
* :mod:`.part_one`: exercises 1-5; :mod:`.part_two`: exercises 6-8.
"""

from ..diagnose.conv2d import FILTER_SUSPECTS
from ..diagnose.image_filters import GREYSCALE_SUSPECTS, SEPIA_SUSPECTS
from ..diagnose.matmul import MATMUL_SUSPECTS
from ..diagnose.softmax import SOFTMAX_SUSPECTS
from ..diagnose.vector_add import VECTOR_SUSPECTS
from ..references import (GREY_WEIGHTS, SEPIA_MATRIX, filter2d_reference, greyscale_reference,
                          matmul_reference, sepia_reference, softmax_reference)
from .part_one import FP16_ONE_ROUNDING, FP16_SOFTMAX_ONE_ROUNDING, PART_ONE, SOFTMAX_MAX_COLS
from .part_two import PART_TWO
from .types import Case, Exercise, StretchTask, Suspect, Task, is_stretch

EXERCISES: dict[int, Exercise] = {**PART_ONE, **PART_TWO}

__all__ = [
    "EXERCISES", "Case", "Exercise", "StretchTask", "Suspect", "Task", "is_stretch",
    "PART_ONE", "PART_TWO", "GREY_WEIGHTS", "SEPIA_MATRIX", "filter2d_reference",
    "greyscale_reference", "matmul_reference", "sepia_reference", "softmax_reference",
    "FP16_ONE_ROUNDING", "FP16_SOFTMAX_ONE_ROUNDING", "SOFTMAX_MAX_COLS",
    "VECTOR_SUSPECTS", "GREYSCALE_SUSPECTS", "SEPIA_SUSPECTS", "FILTER_SUSPECTS",
    "MATMUL_SUSPECTS", "SOFTMAX_SUSPECTS",
]
