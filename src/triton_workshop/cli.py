"""Command line: ``workshop check|progress|profile|tour|filter|bench|tune|list|setup-check`` (also
installed as ``triton-workshop``), the ``exercise_N``/``solution_N`` scripts, and ``setup-check``
(the same as ``workshop setup-check``).

Parses arguments, calls into teach/ or bench/, prints. No kernels live here. The library needs
torch, Triton and NumPy only; the workshop's commands also need pillow, rich and matplotlib (the
``[workshop]`` extra), and say so in one sentence when they are missing. ``setup-check`` runs
without them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import platform
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from rich.console import Console

MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 11)
MIN_TRITON = (3, 6)

#: The install command of the workshop's dependencies, named wherever one is missing.
WORKSHOP_INSTALL = "pip install 'triton-workshop[workshop]'"
#: The modules of the ``[workshop]`` extra and the package each comes from.
WORKSHOP_MODULES = {"PIL": "pillow", "rich": "rich", "matplotlib": "matplotlib"}


def missing_workshop_package(exc: BaseException) -> str | None:
    """The ``[workshop]`` package whose absence raised ``exc`` (None for any other error)."""
    if not isinstance(exc, ImportError):
        return None
    return WORKSHOP_MODULES.get((exc.name or "").split(".")[0])


def run_workshop_command(command: Callable[[], int]) -> int:
    """Run a workshop command; without the ``[workshop]`` extra, one sentence and exit status 2
    instead of an ImportError's traceback."""
    try:
        return command()
    except ImportError as exc:
        package = missing_workshop_package(exc)
        if package is None:
            raise
        print(f"This command needs the workshop's dependencies ({package} is not installed): "
              f"{WORKSHOP_INSTALL}", file=sys.stderr)
        return 2


class _PlainConsole:
    """What setup-check prints through when rich is not installed: the text, markup removed."""

    def print(self, text: str, *, highlight: bool = True, markup: bool = True) -> None:
        print(re.sub(r"\[/?[a-z ]+\]", "", text) if markup else text)


def _console():
    try:
        from rich.console import Console
    except ImportError:
        return _PlainConsole()
    return Console()


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


# ----------------------------------------------------------------------------------------------
# setup-check
# ----------------------------------------------------------------------------------------------
def setup_check(console: Console | None = None) -> int:
    """One line per requirement with ✅/❌, optional pieces after, then a verdict."""
    console = console or _console()
    lines: list[tuple[bool, str, bool]] = []  # (ok, text, required)

    def line(ok: bool, text: str, required: bool = True):
        lines.append((ok, text, required))
        console.print(f"{'✅' if ok else '❌'} {text}", highlight=False, markup=False)

    py = sys.version_info
    line(py[:2] >= MIN_PYTHON, f"Python {platform.python_version()} (need >= 3.10)")
    try:
        import torch
        line(_version_tuple(torch.__version__) >= MIN_TORCH, f"PyTorch {torch.__version__} (need >= 2.11)")
    except Exception as exc:
        line(False, f"PyTorch not importable: {exc} (pip install torch)")
        return _verdict(console, lines)
    try:
        import triton
        line(_version_tuple(triton.__version__) >= MIN_TRITON, f"Triton {triton.__version__} (need >= 3.6)")
    except Exception as exc:
        line(False, f"Triton not importable: {exc} (pip install triton)")
        return _verdict(console, lines)

    from . import runtime

    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        gpu = f"GPU: {torch.cuda.get_device_name()} (compute capability {cap[0]}.{cap[1]})"
        if runtime.INTERPRET:
            gpu += ", but TRITON_INTERPRET=1 is set: interpreter mode"
        line(True, gpu)
    else:
        line(True, "no GPU: interpreter mode (kernels run on the CPU through Triton's interpreter)")

    try:
        from .ops.elementwise import add
        x = torch.randn(1000, device=runtime.DEVICE)
        y = torch.randn(1000, device=runtime.DEVICE)
        ok = bool(torch.equal(add(x, y), x + y))
        line(ok, "a tiny Triton kernel " + ("compiled and " if not runtime.INTERPRET else "")
             + ("ran and gave the right answer" if ok else "ran but gave a WRONG answer"))
    except Exception as exc:
        line(False, f"a tiny Triton kernel failed: {type(exc).__name__}: {str(exc)[:200]}")

    ok = importlib.util.find_spec("numpy") is not None
    line(ok, f"numpy: {'installed' if ok else 'missing (pip install numpy)'} (arrays)")
    for module, why in (("PIL", "images"), ("rich", "tables"), ("matplotlib", "plots")):
        ok = importlib.util.find_spec(module) is not None
        line(ok, f"{WORKSHOP_MODULES[module]}: "
                 f"{'installed' if ok else f'missing ({WORKSHOP_INSTALL})'} (for the workshop: {why})")
    for module, why in (("pytest", "tests: pip install -e '.[dev]'"),
                        ("hypothesis", "property tests: pip install -e '.[dev]'"),
                        ("transformers", "the Hugging Face integration: "
                                         "pip install 'triton-workshop[transformers]'"),
                        ("liger_kernel", "a benchmark peer: pip install liger-kernel")):
        ok = importlib.util.find_spec(module) is not None
        line(ok, f"{module}: {'installed' if ok else 'missing'} (optional: {why})", required=False)
    return _verdict(console, lines)


def _verdict(console, lines) -> int:
    ready = all(ok for ok, _, required in lines if required)
    missing = [text for ok, text, required in lines if not ok and not required]
    if ready:
        extra = f" ({len(missing)} optional piece(s) missing)" if missing else ""
        console.print(f"[bold green]Ready[/bold green]{extra}.")
        return 0
    workshop_only = all(ok or not required or "for the workshop" in text
                        for ok, text, required in lines)
    if workshop_only:  # the library works; the exercises, images and plots do not yet
        console.print("[bold red]Not ready[/bold red] for the workshop (the library is ready); "
                      "its dependencies install with:")
        console.print(WORKSHOP_INSTALL, highlight=False, markup=False)
        return 1
    console.print("[bold red]Not ready[/bold red]: fix the ❌ lines above.")
    return 1


def setup_check_main() -> int:
    return setup_check()


# ----------------------------------------------------------------------------------------------
# workshop ...
# ----------------------------------------------------------------------------------------------
def _cmd_check(args) -> int:
    from .teach import early_start
    from .teach.learner_file import find_exercise_file

    # On a GPU machine the children start now, before this process imports torch (see
    # teach.early_start); the check adopts them.
    path = args.file if args.file is not None else find_exercise_file(args.number, args.solution)
    if path is not None:
        seed = early_start.start_children(args.number, path, seed=args.seed, time_limit=args.time_limit)
        args.seed = args.seed if seed is None else seed
    try:
        return _check(args)
    finally:
        early_start.discard()


def _check(args) -> int:
    from rich.console import Console

    from . import runtime  # noqa: F401  (decides interpreter or GPU before anything else is imported)
    from .teach import EXERCISES, check_exercise

    console = Console()
    if args.number not in EXERCISES:
        console.print(f"❌ exercise must be one of {sorted(EXERCISES)}, got {args.number}: "
                      "`workshop list` lists them", markup=False)
        return 2
    if args.file is not None and not args.file.is_file():
        console.print(f"❌ {args.file} does not exist: pass the path of your exercise file "
                      f"(e.g. exercises/exercise_{args.number}.py)", markup=False)
        return 2
    try:
        png = None if args.png is None else (
            args.png if args.png != "" else Path("workshop-output") / f"check_{args.number}.png")
        code = check_exercise(args.number, solution=args.solution, path=args.file, seed=args.seed,
                              png=png, time_limit=args.time_limit)
    except FileNotFoundError as exc:
        console.print(f"❌ {exc} (a file you deleted comes back with git checkout -- "
                      f"exercises/exercise_{args.number}.py)", markup=False)
        return 2
    except ValueError as exc:
        console.print(f"❌ {exc}", markup=False)
        return 2
    if code == 0 and args.number == 7:  # the exercise's benchmark runs from its own file
        from . import runtime

        console.print("Timing needs a GPU (the interpreter's times say nothing about one)."
                      if runtime.INTERPRET else "Time it against cuBLAS: python "
                      f"{'solutions/solution_7.py' if args.solution else 'exercises/exercise_7.py'}",
                      highlight=False)
    if code == 0 and not args.solution:
        from .teach.progress import next_step_after, print_next_step

        print_next_step(next_step_after(args.number), console)
    return code


def _cmd_progress(args) -> int:
    from .teach.progress import print_progress

    print_progress(args.root)
    return 0


def _cmd_profile(args) -> int:
    from .teach.profile import run_profile

    return run_profile(args.target, args.size, args.dtype, out=args.out, solution=args.solution,
                       run_once=args.run_once)


def _cmd_list(args) -> int:
    from .teach import EXERCISES

    for n, ex in EXERCISES.items():
        print(f"{n}. {ex.title}: {ex.lesson}  (exercises/exercise_{n}.py)")
    return 0


def _cmd_tour(args) -> int:
    from .teach.tour import run_tour

    return run_tour(args.out, image=args.image)


def _cmd_filter(args) -> int:
    from .teach.filter_image import filter_file

    return filter_file(args.input, args.filter, args.output)


def _cmd_bench(args) -> int:
    try:
        from . import bench
    except ImportError as exc:
        if missing_workshop_package(exc):
            raise  # run_workshop_command names the extra
        print(f"benchmarks unavailable: {exc}", file=sys.stderr)
        return 2
    return bench.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workshop", description="The Triton workshop: exercises, checker, tour, images and "
        "benchmarks (also installed as `triton-workshop`).")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="check an exercise (or its solution) and explain what is wrong")
    p.add_argument("number", type=int, help="exercise number (1-8)")
    p.add_argument("--solution", action="store_true", help="check solutions/solution_N.py instead")
    p.add_argument("--file", type=Path, help="check this file instead")
    p.add_argument("--seed", type=int, help="random seed for the inputs (default: fresh)")
    p.add_argument("--png", nargs="?", const="", default=None, metavar="PATH",
                   help="also draw the failing cases' output pictures into a PNG "
                        "(default path: workshop-output/check_N.png)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="seconds one case may run before it counts as hanging (default: 60)")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("list", help="list the exercises")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("progress", help="your exercises: passed, failing, not started; the next step")
    p.add_argument("--root", type=Path, help="the folder holding your exercises/ (default: here)")
    p.set_defaults(func=_cmd_progress)

    p = sub.add_parser("profile", help="(GPU) registers, occupancy, roofline, trace and ncu "
                                       "command of an op or an exercise's kernel")
    p.add_argument("target", help="an op (matmul, layer_norm, softmax, attention, ...) or an "
                                  "exercise number")
    p.add_argument("--size", help="comma-separated, e.g. 4096,4096,4096 for matmul (M,N,K)")
    p.add_argument("--dtype", help="float16, bfloat16 or float32 (default: the op's usual)")
    p.add_argument("--solution", action="store_true", help="profile solutions/solution_N.py")
    p.add_argument("--out", type=Path, help="folder for the trace and the roofline PNG")
    p.add_argument("--run-once", action="store_true",
                   help="compile, then run one call between cudaProfilerStart/Stop (for ncu)")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("tour", help="run every solution, check the library, filter an image")
    p.add_argument("-o", "--out", default="workshop-output", help="folder for the images")
    p.add_argument("--image", help="a PNG/JPEG to filter instead of the sample image")
    p.set_defaults(func=_cmd_tour)

    p = sub.add_parser("filter", help="apply greyscale, sepia or a named filter to an image")
    p.add_argument("input", help="a PNG/JPEG file")
    p.add_argument("--filter", required=True, help="greyscale, sepia, or a filter name (see --help)")
    p.add_argument("-o", "--output", required=True, help="output image path")
    p.set_defaults(func=_cmd_filter)

    p = sub.add_parser("bench", help="benchmarks (GPU only): workshop bench [names] [--quick]",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("tune", help="(GPU) tune the autotuned kernels here and keep the winners as "
                                    "a table later runs read first: workshop tune [--quick]",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser("setup-check", help="is this machine ready for the workshop?")
    p.set_defaults(func=lambda args: setup_check())
    return parser


def _cmd_tune(args) -> int:
    from . import tune  # the library alone: no workshop extra needed

    return tune.main(args.rest)


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None  # the console script (or python -m), not a caller in Python
    argv = sys.argv[1:] if argv is None else list(argv)
    # bench and tune parse their own options (--quick, names, --out, -k).
    if argv[:1] == ["bench"]:
        return run_workshop_command(lambda: _cmd_bench(SimpleNamespace(rest=argv[1:])))
    if argv[:1] == ["tune"]:
        return _cmd_tune(SimpleNamespace(rest=argv[1:]))
    args = build_parser().parse_args(argv)
    code = run_workshop_command(lambda: args.func(args))
    if as_program and args.command == "check":
        exit_without_teardown(code)
    return code


def exit_without_teardown(code: int) -> None:
    """End this process now, its output flushed, without Python's teardown.

    Tearing down a process that imported torch and ran Triton's interpreter frees its millions
    of objects one by one, which a learner would wait for after the last verdict has printed. A
    check has nothing left to do at exit (its child processes are reaped, its files closed), so
    the teardown is skipped. Only for the console script: a caller in Python gets main's return
    value."""
    if "logging" in sys.modules:  # what torch or Triton logged is written out, as at a normal exit
        import logging

        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or a closed stream: nothing to keep
            pass
    os._exit(code)


# ----------------------------------------------------------------------------------------------
# exercise_N / solution_N console scripts: teach.scripts, behind the [workshop] check
# ----------------------------------------------------------------------------------------------
def _teach_script(name: str) -> int:
    return run_workshop_command(
        lambda: getattr(importlib.import_module("triton_workshop.teach.scripts"), name)())


def exercise_1() -> int: return _teach_script("exercise_1")  # noqa: E704
def exercise_2() -> int: return _teach_script("exercise_2")  # noqa: E704
def exercise_3() -> int: return _teach_script("exercise_3")  # noqa: E704
def exercise_4() -> int: return _teach_script("exercise_4")  # noqa: E704
def exercise_5() -> int: return _teach_script("exercise_5")  # noqa: E704
def exercise_6() -> int: return _teach_script("exercise_6")  # noqa: E704
def exercise_7() -> int: return _teach_script("exercise_7")  # noqa: E704
def exercise_8() -> int: return _teach_script("exercise_8")  # noqa: E704
def solution_1() -> int: return _teach_script("solution_1")  # noqa: E704
def solution_2() -> int: return _teach_script("solution_2")  # noqa: E704
def solution_3() -> int: return _teach_script("solution_3")  # noqa: E704
def solution_4() -> int: return _teach_script("solution_4")  # noqa: E704
def solution_5() -> int: return _teach_script("solution_5")  # noqa: E704
def solution_6() -> int: return _teach_script("solution_6")  # noqa: E704
def solution_7() -> int: return _teach_script("solution_7")  # noqa: E704
def solution_8() -> int: return _teach_script("solution_8")  # noqa: E704


if __name__ == "__main__":
    raise SystemExit(main())
