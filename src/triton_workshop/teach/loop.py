"""The case loop: every case of an exercise, in turn, for the launchers of a learner's module.

:func:`iter_check` draws each task's cases, calls :func:`.checker.run_case` on each, and yields a
"start" and a "result" event per case, so that a caller can print as results come (the sandbox's
child writes them to its pipe). A launcher the file lacks gets one verdict; a task whose cases all
pass gets one more case with non-contiguous inputs.
"""

from __future__ import annotations

import difflib
import inspect
import time
from types import ModuleType
from typing import Callable, Iterator

import torch

from .. import runtime
from .checker import run_case
from .exercises import Exercise
from .learner_file import unfinished_todos
from .verdict import CaseResult, Verdict, case_tolerance

__all__ = ["iter_check", "missing_function_verdict"]


def missing_function_verdict(module: ModuleType, name: str) -> Verdict:
    """One sentence and the fix, for a launcher the file does not define (or not as a function)."""
    found = getattr(module, name, None)
    if found is not None and not callable(found):
        return Verdict(False, f"{name} in the file is a {type(found).__name__}, not a function",
                       [f"the checker calls {name}(...): define it with def {name}(...)"])
    # Plain functions only: a launcher was renamed, not a kernel. (A @triton.jit kernel is a
    # callable object, and compiled for a GPU it claims the file's module: add_kernel would
    # otherwise be offered for add.)
    names = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
             and v.__module__ == module.__name__]
    close = sorted((n for n in names if name in n or n in name),
                   key=lambda n: -difflib.SequenceMatcher(None, name, n).ratio())
    close += difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" (the file has {close[0]!r}: renamed?)" if close else ""
    return Verdict(False, f"no function named {name!r} in the file{hint}",
                   [f"the checker calls {name}(...): keep the template's name"])


def iter_check(exercise: Exercise, module: ModuleType, *, seed: int | None = None,
               learner_file: str | None = None, skip: dict | None = None,
               memcheck: bool | None = None, time_limit: float | None = None,
               claim: Callable[[], int | None] | None = None, strided_of: int | None = None
               ) -> Iterator[tuple[str, str, str, str, CaseResult | None]]:
    """Check each case in turn, yielding ``(event, case id, function, label, result)``: a
    "start" before a case runs (result None) and a "result" after. ``skip`` maps the ids of cases
    done elsewhere (an earlier process that crashed) to whether they passed: they are not run
    again, but count for the rest (the non-contiguous case runs only when all others passed).

    Several processes can share the work (:mod:`.parallel`): with ``claim`` this one runs only
    the units (a case, a module check, a missing launcher; numbered in order over the tasks) whose
    numbers ``claim()`` hands it, in increasing order (None: none left), and no non-contiguous
    case; with ``strided_of`` it runs only task ``strided_of``'s non-contiguous case, judged on
    ``skip``."""
    threads = torch.get_num_threads()
    # The cases' tensors are small: torch's intra-op pool costs more than it gains here (several
    # times more on a busy machine).
    torch.set_num_threads(1)
    try:
        yield from _iter_check(exercise, module, seed, learner_file, skip, memcheck, time_limit,
                               _Units(claim, strided_of))
    finally:
        torch.set_num_threads(threads)


class _Units:
    """Which units of the exercise this process runs: every one, those it claims, or none (the
    process that runs one task's non-contiguous case)."""

    def __init__(self, claim, strided_of):
        self.claim, self.strided_of = claim, strided_of
        self.index = -1  # the unit last visited
        self.wanted = None  # the number claimed and not yet reached

    def next(self, *, done: bool = False) -> bool:
        """Visit the next unit; whether to run it (``done``: it ran in an earlier process)."""
        self.index += 1
        if self.strided_of is not None:
            return False
        if self.claim is None or done:
            return not done
        # Numbers below this one belong to units passed over (a task stopped at "not implemented").
        while self.wanted is not None and self.wanted < self.index:
            self.wanted = self.claim()
        if self.wanted is None:
            self.wanted = self.claim()
            while self.wanted is not None and self.wanted < self.index:
                self.wanted = self.claim()
        if self.wanted == self.index:
            self.wanted = None
            return True
        return False

    def pass_over(self, n: int) -> None:
        """Units left unvisited (the rest of a task stopped at "not implemented")."""
        self.index += n

    def strided(self, t: int) -> bool:
        return self.strided_of == t if self.strided_of is not None else self.claim is None


def _iter_check(exercise, module, seed, learner_file, skip, memcheck, time_limit, units):
    gen = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    learner_file = learner_file or getattr(module, "__file__", None)
    todos = unfinished_todos(learner_file) if learner_file else []
    skip = skip or {}
    for t, task in enumerate(exercise.tasks):
        launcher = getattr(module, task.function, None)
        cases = task.make_cases(gen, runtime.DEVICE)  # drawn even when skipped: same inputs after
        if not callable(launcher):
            cid = f"{t}:-"
            if units.next(done=cid in skip):
                yield "result", cid, task.function, "-", CaseResult(
                    "-", missing_function_verdict(module, task.function), 0.0)
            continue
        block = [int(getattr(module, attr, default))
                 for attr, default in zip(task.block_attrs, task.default_block)]
        constants = {name: getattr(module, name) for name in getattr(task, "constants", ())
                     if hasattr(module, name)}
        passed = []
        stop = False
        for c, case in enumerate(cases):
            cid = f"{t}:{c}"
            if cid in skip:
                units.next(done=True)
                passed.append(bool(skip[cid]))
                continue
            if not units.next():
                continue
            yield "start", cid, task.function, case.label, None
            start = time.perf_counter()
            case.block = tuple(block)
            case.constants = dict(constants)
            verdict = run_case(launcher, case.inputs, case.reference, block=block,
                               tol=case_tolerance(case), kwargs=case.kwargs,
                               program_axes=task.program_axes, learner_file=learner_file,
                               matmul_operands=task.matmul_operands, suspects=task.suspects,
                               case=case, leading_axis=task.leading_axis, memcheck=memcheck,
                               time_limit_s=time_limit)
            if not verdict.passed and todos and not verdict.headline.startswith("not implemented"):
                number, lineno, text = todos[0]
                verdict.details.insert(0, f"TODO {number} (line {lineno}) is still open: {text}")
            passed.append(verdict.passed)
            yield "result", cid, task.function, case.label, CaseResult(
                case.label, verdict, time.perf_counter() - start)
            if not verdict.passed and verdict.headline.startswith("not implemented"):
                stop = True  # one "start at TODO n" is enough
                units.pass_over(len(cases) - c - 1 + (getattr(task, "module_check", None) is not None))
                break
        # A check of the learner's module as a whole (exercise 7: every tuning config launched
        # once, which the interpreter's one-config autotuning never does).
        module_check = getattr(task, "module_check", None)
        cid = f"{t}:module"
        if module_check is not None and cid in skip and not stop:
            units.next(done=True)
            passed.append(bool(skip[cid]))
        elif module_check is not None and not stop and units.next():
            label = "every config of CONFIGS, launched once"
            yield "start", cid, task.function, label, None
            start = time.perf_counter()
            verdict = module_check(module, runtime.DEVICE)
            passed.append(verdict.passed)
            yield "result", cid, task.function, label, CaseResult(
                label, verdict, time.perf_counter() - start)
        cid = f"{t}:strided"
        if not stop and passed and all(passed) and cid not in skip and units.strided(t):
            yield "start", cid, task.function, f"{cases[0].label}, non-contiguous inputs", None
            result = _strided_case(launcher, task, cases[0])
            yield "result", cid, task.function, result.label, result


def _strided(t):
    """The same values in non-contiguous memory: column-major for 2-D and up, every other
    element for 1-D."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return t
    if t.dim() == 1:
        return torch.stack([t, torch.full_like(t, float("nan"))], dim=-1)[:, 0]
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _strided_case(launcher, task, case) -> CaseResult:
    """Non-contiguous inputs must be handled (right values) or refused clearly (a ValueError or
    TypeError): a kernel that assumes contiguous memory silently reads the wrong elements."""
    start = time.perf_counter()
    inputs = [_strided(t) for t in case.inputs]
    label = f"{case.label}, non-contiguous inputs"
    try:
        out = launcher(*inputs, **case.kwargs)
    except (ValueError, TypeError) as exc:
        verdict = Verdict(True, f"refused clearly: {str(exc).splitlines()[0][:120]}")
    except Exception as exc:
        verdict = Verdict(False, f"raised {type(exc).__name__} on non-contiguous inputs",
                          [str(exc).splitlines()[0][:200] if str(exc) else "",
                           "handle strides, or refuse with check_tensors_gpu_ready(...)"])
    else:
        tol = case_tolerance(case)
        ok = isinstance(out, torch.Tensor) and out.shape == case.reference.shape and bool(
            torch.allclose(out.detach().cpu().double(), case.reference.cpu().double(),
                           rtol=tol.rtol, atol=tol.atol))
        verdict = Verdict(True, "correct") if ok else Verdict(
            False, "wrong values for non-contiguous inputs",
            ["the kernel assumes contiguous memory: pass the strides to the kernel, or refuse "
             "such inputs with check_tensors_gpu_ready(...) (or call .contiguous())"])
    return CaseResult(label, verdict, time.perf_counter() - start)
