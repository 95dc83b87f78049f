"""layer_norm against F.layer_norm computed in float64: values and gradients, every kernel path.

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
from triton_workshop import nn as tw_nn
from triton_workshop.ops import layer_norm as layer_norm_ops
from triton_workshop.ops.layer_norm import layer_norm
from triton_workshop.runtime import DEVICE, INTERPRET
from conftest import shorter_norm_paths

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
    monkeypatch.setattr(layer_norm_ops, "TUNING", shorter_norm_paths(layer_norm_ops.TUNING, request.param))
    return request.param


def _randn(*shape, dtype=torch.float32, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift
    return t.to(DEVICE, dtype)


def _check(x, normalized_shape, weight=None, bias=None, eps=1e-5, dy=None):
    """Compare layer_norm and its gradients (for every input that requires one) with float64
    PyTorch."""
    inputs = [t for t in (x, weight, bias) if t is not None and t.requires_grad]
    y = layer_norm(x, normalized_shape, weight, bias, eps)
    assert y.dtype == x.dtype and y.shape == x.shape

    def as64(t):
        return None if t is None else t.detach().double().requires_grad_(t.requires_grad)

    x64, w64, b64 = as64(x), as64(weight), as64(bias)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    ref = F.layer_norm(x64, shape, w64, b64, eps)
    tol = TOLERANCES[x.dtype]
    torch.testing.assert_close(y.double(), ref, **tol)
    if not inputs:
        return
    if dy is None:
        dy = _randn(*x.shape, dtype=x.dtype, seed=7)
    grads = torch.autograd.grad(y, inputs, dy)
    refs64 = [t for t in (x64, w64, b64) if t is not None and t.requires_grad]
    ref_grads = torch.autograd.grad(ref, refs64, dy.double())
    for t, g, r in zip(inputs, grads, ref_grads):
        assert g.dtype == t.dtype and g.shape == t.shape
        # A gradient is as exact as the coarser of x's dtype and its own (a bf16 weight's
        # gradient is rounded to bf16); dweight/dbias sum over rows, so allow a little more.
        g_tol = max(tol, TOLERANCES[t.dtype], key=lambda d: d["atol"])
        torch.testing.assert_close(g.double(), r, atol=g_tol["atol"] * 4, rtol=g_tol["rtol"] * 2)


def _params(shape, dtype, weight=True, bias=True):
    w = _randn(*shape, dtype=dtype, seed=3, scale=0.5, shift=1.0) if weight else None
    b = _randn(*shape, dtype=dtype, seed=4) if bias else None
    return tuple(t.requires_grad_() if t is not None else None for t in (w, b))


SHAPES = [((4, 3), 3), ((7, 127), 127), ((5, 1000), 1000), ((2, 3, 5, 7), (5, 7)), ((6, 1), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,normalized_shape", SHAPES, ids=str)
def test_values_and_grads(path, shape, normalized_shape, dtype):
    norm = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    x = _randn(*shape, dtype=dtype, scale=2.0, shift=0.5).requires_grad_()
    _check(x, normalized_shape, *_params(norm, dtype))


@pytest.mark.parametrize("weight,bias", [(True, False), (False, True), (False, False)])
def test_optional_affine(path, weight, bias):
    x = _randn(9, 100, shift=3.0).requires_grad_()
    _check(x, 100, *_params((100,), torch.float32, weight, bias))


@pytest.mark.parametrize(
    "x_dtype,param_dtype",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.bfloat16),
    ],
    ids=str,
)
def test_parameter_dtype_differs_from_input(path, x_dtype, param_dtype):
    x = _randn(8, 96, dtype=x_dtype).requires_grad_()
    _check(x, 96, *_params((96,), param_dtype))


@pytest.mark.parametrize("need", ["x", "weight", "bias", "weight_bias"])
def test_grads_only_where_needed(path, need):
    x = _randn(5, 40).requires_grad_("x" in need)
    w, b = _params((40,), torch.float32)
    w.requires_grad_("weight" in need)
    b.requires_grad_("bias" in need)
    _check(x, 40, w, b)
    y = layer_norm(x, 40, w, b)
    y.sum().backward()
    assert (x.grad is not None) == ("x" in need)
    assert (w.grad is not None) == ("weight" in need)
    assert (b.grad is not None) == ("bias" in need)


def test_non_contiguous_input_and_grad(path):
    x = _randn(64, 12).t().requires_grad_()  # rows of 64 with stride 12
    x_sliced = _randn(12, 130)[:, ::2].requires_grad_()
    for t in (x, x_sliced):
        assert not t.is_contiguous()
        dy = _randn(t.shape[1], t.shape[0], seed=9).t()
        _check(t, t.shape[-1], *_params((t.shape[-1],), torch.float32), dy=dy)


def test_large_mean_small_variance(path):
    # Cancellation check: at a mean of 100 and a variance of 1e-4, E[x^2] - E[x]^2 in fp32 gives
    # 0 or 1e-3 (every digit lost); the two-pass and Chan formulas keep the normalised output
    # within what fp32 inputs allow (torch's own fp32 layer_norm is off by about 8e-4 here).
    x = _randn(4, 500, scale=1e-2, shift=1e2)
    y = layer_norm(x, 500, eps=0.0)
    ref = F.layer_norm(x.double(), (500,), eps=0.0)
    torch.testing.assert_close(y.double(), ref, atol=2e-3, rtol=0)


@pytest.mark.parametrize("n_cols", [10000, 16384 + 1000, 65536])
def test_rows_longer_than_default_single_block_limits(n_cols):
    x = _randn(2, n_cols, shift=1.0).requires_grad_()
    _check(x, n_cols, *_params((n_cols,), torch.float32))


@pytest.mark.parametrize("n_cols, kernels", [
    (8192, ["fused", "sum"]),
    (16384, ["dx_rows", "dwdb", "sum"]),  # dx alone fits a block; the sums are column-tiled
    (16385, ["dx", "dwdb", "sum"]),
])
def test_backward_plan_by_row_length(n_cols, kernels):
    """Which kernels the default limits pick, by row length (fp16, affine, every gradient)."""
    dtypes = (torch.float16,) * 3 + (torch.float16, torch.float16)
    plan = layer_norm_ops.plans.backward_plan(
        4096, n_cols, dtypes, True, (True, True, True), 132, layer_norm_ops.TUNING)
    assert list(plan.launches) == kernels
    if "dx_rows" in plan.launches:
        dx_rows = plan.launches["dx_rows"]
        assert dx_rows.kernel is layer_norm_ops.kernels.layer_norm_bwd_kernel
        # persistent: a program an SM
        assert dx_rows.grid == (128,) and dx_rows.scalars == (4096, 16384, 32)
        consts = dx_rows.consts
        assert consts["STAGES"] == 1 and not consts["COMPUTE_DW"] and not consts["COMPUTE_DB"]


def test_tuning_is_part_of_the_plan_key(monkeypatch, planned_launches):
    """A replaced TUNING takes effect at the next call (its plans are keyed on it, never stale),
    and the default comes back with the default's plans. Every launch goes through a plan."""
    launched = planned_launches
    x = _randn(4, 300, shift=2.0).requires_grad_()
    w, b = _params((300,), torch.float32)
    default = layer_norm_ops.TUNING
    with monkeypatch.context() as m:
        m.setattr(layer_norm_ops, "TUNING", dataclasses.replace(
            default, single_block_max_cols=256, forward_chunk_cols=64,
            backward_single_block_max_cols=256, backward_dx_single_block_max_cols=256,
            chunk_cols=64))
        _check(x, 300, w, b)
    assert [name for name, _ in launched] == [
        "layer_norm_fwd_chunked_kernel", "layer_norm_bwd_dx_chunked_kernel",
        "layer_norm_bwd_dwdb_chunked_kernel", "layer_norm_bwd_sum_partials_kernel"]
    launched.clear()
    _check(x, 300, w, b)
    assert [name for name, _ in launched] == [
        "layer_norm_fwd_kernel", "layer_norm_bwd_kernel", "layer_norm_bwd_sum_partials_kernel"]
    dtypes = (torch.float32,) * 5
    plan = layer_norm_ops.plans.backward_plan(4, 300, dtypes, True, (True,) * 3, 132, default)
    assert plan is layer_norm_ops.plans.backward_plan(
        4, 300, dtypes, True, (True,) * 3, 132, default)


def test_backward_is_deterministic(path):
    # Enough rows that several programs each contribute a partial dweight/dbias.
    x = _randn(64, 300, dtype=torch.float16).requires_grad_()
    w, b = _params((300,), torch.float32)
    dy = _randn(64, 300, dtype=torch.float16, seed=5)
    runs = [torch.autograd.grad(layer_norm(x, 300, w, b), (x, w, b), dy) for _ in range(2)]
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize(
    "shape,normalized_shape", [((0, 8), 8), ((4, 0), 0), ((2, 0, 3), (0, 3))], ids=str
)
def test_empty(shape, normalized_shape):
    norm = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    x = torch.empty(shape, device=DEVICE, requires_grad=True)
    w = torch.ones(norm, device=DEVICE, requires_grad=True)
    b = torch.zeros(norm, device=DEVICE, requires_grad=True)
    y = layer_norm(x, normalized_shape, w, b)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))


@pytest.mark.parametrize("affine", [True, False])
def test_gradcheck_float64(path, affine):
    # fp64 inputs compute in fp64 inside the kernels, so finite differences are meaningful.
    x = _randn(3, 11, dtype=torch.float64).requires_grad_()
    w, b = _params((11,), torch.float64, affine, affine)
    inputs = (x, w, b) if affine else (x,)
    assert torch.autograd.gradcheck(
        lambda *t: layer_norm(t[0], 11, *t[1:]), inputs
    )


def test_torch_compile_matches_eager():
    def f(x, w, b):
        return layer_norm(x * 2.0, (x.shape[-1],), w, b).square().sum(-1)

    x = _randn(6, 40).requires_grad_()
    w, b = _params((40,), torch.float32)
    compiled = torch.compile(f, fullgraph=True)
    out_c = compiled(x, w, b)
    grads_c = torch.autograd.grad(out_c.sum(), (x, w, b))
    out_e = f(x, w, b)
    grads_e = torch.autograd.grad(out_e.sum(), (x, w, b))
    torch.testing.assert_close(out_c, out_e)
    for gc, ge in zip(grads_c, grads_e):
        torch.testing.assert_close(gc, ge)


@pytest.mark.parametrize(
    "kwargs", [{}, {"bias": False}, {"elementwise_affine": False}, {"eps": 1e-3}], ids=str
)
def test_module_is_a_drop_in_for_torch_layer_norm(kwargs):
    ref = torch.nn.LayerNorm((4, 6), device=DEVICE, **kwargs)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(_randn(*p.shape, seed=11))
    ours = tw_nn.LayerNorm((4, 6), device=DEVICE, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ours.load_state_dict(ref.state_dict())
    x = _randn(3, 4, 6, shift=2.0)
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_ref = ours(x_ours), ref(x_ref)
    torch.testing.assert_close(y_ours, y_ref, **TOLERANCES[torch.float32])
    dy = _randn(3, 4, 6, seed=12)
    y_ours.backward(dy)
    y_ref.backward(dy)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, **TOLERANCES[torch.float32])
    for (_, p_ours), (_, p_ref) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p_ours.grad, p_ref.grad, **TOLERANCES[torch.float32])


def test_module_defaults():
    m = tw_nn.LayerNorm(8, dtype=torch.float16)
    assert m.normalized_shape == (8,) and m.weight.dtype == torch.float16
    assert torch.equal(m.weight, torch.ones(8, dtype=torch.float16))
    assert torch.equal(m.bias, torch.zeros(8, dtype=torch.float16))
    assert "elementwise_affine=True" in repr(m)


def _x():
    return torch.ones(2, 3, 4, device=DEVICE)


@pytest.mark.parametrize(
    "make_args,error,match",
    [
        (lambda: ([1.0, 2.0], 2), TypeError, "x must be a torch.Tensor"),
        (lambda: (torch.ones(2, 4, dtype=torch.int64, device=DEVICE), 4), TypeError, "x must have"),
        (lambda: (_x(), 3), ValueError, "normalized_shape"),
        (lambda: (_x(), (2, 4)), ValueError, "normalized_shape"),
        (lambda: (_x(), (1, 2, 3, 4)), ValueError, "normalized_shape"),
        (lambda: (_x(), ()), ValueError, "normalized_shape"),
        (lambda: (_x(), 4.0), TypeError, "normalized_shape"),
        (lambda: (_x(), (4, "a")), TypeError, "normalized_shape"),
        (lambda: (_x(), 4, torch.ones(3, device=DEVICE)), ValueError, "weight"),
        (lambda: (_x(), 4, "w"), TypeError, "weight"),
        (lambda: (_x(), 4, torch.ones(4, dtype=torch.int32, device=DEVICE)), TypeError, "weight"),
        (lambda: (_x(), 4, None, torch.ones(3, 4, device=DEVICE)), ValueError, "bias"),
        (lambda: (_x(), 4, None, None, -1.0), ValueError, "eps"),
        (lambda: (_x(), 4, None, None, "1e-5"), TypeError, "eps"),
    ],
    ids=[
        "x_not_tensor", "x_int", "shape_mismatch", "shape_mismatch_2d", "shape_too_long",
        "shape_empty", "shape_float", "shape_str_entry", "weight_shape", "weight_not_tensor",
        "weight_int", "bias_shape", "eps_negative", "eps_str",
    ],
)
def test_bad_inputs(make_args, error, match):
    with pytest.raises(error, match=match):
        layer_norm(*make_args())


@gpu_only
def test_mismatched_devices():
    with pytest.raises(ValueError, match="weight"):
        layer_norm(_x(), 4, torch.ones(4))  # weight on the CPU, x on the GPU


@pytest.mark.big_memory
@gpu_only
@pytest.mark.gpu
def test_offsets_past_2_31_elements():
    # 2**31 + 4096 fp16 elements (4 GiB): row index * n_cols overflows int32 in the last rows.
    n_cols = 1024
    n_rows = 2**31 // n_cols + 4
    x = torch.zeros(n_rows, n_cols, device="cuda", dtype=torch.float16)
    x[-8:].normal_()
    y = layer_norm(x, n_cols)
    torch.testing.assert_close(
        y[-8:].float(), F.layer_norm(x[-8:].float(), (n_cols,)), **TOLERANCES[torch.float16]
    )


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_eager_backward_takes_the_plan_made_in_the_forward(path, monkeypatch, affine):
    """As for softmax: the eager forward plans the backward for a contiguous gradient, which then
    only launches; other gradients (strided) go through the registered op, with the same
    results."""
    calls = []
    op = layer_norm_ops.layer_norm_backward
    monkeypatch.setattr(layer_norm_ops, "layer_norm_backward",
                        lambda *args: calls.append(1) or op(*args))
    x = _randn(6, 40).requires_grad_()
    w, b = _params((40,), torch.float32, weight=affine, bias=affine)
    for _ in range(2):  # the general path's Function, then the kept signature's
        _check(x, 40, w, b)
    assert calls == []
    _check(x, 40, w, b, dy=_randn(40, 6, seed=2).t())
    assert calls == [1]
    # Only some gradients asked for: the plan follows needs_input_grad.
    _check(x.detach(), 40, w, b)
    assert calls == [1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_repeated_kept_calls_match_float64(path, monkeypatch, dtype):
    """One signature called again and again with fresh data (after the first call, the kept
    forward and backward launches): y and the gradients of x, weight and bias as float64
    PyTorch's, for contiguous and strided incoming gradients, and y without autograd too."""
    recorded = []
    record = layer_norm_ops.layer_norm_forward.record_planned
    monkeypatch.setattr(layer_norm_ops.layer_norm_forward, "record_planned",
                        lambda *args: recorded.append(1) or record(*args))
    w, b = _params((48,), dtype)
    for step in range(6):
        x = _randn(5, 3, 48, dtype=dtype, seed=20 + step, scale=2.0,
                   shift=step - 2.0).requires_grad_()
        if step % 3 == 2:  # strided: (48, 3, 5) permuted back to (5, 3, 48)
            dy = _randn(48, 3, 5, dtype=dtype, seed=30 + step).permute(2, 1, 0)
        else:
            dy = _randn(5, 3, 48, dtype=dtype, seed=30 + step)
        _check(x, (48,), w, b, dy=dy)
        with torch.no_grad():
            y = layer_norm(x, (48,), w, b)
        ref = F.layer_norm(x.detach().double(), (48,), w.detach().double(), b.detach().double())
        torch.testing.assert_close(y.double(), ref, **TOLERANCES[dtype])
    assert len(recorded) == 5  # every call after the first that records


# --------------------------------------------------------------------------------------------
# Numerics at any mean: rows far from zero, constant rows, float64 all the way.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ratio", [1.0, 1e2, 1e3, 1e4])
def test_error_within_twice_pytorchs_at_any_mean(path, dtype, ratio):
    """|mean| / std up to 1e4 (a residual stream with an offset): the error against float64 is
    at most twice PyTorch's own on the same input (plus a rounding floor for rows where PyTorch
    happens to be exact). A plain sum loses the row's digits to its offset."""
    x = _randn(16, 300, dtype=dtype, seed=11, shift=ratio)
    w = _randn(300, seed=12, shift=1.0)
    b = _randn(300, seed=13)
    ref = F.layer_norm(x.double(), (300,), w.double(), b.double(), 1e-5)
    ours = (layer_norm(x, (300,), w, b).double() - ref).abs().max().item()
    theirs = (F.layer_norm(x.cpu().float(), (300,), w.cpu(), b.cpu()).to(dtype).double()
              - ref.cpu()).abs().max().item()
    floor = 4 * torch.finfo(dtype).eps * ref.abs().max().item()
    assert ours <= max(2 * theirs, floor), (ours, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [100.7, -3.3e4, 1e-3])
def test_constant_rows_return_the_bias(path, dtype, value):
    """Every element of a row equal: the variance is exactly 0 and PyTorch returns the bias
    exactly; so does layer_norm (a rounding-noise variance would give bias + noise / sqrt(eps))."""
    x = torch.full((5, 77), value, dtype=dtype, device=DEVICE)
    w = _randn(77, seed=1, shift=1.0)
    b = _randn(77, seed=2)
    y = layer_norm(x, (77,), w, b)
    expected = b.to(dtype).expand_as(y)
    if INTERPRET and dtype == torch.bfloat16:
        # The interpreter truncates fp32 -> bf16 where the GPU rounds to nearest (INTERPRETER.md):
        # one bf16 ulp of difference from the rounded bias, no more.
        torch.testing.assert_close(y, expected, atol=0, rtol=2**-7)
    else:
        assert torch.equal(y, expected), (y - b).abs().max()


def test_float64_keeps_eps_in_float64(path):
    """float64 computes in float64, eps included (a float32 eps is off by ~1e-8 relative)."""
    x = _randn(6, 40, dtype=torch.float64, seed=5, scale=1e-2)
    for eps in (1e-3, 1.1e-5, 0.1):
        torch.testing.assert_close(layer_norm(x, (40,), eps=eps),
                                   F.layer_norm(x, (40,), eps=eps), atol=1e-14, rtol=1e-13)
