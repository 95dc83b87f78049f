"""``workshop bench [NAME ...] [--quick] [--out DIR] [-k TEXT] [--list] [--update-results]``: the
suite's command line (``workshop bench models ...``: :mod:`.models`, its own options).

Parses the arguments, picks the specs (:mod:`.suite`), refuses without a CUDA GPU (in Triton's interpreter kernels
run as Python on the CPU and timings mean nothing: exit code 2), then runs the suite: every case
measured by :mod:`.measure`, each spec's table, plot and the CSV written by :mod:`.report` as soon
as the spec is done, so a cut-off run keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from .measure import (
    TIMING_FULL, TIMING_QUICK, Row, Timer, gpu_unavailable_reason, measure_case,
    measure_copy_ceiling, needs_copy_ceiling,
)
from .report import (
    case_line, problems, render_text, spec_table, summary_rows, summary_table, write_csv,
    write_meta, write_plot,
)
from .spec import Size, Spec, Workload, dtype_name
from .suite import MODELS, SPEC_NAMES, SPECS, load_spec, resolve_names

__all__ = ["SPECS", "SPEC_NAMES", "case_matches", "list_specs", "load_spec", "main",
           "resolve_names", "run_suite"]

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workshop bench",
        description=(
            "Benchmark triton-workshop's kernels on a CUDA GPU against PyTorch eager, "
            "torch.compile and vendor libraries, with the copy bandwidth (or cuBLAS) as ceiling."
        ),
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run (default: all): {', '.join(SPEC_NAMES)}; or "
                             f"'{MODELS}' alone: whole models, its own options (workshop bench "
                             f"{MODELS} --help)")
    parser.add_argument("--quick", action="store_true",
                        help="one mid size per workload and shorter timing (about 2 minutes)")
    parser.add_argument("--out", default="bench-results", type=Path,
                        help="folder for results.csv, <spec>.png and meta.json (default: %(default)s)")
    parser.add_argument("-k", "--match", action="append", default=[], metavar="TEXT",
                        help="only the cases whose 'workload size dtype' contains TEXT (repeatable; "
                             "'x' matches '×'), e.g. -k 'fwd+bwd' -k 8192x8192x8192")
    parser.add_argument("--graphs", action="store_true",
                        help="time each call captured in a CUDA graph (do_bench_cudagraph): the "
                             "GPU's own time, without the host's launches and autograd, which "
                             "bound small fwd+bwd cases; L2 is not flushed between replays")
    parser.add_argument("--list", action="store_true",
                        help="list the benchmarks, their workloads and sizes, and exit")
    parser.add_argument("--update-results", action="store_true",
                        help="after a run of the whole suite (no NAME, no -k): make its "
                             "results.csv docs/results/latest.csv and regenerate from it the "
                             "README's table, the slides' numbers and their plots "
                             "(bench/tables.py)")
    return parser


def list_specs(names: Sequence[str], console, *, models: bool = True) -> None:
    """Each spec's workloads and sizes; then (``models``) the whole models."""
    for name in names:
        spec = load_spec(name)
        console.print(f"[bold]{name}[/]: {spec.title}")
        for w in spec.workloads:
            sizes = ", ".join(w.label(s) for s in w.sizes)
            quick = ", ".join(w.label(s) for s in w.quick)
            console.print(f"  {w.name} ({dtype_name(w.dtype)}, {w.unit}): {sizes}  [dim]quick: {quick}[/]")
            console.print(f"    [dim]{w.work_formula}[/]")
    if models:
        from .models import list_models

        console.print(f"[bold]{MODELS}[/]: whole models, run on their own "
                      f"(workshop bench {MODELS} [--quick] [--models a,b])")
        for line in list_models():
            console.print(f"  {line}", markup=False)


def _console():
    from rich.console import Console

    # Piped into a log, rich would assume 80 columns and fold the tables.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def main(argv: list[str] | None = None) -> int:
    """``workshop bench [NAME ...] [--quick] [--out DIR] [--list]``, or ``workshop bench models
    ...`` (whole training and inference steps, their own options: bench/models.py); returns the
    exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [MODELS]:
        from .models import main as models_main

        return models_main(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return int(exit_.code or 0)
    try:
        names = resolve_names(args.names)
    except ValueError as exc:
        print(f"workshop bench: error: {exc}", file=sys.stderr)
        return 2
    console = _console()
    if args.list:
        list_specs(names, console, models=not args.names)
        return 0
    if args.update_results:
        from . import tables

        # The README and the slides show one run: a partial one would mix runs or drop rows.
        if args.names or args.match:
            problem = "it needs the whole suite: drop the benchmark names and -k"
        elif args.graphs:
            # One method for the published table: do_bench, L2 flushed (see --graphs).
            problem = "the results file holds plain timings: drop --graphs"
        else:
            problem = tables.repository_problem()
        if problem:
            print(f"workshop bench: --update-results: {problem}", file=sys.stderr)
            return 2
    reason = gpu_unavailable_reason()
    if reason:
        print(
            f"workshop bench: needs a CUDA GPU: {reason}.\n"
            "Benchmarks time compiled kernels; in the interpreter they run as Python on the CPU, "
            "where timings mean nothing. Run it on a machine with an NVIDIA GPU "
            "(scripts/gpu_check.sh runs the tests and the benchmarks there).",
            file=sys.stderr,
        )
        return 2
    code = run_suite([load_spec(n) for n in names], quick=args.quick, out=args.out,
                     console=console, match=args.match, graphs=args.graphs)
    if args.update_results:
        if code != 0:
            console.print("[red]--update-results: not updating docs/results/latest.csv: a "
                          "triton-workshop result was not ok[/]")
            return code
        command = f"workshop bench {shlex.join(argv)}".strip()
        written = tables.update_from_run(args.out, command=command)
        console.print(f"updated from this run: {', '.join(str(p) for p in written)}")
    return code


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _environment() -> dict[str, Any]:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def _timing(timer) -> str:
    """How the run times a call, for its header line."""
    if timer.graphs:
        return f"do_bench_cudagraph(rep={timer.rep}, median): the GPU's time, host excluded"
    return f"do_bench(warmup={timer.warmup}, rep={timer.rep}, median)"


def case_matches(w: Workload, size: Size, match: Sequence[str]) -> bool:
    """Whether ``-k`` keeps this case: no filter, or one TEXT is in 'name size dtype'."""
    if not match:
        return True
    text = f"{w.name} {w.label(size)} {dtype_name(w.dtype)}".replace("×", "x").lower()
    return any(m.replace("×", "x").lower() in text for m in match)


def run_suite(specs: Sequence[Spec], *, quick: bool, out: Path, console=None,
              match: Sequence[str] = (), graphs: bool = False) -> int:
    """Run the specs (only the cases ``match`` keeps, see :func:`case_matches`); print tables;
    write results.csv, <spec>.png and meta.json into ``out``. Returns 0 when every
    triton-workshop result was correct and measured, 1 otherwise (also when nothing matched)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or _console()
    # Inductor's hint to enable TF32 is noise here: the IEEE fp32 product is measured on purpose.
    warnings.filterwarnings("ignore", message=".*TensorFloat32 tensor cores.*")
    device = _device()
    timer = Timer(*(TIMING_QUICK if quick else TIMING_FULL), graphs=graphs)
    env = _environment()
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    console.print(
        f"[bold]triton-workshop bench[/] on {env['gpu']} · torch {env['torch']} · "
        f"triton {env['triton']} · {'quick' if quick else 'full'} sweep · {_timing(timer)} · "
        f"results → {out}/"
    )

    plan = [(spec, w, size) for spec in specs for w in spec.workloads for size in w.sizes_for(quick)
            if case_matches(w, size, match)]
    if not plan:
        console.print(f"[red]no benchmark case matches -k {' -k '.join(match)}[/] (see --list)")
        return 1
    ceiling_rows: list[Row] = []
    copy_rate = None
    if any(needs_copy_ceiling(w) for _, w, _ in plan):
        # Always timed plainly: captured in a graph, a copy of 1 GiB becomes a memcpy node that
        # ran at 65% of the kernel's rate on an H200 (2765 against 4221 GB/s).
        ceiling_timer = Timer(timer.warmup, timer.rep) if timer.graphs else timer
        ceiling_rows.append(measure_copy_ceiling(ceiling_timer, device))
        copy_rate = ceiling_rows[0].rate
        console.print(f"ceiling: device-to-device copy of 1 GiB: {copy_rate:.0f} GB/s "
                      "(bytes read + written)")

    meta: dict[str, Any] = {
        "timestamp": stamp, **env, "quick": quick, "specs": [s.name for s in specs],
        "timing": {"warmup_ms": timer.warmup, "rep_ms": timer.rep, "return_mode": "median",
                   "cuda_graphs": timer.graphs, "l2_flushed": not timer.graphs},
        "copy_ceiling_gbps": copy_rate,
        "work": {f"{w.name} ({dtype_name(w.dtype)})": w.work_formula
                 for s in specs for w in s.workloads},
        "files": [],
    }
    rows: list[Row] = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=not console.is_terminal)
    with progress:
        task = progress.add_task("bench", total=len(plan))
        done = 0
        for spec in specs:
            spec_rows: list[Row] = []
            for w in spec.workloads:
                for size in w.sizes_for(quick):
                    if not case_matches(w, size, match):
                        continue
                    done += 1
                    what = f"{spec.name} · {w.name} {w.label(size)} {dtype_name(w.dtype)}"
                    progress.update(task, description=what)
                    elapsed = time.perf_counter() - started
                    console.print(f"[dim][{done:>2}/{len(plan)} {elapsed:5.0f}s][/] {what}")
                    case = measure_case(spec, w, size, timer, device, copy_rate,
                                    headline=size in w.summary_sizes(quick))
                    console.print("        " + case_line(case))
                    spec_rows += case
                    progress.advance(task)
            if not spec_rows:
                continue
            rows += spec_rows
            console.print(spec_table(spec.title, spec_rows))
            for line in problems(spec_rows):
                console.print(f"  [red]{line}[/]")
            png = write_plot(out / f"{spec.name}.png", spec.title, spec_rows, env["gpu"])
            meta["files"].append(png.name)
            write_csv(out / "results.csv", ceiling_rows + rows)
            meta["elapsed_s"] = round(time.perf_counter() - started, 1)
            write_meta(out / "meta.json", {**meta, "files": ["results.csv", *meta["files"]]})

    summary = summary_table(rows)
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    meta["summary"] = summary_rows(rows)
    meta["summary_table"] = render_text(summary)
    meta["files"] = ["results.csv", *meta["files"], "meta.json"]
    write_csv(out / "results.csv", ceiling_rows + rows)
    write_meta(out / "meta.json", meta)
    failed = [r for r in rows if r.role == "ours" and r.status != "ok"]
    console.print(f"wrote {', '.join(meta['files'])} to {out}/ in {meta['elapsed_s']:.0f} s")
    if failed:
        console.print(f"[red]{len(failed)} triton-workshop result(s) not ok[/]")
    console.print(summary)
    return 1 if failed else 0
