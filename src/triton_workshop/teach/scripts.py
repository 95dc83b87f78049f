"""Console scripts ``exercise_N`` / ``solution_N``: check the file in ``exercises/`` or
``solutions/`` (looked up from the current directory first, then the clone the package was
installed from)."""

from __future__ import annotations

from . import check_exercise


def _run(number: int, solution: bool) -> int:
    try:
        return check_exercise(number, solution=solution)
    except FileNotFoundError as exc:
        print(f"❌ {exc}")
        return 2


def exercise_1() -> int: return _run(1, False)  # noqa: E704
def exercise_2() -> int: return _run(2, False)  # noqa: E704
def exercise_3() -> int: return _run(3, False)  # noqa: E704
def exercise_4() -> int: return _run(4, False)  # noqa: E704
def exercise_5() -> int: return _run(5, False)  # noqa: E704
def solution_1() -> int: return _run(1, True)  # noqa: E704
def solution_2() -> int: return _run(2, True)  # noqa: E704
def solution_3() -> int: return _run(3, True)  # noqa: E704
def solution_4() -> int: return _run(4, True)  # noqa: E704
def solution_5() -> int: return _run(5, True)  # noqa: E704
