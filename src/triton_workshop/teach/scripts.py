"""Console scripts ``exercise_N`` / ``solution_N``: check the file in ``exercises/`` or
``solutions/`` (looked up from the current directory first, then the clone the package was
installed from). A learner's file that passes ends with the next step."""

from __future__ import annotations

from rich.console import Console

from .session import check_exercise, exercise_path


def _run(number: int, solution: bool) -> int:
    try:
        code = check_exercise(number, solution=solution)
    except FileNotFoundError as exc:
        print(f"❌ {exc}")
        return 2
    if code == 0 and not solution:
        from .progress import next_step_after, print_next_step

        print_next_step(next_step_after(number), Console())
    if code == 0 and number == 7:  # the exercise's own benchmark: a plot on a GPU, a sentence here
        from .learner_file import load_module

        load_module(exercise_path(7, solution), name=f"_workshop_bench_7_{solution}").benchmark()
    return code


def exercise_1() -> int: return _run(1, False)  # noqa: E704
def exercise_2() -> int: return _run(2, False)  # noqa: E704
def exercise_3() -> int: return _run(3, False)  # noqa: E704
def exercise_4() -> int: return _run(4, False)  # noqa: E704
def exercise_5() -> int: return _run(5, False)  # noqa: E704
def exercise_6() -> int: return _run(6, False)  # noqa: E704
def exercise_7() -> int: return _run(7, False)  # noqa: E704
def exercise_8() -> int: return _run(8, False)  # noqa: E704
def solution_1() -> int: return _run(1, True)  # noqa: E704
def solution_2() -> int: return _run(2, True)  # noqa: E704
def solution_3() -> int: return _run(3, True)  # noqa: E704
def solution_4() -> int: return _run(4, True)  # noqa: E704
def solution_5() -> int: return _run(5, True)  # noqa: E704
def solution_6() -> int: return _run(6, True)  # noqa: E704
def solution_7() -> int: return _run(7, True)  # noqa: E704
def solution_8() -> int: return _run(8, True)  # noqa: E704
