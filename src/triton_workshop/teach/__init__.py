"""The workshop machinery: find an exercise file, run its launchers on fresh inputs, report.

``check_exercise(n, module)`` is what ``workshop check n``, the ``exercise_n`` scripts and
``python exercises/exercise_n.py`` all end in. It checks the learner's file in a child process
(:mod:`.sandbox`): each case's verdict prints as soon as it is known, and a case that kills the
interpreter or hangs is reported and the others still run. ``check_module`` runs the same checks
in this process and returns them (progress, the tour and the tests use it). On a GPU both also run
every case in an interpreter child, bounds-checked, and merge the verdicts (:func:`.sandbox.merge`).
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator

import torch
from rich.console import Console
from rich.text import Text

from .. import runtime
from .checker import (CASE_TIME_LIMIT, CaseResult, Tolerance, Verdict, run_case, tolerance_for,
                      unfinished_todos)
from .exercises import EXERCISES, Exercise

__all__ = ["EXERCISES", "check_exercise", "check_module", "exercise_path", "iter_check", "load_module",
           "run_exercise"]

REPO_ROOT = Path(__file__).resolve().parents[3]


def exercise_path(number: int, solution: bool = False) -> Path:
    """``exercises/exercise_N.py`` (or ``solutions/solution_N.py``): looked up in the current
    directory first, so a learner's own clone wins, then beside the installed package."""
    if number not in EXERCISES:
        raise ValueError(f"exercise must be one of {sorted(EXERCISES)}, got {number}")
    rel = Path("solutions" if solution else "exercises") / (
        f"{'solution' if solution else 'exercise'}_{number}.py")
    for root in (Path.cwd(), REPO_ROOT):
        if (root / rel).is_file():
            return root / rel
    raise FileNotFoundError(
        f"{rel} not found in {Path.cwd()} or {REPO_ROOT}: run this from your clone of "
        "triton-workshop"
    )


def load_module(path: str | Path, name: str | None = None) -> ModuleType:
    """Import a learner's file as a module (a real file: @triton.jit reads its source)."""
    path = Path(path).resolve()
    name = name or f"_workshop_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def case_tolerance(case) -> Tolerance:
    """The case's own tolerance when it has one (derived from how the reference is computed),
    else the dtype's."""
    tol = getattr(case, "tolerance", None)
    return Tolerance(*tol) if tol else tolerance_for(case.reference.dtype)


@dataclass
class TaskReport:
    function: str
    cases: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(c.verdict.passed for c in self.cases)


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
               memcheck: bool | None = None, time_limit: float | None = None
               ) -> Iterator[tuple[str, str, str, str, CaseResult | None]]:
    """Check each case in turn, yielding ``(event, case id, function, label, result)``: a
    "start" before a case runs (result None) and a "result" after. ``skip`` maps the ids of cases
    done elsewhere (an earlier process that crashed) to whether they passed: they are not run
    again, but count for the rest (the non-contiguous case runs only when all others passed)."""
    threads = torch.get_num_threads()
    # The cases' tensors are small: torch's intra-op pool costs more than it gains here (several
    # times more on a busy machine).
    torch.set_num_threads(1)
    try:
        yield from _iter_check(exercise, module, seed, learner_file, skip, memcheck, time_limit)
    finally:
        torch.set_num_threads(threads)


def _iter_check(exercise, module, seed, learner_file, skip, memcheck, time_limit):
    gen = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    learner_file = learner_file or getattr(module, "__file__", None)
    todos = unfinished_todos(learner_file) if learner_file else []
    skip = skip or {}
    for t, task in enumerate(exercise.tasks):
        launcher = getattr(module, task.function, None)
        cases = task.make_cases(gen, runtime.DEVICE)  # drawn even when skipped: same inputs after
        if not callable(launcher):
            cid = f"{t}:-"
            if cid not in skip:
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
                passed.append(bool(skip[cid]))
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
                break
        cid = f"{t}:strided"
        if not stop and passed and all(passed) and cid not in skip:
            yield "start", cid, task.function, f"{cases[0].label}, non-contiguous inputs", None
            result = _strided_case(launcher, task, cases[0])
            yield "result", cid, task.function, result.label, result


def compiled_natively() -> bool:
    """Whether this process's kernels run compiled (on a GPU), where nothing checks the bounds of
    a load or store: then each case runs again in an interpreter child, bounds-checked."""
    return not runtime.INTERPRET


def _can_rerun(path) -> bool:
    """A child process can import the learner's file (a real file; POSIX pipes for the protocol)."""
    return path is not None and Path(path).is_file() and os.name == "posix"


def check_module(exercise: Exercise, module: ModuleType, *, seed: int | None = None,
                 learner_file: str | None = None, rerun_in_interpreter: bool | None = None
                 ) -> list[TaskReport]:
    """Every case of the exercise, run in this process; one report per task.

    On a GPU (``rerun_in_interpreter``, by default when kernels run compiled) the module's file
    is also checked in an interpreter child, bounds-checked, with the same seed, and each case's
    verdict is merged with its rerun's as ``workshop check`` does: an out-of-bounds access fails
    the case even when the values are right.
    """
    path = learner_file or getattr(module, "__file__", None)
    if rerun_in_interpreter is None:
        rerun_in_interpreter = compiled_natively()
    rerun = None
    if rerun_in_interpreter and _can_rerun(path):
        from .sandbox import InterpreterRerun

        if seed is None:  # the rerun must draw the same inputs
            seed = int(time.time_ns() % 2**31)
        rerun = InterpreterRerun(exercise.number, Path(path), seed, CASE_TIME_LIMIT)
    reports: dict[str, TaskReport] = {}
    for task in exercise.tasks:
        reports.setdefault(task.function, TaskReport(task.function, []))
    native = []
    try:
        for event, cid, function, _, result in iter_check(
                exercise, module, seed=seed, learner_file=learner_file,
                memcheck=False if rerun is not None else None):
            if event == "result":
                native.append((cid, function, result))
    except BaseException:
        if rerun is not None:
            rerun.stop()
        raise
    if rerun is None:
        for _, function, result in native:
            reports[function].cases.append(result)
        return list(reports.values())
    from .sandbox import merge, rerun_only

    checked = rerun.results()
    for cid, function, result in native:
        verdict = merge(result.verdict, checked[cid][1].verdict if cid in checked else None)
        reports[function].cases.append(CaseResult(result.label, verdict, result.seconds))
    for function, result in rerun_only([r.verdict for _, _, r in native], [c for c, _, _ in native], checked):
        reports[function].cases.append(result)
    return list(reports.values())


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


# --------------------------------------------------------------------------------------------
# Printing.
# --------------------------------------------------------------------------------------------
def print_header(exercise: Exercise, console: Console, source: str = "") -> None:
    line = Text()
    line.append(f"Exercise {exercise.number}: {exercise.title}", style="bold")
    line.append(f"  {source} · {runtime.mode_description()}", style="dim")
    console.print(line)


def print_case(function: str, case: CaseResult, console: Console, *, picture: bool = False) -> None:
    """One case: the verdict line, its details, and (``picture``) the grid picture. Learner
    text never goes through rich markup (``add_kernel[grid](...)`` stays as written)."""
    line = Text(f"  {'✅' if case.verdict.passed else '❌'} {function}({case.label}): "
                f"{case.verdict.headline}")
    line.append(f" {case.seconds:.2f}s", style="dim")
    console.print(line, highlight=False)
    for detail in case.verdict.details:
        console.print(f"      • {detail}", highlight=False, markup=False)
    if picture and case.verdict.picture:
        from .picture import render

        try:
            console.print(render(case.verdict.picture), highlight=False)
        except Exception:  # a picture that cannot be drawn must not hide the verdict
            pass


def print_summary(exercise: Exercise, ok: bool, console: Console) -> None:
    if ok:
        nxt = exercise.number + 1
        console.print(f"[green]All checks passed.[/green] Next: exercise {nxt}" if nxt in EXERCISES
                      else "[green]All checks passed.[/green]")
    else:
        console.print("[red]Not there yet[/red]: fix the first ❌ above and run again.")


def print_report(exercise: Exercise, reports: list[TaskReport], console: Console,
                 source: str = "", pictures: bool = True) -> bool:
    ok = all(r.passed for r in reports)
    print_header(exercise, console, source)
    for report in reports:
        drawn = False
        for case in report.cases:
            draw = pictures and not drawn and not case.verdict.passed and bool(case.verdict.picture)
            print_case(report.function, case, console, picture=draw)
            drawn = drawn or draw
    print_summary(exercise, ok, console)
    return ok


def check_exercise(number: int, module: ModuleType | None = None, *, solution: bool = False,
                   path: str | Path | None = None, seed: int | None = None,
                   console: Console | None = None, png: str | Path | None = None,
                   isolate: bool | None = None, time_limit: float | None = None,
                   rerun_in_interpreter: bool | None = None) -> int:
    """Check exercise ``number``; returns an exit code (0 when every case passes).

    The learner's file runs in a child process (``isolate``, the default whenever there is a
    file): verdicts print as each case finishes, and a crash or a hang of one case is reported
    without losing the others. On a GPU the cases run there, and again in Triton's interpreter
    (``rerun_in_interpreter``) where every load and store is bounds-checked. ``png``: also draw
    the picture of each failing task into that file.
    """
    if number not in EXERCISES:
        raise ValueError(f"exercise must be one of {sorted(EXERCISES)}, got {number}")
    exercise = EXERCISES[number]
    console = console or Console()
    if module is not None:
        path = path or getattr(module, "__file__", None)
    else:
        path = Path(path) if path else exercise_path(number, solution)
    source = str(path or "")
    try:
        source = str(Path(source).resolve().relative_to(Path.cwd()))
    except ValueError:
        pass
    limit = CASE_TIME_LIMIT if time_limit is None else time_limit
    if isolate is None:
        isolate = _can_rerun(path)
    if isolate:
        from .sandbox import check_isolated

        if rerun_in_interpreter is None:
            rerun_in_interpreter = compiled_natively()
        return check_isolated(exercise, Path(path), seed=seed, console=console, source=source,
                              png=png, time_limit=limit, rerun_in_interpreter=rerun_in_interpreter)
    if module is None:
        from .sandbox import import_failure

        try:
            module = load_module(path)
        except BaseException as exc:  # a syntax error or a bad import in the learner's file
            verdict = import_failure(exc, Path(path))
            console.print(f"❌ {verdict.headline}", markup=False, highlight=False)
            for line in verdict.details:
                console.print(f"   {line}", markup=False, highlight=False)
            return 1
    print_header(exercise, console, source)
    ok = True
    drawn: set[str] = set()
    pictures = []
    for event, _, function, _, result in iter_check(exercise, module, seed=seed, time_limit=limit):
        if event != "result":
            continue
        ok = ok and result.verdict.passed
        draw = not result.verdict.passed and result.verdict.picture and function not in drawn
        if draw:
            drawn.add(function)
            pictures.append((f"{function}({result.label})", result.verdict.picture))
        print_case(function, result, console, picture=bool(draw))
    if png and pictures:
        from .picture import save_png

        console.print(f"picture: {save_png(pictures, png)}", markup=False, highlight=False)
    print_summary(exercise, ok, console)
    return 0 if ok else 1


def run_exercise(module_or_name) -> int:
    """What an exercise file calls under ``if __name__ == "__main__":``."""
    module = sys.modules[module_or_name] if isinstance(module_or_name, str) else module_or_name
    stem = Path(module.__file__).stem  # exercise_3 or solution_3
    return check_exercise(int(stem.rsplit("_", 1)[1]), module)
