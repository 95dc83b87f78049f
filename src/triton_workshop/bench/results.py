"""The results file, read: ``docs/results/latest.csv`` (a ``workshop bench`` run's
``results.csv``) and ``latest.json`` (which run it was) as :class:`Results`, and the cells the
README's and the slides' tables are made of (a rate, a share of the ceiling, a speed-up).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .measure import Row
from .report import CSV_COLUMNS, rate_text, ratio_text, summary_rows
from .spec import OURS, TORCH_COMPILE, TORCH_EAGER

__all__ = ["CUDA_LIBRARIES", "META_KEYS", "PLOTS_DIR", "REPO_ROOT", "RESULTS_CSV", "RESULTS_META",
           "SAME", "SPEEDUP_NOTE", "Results", "cell_compile", "cell_dtype", "cell_others",
           "cell_pct", "cell_rate", "cell_reference", "group_entries", "is_cuda_library",
           "load_results", "markdown_table", "rate_text", "ratio_text", "read_rows", "short"]

#: The checkout this module belongs to (src/triton_workshop/bench/results.py -> the repository).
REPO_ROOT = Path(__file__).resolve().parents[3]
RESULTS_CSV = Path("docs/results/latest.csv")
RESULTS_META = Path("docs/results/latest.json")
PLOTS_DIR = Path("docs/results/latest")

#: What latest.json must say, so that every table can name the run it shows.
META_KEYS = ("gpu", "date", "command")

#: Candidates that are NVIDIA's hand-written CUDA libraries (cuBLAS, cuDNN, and SDPA's
#: FlashAttention-2 and cuDNN back ends), as opposed to PyTorch eager or torch.compile.
CUDA_LIBRARIES = ("cuBLAS", "cuDNN", "SDPA flash", "SDPA cuDNN")

#: A speed-up within this factor of 1 counts as "the same": runs on one GPU drift by about that.
SAME = 0.02


# ----------------------------------------------------------------------------------------------
# The results file.
# ----------------------------------------------------------------------------------------------
def _number(text: str) -> float | None:
    return float(text) if text.strip() else None


def read_rows(path: str | Path) -> list[Row]:
    """The :class:`~.measure.Row` s of a ``results.csv`` that :func:`.report.write_csv` wrote."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
            raise ValueError(f"{path}: its columns {reader.fieldnames} are not the benchmark's "
                             f"results.csv columns {list(CSV_COLUMNS)}")
        rows = []
        for line, r in enumerate(reader, start=2):
            try:
                rows.append(Row(
                    spec=r["spec"], op=r["op"], size=r["size"], dtype=r["dtype"],
                    candidate=r["candidate"], status=r["status"], ms=_number(r["ms"]),
                    rate=_number(r["rate"]), unit=r["unit"], ceiling=_number(r["ceiling"]),
                    ceiling_source=r["ceiling_source"], role=r["role"],
                    ratio=_number(r["ratio_vs_triton_workshop"]),
                    headline=r["headline"].strip() == "1", note=r["note"],
                ))
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: {exc}") from None
    if not any(r.role == "ours" for r in rows):
        raise ValueError(f"{path}: no triton-workshop row: not a benchmark's results.csv")
    return rows


@dataclass(frozen=True)
class Results:
    """One benchmark run: its rows and what run it was."""

    rows: tuple[Row, ...]
    meta: dict[str, Any]
    csv_path: Path = RESULTS_CSV  # as the generated text names it (relative to the repository)

    @property
    def copy_row(self) -> Row:
        for r in self.rows:
            if r.role == "ceiling" and r.op.startswith("copy"):
                return r
        raise KeyError(f"{self.csv_path} has no copy-bandwidth row (spec 'ceiling')")

    @property
    def copy_gbps(self) -> float:
        return self.copy_row.rate

    def row(self, op: str, dtype: str, candidate: str = OURS, size: str | None = None) -> Row:
        """The row of ``candidate`` for ``op`` in ``dtype``, at ``size`` or else at the headline
        size; KeyError naming what the file holds when there is none."""
        found = [r for r in self.rows if r.op == op and r.dtype == dtype
                 and r.candidate == candidate and (r.size == size if size else r.headline)]
        if len(found) != 1:
            held = sorted({f"{r.op} {r.dtype}" for r in self.rows if r.role == "ours"})
            raise KeyError(f"{self.csv_path}: {len(found)} rows for {op!r} {dtype} {candidate!r} "
                           f"at {size or 'the headline size'}; it holds: {', '.join(held)}")
        return found[0]

    def headline_rows(self, op: str, dtype: str, candidate: str = OURS) -> list[Row]:
        """Every headline row of ``candidate`` for ``op`` in ``dtype``, in the order measured."""
        found = [r for r in self.rows if r.op == op and r.dtype == dtype
                 and r.candidate == candidate and r.headline]
        if not found:
            raise KeyError(f"{self.csv_path}: no headline row for {op!r} {dtype} {candidate!r}")
        return found

    def entries(self) -> list[dict[str, Any]]:
        """:func:`.report.summary_rows`: triton-workshop at each headline size, with its peers."""
        return summary_rows(self.rows)

    def run_text(self, *, link: str | None = None) -> str:
        """One line naming the run: GPU, date, command, commit and versions, and the file."""
        m = self.meta
        parts = [f"**{m['gpu']}, {m['date']}**", f"`{m['command']}`"]
        if m.get("commit"):
            parts.append(f"commit {m['commit']}")
        versions = ", ".join(f"{name} {m[key]}" for name, key in
                             (("torch", "torch"), ("Triton", "triton")) if m.get(key))
        if versions:
            parts.append(versions)
        if m.get("quick"):
            parts.append("`--quick` sweep")
        where = f"[{self.csv_path.as_posix()}]({link})" if link else f"`{self.csv_path.as_posix()}`"
        return "Run: " + " · ".join(parts) + f" · {where}"


def load_results(root: str | Path | None = None, *, csv_path: str | Path | None = None,
                 meta_path: str | Path | None = None) -> Results:
    """The results file of the checkout at ``root`` (this one by default)."""
    root = Path(root) if root is not None else REPO_ROOT
    csv_file = Path(csv_path) if csv_path is not None else root / RESULTS_CSV
    meta_file = Path(meta_path) if meta_path is not None else root / RESULTS_META
    rows = read_rows(csv_file)
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    missing = [k for k in META_KEYS if not meta.get(k)]
    if missing:
        raise ValueError(f"{meta_file} must say {', '.join(META_KEYS)} of the run; "
                         f"missing: {', '.join(missing)}")
    return Results(tuple(rows), meta)


# ----------------------------------------------------------------------------------------------
# Cells and tables.
# ----------------------------------------------------------------------------------------------
def short(candidate: str) -> str:
    """``cuDNN (F.conv2d)`` -> ``cuDNN``: the slides' narrow columns."""
    return candidate.split(" (")[0]


def is_cuda_library(candidate: str) -> bool:
    return candidate.startswith(CUDA_LIBRARIES)


def group_entries(entries: Sequence[dict]) -> list[list[dict]]:
    """Entries of one op and size that differ only in dtype (fp16 and bf16, say) as one group,
    in the order of their first appearance."""
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        key = (e["op"], e["size"], e["unit"], e["reference"], tuple(e["speedup"]),
               e["ceiling_source"], e["status"] == "ok")
        groups.setdefault(key, []).append(e)
    return list(groups.values())


def _joined(group, value: Callable[[dict], str]) -> str:
    return " / ".join(value(e) for e in group)


def _ok(group) -> bool:
    return group[0]["status"] == "ok"


def cell_dtype(group) -> str:
    return _joined(group, lambda e: e["dtype"])


def cell_rate(group, *, unit: bool = True) -> str:
    if not _ok(group):
        return _joined(group, lambda e: e["status"].upper())
    return _joined(group, lambda e: rate_text(e["rate"])) + (f" {group[0]['unit']}" if unit else "")


def cell_pct(group, *, source: bool = True) -> str:
    if not _ok(group) or group[0]["pct_of_ceiling"] is None:
        return "–"
    text = _joined(group, lambda e: f"{e['pct_of_ceiling']:.0f}%")
    return text + (f" {group[0]['ceiling_source']}" if source else "")


def cell_reference(group, *, shorten: bool = False) -> str:
    ref = group[0]["reference"]
    if not _ok(group) or ref is None:
        return "–"
    text = _joined(group, lambda e: ratio_text(e["speedup"].get(ref)))
    if ref != TORCH_EAGER:
        text += f" {short(ref) if shorten else ref}"
    return text


def cell_compile(group) -> str:
    if not _ok(group) or TORCH_COMPILE not in group[0]["speedup"]:
        return "–"
    return _joined(group, lambda e: ratio_text(e["speedup"][TORCH_COMPILE]))


def cell_others(group, *, shorten: bool = False) -> str:
    if not _ok(group):
        return "–"
    skip = {group[0]["reference"], TORCH_COMPILE}
    parts = []
    for name in group[0]["speedup"]:
        if name in skip or all(e["speedup"][name] is None for e in group):
            continue
        parts.append(f"{short(name) if shorten else name} "
                     + _joined(group, lambda e: ratio_text(e["speedup"][name])))
    return ", ".join(parts) or "–"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])


SPEEDUP_NOTE = "speed-ups are the peer's time / triton-workshop's (> 1× = triton-workshop faster)"

