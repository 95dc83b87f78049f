"""Checking a learner's file, the session: where the file is, which way it runs, the results.

``check_exercise(n)`` is what ``workshop check n``, the ``exercise_n`` scripts and ``python
exercises/exercise_n.py`` all end in. It checks the learner's file in a child process
(:mod:`.sandbox`): each case's verdict prints as soon as it is known, and a case that kills the
interpreter or hangs is reported and the others still run. ``check_module`` runs the same checks
in this process (:mod:`.loop`) and returns them (progress, the tour and the tests use it). On a GPU
both also run every case in an interpreter child, bounds-checked, and merge the verdicts
(:func:`.sandbox.merge`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import ModuleType

from rich.console import Console

from .. import runtime
from .checker import CASE_TIME_LIMIT
from .errors import import_failure
from .exercises import EXERCISES, Exercise
from .learner_file import REPO_ROOT, find_exercise_file, load_module
from .loop import iter_check
from .report import CasePrinter, print_header, print_import_failure
from .verdict import CaseResult, TaskReport

__all__ = ["can_rerun", "check_exercise", "check_module", "compiled_natively", "exercise_path",
           "run_exercise"]


def exercise_path(number: int, solution: bool = False) -> Path:
    """``exercises/exercise_N.py`` (or ``solutions/solution_N.py``): looked up in the current
    directory first, so a learner's own clone wins, then beside the installed package."""
    if number not in EXERCISES:
        raise ValueError(f"exercise must be one of {sorted(EXERCISES)}, got {number}")
    found = find_exercise_file(number, solution)
    if found is not None:
        return found
    rel = Path("solutions" if solution else "exercises") / (
        f"{'solution' if solution else 'exercise'}_{number}.py")
    raise FileNotFoundError(
        f"{rel} not found in {Path.cwd()} or {REPO_ROOT}: run this from your clone of "
        "triton-workshop"
    )


def compiled_natively() -> bool:
    """Whether this process's kernels run compiled (on a GPU), where nothing checks the bounds of
    a load or store: then each case runs again in an interpreter child, bounds-checked."""
    return not runtime.INTERPRET


def can_rerun(path) -> bool:
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
    if rerun_in_interpreter and can_rerun(path):
        # Imported when used: the child process runs .sandbox as its main module (python -m),
        # which would otherwise find it imported already.
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
        isolate = can_rerun(path)
    if isolate:
        from .parallel import check_parallel, parallel_workers, prints_while_checked
        from .sandbox import check_isolated

        if rerun_in_interpreter is None:
            rerun_in_interpreter = compiled_natively()
        workers = 1 if rerun_in_interpreter or prints_while_checked(
            Path(path), {task.function for task in exercise.tasks}) else parallel_workers()
        if workers > 1:  # the cases shared among forked workers, one per core
            return check_parallel(exercise, Path(path), seed=int(time.time_ns() % 2**31) if seed is None else seed,
                                  console=console, source=source, png=png, time_limit=limit,
                                  workers=workers)
        return check_isolated(exercise, Path(path), seed=seed, console=console, source=source,
                              png=png, time_limit=limit, rerun_in_interpreter=rerun_in_interpreter)
    if module is None:
        try:
            module = load_module(path)
        except BaseException as exc:  # a syntax error or a bad import in the learner's file
            print_import_failure(import_failure(exc, Path(path)), console)
            return 1
    print_header(exercise, console, source)
    printer = CasePrinter(exercise, console)
    for event, _, function, _, result in iter_check(exercise, module, seed=seed, time_limit=limit):
        if event == "result":
            printer.show(function, result)
    return printer.finish(png)


def run_exercise(module_or_name) -> int:
    """What an exercise file calls under ``if __name__ == "__main__":``."""
    module = sys.modules[module_or_name] if isinstance(module_or_name, str) else module_or_name
    stem = Path(module.__file__).stem  # exercise_3 or solution_3
    return check_exercise(int(stem.rsplit("_", 1)[1]), module)
