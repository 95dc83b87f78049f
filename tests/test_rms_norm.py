"""rms_norm / add_rms_norm against F.rms_norm computed in float64 and against the rounding of
transformers' Llama and Gemma RMSNorm modules: values and gradients, every kernel path.

The forward streams rows past 4096 columns in chunks, the backward past 8192 (dx past 16384); the
``path`` fixture replaces the module's ``TUNING`` with lower thresholds so that short rows exercise
the chunked kernels in the interpreter in milliseconds.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop import runtime
from triton_workshop.nn.rms_norm import RMSNorm
from triton_workshop.ops import rms_norm as rms_norm_ops
from triton_workshop.ops.rms_norm import add_rms_norm, rms_norm
from triton_workshop.runtime import DEVICE, INTERPRET
from conftest import shorter_norm_paths, view_past_2_31

TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
gpu_only = pytest.mark.skipif(INTERPRET, reason="needs a CUDA device")


@pytest.fixture(params=["single_block", "dx_rows", "chunked"])
def path(request, monkeypatch):
    """Run the test on each kernel path (conftest.shorter_norm_paths)."""
    monkeypatch.setattr(rms_norm_ops, "TUNING", shorter_norm_paths(rms_norm_ops.TUNING, request.param))
    return request.param


def _randn(*shape, dtype=torch.float32, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift
    return t.to(DEVICE, dtype)


def _weight(shape, dtype=torch.float32, seed=3):
    return _randn(*shape, dtype=dtype, seed=seed, scale=0.5, shift=1.0).requires_grad_()


def _as_tuple(normalized_shape):
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


def _default_eps(dtype):
    """torch's eps=None: the epsilon of the arithmetic type (fp32 for fp16/bf16 rows)."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def _as64(t):
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


def _reference64(x64, shape, w64, eps, offset):
    return F.rms_norm(x64, shape, None if w64 is None else w64 + offset, eps)


def _grad_tolerance(*dtypes):
    """A gradient is as exact as the coarsest dtype it passed through; dweight sums over rows."""
    tol = max((TOLERANCES[d] for d in dtypes), key=lambda d: d["atol"])
    return dict(atol=tol["atol"] * 4, rtol=tol["rtol"] * 2)


def _check(x, normalized_shape, weight=None, eps=None, weight_offset=0.0, dy=None):
    """rms_norm and its gradients (for every input that requires one) against float64 torch."""
    y = rms_norm(x, normalized_shape, weight, eps, weight_offset=weight_offset)
    assert y.dtype == x.dtype and y.shape == x.shape
    shape = _as_tuple(normalized_shape)
    eps64 = _default_eps(x.dtype) if eps is None else eps
    x64, w64 = _as64(x), _as64(weight)
    ref = _reference64(x64, shape, w64, eps64, weight_offset)
    torch.testing.assert_close(y.double(), ref, **TOLERANCES[x.dtype])
    inputs = [t for t in (x, weight) if t is not None and t.requires_grad]
    if not inputs:
        return
    dy = _randn(*x.shape, dtype=x.dtype, seed=7) if dy is None else dy
    grads = torch.autograd.grad(y, inputs, dy)
    refs = torch.autograd.grad(ref, [t for t in (x64, w64) if t is not None and t.requires_grad],
                               dy.double())
    for t, g, r in zip(inputs, grads, refs):
        assert g.dtype == t.dtype and g.shape == t.shape
        torch.testing.assert_close(g.double(), r, **_grad_tolerance(x.dtype, t.dtype))


SHAPES = [((3, 1), 1), ((4, 7), 7), ((5, 100), 100), ((3, 1000), 1000), ((2, 3, 33), 33),
          ((2, 3, 5, 7), (5, 7))]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,normalized_shape", SHAPES, ids=str)
def test_values_and_grads(path, shape, normalized_shape, dtype):
    x = _randn(*shape, dtype=dtype, scale=2.0, shift=0.5).requires_grad_()
    _check(x, normalized_shape, _weight(_as_tuple(normalized_shape), dtype))


def test_row_longer_than_one_forward_block():
    """4097 columns: the default forward streams the row in chunks, the backward keeps it."""
    x = _randn(2, 4097, shift=1.0).requires_grad_()
    _check(x, 4097, _weight((4097,)))


@pytest.mark.parametrize("eps", [None, 1e-3], ids=["eps_none", "eps_1e-3"])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0], ids=["offset0", "offset1"])
@pytest.mark.parametrize("has_weight", [True, False], ids=["weight", "no_weight"])
def test_weight_offset_eps(path, has_weight, weight_offset, eps):
    # Small values: eps is not negligible against mean(x**2), so its value shows.
    x = _randn(6, 50, scale=0.05, seed=1).requires_grad_()
    w = _weight((50,), seed=4) if has_weight else None
    _check(x, 50, w, eps, weight_offset)


def test_eps_none_is_torchs_default():
    """eps=None is F.rms_norm's: fp32's epsilon for fp16/bf16/fp32 rows, fp64's for fp64."""
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = _randn(3, 40, scale=1e-3, dtype=dtype, seed=2)
        want = F.rms_norm(x.cpu(), (40,))
        torch.testing.assert_close(rms_norm(x, 40).cpu(), want, atol=0,
                                   rtol=2 * torch.finfo(dtype).eps)
        assert not torch.allclose(F.rms_norm(x.cpu(), (40,), eps=1e-2).double(), want.double())


@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
     (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16)],
    ids=str,
)
def test_weight_dtype_differs_from_input(path, x_dtype, w_dtype):
    """As F.rms_norm: computed in fp32, the output in x's dtype, dweight in the weight's."""
    x = _randn(8, 96, dtype=x_dtype).requires_grad_()
    w = _weight((96,), w_dtype)
    _check(x, 96, w)
    assert F.rms_norm(x.detach().cpu(), (96,), w.detach().cpu()).dtype == x_dtype


@pytest.mark.parametrize("need", ["x", "weight"])
def test_grads_only_where_needed(path, need):
    x = _randn(5, 40).requires_grad_(need == "x")
    w = _weight((40,)).requires_grad_(need == "weight")
    _check(x, 40, w)
    rms_norm(x, 40, w).sum().backward()
    assert (x.grad is not None) == (need == "x")
    assert (w.grad is not None) == (need == "weight")


def test_non_contiguous_input_and_grad(path):
    x = _randn(64, 12).t().requires_grad_()  # rows of 64 with stride 12
    x_sliced = _randn(12, 130)[:, ::2].requires_grad_()
    for t in (x, x_sliced):
        assert not t.is_contiguous()
        dy = _randn(t.shape[1], t.shape[0], seed=9).t()
        _check(t, t.shape[-1], _weight((t.shape[-1],)), dy=dy)


@pytest.mark.big_memory
def test_rows_past_2_31_elements_apart(path):
    """Rows 2**30 elements apart: the last starts past 2**31 from the first (a 64-bit row
    offset), for rms_norm and for both operands of add_rms_norm."""
    x = view_past_2_31(_randn(3, 40, dtype=torch.bfloat16).requires_grad_(), (2**30 + 9, 1))
    r = view_past_2_31(_randn(3, 40, dtype=torch.bfloat16, seed=2).requires_grad_(),
                       (2**30 + 11, 1))
    _check(x, 40, _weight((40,), torch.bfloat16))
    _check_add(x, r, 40, _weight((40,), torch.bfloat16))


def test_poisoned_outputs_are_fully_written(path, poisoned_new_empty):
    """Every output, gradient and partial-sum buffer starts as NaN: none survives."""
    x = _randn(37, 70, dtype=torch.float16).requires_grad_()
    r = _randn(37, 70, dtype=torch.float16, seed=5).requires_grad_()
    w = _weight((70,))
    y, total = add_rms_norm(x, r, 70, w)
    grads = torch.autograd.grad((y, total), (x, r, w), (_randn(37, 70, dtype=torch.float16),
                                                        _randn(37, 70, dtype=torch.float16)))
    for t in (y, total, *grads):
        assert torch.isfinite(t).all()


# --------------------------------------------------------------------------------------------
# add_rms_norm: the residual add fused in.
# --------------------------------------------------------------------------------------------
def _check_add(x, residual, normalized_shape, weight=None, eps=1e-6, weight_offset=0.0,
               outputs_used=("y", "sum")):
    """add_rms_norm against float64 torch (``x + residual`` rounded to x's dtype, as torch adds
    them, then normalised in float64); gradients through the outputs named in
    ``outputs_used``."""
    y, total = add_rms_norm(x, residual, normalized_shape, weight, eps,
                            weight_offset=weight_offset)
    assert y.dtype == total.dtype == x.dtype and y.shape == total.shape == x.shape
    total_want = (x.detach() + residual.detach()).double()
    exact = INTERPRET and x.dtype == torch.bfloat16  # the interpreter truncates fp32 -> bf16
    torch.testing.assert_close(total.double(), total_want, atol=0,
                               rtol=torch.finfo(x.dtype).eps if exact else 0)
    shape = _as_tuple(normalized_shape)
    x64, r64, w64 = _as64(x), _as64(residual), _as64(weight)
    # Normalised: the rounded sum (checked above), with the gradient of the exact one.
    total64 = x64 + r64
    total64 = total64 + (total.detach().double() - total64).detach()
    ref = _reference64(total64, shape, w64, eps, weight_offset)
    torch.testing.assert_close(y.double(), ref, **TOLERANCES[x.dtype])
    inputs = [t for t in (x, residual, weight) if t is not None and t.requires_grad]
    refs64 = [t for t in (x64, r64, w64) if t is not None and t.requires_grad]
    dy = _randn(*x.shape, dtype=x.dtype, seed=7)
    dsum = _randn(*x.shape, dtype=x.dtype, seed=8)
    ours = [o for name, o in (("y", y), ("sum", total)) if name in outputs_used]
    theirs = [o for name, o in (("y", ref), ("sum", total64)) if name in outputs_used]
    seeds = [g for name, g in (("y", dy), ("sum", dsum)) if name in outputs_used]
    grads = torch.autograd.grad(ours, inputs, seeds, allow_unused=True)
    ref_grads = torch.autograd.grad(theirs, refs64, [s.double() for s in seeds],
                                    allow_unused=True)
    for t, g, r in zip(inputs, grads, ref_grads):
        if r is None:  # the weight, with only the sum used
            assert g is None
            continue
        assert g.dtype == t.dtype and g.shape == t.shape
        torch.testing.assert_close(g.double(), r, **_grad_tolerance(x.dtype, t.dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,normalized_shape", [((5, 100), 100), ((2, 3, 33), 33),
                                                    ((3, 1), 1), ((2, 3, 5, 7), (5, 7))], ids=str)
def test_add_rms_norm_values_and_grads(path, shape, normalized_shape, dtype):
    x = _randn(*shape, dtype=dtype, seed=1).requires_grad_()
    r = _randn(*shape, dtype=dtype, seed=2, scale=3.0).requires_grad_()
    _check_add(x, r, normalized_shape, _weight(_as_tuple(normalized_shape), dtype))


@pytest.mark.parametrize("outputs_used", [("y",), ("sum",), ("y", "sum")], ids=str)
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_add_rms_norm_gradient_paths(path, outputs_used, weight_offset):
    """The gradient reaches x and residual through the normed output, the sum, or both."""
    x = _randn(6, 70, seed=3).requires_grad_()
    r = _randn(6, 70, seed=4).requires_grad_()
    _check_add(x, r, 70, _weight((70,)), weight_offset=weight_offset, outputs_used=outputs_used)


def test_add_rms_norm_grads_only_where_needed():
    x = _randn(4, 30, seed=5).requires_grad_()
    r = _randn(4, 30, seed=6)
    w = _weight((30,)).requires_grad_(False)
    _check_add(x, r, 30, w)
    y, total = add_rms_norm(x, r, 30, w)
    (y.sum() + total.sum()).backward()
    assert x.grad is not None and r.grad is None and w.grad is None


def test_add_rms_norm_non_contiguous(path):
    x = _randn(40, 9, seed=1).t().requires_grad_()
    r = _randn(9, 80, seed=2)[:, ::2].requires_grad_()
    _check_add(x, r, 40, _weight((40,)), eps=1e-5)


# --------------------------------------------------------------------------------------------
# Casting modes: the rounding of transformers' LlamaRMSNorm and GemmaRMSNorm.
# --------------------------------------------------------------------------------------------
def _llama_formula(x, weight, eps, offset=0.0):
    """transformers' LlamaRMSNorm.forward, with Gemma's offset applied as torch would add it."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    h = h.to(input_dtype)
    return h if weight is None else (offset + weight) * h


def _gemma_formula(x, weight, eps, offset=1.0):
    """transformers' GemmaRMSNorm.forward."""
    out = x.float()
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        out = out * (offset + weight.float())
    return out.type_as(x)


def _ulps(dtype, n=2):
    """``n`` units in the last place of ``dtype`` as a relative tolerance (one rounding of ours
    and torch's may fall either side; the interpreter truncates bf16 where a GPU rounds)."""
    return dict(rtol=n * torch.finfo(dtype).eps, atol=n * torch.finfo(dtype).tiny)


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
     (torch.float16, torch.float16), (torch.float32, torch.float32),
     (torch.float16, torch.bfloat16)],
    ids=str,
)
@pytest.mark.parametrize("mode", ["llama", "gemma"])
def test_casting_modes_match_transformers_formulas(path, mode, x_dtype, w_dtype, offset):
    x = _randn(6, 72, dtype=x_dtype, seed=11, scale=1.5).requires_grad_()
    w = _randn(72, dtype=w_dtype, seed=12, scale=0.3, shift=1.0 - offset).requires_grad_()
    formula = _llama_formula if mode == "llama" else _gemma_formula
    want = formula(x.detach().cpu(), w.detach().cpu(), 1e-6, offset)
    y = rms_norm(x, 72, w, 1e-6, weight_offset=offset, casting_mode=mode)
    assert y.dtype == want.dtype  # llama: x's and the weight's promotion; gemma: x's
    # Each rounding may land one ulp apart (our rstd and torch's need not agree to the bit),
    # an ulp of the coarsest dtype rounded to.
    coarsest = max(x_dtype, w_dtype, key=lambda d: torch.finfo(d).eps)
    torch.testing.assert_close(y.cpu().double(), want.double(), **_ulps(coarsest, 4))
    # The gradients of the unrounded function: roundings of x's dtype apart.
    dy = _randn(6, 72, dtype=y.dtype, seed=13)
    grads = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = _as64(x), _as64(w)
    ref_grads = torch.autograd.grad(_reference64(x64, (72,), w64, 1e-6, offset), (x64, w64),
                                    dy.double())
    for t, g, r in zip((x, w), grads, ref_grads):
        assert g.dtype == t.dtype
        torch.testing.assert_close(g.double(), r, **_grad_tolerance(x_dtype, w_dtype))


@pytest.mark.parametrize("mode", ["llama", "gemma"])
def test_casting_modes_without_weight(mode):
    x = _randn(4, 33, dtype=torch.float16, seed=14)
    formula = _llama_formula if mode == "llama" else _gemma_formula
    y = rms_norm(x, 33, None, 1e-6, casting_mode=mode)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.cpu(), formula(x.cpu(), None, 1e-6), **_ulps(torch.float16))


def test_add_rms_norm_llama_casting():
    x = _randn(5, 48, dtype=torch.bfloat16, seed=15)
    r = _randn(5, 48, dtype=torch.bfloat16, seed=16)
    w = _randn(48, seed=17, scale=0.2, shift=1.0)
    y, total = add_rms_norm(x, r, 48, w, 1e-6, casting_mode="llama")
    want = _llama_formula((x + r).cpu(), w.cpu(), 1e-6)
    assert y.dtype == torch.float32
    # The sum and x * rstd rounded to bf16 (the interpreter truncates where a GPU rounds).
    torch.testing.assert_close(y.cpu().double(), want.double(), **_ulps(torch.bfloat16, 4))


@pytest.mark.slow  # importing transformers' model classes takes ~10 s on the CPU
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_matches_transformers_modules(dtype):
    """The modules themselves, in a bf16/fp16 model with fp32 weights and with weights of the
    model's dtype: the casting modes reproduce their output dtypes and values."""
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = _randn(3, 5, 64, dtype=dtype, seed=18, scale=2.0)
    for w_dtype in (torch.float32, dtype):
        llama = LlamaRMSNorm(64, eps=1e-6).to(DEVICE, w_dtype)
        gemma = GemmaRMSNorm(64, eps=1e-6).to(DEVICE, w_dtype)
        with torch.no_grad():
            llama.weight.copy_(_randn(64, seed=19, scale=0.2, shift=1.0))
            gemma.weight.copy_(_randn(64, seed=20, scale=0.2))
        for module, mode, offset in ((llama, "llama", 0.0), (gemma, "gemma", 1.0)):
            want = module(x)
            got = rms_norm(x, 64, module.weight, 1e-6, weight_offset=offset, casting_mode=mode)
            assert got.dtype == want.dtype, (mode, w_dtype)
            torch.testing.assert_close(got.double(), want.double(), **_ulps(dtype, 4))


def test_llama_casting_is_bitwise_on_fp16():
    """fp16: both roundings are to nearest on the CPU too, and the products exact in fp32, so
    ours and the formula's agree to the bit wherever our rstd and torch's do."""
    x = _randn(16, 64, dtype=torch.float16, seed=21)
    w = _randn(64, dtype=torch.float16, seed=22, scale=0.2, shift=1.0)
    y = rms_norm(x, 64, w, 1e-6, casting_mode="llama")
    want = _llama_formula(x.cpu(), w.cpu(), 1e-6)
    mismatched = (y.cpu() != want).float().mean().item()
    assert mismatched < 0.02, mismatched


# --------------------------------------------------------------------------------------------
# Determinism, float64, empty tensors, torch.compile, autocast.
# --------------------------------------------------------------------------------------------
def test_backward_is_deterministic(path):
    # Enough rows that several programs each contribute a partial dweight.
    x = _randn(64, 300, dtype=torch.float16).requires_grad_()
    r = _randn(64, 300, dtype=torch.float16, seed=1).requires_grad_()
    w = _weight((300,))
    dy = _randn(64, 300, dtype=torch.float16, seed=5)
    runs = [torch.autograd.grad(add_rms_norm(x, r, 300, w)[0], (x, r, w), dy) for _ in range(2)]
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def test_gradcheck_float64(path):
    # fp64 inputs compute in fp64 inside the kernels, so finite differences are meaningful.
    x = _randn(2, 5, dtype=torch.float64).requires_grad_()
    r = _randn(2, 5, dtype=torch.float64, seed=1).requires_grad_()
    w = _randn(5, dtype=torch.float64, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, r, w: add_rms_norm(x, r, 5, w, 1e-5, weight_offset=1.0), (x, r, w),
        fast_mode=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, 5, w, 1e-5), (x, w), fast_mode=True)
    assert torch.autograd.gradcheck(lambda x: rms_norm(x, 5), (x,), fast_mode=True)


@pytest.mark.parametrize(
    "shape,normalized_shape", [((0, 8), 8), ((4, 0), 0), ((2, 0, 3), (0, 3))], ids=str
)
def test_empty(shape, normalized_shape):
    norm = _as_tuple(normalized_shape)
    x = torch.empty(shape, device=DEVICE, requires_grad=True)
    r = torch.empty(shape, device=DEVICE, requires_grad=True)
    w = torch.ones(norm, device=DEVICE, requires_grad=True)
    y = rms_norm(x, normalized_shape, w)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros_like(w))
    y, total = add_rms_norm(x, r, normalized_shape, w)
    assert y.shape == total.shape == x.shape
    (y.sum() + total.sum()).backward()
    assert r.grad.shape == x.shape


def test_torch_compile_matches_eager():
    def f(x, r, w):
        y = rms_norm(x * 2.0, (x.shape[-1],), w, 1e-5, weight_offset=1.0)
        y2, total = add_rms_norm(y, r, x.shape[-1], w, casting_mode="llama")
        return (y2.square() + total).sum(-1)

    x = _randn(6, 40).requires_grad_()
    r = _randn(6, 40, seed=1).requires_grad_()
    w = _weight((40,))
    compiled = torch.compile(f, fullgraph=True)
    out_c = compiled(x, r, w)
    grads_c = torch.autograd.grad(out_c.sum(), (x, r, w))
    out_e = f(x, r, w)
    grads_e = torch.autograd.grad(out_e.sum(), (x, r, w))
    torch.testing.assert_close(out_c, out_e)
    for gc, ge in zip(grads_c, grads_e):
        torch.testing.assert_close(gc, ge)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_leaves_dtypes_as_torch_does(dtype):
    """Under autocast of this device type the output dtypes are F.rms_norm's (on a GPU: CUDA's
    fp32 list, fp32 results; on the CPU: on no list, dtypes as without autocast)."""
    x = _randn(4, 24, seed=23)
    xl = x.to(dtype)
    w = _randn(24, seed=24)
    with torch.autocast(DEVICE.type, dtype=dtype):
        for inp in (x, xl):
            want = F.rms_norm(inp, (24,), w)
            got = rms_norm(inp, 24, w)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got.double(), want.double(), **TOLERANCES[want.dtype])
        y, total = add_rms_norm(xl, xl, 24, w)
        assert y.dtype == F.rms_norm(xl + xl, (24,), w).dtype and total.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_fp32_rule(monkeypatch, dtype):
    """The CUDA rule, tried on this device type: fp32 arithmetic and an fp32 output from
    low-precision inputs as they are (what torch's cast-then-compute gives), gradients in the
    inputs' dtypes; add_rms_norm's sum stays in x's dtype; llama/gemma casting is untouched."""
    monkeypatch.setattr(rms_norm_ops, "AUTOCAST", runtime.AutocastPolicy({DEVICE.type: "fp32"}))
    x = _randn(5, 40, dtype=dtype, seed=25).requires_grad_()
    w = _randn(40, dtype=dtype, seed=26, shift=1.0).requires_grad_()
    with torch.autocast(DEVICE.type, dtype=dtype):
        y = rms_norm(x, 40, w)
        y2, total = add_rms_norm(x, x, 40, w)
        llama = rms_norm(x, 40, w, casting_mode="llama")
    assert y.dtype == y2.dtype == torch.float32 and total.dtype == dtype
    assert llama.dtype == dtype
    want = F.rms_norm(x.detach().float(), (40,), w.detach().float())
    torch.testing.assert_close(y, want, **TOLERANCES[torch.float32])
    gx, gw = torch.autograd.grad(y, (x, w), _randn(5, 40, seed=27))
    assert gx.dtype == gw.dtype == dtype


# --------------------------------------------------------------------------------------------
# The module.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", [{}, {"elementwise_affine": False}, {"eps": 1e-3}], ids=str
)
def test_module_is_a_drop_in_for_torch_rms_norm(kwargs):
    ref = torch.nn.RMSNorm((4, 6), device=DEVICE, **kwargs)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(_randn(*p.shape, seed=11))
    ours = RMSNorm((4, 6), device=DEVICE, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert repr(ours) == repr(ref)
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())  # and back: the same keys and shapes
    x = _randn(3, 4, 6, shift=2.0)
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_ref = ours(x_ours), ref(x_ref)
    torch.testing.assert_close(y_ours, y_ref, **TOLERANCES[torch.float32])
    dy = _randn(3, 4, 6, seed=12)
    y_ours.backward(dy)
    y_ref.backward(dy)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, **TOLERANCES[torch.float32])
    for p_ours, p_ref in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p_ours.grad, p_ref.grad, **TOLERANCES[torch.float32])


def test_module_defaults_and_extras():
    m = RMSNorm(8, dtype=torch.float16)
    t = torch.nn.RMSNorm(8, dtype=torch.float16)
    assert m.normalized_shape == t.normalized_shape == (8,) and m.eps is None
    assert m.weight.dtype == torch.float16 and torch.equal(m.weight, t.weight)
    with torch.no_grad():
        m.weight.zero_()
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(8, dtype=torch.float16))
    gemma = RMSNorm(8, eps=1e-6, weight_offset=1.0, casting_mode="gemma", device=DEVICE)
    assert torch.equal(gemma.weight, torch.zeros(8, device=DEVICE))  # 1 + weight = 1
    assert "weight_offset=1.0" in repr(gemma) and "casting_mode='gemma'" in repr(gemma)
    x = _randn(2, 8, seed=13)
    torch.testing.assert_close(gemma(x), F.rms_norm(x, (8,), eps=1e-6))


# --------------------------------------------------------------------------------------------
# The backward's row groups: a persistent grid of a few programs an SM, each looping over its
# fixed group of consecutive rows and writing one row of partial dweight sums, then a fixed-order
# sum over the partials. Here with one row a step (so a program loops, as on a GPU where it owns
# about n_rows / n_SMs rows) and a chosen number of SMs, so that the row count falls on either
# side of the program count.
# --------------------------------------------------------------------------------------------
@pytest.fixture(params=[(3, False), (4, True)], ids=["3sms", "4sms_wide"])
def row_groups(request, monkeypatch):
    """``n_sms`` SMs, one row a backward step; "wide" makes every tile one program an SM (the
    rows of 4097-8192 columns on a GPU), otherwise ``backward_programs_per_sm`` an SM."""
    n_sms, wide = request.param
    monkeypatch.setattr(runtime, "num_sms", lambda device=None: n_sms)
    tuning = rms_norm_ops.TUNING
    monkeypatch.setattr(rms_norm_ops, "TUNING", dataclasses.replace(
        tuning, max_rows_per_program=1,
        backward_wide_tile_elems=1 if wide else tuning.backward_wide_tile_elems))
    return n_sms * (1 if wide else tuning.backward_programs_per_sm)


@pytest.mark.parametrize("n_cols", [1, 7, 129, 1000])
@pytest.mark.parametrize("n_rows", [1, 5, 13], ids=lambda n: f"rows{n}")
def test_backward_rows_against_programs(path, row_groups, n_rows, n_cols):
    """One row (one program), fewer rows than programs, and 13 rows in groups that do not
    divide it (the last group a single row): dx and dweight against float64 on fresh random
    data."""
    x = _randn(n_rows, n_cols, seed=n_rows + n_cols, scale=1.5, shift=0.2).requires_grad_()
    w = _weight((n_cols,), seed=n_cols)
    _check(x, n_cols, w, eps=1e-6, dy=_randn(n_rows, n_cols, seed=n_rows * n_cols + 1))


def test_backward_partition_launches(path, row_groups, planned_launches):
    """13 rows on the fused and column-tiled kernels: no more programs than the SMs allow (every
    partial row they write is summed: test_backward_plan_covers_every_row_once)."""
    x = _randn(13, 129).requires_grad_()
    _check(x, 129, _weight((129,)))
    grids = {name: grid for name, grid in planned_launches}
    partial_rows = [grid[0] for name, grid in planned_launches
                    if name in ("rms_norm_bwd_kernel", "rms_norm_bwd_dw_chunked_kernel")]
    assert partial_rows and max(partial_rows) <= row_groups
    assert "layer_norm_bwd_sum_partials_kernel" in grids


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_kind", ["no_weight", "offset0", "offset1"])
def test_backward_dtypes_and_weights(row_groups, dtype, weight_kind):
    """fp32/fp16/bf16 rows over several row groups, without a weight, with one, and with
    Gemma's 1 + weight: gradients within the dtype's tolerance of float64."""
    x = _randn(13, 129, dtype=dtype, seed=11, scale=2.0).requires_grad_()
    w = None if weight_kind == "no_weight" else _weight((129,), dtype, seed=12)
    _check(x, 129, w, weight_offset=1.0 if weight_kind == "offset1" else 0.0,
           dy=_randn(13, 129, dtype=dtype, seed=13))


@pytest.mark.parametrize("outputs_used", [("y",), ("y", "sum")], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_rms_norm_backward_row_groups(row_groups, dtype, outputs_used):
    """add_rms_norm shares the kernel: its dx takes the sum's gradient where there is one."""
    x = _randn(13, 129, dtype=dtype, seed=21).requires_grad_()
    r = _randn(13, 129, dtype=dtype, seed=22, scale=2.0).requires_grad_()
    _check_add(x, r, 129, _weight((129,), dtype, seed=23), weight_offset=1.0,
               outputs_used=outputs_used)


def test_backward_many_rows_a_program(row_groups):
    """48 rows a program: dweight summed over a long loop stays within fp32's tolerance."""
    n_rows = 48 * row_groups - 5  # the last group 5 rows short
    x = _randn(n_rows, 7, seed=31).requires_grad_()
    _check(x, 7, _weight((7,), seed=32), dy=_randn(n_rows, 7, seed=33))


def test_backward_row_groups_are_deterministic(path, row_groups):
    x = _randn(13, 129, dtype=torch.bfloat16, seed=41).requires_grad_()
    w = _weight((129,), torch.bfloat16, seed=42)
    dy = _randn(13, 129, dtype=torch.bfloat16, seed=43)
    first, second = (torch.autograd.grad(rms_norm(x, 129, w), (x, w), dy) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("n_sms", [1, 4, 132])
@pytest.mark.parametrize("n_cols", [1, 7, 129, 1000, 4097, 8192, 16384, 16385])
def test_backward_plan_covers_every_row_once(n_sms, n_cols):
    """Host only: for any row count, the groups of every launch that writes partial sums cover
    the rows exactly (none empty, so every partial row is written), there are at most a few an
    SM, and the sum reads as many partial rows as were written."""
    tuning = rms_norm_ops.TUNING
    dtypes = (torch.float16,) * 4 + (torch.float32,)
    for n_rows in [*range(1, 40), 127, 128, 129, 263, 264, 265, 1000, 8191, 8192, 100003]:
        plan = rms_norm_ops._backward_plan(n_rows, n_cols, 0.0, dtypes, True, False, False,
                                           (True, True), n_sms, tuning)
        for name, launch in plan.launches.items():
            if name in ("fused", "dw"):
                groups, rows_per_group = launch.grid[0], launch.scalars[2]
                assert launch.scalars[0] == n_rows and groups == plan.n_partials
                assert (groups - 1) * rows_per_group < n_rows <= groups * rows_per_group
                assert groups <= n_sms * tuning.backward_programs_per_sm
        assert plan.launches["sum"].scalars == (plan.n_partials, n_cols)


# --------------------------------------------------------------------------------------------
# Plans and bad input.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fused_max_cols, n_cols, kernels", [
    (None, 8192, ["fused", "sum"]),
    (None, 16384, ["fused", "sum"]),  # one read of x and dy for dx and the sums (layer norm: not)
    (None, 16385, ["dx", "dw", "sum"]),
    (8192, 16384, ["dx_rows", "dw", "sum"]),  # dx alone fits a block; the sums are column-tiled
])
def test_backward_plan_by_row_length(fused_max_cols, n_cols, kernels):
    tuning = rms_norm_ops.TUNING
    if fused_max_cols is not None:
        tuning = dataclasses.replace(tuning, backward_single_block_max_cols=fused_max_cols)
    dtypes = (torch.float16,) * 4 + (torch.float32,)
    plan = rms_norm_ops._backward_plan(4096, n_cols, 0.0, dtypes, True, True, False,
                                       (True, True), 132, tuning)
    assert list(plan.launches) == kernels
    without_dw = rms_norm_ops._backward_plan(4096, n_cols, 0.0, dtypes, True, True, False,
                                             (True, False), 132, tuning)
    assert list(without_dw.launches) == [k for k in kernels if k not in ("dw", "sum")]
    if "fused" in kernels:  # past 8192 columns the weight row is not held through the loop
        reload = plan.launches["fused"].consts["RELOAD_WEIGHT"]
        assert reload == (n_cols > tuning.backward_weight_held_max_cols)


def test_every_launch_goes_through_a_plan(monkeypatch, planned_launches):
    x = _randn(4, 300, shift=2.0).requires_grad_()
    w = _weight((300,))
    with monkeypatch.context() as m:
        m.setattr(rms_norm_ops, "TUNING", dataclasses.replace(
            rms_norm_ops.TUNING, single_block_max_cols=256, forward_chunk_cols=64,
            backward_single_block_max_cols=256, backward_dx_single_block_max_cols=256,
            chunk_cols=64))
        _check(x, 300, w)
    assert [name for name, _ in planned_launches] == [
        "rms_norm_fwd_chunked_kernel", "rms_norm_bwd_dx_chunked_kernel",
        "rms_norm_bwd_dw_chunked_kernel", "layer_norm_bwd_sum_partials_kernel"]
    planned_launches.clear()
    _check(x, 300, w)
    assert [name for name, _ in planned_launches] == [
        "rms_norm_fwd_kernel", "rms_norm_bwd_kernel", "layer_norm_bwd_sum_partials_kernel"]


def test_eager_backward_takes_the_plan_made_in_the_forward(monkeypatch):
    """An eager backward launches what its forward kept, for a contiguous gradient and for one
    laid out otherwise (copied first: a strided one, a ``sum()``'s expanded one); the op only
    while a graph is built for a double backward."""
    calls = []
    op_backward = rms_norm_ops._op_backward
    monkeypatch.setattr(rms_norm_ops, "_op_backward",
                        lambda *args: calls.append(1) or op_backward(*args))
    x = _randn(6, 40).requires_grad_()
    for _ in range(2):  # the general path's Function, then the kept signature's
        _check(x, 40, _weight((40,)))
        _check(x, 40, _weight((40,)), dy=_randn(40, 6, seed=2).t())  # a strided gradient
        _check_add(x, _randn(6, 40, seed=3).requires_grad_(), 40, _weight((40,)))
        w = _weight((40,))
        x.grad = None
        rms_norm(x, 40, w).sum().backward()  # an expanded gradient
        want = torch.autograd.grad(F.rms_norm(x, (40,), w).sum(), (x, w))
        torch.testing.assert_close((x.grad, w.grad), want, **_grad_tolerance(x.dtype))
    assert calls == []
    w = _weight((40,))
    dy = _randn(6, 40, seed=4)
    grads = torch.autograd.grad(rms_norm(x, 40, w), (x, w), dy, create_graph=True)
    assert calls == [1]
    torch.testing.assert_close(grads, torch.autograd.grad(rms_norm(x, 40, w), (x, w), dy))


@pytest.mark.parametrize("dtype,has_weight,weight_offset",
                         [(torch.bfloat16, True, 0.0), (torch.bfloat16, True, 1.0),
                          (torch.float32, False, 0.0)], ids=str)
def test_repeated_eager_calls_of_a_kept_signature(path, dtype, has_weight, weight_offset,
                                                  monkeypatch):
    """The same signature called again and again with fresh data (the kept path after the
    first call, with and without autograd): values and gradients as float64 torch's each time,
    for rms_norm and add_rms_norm (the gradient of the normed output alone, and of both)."""
    checks = []
    checked = rms_norm_ops._checked
    monkeypatch.setattr(rms_norm_ops, "_checked", lambda *a: checks.append(1) or checked(*a))
    shape, n = (3, 5, 48), 48
    w = _weight((n,), dtype) if has_weight else None
    w64 = _as64(w)
    tol, grad_tol = TOLERANCES[dtype], _grad_tolerance(dtype)
    # The sum as torch rounds it (the interpreter truncates fp32 -> bf16: one ulp).
    sum_tol = dict(atol=0, rtol=torch.finfo(dtype).eps if INTERPRET and dtype == torch.bfloat16
                   else 0)
    for step in range(3):
        if step == 1:  # each signature checked once, then kept
            first_checks = len(checks)
            assert first_checks
        x = _randn(*shape, dtype=dtype, seed=10 + step).requires_grad_()
        r = _randn(*shape, dtype=dtype, seed=20 + step, scale=2.0).requires_grad_()
        dy = _randn(*shape, dtype=dtype, seed=30 + step)
        dsum = _randn(*shape, dtype=dtype, seed=40 + step)
        x64, r64 = _as64(x), _as64(r)
        ref = _reference64(x64, (n,), w64, 1e-6, weight_offset)
        with torch.no_grad():
            torch.testing.assert_close(
                rms_norm(x, n, w, 1e-6, weight_offset=weight_offset).double(), ref, **tol)
        y = rms_norm(x, n, w, 1e-6, weight_offset=weight_offset)
        torch.testing.assert_close(y.double(), ref, **tol)
        inputs, inputs64 = [x] + [w] * has_weight, [x64] + [w64] * has_weight
        for g, want in zip(torch.autograd.grad(y, inputs, dy),
                           torch.autograd.grad(ref, inputs64, dy.double())):
            torch.testing.assert_close(g.double(), want, **grad_tol)
        # add_rms_norm: the sum rounded to x's dtype, normalised with the exact sum's gradient.
        total64 = x64 + r64
        total64 = total64 + ((x.detach() + r.detach()).double() - total64).detach()
        ref = _reference64(total64, (n,), w64, 1e-6, weight_offset)
        with torch.no_grad():
            y, total = add_rms_norm(x, r, n, w, 1e-6, weight_offset=weight_offset)
        torch.testing.assert_close(y.double(), ref, **tol)
        torch.testing.assert_close(total.double(), total64, **sum_tol)
        inputs, inputs64 = [x, r] + [w] * has_weight, [x64, r64] + [w64] * has_weight
        for outputs_used in (("y",), ("y", "sum")):
            y, total = add_rms_norm(x, r, n, w, 1e-6, weight_offset=weight_offset)
            torch.testing.assert_close(y.double(), ref, **tol)
            torch.testing.assert_close(total.double(), total64, **sum_tol)
            ours = [y, total][:len(outputs_used)]
            theirs = [ref, total64][:len(outputs_used)]
            seeds = [dy, dsum][:len(outputs_used)]
            for g, want in zip(torch.autograd.grad(ours, inputs, seeds),
                               torch.autograd.grad(theirs, inputs64, [t.double() for t in seeds],
                                                   retain_graph=True)):
                torch.testing.assert_close(g.double(), want, **grad_tol)
    assert len(checks) == first_checks


def _x():
    return torch.ones(2, 3, 4, device=DEVICE)


@pytest.mark.parametrize(
    "make_args,kwargs,error,match",
    [
        (lambda: ([1.0, 2.0], 2), {}, TypeError, "x must be a torch.Tensor"),
        (lambda: (torch.ones(2, 4, dtype=torch.int64, device=DEVICE), 4), {}, TypeError,
         "x must have"),
        (lambda: (_x().to_sparse(), 4), {}, TypeError, "x must be a dense"),
        (lambda: (_x(), 3), {}, ValueError, "normalized_shape"),
        (lambda: (_x(), (2, 4)), {}, ValueError, "normalized_shape"),
        (lambda: (_x(), ()), {}, ValueError, "normalized_shape"),
        (lambda: (_x(), 4.0), {}, TypeError, "normalized_shape"),
        (lambda: (_x(), 4, torch.ones(3, device=DEVICE)), {}, ValueError, "weight"),
        (lambda: (_x(), 4, "w"), {}, TypeError, "weight"),
        (lambda: (_x(), 4, torch.ones(4, dtype=torch.int32, device=DEVICE)), {}, TypeError,
         "weight"),
        (lambda: (_x(), 4, None, -1.0), {}, ValueError, "eps"),
        (lambda: (_x(), 4, None, "1e-5"), {}, TypeError, "eps"),
        (lambda: (_x(), 4), {"weight_offset": "1"}, TypeError, "weight_offset"),
        (lambda: (_x(), 4), {"weight_offset": float("nan")}, ValueError, "weight_offset"),
        (lambda: (_x(), 4), {"casting_mode": "llama2"}, ValueError, "casting_mode"),
        (lambda: (_x(), 4), {"casting_mode": 1}, TypeError, "casting_mode"),
    ],
    ids=[
        "x_not_tensor", "x_int", "x_sparse", "shape_mismatch", "shape_mismatch_2d",
        "shape_empty", "shape_float", "weight_shape", "weight_not_tensor", "weight_int",
        "eps_negative", "eps_str", "offset_str", "offset_nan", "casting_unknown", "casting_int",
    ],
)
def test_bad_inputs(monkeypatch, make_args, kwargs, error, match):
    monkeypatch.setattr(runtime.registry, "launch_kernel", _no_launch)
    with pytest.raises(error, match=match):
        rms_norm(*make_args(), **kwargs)


def _no_launch(*args, **kwargs):
    raise AssertionError("a kernel was launched before the arguments were checked")


@pytest.mark.parametrize(
    "make_args,error,match",
    [
        (lambda: (_x(), "r", 4), TypeError, "residual must be a torch.Tensor"),
        (lambda: (_x(), torch.ones(2, 3, 1, device=DEVICE), 4), ValueError, "residual"),
        (lambda: (_x(), _x().half(), 4), TypeError, "residual"),
        (lambda: (_x(), _x(), 3), ValueError, "normalized_shape"),
        (lambda: (_x(), _x(), 4, torch.ones(5, device=DEVICE)), ValueError, "weight"),
    ],
    ids=["residual_not_tensor", "residual_shape", "residual_dtype", "shape", "weight_shape"],
)
def test_add_rms_norm_bad_inputs(monkeypatch, make_args, error, match):
    monkeypatch.setattr(runtime.registry, "launch_kernel", _no_launch)
    with pytest.raises(error, match=match):
        add_rms_norm(*make_args())


def test_nested_input_is_refused():
    nested = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)]).to(DEVICE)
    with pytest.raises((TypeError, ValueError), match="x"):
        rms_norm(nested, 4)


@gpu_only
def test_mismatched_devices():
    with pytest.raises(ValueError, match="weight"):
        rms_norm(_x(), 4, torch.ones(4))  # weight on the CPU, x on the GPU
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(_x(), torch.ones(2, 3, 4), 4)


# --------------------------------------------------------------------------------------------
# GPU: the default long-row paths at their sizes, and offsets past 2**31.
# --------------------------------------------------------------------------------------------
@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("n_cols", [4096, 8192, 10000, 16384, 16385, 65536])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_long_rows_on_the_gpu(n_cols, dtype):
    x = _randn(300, n_cols, dtype=dtype, shift=0.3).requires_grad_()
    r = _randn(300, n_cols, dtype=dtype, seed=1).requires_grad_()
    _check(x, n_cols, _weight((n_cols,), dtype))
    _check_add(x, r, n_cols, _weight((n_cols,), dtype))


@pytest.mark.big_memory
@gpu_only
@pytest.mark.gpu
def test_offsets_past_2_31_elements():
    # 2**31 + 4096 fp16 elements (4 GiB): row index * n_cols overflows int32 in the last rows.
    n_cols = 1024
    n_rows = 2**31 // n_cols + 4
    x = torch.zeros(n_rows, n_cols, device="cuda", dtype=torch.float16)
    x[-8:].normal_()
    w = torch.randn(n_cols, device="cuda", dtype=torch.float16, requires_grad=True)
    x.requires_grad_()
    y = rms_norm(x, n_cols, w, 1e-6)
    torch.testing.assert_close(
        y[-8:].float(), F.rms_norm(x[-8:].float(), (n_cols,), w.float(), 1e-6),
        **TOLERANCES[torch.float16])
    dy = torch.zeros_like(y)
    dy[-8:] = 1.0
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    x8 = x[-8:].detach().float().requires_grad_()
    w8 = w.detach().float().requires_grad_()
    rx, rw = torch.autograd.grad(F.rms_norm(x8, (n_cols,), w8, 1e-6), (x8, w8), dy[-8:].float())
    torch.testing.assert_close(gx[-8:].float(), rx, **TOLERANCES[torch.float16])
    torch.testing.assert_close(gw.float(), rw, atol=5e-2, rtol=1e-2)
