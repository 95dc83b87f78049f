"""The check's child processes, started before this process imports torch.

On a GPU machine ``workshop check N`` runs the learner's file in two fresh Pythons (the GPU run
and the bounds-checked rerun in the interpreter, :mod:`.sandbox`), and each spends seconds
importing torch and Triton. The checking process needs them too, for its own printing. Done one
after the other, a learner waits for two imports before the first case runs; so the console
script starts both children first, from here (nothing in this module imports torch), and imports
the rest while they import theirs. :class:`.sandbox.ChildRun` then adopts each child whose
command line and environment are exactly what it would have started itself; one not adopted
(the machine turned out to have no usable GPU, a test changed the environment) is killed.

Where the children are forks of the checking process (interpreter mode) nothing starts early:
a fork costs milliseconds.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CASE_TIME_LIMIT", "EarlyChild", "adopt", "child_argv", "child_env", "discard",
           "gpu_likely", "spawn", "start_children"]

CASE_TIME_LIMIT = 60.0  # seconds one case may run before it counts as hanging
CHILD_MODULE = "triton_workshop.teach.sandbox"


def child_env(interpret: bool) -> dict:
    """A child's environment: quiet, unbuffered, this package first on the path, and Triton's
    interpreter when ``interpret``."""
    env = dict(os.environ, TRITON_WORKSHOP_QUIET="1", PYTHONUNBUFFERED="1")
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def child_argv(number: int, path: Path, seed: int, fd: int, *, done: dict, memcheck: str,
               time_limit: float, extra_args=()) -> list[str]:
    """The arguments of ``python -m triton_workshop.teach.sandbox`` (see its ``child_main``)."""
    return ["--exercise", str(number), "--file", str(path), "--seed", str(seed), "--fd", str(fd),
            "--skip", json.dumps(done), "--memcheck", memcheck, "--time-limit", str(time_limit),
            *extra_args]


def gpu_likely() -> bool:
    """Whether kernels will compile for a GPU here, guessed without torch: no
    ``TRITON_INTERPRET``, a CUDA device node, and ``CUDA_VISIBLE_DEVICES`` not hiding them all.
    A wrong guess costs only the early children, killed unadopted."""
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        return False
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    return sys.platform.startswith("linux") and bool(glob.glob("/dev/nvidia[0-9]*"))


@dataclass
class EarlyChild:
    """A started child: the process, the read end of its event pipe, its stderr file, and the
    command line and environment it was started with (what adoption compares)."""
    proc: subprocess.Popen
    read_fd: int
    stderr: object
    key: tuple


_STARTED: dict[str, EarlyChild] = {}


def _key(argv: list[str], env: dict) -> tuple:
    fd = argv.index("--fd")
    return tuple(argv[:fd + 1] + argv[fd + 2:]), tuple(sorted(env.items()))


def spawn(argv: list[str], env: dict, pass_fds: tuple, stderr) -> subprocess.Popen:
    """A fresh Python running a child (``python -m triton_workshop.teach.sandbox argv``): stdin
    empty, stdout a pipe (what the learner's file prints, relayed by the parent), stderr to
    ``stderr``, the event pipe's end among ``pass_fds``."""
    return subprocess.Popen([sys.executable, "-m", CHILD_MODULE, *argv], env=env, pass_fds=pass_fds,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr)


def start(role: str, argv_without_fd, env: dict) -> None:
    """Start one child now (``argv_without_fd``: :func:`child_argv`'s list for fd -1)."""
    read_fd, write_fd = os.pipe()
    argv = list(argv_without_fd)
    argv[argv.index("--fd") + 1] = str(write_fd)
    stderr = tempfile.TemporaryFile()
    try:
        proc = spawn(argv, env, (write_fd,), stderr)
    except OSError:
        os.close(read_fd)
        stderr.close()
        return
    finally:
        os.close(write_fd)
    _STARTED[role] = EarlyChild(proc, read_fd, stderr, _key(argv, env))


def adopt(role: str, argv: list[str], env: dict) -> EarlyChild | None:
    """The child started early for ``role`` if it runs exactly ``argv`` (its ``--fd`` aside) in
    ``env``; else None, and that child is killed."""
    child = _STARTED.pop(role, None)
    if child is None:
        return None
    if child.key == _key(argv, env):
        return child
    _kill(child)
    return None


def discard() -> None:
    """Kill the children nobody adopted (the check ended early, or ran in this process)."""
    while _STARTED:
        _kill(_STARTED.popitem()[1])


def _kill(child: EarlyChild) -> None:
    if child.proc.poll() is None:
        child.proc.kill()
        child.proc.wait()
    for close in (lambda: os.close(child.read_fd), child.stderr.close, child.proc.stdout.close):
        try:
            close()
        except OSError:
            pass


def start_children(number: int, path: Path, *, seed: int | None, time_limit: float | None) -> int | None:
    """Start the GPU run's child and the interpreter rerun's for checking ``path`` as exercise
    ``number``, when a GPU is likely; returns the seed they use (pass it on to the check, whose
    children must draw the same inputs), or None when nothing started."""
    if not gpu_likely() or not path.is_file() or os.name != "posix":
        return None
    if seed is None:
        seed = int(time.time_ns() % 2**31)
    limit = CASE_TIME_LIMIT if time_limit is None else time_limit
    path = Path(path)
    for role, memcheck, interpret in (("main", "off", False), ("memcheck", "on", True)):
        start(role, child_argv(number, path, seed, -1, done={}, memcheck=memcheck, time_limit=limit),
              child_env(interpret))
    return seed
