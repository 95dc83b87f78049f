"""``workshop bench models``: whole models, end to end, on a CUDA GPU: the command line and the
run over models and candidates.

A practitioner judges a kernel library by the model, not by the kernel. This benchmark trains (or
runs) real models the way one would, with bf16 autocast, and measures per candidate:

* **ms/step**: the median of many steps, each timed with CUDA events, after a warm-up; and
  **tokens/s** for the models that read tokens;
* **first step (s)**: the wall time of the very first step, compiling and autotuning included
  (what a user waits for before anything happens);
* **peak memory**: ``torch.cuda.max_memory_allocated`` over the run;
* **loss Δ**: the largest difference between this candidate's losses and torch eager's over the
  first N steps from the same initial weights and the same batches (training: the optimiser's
  updates included, so errors compound as they would in a run).

Everything but the timing runs on the CPU too (tiny sizes, a fake timer): see
tests/test_bench_models.py. :func:`main` refuses without a GPU (exit code 2).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from ..measure import gpu_unavailable_reason
from .report import ModelResult, compare, result_of, table, verdicts, write_reports
from .interleave import interleavable, run_interleaved
from .run import Case, run_inline, run_isolated
from .workloads import CANDIDATES, SIZE_NAMES, WORKLOADS

__all__ = ["list_models", "main", "run_models"]


def _environment(device: str) -> dict[str, Any]:
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__,
           "python": sys.version.split()[0], "device": device,
           "time": datetime.datetime.now().isoformat(timespec="seconds")}  # fmt: skip
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def list_models() -> list[str]:
    """One line per model (its sizes), and one naming the candidates."""
    lines = [f"{w.name}: {w.title}  [full: {w.describe('full')}; quick: {w.describe('quick')}]"
             for w in WORKLOADS.values()]
    return lines + ["candidates: " + ", ".join(CANDIDATES)]


def run_models(
    *,
    quick: bool,
    out: Path,
    console=None,
    models: Sequence[str] | None = None,
    candidates: Sequence[str] | None = None,
    timeout_s: float = 300.0,
    isolate: bool = True,
    device: str | None = None,
    size: str | None = None,
    amp: bool | None = None,
    timer=None,
    interleave: int = 0,
) -> list[ModelResult]:
    """Measure ``models`` (default: all of :data:`WORKLOADS`) for ``candidates`` (default: all),
    torch eager first (the reference for the loss differences). Writes ``models.csv``,
    ``models.png`` and ``models.json`` into ``out`` after every model, prints the table to
    ``console`` (rich) and returns the rows.

    On a GPU, every case runs in its own process with ``timeout_s``; ``isolate=False`` runs them
    here. ``device``/``size``/``amp``/``timer`` exist for the CPU tests (``device="cpu"``,
    ``size="tiny"``, ``amp=False``: the interpreter's bf16 dots are not exact, and a fake timer);
    without ``device``, a missing GPU is a ``RuntimeError``.

    ``interleave=N`` (N rounds) times each model's candidates in turn in this process instead
    (:mod:`.interleave`: for host-bound steps, whose times move between processes), except a
    candidate whose patch holds for the whole process, which runs as above."""
    if device is None:
        reason = gpu_unavailable_reason()
        if reason:
            raise RuntimeError(f"workshop bench models needs a CUDA GPU: {reason}")
        device = "cuda"
    size = size or ("quick" if quick else "full")
    if size not in SIZE_NAMES:
        raise ValueError(f"size must be one of {SIZE_NAMES}, got {size!r}")
    amp = device.startswith("cuda") if amp is None else amp
    names = list(models) if models else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; valid: {', '.join(WORKLOADS)}")
    chosen = list(candidates) if candidates else list(CANDIDATES)
    bad = [c for c in chosen if c not in CANDIDATES]
    if bad:
        raise ValueError(f"unknown candidate(s) {bad}; valid: {', '.join(CANDIDATES)}")
    chosen = [c for c in CANDIDATES if c in chosen]  # torch eager first: the loss reference
    from rich.markup import escape

    if console is None:
        from rich.console import Console

        console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    out = Path(out)
    if interleave < 0:
        raise ValueError(f"interleave must be >= 0 rounds, got {interleave}")
    meta = {**_environment(device), "size": size, "amp_bf16": amp, "timeout_s": timeout_s,
            "interleave_rounds": interleave}
    rows: list[ModelResult] = []
    for name in names:
        workload = WORKLOADS[name]
        console.print(f"[bold]{workload.title}[/] ({workload.describe(size)})")
        cases = [Case(workload, candidate, size=size, device=device, amp=amp)
                 for candidate in chosen]
        shared = [c for c in cases if interleavable(c)] if interleave else []
        if shared:
            started = time.perf_counter()
            together = dict(zip([c.candidate for c in shared],
                                run_interleaved(shared, interleave, timer)))
            console.print(f"  {', '.join(together)}: built and timed in turn, {interleave} rounds "
                          f"[dim]({time.perf_counter() - started:.0f} s)[/]")
        for case in cases:
            candidate = case.candidate
            started = time.perf_counter()
            if shared and candidate in together:
                status, payload = together[candidate]
            elif isolate:
                status, payload = run_isolated(case, timeout_s)
            else:
                status, payload = run_inline(case, timer)
            row = result_of(workload, case, status, payload)
            rows.append(row)
            what = f"{row.ms_per_step:.2f} ms/step" if status == "ok" else f"{status}: {escape(row.note)}"
            console.print(f"  {candidate}: {what} [dim]({time.perf_counter() - started:.0f} s)[/]")
            compare(rows)
            write_reports(out, rows, meta)  # after every case: a run cut off keeps what it measured
    console.print(table(rows))
    for line in verdicts(rows):
        console.print(line)
    console.print(f"[dim]wrote {out / 'models.csv'}, {out / 'models.png'}, {out / 'models.json'}[/]")
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workshop bench models",
        description="Whole models on a CUDA GPU (GPT-2 124M, ResNet-18, a TransformerEncoder, "
                    "LLaMA): ms/step, tokens/s, first-step seconds, peak memory and loss "
                    "difference, for torch eager, torch.compile, triton-workshop (patched), both, "
                    "and Liger-Kernel eager and compiled.",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="smaller batches and fewer steps (GPT-2 4×512, ResNet 32×160², "
                             "LLaMA 2×1024)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="folder for models.csv, models.png, models.json (default: %(default)s)")
    parser.add_argument("--models", default="", help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    parser.add_argument("--candidates", default="",
                        help=f"comma-separated subset of: {', '.join(CANDIDATES)}")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one case may take, compile included (default: %(default)s)")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run the cases in this process (no timeout; for debugging)")
    parser.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                        help="time each model's candidates in turn, in one process, over ROUNDS "
                             "rounds (host-bound steps: their times move between processes); "
                             "all models on the GPU at once, no timeout, no peak memory each")
    parser.add_argument("--list", action="store_true", help="list the models and candidates")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``workshop bench models [--quick] [--out DIR] [--models a,b] [--candidates a,b]
    [--timeout S] [--no-isolate] [--interleave ROUNDS] [--list]``; returns the exit code (2
    without a GPU)."""
    try:
        args = _parser().parse_args(list(argv) if argv is not None else None)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.list:
        for line in list_models():
            print(line)
        return 0
    reason = gpu_unavailable_reason()
    if reason:
        print(f"workshop bench models: needs a CUDA GPU: {reason}.\n"
              "It times whole training steps; in the interpreter kernels run as Python on the "
              "CPU, where timings mean nothing. Run it on a machine with an NVIDIA GPU.",
              file=sys.stderr)  # fmt: skip
        return 2
    split = lambda text: [s.strip() for s in text.split(",") if s.strip()]  # noqa: E731
    try:
        run_models(quick=args.quick, out=args.out, models=split(args.models) or None,
                   candidates=split(args.candidates) or None, timeout_s=args.timeout,
                   isolate=not args.no_isolate, interleave=args.interleave)  # fmt: skip
    except ValueError as exc:
        print(f"workshop bench models: error: {exc}", file=sys.stderr)
        return 2
