"""Crash-proof, streaming checks (teach/sandbox.py): each verdict prints when its case ends; a
case that kills the interpreter or hangs is reported and the others still run; a file that does
not import gets one sentence and the fix; on a GPU machine each case is rerun bounds-checked in
an interpreter subprocess (tested here on the CPU by forcing that rerun)."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from triton_workshop.teach import EXERCISES, check_exercise, iter_check, load_module, parallel

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = "    out = torch.empty_like(x)\n"


class TimedStream(io.StringIO):
    """Remembers when each piece of output was written."""

    def __init__(self):
        super().__init__()
        self.writes: list[tuple[float, str]] = []

    def write(self, s):
        self.writes.append((time.monotonic(), s))
        return super().write(s)

    def when(self, text: str) -> float:
        return next(t for t, s in self.writes if text in s)


def planted(tmp_path, number, old, new, name="planted.py"):
    source = (ROOT / "solutions" / f"solution_{number}.py").read_text()
    assert source.count(old) == 1, old
    path = tmp_path / name
    path.write_text(source.replace(old, new))
    return path


def run(number, path, **kwargs) -> tuple[int, str, TimedStream]:
    stream = TimedStream()
    code = check_exercise(number, path=path, seed=0, console=Console(file=stream, width=300), **kwargs)
    return code, " ".join(stream.getvalue().split()), stream


def test_each_verdict_prints_when_its_case_ends(tmp_path):
    path = planted(tmp_path, 1, LAUNCH, LAUNCH + "    if x.numel() == 4096:\n        import time\n"
                   "        time.sleep(3)\n")
    code, text, stream = run(1, path)
    assert code == 0 and "All checks passed" in text
    assert stream.when("add(n=4096)") - stream.when("add(n=97)") > 2.0, "verdicts held back to the end"


@pytest.mark.parametrize("how, signal_name", [("import os\n        os.abort()", "SIGABRT"),
                                              ("import ctypes\n        ctypes.string_at(0)", "SIGSEGV")])
def test_a_case_that_kills_the_interpreter_is_reported_and_the_rest_run(tmp_path, how, signal_name):
    path = planted(tmp_path, 1, LAUNCH, LAUNCH + f"    if x.numel() == 97:\n        {how}\n")
    code, text, _ = run(1, path)
    assert code == 1
    assert f"add(n=97): the process checking this case died ({signal_name})" in text
    assert "likely cause:" in text
    for label in ("n=1000", "n=4096", "n=3001"):
        assert f"add({label}): correct" in text
    assert "Traceback" not in text


def test_a_hanging_case_is_stopped_and_the_rest_run(tmp_path):
    path = planted(tmp_path, 1, LAUNCH, LAUNCH + "    while x.numel() == 97:\n        pass\n")
    code, text, _ = run(1, path, time_limit=3)
    assert code == 1
    assert "add(n=97): did not finish within 3 s" in text and "loop forever" in text
    assert "add(n=3001): correct" in text


def test_a_hang_the_child_cannot_interrupt_is_killed_by_the_parent(tmp_path):
    # The child's own alarm is switched off: the parent's clock must end the case.
    path = planted(tmp_path, 1, LAUNCH, LAUNCH + "    if x.numel() == 97:\n        import signal\n"
                   "        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n        while True:\n"
                   "            pass\n")
    code, text, _ = run(1, path, time_limit=2)
    assert code == 1 and "add(n=97): did not finish within 2 s" in text
    assert "add(n=4096): correct" in text


def test_a_hang_in_process_is_stopped_too(tmp_path):
    path = planted(tmp_path, 1, LAUNCH, LAUNCH + "    while x.numel() == 97:\n        pass\n")
    module = load_module(path, "_hang_in_process")
    results = {label: r for event, _, _, label, r in iter_check(EXERCISES[1], module, seed=0, time_limit=2)
               if event == "result"}
    assert results["n=97"].verdict.headline == "did not finish within 2 s"
    assert results["n=3001"].verdict.passed


def test_syntax_error_is_one_sentence_and_the_fix(tmp_path):
    bad = tmp_path / "exercise_1.py"
    bad.write_text("import torch\ndef add(x, y:\n    return x\n")
    code, text, _ = run(1, bad)
    assert code == 1
    assert "could not import exercise_1.py: line 2 is not valid Python" in text
    assert "fix that line" in text and "Traceback" not in text


def test_error_while_importing_is_one_sentence(tmp_path):
    bad = planted(tmp_path, 1, "BLOCK_SIZE = 128\n", "BLOCK_SIZE = 128\nraise RuntimeError('boom')\n")
    code, text, _ = run(1, bad)
    assert code == 1 and "could not import planted.py: line 19 raised RuntimeError while being imported: boom" in text
    assert "Traceback" not in text


def test_import_that_hangs_is_stopped(tmp_path):
    bad = planted(tmp_path, 1, "BLOCK_SIZE = 128\n", "BLOCK_SIZE = 128\nwhile True:\n    pass\n")
    code, text, _ = run(1, bad, time_limit=3)
    assert code == 1 and "did not finish within 3 s" in text and "top level" in text


def test_a_renamed_launcher_is_named(tmp_path):
    bad = planted(tmp_path, 1, "def add(x: torch.Tensor", "def addition(x: torch.Tensor")
    code, text, _ = run(1, bad)
    assert code == 1
    assert "no function named 'add' in the file (the file has 'addition': renamed?)" in text


def test_a_changed_signature_is_one_sentence(tmp_path):
    bad = planted(tmp_path, 1, "def add(x: torch.Tensor, y: torch.Tensor)", "def add(x: torch.Tensor)")
    code, text, _ = run(1, bad)
    assert code == 1 and "the checker could not call add(...)" in text and "signature" in text


def test_errors_quote_the_kernel_line_not_the_launch(tmp_path):
    # (16,) * W + (32,): the shapes do not broadcast, inside the kernel.
    path = planted(tmp_path, 2, "    offsets = rows[:, None] * W + cols[None, :]\n    mask = (rows[:, None] < H) & "
                   "(cols[None, :] < W)\n    plane = H * W  # the G",
                   "    offsets = rows * W + cols\n    mask = (rows[:, None] < H) & "
                   "(cols[None, :] < W)\n    plane = H * W  # the G")
    code, text, _ = run(2, path)
    assert code == 1
    assert "at line 31: offsets = rows * W + cols" in text
    assert "greyscale_kernel[grid]" not in text


def test_the_launch_line_keeps_its_brackets(tmp_path):
    # An error at the launch itself: rich markup must not eat "[grid]".
    path = planted(tmp_path, 1, "add_kernel[grid](x, y, out, n, BLOCK_SIZE=BLOCK_SIZE)",
                   "add_kernel[grid](x, y, out, BLOCK_SIZE=BLOCK_SIZE)")
    code, text, _ = run(1, path)
    assert code == 1 and "add_kernel[grid](x, y, out, BLOCK_SIZE=BLOCK_SIZE)" in text


def test_interpreter_rerun_adds_bounds_findings(tmp_path):
    """The GPU path, on the CPU: the main child runs without bounds checks (as a GPU would),
    the rerun child bounds-checked; a kernel whose only fault is an unmasked load is caught by
    the rerun, and a correct one still passes."""
    path = planted(tmp_path, 1, "x = tl.load(x_ptr + offsets, mask=mask)", "x = tl.load(x_ptr + offsets)")
    code, text, _ = run(1, path, rerun_in_interpreter=True)
    assert code == 1
    assert "load at offsets 1000..1023 of x (1000 elements) in program 7" in text
    assert "has no mask=" in text
    code, text, _ = run(1, ROOT / "solutions" / "solution_1.py", rerun_in_interpreter=True)
    assert code == 0 and "All checks passed" in text


def test_sandbox_child_reports_json_events(tmp_path):
    """The child's protocol: start/result per case, done last, on the pipe it is given."""
    import json
    import os
    import subprocess
    import sys

    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "triton_workshop.teach.sandbox", "--exercise", "1",
                             "--file", str(ROOT / "solutions" / "solution_1.py"), "--seed", "0",
                             "--fd", str(write_fd), "--skip", json.dumps({"0:0": True, "0:1": True})],
                            pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        events = [json.loads(line) for line in pipe]
    assert proc.wait(120) == 0
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "done"
    results = [e for e in events if e["event"] == "result"]
    assert [e["label"] for e in results] == ["n=4096", "n=3001", "n=1000, non-contiguous inputs"]
    assert all(e["verdict"]["passed"] for e in results)


def test_a_gpu_compile_error_is_placed_on_the_kernel_line(tmp_path):
    """Triton's CompilationError (what a GPU gives for a kernel that does not compile) quotes the
    kernel's source above a caret: the verdict names that line of the learner's file, in the
    right kernel when two kernels share the line."""
    from triton_workshop.teach.errors import verdict_for_exception

    source = (ROOT / "solutions" / "solution_2.py").read_text()
    learner = tmp_path / "exercise_2.py"
    learner.write_text(source)
    lines = source.splitlines()
    sepia_start = next(i for i, ln in enumerate(lines) if ln.startswith("def sepia_kernel"))
    culprit = next(i for i in range(sepia_start, len(lines)) if "cols = pid_1 * BLOCK_W" in lines[i])
    excerpt = "\n".join(lines[sepia_start:culprit + 1])

    class CompilationError(Exception):
        error_message = "ValueError('Cannot make_shape_compatible: incompatible dimensions')"

    exc = CompilationError(f"at {culprit - sepia_start + 1}:4:\n{excerpt}\n    ^\n"
                           f"{CompilationError.error_message}")
    verdict = verdict_for_exception(exc, str(learner))
    assert verdict.headline == (f"raised CompilationError at line {culprit + 1}: "
                                "cols = pid_1 * BLOCK_W + tl.arange(0, BLOCK_W)")
    assert "incompatible dimensions" in verdict.details[0]


def test_merge_adds_what_only_the_rerun_knows():
    from triton_workshop.teach.verdict import Verdict
    from triton_workshop.teach.sandbox import merge

    native = Verdict(False, "6 of 15 elements wrong (6 never written)",
                     ["the wrong elements were never written: check the grid covers the whole output",
                      "first wrong elements: ..."])
    checked = Verdict(False, "6 of 15 elements wrong (6 never written)",
                      ["the grid launches 3 program(s) along axis 0, but the output needs 5 there",
                       "first wrong elements: ..."])
    merged = merge(native, checked)
    assert merged.details[0].startswith("the grid launches 3") and len(merged.details) == 2
    clean = merge(Verdict(True, "correct"), Verdict(True, "correct"))
    assert clean.passed
    found = merge(Verdict(True, "correct"), Verdict(False, "the values are right, but out-of-bounds "
                                                   "loads", ["load at offsets 97"], ["load at offsets 97"]))
    assert not found.passed and found.details == ["load at offsets 97"]


def _without_times(text: str) -> str:
    return re.sub(r" \d+\.\d\ds", "", text)


@pytest.mark.skipif(not parallel.forks_children(), reason="workers are forks in interpreter mode only")
@pytest.mark.parametrize("number, old, new", [
    # a wrong greyscale: sepia's cases run on; a wrong sepia: greyscale's non-contiguous case runs
    (2, "grey = 0.299 * r + 0.587 * g + 0.114 * b", "grey = 0.3 * r + 0.59 * g + 0.11 * b"),
    (2, "tl.store(out_ptr + 2 * plane + offsets, new_b, mask=mask)",
     "tl.store(out_ptr + plane + offsets, new_b, mask=mask)"),
])
def test_shared_cases_print_what_one_child_prints(tmp_path, monkeypatch, number, old, new):
    """The cases shared among workers: the same verdicts, in the same order, as one child's."""
    path = planted(tmp_path, number, old, new)
    monkeypatch.setattr(parallel, "parallel_workers", lambda: 2)
    code, text, _ = run(number, path)
    monkeypatch.setattr(parallel, "parallel_workers", lambda: 1)
    single_code, single_text, _ = run(number, path)
    assert code == single_code == 1
    assert _without_times(text) == _without_times(single_text)


@pytest.mark.skipif(not parallel.forks_children(), reason="workers are forks in interpreter mode only")
def test_a_template_shared_among_workers_stops_at_the_first_todo(capsys, monkeypatch):
    monkeypatch.setattr(parallel, "parallel_workers", lambda: 2)
    code = check_exercise(6, path=ROOT / "exercises" / "exercise_6.py", seed=0)
    out = capsys.readouterr().out
    assert code == 1 and out.count("not implemented yet: start at TODO") == len(EXERCISES[6].tasks)


def test_a_file_that_prints_while_checked_runs_in_one_worker(tmp_path):
    functions = {"add"}
    assert not parallel.prints_while_checked(ROOT / "solutions" / "solution_1.py", functions)
    kernel_prints = planted(tmp_path, 1, LAUNCH, LAUNCH, name="quiet.py").read_text().replace(
        "    tl.store(", "    print_if('here', '=0')\n    tl.store(", 1)
    (tmp_path / "kernel.py").write_text(kernel_prints)
    assert parallel.prints_while_checked(tmp_path / "kernel.py", functions)
    launcher = planted(tmp_path, 1, LAUNCH, LAUNCH + "    print(x.shape)\n", name="launcher.py")
    assert parallel.prints_while_checked(launcher, functions)
