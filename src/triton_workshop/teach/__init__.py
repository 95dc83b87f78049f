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

from .exercises import EXERCISES
from .learner_file import load_module
from .loop import iter_check
from .session import check_exercise, check_module, exercise_path, run_exercise

# More names this face has offered, from the rooms that define them.
from .learner_file import REPO_ROOT  # noqa: E402,F401
from .loop import missing_function_verdict  # noqa: E402,F401
from .report import print_case, print_header, print_report, print_summary  # noqa: E402,F401
from .session import compiled_natively  # noqa: E402,F401
from .verdict import TaskReport, case_tolerance  # noqa: E402,F401

__all__ = ["EXERCISES", "check_exercise", "check_module", "exercise_path", "iter_check", "load_module",
           "run_exercise"]
