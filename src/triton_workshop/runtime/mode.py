"""Interpreter or GPU, decided once, before any kernel is decorated.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` *decorates* a function, so the choice between
the interpreter and the GPU compiler has to be made before any kernel module is imported. It is made
here, on import (``triton_workshop/__init__.py`` imports the runtime first):

* the user set ``TRITON_INTERPRET=1``: interpreter, even on a GPU machine;
* no CUDA device: interpreter, set for the user, and said once on stderr;
* otherwise: kernels compile for the GPU.
"""

from __future__ import annotations

import os
import sys

import torch

_QUIET = os.environ.get("TRITON_WORKSHOP_QUIET", "") not in ("", "0")


def _decide_interpreter() -> tuple[bool, str]:
    flag = os.environ.get("TRITON_INTERPRET", "")
    if flag not in ("", "0"):
        return True, "TRITON_INTERPRET=1 is set"
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        return True, "no CUDA device found"
    return False, ""


INTERPRET, INTERPRET_REASON = _decide_interpreter()

#: The device new tensors should live on: the GPU when there is one (the interpreter reads CUDA
#: tensors too), the CPU otherwise.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

if INTERPRET and not _QUIET:
    print(
        f"triton-workshop: interpreter mode ({INTERPRET_REASON}): kernels run on the CPU through "
        "Triton's interpreter; results are exact, speed is not representative.",
        file=sys.stderr,
    )
def mode_description() -> str:
    if INTERPRET:
        return f"interpreter ({INTERPRET_REASON})"
    return f"GPU: {torch.cuda.get_device_name()}"

