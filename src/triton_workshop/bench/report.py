"""What a run reports: a rich table per spec and a summary table, ``results.csv``, one PNG plot per
spec and ``meta.json`` (GPU, versions, timestamp, the summary). Everything here reads
:class:`~.measure.Row` s; nothing measures.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from .measure import Row
from .spec import OURS, TORCH_COMPILE, TORCH_EAGER

__all__ = ["CSV_COLUMNS", "case_line", "problems", "rate_text", "ratio_text", "render_text",
           "spec_table", "summary_rows", "summary_table", "write_csv", "write_meta", "write_plot",
           "write_table"]

CSV_COLUMNS = (
    "spec", "op", "size", "dtype", "candidate", "role", "status", "ms", "rate", "unit",
    "pct_of_ceiling", "ceiling", "ceiling_source", "ratio_vs_triton_workshop", "headline", "note",
)


def rate_text(rate: float | None) -> str:
    if rate is None:
        return "–"
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}"


def ratio_text(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"


_STATUS_STYLE = {"wrong": "bold red", "error": "red", "oom": "red", "unavailable": "dim"}


def _cell(r: Row | None) -> str:
    if r is None:
        return ""
    if r.status != "ok":
        label = {"wrong": "WRONG", "unavailable": "n/a"}.get(r.status, r.status)
        return f"[{_STATUS_STYLE.get(r.status, '')}]{label}[/]"
    if r.role == "ours":
        pct = r.pct_ceiling
        return f"[bold]{rate_text(r.rate)}[/]" + ("" if pct is None else f" ({pct:.0f}%)")
    return f"{rate_text(r.rate)} ({ratio_text(r.ratio)})"


def _cases(rows: Iterable[Row]) -> dict[tuple[str, str, str], dict[str, Row]]:
    """(op, size, dtype) → candidate → Row, in the order measured."""
    cases: dict[tuple[str, str, str], dict[str, Row]] = {}
    for r in rows:
        cases.setdefault((r.op, r.size, r.dtype), {})[r.candidate] = r
    return cases


def spec_table(spec_title: str, rows: Sequence[Row]):
    """One rich table: a row per (op, size), a column per candidate."""
    from rich.table import Table

    candidates = list(dict.fromkeys(r.candidate for r in rows))
    unit = rows[0].unit if rows else ""
    table = Table(
        title=f"{spec_title} ({unit})",
        caption=(
            f"{OURS}: {unit} (% of ceiling); peers: {unit} (speed-up of {OURS} over the peer, "
            ">1× = ours faster). WRONG: failed the correctness check, not timed."
        ),
        caption_justify="left",
    )
    for column in ("op", "size", "dtype", "ceiling"):
        table.add_column(column, no_wrap=True)
    for c in candidates:
        table.add_column(c, justify="right")
    for (op, size, dtype), by_candidate in _cases(rows).items():
        first = next(iter(by_candidate.values()))
        ceiling = f"{rate_text(first.ceiling)} {first.ceiling_source}" if first.ceiling else "–"
        table.add_row(op, size, dtype, ceiling, *(_cell(by_candidate.get(c)) for c in candidates))
    return table


def problems(rows: Iterable[Row]) -> list[str]:
    """One line per result that is not a clean measurement of a candidate we expected to run."""
    out = []
    for r in rows:
        if r.status != "ok" and not r.note.startswith("not importable"):
            out.append(f"{r.op} {r.size} {r.dtype} · {r.candidate}: {r.status.upper()} {r.note}")
    return out


def summary_rows(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """One entry per workload and headline size: ours, % of ceiling, speed-up against each peer."""
    out = []
    for (op, size, dtype), by_candidate in _cases(r for r in rows if r.headline).items():
        ours = by_candidate.get(OURS)
        if ours is None:
            continue
        entry: dict[str, Any] = {
            "op": op, "size": size, "dtype": dtype, "unit": ours.unit, "status": ours.status,
            "rate": ours.rate, "pct_of_ceiling": ours.pct_ceiling,
            "ceiling_source": ours.ceiling_source, "speedup": {},
        }
        for name, r in by_candidate.items():
            if name != OURS:
                entry["speedup"][name] = r.ratio if r.status == "ok" else None
        entry["reference"] = next(
            (n for n, r in by_candidate.items() if r.role == "reference"), None
        )
        out.append(entry)
    return out


def summary_table(rows: Sequence[Row]):
    from rich.table import Table

    table = Table(
        title="Summary: triton-workshop at each workload's headline size",
        caption="speed-ups are peer time / triton-workshop time (>1× = triton-workshop faster)",
        caption_justify="left",
    )
    for column in ("op", "size", "dtype", OURS, "% ceiling", "vs eager/vendor", "vs compile",
                   "vs others"):
        table.add_column(column, no_wrap=column not in ("vs others",),
                         justify="left" if column in ("op", "size", "dtype", "vs others") else "right")
    for e in summary_rows(rows):
        if e["status"] != "ok":
            style = _STATUS_STYLE.get(e["status"], "")
            table.add_row(e["op"], e["size"], e["dtype"], f"[{style}]{e['status'].upper()}[/]",
                          "", "", "", "")
            continue
        speedup = dict(e["speedup"])
        ref = e["reference"]
        ref_ratio = speedup.pop(ref, None)
        ref_cell = ratio_text(ref_ratio) + ("" if ref == TORCH_EAGER or ref is None else f" {ref}")
        compile_cell = ratio_text(speedup.pop(TORCH_COMPILE, None))
        others = ", ".join(f"{n} {ratio_text(v)}" for n, v in speedup.items() if v is not None)
        pct = e["pct_of_ceiling"]
        table.add_row(
            e["op"], e["size"], e["dtype"], f"{rate_text(e['rate'])} {e['unit']}",
            "–" if pct is None else f"{pct:.0f}% {e['ceiling_source']}",
            ref_cell, compile_cell, others,
        )
    return table


def render_text(renderable, width: int = 200) -> str:
    """A rich renderable as plain text (for meta.json and logs)."""
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False).print(renderable)
    return buffer.getvalue()


def write_table(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    """A CSV file: ``header``, then one line per row (the benchmark's and the models' writer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _csv_cells(r: Row) -> list:
    pct = r.pct_ceiling
    return [
        r.spec, r.op, r.size, r.dtype, r.candidate, r.role, r.status,
        "" if r.ms is None else f"{r.ms:.6g}",
        "" if r.rate is None else f"{r.rate:.6g}",
        r.unit,
        "" if pct is None else f"{pct:.2f}",
        "" if r.ceiling is None else f"{r.ceiling:.6g}",
        r.ceiling_source,
        "" if r.ratio is None else f"{r.ratio:.4f}",
        int(r.headline), r.note,
    ]


def write_csv(path: Path, rows: Iterable[Row]) -> Path:
    return write_table(path, CSV_COLUMNS, (_csv_cells(r) for r in rows))


def write_plot(path: Path, spec_title: str, rows: Sequence[Row], subtitle: str = "") -> Path:
    """One figure per spec, one panel per workload: x = size, y = GB/s or TFLOP/s, a line per
    candidate, the ceiling dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        panels.setdefault((r.op, r.dtype), []).append(r)
    n = max(1, len(panels))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), squeeze=False)
    # One colour per candidate across all panels, whatever each panel lacks.
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {c: palette[i % len(palette)]
               for i, c in enumerate(dict.fromkeys(r.candidate for r in rows))}
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, ((op, dtype), panel) in zip(axes.flat, panels.items()):
        sizes = list(dict.fromkeys(r.size for r in panel))
        x = list(range(len(sizes)))
        unit = panel[0].unit
        for candidate in dict.fromkeys(r.candidate for r in panel):
            by_size = {r.size: r for r in panel if r.candidate == candidate}
            y = [
                by_size[s].rate if s in by_size and by_size[s].status == "ok" else math.nan
                for s in sizes
            ]
            if all(math.isnan(v) for v in y):
                continue
            ax.plot(x, y, marker="o", label=candidate, color=colours[candidate],
                    linewidth=2.2 if candidate == OURS else 1.4)
        failed = [f"{r.size}: {r.status.upper()}" for r in panel
                  if r.candidate == OURS and r.status != "ok"]
        if failed:
            ax.text(0.02, 0.02, f"{OURS} " + ", ".join(failed), transform=ax.transAxes,
                    color="red", fontsize=7)
        ceiling = {r.size: r.ceiling for r in panel if r.ceiling}
        if ceiling:
            yc = [ceiling.get(s, math.nan) for s in sizes]
            label = f"ceiling ({panel[0].ceiling_source})"
            if len(x) == 1:  # one point draws no line: a dashed tick instead
                ax.hlines(yc, [v - 0.3 for v in x], [v + 0.3 for v in x], colors="k",
                          linestyles="dashed", linewidth=1, label=label)
            else:
                ax.plot(x, yc, "k--", linewidth=1, label=label)
        ax.set_xticks(x)
        ax.set_xticklabels(sizes, rotation=30 if max(len(s) for s in sizes) > 6 else 0,
                           ha="right" if max(len(s) for s in sizes) > 6 else "center", fontsize=8)
        ax.set_title(f"{op} ({dtype})", fontsize=10)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(spec_title + (f" — {subtitle}" if subtitle else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_meta(path: Path, meta: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return path


def case_line(rows: Sequence[Row]) -> str:
    parts = []
    for r in rows:
        if r.status != "ok":
            parts.append(f"{r.candidate} {_cell(r)}")
        elif r.role == "ours":
            pct = r.pct_ceiling
            parts.append(f"{r.candidate} {rate_text(r.rate)} {r.unit}"
                         + ("" if pct is None else f" ({pct:.0f}% of {r.ceiling_source})"))
        else:
            parts.append(f"{r.candidate} {ratio_text(r.ratio)}")
    return " · ".join(parts)
