"""Errors turned into verdicts: an exception raised by the learner's launcher or kernel, a Triton
compile error (placed on the kernel's own line), a kernel that calls an interpreter-only helper on
the GPU, and a file that cannot even be imported. Each becomes one sentence and the fix.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from .learner_file import unfinished_todos
from .verdict import Verdict

__all__ = ["INTERPRETER_ONLY_HELPERS", "import_failure", "import_hang", "interpreter_only_verdict",
           "verdict_for_exception"]


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes, outermost first."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def verdict_for_exception(exc: Exception, learner_file: str | None, launcher=None) -> Verdict:
    todos = unfinished_todos(learner_file) if learner_file else []
    if todos:
        number, lineno, text = todos[0]
        name = Path(learner_file).name if learner_file else "your file"
        return Verdict(
            False,
            f"not implemented yet: start at TODO {number} ({name}:{lineno})",
            [f"TODO {number}: {text}" if text else f"TODO {number}",
             f"{len(todos)} TODO(s) left: replace each '...' with your code"],
        )
    chain = _chain(exc)
    helper = _interpreter_only_helper(chain)
    if helper is not None:
        return interpreter_only_verdict(helper, learner_file)
    target = Path(learner_file).resolve() if learner_file else None
    site = None
    culprit = chain[0]
    # The deepest frame in the learner's file, looked for from the innermost cause outwards:
    # the kernel's own line (the interpreter re-raises a kernel's error at the launch line).
    for inner in reversed(chain):
        frames = traceback.extract_tb(inner.__traceback__)
        mine = [f for f in frames if target and Path(f.filename).resolve() == target]
        if mine:
            site, culprit = mine[-1], inner
            break
    if site is None and isinstance(exc, TypeError) and launcher is not None and \
            len(traceback.extract_tb(exc.__traceback__)) <= 2 and getattr(launcher, "__name__", "") in str(exc):
        return Verdict(False, f"the checker could not call {launcher.__name__}(...): {exc}",
                       [f"keep the template's signature: {launcher.__name__} takes the arguments "
                        "the exercise gives it, in that order"])
    compiled = _compile_error_site(chain, target)
    if compiled is not None:  # a GPU compile error points into the kernel's source itself
        lineno, code, message = compiled
        called = _HELPER_CALL.search(code.split("#")[0])
        if called:  # whatever Triton's words (debug.print_if fails inside the helper itself)
            return interpreter_only_verdict(called.group(1), learner_file)
        details = [message[:300] if message else
                   "(Triton's compiler stopped at a check of its own on that line, without a message)"]
        advice = _dot_accumulator_advice(chain, target, lineno, code)
        if advice:
            details.append(advice)
        details.append("the kernel did not compile: that line (and the message) say what Triton "
                       "could not do")
        return Verdict(False, f"raised {type(culprit).__name__} at line {lineno}: {code}", details)
    where = f" at line {site.lineno}: {site.line}" if site else ""
    message = _message(culprit) or _message(exc)
    details = [message[:300]] if message else []
    if type(culprit).__name__ == "CompilationError" or "CompilationError" in type(exc).__name__:
        details.append("the kernel did not compile: the line above (and the message) say where")
    return Verdict(False, f"raised {type(culprit).__name__}{where}", details)


def _compile_error_site(chain, target: Path | None):
    """(line in the learner's file, its code, the reason) of a Triton CompilationError, whose
    message quotes the kernel's line above a caret."""
    if target is None:
        return None
    for exc in chain:
        if type(exc).__name__ != "CompilationError":
            continue
        lines = str(exc).splitlines()
        caret = next((i for i, ln in enumerate(lines) if ln.strip() and set(ln.strip()) == {"^"}), None)
        if not caret:
            continue
        code = lines[caret - 1].strip()
        try:
            source = [ln.strip() for ln in target.read_text().splitlines()]
        except OSError:
            return None
        # The message quotes up to 12 lines of the kernel ending at the culprit: match as many
        # as it gives, so a line that two kernels share is placed in the right one.
        header = next((i for i, ln in enumerate(lines[:caret]) if re.match(r"at \d+:\d+:", ln)), -1)
        excerpt = [ln.strip() for ln in lines[header + 1:caret]]
        found = []
        for take in (len(excerpt), 3, 1):
            tail = excerpt[-take:] if take else []
            found = [i + len(tail) for i in range(len(source) - len(tail) + 1)
                     if tail and source[i:i + len(tail)] == tail]
            if found:
                break
        if not found:
            continue
        reason = (getattr(exc, "error_message", None) or
                  next((ln.strip() for ln in lines[caret + 1:] if ln.strip()), "")) or _message(exc)
        reason = str(reason).strip().splitlines()[-1] if str(reason).strip() else ""
        # A bare assert inside Triton leaves no reason: the last line is then the caret itself.
        return found[0], code, "" if set(reason) <= {"^", " "} else reason
    return None


# Debug helpers that are plain Python functions: the interpreter runs them inside a kernel, a
# compiled kernel cannot call them.
INTERPRETER_ONLY_HELPERS = ("print_if", "breakpoint_if")
# Triton's words for a plain function in a kernel: its dependency check's on a kernel's first
# launch; that check leaves a placeholder hash on the JITFunction, so the same kernel's later
# launches reach the code generator, which names the global instead.
_UNSUPPORTED_FUNCTION = re.compile(r"Unsupported function referenced: <function (\w+)"
                                   r"|Cannot access global variable (\w+)")
_HELPER_CALL = re.compile(r"\b(print_if|breakpoint_if)\s*\(")


def _interpreter_only_helper(chain) -> str | None:
    """``print_if`` or ``breakpoint_if`` when that is why a compiled kernel failed: Triton's
    compiler refuses a plain Python function called in a kernel ("Unsupported function
    referenced"), and the helpers themselves refuse to run outside the interpreter."""
    for exc in chain:
        text = str(exc)
        m = _UNSUPPORTED_FUNCTION.search(text)
        if m and (m.group(1) or m.group(2)) in INTERPRETER_ONLY_HELPERS:
            return m.group(1) or m.group(2)
        if "print_if/breakpoint_if read program ids in interpreter mode only" in text:
            return "breakpoint_if" if "breakpoint_if(" in text else "print_if"
    return None


def interpreter_only_verdict(helper: str, learner_file: str | None) -> Verdict:
    name = Path(learner_file).name if learner_file else "your file"
    return Verdict(False, f"the kernel calls {helper}, which runs only in Triton's interpreter, "
                   "not in a kernel compiled for the GPU",
                   [f"in a compiled kernel use tl.device_print(\"x\", x) instead (or remove the call); "
                    f"to keep {helper}, run in the interpreter: TRITON_INTERPRET=1 python {name}"],
                   needs_interpreter=True)


def _dot_accumulator_advice(chain, target: Path | None, lineno: int, code: str) -> str | None:
    """For a compile error at a ``tl.dot`` line whose accumulator is not float32: Triton 3.6
    rejects it with a bare assert (tl.dot's out_dtype is float32 and must match the accumulator),
    later versions with a message, or (bfloat16) as an unsupported out_dtype."""
    if "dot(" not in code:
        return None
    text = " ".join(str(e) for e in chain)
    stated = re.search(r"accumulator dtype \S+, got (\w+)", text)
    declared = _accumulator_dtype(target, lineno)
    if stated and not _is_float32_text(stated.group(1)):
        what = stated.group(1)
    elif declared is not None:
        what = declared
    else:
        return None
    return (f"the accumulator passed to tl.dot is not float32 (its dtype is {what}): tl.dot sums "
            "its products in float32 and needs a float32 accumulator. Accumulate in float32 "
            "(acc = tl.zeros(..., dtype=tl.float32), tl.dot(a, b, acc)) and round once, on the "
            "store (acc.to(c_ptr.dtype.element_ty))")


def _is_float32_text(text: str) -> bool:
    return text.strip().strip("'\"").split(".")[-1] in ("float32", "fp32")


def _accumulator_dtype(target: Path | None, lineno: int) -> str | None:
    """The source of the dtype the accumulator of the ``tl.dot`` call at ``lineno`` is made
    with (``tl.zeros(..., dtype=X)`` or ``.to(X)``, followed through assignments in the kernel),
    when that is not float32; None when it is float32 or cannot be told."""
    import ast

    if target is None:
        return None
    try:
        text = target.read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= lineno <=
             (n.end_lineno or n.lineno) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "dot"]
    if not calls:
        return None
    call = calls[-1]
    acc = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "acc"), None)
    if acc is None:
        return None

    def dtype_of(expr) -> str | None:
        if not isinstance(expr, ast.Call):
            return None
        given = next((k.value for k in expr.keywords if k.arg == "dtype"), None)
        if given is None and getattr(expr.func, "attr", None) == "to" and expr.args:
            given = expr.args[0]
        return None if given is None else ast.get_source_segment(text, given)

    sources = [dtype_of(acc)]
    if isinstance(acc, ast.Name):
        kernel = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                  and f.lineno <= call.lineno <= (f.end_lineno or f.lineno)]
        for node in ast.walk(kernel[-1]) if kernel else ():
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == acc.id
                                                    for t in node.targets):
                sources.append(dtype_of(node.value))
    bad = [s for s in sources if s and not _is_float32_text(s)]
    return bad[0] if bad else None


def _message(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    # InterpreterError wraps the real one as repr(e); compile errors put the reason last.
    return lines[-1].strip()


def import_failure(exc: BaseException, path: Path) -> Verdict:
    """Why the learner's file could not be imported, in one sentence, and what to do."""
    name = path.name
    if isinstance(exc, SyntaxError):
        what = "indented wrongly" if isinstance(exc, IndentationError) else "not valid Python"
        text = (exc.text or "").strip()
        return Verdict(False, f"could not import {name}: line {exc.lineno} is {what} ({exc.msg})"
                       + (f": {text}" if text else ""),
                       ["fix that line (a missing bracket, colon or quote, or a stray indent, is the "
                        "usual cause; the mistake may sit at the end of the line above), then run again"])
    if isinstance(exc, FileNotFoundError) and not path.exists():
        return Verdict(False, f"{path} does not exist", ["check the path, or run from your clone of "
                                                         "triton-workshop"])
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).name == name]
    where = f"line {frames[-1].lineno} " if frames else ""
    head = f"could not import {name}: {where}"
    if isinstance(exc, ModuleNotFoundError):
        return Verdict(False, f"{head}imports {exc.name!r}, which is not installed",
                       [f"install it (pip install {exc.name}) or remove that import"])
    if isinstance(exc, ImportError):
        return Verdict(False, f"{head}has an import that fails: {exc}",
                       ["check the name imported (a typo?) and where it comes from"])
    if isinstance(exc, NameError):
        return Verdict(False, f"{head}uses {getattr(exc, 'name', None) or str(exc)!r} before "
                       "it is defined", ["define or import it above that line (or fix the typo)"])
    message = str(exc).strip().splitlines()
    return Verdict(False, f"{head}raised {type(exc).__name__} while being imported"
                   + (f": {message[-1][:200]}" if message else ""),
                   ["the file runs top to bottom when it is imported: code outside the functions "
                    "must not fail (keep tests under if __name__ == \"__main__\":)"])


def import_hang(path: Path, seconds: float) -> Verdict:
    return Verdict(False, f"could not import {path.name}: importing it did not finish within {seconds:g} s",
                   ["code at the top level of the file loops or waits: keep it inside the functions "
                    "(or under if __name__ == \"__main__\":)"])

