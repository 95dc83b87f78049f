"""The instructor's slides run as shown: every ```python block of slides/*.md, in order, in one
namespace per slide file, from the repository root.

A ```text block that directly follows a ```python block (nothing but blank lines between them) is
what that block prints: it is checked too (whitespace-normalised, so a wrapped line still matches).

The blocks run in a child process, with TRITON_INTERPRET=1, so that the namespace and the interpreter
decision are fresh whatever other tests imported, and so that the slides behave the same on a GPU
machine. The same file is the runner; to rehearse a talk, from the repository root:

    python tests/test_slides.py slides/workshop.md

Pictures: an image under ``workshop-output/`` (ignored by git) is drawn by the slides' own code, so
a rehearsal is what puts it there; any other image is a committed file (the benchmark plots under
docs/results/latest/, drawn from the results file by triton_workshop.bench.tables). Benchmark
numbers on a slide sit between ``results:begin``/``results:end`` markers and are generated from
docs/results/latest.csv (tests/test_bench_tables.py checks them).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLIDE_FILES = sorted((ROOT / "slides").glob("*.md"))
END_SLIDE = "<!-- end_slide -->"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass
class Block:
    slide: int  # 1-based, in the order of the file (the title slide of the front matter not counted)
    title: str
    lang: str
    code: str
    line: int  # line of the slide file where the code starts (after the opening fence)
    output: str | None = None  # the ```text block that follows a python block


@dataclass
class Slide:
    number: int
    title: str
    text: str
    blocks: list[Block]


def parse(path: Path) -> list[Slide]:
    text = path.read_text(encoding="utf-8")
    slides, start_line = [], 1
    for number, chunk in enumerate(text.split(END_SLIDE), start=1):
        if number == 1 and chunk.startswith("---\n"):  # presenterm front matter: the title slide
            end = chunk.index("\n---\n", 4) + len("\n---\n")
            start_line += chunk[:end].count("\n")
            chunk = chunk[end:]
        title = next((m[1].strip() for m in re.finditer(r"^## (.+)$", chunk, re.M)), "")
        blocks: list[Block] = []
        previous_end = None
        for m in FENCE.finditer(chunk):
            lang = m[1].strip().split()[0] if m[1].strip() else ""
            line = start_line + chunk[: m.start()].count("\n") + 1
            between = chunk[previous_end : m.start()] if previous_end is not None else None
            if lang == "text" and blocks and blocks[-1].lang == "python" and between is not None \
                    and not between.strip() and blocks[-1].output is None:
                blocks[-1].output = m[2]
            blocks.append(Block(number, title, lang, m[2], line))
            previous_end = m.end()
        slides.append(Slide(number, title, chunk, blocks))
        start_line += chunk.count("\n")
    return slides


def python_blocks(path: Path) -> list[Block]:
    return [b for s in parse(path) for b in s.blocks if b.lang == "python"]


#: Images the slides draw themselves, relative to a slide file (workshop-output/ is ignored by git).
OUTPUT_PREFIX = "../workshop-output/"


def shown_images(path: Path) -> list[str]:
    """The image paths of ``![...](...)`` in a slide file, as written (relative to it)."""
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", path.read_text(encoding="utf-8"))


def drawn_images(path: Path) -> list[Path]:
    """The pictures of a slide file that its own code draws."""
    return [(path.parent / image).resolve() for image in shown_images(path)
            if image.startswith(OUTPUT_PREFIX)]


def _words(text: str) -> str:
    return " ".join(text.split())


class _Tee(io.TextIOBase):
    """Writes to the real stdout (so that a rehearsal shows the output) and keeps a copy."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, s):
        self.copy.write(s)
        return self.stream.write(s)

    def flush(self):
        self.stream.flush()


def run_slides(path: Path) -> int:
    """Run the python blocks of ``path`` in order in one namespace; 0 when all ran and printed
    what their ```text blocks say."""
    os.chdir(ROOT)
    namespace = {"__name__": "__slides__"}
    rel = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    with tempfile.TemporaryDirectory(prefix="slides-code-") as tmp:
        for block in python_blocks(path):
            where = f"{rel}:{block.line} (slide {block.slide}: {block.title})"
            print(f"\n===== {where}", flush=True)
            # A real file (@triton.jit reads its kernel's source), padded so that tracebacks give
            # the line numbers of the slide file.
            source = Path(tmp) / f"{path.stem}_line{block.line}.py"
            source.write_text("\n" * (block.line - 1) + block.code, encoding="utf-8")
            tee = _Tee(sys.stdout)
            try:
                with contextlib.redirect_stdout(tee):
                    exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), namespace)
            except BaseException:  # noqa: BLE001  (SystemExit from a block is a failure too)
                print(f"\nFAILED: the block at {where} raised:", flush=True)
                traceback.print_exc(file=sys.stdout)
                return 1
            finally:
                os.chdir(ROOT)
            if block.output is not None and _words(block.output) not in _words(tee.copy.getvalue()):
                print(f"\nFAILED: the block at {where} did not print its ```text block.\n"
                      f"--- expected:\n{block.output}\n--- printed:\n{tee.copy.getvalue()}",
                      flush=True)
                return 1
    print(f"\nall {len(python_blocks(path))} python blocks of {rel} ran", flush=True)
    return 0


# ------------------------------------------------------------------------------------------------
# The tests.
# ------------------------------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # the runner needs no pytest
    pytest = None

if pytest is not None:
    slide_files = pytest.mark.parametrize("path", SLIDE_FILES, ids=lambda p: p.name)

    def test_there_are_slides():
        assert SLIDE_FILES, "no slides/*.md"

    # Every block in the interpreter, from empty compile caches: minutes on a loaded machine,
    # more than the suite's per-test limit (pytest-timeout's marker; inert without the plugin).
    @pytest.mark.timeout(900)
    @slide_files
    def test_python_blocks_run(path, tmp_path):
        assert python_blocks(path), f"{path.name} has no python blocks"
        started = time.time()
        # torch.compile's caches too go to a temporary directory.
        # The GPU hidden too: with one visible, the interpreter would copy every tensor the
        # blocks make on it to the host and back at each kernel (minutes more than the CPU's).
        env = dict(os.environ, TRITON_INTERPRET="1", TRITON_WORKSHOP_QUIET="1", CUDA_VISIBLE_DEVICES="",
                   PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
                   TRITON_CACHE_DIR=str(tmp_path / "triton"))
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(path)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout[-6000:] + "\n" + proc.stderr[-3000:])
        # Every picture the slides draw was drawn by this run, as a PNG.
        for image in drawn_images(path):
            assert image.is_file(), f"{image} is shown but no block drew it"
            assert image.stat().st_mtime >= started - 1, f"{image} is older than this run"
            assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image

    @slide_files
    def test_slides_have_titles_and_code_blocks_are_small(path):
        slides = parse(path)
        assert 30 <= len(slides) <= 45, f"{len(slides)} slides"
        for s in slides:
            assert s.title, f"slide {s.number} has no '## ' title"
            for b in s.blocks:
                assert b.code.count("\n") <= 26, f"slide {s.number}: a {b.lang} block of " \
                                                 f"{b.code.count(chr(10))} lines"

    #: The one-line comments presenterm knows; it refuses any other one-line comment (one of
    #: several lines it ignores). The value of a command is YAML: a speaker note must not hold
    #: ": " or " #" or start with a YAML indicator, or the whole deck fails to load.
    PRESENTERM_COMMAND = re.compile(
        r"(end_slide|pause|reset_layout|jump_to_middle|no_footer|new_line|skip_slide"
        r"|column_layout: \[\d+(, \d+)*\]|column: \d+|incremental_lists: (true|false)"
        r"|speaker_note: (?![\"'`\[{&*!|>%@#-])((?!: | #).)+)")

    @slide_files
    def test_comments_are_presenterm_commands(path):
        text = FENCE.sub("", path.read_text(encoding="utf-8"))
        for m in re.finditer(r"<!--(.*?)-->", text, flags=re.S):
            if "\n" in m.group(1):  # several lines: presenterm ignores it
                continue
            body = m.group(1).strip()
            assert PRESENTERM_COMMAND.fullmatch(body), f"presenterm refuses <!-- {body} -->"

    @slide_files
    def test_images_exist(path):
        """A committed image exists; one under workshop-output/ is named by the code of a python
        block before it (test_python_blocks_run checks that the block draws it)."""
        images = shown_images(path)
        assert images, f"{path.name} shows no pictures"
        text = path.read_text(encoding="utf-8")
        for image in (i for i in images if i.startswith(OUTPUT_PREFIX)):
            line = text.count("\n", 0, text.index(f"]({image})")) + 1
            before = "".join(b.code for b in python_blocks(path) if b.line < line)
            assert Path(image).name in before, \
                f"{image} (line {line}) is drawn by no python block before it"
        for image in images:
            if not image.startswith(OUTPUT_PREFIX):
                assert (path.parent / image).is_file(), image

    @slide_files
    def test_bash_commands_are_the_readmes(path):
        """A command shown on a slide is one the README shows (and tests/test_readme.py runs or
        CI runs), in a bash block or as inline code."""
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        known = {ln.strip() for block in re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
                 for ln in block.splitlines() if ln.strip()}
        known |= {m.strip() for m in re.findall(r"`([^`\n]+)`", readme)}
        for block in (b for s in parse(path) for b in s.blocks if b.lang == "bash"):
            for ln in block.code.splitlines():
                if ln.strip() and not ln.lstrip().startswith("#"):
                    assert ln.split("  #")[0].strip() in known, ln


if __name__ == "__main__":
    files = [Path(a) for a in sys.argv[1:]] or SLIDE_FILES
    raise SystemExit(max((run_slides(f.resolve()) for f in files), default=0))
