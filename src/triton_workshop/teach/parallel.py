"""Checking a file with every core: the cases shared among child processes, printed in order.

In interpreter mode each case is seconds of Python on one core. So ``workshop check`` forks
several workers (:class:`.sandbox.ChildRun`) that share one pipe of unit numbers (a unit is a
case, a module check or a missing launcher, numbered in order over the tasks): each worker
claims the next number when it is free, so a slow case does not hold the others back. A task's
non-contiguous case runs once all its cases have passed, in a child of its own, while the workers
go on with the next task.

The learner sees what one child would print: the verdicts in case order, each as soon as every
case before it is in, only the first "not implemented" of a task, and a crash or a hang reported
for its case while a fresh worker carries on.
"""

from __future__ import annotations

import ast
import os
import queue
from pathlib import Path

from .report import CasePrinter, print_header, print_import_failure
from .sandbox import ChildRun, child_env, forks_children
from .verdict import CaseResult, Verdict

__all__ = ["check_parallel", "parallel_workers", "prints_while_checked"]

MAX_WORKERS = 4
#: Unit numbers in the pipe: 4096 bytes, one atomic write, more than any exercise has units.
UNITS = 2048


def parallel_workers() -> int:
    """How many workers a check uses: one per two cores (up to :data:`MAX_WORKERS`), and 1 where
    children are not forks (a GPU machine: there the cases run on the GPU, beside the rerun).
    Each worker pays its own warm-up (the file imported, every kernel's first interpretation,
    the cases drawn): on two cores shared with other work, two workers took longer than one."""
    if not forks_children():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores // 2))


_PRINTS = {"print", "print_if", "breakpoint_if", "device_print", "static_print"}


def prints_while_checked(path: Path, launchers=()) -> bool:
    """Whether the file prints while its cases run (print_if in a kernel, a print in a launcher):
    then one worker, so that what it prints comes in case order, between the verdicts."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return True  # one child, as ever, reports what is wrong with the file
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        kernel = any("jit" in ast.unparse(d) for d in node.decorator_list)
        if not (kernel or node.name in launchers):
            continue
        for call in ast.walk(node):
            if isinstance(call, ast.Call):
                func = call.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if name in _PRINTS:
                    return True
    return False


def _key(cid: str) -> tuple[int, int, int]:
    """A case id's place in a single child's order: missing launcher, cases, module check,
    non-contiguous case, task by task."""
    task, unit = cid.split(":", 1)
    if unit == "-":
        return int(task), 0, 0
    if unit == "module":
        return int(task), 2, 0
    if unit == "strided":
        return int(task), 3, 0
    return int(task), 1, int(unit)


def check_parallel(exercise, path: Path, *, seed: int, console, source: str, png=None,
                   time_limit: float, workers: int) -> int:
    """Check ``path`` with ``workers`` forked workers, printing as verdicts arrive, in case
    order; returns the exit code."""
    events: queue.Queue = queue.Queue()
    claims, fill = os.pipe()
    os.write(fill, b"".join(n.to_bytes(2, "big") for n in range(UNITS)))
    os.close(fill)  # the workers see the end of the pipe once every number is taken

    def child(role: str, extra: list[str], done: dict | None = None) -> ChildRun:
        run = ChildRun(role, exercise.number, path, seed, events, env=child_env(False), memcheck="auto",
                       time_limit=time_limit, extra_args=extra,
                       keep_fds=(claims,) if "--claims" in extra else ())
        run.done.update(done or {})
        runs[role] = run
        run.start()
        return run

    runs: dict[str, ChildRun] = {}
    print_header(exercise, console, source)
    workers_live = {f"worker {i}" for i in range(workers)}
    for role in sorted(workers_live):
        child(role, ["--claims", str(claims)])
    live = set(workers_live)
    last_start: dict[str, tuple | None] = dict.fromkeys(workers_live)
    pending: dict[str, dict] = {}
    shown: dict[int, dict[str, bool]] = {t: {} for t in range(len(exercise.tasks))}
    stopped: set[int] = set()  # tasks whose first "not implemented" is printed
    strided: dict[int, str] = {}  # task -> "running" | "done"
    printer = CasePrinter(exercise, console)

    def blocked(key: tuple) -> bool:
        if any(strided.get(t) != "done" for t in range(key[0])):
            return True
        return key[1] < 3 and any(last_start[w] is None or last_start[w] < key for w in workers_live)

    def show(event: dict) -> None:
        task = _key(event["id"])[0]
        if task in stopped:
            return  # a single child would have stopped this task before this case
        verdict = Verdict.from_dict(event["verdict"])
        printer.show(event["function"], CaseResult(event["label"], verdict, float(event["seconds"])))
        shown[task][event["id"]] = verdict.passed
        if not verdict.passed and verdict.headline.startswith("not implemented") and \
                _key(event["id"])[1] == 1:
            stopped.add(task)

    def settle() -> None:
        while True:
            ready = sorted(pending, key=_key)
            if ready and not blocked(_key(ready[0])):
                show(pending.pop(ready[0]))
                continue
            # A task whose cases are all in: its non-contiguous case, when they all passed.
            undecided = [t for t in shown if t not in strided]
            if not undecided:
                return
            t = undecided[0]
            if any(_key(cid)[0] == t for cid in pending) or any(
                    last_start[w] is None or last_start[w][0] <= t for w in workers_live):
                return
            results = shown[t]
            if t not in stopped and results and all(results.values()) and f"{t}:-" not in results:
                strided[t] = "running"
                live.add(f"strided {t}")
                child(f"strided {t}", ["--strided-of", str(t)], done=results)
                continue
            strided[t] = "done"

    failed_import = False
    try:
        while live:
            role, event = events.get()
            kind = event["event"]
            if kind == "finished":
                live.discard(role)
                workers_live.discard(role)
                if role.startswith("strided "):
                    strided[int(role.split()[1])] = "done"
            elif kind == "import_error":
                if role in last_start and not failed_import:
                    failed_import = True
                    print_import_failure(Verdict.from_dict(event["verdict"]), console)
                    for run in runs.values():
                        run.stop()
            elif kind == "start" and role in last_start:
                last_start[role] = _key(event["id"])
            elif kind == "result" and not failed_import:
                pending[event["id"]] = event
            if not failed_import:
                settle()
    finally:
        os.close(claims)
        for run in runs.values():
            run.stop()
    if failed_import:
        return 1
    for cid in sorted(pending, key=_key):  # none are left unless a child vanished mid-task
        show(pending.pop(cid))
    return printer.finish(png)
