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
    calls = []
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
    made = _count_calls(monkeypatch, matmul_module, "_new_product_plan")
    x, w, b = _rand(6, 32, seed=14, grad=True), _rand(8, 32, seed=15, grad=True), _rand(8, seed=16, grad=True)
    g = _rand(6, 8, seed=17)
    tw.linear(x, w, b).backward(g)
    first = len(made)
    assert first >= 3  # the forward product, dx's and dweight's
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    tw.linear(x, w, b).backward(g)
    assert len(made) == first  # nothing worked out again
    for t, want in zip((x, w, b), grads):
        torch.testing.assert_close(t.grad, want)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    F.linear(xr, wr, br).backward(g.double())
    for t, want in zip((x, w, b), (xr, wr, br)):
        torch.testing.assert_close(t.grad, want.grad.float(), atol=1e-4, rtol=1e-4)


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
def test_the_host_probe_runs_with_launches_stubbed(tmp_path):
    csv_path = tmp_path / "host.csv"
    env = dict(os.environ, TRITON_WORKSHOP_QUIET="1", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "host_probe.py"), "--stub", "--ops", "linear,add",
         "--calls", "5", "--batches", "2", "--csv", str(csv_path)],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode in (0, 1), done.stderr  # 1: over budget on a loaded machine
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("op,pass,ours_us,torch_us")
    assert {r.split(",")[0] for r in rows[1:]} == {"linear", "add"}
    assert not any("error" in r for r in rows[1:]), rows
