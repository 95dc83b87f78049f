"""``autocast_linear`` and ``nn.CublasLinear``: torch's ``F.linear`` under autocast, whose
backward writes an fp32 weight's gradient in fp32 from the GEMM on CUDA.

On the CPU (no fp32-output GEMM) every value and gradient is autocast's own, bit for bit; on a
GPU the weight's gradient is the unrounded fp32 sum, checked against a float64 reference to be at
least as close as autocast's bf16-rounded one. Fresh seeded data, ragged sizes, batches, strided
and empty inputs; ``patch(model, compiled=True)`` makes plain Linears CublasLinear, listed.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triton_workshop as tw
from triton_workshop.nn import CublasLinear
from triton_workshop.nn.patch import InterpreterWarning, PatchWarning
from triton_workshop.ops.matmul import autocast_grads
from triton_workshop.runtime import DEVICE

DEVICE_TYPE = DEVICE.type
ON_GPU = DEVICE_TYPE == "cuda"


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def run(fn, x, weight, bias, dtype, grad_seed=7):
    """``fn``'s output under autocast to ``dtype`` and the gradients of x, weight and bias for a
    fixed random incoming gradient."""
    x = x.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    bias = None if bias is None else bias.detach().clone().requires_grad_()
    with torch.autocast(DEVICE_TYPE, dtype=dtype):
        out = fn(x, weight, bias)
    out.backward(rand(*out.shape, seed=grad_seed, dtype=out.dtype))
    return out, x.grad, weight.grad, None if bias is None else bias.grad


SHAPES = [((7, 33), 19), ((2, 5, 24), 40), ((3, 1, 17), 1), ((48,), 9)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("x_shape,n_out", SHAPES)
def test_matches_autocast_linear(x_shape, n_out, has_bias, dtype):
    """Values, x's and the bias's gradients are autocast's F.linear's; the weight's gradient is
    autocast's on the CPU and at least as close to float64 on a GPU."""
    x, weight = rand(*x_shape, seed=1), rand(n_out, x_shape[-1], seed=2)
    bias = rand(n_out, seed=3) if has_bias else None
    out, gx, gw, gb = run(tw.autocast_linear, x, weight, bias, dtype)
    ref, rgx, rgw, rgb = run(F.linear, x, weight, bias, dtype)
    assert out.dtype is ref.dtype is dtype
    assert gx.dtype is gw.dtype is torch.float32
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(gx, rgx, rtol=0, atol=0)
    if has_bias:
        torch.testing.assert_close(gb, rgb, rtol=0, atol=0)
    if not ON_GPU:
        torch.testing.assert_close(gw, rgw, rtol=0, atol=0)
        return
    # float64 from the operands autocast gave the GEMM: ours is the unrounded sum.
    g = rand(*out.shape, seed=7, dtype=dtype).double().reshape(-1, n_out)
    exact = g.t() @ x.to(dtype).double().reshape(-1, x_shape[-1])
    ours, theirs = (gw.double() - exact).abs().max(), (rgw.double() - exact).abs().max()
    assert ours <= theirs + 1e-6 * exact.abs().max()
    torch.testing.assert_close(gw.double(), exact, rtol=1e-5, atol=1e-5 * exact.abs().max())


def test_outside_autocast_and_for_low_precision_weights_it_is_f_linear():
    x, weight, bias = rand(4, 6, 10, seed=1), rand(12, 10, seed=2), rand(12, seed=3)
    for dtype in (torch.float32, torch.float64):  # outside autocast: exactly F.linear
        args = [t.to(dtype).requires_grad_() for t in (x, weight, bias)]
        torch.testing.assert_close(tw.autocast_linear(*args), F.linear(*args), rtol=0, atol=0)
    # float64 under autocast: not cast, F.linear's float64 product.
    wide = run(tw.autocast_linear, x.double(), weight.double(), bias.double(), torch.bfloat16)
    assert wide[0].dtype is wide[2].dtype is torch.float64
    # A weight already in the autocast dtype: F.linear (nothing to cast back).
    bf16 = run(tw.autocast_linear, x, weight.bfloat16(), None, torch.bfloat16)
    ref = run(F.linear, x, weight.bfloat16(), None, torch.bfloat16)
    for ours, theirs in zip(bf16[:3], ref[:3]):
        assert ours.dtype is theirs.dtype
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_strided_and_empty_inputs():
    x = rand(9, 4, 16, seed=1).transpose(0, 1)  # not contiguous
    weight = rand(20, 32, seed=2)[:, ::2]  # strided weight
    for inp in (x, x[:0]):
        ours = run(tw.autocast_linear, inp, weight, None, torch.bfloat16)
        ref = run(F.linear, inp, weight, None, torch.bfloat16)
        assert ours[0].shape == ref[0].shape
        torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=0)
        torch.testing.assert_close(ours[1], ref[1], rtol=0, atol=0)
        torch.testing.assert_close(ours[2], ref[2], rtol=2e-2, atol=1e-2)
    assert run(tw.autocast_linear, x[:0], weight, None, torch.bfloat16)[2].abs().max() == 0


def test_bad_input_is_named():
    weight = rand(3, 4)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        tw.autocast_linear([1.0] * 4, weight)
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        tw.autocast_linear(rand(2, 4), "w")
    with pytest.raises(TypeError, match="bias must be a torch.Tensor or None"):
        tw.autocast_linear(rand(2, 4), weight, 1.0)
    vector = rand(4, seed=3)  # F.linear's 1-D weight: torch's own call
    torch.testing.assert_close(tw.autocast_linear(rand(2, 4), vector), F.linear(rand(2, 4), vector))
    for autocast in (False, True):
        with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16, enabled=autocast):
            with pytest.raises(ValueError, match="x's last dimension must be weight's"):
                tw.autocast_linear(rand(2, 5), weight)
            with pytest.raises(ValueError, match="weight must be 2-D"):
                tw.autocast_linear(rand(2, 4), rand(3, 4, 1))
            with pytest.raises(ValueError, match="bias must have shape"):
                tw.autocast_linear(rand(2, 4), weight, rand(4))
            if ON_GPU:
                with pytest.raises(ValueError, match="weight is on cpu but x is on cuda"):
                    tw.autocast_linear(rand(2, 4), weight.cpu())


def test_cuda_weight_gradient_takes_the_fp32_output_gemm(monkeypatch):
    """Which product makes the weight's gradient: the fp32-output GEMM only on CUDA."""
    seen = []
    original = torch.mm

    def spy(a, b, **kwargs):
        seen.append(kwargs.get("out_dtype"))
        return original(a, b, **kwargs)

    monkeypatch.setattr(autocast_grads.torch, "mm", spy)
    run(tw.autocast_linear, rand(6, 8), rand(5, 8, seed=2), None, torch.bfloat16)
    expected = torch.float32 if ON_GPU and autocast_grads._MM_OUT_DTYPE else None
    assert seen == [expected]


def test_module_is_a_torch_linear():
    torch.manual_seed(0)
    module = CublasLinear(12, 7).to(DEVICE)
    reference = nn.Linear(12, 7).to(DEVICE)
    reference.load_state_dict(module.state_dict())
    assert isinstance(module, nn.Linear)
    x = rand(5, 12, seed=4)
    torch.testing.assert_close(module(x), reference(x), rtol=0, atol=0)
    with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
        torch.testing.assert_close(module(x), reference(x), rtol=0, atol=0)


def test_compiled_in_one_graph():
    module = CublasLinear(16, 24).to(DEVICE)
    reference = copy.deepcopy(module)
    compiled = torch.compile(module, fullgraph=True)
    x = rand(3, 5, 16, seed=5)
    with torch.autocast(DEVICE_TYPE, dtype=torch.bfloat16):
        out, ref = compiled(x), reference(x)
    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    out.float().sum().backward()
    ref.float().sum().backward()
    assert module.weight.grad.dtype is torch.float32
    torch.testing.assert_close(module.weight.grad, reference.weight.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(module.bias.grad, reference.bias.grad, rtol=2e-2, atol=2e-2)


def test_patch_compiled_makes_plain_linears_cublas_linears():
    """patch(compiled=True): a plain Linear stays on cuBLAS as a CublasLinear, listed with the
    reason, and a Linear fused with its activation is ours; eagerly, and with linear=False,
    torch's Linears stay as they are; patched again, a CublasLinear can still become ours."""
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(DEVICE)

    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        warnings.simplefilter("ignore", InterpreterWarning)
        model, reference, eager, untouched = build(), build(), build(), build()
        result = tw.nn.patch(model, compiled=True)
        tw.nn.patch(eager)
        assert not tw.nn.patch(untouched, linear=False, compiled=True).skipped
        assert type(model[0]) is tw.nn.Linear and type(model[2]) is CublasLinear
        assert type(eager[0]) is type(eager[2]) is type(untouched[2]) is nn.Linear
        assert result["linear"] == 1
        (left,) = [s for s in result.skipped if s.kind == "linear"]
        assert left.name == "2" and left.policy and "CublasLinear" in left.reason
        x = rand(6, 8, seed=9)
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
        again = tw.nn.patch(model, compiled=True)  # the same plan: nothing new
        assert again["linear"] == 0 and [s.name for s in again.skipped] == ["2"]
        assert tw.nn.patch(model, linear="always")["linear"] == 1
    assert type(model[2]) is tw.nn.Linear
    torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
