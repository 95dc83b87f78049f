"""The workshop machinery: find an exercise file, run its launchers on fresh inputs, report.

``check_exercise(n, module)`` is what ``workshop check n``, the ``exercise_n`` scripts and
``python exercises/exercise_n.py`` all end in.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from rich.console import Console

from .. import runtime
from .checker import CaseResult, Verdict, run_case, tolerance_for, unfinished_todos
from .exercises import EXERCISES, Exercise

__all__ = ["EXERCISES", "check_exercise", "exercise_path", "load_module", "run_exercise"]

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


@dataclass
class TaskReport:
    function: str
    cases: list[CaseResult]

    @property
    def passed(self) -> bool:
        return all(c.verdict.passed for c in self.cases)


def check_module(exercise: Exercise, module: ModuleType, *, seed: int | None = None,
                 learner_file: str | None = None) -> list[TaskReport]:
    gen = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    learner_file = learner_file or getattr(module, "__file__", None)
    todos = unfinished_todos(learner_file) if learner_file else []
    reports = []
    for task in exercise.tasks:
        launcher = getattr(module, task.function, None)
        if launcher is None:
            verdict = Verdict(False, f"no function named {task.function!r} in the file",
                              [f"the checker calls {task.function}(...): keep that name"])
            reports.append(TaskReport(task.function, [CaseResult("-", verdict, 0.0)]))
            continue
        block = [int(getattr(module, attr, default))
                 for attr, default in zip(task.block_attrs, task.default_block)]
        results = []
        cases = task.make_cases(gen, runtime.DEVICE)
        first_case = cases[0]
        for case in cases:
            start = time.perf_counter()
            verdict = run_case(launcher, case.inputs, case.reference, block=block,
                               tol=tolerance_for(case.reference.dtype), kwargs=case.kwargs,
                               program_axes=task.program_axes, learner_file=learner_file,
                               matmul_operands=task.matmul_operands)
            results.append(CaseResult(case.label, verdict, time.perf_counter() - start))
            if not verdict.passed and verdict.headline.startswith("not implemented"):
                break  # one "start at TODO n" is enough
            if not verdict.passed and todos:
                number, lineno, text = todos[0]
                verdict.details.insert(0, f"TODO {number} (line {lineno}) is still open: {text}")
        if results and all(r.verdict.passed for r in results):
            results.append(_strided_case(launcher, task, first_case))
        reports.append(TaskReport(task.function, results))
    return reports


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
        ok = isinstance(out, torch.Tensor) and out.shape == case.reference.shape and bool(
            torch.allclose(out.detach().cpu().double(), case.reference.cpu().double(),
                           rtol=tolerance_for(case.reference.dtype).rtol,
                           atol=tolerance_for(case.reference.dtype).atol))
        verdict = Verdict(True, "correct") if ok else Verdict(
            False, "wrong values for non-contiguous inputs",
            ["the kernel assumes contiguous memory: pass the strides to the kernel, or refuse "
             "such inputs with check_tensors_gpu_ready(...) (or call .contiguous())"])
    return CaseResult(label, verdict, time.perf_counter() - start)


def print_report(exercise: Exercise, reports: list[TaskReport], console: Console,
                 source: str = "") -> bool:
    ok = all(r.passed for r in reports)
    console.print(f"[bold]Exercise {exercise.number}: {exercise.title}[/bold]  "
                  f"[dim]{source} · {runtime.mode_description()}[/dim]")
    for report in reports:
        for case in report.cases:
            mark = "✅" if case.verdict.passed else "❌"
            console.print(f"  {mark} {report.function}({case.label}): {case.verdict.headline}"
                          f" [dim]{case.seconds:.2f}s[/dim]", highlight=False)
            for line in case.verdict.details:
                console.print(f"      • {line}", highlight=False, markup=False)
    if ok:
        console.print(f"[green]All checks passed.[/green] Next: exercise {exercise.number + 1}"
                      if exercise.number + 1 in EXERCISES else "[green]All checks passed.[/green]")
    else:
        console.print("[red]Not there yet[/red]: fix the first ❌ above and run again.")
    return ok


def check_exercise(number: int, module: ModuleType | None = None, *, solution: bool = False,
                   path: str | Path | None = None, seed: int | None = None,
                   console: Console | None = None) -> int:
    """Check exercise ``number``; returns an exit code (0 when every case passes)."""
    if number not in EXERCISES:
        raise ValueError(f"exercise must be one of {sorted(EXERCISES)}, got {number}")
    exercise = EXERCISES[number]
    console = console or Console()
    if module is None:
        path = Path(path) if path else exercise_path(number, solution)
        try:
            module = load_module(path)
        except Exception as exc:  # a syntax error or a bad import in the learner's file
            console.print(f"❌ could not import {path}: {type(exc).__name__}: {exc}",
                          markup=False, highlight=False)
            todos = unfinished_todos(path)
            if todos:
                console.print(f"   start at TODO {todos[0][0]} (line {todos[0][1]})",
                              markup=False)
            return 1
    source = str(path or getattr(module, "__file__", ""))
    try:
        source = str(Path(source).resolve().relative_to(Path.cwd()))
    except ValueError:
        pass
    reports = check_module(exercise, module, seed=seed)
    return 0 if print_report(exercise, reports, console, source) else 1


def run_exercise(module_or_name) -> int:
    """What an exercise file calls under ``if __name__ == "__main__":``."""
    module = sys.modules[module_or_name] if isinstance(module_or_name, str) else module_or_name
    stem = Path(module.__file__).stem  # exercise_3 or solution_3
    return check_exercise(int(stem.rsplit("_", 1)[1]), module)
