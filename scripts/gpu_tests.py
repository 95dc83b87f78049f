"""The test suite spread over every GPU of the machine, then the big-memory tests, one a GPU.

    python scripts/gpu_tests.py [--out DIR] [--workers 14] [--deadline 540] [-- PYTEST ARGS...]

The suite is about 3,300 tests; on one H100 with a dozen pytest-xdist workers it takes longer
than a 10-minute call. Here it runs as one pytest-xdist run with ``--workers`` processes a GPU,
each worker on one GPU (``CUDA_VISIBLE_DEVICES``, set by tests/conftest.py from the worker's
number), all taking tests from one queue, the big-memory tests left out; with three GPUs or
more the last GPU runs the big-memory tests (several GiB each) meanwhile, one at a time;
otherwise they follow the queue, one process a GPU, each with its share of the files, so that
nothing else competes for a GPU's memory. ``--shards N`` instead deals the files into N runs, balanced by
file size (a rough measure of a file's tests), each on its own GPU. Without a GPU there is one
shard, on the CPU.

Each shard writes ``pytest-shard<i>.log`` (``-v``: every test's outcome as it finishes, so a run cut
off still names what it ran) and ``failures-shard<i>.log`` (each failure's report the moment it
happens, through tests/conftest.py), and ``summary.txt`` is the table printed last: per shard the
passed, failed, errors, skipped and seconds, and whether it finished. At ``--deadline`` seconds
every shard still running is stopped and the table says so. Exit status: 0 when every shard
finished and nothing failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTCOME = re.compile(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ", re.M)
SERIAL_OUTCOME = re.compile(r" (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: |$)", re.M)


def gpu_count() -> int:
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                             capture_output=True, text=True, timeout=120)
        return int(out.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


def deal(files: list[Path], shards: int) -> list[list[Path]]:
    """The files in ``shards`` groups of about equal total size, largest first into the lightest."""
    groups: list[tuple[int, list[Path]]] = [(0, []) for _ in range(shards)]
    for f in sorted(files, key=lambda p: (-p.stat().st_size, p.name)):
        i = min(range(shards), key=lambda j: groups[j][0])
        groups[i] = (groups[i][0] + f.stat().st_size, groups[i][1] + [f])
    return [g for _, g in groups]


def count(log: str) -> dict[str, int]:
    found = OUTCOME.findall(log) or SERIAL_OUTCOME.findall(log)
    return {k: found.count(k) for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")}


def start(name: str, args: list[str], device: str | None, out: Path, workers: int,
          spread_over: int = 0) -> tuple:
    """Start pytest on ``args``: on GPU ``device``, or (``spread_over`` GPUs) its xdist workers
    dealt over them, worker i on GPU i mod ``spread_over`` (tests/conftest.py)."""
    env = dict(os.environ, TRITON_WORKSHOP_FAILURE_LOG=str(out / f"failures-{name}.log"),
               TRITON_WORKSHOP_AUTOTUNE=os.environ.get("TRITON_WORKSHOP_AUTOTUNE", "0"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    # Not inherited (this script run from inside a test): a worker's number and GPU count
    # would pick its GPU again in every process of this run.
    for variable in ("TRITON_WORKSHOP_WORKER_GPUS", "PYTEST_XDIST_WORKER"):
        env.pop(variable, None)
    if spread_over:
        env["TRITON_WORKSHOP_WORKER_GPUS"] = str(spread_over)
    has_xdist = subprocess.run([sys.executable, "-c", "import xdist"], capture_output=True).returncode == 0
    xdist = ["-n", str(workers), "--dist", "loadgroup"] if workers > 1 and has_xdist else []
    log = open(out / f"pytest-{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *args, "-v", "-p", "no:cacheprovider", "-rfE",
                             "--tb=short", *xdist], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return name, proc, log, time.monotonic()


def wait_all(runs: list[tuple], deadline: float) -> dict[str, tuple[int | None, float]]:
    """Each run's exit code (None: stopped at the deadline) and seconds."""
    done: dict[str, tuple[int | None, float]] = {}
    pending = list(runs)
    while pending:
        for run in list(pending):
            name, proc, log, started = run
            if proc.poll() is not None:
                done[name] = (proc.returncode, time.monotonic() - started)
            elif time.monotonic() > deadline:
                os.killpg(proc.pid, 9)
                proc.wait()
                done[name] = (None, time.monotonic() - started)
            else:
                continue
            log.close()
            pending.remove(run)
        if pending:
            time.sleep(1)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench-results"))
    parser.add_argument("--workers", type=int, default=14, help="pytest-xdist workers a shard")
    parser.add_argument("--shards", type=int, default=None,
                        help="split the files into this many runs, one a GPU; default: one run "
                             "whose workers are dealt over the GPUs (one shard without a GPU)")
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds for everything")
    parser.add_argument("pytest_args", nargs="*", help="after --: test files or pytest options")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline
    gpus = gpu_count()
    files = [a for a in args.pytest_args if a.endswith(".py")] or sorted(str(p) for p in (ROOT / "tests").glob("test_*.py"))
    options = [a for a in args.pytest_args if not a.endswith(".py")]
    marked = [ROOT / f for f in files if "big_memory" in (ROOT / f).read_text(errors="replace")]
    big_alongside = args.shards is None and gpus > 2 and bool(marked)
    if args.shards is None and gpus > 1:
        # One queue of tests for every worker of every GPU: no GPU idles at the end while
        # another still has its files' slow tests to run. With three GPUs or more, the last
        # one runs the big-memory tests meanwhile, one at a time, with its memory to itself.
        queue_gpus = gpus - 1 if big_alongside else gpus
        runs = [start("shard0", [*files, "-m", "not big_memory", *options], None, args.out,
                      args.workers * gpus, spread_over=queue_gpus)]
        if big_alongside:
            runs.append(start("big-memory", [*map(str, marked), "-m", "big_memory", *options],
                              str(gpus - 1), args.out, 1))
    else:
        groups = [g for g in deal([ROOT / f for f in files], args.shards or 1) if g]
        runs = [start(f"shard{i}", [*map(str, g), "-m", "not big_memory", *options],
                      str(i % gpus) if gpus else None, args.out, args.workers)
                for i, g in enumerate(groups)]
    results = wait_all(runs, deadline)
    if not big_alongside and time.monotonic() < deadline - 10:
        # One process a GPU, each with its own share of the files: a big-memory test has its
        # GPU to itself, and the dozen of them take a quarter of the time on four GPUs.
        big_groups = [g for g in deal(marked, max(gpus, 1)) if g]
        big = [start("big-memory" if len(big_groups) == 1 else f"big-memory{i}",
                     [*map(str, g), "-m", "big_memory", *options], str(i) if gpus else None,
                     args.out, 1) for i, g in enumerate(big_groups)]
        results.update(wait_all(big, deadline))
    rows, ok = [], True
    for name, (code, seconds) in results.items():
        counts = count((args.out / f"pytest-{name}.log").read_text(errors="replace"))
        finished = code is not None
        ok &= finished and code in (0, 5) and not counts["FAILED"] and not counts["ERROR"]
        rows.append(f"| {name} | {counts['PASSED']} | {counts['FAILED']} | {counts['ERROR']} | "
                    f"{counts['SKIPPED']} | {seconds:.0f} | {'exit ' + str(code) if finished else 'stopped at the deadline'} |")
    table = "\n".join(["| run | passed | failed | errors | skipped | seconds | end |",
                       "|---|---:|---:|---:|---:|---:|---|", *rows])
    (args.out / "summary.txt").write_text(table + "\n")
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
