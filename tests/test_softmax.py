"""softmax against torch.softmax computed in float64: values and gradients, both kernel paths.

The multi-block (online) path normally starts past 32768 columns; the ``multi_block`` fixture
replaces the module's ``TUNING`` with lower thresholds so that short rows exercise it in the
interpreter in milliseconds.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop import nn as tw_nn
from triton_workshop.ops import softmax as softmax_ops
from triton_workshop.ops.softmax import softmax
from triton_workshop.runtime import DEVICE, INTERPRET

TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
gpu_only = pytest.mark.skipif(INTERPRET, reason="needs a CUDA device")


@pytest.fixture(params=["single_block", "multi_block"])
def path(request, monkeypatch):
    """Run the test on both kernel paths: the multi-block one with every row of 2+ columns
    streamed in chunks of at most 64 (so 1000 columns take 16 chunks)."""
    if request.param == "multi_block":
        monkeypatch.setattr(softmax_ops, "TUNING", dataclasses.replace(
            softmax_ops.TUNING, single_block_max_cols=1, backward_single_block_max_cols=1,
            chunk_cols=64))
    return request.param


def _randn(*shape, dtype=torch.float32, seed=0, scale=3.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(DEVICE, dtype)


def _check(x, dim, dy=None):
    """Compare softmax(x, dim) and its gradient for ``dy`` with float64 PyTorch."""
    x = x.detach().requires_grad_()
    y = softmax(x, dim)
    assert y.dtype == x.dtype and y.shape == x.shape
    x64 = x.detach().double().requires_grad_()
    ref = torch.softmax(x64, dim)
    tol = TOLERANCES[x.dtype]
    torch.testing.assert_close(y.double(), ref, equal_nan=True, **tol)
    if dy is None:
        dy = _randn(*x.shape, dtype=x.dtype, seed=1)
    (dx,) = torch.autograd.grad(y, x, dy)
    (ref_dx,) = torch.autograd.grad(ref, x64, dy.double())
    assert dx.dtype == x.dtype
    torch.testing.assert_close(dx.double(), ref_dx, equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (4, 3), (7, 127), (5, 1000), (2, 3, 129)], ids=str)
def test_values_and_grads(path, shape, dtype):
    _check(_randn(*shape, dtype=dtype), -1)


@pytest.mark.parametrize("dim", [0, 1, -2, 2])
def test_any_dim(path, dim):
    _check(_randn(4, 5, 33, dtype=torch.float32), dim)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.t(),  # softmax over a strided dim
        lambda x: x[:, ::3],  # sliced columns
        lambda x: x[1::2],  # sliced rows
        lambda x: x[:, :1].expand(-1, 50),  # stride-0 columns
    ],
    ids=["transposed", "col_slice", "row_slice", "expanded"],
)
def test_non_contiguous_input_and_grad(path, make):
    x = make(_randn(40, 150))
    assert not x.is_contiguous()
    dy = _randn(x.shape[1], x.shape[0], seed=2).t()  # a non-contiguous incoming gradient
    _check(x, -1, dy=dy)


def test_row_longer_than_default_single_block_limit():
    # Past the forward's limit (multi-block forward, single-block backward), then past both.
    for n_cols in (softmax_ops.TUNING.single_block_max_cols + 1000,
                   softmax_ops.TUNING.backward_single_block_max_cols + 1000):
        _check(_randn(2, n_cols), -1)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the NaN rows, in numpy
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_masked_entries_and_all_minus_inf_rows(path, dtype):
    x = _randn(6, 300, dtype=dtype)
    x[0, ::2] = float("-inf")  # masked entries
    x[1, :200] = float("-inf")  # the first chunks all -inf, then finite values
    x[2] = float("-inf")  # a fully masked row: NaN, as in PyTorch
    x[3, 7] = float("inf")  # +inf: NaN, as in PyTorch
    y = softmax(x)
    ref = torch.softmax(x.double(), -1)
    torch.testing.assert_close(y.double(), ref, equal_nan=True, **TOLERANCES[dtype])
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 4, 5]]).all()


def test_large_values_do_not_overflow(path):
    x = _randn(4, 257) * 1e4  # exp(1e4) is inf in fp32: only max subtraction saves it
    _check(x, -1)
    assert torch.isfinite(softmax(x)).all()


@pytest.mark.parametrize(
    "shape,dim", [((0, 5), -1), ((3, 0), -1), ((0,), 0), ((3, 0, 4), 0)], ids=str
)
def test_empty(shape, dim):
    x = torch.empty(shape, device=DEVICE, requires_grad=True)
    y = softmax(x, dim)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_zero_dim_tensor():
    x = torch.tensor(2.5, device=DEVICE)
    torch.testing.assert_close(softmax(x, 0), torch.softmax(x, 0))
    torch.testing.assert_close(softmax(x, -1), torch.softmax(x, -1))


@pytest.mark.parametrize("shape,dim", [((3, 19), -1), ((7, 4), 0)], ids=str)
def test_gradcheck_float64(path, shape, dim):
    # fp64 inputs compute in fp64 inside the kernels, so finite differences are meaningful.
    x = _randn(*shape, dtype=torch.float64, scale=1.0).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: softmax(t, dim), (x,))


def test_torch_compile_matches_eager():
    def f(x):
        return (softmax(x * 2.0, dim=-1) * softmax(x, dim=0)).sum(-1)

    x = _randn(6, 40).requires_grad_()
    compiled = torch.compile(f, fullgraph=True)
    out_c = compiled(x)
    (grad_c,) = torch.autograd.grad(out_c.sum(), x)
    out_e = f(x)
    (grad_e,) = torch.autograd.grad(out_e.sum(), x)
    torch.testing.assert_close(out_c, out_e)
    torch.testing.assert_close(grad_c, grad_e)


def test_module_matches_torch():
    x = _randn(3, 4, 10)
    for dim in (-1, 1):
        torch.testing.assert_close(tw_nn.Softmax(dim)(x), torch.nn.Softmax(dim)(x))
    assert "dim=1" in repr(tw_nn.Softmax(1))


@pytest.mark.parametrize(
    "args,error,match",
    [
        (([[1.0, 2.0]],), TypeError, "x must be a torch.Tensor"),
        ((torch.ones(2, 3, dtype=torch.int32),), TypeError, "x must have dtype"),
        ((torch.ones(2, 3), 2), ValueError, "dim"),
        ((torch.ones(2, 3), -3), IndexError, "dim"),
        ((torch.ones(2, 3), 1.0), TypeError, "dim"),
        ((torch.ones(2, 3), True), TypeError, "dim"),
        ((torch.ones(2, 3), None), TypeError, "dim"),
    ],
    ids=[
        "not_tensor", "int_dtype", "dim_too_big", "dim_too_negative", "dim_float", "dim_bool",
        "dim_none",
    ],
)
def test_bad_inputs(args, error, match):
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(error, match=match):
        softmax(*args)


@gpu_only
def test_cpu_tensor_on_gpu_is_rejected():
    with pytest.raises(ValueError, match="x must be on"):
        softmax(torch.ones(2, 3))


@pytest.mark.big_memory
@gpu_only
@pytest.mark.gpu
def test_offsets_past_2_31_elements():
    # 2**31 + 4096 fp16 elements (4 GiB): row index * row stride overflows int32 in the last rows.
    n_cols = 1024
    n_rows = 2**31 // n_cols + 4
    x = torch.zeros(n_rows, n_cols, device="cuda", dtype=torch.float16)
    x[-8:].normal_()
    y = softmax(x)
    ref = torch.softmax(x[-8:].float(), -1)
    torch.testing.assert_close(y[-8:].float(), ref, **TOLERANCES[torch.float16])


def test_eager_backward_takes_the_plan_made_in_the_forward(path, monkeypatch):
    """The eager forward finds the backward's plan for a gradient laid out like y; the backward
    (on autograd's device thread on a GPU) then only allocates and launches, on a signature's
    first call and on its kept repeats. Any other gradient layout, or a double backward, goes
    through the registered op."""
    general = []
    registered = softmax_ops.softmax_backward
    monkeypatch.setattr(softmax_ops, "softmax_backward",
                        lambda *args: general.append(1) or registered(*args))
    softmax_ops._READY.clear()
    for seed in range(3):  # the first call, then the kept signature's
        _check(_randn(8, 33, seed=10 + seed), -1)
    assert general == []
    x = _randn(8, 33).requires_grad_()
    _check(x, -1, dy=_randn(33, 8, seed=2).t())
    assert general == [1]
    (dx,) = torch.autograd.grad(softmax(x, -1), x, _randn(8, 33, seed=3), create_graph=True)
    assert general == [1, 1]
    torch.testing.assert_close(
        dx, torch.autograd.grad(torch.softmax(x, -1), x, _randn(8, 33, seed=3))[0])


def test_kept_signature_values_and_grads_on_fresh_data(path):
    """A kept signature's repeated calls (plain, recording; a gradient of another dtype, which
    autograd casts, or a strided one) against float64 torch on fresh data each time."""
    softmax_ops._READY.clear()
    for seed in range(4):
        for dtype in (torch.float32, torch.bfloat16):
            x = _randn(6, 40, dtype=dtype, seed=20 + seed).requires_grad_()
            x64 = x.detach().double().requires_grad_()
            y, ref = softmax(x, 1), torch.softmax(x64, 1)
            tol = TOLERANCES[dtype]
            torch.testing.assert_close(y.double(), ref, **tol)
            torch.testing.assert_close(softmax(x.detach(), 1), y.detach())
            dy = _randn(6, 40, dtype=torch.float64, seed=30 + seed)
            if seed % 2:
                dy = _randn(40, 6, dtype=torch.float64, seed=30 + seed).t()
            (dx,) = torch.autograd.grad(y, x, dy)
            (ref_dx,) = torch.autograd.grad(ref, x64, dy.to(dtype).double())
            assert dx.dtype == dtype
            torch.testing.assert_close(dx.double(), ref_dx, **tol)


def test_tuning_is_part_of_the_plan_key(monkeypatch, planned_launches):
    """A replaced TUNING takes effect at the next call (its plans are keyed on it, never stale),
    and the default comes back with the default's plans."""
    x = _randn(4, 300)
    default = softmax_ops.TUNING
    with monkeypatch.context() as m:
        m.setattr(softmax_ops, "TUNING", dataclasses.replace(default, single_block_max_cols=256,
                                                             chunk_cols=64))
        torch.testing.assert_close(softmax(x), torch.softmax(x, -1))
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1))
    assert planned_launches == [("softmax_fwd_online_kernel", (4,)), ("softmax_fwd_kernel", (1,))]
    plan = softmax_ops._find_plan(x.shape, 1, (x.stride(),) * 2, x.dtype, False)
    assert plan is softmax_ops._find_plan(x.shape, 1, (x.stride(),) * 2, x.dtype, False)
    assert plan.consts["BLOCK_N"] == 512 and plan.consts["ROWS"] == 4  # 300 columns, 4 rows
