"""The checker's GPU machine paths, on the CPU.

On a GPU the cases run compiled, where nothing checks the bounds of a load or store and where a
kernel must first get through Triton's compiler; each case then runs again in an interpreter
child, bounds-checked, and the two verdicts are merged. Here:

* ``compiled_natively`` is made to say "GPU", so ``check_module`` (what ``workshop progress``,
  the tour and the tests use) takes the GPU path: native cases in this process without bounds
  checks, and the interpreter rerun in a child;
* :class:`CompiledFirst` stands in for a GPU launch: Triton's real compiler first compiles the
  kernel for an sm_90 target (in a child where torch claims a GPU, so the package decorates real
  ``JITFunction``s), and fails where a GPU's would; what compiles then runs in the interpreter.
  One child holds one ``JITFunction`` for every launch, as the GPU process does: a refused kernel
  leaves state behind in it (a placeholder hash), and the next launch fails differently.
  ``triton_3_6_dot`` makes that compiler's ``tl.dot`` as strict as Triton 3.6's (float32
  ``out_dtype`` by default, a bare assert that the accumulator matches it), which later versions
  relaxed.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import triton_workshop.teach as teach
from triton_workshop.teach import session
from triton_workshop import runtime
from triton_workshop.teach import EXERCISES, check_module, load_module
from triton_workshop.teach import progress as progress_module
from triton_workshop.teach.verdict import Verdict
from triton_workshop.teach.picture import OUT_OF_BOUNDS
from triton_workshop.teach.sandbox import merge, rerun_only

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# The real tests (test_progress, test_checker_picture, test_planted_bugs, ...) run these paths
# for real on a GPU machine; the stand-in compiler below needs the interpreter in this process.
simulated = pytest.mark.skipif(not runtime.INTERPRET, reason="simulates a GPU machine on the CPU")

FRONT_END = r"""
import json, sys
import torch
torch.cuda.is_available = lambda: True  # the package then takes the GPU path: real JITFunctions
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_workshop.teach import load_module

file, name, strict = json.loads(sys.argv[1])
if strict:
    from triton.language.semantic import TritonSemantic
    relaxed = TritonSemantic.dot

    def dot(self, lhs, rhs, acc, input_precision, max_num_imprecise_acc, out_dtype):
        if out_dtype is None:
            out_dtype = tl.float32
        assert acc is None or acc.type.element_ty == out_dtype
        return relaxed(self, lhs, rhs, acc, input_precision, max_num_imprecise_acc, out_dtype)

    TritonSemantic.dot = dot
kernel = getattr(load_module(file, "_front_end"), name)
for line in sys.stdin:  # one launch's compile per line, all on the same JITFunction
    request = json.loads(line)
    try:
        triton.compile(ASTSource(kernel, request["signature"], request["constexprs"]),
                       target=GPUTarget("cuda", 90, 32))
        outcome = None
    except Exception as exc:
        outcome = [type(exc).__name__, str(exc)]
    print(REPLY + json.dumps(outcome), flush=True)
"""
REPLY = "@compiled: "  # the kernel may print while it compiles: replies are told by this mark

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
           torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "i1"}


def _front_end(file: Path, name: str, strict: bool) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["TRITON_WORKSHOP_QUIET"] = "1"
    # A cached kernel would skip the front end, and with it the strict tl.dot.
    env["TRITON_ALWAYS_COMPILE"] = "1"
    cache = tempfile.mkdtemp(prefix="front_end_cache_")
    env["TRITON_CACHE_DIR"] = cache
    errors = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-c", f"REPLY = {REPLY!r}\n" + FRONT_END,
                             json.dumps([str(file), name, strict])], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
    proc.cache, proc.errors = cache, errors
    return proc


def _stop(proc: subprocess.Popen) -> None:
    import shutil

    try:
        proc.stdin.close()
        proc.wait(timeout=30)
    except Exception:
        proc.kill()
        proc.wait()
    proc.errors.close()
    shutil.rmtree(proc.cache, ignore_errors=True)


class CompiledFirst:
    """A kernel launched as a GPU machine launches it (see the module docstring)."""

    def __init__(self, kernel, file: Path, name: str, *, triton_3_6_dot: bool = False):
        self.kernel, self.file, self.name, self.strict = kernel, file, name, triton_3_6_dot
        self.params = inspect.signature(kernel.fn).parameters
        self.compiled: set[str] = set()  # what compiled: a GPU launches it again from its cache
        self.attempts: list[list | None] = []  # each compile's outcome, in order
        self.proc: subprocess.Popen | None = None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self._compile(args, kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch

    def _compile(self, args, kwargs) -> None:
        bound = inspect.signature(self.kernel.fn).bind(*args, **kwargs)
        signature, constexprs = {}, {}
        for name, value in bound.arguments.items():
            if "constexpr" in str(self.params[name].annotation):
                signature[name], constexprs[name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                signature[name] = "*" + _DTYPES[value.dtype]
            elif isinstance(value, bool):
                signature[name] = "i1"
            elif isinstance(value, int):
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            else:
                signature[name] = "fp32"
        request = json.dumps({"signature": signature, "constexprs": constexprs})
        if request in self.compiled:
            return
        if self.proc is None:
            self.proc = _front_end(self.file, self.name, self.strict)
            weakref.finalize(self, _stop, self.proc)
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        for line in iter(self.proc.stdout.readline, ""):
            if line.startswith(REPLY):
                break
        else:
            self.proc.wait()
            self.proc.errors.seek(0)
            raise AssertionError(self.proc.errors.read()[-3000:].decode(errors="replace"))
        failure = json.loads(line[len(REPLY):])
        self.attempts.append(failure)
        if failure is None:
            self.compiled.add(request)
            return
        kind, message = failure
        raise (RuntimeError if kind == "RuntimeError" else type(kind, (Exception,), {}))(message)


def compiled_first(module, path: Path, **options):
    """``module`` with each of its kernels launched as on a GPU."""
    for name, value in list(vars(module).items()):
        if hasattr(value, "fn") and hasattr(value, "__getitem__") and not isinstance(value, CompiledFirst):
            setattr(module, name, CompiledFirst(value, path, name, **options))
    return module


@pytest.fixture
def gpu_machine(monkeypatch):
    """The checker takes its GPU path: cases checked in this process without bounds checks, and
    again in an interpreter child, bounds-checked."""
    monkeypatch.setattr(session, "compiled_natively", lambda: True)


def planted(tmp_path, number, old, new, name=None):
    source = (ROOT / "solutions" / f"solution_{number}.py").read_text()
    assert source.count(old) == 1, old
    path = tmp_path / (name or f"planted_{number}.py")
    path.write_text(source.replace(old, new))
    return path


def cases(reports):
    return [(r.function, c) for r in reports for c in r.cases]


def flat(text):
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------
# A kernel that calls print_if: it cannot compile, its interpreter run is the check.
# --------------------------------------------------------------------------------------------
PRINTS = ("    tl.store(out_ptr + offsets, x + y, mask=mask)\n",
          "    tl.store(out_ptr + offsets, x + y, mask=mask)\n    print_if('HELLO FROM PROGRAM 0', '=0')\n")


@simulated
def test_a_printing_kernel_does_not_compile_for_a_gpu(tmp_path):
    """What the H100 did: Triton refuses print_if (a plain Python function) in a compiled
    kernel. Without the rerun, the verdict says so and how to go on."""
    path = planted(tmp_path, 1, *PRINTS)
    module = compiled_first(load_module(path, "_gpu_prints_alone"), path)
    results = cases(check_module(EXERCISES[1], module, seed=0, rerun_in_interpreter=False))
    verdict = results[0][1].verdict
    assert not verdict.passed and verdict.needs_interpreter
    assert verdict.headline == ("the kernel calls print_if, which runs only in Triton's interpreter, "
                                "not in a kernel compiled for the GPU")
    assert "tl.device_print" in verdict.details[0] and "TRITON_INTERPRET=1 python planted_1.py" in verdict.details[0]


# The same kernel called as debug.print_if: Triton's second refusal is then the helper's own
# failure at compile time (its conditions arrive as constexprs).
MODULE_PRINTS = (PRINTS[0], PRINTS[1].replace("    print_if(", "    debug.print_if("))
IMPORTS_DEBUG = ("import triton\n", "import triton\nfrom triton_workshop import debug\n")


@simulated
@pytest.mark.parametrize("edits", [[PRINTS], [MODULE_PRINTS, IMPORTS_DEBUG]], ids=["print_if", "debug.print_if"])
def test_every_launch_of_a_printing_kernel_is_left_to_the_interpreter(tmp_path, edits):
    """What failed exercise 1 under `workshop progress` on the H100. Triton refuses print_if once
    ("Unsupported function referenced") but leaves a placeholder hash on the JITFunction, so the
    same kernel's next launch gets past that check to the code generator, which refuses the call
    in other words: a CompilationError at the print_if line. Those cases were failed as compile
    errors where the interpreter's verdict should stand."""
    path = planted(tmp_path, 1, *edits[0])
    for old, new in edits[1:]:
        path.write_text(path.read_text().replace(old, new, 1))
    module = compiled_first(load_module(path, f"_gpu_prints_again_{len(edits)}"), path)
    results = cases(check_module(EXERCISES[1], module, seed=0, rerun_in_interpreter=False))
    attempts = module.add_kernel.attempts
    assert [a[0] for a in attempts] == ["RuntimeError"] + ["CompilationError"] * (len(attempts) - 1)
    assert len(attempts) == len(results) == 4 and "print_if" in attempts[1][1]
    for _, case in results:
        assert not case.verdict.passed and case.verdict.needs_interpreter, case.verdict
        assert case.verdict.headline.startswith("the kernel calls print_if, which runs only in")


@simulated
def test_a_printing_kernel_is_checked_in_the_interpreter_on_a_gpu(tmp_path, gpu_machine, capfd):
    path = planted(tmp_path, 1, *PRINTS)
    module = compiled_first(load_module(path, "_gpu_prints"), path)
    results = cases(check_module(EXERCISES[1], module, seed=0))
    labels = [c.label for _, c in results]
    assert len(labels) == 5 and labels[-1] == f"{labels[0]}, non-contiguous inputs"  # every case
    assert all(c.verdict.passed for _, c in results), [c.verdict for _, c in results]
    assert all(c.verdict.details[0].startswith("note: the kernel calls print_if, which runs only in "
                                               "Triton's interpreter: this case was checked there")
               for _, c in results)
    assert "HELLO FROM PROGRAM 0" in capfd.readouterr().out  # the learner sees the print


@simulated
def test_a_printing_kernel_is_passed_by_progress_on_a_gpu(tmp_path, gpu_machine, monkeypatch, capfd):
    (tmp_path / "exercises").mkdir()
    path = planted(tmp_path, 1, *PRINTS, name="exercises/exercise_1.py")
    real_load = progress_module.load_module
    monkeypatch.setattr(progress_module, "load_module",
                        lambda p, name=None: compiled_first(real_load(p, name), Path(p)))
    status = progress_module.exercise_status(1, tmp_path)
    assert status.state == progress_module.PASSED, status.detail
    assert path.is_file() and "HELLO FROM PROGRAM 0" not in capfd.readouterr().out


REFUSED_WHEN_COMPILED = """
import os
if os.environ.get("WORKSHOP_TEST_COMPILED"):  # this process plays the GPU: Triton refuses print_if
    class _Refused:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError(f"Unsupported function referenced: {print_if}")  # Triton's words
            return launch

    add_kernel = _Refused()
"""


def test_workshop_check_on_a_gpu_checks_a_printing_kernel_in_the_interpreter(tmp_path, monkeypatch):
    """The child-process path: the main child (the GPU) cannot compile the kernel, the rerun
    child's verdicts are the check, printed with the note, and the non-contiguous case only the
    rerun ran counts too."""
    import io

    from rich.console import Console

    from triton_workshop.teach import sandbox

    path = planted(tmp_path, 1, *PRINTS)
    path.write_text(path.read_text() + REFUSED_WHEN_COMPILED)
    real_env = sandbox.child_env
    monkeypatch.setattr(sandbox, "child_env", lambda interpret: dict(
        real_env(interpret), **({} if interpret else {"WORKSHOP_TEST_COMPILED": "1"})))
    stream = io.StringIO()
    code = teach.check_exercise(1, path=path, seed=0, console=Console(file=stream, width=300),
                                rerun_in_interpreter=True)
    text = flat(stream.getvalue())
    assert code == 0 and "All checks passed" in text, text
    assert text.count("note: the kernel calls print_if, which runs only in Triton's interpreter") == 5
    assert "non-contiguous inputs): refused clearly" in text


def test_progress_keeps_native_output_out_of_the_table(tmp_path, capfd):
    """tl.device_print on a GPU writes to file descriptor 1 from native code, past Python's
    sys.stdout: the table must stay clean of that too."""
    (tmp_path / "exercises").mkdir()
    planted(tmp_path, 1, "    out = torch.empty_like(x)\n",
            "    out = torch.empty_like(x)\n    import os\n    os.write(1, b'NATIVE PRINT\\n')\n",
            name="exercises/exercise_1.py")
    status = progress_module.exercise_status(1, tmp_path)
    assert status.state == progress_module.PASSED, status.detail
    out = capfd.readouterr().out
    assert "NATIVE PRINT" not in out
    print("still printing")  # file descriptor 1 is back
    assert "still printing" in capfd.readouterr().out


def test_the_reruns_output_goes_where_stdout_was_when_it_started(tmp_path, capfd):
    """`workshop progress` silences stdout only while it checks: a rerun's print_if lines read
    after that (the child is slower than this process) must not reach the table."""
    import contextlib
    import io

    from triton_workshop.teach.checker import CASE_TIME_LIMIT
    from triton_workshop.teach.sandbox import InterpreterRerun

    path = planted(tmp_path, 1, *PRINTS)
    silenced = io.StringIO()
    with contextlib.redirect_stdout(silenced):
        rerun = InterpreterRerun(1, path, 0, CASE_TIME_LIMIT)
    results = rerun.results()
    assert len(results) == 5 and all(r.verdict.passed for _, r in results.values())
    # Program 0 of each case; the non-contiguous inputs are refused before the kernel runs.
    assert silenced.getvalue().count("HELLO FROM PROGRAM 0") == 4
    assert "HELLO FROM PROGRAM 0" not in capfd.readouterr().out


def test_merge_takes_the_interpreter_verdict_when_the_kernel_cannot_compile():
    from triton_workshop.teach.errors import interpreter_only_verdict

    native = interpreter_only_verdict("breakpoint_if", "exercise_2.py")
    wrong = Verdict(False, "3 of 10 elements wrong", ["first wrong elements: ..."])
    merged = merge(Verdict.from_dict(native.to_dict()), wrong)  # as it crosses the pipe
    assert not merged.passed and merged.headline == "3 of 10 elements wrong"
    assert merged.details[0].startswith("note: the kernel calls breakpoint_if")
    assert merge(native, None) is native  # no rerun: the native verdict stands
    # Cases only the interpreter ran count only for such a kernel.
    from triton_workshop.teach.verdict import CaseResult

    checked = {"0:0": ("add", CaseResult("n=97", Verdict(True, "correct"), 0.1)),
               "0:strided": ("add", CaseResult("n=97, non-contiguous inputs", Verdict(True, "correct"), 0.1))}
    assert [r.label for _, r in rerun_only([native], ["0:0"], checked)] == ["n=97, non-contiguous inputs"]
    assert rerun_only([Verdict(True, "correct")], ["0:0"], checked) == []


# --------------------------------------------------------------------------------------------
# Out-of-bounds stores: the rerun's finding fails a case the GPU run passed.
# --------------------------------------------------------------------------------------------
OR_MASK = ("mask = (rows[:, None] < H) & (cols[None, :] < W)\n    plane = H * W  # the G",
           "mask = (rows[:, None] < H) | (cols[None, :] < W)\n    plane = H * W  # the G")


def test_check_module_reruns_on_a_gpu_machine(tmp_path, gpu_machine):
    """An `|` mask stores past the end of the output; the stray values are NaN (loaded from the
    input's guard zone) and land in the NaN guard zone after the output: a GPU run sees right
    values. Its interpreter rerun sees the stores, and the case fails, with the picture."""
    path = planted(tmp_path, 2, *OR_MASK)
    module = load_module(path, "_gpu_or_mask")
    results = cases(check_module(EXERCISES[2], module, seed=0))
    failed = [c for _, c in results if not c.verdict.passed]
    assert [c.label for c in failed] == ["3x37x53", "3x5x130"]  # 64 x 64 has no partial block
    verdict = failed[0].verdict
    assert "store at offsets 1961" in flat("\n".join(verdict.details))
    assert verdict.memory and verdict.picture and verdict.picture["oob"] > 0
    status = np.array(verdict.picture["status"]).reshape(verdict.picture["rows"], verdict.picture["cols"])
    assert (status[37:] == OUT_OF_BOUNDS).any() and not (status[:37] == OUT_OF_BOUNDS).any()


def test_check_module_and_workshop_check_rerun_only_on_a_gpu_machine(monkeypatch, tmp_path):
    seeds, isolated = [], []

    def refuse(self, number, path, seed, time_limit):
        seeds.append(seed)
        raise RuntimeError("no child today")

    monkeypatch.setattr("triton_workshop.teach.sandbox.InterpreterRerun.__init__", refuse)
    monkeypatch.setattr("triton_workshop.teach.sandbox.check_isolated",
                        lambda *a, **k: isolated.append(k["rerun_in_interpreter"]) or 0)
    # Without the rerun, the cases may be shared among forked workers instead: no rerun either.
    monkeypatch.setattr("triton_workshop.teach.parallel.check_parallel",
                        lambda *a, **k: isolated.append(False) or 0)
    path = ROOT / "solutions" / "solution_1.py"
    module = load_module(path, "_gpu_decides")
    monkeypatch.setattr(session, "compiled_natively", lambda: False)
    assert all(c.verdict.passed for _, c in cases(check_module(EXERCISES[1], module, seed=0)))
    teach.check_exercise(1, path=path, seed=0)
    monkeypatch.setattr(session, "compiled_natively", lambda: True)
    with pytest.raises(RuntimeError, match="no child today"):
        check_module(EXERCISES[1], module, seed=3)
    teach.check_exercise(1, path=path, seed=0)
    assert seeds == [3]  # the same seed as the native run: the same inputs
    assert isolated == [False, True]


# --------------------------------------------------------------------------------------------
# A renamed launcher: one message, whatever the kernels are.
# --------------------------------------------------------------------------------------------
def test_a_renamed_launcher_is_named_beside_a_compiled_kernel(tmp_path):
    """Compiled for a GPU, a @triton.jit kernel is a JITFunction whose __module__ is the file's:
    the H100 offered 'add_kernel' for 'add'. Kernels are not launchers."""
    from triton.runtime.jit import JITFunction

    path = planted(tmp_path, 1, "def add(x: torch.Tensor", "def addition(x: torch.Tensor")
    module = load_module(path, "_gpu_renamed")
    module.add_kernel = JITFunction(module.add_kernel.fn)  # what @triton.jit makes on a GPU
    assert module.add_kernel.__module__ == module.__name__
    verdict = cases(check_module(EXERCISES[1], module, seed=0, rerun_in_interpreter=False))[0][1].verdict
    assert verdict.headline == "no function named 'add' in the file (the file has 'addition': renamed?)"


# --------------------------------------------------------------------------------------------
# An fp16 accumulator given to tl.dot: a compile error on a GPU, named as the bug.
# --------------------------------------------------------------------------------------------
FP16_ACC = ("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
            "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)")


def _dot_line(path: Path) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "acc = tl.dot(" in ln)


@simulated
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_fp16_accumulator_that_does_not_compile_is_named(tmp_path, gpu_machine):
    """Triton 3.6 (the H100's): tl.dot's float32 out_dtype against a float16 accumulator is a
    bare assert, a CompilationError at the tl.dot line with no reason: the advice comes from the
    accumulator's dtype in the source."""
    path = planted(tmp_path, 4, *FP16_ACC)
    module = compiled_first(load_module(path, "_gpu_fp16_acc"), path, triton_3_6_dot=True)
    failed = [c for _, c in cases(check_module(EXERCISES[4], module, seed=0)) if not c.verdict.passed]
    half = [c for c in failed if "float16" in c.label]  # (a GPU has a bfloat16 case too)
    assert [c.label for c in failed] == [c.label for c in half] and len(half) == 2
    for case in half:
        text = flat("\n".join([case.verdict.headline, *case.verdict.details]))
        assert f"raised CompilationError at line {_dot_line(path)}: acc = tl.dot(a, b, acc" in text
        assert ("the accumulator passed to tl.dot is not float32 (its dtype is "
                "c_ptr.dtype.element_ty)") in text and "Accumulate in float32" in text
        assert "^" not in case.verdict.details[0] and "TF32" not in text


@simulated
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_fp16_accumulator_on_a_newer_triton(tmp_path, gpu_machine):
    """Triton 3.7 and later take the accumulator's dtype: float16 compiles (and the rounding is
    named), bfloat16 is refused as an out_dtype, with the same advice."""
    path = planted(tmp_path, 4, *FP16_ACC)
    module = compiled_first(load_module(path, "_gpu_fp16_acc_new"), path)
    failed = {c.label: flat("\n".join([c.verdict.headline, *c.verdict.details]))
              for _, c in cases(check_module(EXERCISES[4], module, seed=0)) if not c.verdict.passed}
    assert list(failed) == ["40x1100 @ 1100x36 float16"]
    assert "rounded to float16 along the way" in failed["40x1100 @ 1100x36 float16"]
    # The interpreter has no bfloat16 case (its bf16 tl.dot is wrong): launched directly.
    from triton_workshop.teach.errors import verdict_for_exception

    a, b = torch.randn(77, 90, dtype=torch.bfloat16), torch.randn(90, 130, dtype=torch.bfloat16)
    with pytest.raises(Exception) as raised:
        module.matmul(a, b)
    verdict = verdict_for_exception(raised.value, str(path))
    bf16 = flat("\n".join([verdict.headline, *verdict.details]))
    assert f"raised CompilationError at line {_dot_line(path)}" in bf16
    assert "out_dtype=bfloat16 is unsupported" in bf16 and "is not float32" in bf16


def test_the_accumulator_advice_reads_the_message_or_the_source(tmp_path):
    from triton_workshop.teach.errors import verdict_for_exception

    path = planted(tmp_path, 4, *FP16_ACC)
    lines = path.read_text().splitlines()
    line = _dot_line(path)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("def matmul_kernel"))
    excerpt = "\n".join(lines[start:line])
    compile_error = type("CompilationError", (Exception,), {})

    bare = compile_error(f"at {line - start}:14:\n{excerpt}\n              ^\n")
    verdict = verdict_for_exception(bare, str(path))
    assert verdict.headline.startswith(f"raised CompilationError at line {line}")
    assert "dtype is c_ptr.dtype.element_ty" in verdict.details[1]
    # A float32 accumulator: a compile error there is something else.
    fine = tmp_path / "fine.py"
    fine.write_text((ROOT / "solutions" / "solution_4.py").read_text())
    other = compile_error(f"at {line - start}:14:\n{excerpt.replace(FP16_ACC[1], FP16_ACC[0])}\n"
                          "              ^\nInput shapes should have M >= 16")
    assert not any("accumulator" in d for d in verdict_for_exception(other, str(fine)).details)
    # A message that names the accumulator's dtype is enough.
    stated = compile_error(f"at {line - start}:14:\n{excerpt.replace(FP16_ACC[1], FP16_ACC[0])}\n"
                           "              ^\nexpected accumulator dtype fp32, got fp16; pass out_dtype=fp16")
    assert any("its dtype is fp16" in d for d in verdict_for_exception(stated, str(fine)).details)
