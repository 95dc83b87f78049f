"""layer_norm_linear against F.layer_norm -> F.linear in float64: values, gradients, numerics.

References are computed in float64 from the *same rounded* inputs, so the error measured is the
op's own: fp32 statistics and accumulation, the rounding of the normalised rows to the input
dtype, and the one rounding of the output.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop import runtime
from triton_workshop.ops import layer_norm as layer_norm_module
from triton_workshop.ops import matmul as matmul_module
from triton_workshop.ops.layer_norm_linear import layer_norm_linear
from triton_workshop.ops.matmul import tf32_enabled
from triton_workshop.runtime import DEVICE

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative error bounds: Frobenius norm of the error over that of the reference (and 4x that for
# the largest error over the largest |reference|). fp32 with TF32 off is IEEE fp32 throughout;
# fp16/bf16 are dominated by the rounding of the normalised rows and of the output.
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
        if i == 0 and x.shape[-1] == 1:
            # K = 1: dx is 0 in exact arithmetic, the difference of two terms of size
            # rstd * |dxhat| (rstd = eps ** -0.5); on the GPU the rounding of that difference
            # (order of the sums, fused multiply-adds) differs from the interpreter's. Compare
            # with the size of the terms that cancel, not with the 0 they cancel to.
            dxhat = dy.double() @ w.double() * (1.0 if g is None else g.double())
            scale = eps ** -0.5 * dxhat.abs().max().item()
            assert (gr.double() - wr).abs().max().item() <= tol * scale
            continue
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


def test_long_rows_take_layer_norms_chunked_kernel(monkeypatch):
    # Rows longer than layer_norm's single-block limit: chunks merged by Chan's update.
    monkeypatch.setattr(layer_norm_module, "TUNING", dataclasses.replace(
        layer_norm_module.TUNING, single_block_max_cols=2, forward_chunk_cols=16))
    check(*make_inputs((10,), 100, 12, torch.float32, shift=30.0))


# (lead dims, K, N, dtype, which of ln_weight, ln_bias, bias are given, which of the five
# tensors need a gradient, the incoming gradient's layout): repeated calls of one signature
# take the kept eager path.
KEPT_CASES = [
    ("2d", (6,), 16, 8, torch.float32, (True, True, True), (True,) * 5, "contiguous"),
    ("3d-bf16", (2, 3), 32, 12, torch.bfloat16, (True, True, True), (True,) * 5, "contiguous"),
    ("3d-fp16-no-params", (2, 5), 24, 10, torch.float16, (False, False, False),
     (True, False, False, True, False), "contiguous"),
    ("2d-no-ln-bias", (7,), 20, 9, torch.float32, (True, False, True),
     (True, True, False, True, True), "column_major"),
    ("3d-weights-only", (3, 2), 16, 8, torch.float32, (True, True, True),
     (False, True, True, True, True), "expanded"),
    ("3d-x-only", (2, 4), 16, 8, torch.bfloat16, (True, True, False),
     (True, False, False, False, False), "transposed"),
    ("fp64-parameters", (5,), 16, 8, torch.float32, (True, True, True), (True,) * 5,
     "contiguous"),
]


@pytest.mark.parametrize("name, lead, K, N, dtype, given, needs, grad_layout", KEPT_CASES,
                         ids=[c[0] for c in KEPT_CASES])
def test_kept_signature_repeats_right(name, lead, K, N, dtype, given, needs, grad_layout,
                                      monkeypatch):
    """Repeated eager calls of one call signature, each on fresh random values: every call
    after the first launches the plans kept for the signature (and records with the kept
    forward and backward: torch's GEMMs, layer_norm's kept launches), and the values and
    gradients still match float64 torch, whatever the incoming gradient's strides."""
    from triton_workshop.ops import layer_norm_linear as lnl_module

    op = lnl_module.layer_norm_linear_forward
    recorded = []
    real = op.record_planned
    monkeypatch.setattr(op, "record_planned", lambda *args: recorded.append(1) or real(*args))
    for step in range(3):
        x = rand(*lead, K, dtype=dtype, seed=100 + 10 * step, shift=2.0)
        g = rand(K, dtype=dtype, seed=101 + 10 * step, scale=0.3, shift=1.0)
        b = rand(K, dtype=dtype, seed=102 + 10 * step, scale=0.5)
        w = rand(N, K, dtype=dtype, seed=103 + 10 * step, scale=K ** -0.5)
        bias = rand(N, dtype=dtype, seed=104 + 10 * step, scale=0.5)
        if name == "fp64-parameters":
            g, b, bias = g.double(), b.double(), bias.double()
        g, b, bias = (t if keep else None for t, keep in zip((g, b, bias), given))
        tensors = (x, g, b, w, bias)
        # No autograd.
        assert_close(layer_norm_linear(*tensors), reference(*tensors), TOL[dtype])
        # Forward and backward.
        leaves = [t.clone().requires_grad_(need) if t is not None else None
                  for t, need in zip(tensors, needs)]
        out = layer_norm_linear(*leaves)
        refs = [t.double().requires_grad_(need) if t is not None else None
                for t, need in zip(tensors, needs)]
        ref = reference(*refs)
        assert_close(out.detach(), ref.detach(), TOL[dtype])
        dy = rand(*out.shape, dtype=dtype, seed=105 + 10 * step)
        if grad_layout == "column_major":  # (M, N) with M contiguous
            dy = dy.t().contiguous().t()
        elif grad_layout == "transposed":  # leading dims swapped in memory
            dy = dy.transpose(0, 1).contiguous().transpose(0, 1)
        elif grad_layout == "expanded":  # one row for every row: stride 0
            dy = dy[:1].expand(out.shape)
        wanted = [i for i, t in enumerate(leaves) if t is not None and t.requires_grad]
        got = torch.autograd.grad(out, [leaves[i] for i in wanted], dy)
        want = torch.autograd.grad(ref, [refs[i] for i in wanted], dy.double())
        for i, mine, theirs in zip(wanted, got, want):
            assert mine.dtype == tensors[i].dtype and mine.shape == tensors[i].shape
            assert_close(mine, theirs, TOL[dtype])
    # Every call recorded through the kept plans (the signature was kept before it), except on a
    # GPU where K is not a multiple of 16 elements: there the normalised rows and the weight are
    # copied to aligned buffers every call (the general path, nothing kept).
    assert len(recorded) == (3 if runtime.INTERPRET or K % 16 == 0 else 0)


def test_kept_signature_backward_under_autocast():
    """A kept signature's backward run inside an autocast region (its GEMMs would be cast
    there) takes the general gradients, still right: fp32 leaves, the op in bf16."""
    for step in range(3):
        inputs = make_inputs((2, 3), 16, 8, torch.float32)
        inputs = [t + 0.01 * step for t in inputs]
        leaves = [t.clone().requires_grad_() for t in inputs]
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            out = layer_norm_linear(*leaves)
            assert out.dtype == torch.bfloat16
            grads = torch.autograd.grad(out.float().sum(), leaves)
        refs = [t.to(torch.bfloat16).double().requires_grad_() for t in inputs]
        want = torch.autograd.grad(reference(*refs).sum(), refs)
        for leaf, got, ref in zip(leaves, grads, want):
            assert got.dtype == leaf.dtype == torch.float32
            assert_close(got, ref, 3 * TOL[torch.bfloat16])


# ---------------------------------------------------------------------------------------------
# Numerics at any mean: rows far from zero (a residual stream with an offset), constant rows.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [0.0, 1e2, 1e3, 1e4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_error_within_twice_the_unfused_pairs_at_any_mean(dtype, ratio):
    """|mean| / std up to 1e4: the error against float64 is at most twice that of PyTorch's own
    F.linear(F.layer_norm(...)) on the same inputs (plus a rounding floor). The folded epilogue
    form this op once used was off by 0.13-0.38 here (its accumulator cancels)."""
    x, g, b, w, bias = make_inputs((48,), 200, 24, dtype, shift=ratio)
    ref = reference(x, g, b, w, bias)
    ours = (layer_norm_linear(x, g, b, w, bias).double() - ref).abs().max().item()
    pair = F.linear(F.layer_norm(x.cpu().float(), (200,), g.cpu().float(), b.cpu().float()),
                    w.cpu().float(), bias.cpu().float()).to(dtype)
    theirs = (pair.double() - ref.cpu()).abs().max().item()
    floor = 8 * torch.finfo(dtype).eps * ref.abs().max().item()
    assert ours <= max(2 * theirs, floor), (ours, theirs)


def test_constant_rows_give_the_linear_of_the_bias():
    """A constant row normalises to exactly 0, so the output is W @ ln_bias + bias."""
    _, g, b, w, bias = make_inputs((6,), 64, 20, torch.float32)
    x = torch.full((6, 64), 100.7, device=DEVICE)
    expected = F.linear(b[None].expand(6, 64), w, bias)
    torch.testing.assert_close(layer_norm_linear(x, g, b, w, bias), expected, atol=1e-6, rtol=1e-6)


def test_tf32_path(monkeypatch):
    """With TF32 on, the product rounds the normalised rows (values of size std), as the unfused
    PyTorch pair does. The interpreter computes TF32 dots in IEEE fp32, so there this checks the
    plumbing; on the GPU, that the error stays at TF32's level despite a large mean."""
    torch.backends.cuda.matmul.allow_tf32 = True  # the fixture restores it
    assert matmul_module.input_precision(torch.float32) == "tf32"
    x, g, b, w, bias = make_inputs((40,), 96, 24, torch.float32, shift=50.0)
    tol = 1e-4 if triton_workshop.INTERPRET else 5e-3
    check(x, g, b, w, bias, tol=tol)
    # Parameters of other dtypes reach layer_norm and the matmul's bias as they are.
    check(x, g.double(), b.half(), w, bias.double(), tol=tol, grads=False)
    launched = spy_launches(monkeypatch)
    layer_norm_linear(x, g, b, w, bias)
    assert launched == ["layer_norm_fwd_kernel", "matmul_kernel"]


# ---------------------------------------------------------------------------------------------
# Ragged shapes through matmul_kernel: edge rows (columns) wrapped around instead of masked, the
# masked K tail. NaN is planted wherever the kernels may read but must never let reach a stored
# result (past K, in the padding of x's and W's rows, past M); every new_empty (the output, the
# normalised rows, mean, rstd, aligned copies) starts as NaN too.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ln_weight", [True, False], ids=["folded_w", "w_in_place"])
@pytest.mark.parametrize("x_layout", ["rowmajor", "m_contig", "copied_aligned"])
@pytest.mark.parametrize("K", [5, 64, 77], ids=lambda k: f"K{k}")  # BLOCK_K 64 in the interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_ragged_edges_never_reach_results(dtype, K, x_layout, ln_weight, monkeypatch,
                                          poisoned_new_empty, in_nan_storage):  # fmt: skip
    # M and N neither multiples of the 128-wide tile nor of 16 bytes: both edge tiles wrap.
    # "copied_aligned" is the GPU path: a ragged operand is copied into padded rows first (and
    # read in place at K = 64).
    M, N = 133, 21
    x_vals, g, b, w_vals, bias = make_inputs((M,), K, N, dtype, ln_weight=ln_weight, shift=3.0)
    if x_layout == "copied_aligned":
        monkeypatch.setattr(matmul_module, "TUNING",
                            dataclasses.replace(matmul_module.TUNING, align_operands=True))
        x = x_vals
    else:
        x = in_nan_storage(x_vals, transpose=x_layout == "m_contig")
    w = in_nan_storage(w_vals)  # read in place
    out = layer_norm_linear(x, g, b, w, bias)
    assert_close(out, reference(x_vals, g, b, w_vals, bias), TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("K", [48, 77], ids=lambda k: f"K{k}")
def test_through_the_tma_kernel(dtype, K, monkeypatch, poisoned_new_empty, in_nan_storage):
    """The product through matmul_tma_kernel (Hopper's path), forced on here: ragged M, N
    against 32x32 tiles, K ragged (77: rows copied into padded rows) or not, NaN wherever a read
    past an edge would show."""
    monkeypatch.setattr(matmul_module, "TUNING", dataclasses.replace(
        matmul_module.TUNING, tma_matmul=True, align_operands=True, tma_block_m=32,
        tma_block_n=32, tma_block_k=16))
    launched = spy_launches(monkeypatch)
    x_vals, g, b, w, bias = make_inputs((75,), K, 40, dtype, shift=3.0)
    x = in_nan_storage(x_vals) if K % 16 == 0 else x_vals
    check(x, g, b, w, bias)
    assert "matmul_tma_kernel" in launched


def spy_launches(monkeypatch) -> list[str]:
    """The names of the kernels launched from now on, in order: the planned launches (layer_norm's,
    through runtime.registry.launch_kernel) and matmul's autotuned ones (its wrap_triton)."""
    launched = []
    real_wrap, real_launch = matmul_module.wrap_triton, runtime.registry.launch_kernel

    def spy_wrap(kernel):
        launched.append(getattr(kernel, "fn", kernel).__name__)
        return real_wrap(kernel)

    def spy_launch(kernel, *args, **kwargs):
        launched.append(getattr(kernel, "fn", kernel).__name__)
        return real_launch(kernel, *args, **kwargs)

    monkeypatch.setattr(matmul_module, "wrap_triton", spy_wrap)
    monkeypatch.setattr(runtime.registry, "launch_kernel", spy_launch)
    return launched


def test_forward_is_two_launches(monkeypatch):
    """layer_norm's forward, then the product with the bias in its epilogue: nothing else runs
    per call."""
    launched = spy_launches(monkeypatch)
    # K = 32: rows 16-byte aligned, so the GPU reads x in place (no pad_copy_kernel).
    layer_norm_linear(*make_inputs((2, 5), 32, 10, torch.float16))
    assert launched == ["layer_norm_fwd_kernel", "matmul_kernel"]


# ---------------------------------------------------------------------------------------------
# Empty inputs and bad inputs.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lead, K, N",
    [((0,), 8, 4), ((5,), 8, 0), ((5,), 0, 4), ((2, 0), 8, 4), ((2, 3), 0, 4)],
    ids=str,
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
