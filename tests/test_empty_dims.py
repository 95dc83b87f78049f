"""Every op with each dimension 0 in turn, forward and backward.

An empty dimension is where a launcher's reshapes, grids and reductions meet their edge cases
(``reshape(-1, 0)`` is ambiguous; a zero-filter convolution is refused by cuDNN's gradient
helpers; a sum over nothing must be 0, not unwritten memory). Each case compares shapes, values
and gradients with PyTorch on the same inputs; where PyTorch itself refuses a shape that is
well defined (a convolution with zero filters), with the mathematical answer: an empty output,
zero gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import triton_workshop as tw
from triton_workshop.runtime import DEVICE


def _leaves(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(DEVICE).requires_grad_() for s in shapes]


def _run(fn, leaves):
    out = fn(*leaves)
    # A random upstream gradient (not ones): a wrong reduction axis cannot hide behind symmetry.
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    grads = torch.autograd.grad(out, leaves, dy, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]


def _compare(ours, reference, shapes, seed=0):
    mine = _leaves(shapes, seed)
    theirs = [x.detach().clone().requires_grad_() for x in mine]
    out, grads = _run(ours, mine)
    ref_out, ref_grads = _run(reference, theirs)
    assert out.shape == ref_out.shape
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    for g, r, x in zip(grads, ref_grads, mine):
        assert g.shape == x.shape
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def _with_zero(shape, i):
    shape = list(shape)
    shape[i] = 0
    return tuple(shape)


# matmul: a (B, M, K) or (M, K) against b (B, K, N) or (K, N); each of B, M, K, N zero in turn.
MATMUL_CASES = []
for a_shape, b_shape in (((3, 4, 5), (5, 6)), ((3, 4, 5), (3, 5, 6)), ((4, 5), (5, 6)),
                         ((4, 5), (3, 5, 6))):
    dims = {"B": None, "M": None, "K": None, "N": None}
    for name in ("B", "M", "K", "N"):
        a, b = list(a_shape), list(b_shape)
        if name == "B":
            if len(a) == 3:
                a[0] = 0
            if len(b) == 3:
                b[0] = 0
            if len(a) == 2 and len(b) == 2:
                continue
        elif name == "M":
            a[-2] = 0
        elif name == "K":
            a[-1] = b[-2] = 0
        else:
            b[-1] = 0
        MATMUL_CASES.append((tuple(a), tuple(b), name))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("a_shape,b_shape,zero", MATMUL_CASES,
                         ids=[f"{a}@{b}-{z}=0" for a, b, z in MATMUL_CASES])
def test_matmul(a_shape, b_shape, zero, with_bias):
    n = b_shape[-1]
    if with_bias:
        _compare(lambda a, b, bias: tw.matmul(a, b, bias=bias),
                 lambda a, b, bias: torch.matmul(a, b) + bias, [a_shape, b_shape, (n,)])
    else:
        _compare(tw.matmul, torch.matmul, [a_shape, b_shape])


def test_matmul_batched_a_against_shared_b_with_empty_k():
    """The issue's own reproduction: K = 0, batched a against a 2-D b."""
    a = torch.randn(5, 5, 0, device=DEVICE, requires_grad=True)
    b = torch.randn(0, 5, device=DEVICE, requires_grad=True)
    out = tw.matmul(a, b)
    out.sum().backward()
    assert torch.equal(out, torch.zeros(5, 5, 5, device=DEVICE))
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


@pytest.mark.parametrize("zero", range(2))
@pytest.mark.parametrize("out_features", [3, 0])
def test_linear(zero, out_features):
    x_shape = _with_zero((4, 6), zero)
    k = x_shape[-1]
    _compare(tw.linear, F.linear, [x_shape, (out_features, k), (out_features,)])


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("zero", ["N", "C", "F"])
def test_conv2d(zero, memory_format):
    n, c, f = 2, 3, 4
    if zero == "N":
        n = 0
    elif zero == "C":
        c = 0
    else:
        f = 0
    x, w, b = _leaves([(n, c, 6, 7), (f, c, 3, 3), (f,)], seed=3)
    x_in = x.to(memory_format=memory_format)
    out, (gx, gw, gb) = _run(lambda x_, w_, b_: tw.conv2d(x_, w_, b_, padding=1), [x_in, w, b])
    assert out.shape == (n, f, 6, 7)
    # The mathematical answer (PyTorch refuses zero filters, and returns the wrong shape for
    # zero channels): with no channels each output is its bias; every other sum is empty.
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    torch.testing.assert_close(out, b[None, :, None, None].expand_as(out).detach())
    assert torch.equal(gx, torch.zeros_like(x_in)) and torch.equal(gw, torch.zeros_like(w))
    torch.testing.assert_close(gb, dy.sum(dim=(0, 2, 3)))


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_zero_filters_backward(stride):
    """The issue's own reproduction: w = randn(0, 2, 3, 3) (both gradient paths: stride 1 runs
    the Triton kernel, stride 2 PyTorch's helpers)."""
    x = torch.randn(1, 2, 5, 5, device=DEVICE, requires_grad=True)
    w = torch.randn(0, 2, 3, 3, device=DEVICE, requires_grad=True)
    out = tw.conv2d(x, w, stride=stride)
    out.sum().backward()
    assert out.numel() == 0
    assert torch.equal(x.grad, torch.zeros_like(x)) and w.grad.shape == w.shape


@pytest.mark.parametrize("zero", range(2))
def test_softmax(zero):
    _compare(lambda x: tw.softmax(x, -1), lambda x: torch.softmax(x, -1), [_with_zero((3, 9), zero)])


@pytest.mark.parametrize("zero", range(2))
def test_layer_norm(zero):
    shape = _with_zero((3, 9), zero)
    k = shape[-1]
    _compare(lambda x, w, b: tw.layer_norm(x, (k,), w, b),
             lambda x, w, b: F.layer_norm(x, (k,), w, b), [shape, (k,), (k,)])


@pytest.mark.parametrize("out_features", [5, 0])
@pytest.mark.parametrize("zero", range(2))
def test_layer_norm_linear(zero, out_features):
    shape = _with_zero((3, 8), zero)
    k = shape[-1]
    _compare(tw.layer_norm_linear,
             lambda x, lw, lb, w, b: F.linear(F.layer_norm(x, (k,), lw, lb), w, b),
             [shape, (k,), (k,), (out_features, k), (out_features,)])


def _attention_reference(q, k, v):
    # Written out: PyTorch's CUDA SDPA kernels refuse some empty shapes (zero heads).
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("zero", range(3))
def test_attention(zero):
    shape = _with_zero((2, 3, 5, 8), zero)
    _compare(tw.attention, _attention_reference, [shape, shape, shape])


def test_attention_empty_keys():
    """No keys at all: PyTorch's SDPA gives NaN rows (0/0); the shapes and gradients of the
    other inputs must still come back without a crash."""
    q, k, v = _leaves([(2, 3, 5, 8), (2, 3, 0, 8), (2, 3, 0, 8)], seed=4)
    out, grads = _run(tw.attention, [q, k, v])
    assert out.shape == q.shape
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


@pytest.mark.parametrize("zero", range(2))
def test_elementwise(zero):
    shape = _with_zero((4, 6), zero)
    _compare(tw.add, torch.add, [shape, shape])
    _compare(tw.fused_mul_add_sqrt, lambda a, b, c: torch.sqrt(a * b + c),
             [shape, shape, shape])
