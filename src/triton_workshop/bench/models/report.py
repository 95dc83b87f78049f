"""What a models run reports: a row per (model, candidate) (:class:`ModelResult`), compared with
torch eager and torch.compile, as a rich table, ``models.csv``, ``models.png`` and ``models.json``.
The files are written by the benchmark's own writers (:mod:`..report`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

from ..report import write_meta, write_table
from .run import Case
from .workloads import CANDIDATES, OURS, OURS_COMPILED, TORCH_COMPILE, TORCH_EAGER, ModelWorkload

__all__ = ["CSV_COLUMNS", "ModelResult", "compare", "result_of", "table", "verdicts", "write_csv",
           "write_plot", "write_reports"]


@dataclasses.dataclass
class ModelResult:
    model: str
    title: str
    candidate: str
    status: str  # ok, n/a, failed, oom, timeout
    size: str = ""
    ms_per_step: float | None = None
    tokens_per_s: float | None = None  # for models that read tokens
    first_step_s: float | None = None
    peak_gib: float | None = None
    loss_diff: float | None = None  # max |loss - torch eager's loss| over the first N steps
    final_loss: float | None = None
    vs_eager: float | None = None  # torch eager ms / this ms (>1: faster than eager)
    vs_compile: float | None = None  # torch.compile ms / this ms
    note: str = ""
    losses: list = dataclasses.field(default_factory=list, repr=False)  # json only


CSV_COLUMNS = tuple(f.name for f in dataclasses.fields(ModelResult) if f.name != "losses")


def result_of(workload: ModelWorkload, case: Case, status: str, payload) -> ModelResult:
    row = ModelResult(workload.name, workload.title, case.candidate, status,
                      size=workload.describe(case.size))
    if status != "ok":
        row.note = str(payload)
        return row
    row.ms_per_step = payload["ms_per_step"]
    if workload.tokens is not None and row.ms_per_step:
        row.tokens_per_s = workload.tokens(workload.sizes[case.size]) / (row.ms_per_step / 1e3)
    row.first_step_s = payload["first_step_s"]
    peak = payload.get("peak_bytes")
    row.peak_gib = None if peak is None else peak / 2**30
    row.losses = list(payload["losses"])
    row.final_loss = row.losses[-1]
    return row


def compare(rows: list[ModelResult]) -> None:
    """Fill ``vs_eager``, ``vs_compile`` and ``loss_diff`` of each model's rows from its torch
    eager and torch.compile rows."""
    by_model: dict[str, dict[str, ModelResult]] = {}
    for r in rows:
        by_model.setdefault(r.model, {})[r.candidate] = r
    for candidates in by_model.values():
        eager, compiled = candidates.get(TORCH_EAGER), candidates.get(TORCH_COMPILE)
        reference = eager.losses if eager and eager.status == "ok" else None
        for r in candidates.values():
            if r.status != "ok":
                continue
            if eager and eager.status == "ok":
                r.vs_eager = eager.ms_per_step / r.ms_per_step
            if compiled and compiled.status == "ok":
                r.vs_compile = compiled.ms_per_step / r.ms_per_step
            if reference is not None and r.losses:
                diffs = [abs(a - b) for a, b in zip(r.losses, reference)]
                r.loss_diff = max(diffs) if all(map(math.isfinite, diffs)) else math.inf


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def table(rows: Sequence[ModelResult]):
    from rich.markup import escape
    from rich.table import Table

    t = Table(
        title="Whole models (bf16 autocast)",
        caption=("ms/step: median over the timed steps (CUDA events). first step: wall time, "
                 "compile and autotune included. ×: torch's ms/step over this one (>1: faster). "
                 "loss Δ: max |loss − torch eager's| over the first steps, same init and data."),
        caption_justify="left",
    )  # fmt: skip
    for column, justify in (("model", "left"), ("candidate", "left"), ("ms/step", "right"),
                            ("tokens/s", "right"),
                            ("× eager", "right"), ("× compile", "right"), ("first step", "right"),
                            ("peak GiB", "right"), ("loss Δ", "right"), ("note", "left")):
        t.add_column(column, justify=justify, no_wrap=column != "note")
    previous = None
    for r in rows:
        name = r.model if r.model != previous else ""
        previous = r.model
        if r.status != "ok":
            style = "dim" if r.status == "n/a" else "red"
            t.add_row(name, r.candidate, f"[{style}]{r.status}[/]", "", "", "", "", "", "",
                      f"[{style}]{escape(r.note)}[/]")
            continue
        ours = r.candidate in (OURS, OURS_COMPILED)
        ms = _fmt(r.ms_per_step, ".1f")
        t.add_row(
            name, f"[bold]{r.candidate}[/]" if ours else r.candidate,
            f"[bold]{ms}[/]" if ours else ms, _fmt(r.tokens_per_s, ",.0f"),
            _fmt(r.vs_eager, ".2f", "×"), _fmt(r.vs_compile, ".2f", "×"),
            _fmt(r.first_step_s, ".1f", " s"), _fmt(r.peak_gib, ".2f"),
            _fmt(r.loss_diff, ".2g"), escape(r.note),
        )  # fmt: skip
    return t


def verdicts(rows: Sequence[ModelResult]) -> list[str]:
    """One line per model: triton-workshop's best (eager or compiled) against torch.compile."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        ours = [r for r in rows if r.model == model and r.candidate in (OURS, OURS_COMPILED)
                and r.status == "ok" and r.vs_compile is not None]  # fmt: skip
        if not ours:
            lines.append(f"{model}: no comparison with torch.compile (a candidate did not run)")
            continue
        best = max(ours, key=lambda r: r.vs_compile)
        lines.append(f"{model}: {OURS} at its best ({best.candidate}) runs "
                     f"{best.vs_compile:.2f}× torch.compile's speed")
    return lines


def write_csv(path: Path, rows: Sequence[ModelResult]) -> Path:
    def cells(r: ModelResult) -> list:
        return ["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)
                for v in (getattr(r, c) for c in CSV_COLUMNS)]  # fmt: skip

    return write_table(path, CSV_COLUMNS, (cells(r) for r in rows))


def write_plot(path: Path, rows: Sequence[ModelResult]) -> Path:
    """Two panels, a group of bars per model: speed relative to torch eager (higher is better),
    and the first step's seconds (log scale). A case that did not run has no bar but a mark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    candidates = [c for c in CANDIDATES if any(r.candidate == c for r in rows)]
    cell = {(r.model, r.candidate): r for r in rows}
    fig, (speed_ax, first_ax) = plt.subplots(1, 2, figsize=(max(8, 3.2 * len(models)), 4.5))
    width = 0.8 / max(1, len(candidates))
    for i, c in enumerate(candidates):
        offset = (i - (len(candidates) - 1) / 2) * width
        for ax, field in ((speed_ax, "vs_eager"), (first_ax, "first_step_s")):
            xs, heights = [], []
            for m, model in enumerate(models):
                r = cell.get((model, c))
                value = getattr(r, field) if r is not None and r.status == "ok" else None
                if value is not None:
                    xs.append(m + offset)
                    heights.append(value)
                elif r is not None:  # it ran and failed, or timed out: a mark, not a gap
                    ax.annotate("×", (m + offset, 0), ha="center", va="bottom", color="red",
                                xycoords=("data", "axes fraction"))
            ax.bar(xs, heights, width, label=c if ax is speed_ax else None)
    speed_ax.axhline(1.0, color="grey", linewidth=0.8)
    speed_ax.set_ylabel("speed vs torch eager (×, higher is better)")
    first_ax.set_ylabel("first step (s, compile + tune included)")
    first_ax.set_yscale("log")
    for ax in (speed_ax, first_ax):
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models, rotation=15)
    speed_ax.legend(fontsize=8)
    fig.suptitle("Whole models: triton-workshop against torch eager, torch.compile and peers")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_reports(out: Path, rows: Sequence[ModelResult], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "models.csv", rows)
    write_plot(out / "models.png", rows)
    write_meta(out / "models.json", {**meta, "verdicts": verdicts(rows),
                                     "rows": [dataclasses.asdict(r) for r in rows]})
