"""``workshop progress``: where a learner stands, read from their own exercise files.

Each exercise is one of:

* **missing**: ``exercises/exercise_N.py`` is not there;
* **not started**: every TODO of the template is still open (``...  # TODO n``, numbered 1 up);
* **in progress**: some TODO of the core is still open (the next one is named);
* **failing**: every core TODO is filled in but the checker finds something wrong;
* **core passed**: everything passes except a stretch task left for later (its TODOs say
  ``(stretch)``);
* **passed**: every check passes.

Only exercises with every core TODO filled are run through the checker (a fixed seed, its output
kept quiet), so the table costs a few seconds per finished exercise. The next step is the first
exercise that is not done, with the command that checks it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from .exercises import EXERCISES, is_stretch
from .learner_file import REPO_ROOT, load_module, unfinished_todos
from .session import check_module

MISSING = "missing"
NOT_STARTED = "not started"
IN_PROGRESS = "in progress"
READY = "ready to check"  # every core TODO filled, the checker not run (quick mode)
FAILING = "failing"
CORE_PASSED = "core passed"
PASSED = "passed"

DONE = (PASSED, CORE_PASSED)
MARKS = {MISSING: "❓", NOT_STARTED: "·", IN_PROGRESS: "✏️", READY: "…", FAILING: "❌",
         CORE_PASSED: "✅", PASSED: "✅"}


@dataclass
class Status:
    number: int
    title: str
    state: str
    detail: str
    path: Path
    next_todo: tuple[int, int] | None = None  # (TODO number, line) of the next open core TODO
    stretch_open: bool = False

    @property
    def command(self) -> str:
        if self.state == MISSING:
            return f"git checkout -- exercises/exercise_{self.number}.py"
        return f"workshop check {self.number}"


def learner_root(root: str | Path | None = None) -> Path:
    """Where the learner's ``exercises/`` live: ``root`` if given, else the current directory
    when it has an ``exercises/`` folder, else the clone the package was installed from."""
    if root is not None:
        return Path(root)
    return Path.cwd() if (Path.cwd() / "exercises").is_dir() else REPO_ROOT


_TODO_COMMENT = re.compile(r"#\s*TODO\s+(\d+)")


def _is_stretch_todo(text: str) -> bool:
    return text.lstrip().lower().startswith("(stretch")


def _untouched(path: Path, open_numbers: list[int]) -> bool:
    """Every TODO of the template still open: the open ones are 1..n with no gap, and no other
    ``# TODO n`` comment (one a learner kept beside their code) is left in the file."""
    if not open_numbers or sorted(open_numbers) != list(range(1, len(open_numbers) + 1)):
        return False
    mentioned = {int(m.group(1)) for m in _TODO_COMMENT.finditer(path.read_text())}
    return mentioned <= set(open_numbers)


def exercise_status(number: int, root: str | Path | None = None, *, run_checks: bool = True,
                    seed: int = 0) -> Status:
    """The state of exercise ``number`` in the learner's files (see the module docstring)."""
    if number not in EXERCISES:
        raise ValueError(f"exercise must be one of {sorted(EXERCISES)}, got {number}")
    exercise = EXERCISES[number]
    path = learner_root(root) / "exercises" / f"exercise_{number}.py"
    if not path.is_file():
        return Status(number, exercise.title, MISSING, f"{path} is not there", path)
    todos = unfinished_todos(path)
    core = [t for t in todos if not _is_stretch_todo(t[2])]
    stretch = [t for t in todos if _is_stretch_todo(t[2])]
    if _untouched(path, [t[0] for t in todos]):
        return Status(number, exercise.title, NOT_STARTED,
                      f"{len(todos)} TODOs; start at TODO 1 (line {todos[0][1]})", path,
                      (todos[0][0], todos[0][1]))
    if core:
        first = core[0]
        return Status(number, exercise.title, IN_PROGRESS,
                      f"TODO {first[0]} next (line {first[1]}); {len(core)} left"
                      + (f", plus {len(stretch)} stretch" if stretch else ""), path,
                      (first[0], first[1]), stretch_open=bool(stretch))
    if not run_checks:
        return Status(number, exercise.title, READY, "every TODO filled in: check it", path,
                      stretch_open=bool(stretch))
    return _checked_status(number, path, seed, stretch_open=bool(stretch))


@contextlib.contextmanager
def _quiet():
    """Nothing reaches stdout: Python's prints (print_if, the interpreter rerun's output relayed)
    and, on a GPU, what tl.device_print writes to file descriptor 1 from native code."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no file descriptor 1: only Python's stdout to silence
        saved = None
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        if saved is not None:
            os.dup2(sink, 1)
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        if saved is not None:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()  # the device's printf buffer is written out at a sync
            os.dup2(saved, 1)
            os.close(saved)
        os.close(sink)


def _checked_status(number: int, path: Path, seed: int, *, stretch_open: bool) -> Status:
    exercise = EXERCISES[number]
    try:  # the learner's kernel may print (print_if, tl.device_print): keep the table clean
        with _quiet():
            module = load_module(path, name=f"_workshop_progress_{number}")
            reports = check_module(exercise, module, seed=seed)
    except Exception as exc:  # a syntax error or a bad import in the learner's file
        return Status(number, exercise.title, FAILING,
                      f"could not import: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
                      if str(exc) else f"could not import: {type(exc).__name__}", path)
    stretch_functions = {t.function for t in exercise.tasks if is_stretch(t)}
    failing_core, failing_stretch = [], []
    for report in reports:
        bad = [case for case in report.cases if not case.verdict.passed]
        if bad:
            (failing_stretch if report.function in stretch_functions else failing_core).append(
                (report.function, bad[0]))
    if failing_core:
        function, case = failing_core[0]
        return Status(number, exercise.title, FAILING,
                      f"{function}({case.label}): {case.verdict.headline}", path,
                      stretch_open=stretch_open)
    if failing_stretch:
        function, case = failing_stretch[0]
        return Status(number, exercise.title, CORE_PASSED,
                      f"stretch open: {function}({case.label}): {case.verdict.headline}", path,
                      stretch_open=True)
    return Status(number, exercise.title, PASSED, "every check passes", path)


def progress(root: str | Path | None = None, *, run_checks: bool = True,
             seed: int = 0) -> list[Status]:
    """The status of every exercise, in order."""
    return [exercise_status(n, root, run_checks=run_checks, seed=seed) for n in sorted(EXERCISES)]


def next_step(statuses: list[Status]) -> tuple[str, str]:
    """(what to do next, the command that does or checks it)."""
    for s in statuses:
        if s.state in DONE:
            continue
        if s.state == MISSING:
            return (f"Exercise {s.number}'s file is missing: restore it from git", s.command)
        if s.state == NOT_STARTED:
            return (f"Start exercise {s.number} ({s.title}): open exercises/exercise_{s.number}.py "
                    f"at TODO 1, then check it", s.command)
        if s.state == IN_PROGRESS:
            todo, line = s.next_todo or (0, 0)
            return (f"Go on with exercise {s.number} ({s.title}): TODO {todo}, line {line} of "
                    f"exercises/exercise_{s.number}.py", s.command)
        if s.state == READY:
            return f"Check exercise {s.number} ({s.title}): every TODO is filled in", s.command
        return f"Fix exercise {s.number} ({s.title}): {s.detail}", s.command
    stretch = [s for s in statuses if s.state == CORE_PASSED]
    if stretch:
        s = stretch[0]
        return (f"Every exercise's core passes. Optional: the stretch of exercise {s.number} "
                f"({s.detail.removeprefix('stretch open: ')})", s.command)
    return ("Every exercise passes. Next: see where a kernel's time goes with `workshop profile` "
            "on a GPU (docs/learners-guide.md, \"Where to go next\")", "workshop profile matmul")


def next_step_after(number: int, root: str | Path | None = None) -> tuple[str, str]:
    """The next step once exercise ``number`` passes, without running any other check: the
    first later exercise that is not filled in yet, else ``workshop progress``."""
    later = [exercise_status(n, root, run_checks=False) for n in sorted(EXERCISES) if n > number]
    for s in later:
        if s.state in (MISSING, NOT_STARTED, IN_PROGRESS, READY):
            return next_step([s])
    return ("See every exercise's state (and the stretch tasks left)", "workshop progress")


def print_next_step(step: tuple[str, str], console: Console | None = None) -> None:
    console = console or Console()
    text, command = step
    console.print(f"[bold]Next step:[/bold] {text}\n    [cyan]{command}[/cyan]", highlight=False)


def progress_table(statuses: list[Status]) -> Table:
    table = Table(title="Your progress", show_lines=False)
    for column in ("", "#", "exercise", "state", "detail"):
        table.add_column(column)
    for s in statuses:
        state = s.state + (" (stretch open)" if s.state == CORE_PASSED else "")
        table.add_row(MARKS[s.state], str(s.number), s.title, state, s.detail)
    return table


def print_progress(root: str | Path | None = None, console: Console | None = None, *,
                   run_checks: bool = True, seed: int = 0) -> list[Status]:
    """``workshop progress``: the table, then the next step and its command."""
    console = console or Console()
    statuses = progress(root, run_checks=run_checks, seed=seed)
    console.print(progress_table(statuses))
    done = sum(s.state in DONE for s in statuses)
    console.print(f"{done} of {len(statuses)} exercises done "
                  f"[dim](files in {learner_root(root)}/exercises)[/dim]", highlight=False)
    print_next_step(next_step(statuses), console)
    return statuses
