"""The numbers of the README and the slides, generated from one results file.

``docs/results/latest.csv`` is the ``results.csv`` of one ``workshop bench`` run, unchanged (its
columns are :data:`.report.CSV_COLUMNS`); ``docs/results/latest.json`` says which run it was (GPU,
date, command, commit, versions). Every benchmark number of ``README.md`` and ``slides/*.md`` sits
between two marker comments and is rewritten from that file, never typed::

    <!-- results:begin NAME -->
    (generated)
    <!-- results:end -->

NAME is a key of :data:`REGIONS`. In the slides the markers are comments of two lines starting
``<!-- // results:begin NAME`` and ``<!-- // results:end``: presenterm refuses a one-line comment
that is not one of its commands, and ignores one of several lines. So the README and the slides
cannot disagree with each other or with the file, and ``tests/test_bench_tables.py`` fails when a
committed file differs from what the results file gives.

    python -m triton_workshop.bench.tables            # rewrite the README and the slides
    python -m triton_workshop.bench.tables --check    # exit 1 when they differ from the file
    python -m triton_workshop.bench.tables --plots    # also redraw docs/results/latest/<spec>.png

On a GPU machine, ``workshop bench --update-results`` runs the whole suite and then does all of
it: copies the run's ``results.csv`` to ``docs/results/latest.csv``, records the run in
``latest.json``, draws the plots from the file and rewrites the marked text
(:func:`update_from_run`). When the run's ``--out`` folder comes back from another machine (the
checkout there is a copy), the same update runs here:

    python -m triton_workshop.bench.tables --from-run DIR [--commit SHA]

The commit recorded is ``--commit`` if given, else the checkout's (``git``), else the
environment's ``TRITON_WORKSHOP_COMMIT``; a run that is not the whole suite is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from .measure import Row
from .report import write_plot
from .results import (META_KEYS, PLOTS_DIR, REPO_ROOT, RESULTS_CSV, RESULTS_META, SAME,
                      SPEEDUP_NOTE, Results, cell_compile, cell_dtype, cell_others, cell_pct,
                      cell_rate, cell_reference, group_entries, is_cuda_library, load_results,
                      markdown_table, rate_text, ratio_text, read_rows, short)
from .spec import GBPS, OURS, TFLOPS, TORCH_COMPILE, TORCH_EAGER, dtype_name
from .suite import SPECS

# META_KEYS and short are read through this module too (its tests, the slides' checks).
__all__ = ["META_KEYS", "PLOTS_DIR", "REGIONS", "RESULTS_CSV", "RESULTS_META", "Results",
           "draw_plots", "load_results", "main", "markers", "rate_text", "ratio_text",
           "read_rows", "regenerate", "regions_in", "render", "repository_problem", "short",
           "stale_files", "update_from_run"]

#: The files whose marked regions are generated, relative to the repository; slides/*.md too.
README = Path("README.md")
SLIDES_DIR = Path("slides")

#: A comment that starts a line and ends one (it may span several); its text says what it marks.
COMMENT = re.compile(r"^<!--(.*?)-->[ \t]*$", re.S | re.M)
BEGIN = re.compile(r"(?://\s*)?results:begin\s+([A-Za-z0-9_-]+)\b")
END = re.compile(r"(?://\s*)?results:end\b")


def markers(text: str) -> list[tuple[re.Match, str | None]]:
    """The marker comments of ``text`` in order: (the comment, the region NAME for a begin or
    None for an end)."""
    found = []
    for comment in COMMENT.finditer(text):
        body = comment.group(1).strip()
        begin = BEGIN.match(body)
        if begin:
            found.append((comment, begin.group(1)))
        elif END.match(body):
            found.append((comment, None))
    return found


# ----------------------------------------------------------------------------------------------
# The regions.
# ----------------------------------------------------------------------------------------------
def readme_table(results: Results) -> str:
    """Every workload at its headline size, fp16 and bf16 of one size on one line."""
    rows = [(g[0]["op"], g[0]["size"], cell_dtype(g), cell_rate(g), cell_pct(g), cell_reference(g),
             cell_compile(g), cell_others(g)) for g in group_entries(results.entries())]
    return "\n\n".join([
        results.run_text(link=RESULTS_CSV.as_posix()) + f". Each workload at its headline size; "
        f"{SPEEDUP_NOTE}.",
        markdown_table(("op", "size", "dtype", OURS, "% of ceiling", "vs eager / vendor",
                        "vs torch.compile", "vs others"), rows),
    ])


def _slide_table(results: Results, keep: Callable[[dict], bool], columns) -> str:
    groups = [g for g in group_entries(results.entries()) if keep(g[0])]
    if not groups:
        raise ValueError(f"{results.csv_path}: no headline rows for this table")
    header = [name for name, _ in columns]
    return markdown_table(header, [[cell(g) for _, cell in columns] for g in groups])


def _run_caption(results: Results) -> str:
    return results.run_text() + "."


def slides_memory(results: Results) -> str:
    table = _slide_table(results, lambda e: e["unit"] == GBPS, [
        ("op", lambda g: g[0]["op"]), ("size", lambda g: g[0]["size"]), ("dtype", cell_dtype),
        ("GB/s", lambda g: cell_rate(g, unit=False)),
        ("% copy", lambda g: cell_pct(g, source=False)),
        ("vs eager", lambda g: cell_reference(g, shorten=True)), ("vs torch.compile", cell_compile),
    ])
    return _run_caption(results) + f" GB/s counts the bytes the op must move; {SPEEDUP_NOTE}.\n\n" \
        + table


def slides_matmul(results: Results) -> str:
    def keep(e):
        return e["unit"] == TFLOPS and _spec_of(results, e) == "matmul"

    table = _slide_table(results, keep, [
        ("op", lambda g: g[0]["op"]), ("size", lambda g: g[0]["size"]), ("dtype", cell_dtype),
        ("TFLOP/s", lambda g: cell_rate(g, unit=False)), ("% of ceiling", cell_pct),
        ("vs eager / vendor", lambda g: cell_reference(g, shorten=True)),
        ("vs torch.compile", cell_compile),
    ])
    return _run_caption(results) + "\n\n" + table


def slides_other_tensor_core(results: Results) -> str:
    def keep(e):
        return e["unit"] == TFLOPS and _spec_of(results, e) != "matmul"

    table = _slide_table(results, keep, [
        ("op", lambda g: g[0]["op"]), ("size", lambda g: g[0]["size"]), ("dtype", cell_dtype),
        ("TFLOP/s", lambda g: cell_rate(g, unit=False)),
        ("vs eager / vendor", lambda g: cell_reference(g, shorten=True)),
        ("vs others", lambda g: cell_others(g, shorten=True)),
    ])
    return _run_caption(results) + " SDPA flash is FlashAttention-2, SDPA math the eager " \
        "composite.\n\n" + table


def _spec_of(results: Results, entry: dict) -> str:
    for r in results.rows:
        if r.op == entry["op"] and r.size == entry["size"] and r.dtype == entry["dtype"]:
            return r.spec
    raise KeyError(entry["op"])


def _square_matmuls(results: Results) -> list[dict]:
    return [e for e in results.entries() if e["op"] == "matmul" and e["dtype"] in ("fp16", "bf16")
            and e["status"] == "ok" and len(set(e["size"].split("×"))) == 1]


def slides_claims(results: Results) -> str:
    memory = [e for e in results.entries() if e["unit"] == GBPS and e["status"] == "ok"]
    # Counted as the tables round them, so that a reader counting rows gets the same number.
    fast = [e for e in memory
            if e["pct_of_ceiling"] is not None and round(e["pct_of_ceiling"]) >= 90]
    square = _square_matmuls(results)
    text = (f"* Fast anyway, in the benchmark run behind every number of these slides "
            f"({results.meta['gpu']}, {results.meta['date']}): {len(fast)} of {len(memory)} "
            f"memory-bound workloads at 90% of the copy bandwidth or more")
    if square:
        lo = min(e["pct_of_ceiling"] for e in square)
        hi = max(e["pct_of_ceiling"] for e in square)
        text += f", the fp16 / bf16 matmul at {lo:.0f}-{hi:.0f}% of cuBLAS on square sizes"
    return text + " (the tables at the end)."


def slides_tf32(results: Results) -> str:
    ieee = results.row("matmul IEEE", "fp32", _reference_name(results, "matmul IEEE", "fp32"))
    tf32 = results.row("matmul TF32", "fp32", _reference_name(results, "matmul TF32", "fp32"))
    return (f"* The price, at {tf32.size} in the run behind these slides ({results.meta['gpu']}): "
            f"cuBLAS does **{rate_text(tf32.rate)} TFLOP/s in TF32** against "
            f"**{rate_text(ieee.rate)} in IEEE fp32** ({tf32.rate / ieee.rate:.1f}×).")


def _reference_name(results: Results, op: str, dtype: str) -> str:
    for e in results.entries():
        if e["op"] == op and e["dtype"] == dtype:
            return e["reference"]
    raise KeyError(f"{results.csv_path}: no headline {op!r} {dtype}")


def slides_copy(results: Results) -> str:
    copy = results.copy_row
    return (f"The ceiling of the run behind these slides ({results.meta['gpu']}, "
            f"{results.meta['date']}): {copy.size} read and written in {copy.ms:.3f} ms, "
            f"**{rate_text(copy.rate)} GB/s**.")


#: The fusion slide's arithmetic: passes over n elements each candidate makes for sqrt(a*b+c).
FUSION_OP = "sqrt(a*b+c)"
FUSION_PASSES = {TORCH_EAGER: 8, OURS: 4, TORCH_COMPILE: 4}


def size_elements(size: str) -> int:
    """``2^28`` -> 268435456, ``3×8192×8192`` -> 201326592."""
    if size.startswith("2^"):
        return 2 ** int(size[2:])
    return math.prod(int(d) for d in size.split("×"))


def fusion_rows(results: Results) -> list[tuple[str, int, float, float, float]]:
    """(candidate, passes, GB moved, predicted ms = bytes / copy bandwidth, measured ms) for
    sqrt(a*b+c) fp32 at its headline size."""
    out = []
    for candidate, passes in FUSION_PASSES.items():
        r = results.row(FUSION_OP, "fp32", candidate)
        gbytes = passes * size_elements(r.size) * 4 / 1e9
        out.append((candidate, passes, gbytes, gbytes / results.copy_gbps * 1e3, r.ms))
    return out


def slides_fusion(results: Results) -> str:
    rows = fusion_rows(results)
    size = results.row(FUSION_OP, "fp32").size
    eager = next(r for r in rows if r[0] == TORCH_EAGER)
    ours = next(r for r in rows if r[0] == OURS)
    table = markdown_table(
        ("candidate", f"passes over n = {size}", "bytes", "predicted: bytes / copy", "measured"),
        [(c, p, f"{gb:.2f} GB", f"{pred:.3f} ms", f"{ms:.3f} ms") for c, p, gb, pred, ms in rows])
    return (_run_caption(results) + f" Copy bandwidth {rate_text(results.copy_gbps)} GB/s.\n\n"
            + table
            + f"\n\nEager moves twice the bytes and takes {eager[4] / ours[4]:.2f}× as long.")


def slides_versus(results: Results) -> str:
    """How often triton-workshop is faster than torch.compile, the CUDA libraries and eager."""
    against: dict[str, list[tuple[str, float]]] = {TORCH_COMPILE: [], "CUDA": [], TORCH_EAGER: []}
    for e in results.entries():
        if e["status"] != "ok":
            continue
        label = f"{e['op']} {e['dtype']}"
        speedup = {n: v for n, v in e["speedup"].items() if v is not None}
        if TORCH_COMPILE in speedup:
            against[TORCH_COMPILE].append((label, speedup[TORCH_COMPILE]))
        libraries = [v for n, v in speedup.items() if is_cuda_library(n)]
        if libraries:  # the fastest library of the workload: the smallest speed-up over it
            against["CUDA"].append((label, min(libraries)))
        if TORCH_EAGER in speedup:
            against[TORCH_EAGER].append((label, speedup[TORCH_EAGER]))
    names = {TORCH_COMPILE: "torch.compile (Inductor writes Triton)",
             "CUDA": "the fastest CUDA library (cuBLAS, cuDNN, SDPA's FlashAttention-2 / cuDNN)",
             TORCH_EAGER: "PyTorch eager"}
    rows = []
    for key, ratios in against.items():
        if not ratios:
            continue
        values = [v for _, v in ratios]
        faster = sum(v > 1 + SAME for v in values)
        slower = sum(v < 1 - SAME for v in values)
        geomean = math.exp(sum(math.log(v) for v in values) / len(values))
        rows.append((names[key], len(values), faster, len(values) - faster - slower, slower,
                     ratio_text(geomean)))
    table = markdown_table(("triton-workshop against", "workloads", "faster",
                            f"within ±{SAME:.0%}", "slower", "geometric mean"), rows)
    return _run_caption(results) + " Each workload at its headline size.\n\n" + table


#: NAME of ``<!-- results:begin NAME -->`` -> the text between the markers.
REGIONS: dict[str, Callable[[Results], str]] = {
    "readme": readme_table,
    "claims": slides_claims,
    "tf32": slides_tf32,
    "copy": slides_copy,
    "fusion": slides_fusion,
    "memory": slides_memory,
    "matmul": slides_matmul,
    "other-tensor-core": slides_other_tensor_core,
    "versus": slides_versus,
}


# ----------------------------------------------------------------------------------------------
# Rewriting the files.
# ----------------------------------------------------------------------------------------------
def render(text: str, results: Results, *, where: str = "text") -> str:
    """``text`` with every marked region rewritten from ``results``; ValueError naming ``where``
    and the line for an unknown region, a begin without its end or an end without its begin."""
    out, pos, open_begin, open_name = [], 0, None, None
    for m, name in markers(text):
        line = text.count("\n", 0, m.start()) + 1
        if name is not None and open_begin is not None:
            raise ValueError(f"{where}:{line}: results:begin before the results:end of the "
                             f"region {open_name!r}")
        if name is None and open_begin is None:
            raise ValueError(f"{where}:{line}: results:end without a results:begin")
        if name is not None:
            if name not in REGIONS:
                raise ValueError(f"{where}:{line}: unknown results region {name!r}; known: "
                                 f"{', '.join(REGIONS)}")
            open_begin, open_name = m, name
            continue
        out += [text[pos:open_begin.end()], "\n\n", REGIONS[open_name](results).strip("\n"),
                "\n\n"]
        pos, open_begin = m.start(), None
    if open_begin is not None:
        line = text.count("\n", 0, open_begin.start()) + 1
        raise ValueError(f"{where}:{line}: results:begin {open_name} has no results:end after it")
    out.append(text[pos:])
    return "".join(out)


def generated_files(root: str | Path | None = None) -> list[Path]:
    """The README and every slide file of the checkout at ``root``."""
    root = Path(root) if root is not None else REPO_ROOT
    return [root / README, *sorted((root / SLIDES_DIR).glob("*.md"))]


def regions_in(text: str) -> list[str]:
    return [name for _, name in markers(text) if name is not None]


def stale_files(root: str | Path | None = None, results: Results | None = None) -> list[Path]:
    """The files whose marked regions differ from what the results file gives."""
    root = Path(root) if root is not None else REPO_ROOT
    results = results or load_results(root)
    stale = []
    for path in generated_files(root):
        text = path.read_text(encoding="utf-8")
        if render(text, results, where=str(path.relative_to(root))) != text:
            stale.append(path)
    return stale


def regenerate(root: str | Path | None = None, results: Results | None = None) -> list[Path]:
    """Rewrite the marked regions of the README and the slides; returns the files changed."""
    root = Path(root) if root is not None else REPO_ROOT
    results = results or load_results(root)
    changed = []
    for path in generated_files(root):
        text = path.read_text(encoding="utf-8")
        new = render(text, results, where=str(path.relative_to(root)))
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def spec_titles() -> dict[str, str]:
    return {spec.name: spec.title for spec in SPECS}


def draw_plots(root: str | Path | None = None, results: Results | None = None) -> list[Path]:
    """``docs/results/latest/<spec>.png`` from the results file, drawn by the benchmark's own
    :func:`.report.write_plot`; plots of specs the file does not hold are removed."""
    root = Path(root) if root is not None else REPO_ROOT
    results = results or load_results(root)
    titles = spec_titles()
    folder = root / PLOTS_DIR
    by_spec: dict[str, list[Row]] = {}
    for r in results.rows:
        if r.role != "ceiling":
            by_spec.setdefault(r.spec, []).append(r)
    written = [write_plot(folder / f"{spec}.png", titles.get(spec, spec), rows,
                          f"{results.meta['gpu']}, {results.meta['date']}")
               for spec, rows in by_spec.items()]
    for old in folder.glob("*.png"):
        if old not in written:
            old.unlink()
    return written


def repository_problem(root: str | Path | None = None) -> str | None:
    """Why ``root`` is not a checkout whose results can be updated (None when it is)."""
    root = Path(root) if root is not None else REPO_ROOT
    missing = [p.as_posix() for p in (README, SLIDES_DIR, RESULTS_CSV.parent)
               if not (root / p).exists()]
    if missing:
        return (f"{root} is not a checkout of triton-workshop (no {', '.join(missing)}): "
                "run it from a clone, with PYTHONPATH=src or an editable install")
    return None


def git_commit(root: Path) -> str | None:
    """The checkout's short commit, with ``+changes`` when the tree differs from it; None
    without git (a copied tree)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               text=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def missing_cases(rows: Sequence[Row], quick: bool) -> list[str]:
    """The cases of the whole suite (``--quick``'s when ``quick``) that ``rows`` do not measure."""
    have = {(r.spec, r.op, r.size, r.dtype) for r in rows if r.role == "ours"}
    return [f"{spec.name}: {w.name} {w.label(size)} {dtype_name(w.dtype)}"
            for spec in SPECS for w in spec.workloads for size in w.sizes_for(quick)
            if (spec.name, w.name, w.label(size), dtype_name(w.dtype)) not in have]


def update_from_run(out_dir: str | Path, *, command: str, root: str | Path | None = None,
                    commit: str | None = None) -> list[Path]:
    """After a ``workshop bench`` run of the whole suite that wrote ``out_dir``: its results.csv
    becomes the results file, its meta.json the record of the run (with ``command`` and the
    commit), then the plots and the marked text are regenerated. Returns every file written."""
    root = Path(root) if root is not None else REPO_ROOT
    problem = repository_problem(root)
    if problem:
        raise FileNotFoundError(problem)
    out_dir = Path(out_dir)
    rows = read_rows(out_dir / "results.csv")  # refuses a file that is not a run's results.csv
    run = json.loads((out_dir / "meta.json").read_text(encoding="utf-8"))
    missing = missing_cases(rows, bool(run.get("quick")))
    if missing:
        raise ValueError(
            f"{out_dir / 'results.csv'} lacks {len(missing)} case(s) of the whole suite "
            f"({'; '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}): the README and the "
            "slides show one complete run, so run workshop bench without names or -k")
    commit = commit or git_commit(root) or os.environ.get("TRITON_WORKSHOP_COMMIT") or None
    meta = {
        "gpu": run["gpu"], "date": str(run["timestamp"])[:10], "timestamp": run["timestamp"],
        "command": command, "commit": commit, "torch": run.get("torch"),
        "triton": run.get("triton"), "cuda": run.get("cuda"), "quick": bool(run.get("quick")),
        "specs": run.get("specs"), "source": "written by workshop bench --update-results",
    }
    csv_file, meta_file = root / RESULTS_CSV, root / RESULTS_META
    shutil.copyfile(out_dir / "results.csv", csv_file)
    meta_file.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    results = load_results(root)
    return [csv_file, meta_file, *draw_plots(root, results), *regenerate(root, results)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m triton_workshop.bench.tables",
        description="Rewrite the README's results table and the slides' numbers from "
                    f"{RESULTS_CSV} (the run it came from: {RESULTS_META}).")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a file differs from the results file")
    parser.add_argument("--plots", action="store_true",
                        help=f"also redraw {PLOTS_DIR}/<spec>.png from the results file")
    parser.add_argument("--from-run", type=Path, metavar="DIR",
                        help="first make DIR/results.csv the results file: DIR is the --out of a "
                             "workshop bench run of the whole suite (meta.json beside it), e.g. "
                             "copied back from a GPU machine; also redraws the plots")
    parser.add_argument("--command", help="with --from-run: the command that made the run "
                                          "(default: workshop bench, --quick if it was quick)")
    parser.add_argument("--commit", help="with --from-run: the commit the run was made from "
                                         "(default: this checkout's)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.from_run is not None:
        try:
            quick = json.loads((args.from_run / "meta.json").read_text()).get("quick")
            command = args.command or ("workshop bench --quick" if quick else "workshop bench")
            written = update_from_run(args.from_run, command=command, root=args.root,
                                      commit=args.commit)
        except (OSError, ValueError, KeyError) as exc:
            print(f"tables: error: {exc}", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path.relative_to(args.root)}")
        return 0
    try:
        results = load_results(args.root)
        if args.check:
            stale = stale_files(args.root, results)
            for path in stale:
                print(f"{path.relative_to(args.root)} differs from {RESULTS_CSV}: run "
                      "python -m triton_workshop.bench.tables", file=sys.stderr)
            return 1 if stale else 0
        written = draw_plots(args.root, results) if args.plots else []
        written += regenerate(args.root, results)
    except (OSError, ValueError, KeyError) as exc:
        print(f"tables: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(args.root)}")
    if not written:
        print(f"up to date with {RESULTS_CSV}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
