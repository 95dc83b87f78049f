"""``workshop tour``: everything the workshop has, run once on this machine.

Checks every solution with the same checker learners get, checks the library's ops against
PyTorch, filters a sample image (or the user's) through the solutions' kernels, writes the
pictures to a folder, and prints a summary table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import runtime
from . import EXERCISES, check_module, exercise_path, load_module
from .filter_image import SIGNED_FILTERS
from .images import load_image, sample_image, save_image
from .progress import next_step, print_next_step
from .progress import progress as learner_progress


@dataclass
class Row:
    section: str
    name: str
    passed: bool
    detail: str
    seconds: float


def _library_checks() -> list[tuple[str, Callable[[], tuple[bool, str]]]]:
    """(name, check) pairs: each runs a public op on fresh random data and compares with torch."""
    import torch.nn.functional as F

    import triton_workshop as tw

    dev = runtime.DEVICE
    gen = torch.Generator().manual_seed(int(time.time()) % 2**31)

    def rand(*shape, dtype=torch.float32):
        return torch.rand(*shape, generator=gen).to(dev, dtype)

    def compare(name, ours, ref, tol=1e-5):
        err = ((ours.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-12)).item()
        return err <= tol, f"max rel. error {err:.1e}"

    checks = []

    def add(name):
        def deco(fn):
            checks.append((name, fn))
            return fn
        return deco

    @add("add")
    def _():
        x, y = rand(1001), rand(1001)
        return compare("add", tw.add(x, y), x.double() + y.double())

    @add("fused_mul_add_sqrt")
    def _():
        a, b, c = rand(999), rand(999), rand(999)
        return compare("sqrt", tw.fused_mul_add_sqrt(a, b, c), torch.sqrt(a.double() * b.double() + c.double()))

    optional = {
        "greyscale": lambda: compare("grey", tw.greyscale(img := rand(3, 33, 47)),
                                     torch.einsum("c,chw->hw", torch.tensor([0.299, 0.587, 0.114], dtype=torch.float64, device=dev), img.double())),
        "filter2d": lambda: compare("f2d", tw.filter2d(img := rand(3, 33, 47), k := rand(5, 5)),
                                    F.conv2d(img.double()[None], k.double().expand(3, 1, 5, 5), padding=2, groups=3)[0]),
        "softmax": lambda: compare("sm", tw.softmax(x := rand(17, 300) * 10), torch.softmax(x.double(), -1)),
        "layer_norm": lambda: compare("ln", tw.layer_norm(x := rand(9, 257), (257,)),
                                      F.layer_norm(x.double(), (257,)), tol=1e-4),
        "matmul": lambda: compare("mm", tw.matmul(a := rand(65, 70), b := rand(70, 33)), a.double() @ b.double()),
        "attention": lambda: compare("attn", tw.attention(q := rand(1, 2, 40, 16), k := rand(1, 2, 40, 16),
                                                          v := rand(1, 2, 40, 16)),
                                     torch.softmax(q.double() @ k.double().transpose(-1, -2) / 4.0, -1) @ v.double(),
                                     tol=1e-4),
    }
    for name, fn in optional.items():
        if hasattr(tw, name):
            checks.append((name, fn))
    return checks


def run_tour(out_dir: str | Path = "workshop-output", image: str | Path | None = None,
             console: Console | None = None) -> int:
    console = console or Console()
    try:  # the solutions are the clone's files, not the package's: say so before starting
        for number in EXERCISES:
            exercise_path(number, solution=True)
    except FileNotFoundError as exc:
        console.print(f"❌ workshop tour runs the reference solutions, files of a clone of "
                      f"triton-workshop that a pip-installed package does not include: {exc}",
                      markup=False, highlight=False)
        return 2
    out_dir = Path(out_dir)
    console.rule(f"[bold]triton-workshop tour[/bold] · {runtime.mode_description()}")
    rows: list[Row] = []
    img = load_image(image) if image else sample_image()
    if runtime.INTERPRET and image and img.shape[1] * img.shape[2] > 512 * 512:
        console.print(f"[yellow]{image} is {img.shape[2]}x{img.shape[1]}: the interpreter is slow; "
                      "filtering may take minutes[/yellow]")
    img = img.to(runtime.DEVICE)

    library = _library_checks()
    n_steps = len(EXERCISES) + len(library) + 1
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("starting", total=n_steps)
        modules = {}
        for number, exercise in EXERCISES.items():
            progress.update(task, description=f"checking solution {number}: {exercise.title}")
            start = time.perf_counter()
            modules[number] = module = load_module(exercise_path(number, solution=True))
            for report in check_module(exercise, module):
                bad = [c for c in report.cases if not c.verdict.passed]
                detail = f"{len(report.cases) - len(bad)}/{len(report.cases)} cases"
                if bad:
                    detail += f"; {bad[0].label}: {bad[0].verdict.headline}"
                rows.append(Row(f"solution {number}", report.function, not bad, detail,
                                time.perf_counter() - start))
            progress.advance(task)

        for name, check in library:
            progress.update(task, description=f"library op {name} vs PyTorch")
            start = time.perf_counter()
            try:
                ok, detail = check()
            except Exception as exc:  # report, keep touring
                ok, detail = False, f"{type(exc).__name__}: {exc}"[:120]
            rows.append(Row("library", name, ok, detail, time.perf_counter() - start))
            progress.advance(task)

        progress.update(task, description="filtering the image")
        start = time.perf_counter()
        written = _write_images(img, modules[2], modules[3], out_dir)
        rows.append(Row("images", "greyscale, sepia, filters", True,
                        f"{len(written)} files in {out_dir}/", time.perf_counter() - start))
        progress.advance(task)

    table = Table(title="Summary", show_lines=False)
    for col in ("", "part", "what", "result", "time"):
        table.add_column(col)
    for r in rows:
        table.add_row("✅" if r.passed else "❌", r.section, r.name, r.detail, f"{r.seconds:.1f}s")
    console.print(table)
    console.print("Images: " + ", ".join(p.name for p in written))
    ok = all(r.passed for r in rows)
    console.print("[green]Tour complete: everything passed.[/green]" if ok
                  else "[red]Tour finished with failures (see ❌ above).[/red]")
    # Where the learner stands in their own exercise files (``workshop progress`` shows all).
    print_next_step(next_step(learner_progress()), console)
    return 0 if ok else 1


def _write_images(img: torch.Tensor, sol2, sol3, out_dir: Path) -> list[Path]:
    from ..ops.image import FILTERS

    if runtime.INTERPRET:
        # The interpreter runs each program as NumPy code: a few big tiles beat many small ones.
        for module in (sol2, sol3):
            module.BLOCK_H, module.BLOCK_W = 64, 128
    written = [save_image(img, out_dir / "original.png"),
               save_image(sol2.greyscale(img), out_dir / "greyscale.png"),
               save_image(sol2.sepia(img), out_dir / "sepia.png")]
    for name, taps in FILTERS.items():
        out = sol3.filter2d(img, taps.to(img.device))
        if name in SIGNED_FILTERS:
            out = out.abs()
        written.append(save_image(out, out_dir / f"{name}.png"))
    return written
