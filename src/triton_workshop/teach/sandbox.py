"""Crash-proof checks: the learner's file runs in a child process.

A learner's kernel can take the whole interpreter down (a segfault, glibc's "corrupted
double-linked list" abort) or loop forever. So ``workshop check`` does not import the file
itself: a child process (``python -m triton_workshop.teach.sandbox``) imports it and checks one
case after another, writing one JSON line per event to a pipe. This process prints each verdict
the moment it arrives; if the child dies, or a case runs past its time limit, the case is
reported with the likely cause and a fresh child carries on with the cases left. Where this
process runs Triton's interpreter itself, a child is a fork of it (torch and Triton already
imported: no seconds spent importing them again); on a GPU machine a fresh Python.

On a GPU machine the cases run on the GPU, where nothing checks the bounds of a load or store.
A second child runs the same cases (same seed, same inputs) in Triton's interpreter
(``TRITON_INTERPRET=1``), bounds-checked; its out-of-bounds findings join each case's verdict. A
kernel that cannot compile because it calls an interpreter-only helper (``print_if``) is judged by
that run alone, with a note saying so.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from functools import partial
from pathlib import Path

from .. import runtime
from . import early_start
from .checker import CaseTimeout, hang_verdict, time_limit
from .errors import INTERPRETER_ONLY_HELPERS, import_failure, import_hang
from .early_start import child_argv, child_env
from .exercises import EXERCISES
from .learner_file import load_module
from .loop import iter_check
from .report import CasePrinter, print_header, print_import_failure
from .verdict import CaseResult, Verdict

__all__ = ["ChildRun", "ForkedChild", "InterpreterRerun", "check_isolated", "child_env", "child_main",
           "forks_children", "import_failure", "import_hang", "interpreted_instead", "merge", "rerun_only"]

STARTUP_LIMIT = 120.0  # seconds for a child to import torch, Triton and the learner's file
CUDA_BROKEN = ("CUDA error", "illegal memory access", "device-side assert", "unspecified launch failure")


def _crash_verdict(returncode: int | None, stderr_tail: str, label: str) -> Verdict:
    sig = -returncode if returncode is not None and returncode < 0 else None
    name = signal.Signals(sig).name if sig and sig in signal.Signals._value2member_map_ else (
        f"exit code {returncode}" if returncode is not None else "killed")
    text = stderr_tail.lower()
    if "corrupted" in text or "double free" in text or "malloc" in text or "free():" in text:
        cause = ("memory outside the tensors was written (the heap is corrupted): a store without a "
                 "mask, or a grid larger than the data")
    elif sig == signal.SIGSEGV:
        cause = ("a load or store far outside every tensor: a wrong stride or offset, or a grid "
                 "much larger than the data")
    elif sig == signal.SIGKILL:
        cause = "it ran out of memory: a huge grid or allocation (check the sizes the launcher computes)"
    elif sig == signal.SIGFPE:
        cause = "an integer division by zero"
    elif sig == signal.SIGABRT:
        cause = "an abort inside native code: often memory corrupted by an out-of-bounds store"
    else:
        cause = "native code failed"
    details = [f"likely cause: {cause}"]
    last = [ln.strip() for ln in stderr_tail.strip().splitlines() if ln.strip()]
    if last:
        details.append(f"its last words: {last[-1][:200]}")
    details.append("the other cases still ran: see below")
    return Verdict(False, f"the process checking this case died ({name})", details)


# --------------------------------------------------------------------------------------------
# The child.
# --------------------------------------------------------------------------------------------
def child_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triton_workshop.teach.sandbox")
    parser.add_argument("--exercise", type=int, required=True)
    parser.add_argument("--file", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--skip", default="{}")
    parser.add_argument("--memcheck", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--time-limit", type=float, default=None)
    parser.add_argument("--claims", type=int, default=None,
                        help="a pipe of unit numbers, shared with other children (teach.parallel)")
    parser.add_argument("--strided-of", type=int, default=None)
    args = parser.parse_args(argv)
    pipe = os.fdopen(args.fd, "w", buffering=1)

    def emit(**event):
        sys.stdout.flush()
        pipe.write(json.dumps(event) + "\n")
        pipe.flush()

    import torch

    # The child's tensors are small and the machine may be shared: one thread avoids the
    # intra-op pool's spinning, which costs more than it gains here.
    torch.set_num_threads(1)
    path = Path(args.file)
    limit = args.time_limit or STARTUP_LIMIT
    try:
        with time_limit(limit):
            module = load_module(path)
    except CaseTimeout:
        emit(event="import_error", verdict=import_hang(path, limit).to_dict())
        return 0
    except BaseException as exc:  # noqa: BLE001  (any failure to import is the learner's to fix)
        emit(event="import_error", verdict=import_failure(exc, path).to_dict())
        return 0
    memcheck = {"auto": None, "on": True, "off": False}[args.memcheck]
    for event, cid, function, label, result in iter_check(
            EXERCISES[args.exercise], module, seed=args.seed, learner_file=str(path),
            skip=json.loads(args.skip), memcheck=memcheck, time_limit=args.time_limit,
            claim=None if args.claims is None else partial(claim_unit, args.claims),
            strided_of=args.strided_of):
        if event == "start":
            emit(event="start", id=cid, function=function, label=label)
            continue
        emit(event="result", id=cid, function=function, label=label, seconds=result.seconds,
             verdict=result.verdict.to_dict())
        text = " ".join([result.verdict.headline, *result.verdict.details])
        if any(marker in text for marker in CUDA_BROKEN):
            emit(event="restart", reason="the CUDA context is broken after this error")
            return 3  # a fresh process gets a fresh CUDA context for the cases left
    emit(event="done")
    return 0


def claim_unit(fd: int) -> int | None:
    """The next unit number from a pipe of them (two bytes each, written at once, before any
    child started): a read this small is atomic, so children sharing the pipe never split one.
    None when the pipe is empty."""
    data = os.read(fd, 2)
    return int.from_bytes(data, "big") if len(data) == 2 else None


# --------------------------------------------------------------------------------------------
# The parent: one child at a time per role, restarted after a crash.
# --------------------------------------------------------------------------------------------
class ChildRun(threading.Thread):
    """Runs the cases of one exercise in child processes, restarting after a crash or a hang,
    and puts ``(role, event dict)`` on ``events``; ``(role, {"event": "finished"})`` last."""

    def __init__(self, role: str, number: int, path: Path, seed: int, events: queue.Queue, *,
                 env: dict, memcheck: str, time_limit: float, extra_args: tuple = (),
                 keep_fds: tuple = ()):
        super().__init__(daemon=True)
        self.extra_args, self.keep_fds = list(extra_args), tuple(keep_fds)
        self.role, self.number, self.path, self.seed = role, number, path, seed
        self.events, self.env, self.memcheck, self.time_limit = events, env, memcheck, time_limit
        self.done: dict[str, bool] = {}
        self.proc: subprocess.Popen | None = None
        # Where the child's output goes: our stdout as it is now. Lines relayed late (a child
        # killed mid-case) must not land in a stdout restored since (``workshop progress``
        # silences it only while it checks).
        self.out = sys.stdout
        self.stopped = False

    def put(self, **event):
        self.events.put((self.role, event))

    def run(self):
        try:
            while not self._one_child() and not self.stopped:
                pass
        finally:
            self.put(event="finished")

    def stop(self) -> None:
        """No more children: the one running is killed, and no fresh one starts."""
        self.stopped = True
        self._kill()

    def _one_child(self) -> bool:
        """Run one child to its end; True when nothing is left to do."""
        read_fd, write_fd = os.pipe()
        argv = child_argv(self.number, self.path, self.seed, write_fd, done=self.done,
                          memcheck=self.memcheck, time_limit=self.time_limit, extra_args=self.extra_args)
        early = None if forks_children() or self.keep_fds else early_start.adopt(self.role, argv, self.env)
        if early is not None:  # started before this process imported torch: the same command
            os.close(write_fd)
            os.close(read_fd)
            self.proc, read_fd, stderr = early.proc, early.read_fd, early.stderr
        else:
            stderr = tempfile.TemporaryFile()
            try:
                if forks_children():
                    self.proc = ForkedChild(argv, (write_fd, *self.keep_fds), stderr, self.env)
                else:
                    self.proc = early_start.spawn(argv, self.env, (write_fd, *self.keep_fds), stderr)
            finally:
                os.close(write_fd)
        relay = threading.Thread(target=_relay, args=(self.proc.stdout, self.out), daemon=True)
        relay.start()
        current, started, finished, buffer = None, time.monotonic(), False, b""
        try:
            while True:
                limit = (self.time_limit + 5.0) if current else STARTUP_LIMIT
                wait = max(0.0, started + limit - time.monotonic())
                ready, _, _ = select.select([read_fd], [], [], wait)
                if not ready:  # past the limit: a hang (the child's own alarm did not fire)
                    self._kill()
                    if current is None:
                        self.put(event="import_error", verdict=import_hang(self.path, limit).to_dict())
                        return True
                    self._result(current, hang_verdict(self.time_limit))
                    return False
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    event = json.loads(line)
                    kind = event["event"]
                    if kind == "start":
                        current, started = event, time.monotonic()
                        self.put(**event)
                    elif kind == "result":
                        self.done[event["id"]] = bool(event["verdict"]["passed"])
                        current, started = None, time.monotonic()
                        self.put(**event)
                    elif kind == "import_error":
                        self.put(**event)
                        finished = True
                    elif kind == "done":
                        finished = True
            self.proc.wait()
            relay.join(timeout=5)
            if isinstance(self.proc, ForkedChild):
                self.proc.stdout.close()
            if finished:
                return True
            if current is None:  # exited between cases (a restart after a CUDA error)
                return False
            stderr.seek(0)
            tail = stderr.read()[-4000:].decode(errors="replace")
            self._result(current, _crash_verdict(self.proc.returncode, tail, current["label"]))
            return False
        finally:
            os.close(read_fd)
            stderr.close()
            self._kill()

    def _result(self, start_event: dict, verdict: Verdict) -> None:
        self.done[start_event["id"]] = False
        self.put(event="result", id=start_event["id"], function=start_event["function"],
                 label=start_event["label"], seconds=0.0, verdict=verdict.to_dict())

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def forks_children() -> bool:
    """Whether a child is a fork of this process rather than a fresh Python: when this process
    already runs Triton's interpreter, as every child then does, a fork starts in milliseconds
    where a fresh one spends seconds importing torch and Triton again. A process that compiles
    for a GPU spawns: a CUDA context does not survive a fork, and the rerun child must decide
    for the interpreter before any kernel is decorated. Linux only: on macOS a fork of a process
    that loaded system frameworks may crash (Python spawns there by default too)."""
    return runtime.INTERPRET and hasattr(os, "fork") and sys.platform.startswith("linux")


class ForkedChild:
    """A child forked from this process that runs :func:`child_main`; what :class:`ChildRun`
    uses of a ``subprocess.Popen`` (``stdout``, ``poll``, ``wait``, ``kill``, ``returncode``)."""

    def __init__(self, argv: list[str], keep_fds: tuple[int, ...], stderr, env: dict | None = None):
        out_read, out_write = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns when a threaded process forks: the child below runs only
            # child_main, and replaces the streams other threads may have held.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            _forked_main(argv, keep_fds, out_write, stderr.fileno(), env)
        os.close(out_write)
        self.pid, self.returncode = pid, None
        self._reaping = threading.Lock()
        self.stdout = os.fdopen(out_read, "rb")

    def poll(self) -> int | None:
        # One thread reaps (the run's own, or one stopping it): the others see the code it set.
        if self.returncode is None and self._reaping.acquire(blocking=False):
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            finally:
                self._reaping.release()
        return self.returncode

    def wait(self) -> int:
        with self._reaping:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _forked_main(argv: list[str], keep_fds: tuple[int, ...], out_fd: int, err_fd: int,
                 env: dict | None) -> None:
    """The forked child: the same standard streams a spawned child gets (stdin empty, stdout to
    the parent's relay, stderr to its file), no other descriptor of the parent's kept open (a
    sibling's pipe would never see its end), then :func:`child_main`, then exit without running
    the parent's exit handlers."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        low = 3
        for fd in sorted(keep_fds):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, max(low, os.sysconf("SC_OPEN_MAX")))
        sys.stdin = sys.__stdin__ = open(0, closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
        if env is not None:  # what a learner's file reads at import sees a spawned child's
            os.environ.clear()
            os.environ.update(env)
        faulthandler.disable()  # a spawned child dies without a Python traceback: the same last words
        code = child_main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  (reported on stderr, as a spawned child's would be)
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _relay(stream, out) -> None:
    """The child's own output (a learner's print_if) goes to ours."""
    for line in iter(stream.readline, b""):
        if out is None:
            continue  # still read: a child blocked on a full pipe would hang
        try:
            out.write(line.decode(errors="replace"))
            out.flush()
        except ValueError:  # that stream was closed meanwhile (a test's capture): drop the rest
            out = None


WRITE_MAP_FINDINGS = ("the grid launches", "stores landed", "programs stored outside",
                      "the kernel never stored", "element(s) were stored more than once")
SUSPECT_FINDINGS = ("this looks like", "the wrong elements are what")
CATCH_ALL = "the wrong elements were never written: check the grid"


def interpreted_instead(native: Verdict, checked: Verdict) -> Verdict:
    """The interpreter run's verdict for a case that could not run compiled (``native`` says
    why: the kernel calls print_if), with a note saying so."""
    helper = next((h for h in INTERPRETER_ONLY_HELPERS if f"calls {h}," in native.headline), "print_if")
    note = (f"note: the kernel calls {helper}, which runs only in Triton's interpreter: this case "
            f"was checked there, bounds-checked, not on the GPU (remove the call, or use "
            "tl.device_print, to run it compiled)")
    return Verdict(checked.passed, checked.headline, [note] + [d for d in checked.details if d != note],
                   list(checked.memory), checked.picture)


def merge(native: Verdict, checked: Verdict | None) -> Verdict:
    """A GPU verdict with the interpreter rerun's findings added: its out-of-bounds accesses
    (which fail the case), and what only its write map can tell (who stored where). A case that
    could not run compiled at all (the kernel calls print_if) takes the rerun's verdict."""
    if checked is None:
        return native
    if native.needs_interpreter:
        return interpreted_instead(native, checked)
    if not native.passed and not checked.passed:
        have_suspect = any(d.startswith(SUSPECT_FINDINGS) for d in native.details)
        extra = [d for d in checked.details if d not in native.details and not d.startswith("first wrong")
                 and (d.startswith(WRITE_MAP_FINDINGS) or (not have_suspect and d.startswith(SUSPECT_FINDINGS)))]
        if extra:
            native.details = extra + [d for d in native.details if not d.startswith(CATCH_ALL)]
    if not checked.memory:
        if checked.headline.startswith("the process checking") or checked.headline.startswith("did not finish"):
            native.details.append(f"(the bounds-checked rerun in the interpreter: {checked.headline})")
        return native
    extra = [m for m in checked.memory if m not in native.details]
    if native.passed:
        return Verdict(False, checked.headline if checked.headline.startswith("the values are right")
                       else "out-of-bounds loads or stores (found by the bounds-checked rerun in "
                            "the interpreter)", extra + [d for d in checked.details if d not in extra],
                       list(checked.memory), checked.picture)
    native.passed = False
    native.details = extra + native.details
    native.memory = list(checked.memory)
    # The rerun's picture has what the native one cannot: the stray cells, and who stored where.
    native.picture = checked.picture or native.picture
    return native


def rerun_only(native: list[Verdict], native_ids, checked: dict) -> list[tuple[str, CaseResult]]:
    """The cases only the interpreter ran (the non-contiguous case, which runs once the others
    pass), as ``(function, result)``: they count when the kernel cannot run compiled, where the
    interpreter's run is the check."""
    stand_in = next((v for v in native if v.needs_interpreter), None)
    if stand_in is None:
        return []
    return [(function, CaseResult(result.label, interpreted_instead(stand_in, result.verdict), result.seconds))
            for cid, (function, result) in checked.items() if cid not in set(native_ids)]


class InterpreterRerun:
    """Every case of one exercise run again in an interpreter child, bounds-checked, in the
    background while this process runs them natively (``check_module`` on a GPU). The child's
    own output (a learner's print_if) goes to our stdout, as the native run's does."""

    def __init__(self, number: int, path: Path, seed: int, time_limit: float):
        self.events: queue.Queue = queue.Queue()
        self.child = ChildRun("memcheck", number, path, seed, self.events, env=child_env(True),
                              memcheck="on", time_limit=time_limit)
        self.child.start()

    def results(self) -> dict[str, tuple[str, CaseResult]]:
        """Waits for the child; ``{case id: (function, result)}`` in the order the cases ran
        (empty when the file does not import in the interpreter: the native verdicts stand)."""
        found: dict[str, tuple[str, CaseResult]] = {}
        while True:
            _, event = self.events.get()
            if event["event"] == "finished":
                return found
            if event["event"] == "result":
                found[event["id"]] = (event["function"], CaseResult(
                    event["label"], Verdict.from_dict(event["verdict"]), float(event["seconds"])))

    def stop(self) -> None:
        self.child.stop()


def check_isolated(exercise, path: Path, *, seed: int | None, console, source: str, png=None,
                   time_limit: float, rerun_in_interpreter: bool | None = None) -> int:
    """Check ``path`` in child processes, printing as verdicts arrive; returns the exit code."""
    if seed is None:
        seed = int(time.time_ns() % 2**31)
    if rerun_in_interpreter is None:
        rerun_in_interpreter = not runtime.INTERPRET
    events: queue.Queue = queue.Queue()
    runs = {"main": ChildRun("main", exercise.number, path, seed, events, env=child_env(False),
                             memcheck="off" if rerun_in_interpreter else "auto", time_limit=time_limit)}
    if rerun_in_interpreter:
        runs["memcheck"] = ChildRun("memcheck", exercise.number, path, seed, events,
                                    env=child_env(True), memcheck="on", time_limit=time_limit)
    print_header(exercise, console, source)
    for run in runs.values():
        run.start()
    pending: dict[str, dict] = {}  # main results waiting for their rerun
    checked: dict[str, tuple[str, CaseResult]] = {}
    memcheck_over = "memcheck" not in runs
    live = set(runs)
    failed_import = False
    printer = CasePrinter(exercise, console)
    native: dict[str, Verdict] = {}  # the main run's own verdicts, by case id

    def show_main(event: dict) -> None:
        verdict = native[event["id"]] = Verdict.from_dict(event["verdict"])
        rerun = checked.get(event["id"])
        printer.show(event["function"], CaseResult(event["label"], merge(verdict, rerun and rerun[1].verdict),
                                                   float(event["seconds"])))

    while live:
        role, event = events.get()
        kind = event["event"]
        if kind == "finished":
            live.discard(role)
            if role == "memcheck":
                memcheck_over = True
        elif kind == "import_error":
            if role == "main" and not failed_import:
                failed_import = True
                print_import_failure(Verdict.from_dict(event["verdict"]), console)
                for other in runs.values():
                    other.stop()
        elif kind == "result" and role == "memcheck":
            checked[event["id"]] = (event["function"], CaseResult(
                event["label"], Verdict.from_dict(event["verdict"]), float(event["seconds"])))
        elif kind == "result":
            pending[event["id"]] = event
        # Print, in order, the main results whose rerun is in (or over).
        for cid in list(pending):
            if not (memcheck_over or cid in checked):
                break
            show_main(pending.pop(cid))
    for cid in list(pending):
        show_main(pending.pop(cid))
    if failed_import:
        return 1
    for function, result in rerun_only(list(native.values()), list(native), checked):
        printer.show(function, result)
    return printer.finish(png)


def exit_now(code: int) -> None:
    """End the child without Python's teardown, its streams flushed: freeing torch's and
    Triton's objects one by one takes about a second that the learner would wait for (the
    parent reads the child's pipe until it closes). Every case has synchronized by then."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(child_main())
