"""layer_norm_linear against F.layer_norm -> F.linear in float64: values, gradients, numerics.

References are computed in float64 from the *same rounded* inputs, so the error measured is the
fused op's own: fp32 statistics and accumulation, the rounding of W' = weight * ln_weight to the
input dtype, and the one rounding of the output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop.ops import layer_norm_linear as lnl_module
from triton_workshop.ops.layer_norm_linear import layer_norm_linear
from triton_workshop.ops.matmul import tf32_enabled
from triton_workshop.runtime import DEVICE

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative error bounds: Frobenius norm of the error over that of the reference (and 4x that for
# the largest error over the largest |reference|). fp32 with TF32 off is IEEE fp32 throughout;
# fp16/bf16 are dominated by the rounding of W' and of the output (2**-11, 2**-8).
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def ieee_fp32():
    """TF32 off (the test of the TF32 path turns it on), restored afterwards."""
    before = tf32_enabled()
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def rand(*shape, dtype=torch.float32, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift
    return t.to(DEVICE, dtype)


def make_inputs(lead, K, N, dtype, *, ln_weight=True, ln_bias=True, bias=True, shift=0.0):
    x = rand(*lead, K, dtype=dtype, seed=1, shift=shift)
    g = rand(K, dtype=dtype, seed=2, scale=0.3, shift=1.0) if ln_weight else None
    b = rand(K, dtype=dtype, seed=3, scale=0.5) if ln_bias else None
    w = rand(N, K, dtype=dtype, seed=4, scale=max(K, 1) ** -0.5)
    bias_t = rand(N, dtype=dtype, seed=5, scale=0.5) if bias else None
    return x, g, b, w, bias_t


def reference(x, g, b, w, bias, eps=1e-5):
    def d(t):
        return None if t is None else t.double()

    return F.linear(F.layer_norm(d(x), (x.shape[-1],), d(g), d(b), eps), d(w), d(bias))


def assert_close(out, ref, tol):
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()
    err = out.double() - ref
    if ref.numel() == 0:
        return
    # The floor: a gradient that is 0 in exact arithmetic (K = 1: xhat = 0) is float64 noise.
    rel = (err.norm() / ref.norm().clamp_min(1e-6)).item()
    peak = (err.abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    assert rel <= tol and peak <= 4 * tol, f"relative error {rel:.2e}, peak {peak:.2e} (tol {tol})"


def check(x, g, b, w, bias, *, eps=1e-5, tol=None, grads=True):
    """Values, then the gradient of every input, against float64 autograd."""
    tol = tol or TOL[x.dtype]
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, g, b, w, bias)]
    out = layer_norm_linear(*leaves, eps=eps)
    assert out.dtype == x.dtype and out.shape == (*x.shape[:-1], w.shape[0])
    refs = [t.double().requires_grad_() if t is not None else None for t in (x, g, b, w, bias)]
    ref = reference(*refs, eps=eps)
    assert_close(out, ref, tol)
    if not grads:
        return
    dy = rand(*out.shape, dtype=x.dtype, seed=9)
    used = [i for i, t in enumerate(leaves) if t is not None]
    got = torch.autograd.grad(out, [leaves[i] for i in used], dy)
    want = torch.autograd.grad(ref, [refs[i] for i in used], dy.double())
    for i, gr, wr in zip(used, got, want):
        assert gr.dtype == leaves[i].dtype and gr.shape == leaves[i].shape
        assert_close(gr, wr, tol)


# ---------------------------------------------------------------------------------------------
# Values and gradients.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "lead, K, N",
    [((1,), 1, 1), ((3,), 7, 5), ((37,), 70, 45), ((130,), 129, 131)],
    ids=lambda v: str(v),
)
def test_matches_float64(lead, K, N, dtype):
    check(*make_inputs(lead, K, N, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_batch_dims_and_strided_x(dtype):
    check(*make_inputs((2, 9), 40, 24, dtype))
    check(*make_inputs((2, 3, 5), 16, 8, dtype))
    # Leading dims that cannot be merged into rows without a copy, and a strided last dim.
    x, g, b, w, bias = make_inputs((9, 2), 40, 24, dtype)
    check(x.transpose(0, 1), g, b, w, bias)
    wide = rand(6, 80, dtype=dtype, seed=11)
    check(wide[:, ::2], g, b, w, bias)


@pytest.mark.parametrize(
    "ln_weight, ln_bias, bias",
    [(False, False, False), (True, False, True), (False, True, False), (True, True, False)],
    ids=["none", "weight+bias", "ln_bias_only", "no_linear_bias"],
)
def test_optional_parameters(ln_weight, ln_bias, bias):
    flags = dict(ln_weight=ln_weight, ln_bias=ln_bias, bias=bias)
    check(*make_inputs((21,), 33, 17, torch.float32, **flags))


def test_parameters_of_other_dtypes():
    # fp32 LayerNorm/bias parameters with fp16 activations and weight (a mixed-precision layout).
    x, g, b, w, bias = make_inputs((19,), 48, 20, torch.float16)
    check(x, g.float(), b.float(), w, bias.float())


def test_eps():
    x, g, b, w, bias = make_inputs((8,), 32, 16, torch.float32)
    check(x * 1e-3, g, b, w, bias, eps=1e-2)


def test_long_rows_are_merged_chunk_by_chunk(monkeypatch):
    # Rows longer than STATS_CHUNK_COLS take several chunks merged by Chan's update.
    monkeypatch.setattr(lnl_module, "STATS_CHUNK_COLS", 16)
    check(*make_inputs((10,), 100, 12, torch.float32, shift=30.0))


# ---------------------------------------------------------------------------------------------
# Numerics of the epilogue form.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_large_mean(dtype):
    """mean 50, std 1: x @ W' and mean * c1 are ~50x the result and cancel. The expected error is
    ~2**-24 * sqrt(K) * 50 (about 5e-5 here), far inside the dtype's tolerance."""
    x, g, b, w, bias = make_inputs((64,), 256, 48, dtype, shift=50.0)
    check(x, g, b, w, bias)
    # Tighter than the general bound: the cancellation adds nothing visible to fp16's rounding.
    out = layer_norm_linear(x, g, b, w, bias)
    ref = reference(x, g, b, w, bias)
    assert_close(out, ref, 2e-4 if dtype == torch.float32 else 2e-3)


def test_tf32_path_centres_a():
    """With TF32 on, fp32 takes the centred path (x - mean in the main loop, no c1 term). The
    interpreter computes TF32 dots in IEEE fp32, so there this checks the algebra; the GPU test
    checks the error stays at TF32's level despite a large mean."""
    torch.backends.cuda.matmul.allow_tf32 = True  # the fixture restores it
    assert lnl_module._input_precision(torch.float32) == "tf32"
    x, g, b, w, bias = make_inputs((40,), 96, 24, torch.float32, shift=50.0)
    tol = 1e-4 if triton_workshop.INTERPRET else 5e-3
    check(x, g, b, w, bias, tol=tol)


# ---------------------------------------------------------------------------------------------
# Empty inputs and bad inputs.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lead, K, N", [((0,), 8, 4), ((5,), 8, 0), ((5,), 0, 4), ((2, 0), 8, 4)], ids=str
)
def test_empty(lead, K, N):
    inputs = make_inputs(lead, K, N, torch.float32)
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = layer_norm_linear(*leaves)
    refs = [t.double().requires_grad_() for t in inputs]
    ref = reference(*refs)
    torch.testing.assert_close(out.double(), ref)
    grads = torch.autograd.grad(out.sum(), leaves)
    want = torch.autograd.grad(ref.sum(), refs)
    for t, gr, wr in zip(leaves, grads, want):
        assert gr.shape == t.shape
        torch.testing.assert_close(gr.double(), wr)


def test_bad_inputs():
    x, g, b, w, bias = make_inputs((4,), 8, 6, torch.float32)
    cases = [
        ((x.tolist(), g, b, w, bias), TypeError, "x must be a torch.Tensor"),
        ((x[0, 0], g, b, w, bias), ValueError, "x must have at least 1 dimension"),
        ((x.long(), g, b, w, bias), TypeError, "x must have dtype"),
        ((x, g, b, w.half(), bias), TypeError, "weight has dtype torch.float16 but x"),
        ((x, g, b, w[None], bias), ValueError, "weight must have 2 dimensions"),
        ((x, g, b, w[:, :7], bias), ValueError, "x has in_features=8 but weight has in_features=7"),
        ((x, g[:7], b, w, bias), ValueError, r"ln_weight must have shape \(in_features,\) = \(8"),
        ((x, g, b[None], w, bias), ValueError, "ln_bias must have 1 dimensions"),
        ((x, g, b, w, bias[:5]), ValueError, r"bias must have shape \(out_features,\) = \(6,\)"),
        ((x, g.int(), b, w, bias), TypeError, "ln_weight must have dtype"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            layer_norm_linear(*args)
    with pytest.raises(TypeError, match="eps must be a float"):
        layer_norm_linear(x, g, b, w, bias, eps="1e-5")
    with pytest.raises(ValueError, match="eps must be >= 0"):
        layer_norm_linear(x, g, b, w, bias, eps=-1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device next to the CPU")
def test_devices_must_match():
    x, g, b, w, bias = make_inputs((4,), 8, 6, torch.float32)
    x, g, b, w = (t.cuda() for t in (x, g, b, w))
    # Compiled kernels refuse CPU memory outright; the interpreter reads both, so says they differ.
    with pytest.raises(ValueError, match="^bias (is on cpu but x is on cuda|must be on a CUDA)"):
        layer_norm_linear(x, g, b, w, bias.cpu())


# ---------------------------------------------------------------------------------------------
# torch.compile.
# ---------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def fn(x, g, b, w, bias):
        return layer_norm_linear(x * 2.0, g, b, w, bias).square().sum()

    inputs = make_inputs((3, 7), 24, 10, torch.float32)
    leaves = [t.clone().requires_grad_() for t in inputs]
    loss = torch.compile(fn, fullgraph=True)(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    refs = [t.double().requires_grad_() for t in inputs]
    ref = reference(refs[0] * 2.0, *refs[1:]).square().sum()
    want = torch.autograd.grad(ref, refs)
    assert_close(loss.detach(), ref.detach(), 1e-4)
    for gr, wr in zip(grads, want):
        assert_close(gr, wr, 1e-4)
