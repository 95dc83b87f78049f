"""Running one case: the learner's launcher called on fresh inputs, and the verdict.

:func:`run_case` copies the inputs into guarded buffers and poisons this thread's allocations
(:mod:`.poison`), runs the launcher under a time limit, in interpreter mode bounds-checked
(:mod:`.memcheck`), and judges the output: an exception becomes a verdict (:mod:`.errors`), a wrong
output is diagnosed (:mod:`.diagnose`) and drawn (:mod:`.picture`).

From these the classic bugs are recognised: the tail past the last full block (grid rounded down,
or a wrong mask), every program repeating the first block (offsets without the program id), a
transposed result, out-of-bounds loads and stores, errors the size of TF32 or float16 rounding,
and NaNs a row-wise kernel computed (exp overflowing in a softmax without the max subtracted).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import signal
import threading
from typing import Callable, Sequence

import torch

from .. import runtime
from .early_start import CASE_TIME_LIMIT
from .diagnose import diagnose, match_suspects, memory_findings
from .errors import INTERPRETER_ONLY_HELPERS, interpreter_only_verdict, verdict_for_exception
from .learner_file import reduces, unfinished_todos, uses_dot, uses_exp
from .memcheck import MemcheckUnavailable, memory_checked
from .picture import build_picture
from .poison import (GUARD, guarded_copy, guarded_empty, is_poison, poisoned_allocations,
                     second_poison_value)
from .verdict import CaseResult, Geometry, Tolerance, Verdict, close, tolerance_for

# Names the checker has always offered, from the rooms that define them now.
__all__ = ["CASE_TIME_LIMIT", "GUARD", "INTERPRETER_ONLY_HELPERS", "CaseResult", "CaseTimeout",
           "Geometry", "Tolerance", "Verdict", "diagnose", "guarded_copy", "guarded_empty",
           "hang_verdict", "interpreter_only_verdict", "match_suspects", "memory_findings",
           "poisoned_allocations", "run_case", "time_limit", "tolerance_for", "unfinished_todos"]



class CaseTimeout(Exception):
    """A case ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise CaseTimeout in this thread after ``seconds`` (main thread only: elsewhere the
    sandbox's parent process keeps the clock)."""
    usable = (seconds and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"ran for more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def hang_verdict(seconds: float, label: str = "") -> Verdict:
    return Verdict(False, f"did not finish within {seconds:g} s",
                   ["the kernel or the launcher seems to loop forever: a while loop whose condition "
                    "never changes, a for loop over a huge range, or a grid with far too many "
                    "programs (a grid counts blocks: cdiv(n, BLOCK_SIZE), not n * BLOCK_SIZE)"])


def _input_names(launcher, n: int) -> list[str]:
    try:
        params = [p.name for p in inspect.signature(launcher).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input {i}" for i in range(n)]


def _lead_axis(leading_axis: str | None) -> int | None:
    """The grid axis a task's leading dim runs over ("channel (pid_0)" -> 0), if it names one."""
    m = re.search(r"pid_(\d)", leading_axis or "")
    return int(m.group(1)) if m else None


def run_case(
    launcher: Callable,
    inputs: Sequence,
    ref: torch.Tensor,
    *,
    block: Sequence[int],
    tol: Tolerance,
    kwargs: dict | None = None,
    program_axes: Sequence[str] | None = None,
    learner_file: str | None = None,
    matmul_operands: bool = False,
    suspects: Sequence = (),
    case=None,
    memcheck: bool | None = None,
    time_limit_s: float | None = None,
    picture: bool = True,
    leading_axis: str | None = None,
) -> Verdict:
    """Call ``launcher(*inputs, **kwargs)`` with guarded inputs and poisoned allocations, in
    interpreter mode bounds-checked (``memcheck``, default: when interpreting), and diagnose."""
    kwargs = kwargs or {}
    use_memcheck = runtime.INTERPRET if memcheck is None else memcheck
    guarded_inputs = [guarded_copy(x) if isinstance(x, torch.Tensor) and x.is_contiguous() else x
                      for x in inputs]
    note: list[str] = []
    report = None
    try:
        with time_limit(time_limit_s):
            try:
                out, made, report = _call(launcher, guarded_inputs, kwargs, use_memcheck, learner_file)
            except _Unavailable as exc:
                note.append(f"note: out-of-bounds checks are off ({exc})")
                out, made, report = _call(launcher, guarded_inputs, kwargs, False, learner_file)
    except CaseTimeout:
        return hang_verdict(time_limit_s or 0)
    except _LauncherError as wrapped:
        exc, report = wrapped.exc, wrapped.report
        verdict = verdict_for_exception(exc, learner_file, launcher)
        if report is not None and report.violations:
            verdict.memory = report.describe()
            verdict.details = verdict.details + verdict.memory
        return verdict
    try:
        return _judge(out, made, report, launcher, inputs, guarded_inputs, ref, kwargs, block=block, tol=tol,
                      program_axes=program_axes, learner_file=learner_file,
                      matmul_operands=matmul_operands, suspects=suspects, case=case, note=note,
                      picture=picture, lead_axis=_lead_axis(leading_axis))
    except Exception as exc:  # a diagnosis that fails must not hide the verdict
        ok = isinstance(out, torch.Tensor) and out.shape == ref.shape and bool(
            close(out.detach().cpu(), ref.detach().cpu(), tol).all()) and not (
            report is not None and report.violations)
        return Verdict(ok, "correct" if ok else "wrong result",
                       [] if ok else [f"(the checker could not analyse it further: {exc!r})"])


class _Unavailable(Exception):
    pass


class _LauncherError(Exception):
    def __init__(self, exc, report):
        self.exc, self.report = exc, report


def _call(launcher, inputs, kwargs, use_memcheck, learner_file, poison=None):
    """(output, allocations, memory report or None); the learner's errors come wrapped."""
    report = None
    with poisoned_allocations(poison) as made:
        if use_memcheck:
            try:
                ctx = memory_checked(learner_file)
                report = ctx.__enter__()
            except MemcheckUnavailable as exc:
                raise _Unavailable(str(exc)) from exc
            try:
                out = launcher(*inputs, **kwargs)
            except CaseTimeout:
                raise
            except Exception as exc:  # the learner's code: any error is a finding, not a crash
                raise _LauncherError(exc, report) from exc
            finally:
                ctx.__exit__(None, None, None)
        else:
            try:
                out = launcher(*inputs, **kwargs)
            except CaseTimeout:
                raise
            except Exception as exc:
                raise _LauncherError(exc, None) from exc
    return out, made, report


def _judge(out, made, report, launcher, inputs, guarded_inputs, ref, kwargs, *, block, tol,
           program_axes, learner_file, matmul_operands, suspects, case, note, picture,
           lead_axis=None) -> Verdict:
    spill = (0, 0)
    out_guard = None
    if isinstance(out, torch.Tensor):
        for g in made:
            if g.view.data_ptr() == out.data_ptr() and g.n == out.numel():
                spill, out_guard = g.spill(), g
    names = _input_names(launcher, len(inputs))
    geo = Geometry(tuple(ref.shape), tuple(int(b) for b in block), lead_axis) if isinstance(out, torch.Tensor) \
        and tuple(out.shape) == tuple(ref.shape) else None
    problems: list[str] = []
    findings: list[str] = []
    unwritten = None
    grid = None
    if report is not None:
        problems, findings = memory_findings(report, out, guarded_inputs, names, geo)
        grid = report.launches[-1].grid if report.launches else None
        if isinstance(out, torch.Tensor) and out.is_contiguous() and any(
                launch.passed(out) for launch in report.launches):
            wm = report.writes.get(out.data_ptr())
            n = out.numel()
            unwritten = torch.ones(n, dtype=torch.bool) if wm is None else torch.from_numpy(
                wm.count[:n] == 0)
            unwritten = unwritten.reshape(out.shape)
    else:
        for x, g, name in zip(inputs, guarded_inputs, names):
            if isinstance(x, torch.Tensor) and isinstance(g, torch.Tensor) and g is not x and not bool(
                    close(g.detach().cpu(), x.detach().cpu(), Tolerance(0, 0)).all()):
                problems.append(f"the kernel changed {name} (an input): a tl.store writes through an "
                                "input's pointer; results belong in the output")
    values_ok = isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(ref.shape) and \
        out.dtype == ref.dtype and bool(close(out.detach().cpu(), ref.detach().cpu(), tol).all())
    if not values_ok and isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(ref.shape):
        findings = match_suspects(out, case, suspects, tol) + findings
        if unwritten is None and out_guard is not None and bool(is_poison(out.detach().cpu()).any()):
            unwritten = _second_poison_unwritten(launcher, guarded_inputs, kwargs, out)
    verdict = diagnose(out, ref, block=block, tol=tol, spill=spill, program_axes=program_axes,
                       matmul_operands=matmul_operands,
                       uses_dot=uses_dot(learner_file, matmul_operands),
                       uses_exp=uses_exp(learner_file), unwritten=unwritten,
                       findings=findings, problems=problems, grid=grid, lead_axis=lead_axis)
    verdict.memory = list(problems)
    if not verdict.passed:
        if report is not None and not values_ok and reduces(learner_file):
            verdict.details.extend(report.notes())
        verdict.details.extend(note)
        if picture and geo is not None:
            verdict.picture = _picture(out, ref, tol, geo, unwritten, report, program_axes)
    return verdict


def _second_poison_unwritten(launcher, inputs, kwargs, out) -> torch.Tensor | None:
    """Run again with a finite poison: what still holds it was never written (a NaN there the
    first time was the poison, elsewhere the kernel computed it)."""
    try:
        again, made, _ = _call(launcher, [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs],
                               kwargs, False, None, poison=second_poison_value)
    except Exception:
        return None
    if not isinstance(again, torch.Tensor) or again.shape != out.shape:
        return None
    if not any(g.view.data_ptr() == again.data_ptr() for g in made):
        return None  # not a poisoned allocation: nothing to learn
    return is_poison(again.detach().cpu(), second_poison_value(again.dtype))


def _picture(out, ref, tol, geo, unwritten, report, program_axes):
    try:
        wm = report.writes.get(out.data_ptr()) if report is not None else None
        oob = []
        if report is not None:
            for v in report.violations.values():
                if v.kind == "store" and v.tensor.key == out.data_ptr():
                    oob.extend(v.positions)
        grid = report.launches[-1].grid if report is not None and report.launches else None
        return build_picture(out.detach().cpu(), ref.detach().cpu(), tol=tol, geometry=geo,
                                     unwritten=unwritten, writer=None if wm is None else wm.writer,
                                     oob=oob, grid=grid, program_axes=program_axes)
    except Exception:  # the picture is a bonus: never let it hide the verdict
        return None

