"""Two fixes to Triton's interpreter, applied once at import in interpreter mode.

Both reach into Triton's private API, as :mod:`.launch` does: scalars usable as ``range()``
bounds under NumPy >= 2.4 (Triton <= 3.6 converts them with ``int(array)``), and the
``@triton.jit`` functions decorated before interpreter mode was chosen (Triton imported first by
``torch._dynamo``, torchvision, timm or transformers) routed to the interpreter too, so that the
mode holds whatever was imported first. :data:`EARLY_JIT_FUNCTIONS` says what the second did.
Imported by :mod:`.launch`, before any kernel launches; tests/test_import_order.py runs the orders.
"""

from __future__ import annotations

import inspect

from . import mode


def _squeeze_interpreter_index() -> bool:
    """Make the interpreter's scalars usable as ``range()`` bounds under NumPy >= 2.4.

    The interpreter holds a scalar as a shape-(1,) array, and Triton <= 3.6 turns it into a Python
    int with ``int(array)``, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted
    to Python scalars"): every loop with a runtime bound then fails. Triton 3.7 squeezes first
    (triton-lang/triton#9172); on older versions the same one-line fix is applied here. Returns
    whether it was applied."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - a Triton without an interpreter module
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or "squeeze" in inspect.getsource(original):
        return False

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


def _interpret_early_jit_functions() -> str:
    """Run the ``@triton.jit`` functions decorated before interpreter mode was chosen in the
    interpreter too, so that the mode holds whatever was imported first.

    Triton chooses between compiling and interpreting when ``@triton.jit`` *decorates* a function
    (it reads ``TRITON_INTERPRET`` then). Importing ``torch._dynamo``, torchvision, timm or
    transformers' models imports Triton before this package can set the variable, so Triton's own
    helpers (``tl.cdiv``, ``tl.sigmoid``, the combine functions of ``tl.max``/``tl.sum``, ...)
    are GPU ``JITFunction`` objects. An interpreted kernel that calls one fails ("Cannot call
    @triton.jit'd outside of the scope of a kernel"); a kernel of the user's decorated that early
    fails to launch ("0 active drivers"). In interpreter mode neither can work otherwise, so both
    calls go to an ``InterpretedFunction`` of the same Python function, which is what the
    decorator makes in interpreter mode (one per function, made on first use; the objects stay
    the same, so the interpreter's identity checks on ``tl.standard``'s combine functions still
    hold). Triton 3.6-3.9 have everything read here; where something differs nothing is changed
    and a warning says how to avoid the problem. Returns what was done ("" when nothing
    needed doing)."""
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError as exc:  # pragma: no cover - a Triton without these modules
        return _cannot_interpret_early_jit(f"{exc}")
    if getattr(JITFunction, "_triton_workshop_interprets", False):
        return "already routed"
    early = [value for value in vars(tl).values() if isinstance(value, JITFunction)]
    if not early:
        return ""  # Triton was imported after the mode was set: every function is interpreted
    try:
        run_parameters = inspect.signature(InterpretedFunction.run).parameters
        if not (callable(getattr(early[0], "fn", None)) and "grid" in run_parameters
                and "warmup" in run_parameters and callable(InterpretedFunction.__call__)):
            return _cannot_interpret_early_jit("InterpretedFunction or JITFunction changed")
    except (TypeError, ValueError) as exc:
        return _cannot_interpret_early_jit(f"{exc}")

    interpreted: dict = {}

    def interpreted_twin(jit_function):
        twin = interpreted.get(jit_function.fn)
        if twin is None:
            twin = interpreted[jit_function.fn] = InterpretedFunction(jit_function.fn)
        return twin

    def call(self, *args, **kwargs):  # a device function called from an interpreted kernel
        return interpreted_twin(self)(*args, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):  # kernel[grid](...) of an early kernel
        return interpreted_twin(self).run(*args, grid=grid, warmup=warmup, **kwargs)

    # Triton's own two, kept: tests compile for sm_90 in this process (tests/test_launch.py).
    JITFunction._triton_workshop_compiled = {"__call__": JITFunction.__call__,
                                             "run": JITFunction.run}
    JITFunction.__call__ = call
    JITFunction.run = run
    JITFunction._triton_workshop_interprets = True
    return f"routed {len(early)} early triton.language functions (and any other) to the interpreter"


def _cannot_interpret_early_jit(why: str) -> str:
    import warnings

    warnings.warn(
        "triton-workshop: Triton was imported before interpreter mode was chosen, and its jit "
        f"functions could not be switched to the interpreter ({why}): kernels may fail with "
        "\"Cannot call @triton.jit'd outside of the scope of a kernel\". Import triton_workshop "
        "before torch._dynamo, torchvision, timm or transformers, or set TRITON_INTERPRET=1 "
        "before Python starts.", RuntimeWarning, stacklevel=2)
    return f"not routed: {why}"


if mode.INTERPRET:
    _squeeze_interpreter_index()
    #: What :func:`_interpret_early_jit_functions` did at import ("" when Triton was imported
    #: after the mode was set, the usual order).
    EARLY_JIT_FUNCTIONS = _interpret_early_jit_functions()
else:
    EARLY_JIT_FUNCTIONS = ""
