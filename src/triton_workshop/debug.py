"""Debug helpers for writing kernels.

In interpreter mode (``TRITON_INTERPRET=1``, or automatically with no GPU) a kernel body is plain
Python run once per program, so ordinary ``print`` and ``breakpoint`` work inside it. With a grid
of hundreds of programs that is a flood; ``print_if`` and ``breakpoint_if`` act only in the
programs whose ids match a condition::

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
        pid = tl.program_id(0)
        offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        print_if(f"offsets = {offsets}", "=1")       # only program 1 prints
        breakpoint_if(">2")                           # stop in programs 3, 4, ...

Conditions are comma-separated, one per grid axis, each an operator and a number:
``"=0"`` (axis 0 is 0), ``",>1"`` (axis 1 greater than 1), ``">=1,<3"``, ``"!=0"``; an empty entry
matches anything. On a compiled GPU kernel these Python calls are not available: use
``tl.device_print`` / ``tl.static_print`` there.
"""

from __future__ import annotations

import operator
import pdb
import sys

import torch

from . import runtime

_OPS = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


# Ceiling division, how many blocks of ``d`` cover ``n`` elements (the grid size): the library's own.
cdiv = runtime.cdiv
ceiling_divide = cdiv


def _as_int(pid) -> int:
    """A program id as a Python int, whether given as an int, a list ``[pid]`` (the notebook
    convention), a numpy array or an interpreter ``tl.tensor``."""
    if isinstance(pid, (list, tuple)):
        pid = pid[0]
    handle = getattr(pid, "handle", None)
    if handle is not None and hasattr(handle, "data"):
        pid = handle.data
    try:
        return int(pid.item() if hasattr(pid, "item") else pid)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"program id must be an integer, got {pid!r}") from exc


def _current_pids() -> tuple[int, int, int]:
    """The ids of the program the interpreter is running now."""
    if not runtime.INTERPRET:
        raise RuntimeError(
            "print_if/breakpoint_if read program ids in interpreter mode only "
            "(run with TRITON_INTERPRET=1); in a compiled kernel use tl.device_print"
        )
    from triton.runtime import interpreter

    # The interpreter leaves the last program's ids behind after a launch, so "inside a kernel"
    # is told by the call stack: an interpreter frame below us.
    frame, inside = sys._getframe(1), False
    while frame is not None and not inside:
        inside = frame.f_code.co_filename == interpreter.__file__
        frame = frame.f_back
    grid_idx = getattr(interpreter.interpreter_builder, "grid_idx", None)
    if not inside or grid_idx is None:
        raise RuntimeError("print_if/breakpoint_if must be called inside a running kernel "
                           "(or given pid_0/pid_1/pid_2)")
    return tuple(int(i) for i in grid_idx)  # type: ignore[return-value]


def _parse(conds: str) -> list[tuple[str, int] | None]:
    parsed: list[tuple[str, int] | None] = []
    for cond in conds.replace(" ", "").split(","):
        if cond == "":
            parsed.append(None)
            continue
        op = next((o for o in (">=", "<=", "!=", "==", "=", "<", ">") if cond.startswith(o)), None)
        if op is None:
            raise ValueError(
                f"condition {cond!r}: must start with one of =, !=, <, <=, >, >= (e.g. '=0' or ',>1')"
            )
        try:
            parsed.append((op, int(cond[len(op):])))
        except ValueError:
            raise ValueError(f"condition {cond!r}: expected a whole number after {op!r}") from None
    if len(parsed) > 3:
        raise ValueError(f"conditions {conds!r}: at most 3 (one per grid axis), got {len(parsed)}")
    return parsed


def test_pid_conds(conds: str, pid_0=None, pid_1=None, pid_2=None) -> bool:
    """True when the program ids satisfy ``conds`` (see the module docstring).

    Ids not given are read from the running interpreter program.
    """
    parsed = _parse(conds)
    given = (pid_0, pid_1, pid_2)
    # Read the running program's ids only for an axis that has a condition but no id given.
    needs_lookup = any(c is not None and p is None for c, p in zip(parsed, given))
    current = _current_pids() if needs_lookup else (0, 0, 0)
    pids = [_as_int(p) if p is not None else c for p, c in zip(given, current)]
    return all(c is None or _OPS[c[0]](pid, c[1]) for c, pid in zip(parsed, pids))


test_pid_conds.__test__ = False  # its name starts with "test"; keep pytest from collecting it


def print_if(txt, conds: str = "", pid_0=None, pid_1=None, pid_2=None) -> None:
    """Print ``txt`` only in the programs whose ids satisfy ``conds``."""
    if test_pid_conds(conds, pid_0, pid_1, pid_2):
        print(txt)


def breakpoint_if(conds: str = "", pid_0=None, pid_1=None, pid_2=None) -> None:
    """Drop into pdb only in the programs whose ids satisfy ``conds``."""
    if test_pid_conds(conds, pid_0, pid_1, pid_2):
        pdb.Pdb().set_trace(sys._getframe(1))


def check_tensors_gpu_ready(*tensors: torch.Tensor) -> None:
    """Raise a clear ``ValueError`` unless every tensor is contiguous and where kernels can read
    it: on a CUDA device, or (interpreter mode only) on the CPU."""
    for i, t in enumerate(tensors):
        name = f"tensor {i}"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(
                f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) is not contiguous: "
                "call .contiguous() first, or pass its strides to the kernel"
            )
        runtime.check_kernel_device(t, name)
