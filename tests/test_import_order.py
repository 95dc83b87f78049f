"""Interpreter mode holds whatever was imported before the package.

Each test runs a script in a fresh Python without ``TRITON_INTERPRET`` and with the GPUs hidden
(so interpreter mode is chosen, on any machine), after importing first what a user's script
often imports first: ``torch._dynamo``, ``triton`` itself, transformers' models. Those import
Triton, which then decorates its own jit helpers (``tl.cdiv``, ``tl.sigmoid``, the combine
functions of ``tl.max``/``tl.sum``) for the GPU before the package could choose the interpreter.
The scripts run real kernels that use those helpers and compare with PyTorch on random data.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: The kernels after the imports: matmul (tl.cdiv in its tile order), softmax and layer_norm
#: (tl.max / tl.sum reductions, which the interpreter recognises by identity), attention, add.
CHECKS = """
import torch
import torch.nn.functional as F
import triton_workshop as tw
from triton_workshop import runtime

assert runtime.INTERPRET, runtime.mode_description()
g = torch.Generator().manual_seed(0)
a, b = torch.randn(37, 45, generator=g), torch.randn(45, 29, generator=g)
torch.testing.assert_close(tw.matmul(a, b).double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)
x = torch.randn(6, 50, generator=g)
torch.testing.assert_close(tw.softmax(x, -1), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
torch.testing.assert_close(tw.layer_norm(x, (50,)), F.layer_norm(x, (50,)), rtol=1e-5, atol=1e-5)
q, k, v = (torch.randn(1, 2, 11, 16, generator=g) for _ in range(3))
torch.testing.assert_close(tw.attention(q, k, v, causal=True),
                           F.scaled_dot_product_attention(q, k, v, is_causal=True),
                           rtol=1e-4, atol=1e-5)
torch.testing.assert_close(tw.add(x, x), x + x)
print("OK", runtime.mode.TRITON_IMPORTED_FIRST)
"""

#: A kernel of the user's, decorated before the package is imported, using Triton's helpers.
USER_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def user_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=float("-inf"))
    # tl.max over the block; tl.cdiv(n, BLOCK) is the number of blocks
    shifted = tl.sigmoid(x) + tl.max(x, axis=0) + tl.cdiv(n, BLOCK)
    tl.store(out_ptr + offs, shifted, mask=mask)
"""

USER_KERNEL_CHECK = """
n = 100
xs = torch.randn(n, generator=g)
out = torch.empty_like(xs)
user_kernel[(triton.cdiv(n, 64),)](xs, out, n, BLOCK=64)
blocks = [xs[:64].max(), xs[64:].max()]
want = torch.sigmoid(xs) + torch.cat([blocks[0].expand(64), blocks[1].expand(n - 64)]) + 2
torch.testing.assert_close(out, want)
print("USER OK")
"""


def _run(tmp_path, script: str, **env_vars) -> subprocess.CompletedProcess:
    """The script as a file (``@triton.jit`` reads a kernel's source with ``inspect``), run in a
    fresh Python without TRITON_INTERPRET and with the GPUs hidden."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "TRITON_WORKSHOP_QUIET")}
    env.update(CUDA_VISIBLE_DEVICES="", TRITON_WORKSHOP_QUIET="1", **env_vars)
    # The package this test imported, wherever it came from (an install, or PYTHONPATH=src
    # relative to a working directory the script does not share).
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(importlib.util.find_spec("triton_workshop").origin).resolve().parents[1])]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, str(path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


FIRST_IMPORTS = {
    "package_first": "",
    "torch_dynamo_first": "import torch._dynamo\n",
    "triton_first": "import triton\nimport triton.language as tl\n",
    "torch_inductor_first": "import torch._inductor.config\n",
}


@pytest.mark.parametrize("first", FIRST_IMPORTS, ids=list(FIRST_IMPORTS))
def test_kernels_run_whatever_was_imported_first(tmp_path, first):
    out = _ok(_run(tmp_path, FIRST_IMPORTS[first] + CHECKS))
    # The package knows which case it was in (package_first: Triton came with it, not before).
    assert out.strip().splitlines()[-1] == f"OK {first != 'package_first'}"


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_kernels_run_after_importing_transformers_models(tmp_path):
    out = _ok(_run(tmp_path, "from transformers import GPT2LMHeadModel\n" + CHECKS))
    assert out.strip().splitlines()[-1] == "OK True"


def test_a_kernel_decorated_before_the_package_runs_in_the_interpreter(tmp_path):
    """The user's own kernel, decorated while Triton still meant the GPU, launches in the
    interpreter once the package has chosen it (on a machine without a GPU it could not run
    otherwise)."""
    out = _ok(_run(tmp_path, USER_KERNEL + CHECKS + USER_KERNEL_CHECK))
    assert out.strip().splitlines()[-2:] == ["OK True", "USER OK"]


def test_interpreter_requested_late_in_the_script(tmp_path):
    """TRITON_INTERPRET=1 set by the script itself after Triton came in: the same."""
    script = ("import torch._dynamo\nimport os\nos.environ['TRITON_INTERPRET'] = '1'\n"
              + CHECKS + "assert runtime.INTERPRET_REASON == 'TRITON_INTERPRET=1 is set'\n")
    assert "OK True" in _ok(_run(tmp_path, script))


def test_triton_internals_not_as_expected_warn_with_the_remedy(tmp_path):
    """Where Triton's objects are not what the fix reads, nothing is changed and a warning says
    how to avoid the problem (the kernels then fail as before, with Triton's message)."""
    script = """
    import warnings
    import torch._dynamo
    from triton.runtime import interpreter
    interpreter.InterpretedFunction.run = lambda self, *args, **kwargs: None  # another signature
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import triton_workshop
    from triton_workshop.runtime import launch
    from triton.runtime.jit import JITFunction
    assert launch.EARLY_JIT_FUNCTIONS.startswith("not routed"), launch.EARLY_JIT_FUNCTIONS
    assert not getattr(JITFunction, "_triton_workshop_interprets", False)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("Import triton_workshop before torch._dynamo" in m for m in said), said
    print("WARNED")
    """
    assert _ok(_run(tmp_path, script)).strip() == "WARNED"
