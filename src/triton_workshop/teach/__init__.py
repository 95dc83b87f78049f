"""The workshop's teaching side: find an exercise file, run its launchers on fresh inputs, say
what is wrong. This is the face; each room does one job:

* :mod:`.session`: check a file (``check_exercise``, ``check_module``), in this process or in
  child processes (:mod:`.sandbox`), results merged; in interpreter mode the cases shared among
  forked workers, one per core (:mod:`.parallel`);
* :mod:`.loop`: the case loop over an exercise's cases;
* :mod:`.checker`: run one case (poisoned outputs, a time limit, the launcher called, judged);
* :mod:`.diagnose`: name the bug; :mod:`.errors`: an exception turned into a verdict;
* :mod:`.report`: printing; :mod:`.picture`: the grid picture;
* :mod:`.exercises`: the registry (:data:`EXERCISES`); :mod:`.progress`, :mod:`.profile`,
  :mod:`.tour`: the learner's other commands.

A ``workshop check N`` reads top to bottom: face -> session -> sandbox (child) -> loop -> checker
-> diagnose -> report.
"""

import importlib

# The workshop extra: every room prints through rich, so without it any teach command fails here,
# on import, where `workshop` turns the ImportError into one sentence naming the extra.
import rich  # noqa: F401

# Imported on first use (module __getattr__ below): `workshop check` imports this package
# before torch, to start its child processes first (:mod:`.early_start`).
_NAMES = {
    "EXERCISES": "exercises",
    "load_module": "learner_file",
    "REPO_ROOT": "learner_file",
    "iter_check": "loop",
    "missing_function_verdict": "loop",
    "check_exercise": "session",
    "check_module": "session",
    "compiled_natively": "session",
    "exercise_path": "session",
    "run_exercise": "session",
    "print_case": "report",
    "print_header": "report",
    "print_report": "report",
    "print_summary": "report",
    "TaskReport": "verdict",
    "case_tolerance": "verdict",
}


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))


__all__ = ["EXERCISES", "check_exercise", "check_module", "exercise_path", "iter_check", "load_module",
           "run_exercise"]
