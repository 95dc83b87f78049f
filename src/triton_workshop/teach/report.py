"""Showing: a check printed for the learner (the header, one line per case with its details and
the grid picture, the summary), and the pictures saved as a PNG. Learner text never goes through
rich markup (``add_kernel[grid](...)`` stays as written).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from .. import runtime
from .exercises import EXERCISES, Exercise
from .verdict import CaseResult, TaskReport, Verdict

__all__ = ["CasePrinter", "print_case", "print_header", "print_import_failure", "print_report",
           "print_summary"]


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


def print_import_failure(verdict: Verdict, console: Console) -> None:
    """A file that could not be imported: the verdict alone, no case ran."""
    console.print(f"❌ {verdict.headline}", markup=False, highlight=False)
    for line in verdict.details:
        console.print(f"   {line}", markup=False, highlight=False)


class CasePrinter:
    """Prints results as they come, draws the first failing case of each function, and at the
    end saves the pictures (``png``) and prints the summary."""

    def __init__(self, exercise: Exercise, console: Console) -> None:
        self.exercise, self.console = exercise, console
        self.ok = True
        self.drawn: set[str] = set()
        self.pictures: list = []

    def show(self, function: str, result: CaseResult) -> None:
        verdict = result.verdict
        self.ok = self.ok and verdict.passed
        draw = not verdict.passed and bool(verdict.picture) and function not in self.drawn
        if draw:
            self.drawn.add(function)
            self.pictures.append((f"{function}({result.label})", verdict.picture))
        print_case(function, result, self.console, picture=draw)

    def finish(self, png=None) -> int:
        """The pictures saved (when ``png``), the summary printed; the exit code."""
        if png and self.pictures:
            from .picture import save_png

            self.console.print(f"picture: {save_png(self.pictures, png)}", markup=False,
                               highlight=False)
        print_summary(self.exercise, self.ok, self.console)
        return 0 if self.ok else 1
