"""cross_entropy and linear_cross_entropy against F.cross_entropy computed in float64: values and
gradients (input, weight, bias), every reduction, ignore_index, label smoothing, dtypes, strides.

The kernels stream a row of logits ``chunk_cols`` at a time and linear_cross_entropy cuts the
logits into chunks of tokens, each in blocks of the vocabulary where whole rows would leave too
few tokens a chunk (``chunk_plan``); the ``path`` and ``linear_path`` fixtures replace the
module's ``TUNING`` so that small shapes cross many column chunks, several token chunks and
several vocabulary blocks (ragged last ones) on the CPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from conftest import view_past_2_31
from triton_workshop.ops import cross_entropy as ce_ops
from triton_workshop.ops.cross_entropy import (
    ChunkPlan,
    chunk_plan,
    chunk_rows,
    cross_entropy,
    estimated_peak_bytes,
    linear_cross_entropy,
)
from triton_workshop.runtime import DEVICE, INTERPRET

#: (rtol, atol relative to the largest |reference| value) by the dtype of the result.
TOLERANCES = {
    torch.float32: (2e-5, 2e-6),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDUCTIONS = ["mean", "sum", "none"]
NAN = float("nan")
gpu_only = pytest.mark.skipif(INTERPRET, reason="needs a CUDA device")


@pytest.fixture(params=["one_chunk", "chunked"])
def path(request, monkeypatch):
    """cross_entropy's. "chunked": rows streamed 64 columns a step (1000 columns take 16 steps,
    the last ragged). linear_cross_entropy's are :func:`linear_path`'s."""
    if request.param == "chunked":
        monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(ce_ops.TUNING, chunk_cols=64))
    return request.param


@pytest.fixture(params=["one_chunk", "token_chunks", "vocab_blocks"])
def linear_path(request, monkeypatch):
    """linear_cross_entropy's ways through the logits. "token_chunks": chunks of whole rows, 4
    tokens of up to 64 classes of fp32 (rows streamed 64 columns a step). "vocab_blocks": chunks
    of at most 4 tokens, each cut into vocabulary blocks of at most 96 bytes a row (24 fp32
    classes, 48 fp16/bf16), rows streamed 16 columns a step: a block of 17 or 24 columns takes a
    ragged second step, the last block of a row and the last chunk of tokens are ragged."""
    if request.param == "token_chunks":
        monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
            ce_ops.TUNING, chunk_cols=64, logits_chunk_bytes=4 * 64 * 4, min_chunk_rows=1))
    elif request.param == "vocab_blocks":
        monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
            ce_ops.TUNING, chunk_cols=16, logits_chunk_bytes=4 * 96, max_chunk_rows=4,
            min_chunk_rows=4))
    return request.param


def _randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(DEVICE, dtype)


def _targets(n, n_classes, *, seed=1, ignored=(), ignore_index=-100):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.randint(0, n_classes, (n,), generator=g)
    t[list(ignored)] = ignore_index
    return t.to(DEVICE)


def _assert_close(got, ref, dtype, scale=1.0):
    """``got`` against a float64 ``ref`` with ``dtype``'s tolerance, the absolute part relative
    to the largest |ref| (a mean's gradient is ~1/N, a sum's ~1). NaNs must match."""
    rtol, atol = TOLERANCES[dtype]
    big = ref.abs().nan_to_num(0.0).max().item() if ref.numel() else 0.0
    torch.testing.assert_close(got.double(), ref, rtol=rtol * scale,
                               atol=atol * scale * max(big, 1e-30), equal_nan=True)


def _ce_grad_check(x, target, *, dy_seed=7, **kwargs):
    """cross_entropy's loss and d(loss)/d(x) against float64 F.cross_entropy; the loss's dtype
    against torch's in x's dtype."""
    loss = cross_entropy(x, target, **kwargs)
    assert loss.dtype == F.cross_entropy(x.detach(), target, **kwargs).dtype
    x64 = x.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, target, **kwargs)
    assert loss.shape == ref.shape
    _assert_close(loss, ref, loss.dtype)
    dy = _randn(*ref.shape, dtype=torch.float64, seed=dy_seed)
    (dx,) = torch.autograd.grad(loss, x, dy.to(loss.dtype))
    (ref_dx,) = torch.autograd.grad(ref, x64, dy.to(loss.dtype).double())
    assert dx.dtype == x.dtype and dx.shape == x.shape
    _assert_close(dx, ref_dx, x.dtype, scale=2.0)
    return loss, dx


# --------------------------------------------------------------------------------------------
# cross_entropy
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_classes", [1, 7, 1000, 5000])
def test_cross_entropy_values_and_grads(path, n_classes, dtype):
    if INTERPRET and path == "chunked" and n_classes == 5000:
        pytest.skip("79 interpreted steps a row; 1000 columns already cross 16 chunks")
    x = _randn(6, n_classes, dtype=dtype, scale=3.0).requires_grad_()
    _ce_grad_check(x, _targets(6, n_classes, ignored=[4]))


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_reductions_and_smoothing(path, reduction, label_smoothing):
    x = _randn(9, 100, scale=2.0).requires_grad_()
    target = _targets(9, 100, ignored=[0, 5])
    loss, dx = _ce_grad_check(x, target, reduction=reduction, label_smoothing=label_smoothing)
    assert torch.all(dx[[0, 5]] == 0)  # ignored rows: no gradient at all
    if reduction == "none":
        assert torch.all(loss[[0, 5]] == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_half_reductions(reduction, dtype):
    x = _randn(8, 300, dtype=dtype, scale=4.0).requires_grad_()
    _ce_grad_check(x, _targets(8, 300, ignored=[3]), reduction=reduction, label_smoothing=0.2)


def test_cross_entropy_ignore_index_is_any_int(path):
    # ignore_index 3 is also a class: rows whose target is 3 are the ignored ones.
    x = _randn(12, 10).requires_grad_()
    target = _targets(12, 10, ignored=[1, 2, 7], ignore_index=3)
    for reduction in REDUCTIONS:
        _ce_grad_check(x, target, ignore_index=3, reduction=reduction, label_smoothing=0.3)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_all_targets_ignored(reduction, label_smoothing):
    # A mean over no target is 0/0 = NaN, as torch gives; the gradient is all zeros.
    x = _randn(4, 33).requires_grad_()
    loss, dx = _ce_grad_check(x, _targets(4, 33, ignored=range(4)), reduction=reduction,
                              label_smoothing=label_smoothing)
    assert loss.isnan().item() if reduction == "mean" else torch.all(loss == 0)
    assert torch.all(dx == 0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_no_rows(reduction):
    x = torch.empty(0, 17, device=DEVICE).requires_grad_()
    loss = cross_entropy(x, torch.empty(0, dtype=torch.int64, device=DEVICE), reduction=reduction)
    ref = F.cross_entropy(x.detach(), torch.empty(0, dtype=torch.int64, device=DEVICE),
                          reduction=reduction)
    torch.testing.assert_close(loss, ref, equal_nan=True)
    (dx,) = torch.autograd.grad(loss.sum(), x)
    assert dx.shape == (0, 17)


@pytest.mark.parametrize("layout", ["column_stride", "transposed", "row_slice"])
def test_cross_entropy_strided_input(path, layout, in_nan_storage):
    """Logits read in place whatever their strides, NaN around them never read."""
    values = _randn(7, 130, scale=2.0)
    if layout == "column_stride":
        storage = torch.full((7, 260), NAN, device=DEVICE)
        storage[:, ::2] = values
        x = storage[:, ::2]
    elif layout == "transposed":
        x = in_nan_storage(values, transpose=True)
    else:
        x = in_nan_storage(values)
    assert not x.is_contiguous()
    x.requires_grad_()
    _ce_grad_check(x, _targets(7, 130, ignored=[2]), label_smoothing=0.1)


@pytest.mark.big_memory
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_rows_past_2_31_elements(path, reduction):
    """Rows 2**30 elements apart, read in place: the last starts past 2**31 elements from the
    first, so a row's offset must be 64-bit (an int32 one would read another row)."""
    values = _randn(3, 130, dtype=torch.bfloat16, scale=2.0).requires_grad_()
    x = view_past_2_31(values, (2**30 + 7, 1))
    _ce_grad_check(x, _targets(3, 130, ignored=[1]), reduction=reduction)


def test_cross_entropy_one_row_input():
    x = _randn(25).requires_grad_()
    for reduction in REDUCTIONS:
        _ce_grad_check(x, torch.tensor(4, device=DEVICE), reduction=reduction)


def test_cross_entropy_infinite_logits(path):
    # -inf logits (a masked vocabulary) over whole chunks, the running max starting at -inf.
    x = _randn(3, 200, scale=2.0)
    x[:, :130] = float("-inf")
    x.requires_grad_()
    _ce_grad_check(x, torch.tensor([150, 199, 131], device=DEVICE), reduction="sum")


def test_cross_entropy_target_out_of_range_is_nan():
    """torch raises; the kernel cannot without waiting for the GPU, so the row is NaN (and
    nothing outside the row is read)."""
    x = _randn(3, 8).requires_grad_()
    loss = cross_entropy(x, torch.tensor([1, 8, -1], device=DEVICE), reduction="none")
    assert not loss[0].isnan() and loss[1:].isnan().all()
    (dx,) = torch.autograd.grad(loss.sum(), x)
    assert dx[1:].isnan().all() and not dx[0].isnan().any()


@pytest.fixture(params=[True, False], ids=["grad_in_forward", "recomputed"])
def either_backward(request, monkeypatch):
    """Both ways to a gradient: made in the forward and scaled in the backward (the tuning
    option), or recomputed from the logits in the backward (the default)."""
    monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
        ce_ops.TUNING, grad_in_forward=request.param))
    return request.param


@pytest.fixture
def gradient_made_in_forward(monkeypatch):
    """The gradient made in the forward (a tuning option, off by default): what a retained
    graph's later backward passes do with it."""
    monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(ce_ops.TUNING, grad_in_forward=True))


def test_cross_entropy_retain_graph_twice(either_backward):
    x = _randn(5, 40).requires_grad_()
    loss = cross_entropy(x, _targets(5, 40))
    (first,) = torch.autograd.grad(loss * 3.0, x, retain_graph=True)
    (second,) = torch.autograd.grad(loss * 3.0, x)
    torch.testing.assert_close(first, second)


@pytest.fixture
def launches(monkeypatch):
    """``(kernel name, its constexpr arguments)`` of every planned launch from now on."""
    from triton_workshop import runtime

    seen = []
    real_launch = runtime.registry.launch_kernel

    def spy(kernel, grid, tensors, scalars, consts, prepared):
        seen.append((getattr(kernel, "fn", kernel).__name__, dict(consts)))
        return real_launch(kernel, grid, tensors, scalars, consts, prepared)

    monkeypatch.setattr(runtime.registry, "launch_kernel", spy)
    return seen


@pytest.mark.parametrize("grad_in_forward", [True, False], ids=["in_forward", "default"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cross_entropy_gradient_made_in_the_forward(launches, monkeypatch, dtype,
                                                    grad_in_forward):
    """Eager autograd with fp32/bf16 logits: the forward writes the gradient (into a new
    tensor: the logits are never written) and the backward only scales it, in place; fp16
    keeps the recomputing backward (its range cannot hold an unscaled mean's gradient), as
    every dtype does with ``grad_in_forward`` tuned off, and no gradient is made where none
    is wanted."""
    monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
        ce_ops.TUNING, grad_in_forward=grad_in_forward))
    x = _randn(5, 300, dtype=dtype, scale=2.0).requires_grad_()
    before = x.detach().clone()
    target = _targets(5, 300, ignored=[2])
    for _ in range(2):  # the first call and a kept signature
        launches.clear()
        _ce_grad_check(x, target, label_smoothing=0.1)
        # A kept signature's mean may be reduced by a kernel of its own: not a pass over rows.
        fwd, bwd = [launch for launch in launches if launch[0] != "cross_entropy_reduce_kernel"]
        assert fwd[0] == "cross_entropy_fwd_kernel" and bwd[0] == "cross_entropy_bwd_kernel"
        made_in_forward = grad_in_forward and dtype != torch.float16
        assert fwd[1]["COMPUTE_GRAD"] == made_in_forward and fwd[1]["MEAN"] == made_in_forward
        assert bwd[1]["FROM_GRAD"] == made_in_forward
        assert bwd[1]["IN_PLACE"] == made_in_forward and not bwd[1]["APPLIED"]
        assert torch.equal(x.detach(), before)
    launches.clear()
    with torch.no_grad():
        cross_entropy(x, target)
    cross_entropy(x.detach(), target)
    rows = [(name, consts) for name, consts in launches if name != "cross_entropy_reduce_kernel"]
    assert [name for name, _ in rows] == ["cross_entropy_fwd_kernel"] * 2
    assert all(not consts["COMPUTE_GRAD"] for _, consts in rows), launches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_incoming_gradients(dtype, reduction, either_backward):
    """The stored gradient times every kind of incoming gradient: exactly 1 (the pass skips the
    rows), another scalar, per-row values with 1s, 0s and others among them, and the expanded
    ones of a sum (stride 0)."""
    x = _randn(7, 90, dtype=dtype, scale=3.0).requires_grad_()
    target = _targets(7, 90, ignored=[3])
    x64 = x.detach().double().requires_grad_()
    if reduction == "none":
        incoming = [torch.tensor([1.0, 0.0, 2.5, 1.0, -1.0, 1.0, 0.5]), torch.ones(7),
                    torch.ones(()).expand(7)]
    else:
        incoming = [torch.ones(()), torch.tensor(-0.75)]
    for dy in incoming:
        loss = cross_entropy(x, target, reduction=reduction, label_smoothing=0.05)
        ref = F.cross_entropy(x64, target, reduction=reduction, label_smoothing=0.05)
        dy = dy.to(DEVICE, loss.dtype)
        (dx,) = torch.autograd.grad(loss, x, dy)
        (ref_dx,) = torch.autograd.grad(ref, x64, dy.double())
        _assert_close(dx, ref_dx, dtype, scale=2.0)
        assert torch.all(dx[3] == 0)


def test_cross_entropy_backward_over_a_retained_graph(gradient_made_in_forward):
    """The first backward scales the stored gradient in place and hands it out; later ones make
    new tensors, from the scale the first applied: right for any incoming gradient that left
    the rows recoverable, NaN in the rows that a 0 wiped, and the first result left alone."""
    x = _randn(6, 50, scale=2.0).requires_grad_()
    target = _targets(6, 50, ignored=[4])
    x64 = x.detach().double().requires_grad_()

    def reference(dy):
        ref = F.cross_entropy(x64, target, reduction="none", label_smoothing=0.1)
        return torch.autograd.grad(ref, x64, dy.double())[0]

    loss = cross_entropy(x, target, reduction="none", label_smoothing=0.1)
    dy1 = torch.tensor([3.0, 1.0, 0.0, -2.0, 5.0, 1.0], device=DEVICE)
    (first,) = torch.autograd.grad(loss, x, dy1, retain_graph=True)
    kept = first.clone()
    dy2 = torch.tensor([2.0, 1.0, 4.0, 0.5, 1.0, 0.0], device=DEVICE)
    (second,) = torch.autograd.grad(loss, x, dy2, retain_graph=True)
    assert torch.equal(first, kept)
    _assert_close(first, reference(dy1), torch.float32)
    wiped = second[2]
    assert wiped.isnan().all()  # dy1 was 0 there: nothing left to scale
    rows = [0, 1, 3, 4, 5]
    _assert_close(second[rows], reference(dy2)[rows], torch.float32)
    (third,) = torch.autograd.grad(loss, x, dy1)  # the first scale again: exact
    assert torch.equal(third, kept)


def test_cross_entropy_retained_graph_refuses_changed_state(gradient_made_in_forward):
    """What a second backward reads, changed in place in between, is refused, not used: the
    incoming gradient of the first, and the gradient it handed out."""
    x = _randn(4, 30).requires_grad_()
    target = _targets(4, 30)
    loss = cross_entropy(x, target, reduction="sum")
    dy = torch.tensor(2.0, device=DEVICE)
    torch.autograd.grad(loss, x, dy, retain_graph=True)
    dy.mul_(3.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        torch.autograd.grad(loss, x, dy, retain_graph=True)
    loss = cross_entropy(x, target, reduction="sum")
    (first,) = torch.autograd.grad(loss, x, retain_graph=True)
    first.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, x)


def test_cross_entropy_create_graph_then_double_backward_raises(either_backward):
    """A backward that builds a graph works (out of place); differentiating it again is not
    supported and says so."""
    x = _randn(4, 20).requires_grad_()
    target = _targets(4, 20, ignored=[1])
    x64 = x.detach().double().requires_grad_()
    for reduction in REDUCTIONS:
        loss = cross_entropy(x, target, reduction=reduction)
        (dx,) = torch.autograd.grad(loss.sum(), x, create_graph=True)
        ref = F.cross_entropy(x64, target, reduction=reduction).sum()
        _assert_close(dx, torch.autograd.grad(ref, x64)[0], torch.float32)
        assert dx.requires_grad
        with pytest.raises(RuntimeError, match="no autograd formula"):
            dx.sum().backward()


def test_plans_are_kept_apart_by_dtype(monkeypatch):
    """A plan keeps its compiled launch (``prepared``): logits of another dtype at the same shape
    must get another plan, or a GPU would run the fp32 kernel over fp16 memory."""
    from triton_workshop import runtime

    seen = {}
    real_launch = runtime.registry.launch_kernel

    def spy(kernel, grid, tensors, scalars, consts, prepared):
        seen.setdefault(id(prepared), set()).add(tensors[0].dtype)
        return real_launch(kernel, grid, tensors, scalars, consts, prepared)

    monkeypatch.setattr(runtime.registry, "launch_kernel", spy)
    target = _targets(3, 9)
    for dtype in DTYPES:
        x = _randn(3, 9, dtype=dtype).requires_grad_()
        _ce_grad_check(x, target)
    assert len(seen) == 2 * len(DTYPES) and all(len(d) == 1 for d in seen.values())


def test_cross_entropy_torch_compile():
    def f(x, target):
        return cross_entropy(x * 2.0, target, label_smoothing=0.1) + \
            cross_entropy(x, target, reduction="none").sum()

    x = _randn(6, 50).requires_grad_()
    target = _targets(6, 50, ignored=[1])
    out = torch.compile(f, fullgraph=True)(x, target)
    (dx,) = torch.autograd.grad(out, x)
    ref = f(x, target)
    (ref_dx,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, ref_dx)


def test_cross_entropy_autocast():
    """Under autocast F.cross_entropy returns fp32 (torch's fp32 lists); so does this op, from
    the half-precision logits without an fp32 copy, and the gradient stays in their dtype. On
    CUDA torch's own loss has bf16 roundings in it (about 4e-4 relative): compared with float64,
    this op's is the closer."""
    device_type = "cuda" if DEVICE.type == "cuda" else "cpu"
    x = _randn(5, 70, dtype=torch.bfloat16).requires_grad_()
    target = _targets(5, 70)
    with torch.autocast(device_type, dtype=torch.bfloat16):
        loss = cross_entropy(x, target)
        ref = F.cross_entropy(x, target)
    assert loss.dtype == ref.dtype == torch.float32
    x64 = x.detach().double().requires_grad_()
    ref64 = F.cross_entropy(x64, target)
    torch.testing.assert_close(loss.double(), ref64, rtol=1e-6, atol=1e-6)
    assert (loss.double() - ref64).abs() <= (ref.double() - ref64).abs() + 1e-6
    (dx,) = torch.autograd.grad(loss, x)
    (ref_dx,) = torch.autograd.grad(ref, x)
    assert dx.dtype == torch.bfloat16
    torch.testing.assert_close(dx.float(), ref_dx.float(), rtol=2e-2, atol=1e-3)
    _assert_close(dx, torch.autograd.grad(ref64, x64)[0], torch.bfloat16)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cross_entropy_loss_dtype(dtype, reduction):
    """``dtype=torch.float32`` on half-precision logits: F.cross_entropy(x.float()) (the loss in
    fp32, as transformers' causal-LM loss makes it), eagerly (twice: the kept signature too) and
    compiled; the gradient in x's dtype. A dtype that is not a float dtype is refused."""
    x = _randn(9, 300, dtype=dtype, scale=4.0).requires_grad_()
    target = _targets(9, 300, ignored=[2])
    x64 = x.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, target, reduction=reduction)
    dy = _randn(*ref.shape, dtype=torch.float64, seed=5)
    (ref_dx,) = torch.autograd.grad(ref, x64, dy)
    eager = lambda x: cross_entropy(x, target, reduction=reduction, dtype=torch.float32)  # noqa
    for f in (eager, eager, torch.compile(eager, fullgraph=True)):
        loss = f(x)
        assert loss.dtype == torch.float32
        _assert_close(loss, ref, torch.float32)
        (dx,) = torch.autograd.grad(loss, x, dy.float())
        assert dx.dtype == dtype
        _assert_close(dx, ref_dx, dtype, scale=2.0)
    with pytest.raises(TypeError, match="dtype must be None or one of"):
        cross_entropy(x, target, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype must be None or one of"):
        cross_entropy(x, target, dtype="float32")


# --------------------------------------------------------------------------------------------
# linear_cross_entropy
# --------------------------------------------------------------------------------------------
def _linear_inputs(n, hidden, vocab, dtype, *, bias=True, seed=0):
    x = _randn(n, hidden, dtype=dtype, seed=seed).requires_grad_()
    w = _randn(vocab, hidden, dtype=dtype, seed=seed + 1, scale=hidden ** -0.5).requires_grad_()
    b = _randn(vocab, dtype=dtype, seed=seed + 2).requires_grad_() if bias else None
    return x, w, b


def _linear_check(x, w, target, b=None, *, dy_seed=7, grad_scale=4.0, ref_dtype=torch.float64,
                  **kwargs):
    """linear_cross_entropy and its gradients against the reference of the same operands in
    ``ref_dtype``: float64 (what each dtype's rounding is measured against), or None for torch's
    own ``F.cross_entropy(F.linear(...).float())`` in the operands' dtype."""
    leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]
    loss = linear_cross_entropy(x, w, target, b, **kwargs)
    assert loss.dtype == torch.float32
    as64 = [t.detach().to(ref_dtype or t.dtype).requires_grad_(t.requires_grad)
            if t is not None else None for t in (x, w, b)]
    logits = F.linear(as64[0].reshape(-1, x.shape[-1]), as64[1], as64[2])
    ref = F.cross_entropy(logits if ref_dtype else logits.float(), target.reshape(-1), **kwargs)
    if kwargs.get("reduction") == "none":
        ref = ref.view(target.shape)
    assert loss.shape == ref.shape
    _assert_close(loss, ref.double(), x.dtype)
    if not leaves:
        return loss, []
    dy = _randn(*ref.shape, dtype=torch.float64, seed=dy_seed)
    grads = torch.autograd.grad(loss, leaves, dy.float())
    ref_grads = torch.autograd.grad(ref, [t for t in as64 if t is not None and t.requires_grad],
                                    dy.float().to(ref.dtype))
    for t, g, r in zip(leaves, grads, ref_grads):
        assert g.dtype == t.dtype and g.shape == t.shape
        _assert_close(g, r.double(), t.dtype, scale=grad_scale)
    return loss, grads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("vocab", [1, 7, 64, 1000])
def test_linear_values_and_grads(linear_path, vocab, dtype):
    # 11 tokens: with the chunked paths' 4-token chunks the last is ragged; "vocab_blocks" cuts
    # 64 classes of fp32 in 3 blocks of 22 (the last of 20), of fp16/bf16 in 2 of 32.
    if INTERPRET and linear_path == "vocab_blocks" and vocab == 1000:
        pytest.skip("42 interpreted blocks a chunk; 64 classes already cross blocks")
    x, w, b = _linear_inputs(11, 16, vocab, dtype)
    _linear_check(x, w, _targets(11, vocab, ignored=[3]), b)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear_reductions_and_smoothing(linear_path, reduction):
    x, w, b = _linear_inputs(10, 12, 50, torch.float32)
    target = _targets(10, 50, ignored=[0, 9])
    _, (dx, dw, db) = _linear_check(x, w, target, b, reduction=reduction, label_smoothing=0.15)
    assert torch.all(dx[[0, 9]] == 0)


def test_linear_chunks_cover_every_token(monkeypatch):
    """Chunks of whole rows, 1, 2, 4 and 8 tokens over 13 tokens (one ragged chunk each), give
    the same result as one chunk, whatever the reduction."""
    x, w, b = _linear_inputs(13, 8, 30, torch.float32)
    for reduction in REDUCTIONS:
        target = _targets(13, 30, ignored=[12])
        for rows in (1, 2, 4, 8):
            monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
                ce_ops.TUNING, logits_chunk_bytes=rows * 30 * 4 + 3, min_chunk_rows=1))
            assert chunk_rows(30, 4) == rows
            assert chunk_plan(13, 30, 4) == ChunkPlan(rows, 30, 1, rows * 30 * 4)
            _linear_check(x, w, target, b, reduction=reduction)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear_vocab_blocks_cover_every_class(monkeypatch, reduction, dtype):
    """13 tokens in chunks of 3, 4 or 8 (a ragged last chunk), each cut into vocabulary blocks
    of 30 classes (5 of 6, 4 of 8 with a ragged last, 2 of 15), with ignored rows, label
    smoothing and a bias: values and gradients against float64 in every dtype, whatever the
    reduction. The plan is what :func:`chunk_plan` promises: ``rows x cols`` within the budget,
    as few blocks as that allows, covering the vocabulary with a last one that is not empty."""
    x, w, b = _linear_inputs(13, 8, 30, dtype, seed=3)
    target = _targets(13, 30, ignored=[0, 6, 12])
    size = dtype.itemsize
    for rows, cols in ((4, 7), (8, 8), (3, 16)):
        budget = rows * cols * size
        monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
            ce_ops.TUNING, chunk_cols=16, logits_chunk_bytes=budget, max_chunk_rows=rows,
            min_chunk_rows=rows))
        plan = chunk_plan(13, 30, size)
        assert plan.rows == rows and plan.rows * plan.cols * size <= budget
        assert plan.blocks == -(-30 // plan.cols) and (plan.blocks - 1) * plan.cols < 30
        # As few blocks as the budget allows, evened out.
        assert plan.blocks == -(-30 // min(30, budget // size // plan.rows))
        _linear_check(x, w, target, b, reduction=reduction, label_smoothing=0.1)


def test_linear_vocab_blocks_launches(monkeypatch, launches):
    """A chunk in blocks: the loss pass launches one kernel a block, first to last (the first
    writes each row's running logsumexp, the others merge into it, the last finishes the loss
    and, for a gradient, turns its own logits into it); the gradient pass recomputes every
    block but that last one. reduction="none" recomputes every block in its backward, scaled by
    the incoming gradient of each row; no gradient wanted, no gradient pass."""
    monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
        ce_ops.TUNING, logits_chunk_bytes=4 * 10 * 4, max_chunk_rows=4, min_chunk_rows=4))
    x, w, b = _linear_inputs(10, 8, 30, torch.float32)
    target = _targets(10, 30, ignored=[1])
    assert chunk_plan(10, 30, 4) == ChunkPlan(4, 10, 3, 4 * 10 * 4)  # 3 chunks (4, 4, 2 rows)

    def forward_flags():
        return [(c["FIRST"], c["LAST"], c["COMPUTE_GRAD"], c["MEAN"]) for name, c in launches
                if name == "linear_ce_block_fwd_kernel"]

    def grads():
        return [c["SCALE_BY"] for name, c in launches if name == "linear_ce_block_grad_kernel"]

    _linear_check(x, w, target, b)
    assert forward_flags() == [(True, False, False, False), (False, False, False, False),
                               (False, True, True, True)] * 3
    assert grads() == [1] * 2 * 3  # two recomputed blocks a chunk, scaled by 1 / count
    launches.clear()
    _linear_check(x, w, target, b, reduction="sum")
    assert grads() == [0] * 2 * 3
    launches.clear()
    _linear_check(x, w, target, b, reduction="none")
    assert forward_flags() == [(True, False, False, False), (False, False, False, False),
                               (False, True, False, False)] * 3
    assert grads() == [2] * 3 * 3
    launches.clear()
    with torch.no_grad():
        linear_cross_entropy(x, w, target, b)
    assert [name for name, _ in launches] == ["linear_ce_block_fwd_kernel"] * 3 * 3


#: The size the fused op is measured at (docs/kernels/cross_entropy.md): 8192 tokens, hidden
#: 2048, Llama 3's vocabulary, bf16; Liger-Kernel's peak there, above the inputs, on an H100.
HEADLINE = dict(n_tokens=8192, hidden=2048, n_vocab=128256)
LIGER_PEAK_MIB = 597


def test_linear_plan_at_the_headline_size():
    """The default plan at 8192 x 2048 x 128256: 512 tokens a chunk, the vocabulary in 2 blocks
    of 64128 classes: 62.6 MiB of bf16 logits, as much as Liger-Kernel's chunk of 256 whole
    rows. With grad_weight (501 MiB) and grad_input (32 MiB) the estimated peak is 595.7 MiB,
    within Liger-Kernel's measured 597. fp32 inputs take chunks of fp32 logits in 4 blocks
    within the same bytes."""
    n, hidden, vocab = HEADLINE.values()
    plan = chunk_plan(n, vocab, 2)
    assert plan == ChunkPlan(rows=512, cols=64128, blocks=2, chunk_bytes=512 * 64128 * 2)
    assert plan.rows >= 256 and plan.chunk_bytes <= 256 * vocab * 2
    assert chunk_rows(vocab, 2) == 512
    peak = estimated_peak_bytes(n, hidden, vocab, torch.bfloat16)
    assert peak == (vocab + n) * hidden * 2 + plan.chunk_bytes + 2 * n * 4
    assert peak / 2**20 <= LIGER_PEAK_MIB
    assert estimated_peak_bytes(n, hidden, vocab, torch.bfloat16, bias=True) == \
        peak + (vocab + plan.cols) * 4
    assert chunk_plan(n, vocab, 4) == ChunkPlan(512, 32064, 4, 512 * 32064 * 4)
    # A few tokens fit whole rows in one chunk; a few hundred take one chunk in blocks.
    assert chunk_plan(200, vocab, 2) == ChunkPlan(200, vocab, 1, 200 * vocab * 2)
    assert chunk_plan(300, vocab, 2) == ChunkPlan(300, 64128, 2, 300 * 64128 * 2)
    # Small vocabularies keep whole rows: GPT-2's 50257 at 512 tokens a chunk.
    assert chunk_plan(n, 50257, 2) == ChunkPlan(512, 50257, 1, 512 * 50257 * 2)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear_all_targets_ignored(reduction):
    x, w, b = _linear_inputs(5, 8, 20, torch.float32)
    loss, grads = _linear_check(x, w, _targets(5, 20, ignored=range(5)), b, reduction=reduction,
                                label_smoothing=0.1)
    assert loss.isnan().item() if reduction == "mean" else torch.all(loss == 0)
    assert all(torch.all(g == 0) for g in grads)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear_no_tokens(reduction):
    x, w, b = _linear_inputs(0, 8, 20, torch.float32)
    loss = linear_cross_entropy(x, w, torch.empty(0, dtype=torch.int64, device=DEVICE), b,
                                reduction=reduction)
    ref = F.cross_entropy(F.linear(x, w, b).float(),
                          torch.empty(0, dtype=torch.int64, device=DEVICE), reduction=reduction)
    torch.testing.assert_close(loss, ref, equal_nan=True)
    dx, dw, db = torch.autograd.grad(loss.sum(), (x, w, b))
    assert dx.shape == (0, 8) and torch.all(dw == 0) and torch.all(db == 0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear_batched_input(linear_path, reduction):
    """(B, T, H) input and (B, T) target: the tokens flattened; "none" keeps target's shape."""
    x, w, b = _linear_inputs(2 * 5, 12, 40, torch.float32)
    x = x.detach().view(2, 5, 12).requires_grad_()
    target = _targets(10, 40, ignored=[4]).view(2, 5)
    loss, _ = _linear_check(x, w, target, b, reduction=reduction)
    if reduction == "none":
        assert loss.shape == (2, 5)


def test_linear_strided_operands(linear_path, in_nan_storage):
    values = _randn(9, 24)
    x = in_nan_storage(values, transpose=True).requires_grad_()
    w = in_nan_storage(_randn(33, 24, seed=3, scale=0.2)).requires_grad_()
    target = _targets(18, 33, ignored=[4])[::2]  # a strided target
    _linear_check(x, w, target, reduction="none", label_smoothing=0.05)
    _linear_check(x, w, target)


@pytest.mark.parametrize("need", ["input", "weight", "bias", "no_bias"])
def test_linear_partial_grads(linear_path, need):
    x, w, b = _linear_inputs(7, 10, 30, torch.float32, bias=need != "no_bias")
    for name, t in (("input", x), ("weight", w), ("bias", b)):
        if t is not None and need not in (name, "no_bias"):
            t.requires_grad_(False)
    for reduction in REDUCTIONS:
        _linear_check(x, w, _targets(7, 30, ignored=[2]), b, reduction=reduction)


def test_linear_none_reduction_recomputes_in_backward(monkeypatch):
    """reduction="none": a per-row incoming gradient must scale each row before the rows are
    summed into grad_weight, so the backward recomputes the chunks; mean/sum keep the gradients
    made in the forward (no recomputation)."""
    calls = []
    backward = ce_ops.linear_cross_entropy_backward
    monkeypatch.setattr(ce_ops, "linear_cross_entropy_backward",
                        lambda *a: calls.append(1) or backward(*a))
    x, w, b = _linear_inputs(6, 8, 25, torch.float32)
    target = _targets(6, 25)
    _linear_check(x, w, target, b, reduction="none", dy_seed=11)
    assert calls == [1]
    _linear_check(x, w, target, b, reduction="sum")
    assert calls == [1]


def test_linear_no_grad_computes_the_loss_only(monkeypatch):
    wanted = []
    new_grads = ce_ops.linear.new_grads

    def spy(x, w, b, need):
        wanted.append(tuple(need))
        return new_grads(x, w, b, need)

    monkeypatch.setattr(ce_ops.linear, "new_grads", spy)
    x, w, b = _linear_inputs(6, 8, 25, torch.float32)
    target = _targets(6, 25)
    with torch.no_grad():
        loss = linear_cross_entropy(x, w, target, b)
    assert not loss.requires_grad
    assert wanted == [(False, False, False)]
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(x, w, b), target))
    with torch.inference_mode():
        linear_cross_entropy(x, w, target, b, reduction="none")
    assert wanted[-1] == (False, False, False)


def test_linear_retain_graph_twice():
    """The gradients made in the forward are scaled out of place: a second backward over a
    retained graph gives the same gradients."""
    x, w, b = _linear_inputs(6, 8, 25, torch.float32)
    loss = linear_cross_entropy(x, w, _targets(6, 25), b)
    first = torch.autograd.grad(loss * 2.0, (x, w, b), retain_graph=True)
    second = torch.autograd.grad(loss * 2.0, (x, w, b))
    for a, c in zip(first, second):
        torch.testing.assert_close(a, c)


def test_linear_backward_over_a_retained_graph():
    """The first backward scales the forward's gradients in place and hands them out; later
    ones make new tensors from the scale the first applied, each gradient on its own (one
    asked for in the first backward only, another in the second only)."""
    x, w, b = _linear_inputs(6, 8, 25, torch.float32)
    target = _targets(6, 25, ignored=[2])
    loss = linear_cross_entropy(x, w, target, b, label_smoothing=0.1)
    (first_x,) = torch.autograd.grad(loss * 3.0, x, retain_graph=True)
    kept = first_x.clone()
    second = torch.autograd.grad(loss * -2.0, (x, w, b), retain_graph=True)
    third = torch.autograd.grad(loss * 3.0, (x, w, b))
    assert torch.equal(first_x, kept)
    assert torch.equal(third[0], kept)
    for g2, g3 in zip(second, third):
        torch.testing.assert_close(g2, g3 * (-2.0 / 3.0))
    _linear_check(x, w, target, b, label_smoothing=0.1)


def test_linear_retained_graph_refuses_a_changed_incoming_gradient():
    x, w, b = _linear_inputs(5, 8, 20, torch.float32)
    loss = linear_cross_entropy(x, w, _targets(5, 20), b, reduction="sum")
    dy = torch.tensor(2.0, device=DEVICE)
    torch.autograd.grad(loss, (x, w), dy, retain_graph=True)
    dy.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        torch.autograd.grad(loss, (x, w), dy)


def test_linear_create_graph_then_double_backward_raises():
    """A backward that builds a graph gives the right gradients; differentiating them again is
    refused (the second derivative is not implemented), not silently dropped."""
    x, w, b = _linear_inputs(5, 8, 20, torch.float32)
    target = _targets(5, 20, ignored=[0])
    loss = linear_cross_entropy(x, w, target, b)
    grads = torch.autograd.grad(loss, (x, w, b), create_graph=True)
    ref = F.cross_entropy(F.linear(x, w, b), target)
    for g, r in zip(grads, torch.autograd.grad(ref, (x, w, b))):
        torch.testing.assert_close(g, r)
    assert grads[0].requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        grads[0].square().sum().backward()


def test_linear_torch_compile(linear_path):
    def f(x, w, b, target):
        return linear_cross_entropy(x, w, target, b, label_smoothing=0.1) + \
            linear_cross_entropy(x, w, target, reduction="none").square().sum()

    x, w, b = _linear_inputs(9, 8, 30, torch.float32)
    target = _targets(9, 30, ignored=[5])
    out = torch.compile(f, fullgraph=True)(x, w, b, target)
    grads = torch.autograd.grad(out, (x, w, b))
    ref = f(x, w, b, target)
    ref_grads = torch.autograd.grad(ref, (x, w, b))
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_linear_autocast():
    """Under autocast the product runs in the autocast dtype (as F.linear's) and the loss in
    fp32; gradients reach the fp32 parameters in fp32."""
    device_type = "cuda" if DEVICE.type == "cuda" else "cpu"
    x, w, b = _linear_inputs(8, 16, 40, torch.float32)
    target = _targets(8, 40, ignored=[1])
    with torch.autocast(device_type, dtype=torch.bfloat16):
        loss = linear_cross_entropy(x, w, target, b, label_smoothing=0.1)
        ref = F.cross_entropy(F.linear(x, w, b).float(), target, label_smoothing=0.1)
    assert loss.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
    grads = torch.autograd.grad(loss, (x, w, b))
    ref_grads = torch.autograd.grad(ref, (x, w, b))
    for g, r in zip(grads, ref_grads):
        assert g.dtype == torch.float32
        _assert_close(g, r.double(), torch.bfloat16, scale=2.0)



# --------------------------------------------------------------------------------------------
# Memory, counted on the CPU: what forward + backward hold at once beyond their inputs.
# --------------------------------------------------------------------------------------------
@pytest.fixture
def collected_launches(monkeypatch):
    """Each planned launch followed by a garbage collection: Triton's interpreter leaves its
    host copies of a launch's tensors (sharing their memory) in reference cycles, so a tensor
    the code has dropped would otherwise be counted as held until the collector runs; on a GPU
    nothing holds them."""
    import gc

    from triton_workshop import runtime

    real_launch = runtime.registry.launch_kernel

    def launch_then_collect(*args):
        real_launch(*args)
        gc.collect()

    monkeypatch.setattr(runtime.registry, "launch_kernel", launch_then_collect)


def _peak_bytes(fn) -> int:
    """The most bytes of tensors that ``fn()`` held at once beyond those that existed before:
    torch's profiler sees every allocation and free of the CPU allocator, each with its size,
    in order."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    stack, sizes = list(prof.profiler.kineto_results.experimental_event_tree()), []
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.typed[0] == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.typed[1].alloc_size))
    held = peak = 0
    for _, size in sorted(sizes, key=lambda s: s[0]):
        held += size
        peak = max(peak, held)
    return peak


cpu_only = pytest.mark.skipif(not INTERPRET, reason="counted on the CPU; on a GPU the peak "
                              "memory tests below read the CUDA allocator")


@cpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_memory_is_one_gradient(collected_launches, dtype, reduction):
    """Forward + backward hold the N x V gradient and a few N-sized vectors, nothing more: no
    fp32 copy of the logits, no second N x V buffer for scaling the gradient."""
    n, vocab = 32, 2048
    x = _randn(n, vocab, dtype=dtype).requires_grad_()
    target = _targets(n, vocab, ignored=[3])
    cross_entropy(x, target, reduction=reduction)  # plans and compiles outside the count

    def step():
        loss = cross_entropy(x, target, reduction=reduction)
        dy = torch.full_like(loss, 0.5)  # not 1: the gradient is scaled
        return torch.autograd.grad(loss, x, dy)

    budget = n * vocab * x.element_size() + 16 * 1024
    assert _peak_bytes(step) <= budget


@cpu_only
@pytest.mark.parametrize("cut", ["whole_rows", "vocab_blocks"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_memory_is_the_gradients_and_one_chunk(collected_launches, monkeypatch,
                                                     reduction, cut):
    """Forward + backward hold grad_weight, grad_input, grad_bias and one chunk of logits (a
    handful of V-sized vectors besides): the backward scales the forward's gradients in place
    (a scaled copy would hold grad_weight twice), a chunk's logits are their gradient (no second
    buffer), and a chunk's or a block's logits are freed before the next are made: three chunks
    of 16 whole rows, or one chunk of 48 rows in 2 blocks of 512 classes (the second block
    made while the first is freed, the first made again once the second is). For a mean that
    is what :func:`estimated_peak_bytes` counts."""
    n, hidden, vocab, rows = 48, 64, 1024, 16
    monkeypatch.setattr(ce_ops, "TUNING", dataclasses.replace(
        ce_ops.TUNING, logits_chunk_bytes=rows * vocab * 4 if cut == "whole_rows" else
        n * 512 * 4, min_chunk_rows=1 if cut == "whole_rows" else 64))
    plan = chunk_plan(n, vocab, 4)
    assert plan == (ChunkPlan(rows, vocab, 1, rows * vocab * 4) if cut == "whole_rows" else
                    ChunkPlan(n, 512, 2, n * 512 * 4))
    x, w, b = _linear_inputs(n, hidden, vocab, torch.float32)
    target = _targets(n, vocab, ignored=[7])
    linear_cross_entropy(x, w, target, b, reduction=reduction)

    def step():
        loss = linear_cross_entropy(x, w, target, b, reduction=reduction)
        dy = torch.full_like(loss, 0.5)
        return torch.autograd.grad(loss, (x, w, b), dy)

    gradients = (w.numel() + x.numel() + b.numel()) * 4
    budget = gradients + plan.chunk_bytes + 3 * vocab * 4 + 8 * 1024
    peak = _peak_bytes(step)
    assert peak <= budget, (peak, budget)
    assert peak >= gradients + plan.chunk_bytes  # what is counted is what is there
    if reduction == "mean":
        estimate = estimated_peak_bytes(n, hidden, vocab, torch.float32, bias=True)
        assert estimate - 1024 <= peak <= estimate + 1024, (peak, estimate)

# --------------------------------------------------------------------------------------------
# Bad input: TypeError / ValueError naming the argument, before anything launches.
# --------------------------------------------------------------------------------------------
def _call(fn, args: dict, change: dict):
    """``fn(**args)`` with ``change`` applied, tensors on DEVICE (sparse ones as they are), to
    call later."""
    args = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) and not v.is_sparse else v
            for k, v in {**args, **change}.items()}
    return lambda: fn(**args)


def _ce_call(**change):
    return _call(cross_entropy, dict(input=torch.randn(4, 5), target=torch.tensor([0, 1, 2, 3])),
                 change)


def _linear_call(**change):
    return _call(linear_cross_entropy, dict(input=torch.randn(4, 3), weight=torch.randn(5, 3),
                                            target=torch.tensor([0, 1, 2, 3])), change)


BAD = {
    "input_not_tensor": (_ce_call(input=[[1.0, 2.0]]), TypeError, "input must be a torch.Tensor"),
    "input_int": (_ce_call(input=torch.ones(4, 5, dtype=torch.int32)), TypeError, "input"),
    "input_3d": (_ce_call(input=torch.randn(4, 5, 2)), ValueError, "input"),
    "no_classes": (_ce_call(input=torch.randn(4, 0)), ValueError, "input"),
    "target_float": (_ce_call(target=torch.zeros(4)), TypeError, "target"),
    "target_int32": (_ce_call(target=torch.zeros(4, dtype=torch.int32)), TypeError, "target"),
    "target_shape": (_ce_call(target=torch.zeros(3, dtype=torch.int64)), ValueError, "target"),
    "ignore_index_float": (_ce_call(ignore_index=-100.0), TypeError, "ignore_index"),
    "ignore_index_bool": (_ce_call(ignore_index=True), TypeError, "ignore_index"),
    "reduction_unknown": (_ce_call(reduction="avg"), ValueError, "reduction"),
    "reduction_none_object": (_ce_call(reduction=None), TypeError, "reduction"),
    "smoothing_negative": (_ce_call(label_smoothing=-0.1), ValueError, "label_smoothing"),
    "smoothing_above_1": (_ce_call(label_smoothing=1.5), ValueError, "label_smoothing"),
    "smoothing_str": (_ce_call(label_smoothing="0.1"), TypeError, "label_smoothing"),
    "input_sparse": (_ce_call(input=torch.randn(4, 5).to_sparse()), TypeError, "input"),
    "input_nested": (
        _ce_call(input=torch.nested.nested_tensor([torch.randn(2, 5)], layout=torch.jagged)),
        TypeError, "input"),
    "linear_weight_1d": (_linear_call(weight=torch.randn(5)), ValueError, "weight"),
    "linear_in_features": (_linear_call(weight=torch.randn(5, 4)), ValueError, "in_features"),
    "linear_no_classes": (_linear_call(weight=torch.randn(0, 3)), ValueError, "weight"),
    "linear_dtype_mix": (_linear_call(weight=torch.randn(5, 3, dtype=torch.float16)),
                         TypeError, "weight"),
    "linear_bias_shape": (_linear_call(bias=torch.randn(4)), ValueError, "bias"),
    "linear_bias_dtype": (_linear_call(bias=torch.randn(5, dtype=torch.bfloat16)),
                          TypeError, "bias"),
    "linear_scalar_input": (_linear_call(input=torch.tensor(1.0)), ValueError, "input"),
    "linear_target_shape": (_linear_call(target=torch.zeros(2, 2, dtype=torch.int64)),
                            ValueError, "target"),
    "linear_target_float": (_linear_call(target=torch.zeros(4)), TypeError, "target"),
    "linear_reduction": (_linear_call(reduction="batchmean"), ValueError, "reduction"),
    "linear_smoothing": (_linear_call(label_smoothing=2.0), ValueError, "label_smoothing"),
    "linear_ignore_index": (_linear_call(ignore_index="x"), TypeError, "ignore_index"),
    "linear_weight_sparse": (_linear_call(weight=torch.randn(5, 3).to_sparse()),
                             TypeError, "weight"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs(name, planned_launches):
    call, error, match = BAD[name]
    with pytest.raises(error, match=match):
        call()
    assert planned_launches == []


@gpu_only
def test_tensors_on_different_devices_are_rejected():
    x = torch.randn(4, 5, device="cuda")
    with pytest.raises(ValueError, match="target"):
        cross_entropy(x, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="weight"):
        linear_cross_entropy(torch.randn(4, 3, device="cuda"), torch.randn(5, 3),
                             torch.zeros(4, dtype=torch.int64, device="cuda"))


# --------------------------------------------------------------------------------------------
# GPU: a 128k vocabulary, and the memory it takes.
# --------------------------------------------------------------------------------------------
VOCAB = 128256


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cross_entropy_large_vocabulary(dtype):
    x = _randn(64, VOCAB, dtype=dtype, scale=2.0).requires_grad_()
    _ce_grad_check(x, _targets(64, VOCAB, ignored=[5]), label_smoothing=0.1)


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_large_vocabulary(dtype):
    """fp32 against float64. fp16 and bf16: each gradient no further from float64 than twice
    torch's own pair in that dtype (``F.cross_entropy(F.linear(...).float())``), plus the
    dtype's tolerance. A mean over 2047 tokens of 128256 classes makes d(loss)/d(logits) ~4e-9,
    below fp16's smallest subnormal: which of those terms survive depends on where each
    implementation rounds (torch's pair rounds them all to 0 before its product; on an H100 the
    kernel's fp16 input gradient differed from that pair's by up to 2.7e-6, 15% of its elements
    beyond fp16's tolerance), so the same dtype's result is no reference; float64 is, and
    torch's own distance from it sets the bound."""
    x, w, b = _linear_inputs(2048, 64, VOCAB, dtype)
    target = _targets(2048, VOCAB, ignored=[5])
    if dtype == torch.float32:
        _linear_check(x, w, target, b, grad_scale=8.0)
        return
    loss = linear_cross_entropy(x, w, target, b)
    grads = torch.autograd.grad(loss, (x, w, b))

    def torch_loss(ref_dtype):
        leaves = [t.detach().to(ref_dtype).requires_grad_() for t in (x, w, b)]
        logits = F.linear(*leaves)
        out = F.cross_entropy(logits if ref_dtype == torch.float64 else logits.float(), target)
        return out, torch.autograd.grad(out, leaves)

    loss64, grads64 = torch_loss(torch.float64)
    _, torch_grads = torch_loss(dtype)
    _assert_close(loss, loss64, dtype)
    rtol, atol = TOLERANCES[dtype]
    for name, g, g64, gt in zip(("x", "weight", "bias"), grads, grads64, torch_grads):
        ours = (g.double() - g64).abs().max().item()
        torch_error = (gt.double() - g64).abs().max().item()
        assert ours <= 2 * torch_error + atol * g64.abs().max().item(), (name, ours, torch_error)


@gpu_only
@pytest.mark.gpu
def test_cross_entropy_peak_memory():
    """Forward + backward takes the gradient's N x V and not more (made in the forward and
    scaled in place by the backward; no fp32 copy of bf16 logits, no softmax kept)."""
    n = 4096
    x = torch.randn(n, VOCAB, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, VOCAB, (n,), device="cuda")
    grad_bytes = n * VOCAB * x.element_size()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    (dx,) = torch.autograd.grad(cross_entropy(x, target), x)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < grad_bytes + (64 << 20), f"{extra / 2**20:.0f} MiB over the logits"


@pytest.mark.big_memory
@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_peak_memory_is_not_tokens_times_vocabulary(reduction):
    """8192 tokens x 128256 classes would be 4 GiB of fp32 logits; the fused op takes one chunk
    of them (1024 tokens x 32064 classes: 62.6 MiB) and the gradient buffers."""
    n, hidden = 8192, 1024
    x = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(VOCAB, hidden, device="cuda", dtype=torch.bfloat16) * 0.03).requires_grad_()
    target = torch.randint(0, VOCAB, (n,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = linear_cross_entropy(x, w, target, reduction=reduction)
    dx, dw = torch.autograd.grad(loss.sum(), (x, w))
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    logits_fp32 = n * VOCAB * 4
    chunk = chunk_plan(n, VOCAB, 2).chunk_bytes
    # dx and dw (scaled in place by the backward), one chunk of logits, and 64 MiB of change
    # (the loss's small vectors, cuBLAS's workspace: the caching allocator counts it; an H100
    # measured 16 MiB over the buffers alone): well under a quarter of the fp32 logits.
    budget = w.numel() * 2 + x.numel() * 2 + chunk + (64 << 20)
    assert extra < budget < logits_fp32 / 4, (extra / 2**20, budget / 2**20)


# --------------------------------------------------------------------------------------------
# Kept signatures: a repeated eager call computes as the first, and bad arguments still fail.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cross_entropy_kept_signature_repeats(dtype, reduction):
    """Three eager calls of one signature (the first checks and keeps its plans, the others
    take them): each loss and gradient as torch's in float64, an all-ignored mean NaN."""
    x = _randn(6, 50, dtype=dtype, scale=2.0)
    target = _targets(6, 50, ignored=[1, 4])
    ref_x = x.double().requires_grad_()
    ref = F.cross_entropy(ref_x, target, reduction=reduction, label_smoothing=0.1)
    (ref_grad,) = torch.autograd.grad(ref.sum(), ref_x)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    for _ in range(3):
        plain = cross_entropy(x, target, reduction=reduction, label_smoothing=0.1)
        torch.testing.assert_close(plain.double(), ref.detach(), **tol)
        xg = x.clone().requires_grad_()
        loss = cross_entropy(xg, target, reduction=reduction, label_smoothing=0.1)
        torch.testing.assert_close(loss.double(), ref.detach(), **tol)
        (grad,) = torch.autograd.grad(loss.sum() * 1.0, xg)
        torch.testing.assert_close(grad.double(), ref_grad, **tol)
    ignored = torch.full_like(target, -100)
    for _ in range(2):
        assert cross_entropy(x, ignored).isnan()
        assert cross_entropy(x.clone().requires_grad_(), ignored).isnan()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_linear_cross_entropy_kept_signature_repeats(reduction):
    """linear_cross_entropy's kept one-chunk signature, three calls: the loss and the three
    gradients as torch's in float64 each time."""
    x, w, b = _randn(7, 16), _randn(24, 16, scale=0.5), _randn(24)
    target = _targets(7, 24, ignored=[3])
    refs = [t.double().requires_grad_() for t in (x, w, b)]
    ref = F.cross_entropy(F.linear(*refs), target, reduction=reduction, label_smoothing=0.05)
    ref_grads = torch.autograd.grad(ref.sum(), refs)
    for _ in range(3):
        torch.testing.assert_close(
            linear_cross_entropy(x, w, target, b, reduction=reduction,
                                 label_smoothing=0.05).double(), ref.detach())
        args = [t.clone().requires_grad_() for t in (x, w, b)]
        loss = linear_cross_entropy(args[0], args[1], target, args[2], reduction=reduction,
                                    label_smoothing=0.05)
        torch.testing.assert_close(loss.double(), ref.detach())
        grads = torch.autograd.grad(loss.sum(), args)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


def test_kept_signature_still_refuses_bad_arguments():
    """A signature kept from good calls does not let a changed bad argument through: a target
    of another dtype, a label_smoothing out of range, an unknown reduction."""
    x, target = _randn(4, 10), _targets(4, 10)
    w = _randn(10, 8)
    h = _randn(4, 8)
    for _ in range(2):
        cross_entropy(x, target)
        cross_entropy(x.clone().requires_grad_(), target)
        linear_cross_entropy(h, w, target)
    with pytest.raises((TypeError, ValueError), match="target"):
        cross_entropy(x, target.int())
    with pytest.raises((TypeError, ValueError), match="target"):
        cross_entropy(x.clone().requires_grad_(), target.float())
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(x, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(x, target, label_smoothing=-0.1)
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(x, target, reduction="avg")
    with pytest.raises((TypeError, ValueError), match="target"):
        linear_cross_entropy(h, w, target.int())
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_cross_entropy(h, w, target, label_smoothing=2.0)


# --------------------------------------------------------------------------------------------
# linear_cross_entropy's kept one-chunk signature: every repeat right on fresh data.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("wanted", ["all", "weight_only", "input_only"])
def test_linear_kept_signature_repeats(dtype, reduction, with_bias, wanted, launches):
    """A kept one-chunk signature (the first call checks and keeps it, the others take its
    plans): the loss and the gradients asked for against float64 on fresh data every call, the
    gradients not asked for left alone; a mean's count made by the reduction kernel (no
    torch op), before the block kernel divides by it."""
    ce_ops._LINEAR_READY.clear()
    rtol, atol = TOLERANCES[dtype]
    for step in range(3):
        x = _randn(2, 3, 16, dtype=dtype, seed=500 + step)
        weight = _randn(24, 16, dtype=dtype, seed=510 + step)
        bias = _randn(24, dtype=dtype, seed=520 + step) if with_bias else None
        target = _targets(6, 24, seed=530 + step, ignored=[step % 6]).view(2, 3)
        x.requires_grad_(wanted != "weight_only")
        weight.requires_grad_(wanted != "input_only")
        if bias is not None:
            bias.requires_grad_(wanted == "all")
        leaves = [t for t in (x, weight, bias) if t is not None and t.requires_grad]
        refs = [t.detach().double().requires_grad_(t.requires_grad) if t is not None else None
                for t in (x, weight, bias)]
        want = F.cross_entropy(F.linear(*refs).flatten(0, 1), target.flatten(),
                               reduction=reduction)
        launches.clear()
        loss = linear_cross_entropy(x, weight, target, bias, reduction=reduction)
        if step:  # kept: the count (a mean's) by the reduction kernel, before the block kernel
            names = [name for name, _ in launches]
            counts = [c for name, c in launches if name == "cross_entropy_reduce_kernel"
                      and c["COUNT_ONLY"]]
            assert len(counts) == (reduction == "mean")
            assert names[-2:] == ["linear_ce_block_fwd_kernel", "cross_entropy_reduce_kernel"]
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss.double(), want.detach(), rtol=rtol,
                                   atol=atol * want.abs().item())
        (loss * 0.5).backward()
        (want * 0.5).backward()
        for mine, ref in zip((x, weight, bias), refs):
            if mine is None or not mine.requires_grad:
                assert mine is None or mine.grad is None
                continue
            scale = ref.grad.abs().max().item()
            torch.testing.assert_close(mine.grad.double(), ref.grad, rtol=rtol,
                                       atol=2 * atol * scale)
            assert mine.grad.dtype == dtype
        assert leaves
    assert all(ce_ops._LINEAR_READY.values())


def test_linear_kept_mean_of_no_target_is_nan_with_zero_gradients():
    """Every target ignored in a kept signature: the mean is NaN as torch's (0 / 0), and the
    gradients are zero (no row is scaled by the 1 / 0 count)."""
    ce_ops._LINEAR_READY.clear()
    for step in range(3):
        x = _randn(4, 16, seed=540 + step).requires_grad_()
        weight = _randn(8, 16, seed=550 + step).requires_grad_()
        target = _targets(4, 8, ignored=[0, 1, 2, 3])
        loss = linear_cross_entropy(x, weight, target)
        assert torch.isnan(loss)
        loss.backward()
        assert torch.equal(x.grad, torch.zeros_like(x))
        assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_a_kept_linear_signature_still_refuses_a_changed_bad_argument():
    """After a signature is kept, a call that differs in one bad argument is checked again and
    refused, naming it."""
    x, weight, target = _randn(4, 16, seed=560), _randn(8, 16, seed=561), _targets(4, 8)
    for _ in range(2):
        linear_cross_entropy(x, weight, target)
    with pytest.raises(TypeError, match="target"):
        linear_cross_entropy(x, weight, target.int())
    with pytest.raises(ValueError, match="target"):
        linear_cross_entropy(x, weight, target[:3])
    with pytest.raises(TypeError, match="weight"):
        linear_cross_entropy(x, weight.double(), target)
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(x, weight, target, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_cross_entropy(x, weight, target, label_smoothing=2.0)
