"""The learner's file, read as text and imported as a module: where the exercises live, the
``... # TODO n`` lines still open, and what the kernel's source uses (a reduction, ``tl.dot``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["REPO_ROOT", "find_exercise_file", "load_module", "reduces", "unfinished_todos", "uses_dot"]

REPO_ROOT = Path(__file__).resolve().parents[3]


def find_exercise_file(number: int, solution: bool = False) -> Path | None:
    """``exercises/exercise_N.py`` (or ``solutions/solution_N.py``): looked up in the current
    directory first, so a learner's own clone wins, then beside the installed package; None
    when neither has it."""
    rel = Path("solutions" if solution else "exercises") / (
        f"{'solution' if solution else 'exercise'}_{number}.py")
    for root in (Path.cwd(), REPO_ROOT):
        if (root / rel).is_file():
            return root / rel
    return None


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


_TODO_LINE = re.compile(r"\.\.\.\s*#\s*TODO\s*(\d+)\s*:?\s*(.*)$")


def unfinished_todos(path: str | Path) -> list[tuple[int, int, str]]:
    """(todo number, line number, text) of each ``... # TODO n: text`` line still in the file."""
    found = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for lineno, line in enumerate(lines, 1):
        m = _TODO_LINE.search(line)
        if m and not line.lstrip().startswith("#"):
            found.append((int(m.group(1)), lineno, m.group(2).strip()))
    return sorted(found)


def reduces(learner_file: str | None) -> bool:
    """Whether masked-off lanes can reach a result: only through a reduction or a dot (an
    elementwise kernel stores none of them)."""
    if not learner_file:
        return True
    try:
        text = Path(learner_file).read_text()
    except OSError:
        return True
    return any(f"tl.{name}(" in text for name in ("sum", "max", "min", "dot", "reduce", "cumsum",
                                                  "argmax", "argmin", "xor_sum"))


def uses_exp(learner_file: str | None) -> bool | None:
    """Whether the learner's kernel takes ``tl.exp`` (None when the file cannot be read): NaN
    advice about exponentials is given only where there is one."""
    if learner_file:
        try:
            return "tl.exp(" in Path(learner_file).read_text()
        except OSError:
            pass
    return None


def uses_dot(learner_file: str | None, default: bool) -> bool:
    if learner_file:
        try:
            return "tl.dot(" in Path(learner_file).read_text() or default
        except OSError:
            pass
    return default

