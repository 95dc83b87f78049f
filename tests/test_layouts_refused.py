"""Tensors of other layouts than dense strided memory are refused by name, before any launch.

The kernels read memory through a data pointer and strides. A nested tensor (which reports the
strided layout), a sparse tensor of any layout or an mkldnn tensor has no such memory to read, and
used to fail somewhere inside with an internal error. ``runtime.check_tensor`` now refuses them
first, with a ``TypeError`` that names the argument and the layout, so every op that checks its
tensors does.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import triton_workshop as tw
from triton_workshop import DEVICE, runtime
from triton_workshop.ops import matmul as matmul_module


def _nested(*shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested tensor API's prototype warning
        return torch.nested.nested_tensor([torch.randn(*s) for s in shapes]).to(DEVICE)


def _sparse(layout, rows=4, cols=16):
    dense = torch.randn(rows, cols)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR/BSR beta warnings
        if layout is torch.sparse_coo:
            t = dense.to_sparse()
        elif layout is torch.sparse_csr:
            t = dense.to_sparse_csr()
        elif layout is torch.sparse_csc:
            t = dense.to_sparse_csc()
        elif layout is torch.sparse_bsr:
            t = dense.to_sparse_bsr((2, 2))
        else:
            t = dense.to_sparse_bsc((2, 2))
        try:
            return t.to(DEVICE)
        except (RuntimeError, NotImplementedError):
            return t  # refused for its layout before its device is looked at


SPARSE = {
    torch.sparse_coo: "a sparse COO tensor",
    torch.sparse_csr: "a sparse CSR tensor",
    torch.sparse_csc: "a sparse CSC tensor",
    torch.sparse_bsr: "a sparse BSR tensor",
    torch.sparse_bsc: "a sparse BSC tensor",
}


def _odd_tensors():
    """``(id, tensor of 4 x 16 values or nested rows of 16, what the error calls it)``."""
    cases = [("nested", _nested((3, 16), (5, 16)), "a nested tensor")]
    cases += [(str(layout).replace("torch.", ""), _sparse(layout), name)
              for layout, name in SPARSE.items()]
    if torch.backends.mkldnn.is_available():
        cases.append(("mkldnn", torch.randn(4, 16).to_mkldnn(), "an mkldnn tensor"))
    return cases


ODD = _odd_tensors()


def _refuse_launches(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(runtime.registry, "launch_kernel", refuse)
    monkeypatch.setattr(runtime.registry, "wrap_triton", refuse)
    monkeypatch.setattr(matmul_module, "wrap_triton", refuse)


@pytest.fixture
def no_launch(monkeypatch):
    """Any kernel launch fails the test: the refusal must come before."""
    _refuse_launches(monkeypatch)


def _dense(*shape):
    return torch.randn(*shape, device=DEVICE)


def _refused(name: str, what: str):
    return pytest.raises(TypeError, match=f"^{name} must be a dense \\(strided\\) tensor, got {what}$")


def test_the_reported_repro():
    x = _nested((3, 16), (5, 16))
    with _refused("x", "a nested tensor"):
        tw.linear(x, torch.randn(8, 16, device=DEVICE))


@pytest.mark.parametrize("case", ODD, ids=[c[0] for c in ODD])
def test_linear_and_matmul_refuse_each_operand(case, no_launch):
    _, odd, what = case
    with _refused("x", what):
        tw.linear(odd, _dense(8, 16))
    with _refused("weight", what):
        tw.linear(_dense(4, 16), odd)
    with _refused("a", what):
        tw.matmul(odd, _dense(16, 8))
    if odd.dim() == 2:  # a nested tensor is a batch of matrices: as b it is rank-checked too
        with _refused("b", what):
            tw.matmul(_dense(8, 4), odd)


@pytest.mark.parametrize("case", ODD, ids=[c[0] for c in ODD])
def test_row_wise_and_elementwise_ops_refuse(case, no_launch):
    _, odd, what = case
    with _refused("x", what):
        tw.layer_norm(odd, (16,))
    with _refused("x", what):
        tw.softmax(odd, -1)
    with _refused("x", what):
        tw.add(odd, _dense(4, 16))
    with _refused("y", what):
        tw.add(_dense(4, 16), odd)


def test_bias_and_norm_weights_are_checked_too(no_launch):
    coo = _sparse(torch.sparse_coo, 1, 16)[0]  # a 1-D sparse vector of 16
    with _refused("bias", "a sparse COO tensor"):
        tw.linear(_dense(4, 16), _dense(16, 16), coo)
    with _refused("weight", "a sparse COO tensor"):
        tw.layer_norm(_dense(4, 16), (16,), coo)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_attention_refuses_a_nested_tensor(which, no_launch):
    tensors = {name: _dense(1, 2, 8, 16) for name in "qkv"}
    tensors[which] = _nested((2, 8, 16), (2, 8, 16))
    with _refused(which, "a nested tensor"):
        tw.attention(tensors["q"], tensors["k"], tensors["v"])


def test_a_checked_signature_does_not_let_another_layout_through(monkeypatch):
    """linear keeps the call signatures it has checked; a tensor of another layout with the same
    shape, dtype and device as a dense one checked before still gets its refusal (the layout is
    part of the kept signature)."""
    w = _dense(8, 16)
    for _ in range(2):
        tw.linear(_dense(4, 16), w)  # checked, then its signature kept
    _refuse_launches(monkeypatch)
    for _, odd, what in ODD:
        if odd.layout is not torch.strided and odd.dim() == 2:
            with _refused("x", what):
                tw.linear(odd, w)


def test_check_tensor_accepts_dense_tensors_of_any_strides():
    t = _dense(4, 16)
    for view in (t, t.t(), t[:, ::2], t[None].expand(3, 4, 16)):
        runtime.check_tensor(view, "t")
    runtime.check_tensor(torch.nn.Parameter(t), "t")
