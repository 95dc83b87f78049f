"""runtime: the interpreter-or-GPU decision on import, argument checks, autotune, register_op."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import triton_workshop
from triton_workshop import runtime
import triton
import triton.language as tl

NO_CUDA = not torch.cuda.is_available()
no_cuda_only = pytest.mark.skipif(not NO_CUDA, reason="checks the no-GPU path")
interpreter_only = pytest.mark.skipif(not runtime.INTERPRET, reason="interpreter mode only")


def _env(**set_vars: str) -> dict:
    """This process's environment without the two variables the import reacts to."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "TRITON_WORKSHOP_QUIET")}
    env.update(set_vars)
    return env


def _python(args, env, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


# --------------------------------------------------------------------------------------------
# The decision on import.
# --------------------------------------------------------------------------------------------
@no_cuda_only
def test_interpreter_chosen_without_cuda():
    assert runtime.INTERPRET is True
    assert triton_workshop.INTERPRET is True
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert runtime.INTERPRET_REASON in ("no CUDA device found", "TRITON_INTERPRET=1 is set")
    assert runtime.mode_description().startswith("interpreter (")


@no_cuda_only
def test_device_is_cpu_without_cuda():
    assert runtime.DEVICE == torch.device("cpu")
    assert triton_workshop.DEVICE == torch.device("cpu")


@no_cuda_only
@pytest.mark.parametrize("quiet, lines", [(None, 1), ("1", 0), ("0", 1)],
                         ids=["unset", "quiet=1", "quiet=0"])
def test_import_announces_interpreter_mode_once(quiet, lines):
    env = _env() if quiet is None else _env(TRITON_WORKSHOP_QUIET=quiet)
    proc = _python(["-c", "import triton_workshop, triton_workshop.debug; "
                          "import triton_workshop.ops.elementwise; import triton_workshop"], env)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "interpreter mode" in line]
    assert len(said) == lines, proc.stderr
    assert "interpreter mode" not in proc.stdout
    if lines:
        assert "no CUDA device found" in said[0]


@no_cuda_only
def test_user_kernel_runs_without_setting_triton_interpret(tmp_path):
    """Import the package first, then write a kernel: it runs on CPU tensors with nothing set.

    (A file, not ``-c``: ``@triton.jit`` reads the kernel's source with ``inspect``.)
    """
    script = tmp_path / "user_kernel.py"
    script.write_text(textwrap.dedent("""
        import os
        assert "TRITON_INTERPRET" not in os.environ
        import triton_workshop
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)

        x = torch.arange(1, 101, dtype=torch.float32)
        out = torch.empty_like(x)
        double_kernel[(triton.cdiv(100, 32),)](x, out, 100, BLOCK=32)
        assert torch.equal(out, 2 * x), out
        print("OK", os.environ["TRITON_INTERPRET"], triton_workshop.INTERPRET)
    """))
    proc = _python([str(script)], _env(TRITON_WORKSHOP_QUIET="1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "OK 1 True"


# --------------------------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------------------------
def test_check_tensor_accepts_a_good_tensor():
    t = torch.ones(2, 3, device=runtime.DEVICE)
    runtime.check_tensor(t, "w", dtypes=runtime.FLOAT_DTYPES, ndim=(1, 2))
    runtime.check_tensor(t, "w", ndim=2)


def test_check_tensor_not_a_tensor_names_argument():
    with pytest.raises(TypeError, match=r"^weight must be a torch\.Tensor, got list$"):
        runtime.check_tensor([1, 2], "weight")


def test_check_tensor_dtype_names_argument():
    with pytest.raises(TypeError, match=r"^bias must have dtype in \(float32, float16\), got torch\.int64$"):
        runtime.check_tensor(torch.ones(2, dtype=torch.int64, device=runtime.DEVICE), "bias",
                             dtypes=(torch.float32, torch.float16))


def test_check_tensor_ndim_names_argument():
    with pytest.raises(ValueError, match=r"^image must have 2 or 3 dimensions, got shape \(4,\)$"):
        runtime.check_tensor(torch.ones(4, device=runtime.DEVICE), "image", ndim=(2, 3))
    with pytest.raises(ValueError, match=r"^image must have 2 dimensions"):
        runtime.check_tensor(torch.ones(1, 2, 3, device=runtime.DEVICE), "image", ndim=2)


def test_check_tensor_device_names_argument():
    with pytest.raises(ValueError, match=r"^kv must be on .*got a tensor on meta$"):
        runtime.check_tensor(torch.ones(2, device="meta"), "kv")


@interpreter_only
def test_check_kernel_device_accepts_cpu_in_interpreter():
    runtime.check_kernel_device(torch.ones(2), "x")


def test_check_same_device_names_both_arguments():
    cpu, meta = torch.ones(2), torch.ones(2, device="meta")
    with pytest.raises(ValueError, match=r"^b is on meta but a is on cpu: all tensors must be on the same device$"):
        runtime.check_same_device(a=cpu, b=meta)
    with pytest.raises(ValueError, match=r"^c is on cpu but a is on meta"):
        runtime.check_same_device(a=meta, b=meta, c=cpu)
    runtime.check_same_device(a=cpu, b=None, c=cpu)  # None is skipped
    runtime.check_same_device(a=None, b=meta)
    runtime.check_same_device()


def test_check_same_dtype_names_both_arguments():
    f32, f16 = torch.ones(2), torch.ones(2, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"^k has dtype torch\.float16 but q has torch\.float32: they must match$"):
        runtime.check_same_dtype(q=f32, k=f16)
    runtime.check_same_dtype(q=f32, k=None, v=f32)
    runtime.check_same_dtype()


def test_device_guard_is_a_no_op_off_cuda():
    with runtime.device_guard(torch.ones(1)):
        pass


# --------------------------------------------------------------------------------------------
# autotune and register_op.
# --------------------------------------------------------------------------------------------
_CONFIGS = [
    triton.Config({"BLOCK": 16}, num_warps=1),
    triton.Config({"BLOCK": 32}, num_warps=2),
    triton.Config({"BLOCK": 64}, num_warps=4),
]


@runtime.autotune(_CONFIGS, key=["n"])
@triton.jit
def _tuned_inc_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@interpreter_only
def test_autotune_keeps_first_config_in_interpreter():
    assert isinstance(_tuned_inc_kernel, triton.runtime.autotuner.Autotuner)
    assert len(_tuned_inc_kernel.configs) == 1
    assert _tuned_inc_kernel.configs[0] is _CONFIGS[0]
    assert _tuned_inc_kernel.configs[0].kwargs == {"BLOCK": 16}
    assert len(_CONFIGS) == 3  # the caller's list is left alone


def test_autotune_off_on_gpu_takes_the_first_config_pruning_keeps(monkeypatch):
    # TRITON_WORKSHOP_AUTOTUNE=0 on a GPU: not blindly configs[0] (it may not fit the shape, as a
    # D = 256 attention tile overflows shared memory) but the first config the pruning keeps.
    monkeypatch.setattr(runtime.mode, "INTERPRET", False)
    monkeypatch.setenv("TRITON_WORKSHOP_AUTOTUNE", "0")

    def prune(configs, named_args, **kwargs):
        return [c for c in configs if c.kwargs["BLOCK"] >= named_args["min_block"]]

    tuner = runtime.autotune(_CONFIGS, key=["n"], prune_configs_by={"early_config_prune": prune})(
        _tuned_inc_kernel.fn)
    assert len(tuner.configs) == 3
    assert tuner.early_config_prune(_CONFIGS, {"min_block": 32}) == [_CONFIGS[1]]
    assert tuner.early_config_prune(_CONFIGS, {"min_block": 1}) == [_CONFIGS[0]]
    # Nothing is timed for the lone config (older Triton would benchmark it).
    assert tuner.do_bench(lambda: pytest.fail("timed"), quantiles=(0.5, 0.2, 0.8)) == [0.0] * 3
    plain = runtime.autotune(_CONFIGS, key=["n"])(_tuned_inc_kernel.fn)
    assert plain.configs == [_CONFIGS[0]]


def test_autotune_asks_triton_to_keep_its_results_on_disk(monkeypatch):
    # A model's second run (a new process) should not benchmark its configs again: Triton keeps
    # the tuning results beside its compiled kernels where the installed release can.
    seen = {}
    monkeypatch.setattr(runtime.mode, "INTERPRET", False)
    monkeypatch.delenv("TRITON_WORKSHOP_AUTOTUNE", raising=False)
    monkeypatch.setattr(triton, "autotune", lambda **kwargs: seen.update(kwargs) or (lambda fn: fn))
    runtime.autotune(_CONFIGS, key=["n"])
    assert seen["configs"] == _CONFIGS and seen["key"] == ["n"]
    if "cache_results" in inspect.signature(triton.runtime.autotuner.Autotuner).parameters:
        assert seen["cache_results"] is True
    runtime.autotune(_CONFIGS, key=["n"], cache_results=False)
    assert seen["cache_results"] is False  # a caller's choice stands


@interpreter_only
def test_autotuned_kernel_runs_in_interpreter():
    x = torch.zeros(100)
    _tuned_inc_kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, 100)
    assert torch.equal(x, torch.ones(100))


def test_register_op_add_is_a_torch_op():
    import triton_workshop.ops.elementwise  # noqa: F401  (registers the op)

    op = torch.ops.triton_workshop.add
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(runtime.DEVICE)
    y = torch.randn(1000, generator=torch.Generator().manual_seed(1)).to(runtime.DEVICE)
    torch.testing.assert_close(op(x, y), x + y)
    torch.testing.assert_close(op.default(x, y), x + y)
    assert hasattr(torch.ops.triton_workshop, "fused_mul_add_sqrt")


@interpreter_only
def test_register_op_needs_fake_in_interpreter():
    def launcher(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(TypeError, match=r"register_op\('_test_no_fake'\) needs fake="):
        runtime.register_op("_test_no_fake")(launcher)


@interpreter_only
def test_register_op_registers_new_op_with_fake():
    def launcher(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    op = runtime.register_op("_test_triple", fake=lambda x: torch.empty_like(x))(launcher)
    x = torch.arange(4.0)
    assert torch.equal(torch.ops.triton_workshop._test_triple(x), 3 * x)
    assert torch.equal(op(x), 3 * x)
    # The fake runs under torch.compile.
    out = torch.compile(lambda t: torch.ops.triton_workshop._test_triple(t) + 1,
                        fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(out, 3 * x + 1)


def test_an_opaque_op_is_a_custom_op_on_a_gpu_too(monkeypatch):
    """opaque=True: torch.compile calls the launcher as it is, never traces into it; the other
    ops are triton_ops on a GPU. (Registered with the mode switched, run nowhere.)"""
    from torch._library.custom_ops import CustomOpDef

    from triton_workshop.runtime import mode

    def launcher(x: torch.Tensor) -> torch.Tensor:
        return x * 5

    monkeypatch.setattr(mode, "INTERPRET", False)
    with pytest.raises(TypeError, match=r"needs fake= when opaque"):
        runtime.register_op("_test_opaque_no_fake", opaque=True)(launcher)
    def fake(x):
        return torch.empty_like(x)

    opaque = runtime.register_op("_test_opaque", fake=fake, opaque=True)(launcher)
    traced = runtime.register_op("_test_traced")(launcher)
    # Both are CustomOpDefs; the custom_op's shape function is the fake given, while a
    # triton_op's is the launcher itself, run on fake tensors (what Inductor traces into).
    assert isinstance(opaque._op, CustomOpDef) and isinstance(traced._op, CustomOpDef)
    assert opaque._op._abstract_fn is fake
    assert traced._op._abstract_fn is launcher
    x = torch.arange(3.0)
    assert torch.equal(torch.ops.triton_workshop._test_opaque(x), 5 * x)


def test_num_sms_is_positive():
    assert runtime.num_sms() >= 1


def test_functorch_transforms_and_tracing_go_through_the_registered_op():
    """vmap and make_fx see the op, not the raw kernel launch (which cannot read their tensors)."""
    import triton_workshop as tw
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.rand(3, 17, device=runtime.DEVICE)
    torch.testing.assert_close(torch.vmap(tw.add)(x, x), 2 * x)
    graph = make_fx(lambda a: tw.add(a, a))(x)
    assert "triton_workshop.add" in str(graph.graph)


def test_registered_op_accepts_keyword_arguments():
    from triton_workshop.ops.elementwise import _add

    x = torch.rand(5, device=runtime.DEVICE)
    torch.testing.assert_close(_add(x, y=x), 2 * x)


def test_eager_backward_is_false_while_building_a_graph_for_double_backward():
    with torch.no_grad():
        assert runtime.eager_backward()
    with torch.enable_grad():
        assert not runtime.eager_backward()


# --------------------------------------------------------------------------------------------
# Direct launches (FastLaunch, PreparedLaunch, launch_kernel's plans): tests/test_launch.py, on
# the installed Triton's real objects.
# --------------------------------------------------------------------------------------------
