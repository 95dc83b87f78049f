"""Interpreter or GPU, decided once, on import, whatever was imported first.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` *decorates* a function, so the choice between
the interpreter and the GPU compiler is made here, on import, before the package's kernel modules
are imported (``triton_workshop/__init__.py`` imports the runtime first):

* the user set ``TRITON_INTERPRET=1``: interpreter, even on a GPU machine;
* no CUDA device: interpreter, set for the user, and said once;
* otherwise: kernels compile for the GPU.

The notice is a warning of the ``triton_workshop`` logger (a logging record, not a print): with no
logging configured Python writes it to stderr as one line; an application's logging
configuration takes it like any other record. ``TRITON_WORKSHOP_QUIET=1``, or
``logging.getLogger("triton_workshop").setLevel(logging.ERROR)`` before the import, silences it.

Triton may have been imported already (``torch._dynamo``, torchvision, timm and transformers import
it), in which case its own jit helpers (``tl.cdiv``, ...) and any kernel decorated before this
point were made for the GPU. The decision still holds: in interpreter mode
:mod:`.launch` (the only module that reaches into Triton) runs those in the interpreter too.
:data:`TRITON_IMPORTED_FIRST` records whether that was the case.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

_QUIET = os.environ.get("TRITON_WORKSHOP_QUIET", "") not in ("", "0")
_log = logging.getLogger(__name__)  # a child of "triton_workshop": that logger's level applies


#: Whether Triton was imported before the mode was decided (by the user, or by torch._dynamo and
#: the libraries that import it): its jit functions decorated until then were made for the GPU.
TRITON_IMPORTED_FIRST = "triton" in sys.modules


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
    # WARNING, so that Python's last-resort handler shows it when the application configured no
    # logging (INFO would vanish there); a library adds no handler of its own.
    _log.warning(
        "triton-workshop: interpreter mode (%s): kernels run on the CPU through Triton's "
        "interpreter; results are exact, speed is not representative.", INTERPRET_REASON)


def mode_description() -> str:
    if INTERPRET:
        return f"interpreter ({INTERPRET_REASON})"
    return f"GPU: {torch.cuda.get_device_name()}"

