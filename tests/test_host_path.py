"""The eager host path: public function -> plan (kept per call signature) -> launch.

What a repeated eager call skips (the checks of a signature seen before, the launch decisions of a
layout seen before), that nothing it skips could have changed the outcome (a new signature is
checked again, a replaced tuning or TF32 setting gets new plans), and how few Python frames lie
between a public function and the launch. The host times themselves are measured by
scripts/host_probe.py (on a GPU, or here with --stub).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import triton_workshop as tw
from triton_workshop import DEVICE, runtime
from triton_workshop.ops import matmul as matmul_module

ROOT = Path(__file__).resolve().parents[1]


def _rand(*shape, seed=0, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)
    return t.requires_grad_() if grad else t


def _count_calls(monkeypatch, module, name) -> list:
    """Count the calls of ``module.name`` (``name`` may be dotted: a submodule's function)."""
    calls = []
    owner, _, name = name.rpartition(".")
    for part in owner.split(".") if owner else ():
        module = getattr(module, part)
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


# --------------------------------------------------------------------------------------------
# linear: checked once per call signature.
# --------------------------------------------------------------------------------------------
def test_a_repeated_linear_call_is_checked_once(monkeypatch):
    checks = _count_calls(monkeypatch, matmul_module, "_check_linear")
    x, w, b = _rand(5, 24, seed=1), _rand(7, 24, seed=2), _rand(7, seed=3)
    for _ in range(3):
        torch.testing.assert_close(tw.linear(x, w, b), F.linear(x, w, b))
    assert len(checks) == 1
    # Same layouts, other tensors: the same signature.
    tw.linear(_rand(5, 24, seed=4), _rand(7, 24, seed=5), _rand(7, seed=6))
    assert len(checks) == 1
    # Another shape, activation, slope type or bias presence: checked again.
    tw.linear(_rand(6, 24, seed=7), w, b)
    tw.linear(x, w, b, "leaky_relu", leaky_relu_slope=1)
    tw.linear(x, w, b, "leaky_relu", leaky_relu_slope=1.0)
    tw.linear(x, w)
    assert len(checks) == 5


def test_a_kept_signature_still_refuses_what_differs():
    x, w = _rand(3, 16, seed=8), _rand(4, 16, seed=9)
    tw.linear(x, w, None, "leaky_relu", leaky_relu_slope=1)
    with pytest.raises(TypeError, match="^leaky_relu_slope must be a float"):
        tw.linear(x, w, None, "leaky_relu", leaky_relu_slope=True)  # True == 1, hash(True) == 1
    with pytest.raises(TypeError, match="^weight has dtype torch.float16"):
        tw.linear(x, w.half())
    with pytest.raises(ValueError, match="^activation must be one of"):
        tw.linear(x, w, None, ["relu"])  # unhashable: checked, not looked up
    with pytest.raises(TypeError, match="^x must be a torch.Tensor"):
        tw.linear(x.tolist(), w)


@pytest.mark.parametrize("shape", [(16,), (3, 16), (2, 3, 16)])
def test_linear_rows_of_every_rank_and_a_batched_view(shape):
    w, b = _rand(5, 16, seed=10), _rand(5, seed=11)
    x = _rand(*shape, seed=12)
    for _ in range(2):
        torch.testing.assert_close(tw.linear(x, w, b), F.linear(x, w, b))
    if x.dim() == 3:  # leading dims that do not merge: a batched product, no copy
        xt = _rand(3, 2, 16, seed=13).transpose(0, 1)
        for _ in range(2):
            torch.testing.assert_close(tw.linear(xt, w, b), F.linear(xt, w, b))


# --------------------------------------------------------------------------------------------
# The product: one plan per operand layout, made once (the backward's products included).
# --------------------------------------------------------------------------------------------
def test_forward_and_backward_products_reuse_their_plans(monkeypatch):
    """The forward's plan is made once per layout; the backward makes none (its products are
    torch's GEMMs: nothing to fuse), and its gradients are right."""
    # Nothing kept from earlier tests: a new tuning object (signature caches) and plan cache.
    monkeypatch.setattr(matmul_module, "TUNING", dataclasses.replace(matmul_module.TUNING))
    monkeypatch.setattr(matmul_module.product, "_PRODUCT_PLANS", {})
    made = _count_calls(monkeypatch, matmul_module, "_new_product_plan")
    x, w, b = _rand(6, 32, seed=14, grad=True), _rand(8, 32, seed=15, grad=True), _rand(8, seed=16, grad=True)
    g = _rand(6, 8, seed=17)
    for activation in (None, "gelu"):  # gelu: the backward recomputes the pre-activation too
        tw.linear(x, w, b, activation).backward(g)
        assert len(made) == 1 + (activation == "gelu")  # the forward's plan, nothing else
        grads = [t.grad.clone() for t in (x, w, b)]
        for _ in range(2):
            for t in (x, w, b):
                t.grad = None
            tw.linear(x, w, b, activation).backward(g)
            assert len(made) == 1 + (activation == "gelu")  # nothing worked out again
            for t, want in zip((x, w, b), grads):
                torch.testing.assert_close(t.grad, want)
        xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
        ref = F.linear(xr, wr, br)
        (F.gelu(ref, approximate="tanh") if activation else ref).backward(g.double())
        for t, want in zip((x, w, b), (xr, wr, br)):
            torch.testing.assert_close(t.grad, want.grad.float(), atol=1e-4, rtol=1e-4)
        for t in (x, w, b):
            t.grad = None


def test_a_replaced_tuning_or_tf32_setting_gets_new_plans(monkeypatch):
    made = _count_calls(monkeypatch, matmul_module, "_new_product_plan")
    a, b = _rand(4, 32, seed=18), _rand(32, 16, seed=19)  # 16-element rows: read as they lie
    tw.matmul(a, b)
    tw.matmul(a, b)
    assert len(made) == 1
    monkeypatch.setattr(matmul_module, "TUNING",
                        dataclasses.replace(matmul_module.TUNING, int32_tile_offsets=False))
    tw.matmul(a, b)
    assert len(made) == 2
    plan = matmul_module._product_plan(a, b, a.new_empty(4, 16), None, "none", 0.0)
    assert plan.consts["INT32_TILE_OFFSETS"] is False
    monkeypatch.setattr(matmul_module, "tf32_enabled", lambda: True)
    before = len(made)
    tw.matmul(a, b)
    assert len(made) == before + 1


def test_operands_that_need_a_copy_take_the_general_path(monkeypatch):
    """An operand Triton cannot read with 16-byte loads is copied first (align_operands): no
    plan is kept for launching it as it lies."""
    monkeypatch.setattr(matmul_module, "TUNING",
                        dataclasses.replace(matmul_module.TUNING, align_operands=True))
    a = _rand(4, 30, seed=20, dtype=torch.float16)  # rows of 60 bytes
    b = _rand(30, 8, seed=21, dtype=torch.float16)
    out = a.new_empty(4, 16)
    assert runtime.launch_directly(matmul_module._product_plan)(a, b, out, None, "none", 0.0) is None
    aligned = _rand(4, 32, seed=22, dtype=torch.float16)
    b32 = _rand(32, 16, seed=23, dtype=torch.float16)
    plan = runtime.launch_directly(matmul_module._product_plan)(aligned, b32, out, None, "none", 0.0)
    assert isinstance(plan, runtime.LaunchPlan)


# --------------------------------------------------------------------------------------------
# The registered op's eager call.
# --------------------------------------------------------------------------------------------
def test_the_eager_autograd_function_is_applied_through_torch_c_entry_point():
    op = matmul_module._matmul
    assert op._apply is not None
    assert op._apply.__self__ is op._function  # bound to the Function class
    x, w = _rand(3, 8, seed=24, grad=True), _rand(4, 8, seed=25)
    y = tw.linear(x, w)
    assert type(y.grad_fn)._forward_cls is op._function


def test_eager_calls_with_keywords_or_subclasses_keep_their_paths():
    a, b = _rand(3, 8, seed=26), _rand(8, 4, seed=27)
    op = matmul_module._matmul
    torch.testing.assert_close(op(a, b, None, activation="none", slope=0.0), a @ b)

    class Marked(torch.Tensor):
        pass

    marked = a.as_subclass(Marked)
    out = op(marked, b, None, "none", 0.0)  # the dispatcher handles the subclass
    torch.testing.assert_close(torch.Tensor(out), a @ b)


def test_device_guard_only_switches_for_another_device():
    assert runtime.device_guard(torch.empty(1)) is runtime.launch._NO_GUARD
    if torch.cuda.is_available():
        current = torch.cuda.current_device()
        assert runtime.device_guard(torch.empty(1, device=f"cuda:{current}")) is runtime.launch._NO_GUARD


# --------------------------------------------------------------------------------------------
# A few frames from the public function to the launch.
# --------------------------------------------------------------------------------------------
def _outer():
    return inspect.currentframe().f_back.f_code


@pytest.mark.parametrize("name", ["linear", "layer_norm", "softmax", "add"])
def test_few_frames_from_the_public_function_to_the_launch(name, monkeypatch):
    x, w = _rand(4, 16, seed=28), _rand(8, 16, seed=29)
    call = {"linear": lambda: tw.linear(x, w), "layer_norm": lambda: tw.layer_norm(x, (16,)),
            "softmax": lambda: tw.softmax(x), "add": lambda: tw.add(x, x)}[name]
    call()
    frames = []
    real = runtime.registry.launch_kernel
    here = _outer()

    def spy(*args, **kwargs):
        if not frames:
            frame = inspect.currentframe().f_back
            while frame is not None and frame.f_code is not here:
                frames.append(frame.f_code.co_name)
                frame = frame.f_back
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime.registry, "launch_kernel", spy)
    call()
    # public function (and the autocast wrapper), the registered op, the launcher, its plan.
    frames = [f for f in frames if f != "<lambda>"]
    assert frames[0] == "launch" and len(frames) <= 6, frames


# --------------------------------------------------------------------------------------------
# The probe, stubbed (its own process: stub_launches cannot be undone).
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["--autocast"], ["--same-thread"]], ids=str)
def test_the_host_probe_runs_with_launches_stubbed(tmp_path, options):
    autocast = "--autocast" in options
    csv_path = tmp_path / "host.csv"
    # As on a machine without a GPU, also on one with: the stubbed probe runs on CPU tensors (on
    # a GPU the real probe, launches and all, is what measures).
    env = dict(os.environ, TRITON_WORKSHOP_QUIET="1", PYTHONPATH=str(ROOT / "src"),
               TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "host_probe.py"), "--stub", "--ops", "linear,add",
         "--calls", "5", "--batches", "2", "--csv", str(csv_path)] + options,
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode in (0, 1), done.stderr  # 1: over budget on a loaded machine
    assert ("under torch.autocast" in done.stdout) is autocast
    assert ("backwards on the calling thread" in done.stdout) is ("--same-thread" in options)
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("op,pass,ours_us,torch_us")
    assert {r.split(",")[0] for r in rows[1:]} == {"linear", "add"}
    assert not any("error" in r for r in rows[1:]), rows


# --------------------------------------------------------------------------------------------
# The memory-bound ops: an eager call of layouts seen before goes straight to its launch.
# --------------------------------------------------------------------------------------------
from triton_workshop.ops import cross_entropy as ce_module  # noqa: E402
from triton_workshop.ops import elementwise as elementwise_module  # noqa: E402
from triton_workshop.ops import glu as glu_module  # noqa: E402
from triton_workshop.ops import layer_norm as layer_norm_module  # noqa: E402
from triton_workshop.ops import rms_norm as rms_norm_module  # noqa: E402
from triton_workshop.ops import softmax as softmax_module  # noqa: E402

_LABELS = torch.tensor([3, 0, 7, -100, 1, 15], device=DEVICE)

#: name -> (module, its check function, ours(x, y), torch's(x, y)) over (6, 16) operands.
_KEPT_OPS = {
    "softmax": (softmax_module, "_check_args", lambda x, y: tw.softmax(x, -1),
                lambda x, y: torch.softmax(x, -1)),
    "swiglu": (glu_module, "_check_args", glu_module.swiglu, lambda x, y: F.silu(x) * y),
    "geglu": (glu_module, "_check_args", glu_module.geglu,
              lambda x, y: F.gelu(x, approximate="tanh") * y),
    "add": (elementwise_module, "_check", tw.add, torch.add),
    "fused_mul_add_sqrt": (elementwise_module, "_check",
                           lambda x, y: tw.fused_mul_add_sqrt(x.abs(), y.abs(), x.abs()),
                           lambda x, y: torch.sqrt(x.abs() * y.abs() + x.abs())),
    "rms_norm": (rms_norm_module, "checks._check_arguments",
                 lambda x, y: rms_norm_module.rms_norm(x, (16,), y[0]),
                 lambda x, y: F.rms_norm(x, (16,), y[0])),
    "add_rms_norm": (rms_norm_module, "checks._check_arguments",
                     lambda x, y: torch.cat(rms_norm_module.add_rms_norm(x, y, (16,), y[1])),
                     lambda x, y: torch.cat((F.rms_norm(x + y, (16,), y[1]), x + y))),
    "layer_norm": (layer_norm_module, "_check_args",
                   lambda x, y: tw.layer_norm(x, (16,), y[0], y[1]),
                   lambda x, y: F.layer_norm(x, (16,), y[0], y[1])),
    "cross_entropy": (ce_module, "_check_cross_entropy",
                      lambda x, y: ce_module.cross_entropy(x, _LABELS),
                      lambda x, y: F.cross_entropy(x, _LABELS)),
}


def _forget_kept(module):
    """Clear the kept calls of an op module (and of its ``checks`` submodule, where it has one)."""
    for owner in (module, getattr(module, "checks", None)):
        for name in ("_READY", "_CALLS"):
            if hasattr(owner, name):
                getattr(owner, name).clear()


@pytest.mark.parametrize("name", list(_KEPT_OPS))
def test_a_repeated_eager_call_is_checked_once_and_stays_right(name, monkeypatch):
    module, check, ours, theirs = _KEPT_OPS[name]
    _forget_kept(module)
    checks = _count_calls(monkeypatch, module, check)
    x, y = _rand(6, 16, seed=30), _rand(6, 16, seed=31)
    for seed in range(3):  # other tensors of the same layouts: nothing checked again
        x, y = _rand(6, 16, seed=30 + seed), _rand(6, 16, seed=40 + seed)
        torch.testing.assert_close(ours(x, y), theirs(x, y))
    assert len(checks) == 1
    # Another dtype, another stride (a transposed copy viewed back), or autograd: right again.
    torch.testing.assert_close(ours(x.double() if name in ("softmax", "layer_norm", "rms_norm",
                                                            "add_rms_norm") else x.half(),
                                    y.double() if name in ("softmax", "layer_norm", "rms_norm",
                                                            "add_rms_norm") else y.half()).float(),
                               theirs(x, y), atol=2e-3, rtol=2e-3)
    assert len(checks) == 2
    xt = x.t().contiguous().t()  # (6, 16) with strides (1, 6): its own launch
    for _ in range(2):
        torch.testing.assert_close(ours(xt, y), theirs(xt, y))
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    g = torch.randn_like(theirs(x, y))
    for _ in range(2):  # the kept signature, now recording for autograd
        xg.grad = yg.grad = xr.grad = yr.grad = None
        out = ours(xg, yg)
        assert out.grad_fn is not None
        out.backward(g)
        theirs(xr, yr).backward(g)
        torch.testing.assert_close(xg.grad, xr.grad, atol=1e-5, rtol=1e-4)
        if yr.grad is not None:
            torch.testing.assert_close(yg.grad, yr.grad, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # tensors that require grad, autograd off: the plain launch
        torch.testing.assert_close(ours(xg, yg), theirs(x, y))


def test_a_kept_eager_signature_still_refuses_what_differs():
    x, y, w = _rand(4, 16, seed=60), _rand(4, 16, seed=61), _rand(16, seed=62)
    tw.softmax(x, -1)
    tw.softmax(x, -1)
    with pytest.raises(IndexError, match="^dim must be in"):
        tw.softmax(x, 2)
    with pytest.raises(TypeError, match="^dim must be an int, got bool"):
        tw.softmax(x, True)  # True == 1: a key of its own
    glu_module.swiglu(x, y)
    glu_module.swiglu(x, y)
    with pytest.raises(ValueError, match="^gate and up must have the same shape"):
        glu_module.swiglu(x, y[:3])
    with pytest.raises(TypeError, match="^gate must be a torch.Tensor"):
        glu_module.swiglu(x.tolist(), y)
    glu_module.geglu(x, y)
    with pytest.raises(ValueError, match="^approximate must be 'none' or 'tanh'"):
        glu_module.geglu(x, y, "silu")
    with pytest.raises(TypeError, match="^approximate must be a str, got NoneType"):
        glu_module.geglu(x, y, None)
    tw.add(x, y)
    tw.add(x, y)
    with pytest.raises(TypeError, match="^y must have dtype in"):
        tw.add(x, y.long())
    rms_norm_module.rms_norm(x, (16,), w, 1e-6)
    rms_norm_module.rms_norm(x, (16,), w, 1e-6)
    with pytest.raises(ValueError, match="^eps must be >= 0"):
        rms_norm_module.rms_norm(x, (16,), w, -1e-6)
    with pytest.raises(ValueError, match="^weight must have shape"):
        rms_norm_module.rms_norm(x, (16,), w[:8], 1e-6)
    with pytest.raises(ValueError, match="^residual must have the shape of x"):
        rms_norm_module.add_rms_norm(x, y[:2], (16,), w)
    tw.layer_norm(x, (16,), w, w)
    tw.layer_norm(x, (16,), w, w)
    with pytest.raises(TypeError, match="^eps must be a float, got bool"):
        tw.layer_norm(x, (16,), w, w, True)
    labels = _LABELS[:4]
    ce_module.cross_entropy(x, labels)
    ce_module.cross_entropy(x, labels)
    with pytest.raises(TypeError, match="^target must have dtype in"):
        ce_module.cross_entropy(x, labels.int())
    with pytest.raises(ValueError, match="^reduction must be one of"):
        ce_module.cross_entropy(x, labels, reduction="avg")


def test_eager_path_says_which_way_a_call_goes():
    op = softmax_module.softmax_forward
    x = _rand(2, 8, seed=63)
    xg = x.clone().requires_grad_()
    assert op.eager_path(x, -1) == runtime.PLAIN
    assert op.eager_path(xg, -1) == runtime.RECORD
    with torch.no_grad():
        assert op.eager_path(xg, -1) == runtime.PLAIN

    class Marked(torch.Tensor):
        pass

    assert op.eager_path(x.as_subclass(Marked), -1) == 0
    assert op.eager_path(torch.nn.Parameter(x), -1) == runtime.RECORD


def test_kept_eager_launches_follow_a_replaced_tuning(monkeypatch):
    x = _rand(4, 300, seed=64)
    for _ in range(2):
        torch.testing.assert_close(tw.softmax(x), torch.softmax(x, -1))
    monkeypatch.setattr(softmax_module, "TUNING", dataclasses.replace(
        softmax_module.TUNING, single_block_max_cols=256, chunk_cols=64))
    for _ in range(2):
        torch.testing.assert_close(tw.softmax(x), torch.softmax(x, -1))
    kept = [ready[1] for ready in softmax_module._READY.values()]  # (dim, plan, ...)
    assert [plan.kernel for plan in kept] == [softmax_module.softmax_fwd_online_kernel]


def test_cross_entropy_mean_backward_divides_by_its_own_count():
    """The backward of a mean takes the count of targets its forward made: calls in between
    (another target, no autograd) leave it alone."""
    x = _rand(6, 16, seed=65, grad=True)
    ref = x.detach().clone().requires_grad_()
    loss = ce_module.cross_entropy(x, _LABELS)
    with torch.no_grad():
        ce_module.cross_entropy(x, torch.full_like(_LABELS, -100))
    ce_module.cross_entropy(x.detach(), _LABELS[[1, 0, 2, 3, 4, 5]])
    loss.backward()
    F.cross_entropy(ref, _LABELS).backward()
    torch.testing.assert_close(x.grad, ref.grad)


# --------------------------------------------------------------------------------------------
# The products, attention and linear_cross_entropy: a kept signature launches its kept plans,
# and its autograd Function takes the forward that launches them (record_planned).
# --------------------------------------------------------------------------------------------
from triton_workshop.ops import attention as attention_module  # noqa: E402
from triton_workshop.ops import layer_norm_linear as layer_norm_linear_module  # noqa: E402

_LABELS16 = torch.tensor([3, 0, 7, -100, 1, 15], device=DEVICE)

#: name -> (the registered op, ours(*tensors), torch's(*tensors), the tensors' shapes).
_KEPT_PRODUCTS = {
    # b as a transposed view (K contiguous): on a GPU an fp32 (TF32) product copies a row-major
    # b first, which takes the general path and keeps no plan.
    "matmul": (matmul_module._matmul, lambda a, b: tw.matmul(a, b.T), lambda a, b: a @ b.T,
               [(6, 16), (8, 16)]),
    "matmul_bias_relu": (matmul_module._matmul,
                         lambda a, b, c: tw.matmul(a, b.T, bias=c, activation="relu"),
                         lambda a, b, c: torch.relu(a @ b.T + c), [(6, 16), (8, 16), (8,)]),
    "linear": (matmul_module._matmul, lambda x, w, b: tw.linear(x, w, b), F.linear,
               [(6, 16), (8, 16), (8,)]),
    "linear_3d": (matmul_module._matmul, lambda x, w: tw.linear(x, w), F.linear,
                  [(2, 3, 16), (8, 16)]),
    "attention": (attention_module.attention_forward,
                  lambda q, k, v: tw.attention(q, k, v, causal=True),
                  lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                  [(1, 2, 8, 16)] * 3),
    "attention_3d": (attention_module.attention_forward,
                     lambda q, k, v: tw.attention(q, k, v, window=3, softcap=20.0),
                     lambda q, k, v: _windowed_softcapped(q, k, v, 3, 20.0), [(2, 8, 16)] * 3),
    "layer_norm_linear": (layer_norm_linear_module.layer_norm_linear_forward,
                          lambda x, g, b, w, c: tw.layer_norm_linear(x, g, b, w, c),
                          lambda x, g, b, w, c: F.linear(F.layer_norm(x, (16,), g, b), w, c),
                          [(2, 3, 16), (16,), (16,), (8, 16), (8,)]),
    "linear_cross_entropy": (ce_module.linear_cross_entropy_forward,
                             lambda x, w, b: ce_module.linear_cross_entropy(
                                 x, w, _LABELS16, b, label_smoothing=0.1),
                             lambda x, w, b: F.cross_entropy(F.linear(x, w, b), _LABELS16,
                                                             label_smoothing=0.1),
                             [(6, 16), (16, 16), (16,)]),
    "linear_cross_entropy_sum": (ce_module.linear_cross_entropy_forward,
                                 lambda x, w: ce_module.linear_cross_entropy(
                                     x, w, _LABELS16, reduction="sum"),
                                 lambda x, w: F.cross_entropy(F.linear(x, w), _LABELS16,
                                                              reduction="sum"),
                                 [(6, 16), (16, 16)]),
}


@pytest.mark.parametrize("name", list(_KEPT_PRODUCTS))
def test_a_kept_signature_launches_its_plans_and_stays_right(name, monkeypatch):
    op, ours, theirs, shapes = _KEPT_PRODUCTS[name]
    planned = []
    real = op.record_planned
    monkeypatch.setattr(op, "record_planned", lambda *args: planned.append(1) or real(*args))
    for step in range(3):
        tensors = [_rand(*shape, seed=70 + 10 * step + i) for i, shape in enumerate(shapes)]
        torch.testing.assert_close(ours(*tensors), theirs(*tensors), atol=1e-4, rtol=1e-4)
        ours_grad = [t.clone().requires_grad_() for t in tensors]
        theirs_grad = [t.clone().requires_grad_() for t in tensors]
        out = ours(*ours_grad)
        g = torch.randn_like(out)
        out.backward(g)
        theirs(*theirs_grad).backward(g)
        for mine, want in zip(ours_grad, theirs_grad):
            torch.testing.assert_close(mine.grad, want.grad, atol=1e-4, rtol=1e-4)
    assert len(planned) == 3  # every call that recorded: its signature was kept before


def _windowed_softcapped(q, k, v, window, softcap):
    """attention's ``window`` (query i sees key j where i - j < window) and ``softcap``."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(q.shape[-2], device=q.device)
    scores = scores.masked_fill(rows[:, None] - rows[None] >= window, float("-inf"))
    return torch.softmax(scores, -1) @ v


def test_autocast_calls_whose_arguments_are_cast_take_the_kept_path():
    """Under torch.autocast the public function casts first; the op then sees arguments of the
    autocast dtype, which take the kept eager path (a training loop's every call), while any
    argument still to cast sends the call down the general path that casts it."""
    op = matmul_module._matmul
    a16, b16 = _rand(4, 8, seed=65, dtype=torch.bfloat16), _rand(8, 6, seed=66, dtype=torch.bfloat16)
    a32 = _rand(4, 8, seed=67)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        assert op.eager_path(a16, b16, None) == runtime.PLAIN
        assert op.eager_path(a16, b16.clone().requires_grad_(), None) == runtime.RECORD
        assert op.eager_path(a32, b16, None) == 0
    assert op.eager_path(a32, b16, None) == runtime.PLAIN  # outside autocast: nothing to cast
    # Repeated calls (the second one kept) give torch's autocast result, and its gradients.
    x, w = _rand(5, 16, seed=68, grad=True), _rand(12, 16, seed=69, grad=True)
    for _ in range(3):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            ours, theirs = tw.linear(x, w), F.linear(x, w)
        assert ours.dtype == theirs.dtype == torch.bfloat16
        torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=2e-2)
        gx, gw = torch.autograd.grad(ours.float().sum(), (x, w))
        tx, tw_ = torch.autograd.grad(theirs.float().sum(), (x, w))
        assert gx.dtype == gw.dtype == torch.float32
        torch.testing.assert_close(gx, tx, atol=5e-2, rtol=2e-2)
        torch.testing.assert_close(gw, tw_, atol=5e-2, rtol=2e-2)
