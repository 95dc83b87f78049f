"""matmul / linear against float64 references: values, epilogues, gradients, errors, compile.

Every test draws fresh seeded random data (never zeros: a kernel that writes nothing, or reads the
wrong tile, must fail). References are computed in float64 from the *same rounded* inputs, so the
only error allowed is the kernel's own: fp32 accumulation plus one rounding of the output.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import triton_workshop
from triton_workshop import runtime
from triton_workshop.ops import matmul as matmul_module
from triton_workshop.ops.matmul import CONFIGS, linear, matmul, prune_configs, tf32_enabled

DEVICE = runtime.DEVICE
GPU_ONLY = pytest.mark.skipif(
    not torch.cuda.is_available() or triton_workshop.INTERPRET,
    reason="needs a CUDA GPU with compiled kernels (not the interpreter)",
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative error bounds (Frobenius norm of the error over that of the reference, and max error
# over max |reference|): fp32 with TF32 off is exact fp32 accumulation; fp16/bf16 are dominated
# by the final rounding of the output (2**-11 and 2**-8 relative).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def ieee_fp32():
    """fp32 tests compare with exact fp32: TF32 off (tests of TF32 turn it on), then restored.
    Set through the legacy flag, which keeps the new ``fp32_precision`` API in sync (monkeypatch
    cannot undo it: it is not a plain attribute)."""
    before = tf32_enabled()
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def set_tuning(monkeypatch, **fields):
    """Replace matmul's tuning object for one test (undone by monkeypatch)."""
    tuning = dataclasses.replace(matmul_module.TUNING, **fields)
    monkeypatch.setattr(matmul_module, "TUNING", tuning)


def rand(*shape, dtype=torch.float32, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)


def ref_epilogue(z, activation, slope=0.01):
    if activation == "relu":
        return torch.relu(z)
    if activation == "leaky_relu":
        return F.leaky_relu(z, slope)
    if activation == "gelu":
        return F.gelu(z, approximate="tanh")
    return z


def reference(a, b, bias=None, activation=None, slope=0.01):
    z = torch.matmul(a.double(), b.double())
    if bias is not None:
        z = z + bias.double()
    return ref_epilogue(z, activation, slope)


def assert_close(out, ref, dtype):
    assert out.shape == ref.shape
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    err = out.double() - ref
    tol = TOL[dtype]
    scale = ref.abs().max().clamp_min(1e-30)
    assert (err.norm() / ref.norm().clamp_min(1e-30)).item() <= tol
    assert (err.abs().max() / scale).item() <= 4 * tol


# ---------------------------------------------------------------------------------------------
# Values.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "M, K, N",
    [(1, 1, 1), (17, 65, 33), (130, 200, 70), (64, 128, 128), (5, 300, 3)],
)
def test_matches_float64(M, K, N, dtype):
    a, b = rand(M, K, dtype=dtype, seed=1), rand(K, N, dtype=dtype, seed=2)
    assert_close(matmul(a, b), reference(a, b), dtype)


def test_many_tiles_grouped_ordering():
    # 9 x 3 tiles with GROUP_M = 8: one full group and a ragged last one of a single tile-row.
    # A tile computed twice or never would show up as a wrong or unwritten block.
    a, b = rand(1100, 20, seed=3), rand(20, 300, seed=4)
    assert_close(matmul(a, b), reference(a, b), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_transposed_and_strided_operands(dtype):
    a_t = rand(70, 40, dtype=dtype, seed=5)  # a = a_t.t(): column-major (40, 70)
    w = rand(33, 70, dtype=dtype, seed=6)  # b = w.t(): an nn.Linear weight read in place
    b_wide = rand(70, 66, dtype=dtype, seed=7)  # b = b_wide[:, ::2]: column stride 2
    for a in (a_t.t(), rand(40, 140, dtype=dtype, seed=8)[:, ::2]):
        for b in (w.t(), b_wide[:, ::2]):
            assert not a.is_contiguous() and not b.is_contiguous()
            assert_close(matmul(a, b), reference(a, b), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batched(dtype):
    a = rand(3, 17, 40, dtype=dtype, seed=9)
    b = rand(3, 40, 20, dtype=dtype, seed=10)
    assert_close(matmul(a, b), reference(a, b), dtype)
    # Batched and transposed inside each batch.
    bt = rand(3, 20, 40, dtype=dtype, seed=11).transpose(1, 2)
    assert_close(matmul(a, bt), reference(a, bt), dtype)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((2, 9, 30), (30, 11)), ((9, 30), (2, 30, 11)), ((1, 9, 30), (3, 30, 11)), ((3, 9, 30), (1, 30, 11))],
)
def test_batch_broadcast(a_shape, b_shape):
    a, b = rand(*a_shape, seed=12), rand(*b_shape, seed=13)
    out = matmul(a, b)
    assert out.shape == torch.matmul(a, b).shape
    assert_close(out, reference(a, b), torch.float32)


# ---------------------------------------------------------------------------------------------
# Epilogue.
# ---------------------------------------------------------------------------------------------
EPILOGUES = [
    dict(bias=False, activation=None),
    dict(bias=True, activation=None),
    dict(bias=False, activation="relu"),
    dict(bias=True, activation="relu"),
    dict(bias=True, activation="leaky_relu", slope=0.2),
    dict(bias=False, activation="leaky_relu", slope=-0.5),
    dict(bias=True, activation="gelu"),
    dict(bias=False, activation="gelu"),
]


def _epilogue_id(e):
    return f"{'bias+' if e['bias'] else ''}{e['activation']}{e.get('slope', '')}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=_epilogue_id)
def test_epilogue(epilogue, dtype):
    M, K, N = 33, 70, 47
    a, b = rand(M, K, dtype=dtype, seed=14), rand(K, N, dtype=dtype, seed=15)
    bias = rand(N, dtype=dtype, seed=16) if epilogue["bias"] else None
    slope = epilogue.get("slope", 0.01)
    out = matmul(a, b, bias=bias, activation=epilogue["activation"], leaky_relu_slope=slope)
    assert_close(out, reference(a, b, bias, epilogue["activation"], slope), dtype)


def test_bias_of_another_dtype_is_added_in_fp32():
    a, b = rand(20, 30, dtype=torch.float16, seed=17), rand(30, 10, dtype=torch.float16, seed=18)
    bias = rand(10, seed=19, dtype=torch.float64)
    out = matmul(a, b, bias=bias)
    assert out.dtype == torch.float16
    assert_close(out, reference(a, b, bias), torch.float16)


def test_strided_bias():
    a, b = rand(20, 30, seed=20), rand(30, 10, seed=21)
    bias = rand(20, seed=22)[::2]
    assert_close(matmul(a, b, bias=bias), reference(a, b, bias), torch.float32)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # x**3, on purpose
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gelu_is_finite_at_extremes(dtype):
    # tanh through exp(+2x) would give inf/inf = nan for large |x|; x**3 overflows fp32 past ~7e12.
    x = torch.tensor([-1e20, -1e4, -30.0, -1e-3, 0.0, 1e-3, 30.0, 1e4, 1e20])
    a = x[:, None].to(device=DEVICE, dtype=dtype)
    b = torch.ones(1, 1, device=DEVICE, dtype=dtype)
    out = matmul(a, b, activation="gelu")
    assert torch.isfinite(out).all()
    expect = F.gelu(a.double(), approximate="tanh")
    torch.testing.assert_close(out.double(), expect, rtol=TOL[dtype], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Gradients.
# ---------------------------------------------------------------------------------------------
def _grads(fn, inputs, grad_out):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(grad_out)
    return out, [t.grad for t in leaves]


ACTIVATION_GRADS = [(None, 0.01), ("relu", 0.01), ("leaky_relu", 0.1), ("leaky_relu", -0.3), ("gelu", 0.01)]


@pytest.mark.parametrize("activation, slope", ACTIVATION_GRADS, ids=lambda v: str(v))
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_gradients(activation, slope, with_bias):
    M, K, N = 19, 37, 23
    inputs = [rand(M, K, seed=23), rand(K, N, seed=24)] + ([rand(N, seed=25)] if with_bias else [])
    grad_out = rand(M, N, seed=26)

    def ours(a, b, bias=None):
        return matmul(a, b, bias=bias, activation=activation, leaky_relu_slope=slope)

    def theirs(a, b, bias=None):
        return reference(a, b, bias, activation, slope)

    _, got = _grads(ours, inputs, grad_out)
    _, want = _grads(theirs, [t.double() for t in inputs], grad_out.double())
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        assert_close(g, w, torch.float32)


def test_gradients_batched_broadcast_weight_and_fp16():
    # The nn.Linear case: a 3-D input against one shared weight, read transposed.
    a = rand(2, 9, 30, dtype=torch.float16, seed=27)
    w = rand(11, 30, dtype=torch.float16, seed=28)
    bias = rand(11, dtype=torch.float16, seed=29)
    grad_out = rand(2, 9, 11, dtype=torch.float16, seed=30)
    _, got = _grads(lambda a, w, bias: matmul(a, w.t(), bias=bias, activation="gelu"), [a, w, bias], grad_out)
    _, want = _grads(
        lambda a, w, bias: reference(a, w.t(), bias, "gelu"),
        [a.double(), w.double(), bias.double()],
        grad_out.double(),
    )
    for g, ref, t in zip(got, want, (a, w, bias)):
        assert g.shape == t.shape and g.dtype == torch.float16
        # Rounded to fp16 twice (dZ, then dA / dW), hence a little looser than a forward product.
        assert ((g.double() - ref).norm() / ref.norm()).item() < 5e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_layout", ["2d", "3d", "3d_unmergeable"])
@pytest.mark.parametrize("activation, slope", ACTIVATION_GRADS, ids=lambda v: str(v))
def test_linear_gradients_match_float64(activation, slope, x_layout, dtype):
    """linear's backward (torch's GEMMs for dx, dweight and GELU's recomputed Z; the bias
    gradient summed in fp32) against float64 autograd from the same rounded inputs, twice: the
    second call takes the kept signature's planned forward. "3d_unmergeable": leading dims that
    do not merge, a batched product against the shared weight (its gradient one product)."""
    x = {"2d": lambda: rand(13, 40, dtype=dtype, seed=84),
         "3d": lambda: rand(3, 5, 40, dtype=dtype, seed=84),
         "3d_unmergeable": lambda: rand(5, 3, 40, dtype=dtype, seed=84).transpose(0, 1)}[x_layout]()
    w, bias = rand(24, 40, dtype=dtype, seed=85), rand(24, dtype=dtype, seed=86)
    grad_out = rand(*x.shape[:-1], 24, dtype=dtype, seed=87)

    def theirs(x, w, bias):
        return ref_epilogue(F.linear(x, w, bias), activation, slope)

    _, want = _grads(theirs, [x.double(), w.double(), bias.double()], grad_out.double())
    check = assert_close if dtype == torch.float32 else assert_close_rounded_twice
    for _ in range(2):
        _, got = _grads(lambda x, w, bias: linear(x, w, bias, activation, leaky_relu_slope=slope),
                        [x, w, bias], grad_out)
        for g, ref, t in zip(got, want, (x, w, bias)):
            assert g.shape == t.shape
            check(g, ref, dtype)


def assert_close_rounded_twice(out, ref, dtype):
    """assert_close's bounds doubled: an fp16/bf16 gradient is rounded twice (dZ, then the
    product), as torch's own backward rounds it."""
    assert out.shape == ref.shape and out.dtype == dtype and torch.isfinite(out).all()
    err = out.double() - ref
    assert (err.norm() / ref.norm()).item() <= 2 * TOL[dtype]
    assert (err.abs().max() / ref.abs().max()).item() <= 8 * TOL[dtype]


def test_gradients_broadcast_a():
    a, b = rand(9, 30, seed=31), rand(2, 30, 11, seed=32)
    grad_out = rand(2, 9, 11, seed=33)
    _, got = _grads(lambda a, b: matmul(a, b, activation="relu"), [a, b], grad_out)
    _, want = _grads(lambda a, b: reference(a, b, None, "relu"), [a.double(), b.double()], grad_out.double())
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)


# ---------------------------------------------------------------------------------------------
# Empty shapes: right shape and values, and no matmul kernel launched.
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def no_kernel(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the matmul kernel was launched for an empty product")

    monkeypatch.setattr(matmul_module, "wrap_triton", refuse)
    monkeypatch.setattr(runtime.registry, "launch_kernel", refuse)  # planned launches


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((0, 5), (5, 3)), ((4, 5), (5, 0)), ((4, 0), (0, 3)), ((0, 4, 5), (0, 5, 3)), ((2, 4, 0), (0, 3))],
)
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_empty(a_shape, b_shape, activation, no_kernel):
    a, b = rand(*a_shape, seed=34), rand(*b_shape, seed=35)
    bias = rand(b_shape[-1], seed=36)
    out = matmul(a, b, bias=bias, activation=activation)
    # K = 0 gives act(0 + bias), as torch does.
    torch.testing.assert_close(out.double(), reference(a, b, bias, activation))


def test_empty_k_gradients(no_kernel):
    a, b, bias = rand(4, 0, seed=37), rand(0, 3, seed=38), rand(3, seed=39)
    _, (ga, gb, gbias) = _grads(lambda a, b, bias: matmul(a, b, bias=bias, activation="relu"), [a, b, bias], rand(4, 3, seed=40))
    _, want = _grads(lambda a, b, bias: reference(a, b, bias, "relu"), [a.double(), b.double(), bias.double()], rand(4, 3, seed=40).double())
    assert ga.shape == (4, 0) and gb.shape == (0, 3)
    torch.testing.assert_close(gbias.double(), want[2])


# ---------------------------------------------------------------------------------------------
# Bad inputs: the error names the argument, before anything launches.
# ---------------------------------------------------------------------------------------------
def test_bad_inputs():
    a, b = rand(4, 5, seed=41), rand(5, 3, seed=42)
    with pytest.raises(TypeError, match="^a must be a torch.Tensor"):
        matmul([[1.0]], b)
    with pytest.raises(TypeError, match="^b must be a torch.Tensor"):
        matmul(a, 3.0)
    with pytest.raises(TypeError, match="^b must have dtype"):
        matmul(a, b.to(torch.int32))
    with pytest.raises(TypeError, match="^b has dtype torch.float16 but a has"):
        matmul(a, b.half())
    with pytest.raises(ValueError, match="^a must have 2 or 3 dimensions"):
        matmul(a[0], b)
    with pytest.raises(ValueError, match="^b must have 2 or 3 dimensions"):
        matmul(a, b[None, None])
    with pytest.raises(ValueError, match="^a has K=5 but b has K=4"):
        matmul(a, b[:4])
    with pytest.raises(ValueError, match="^batch sizes differ: a has batch 2 but b has batch 3"):
        matmul(rand(2, 4, 5), rand(3, 5, 3))
    with pytest.raises(ValueError, match=r"^bias must have shape \(N,\) = \(3,\)"):
        matmul(a, b, bias=rand(4))
    with pytest.raises(ValueError, match="^bias must have 1 dimensions"):
        matmul(a, b, bias=rand(1, 3))
    with pytest.raises(TypeError, match="^bias must have dtype"):
        matmul(a, b, bias=torch.ones(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="^activation must be one of None, 'relu', 'leaky_relu', 'gelu'"):
        matmul(a, b, activation="tanh")
    with pytest.raises(ValueError, match="^activation must be one of"):
        matmul(a, b, activation=torch.relu)
    with pytest.raises(TypeError, match="^leaky_relu_slope must be a float"):
        matmul(a, b, activation="leaky_relu", leaky_relu_slope="0.1")


def test_bad_linear_inputs():
    x, w = rand(2, 3, 5, seed=43), rand(4, 5, seed=44)
    with pytest.raises(ValueError, match="^x has in_features=5 but weight has in_features=6"):
        linear(x, rand(4, 6))
    with pytest.raises(ValueError, match="^weight must have 2 dimensions"):
        linear(x, w[None])
    with pytest.raises(TypeError, match="^weight has dtype torch.float16 but x has"):
        linear(x, w.half())
    with pytest.raises(ValueError, match="^bias must have shape"):
        linear(x, w, rand(5))
    # linear checks its own arguments before going straight to the op: the same errors as matmul.
    with pytest.raises(ValueError, match="^bias must have 1 dimensions"):
        linear(x, w, rand(1, 4))
    with pytest.raises(TypeError, match="^bias must have dtype"):
        linear(x, w, torch.ones(4, dtype=torch.int32, device=x.device))  # x's device: the dtype fails
    with pytest.raises(TypeError, match="^bias must be a torch.Tensor"):
        linear(x, w, [0.0] * 4)
    with pytest.raises(ValueError, match="^activation must be one of"):
        linear(x, w, activation="tanh")
    with pytest.raises(TypeError, match="^leaky_relu_slope must be a float"):
        linear(x, w, activation="leaky_relu", leaky_relu_slope="0.1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device next to the CPU")
def test_devices_must_match():
    a, b = rand(4, 5, device="cuda"), rand(5, 3, device="cuda")
    bias = rand(3, device="cpu")
    # Compiled kernels refuse CPU memory outright; the interpreter reads both, so says they differ.
    with pytest.raises(ValueError, match="^bias (is on cpu but a is on cuda|must be on a CUDA device)"):
        matmul(a, b, bias=bias)


# ---------------------------------------------------------------------------------------------
# linear.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x_shape", [(7,), (6, 7), (2, 3, 7)])
def test_linear(x_shape):
    x, w, bias = rand(*x_shape, seed=45), rand(5, 7, seed=46), rand(5, seed=47)
    out = linear(x, w, bias, activation="relu")
    expect = torch.relu(F.linear(x.double(), w.double(), bias.double()))
    assert out.shape == expect.shape
    assert_close(out, expect, torch.float32)
    assert_close(linear(x, w), F.linear(x.double(), w.double()), torch.float32)


def test_linear_unmergeable_and_empty_inputs():
    x = rand(3, 4, 7, seed=58).transpose(0, 1)  # (4, 3, 7): leading dims cannot be merged
    w, bias = rand(5, 7, seed=59), rand(5, seed=60)
    expect = F.gelu(F.linear(x.double(), w.double(), bias.double()), approximate="tanh")
    assert_close(linear(x, w, bias, "gelu"), expect, torch.float32)
    assert linear(rand(0, 7), w, bias).shape == (0, 5)
    out = linear(rand(2, 3, 0), rand(5, 0), bias)  # in_features = 0: just the bias
    torch.testing.assert_close(out, bias.expand(2, 3, 5))


# ---------------------------------------------------------------------------------------------
# Tuning configs.
# ---------------------------------------------------------------------------------------------
def test_prune_configs_keeps_what_fits():
    def pruned(dtype, m, n, k):
        args = dict(a_ptr=torch.empty(0, dtype=dtype), M_BUCKET=m, N_BUCKET=n, K_BUCKET=k)
        return prune_configs(CONFIGS, args)

    big16, big32 = pruned(torch.float16, 4096, 4096, 4096), pruned(torch.float32, 4096, 4096, 4096)
    assert CONFIGS[0] in big16 and CONFIGS[0] in big32
    assert len(big32) < len(big16)  # fp32 128x256x64 x 3 stages does not fit in shared memory
    assert all(c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] >= 128 * 64 for c in big16)
    small = pruned(torch.float16, 1, 1, 1)
    assert small and all(c.kwargs["BLOCK_M"] <= 64 and c.kwargs["BLOCK_N"] <= 64 for c in small)


# ---------------------------------------------------------------------------------------------
# torch.compile.
# ---------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def fn(a, b, bias):
        return matmul(a, b, bias=bias, activation="gelu").sum()

    compiled = torch.compile(fn, fullgraph=True)
    a, b, bias = rand(20, 30, seed=48), rand(30, 10, seed=49), rand(10, seed=50)
    leaves = [t.clone().requires_grad_(True) for t in (a, b, bias)]
    loss = compiled(*leaves)
    loss.backward()
    _, want = _grads(lambda a, b, bias: reference(a, b, bias, "gelu").sum(), [a.double(), b.double(), bias.double()], None)
    torch.testing.assert_close(loss.double(), reference(a, b, bias, "gelu").sum(), rtol=1e-5, atol=1e-4)
    for t, w in zip(leaves, want):
        assert_close(t.grad, w, torch.float32)


@pytest.mark.skipif(
    not hasattr(torch.backends, "fp32_precision"), reason="torch < 2.9 has no fp32_precision API"
)
def test_tf32_setting_read_through_new_api():
    # Setting the new API alone makes the legacy allow_tf32 raise on read; ours must still follow.
    saved = torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert tf32_enabled()
        assert matmul_module.input_precision(torch.float32) == "tf32"
        assert matmul_module.input_precision(torch.float16) == "ieee"
        # "none" inherits from the parent setting.
        torch.backends.cuda.matmul.fp32_precision = "none"
        torch.backends.fp32_precision = "tf32"
        assert tf32_enabled()
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        assert not tf32_enabled()
        assert matmul_module.input_precision(torch.float32) == "ieee"
    finally:
        torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision = saved


# ---------------------------------------------------------------------------------------------
# GPU only.
# ---------------------------------------------------------------------------------------------
@GPU_ONLY
def test_tf32_follows_torch():
    a, b = rand(512, 1024, seed=51), rand(1024, 256, seed=52)
    exact = reference(a, b)
    torch.backends.cuda.matmul.allow_tf32 = True  # the ieee_fp32 fixture restores it
    assert tf32_enabled()
    ours_tf32 = matmul(a, b)
    torch_tf32 = torch.matmul(a, b)
    err_ours = ((ours_tf32.double() - exact).norm() / exact.norm()).item()
    err_torch = ((torch_tf32.double() - exact).norm() / exact.norm()).item()
    # TF32 keeps 10 mantissa bits: both well above IEEE's 1e-7 and of the same size.
    assert 1e-5 < err_ours < 3 * err_torch + 1e-6
    torch.backends.cuda.matmul.allow_tf32 = False
    assert_close(matmul(a, b), exact, torch.float32)


@GPU_ONLY
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gpu_large_autotuned(dtype):
    a, b = rand(1000, 2048, dtype=dtype, seed=53), rand(2048, 3000, dtype=dtype, seed=54)
    bias = rand(3000, dtype=dtype, seed=55)
    assert_close(matmul(a, b, bias=bias, activation="gelu"), reference(a, b, bias, "gelu"), dtype)


@pytest.mark.big_memory
@GPU_ONLY
def test_more_than_2_31_elements():
    # a has 2**31 + 64 * 17 elements: offsets past 2**31 must not wrap around. Only the last rows
    # are checked against torch (the whole float64 reference would need 17 GB).
    free, _ = torch.cuda.mem_get_info()
    if free < 8 * 2**30:
        pytest.skip("needs 8 GiB of free GPU memory")
    M, K, N = 2**31 // 64 + 17, 64, 16
    a = torch.empty(M, K, dtype=torch.float16, device="cuda")
    a[-4096:] = rand(4096, K, dtype=torch.float16, seed=56)
    a[:-4096] = 1.0
    b = rand(K, N, dtype=torch.float16, seed=57)
    out = matmul(a, b)
    assert_close(out[-4096:], reference(a[-4096:], b), torch.float16)
    torch.testing.assert_close(out[0].float(), b.float().sum(0), rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_misaligned_operands_copied_to_aligned_rows(dtype, monkeypatch):
    """The GPU path copies operands whose rows are not 16-byte aligned (ragged K or N) into
    padded storage; the values must not change, whatever the layout."""
    set_tuning(monkeypatch, align_operands=True)
    a_t = rand(77, 45, dtype=dtype, seed=40)
    for a in (rand(45, 77, dtype=dtype, seed=41), a_t.t(), rand(3, 45, 77, dtype=dtype, seed=42)):
        for b in (rand(77, 21, dtype=dtype, seed=43), rand(21, 77, dtype=dtype, seed=44).t(),
                  rand(77, 42, dtype=dtype, seed=45)[:, ::2]):
            assert_close(matmul(a, b), reference(a, b), dtype)
    for t in (rand(45, 77, dtype=dtype, seed=46), a_t.t()):
        aligned = matmul_module._aligned(t)
        assert matmul_module._is_aligned(aligned) and torch.equal(aligned, t)


def test_misaligned_operands_gradients(monkeypatch):
    set_tuning(monkeypatch, align_operands=True)
    a = rand(13, 77, seed=47).requires_grad_()
    b = rand(77, 21, seed=48).requires_grad_()
    matmul(a, b, activation="relu").sum().backward()
    a_ref, b_ref = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    torch.relu(a_ref @ b_ref).sum().backward()
    torch.testing.assert_close(a.grad.double(), a_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.grad.double(), b_ref.grad, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Ragged shapes: 16-element padding, the unmasked main loop with its masked K tail, and the
# wrapped-around edge rows / columns. NaN is planted wherever the kernel may read but must never
# let reach a stored result (past K, in the padding, past M or N); outputs start as NaN too, so
# an element never written shows up.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("K", [5, 64, 77, 200], ids=lambda k: f"K{k}")  # BLOCK_K 64 in the interpreter
@pytest.mark.parametrize("layout", ["rowmajor", "a_m_contig", "b_k_contig"])
def test_ragged_edges_never_reach_results(layout, K, dtype, poisoned_new_empty, in_nan_storage):
    # M and N neither multiples of 16 bytes nor of the 128-wide tile: both edge tiles wrap.
    M, N = 133, 21
    a_vals, b_vals = rand(M, K, dtype=dtype, seed=61), rand(K, N, dtype=dtype, seed=62)
    a = in_nan_storage(a_vals, transpose=layout == "a_m_contig")
    b = in_nan_storage(b_vals, transpose=layout == "b_k_contig")
    assert matmul_module._is_aligned(a) and matmul_module._is_aligned(b)
    # Whole 16-byte vectors along each contiguous dim: the kernel then reads the NaN past M or N
    # (into results never stored) and past K (zeroed before the last product), never past 1.
    unit = 16 // a.element_size()
    a_m, b_k = layout == "a_m_contig", layout == "b_k_contig"
    grains = [matmul_module._grain(t, d) for t, d in ((a, -2), (a, -1), (b, -2), (b, -1))]
    assert grains == [unit if a_m else 1, 1 if a_m else unit, unit if b_k else 1, 1 if b_k else unit]
    bias = rand(N, dtype=dtype, seed=63)
    out = matmul(a, b, bias=bias, activation="gelu")
    assert_close(out, reference(a_vals, b_vals, bias, "gelu"), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_ragged_batched_through_padded_copies(dtype, monkeypatch, poisoned_new_empty):
    """The GPU path: unaligned operands copied into zero-padded storage, then read with wrapped
    edges and a K tail, batched, with a bias and an activation."""
    set_tuning(monkeypatch, align_operands=True)
    a = rand(3, 45, 77, dtype=dtype, seed=64)
    bias = rand(21, dtype=dtype, seed=65)
    for b in (rand(77, 21, dtype=dtype, seed=66), rand(3, 21, 77, dtype=dtype, seed=67).transpose(1, 2),
              rand(1, 77, 42, dtype=dtype, seed=68)[..., ::2]):
        assert not matmul_module._is_aligned(b)
        out = matmul(a, b, bias=bias, activation="leaky_relu", leaky_relu_slope=0.2)
        assert_close(out, reference(a, b, bias, "leaky_relu", 0.2), dtype)


@pytest.mark.parametrize("int32_offsets", [True, False], ids=["int32_tile_offsets", "int64_tile_offsets"])
def test_store_offsets_inside_a_tile(int32_offsets, monkeypatch, poisoned_new_empty):
    """Outputs are addressed from the tile's corner with 32-bit offsets unless a tile could span
    2**31 elements (rows of >= 8M elements): 64-bit ones forced here through the tuning."""
    if not int32_offsets:
        set_tuning(monkeypatch, int32_tile_offsets=False)
    a, b = rand(2, 133, 77, seed=76), rand(77, 21, seed=77)
    assert_close(matmul(a, b, activation="relu"), reference(a, b, None, "relu"), torch.float32)


def _storage_of(view: torch.Tensor) -> torch.Tensor:
    """Everything in the storage behind ``view``, flat."""
    return torch.empty(0, dtype=view.dtype, device=view.device).set_(view.untyped_storage())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_aligned_copies_pad_rows_to_16_elements_with_zeros(dtype, poisoned_new_empty):
    # (tensor, dim to make contiguous): row-major, column-major, 3-D, no unit stride, 16 bytes
    # but not 16 elements (fp16 rows of 24), and the K-major copy TF32 asks for.
    cases = [
        (rand(45, 77, dtype=dtype, seed=69), None),
        (rand(77, 45, dtype=dtype, seed=70).t(), None),
        (rand(3, 45, 77, dtype=dtype, seed=71), None),
        (rand(45, 154, dtype=dtype, seed=72)[:, ::2], None),
        (rand(10, 24, dtype=dtype, seed=73), None),
        (rand(45, 40, dtype=dtype, seed=74), -2),
    ]
    for t, dim in cases:
        copy = matmul_module._aligned(t, dim)
        assert copy is not t and torch.equal(copy, t)
        assert matmul_module._is_aligned(copy)
        inner = dim if dim is not None else (-2 if t.stride(-1) != 1 and t.stride(-2) == 1 else -1)
        assert copy.stride(inner) == 1
        rows_contig = copy if inner == -1 else copy.transpose(-1, -2)
        padded = rows_contig.stride(-2)
        assert padded % 16 == 0 and padded - 16 < rows_contig.shape[-1] <= padded
        # The padding is written, and with zeros: nothing uninitialised behind the view.
        flat = _storage_of(copy)
        assert flat.numel() == rows_contig.numel() // rows_contig.shape[-1] * padded
        padding = flat.view(-1, padded)[:, rows_contig.shape[-1]:]
        assert padding.numel() > 0 and (padding == 0).all()
    already = rand(64, 32, dtype=dtype, seed=75)
    assert matmul_module._aligned(already) is already
    assert matmul_module._aligned(already.t()) is not already  # asked for: already.t() is aligned
    assert matmul_module._aligned(already.t(), -2).data_ptr() == already.data_ptr()


def test_is_aligned_follows_tritons_specialisation():
    fp16 = torch.float16
    assert matmul_module._is_aligned(torch.empty(8, 32, dtype=fp16))
    assert not matmul_module._is_aligned(torch.empty(8, 24, dtype=fp16))  # 48 bytes, 24 elements
    assert not matmul_module._is_aligned(torch.empty(8, 40)[:, 1:33])  # storage offset of 4 bytes
    assert matmul_module._is_aligned(torch.empty(8, 48)[:, 4:36].t())
    assert matmul_module._is_aligned(torch.empty(1, 32, dtype=fp16).expand(5, 32))  # stride 0
    assert matmul_module._is_aligned(torch.empty(7, 1, dtype=fp16))  # a column, strides (1, 1)
    assert not matmul_module._is_aligned(torch.empty(64, dtype=fp16).as_strided((8, 8), (1, 1)))
    assert not matmul_module._is_aligned(torch.empty(8, 64, dtype=fp16)[:, ::2])
    assert not matmul_module._is_aligned(torch.empty(3, 8, 32, dtype=fp16).as_strided((3, 8, 32), (1, 32, 1)))
    # Reads past the end in whole 16-byte vectors only along the unit stride of an aligned operand.
    b = torch.empty(5, 32, dtype=fp16)[:, :21]
    assert matmul_module._grain(b, -1) == 8 and matmul_module._grain(b, -2) == 1
    assert matmul_module._grain(torch.empty(5, 32)[:, :21], -1) == 4  # fp32
    assert matmul_module._grain(torch.empty(5, 21, dtype=fp16), -1) == 1  # unaligned: exact
    assert matmul_module._grain(torch.empty(5, 1, dtype=fp16), -1) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_aligned_copy_launch_plan_follows_the_tuning(dtype, planned_launches, monkeypatch):
    """pad_copy_kernel launches through a cached plan: one plan per layout, dtype and tuning, so a
    repeated call reuses it and a replaced tuning object takes effect at once."""
    t = rand(3, 45, 77, dtype=dtype, seed=90)  # rows of 77 elements: copied, padded to 80
    for _ in range(2):
        copy = matmul_module._aligned(t)
        assert torch.equal(copy, t) and matmul_module._is_aligned(copy)
    tuning = matmul_module.TUNING
    rows, cols = tuning.pad_block_rows, tuning.pad_block_cols
    want = ("pad_copy_kernel", (3 * -(-45 // rows) * -(-80 // cols),))
    assert planned_launches == [want, want]
    key = (3, 45, 77, 80, t.stride(), dtype, tuning)
    plan = matmul_module._pad_copy_plan(*key)
    assert plan is matmul_module._pad_copy_plan(*key)  # cached: its prepared launches kept
    assert (plan.consts["BLOCK_R"], plan.consts["BLOCK_C"]) == (rows, cols)

    planned_launches.clear()
    set_tuning(monkeypatch, pad_block_rows=8, pad_block_cols=16)
    assert torch.equal(matmul_module._aligned(t), t)
    assert planned_launches == [("pad_copy_kernel", (3 * 6 * 5,))]


def test_former_module_switches_read_the_tuning(monkeypatch):
    """TMA_MATMUL, ALIGN_OPERANDS and TMA_CONFIG are fields of TUNING now: still readable under
    the old names, and setting one says where it went instead of silently changing nothing."""
    set_tuning(monkeypatch, tma_matmul=True, align_operands=True, tma_block_n=64)
    assert matmul_module.TMA_MATMUL is True and matmul_module.ALIGN_OPERANDS is True
    assert matmul_module.TMA_CONFIG["BLOCK_N"] == 64
    assert matmul_module.TMA_CONFIG == matmul_module.TUNING.tma_config()
    for name in ("TMA_MATMUL", "ALIGN_OPERANDS", "TMA_CONFIG"):
        with pytest.raises(AttributeError, match="TUNING"):
            setattr(matmul_module, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        matmul_module.TUNING.tma_matmul = False
    with pytest.raises(AttributeError, match="no attribute"):
        matmul_module.NO_SUCH_SWITCH  # noqa: B018


# The property the padding and the unmasked loop exist for, checked without a GPU: compiled for an
# H100 (sm_90) as a launch on _aligned's padded operands would specialise it, the ragged product's
# main loop moves both operands with 16-byte asynchronous copies, as the aligned one does.
_SM90_SCRIPT = r"""
import os, re, subprocess, sys
os.environ.pop("TRITON_INTERPRET", None)
import torch
torch.cuda.is_available = lambda: True  # compile for the GPU: no kernel is launched
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_workshop.ops import matmul as mm

def compile_sm90(jit_fn, args, constexprs, unspecialised=(), **options):
    # Specialised as a launch would: ints equal to 1 become constants, pointers and ints
    # divisible by 16 carry tt.divisibility.
    sig, consts, attrs = {}, dict(constexprs), {}
    for i, name in enumerate(jit_fn.arg_names):
        value = args.get(name)
        if name in consts:
            sig[name] = "constexpr"
        elif isinstance(value, str):
            sig[name], attrs[(i,)] = value, [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif value == 1 and name not in unspecialised:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if value % 16 == 0 and name not in unspecialised:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=jit_fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

from triton.backends.nvidia.compiler import get_ptxas
PTXAS = get_ptxas(90).path  # the ptxas Triton itself uses for sm_90

def registers(ptx):
    with open("kernel.ptx", "w") as f:
        f.write(ptx)
    done = subprocess.run([PTXAS, "-v", "-arch=sm_90a", "kernel.ptx", "-o", "kernel.cubin"],
                          capture_output=True, text=True, check=True)
    spills = re.search(r"(\d+) bytes spill stores", done.stderr)
    return int(re.search(r"Used (\d+) registers", done.stderr).group(1)), int(spills.group(1))

def matmul_counts(M, N, K, linear=False):
    # linear: F.linear's product, x @ Wᵀ with W (N, K) K-contiguous, and a bias.
    a = torch.empty(M, -(-K // 16) * 16, dtype=torch.float16, device="meta")[:, :K]
    if linear:
        b = torch.empty(N, -(-K // 16) * 16, dtype=torch.float16, device="meta")[:, :K].t()
    else:
        b = torch.empty(K, -(-N // 16) * 16, dtype=torch.float16, device="meta")[:, :N]
    out = torch.empty(M, N, dtype=torch.float16, device="meta")
    assert mm._is_aligned(a) and mm._is_aligned(b)  # what _aligned hands the kernel
    args = dict(a_ptr="*fp16", b_ptr="*fp16", c_ptr="*fp16", bias_ptr="*fp16", seed_ptr="*i64",
                M=M, N=N, K=K,
                stride_ab=0, stride_am=a.stride(0), stride_ak=a.stride(1),
                stride_bb=0, stride_bk=b.stride(0), stride_bn=b.stride(1),
                stride_cb=0, stride_cm=out.stride(0), stride_cn=out.stride(1), stride_bias=1,
                slope=0.01, dropout_p=0.0, M_BUCKET=8192, N_BUCKET=8192, K_BUCKET=8192)
    config = mm.CONFIGS[0]
    constexprs = dict(HAS_BIAS=linear, ACTIVATION="none", DROPOUT=False, INPUT_PRECISION="ieee",
                      DOT_IN_FP32=False,
                      A_M_GRAIN=mm._grain(a, -2), A_K_GRAIN=mm._grain(a, -1),
                      B_K_GRAIN=mm._grain(b, -2), B_N_GRAIN=mm._grain(b, -1),
                      INT32_TILE_OFFSETS=True, **config.kwargs)
    k = compile_sm90(mm.matmul_kernel.fn, args, constexprs,
                     unspecialised=("M_BUCKET", "N_BUCKET", "K_BUCKET"),
                     num_warps=config.num_warps, num_stages=config.num_stages)
    ptx = k.asm["ptx"]
    copies = re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, (0x[0-9a-f]+)", ptx)
    regs, spills = registers(ptx)
    return dict(cp16=copies.count("0x10"), narrow_cp=len(copies) - copies.count("0x10"),
                wgmma=len(re.findall(r"wgmma\.mma_async", ptx)), shared=k.metadata.shared,
                narrow_loads=len(re.findall(r"ld\.global(?!\S*\.v4)", ptx)),
                regs=regs, spills=spills)

aligned, ragged = matmul_counts(4096, 4096, 4096), matmul_counts(5012, 2100, 7777)
print("aligned", aligned, "ragged", ragged)
assert aligned["cp16"] > 0 and aligned["narrow_cp"] == 0 and aligned["wgmma"] > 0
# The same pipeline (copies, stages, tensor-core instructions), no load narrower than 16 bytes
# (the K tail included), and registers within the 128 that keep two 8-warp tiles resident per
# SM, with no spills.
same = ("cp16", "narrow_cp", "wgmma", "shared", "narrow_loads")
assert {k: ragged[k] for k in same} == {k: aligned[k] for k in same}, (ragged, aligned)
assert ragged["narrow_loads"] == 0, ragged
assert ragged["regs"] <= max(128, aligned["regs"]) and ragged["spills"] == 0, ragged

# F.linear's product (K-major B, a bias in the epilogue): the same pipeline, aligned or ragged,
# and no spills.
lin_aligned, lin_ragged = (matmul_counts(4096, 4096, 4096, linear=True),
                           matmul_counts(5012, 2100, 7777, linear=True))
print("lin_aligned", lin_aligned, "lin_ragged", lin_ragged)
pipeline = ("cp16", "narrow_cp", "wgmma", "shared")
assert {k: lin_aligned[k] for k in pipeline} == {k: aligned[k] for k in pipeline}, lin_aligned
assert {k: lin_ragged[k] for k in pipeline} == {k: aligned[k] for k in pipeline}, lin_ragged
assert lin_aligned["spills"] == 0 and lin_ragged["spills"] == 0, (lin_aligned, lin_ragged)

pad = compile_sm90(mm.pad_copy_kernel,
                   dict(src_ptr="*fp16", dst_ptr="*fp16", rows=5012, cols=7777, cols_padded=7792,
                        stride_sb=0, stride_sr=7777, stride_sc=1),
                   dict(BLOCK_R=mm.TUNING.pad_block_rows, BLOCK_C=mm.TUNING.pad_block_cols),
                   num_warps=mm.TUNING.pad_num_warps)
stores = re.findall(r"st\.global\S*", pad.asm["ptx"])
assert stores and all(".v4.b32" in s for s in stores), stores
print("ok")
"""


def run_compile_script(script: str, cwd, timeout: int) -> None:
    """Run a script that compiles kernels for sm_90 on the CPU (outside interpreter mode, in a
    process of its own) and prints "ok" last."""
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_WORKSHOP_QUIET"] = "1"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests time the real thing")
def test_ragged_main_loop_compiles_to_16_byte_async_copies(tmp_path):
    run_compile_script(_SM90_SCRIPT, tmp_path, 300)


_TMA_SHARED_SCRIPT = r"""
import os
os.environ.pop("TRITON_INTERPRET", None)
import torch
torch.cuda.is_available = lambda: True  # compile for the GPU: no kernel is launched
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_workshop.ops.matmul import TUNING
from triton_workshop.ops.matmul.kernels import matmul_tma_kernel

def shared(dtype, activation, dropout, a_k_major, b_k_major):
    cfg = TUNING.tma_config()
    bm, bn, bk = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    options = dict(num_warps=cfg.pop("num_warps"), num_stages=cfg.pop("num_stages"))
    a_block = [bm, bk] if a_k_major else [bk, bm]
    b_block = [bn, bk] if b_k_major else [bk, bn]
    sig = dict(a_desc=f"tensordesc<{dtype}{a_block}>", b_desc=f"tensordesc<{dtype}{b_block}>",
               c_desc=f"tensordesc<{dtype}[{bm}, {bn}]>", c_ptr="*" + dtype,
               bias_ptr="*" + dtype, seed_ptr="*i64", M="i32", N="i32", K="i32",
               stride_cm="i32", stride_bias="i32", slope="fp32", dropout_p="fp32")
    consts = dict(A_K_MAJOR=a_k_major, B_K_MAJOR=b_k_major, C_TMA=True, HAS_BIAS=True,
                  ACTIVATION=activation, DROPOUT=dropout, INPUT_PRECISION="ieee",
                  DOT_IN_FP32=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_SMS=132, **cfg)
    sig.update({name: "constexpr" for name in consts})
    names = matmul_tma_kernel.arg_names
    src = ASTSource(fn=matmul_tma_kernel, signature=sig,
                    constexprs={(names.index(k),): v for k, v in consts.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return kernel.metadata.shared

LIMIT = 227 * 1024  # an H100's / H200's opt-in shared memory a block
# What use_tma sends to the kernel: no dropout, any activation, either operand order.
for case in [("bf16", "gelu", False, True, False), ("fp16", "leaky_relu", False, False, True)]:
    used = shared(*case)
    print(case, used)
    assert used <= LIMIT, (case, used)
# What it keeps away: dropout's epilogue does not fit at these tiles.
used = shared("bf16", "none", True, True, True)
print("dropout", used)
assert used > LIMIT, used
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests launch the real thing")
def test_tma_kernel_fits_shared_memory_at_its_tiles_and_dropout_would_not(tmp_path):
    # Compiled for sm_90 on the CPU: a launch Triton would refuse for its shared memory (as
    # dropout's epilogue was, at a GPT-2 MLP's size) shows here without a GPU.
    run_compile_script(_TMA_SHARED_SCRIPT, tmp_path, 600)


# ---------------------------------------------------------------------------------------------
# The persistent TMA kernel (Hopper's path for large 2-D fp16/bf16 products), forced on here so
# that the interpreter runs it too.
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def tma_forced(monkeypatch):
    """Every eligible product through matmul_tma_kernel (small tiles: more programs than SMs,
    so each program walks several tiles); yields the list its launches are recorded in."""
    set_tuning(monkeypatch, tma_matmul=True, tma_block_m=32, tma_block_n=32, tma_block_k=16)
    launches = []
    launch = matmul_module._launch_matmul_tma

    def recorded(a, b, out, **kwargs):
        launches.append((tuple(a.stride()), tuple(b.stride()), tuple(out.stride())))
        return launch(a, b, out, **kwargs)

    monkeypatch.setattr(matmul_module, "_launch_matmul_tma", recorded)
    return launches


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("a_k_major", [True, False], ids=["a_row_major", "a_col_major"])
@pytest.mark.parametrize("b_k_major", [True, False], ids=["b_k_major", "b_row_major"])
def test_tma_kernel_layouts_and_ragged_edges(dtype, a_k_major, b_k_major, tma_forced,
                                             poisoned_new_empty, in_nan_storage):
    # M, N, K all ragged against the 32x32x16 tiles; operands in NaN-padded storage, so a tile
    # that reads past an edge instead of taking the TMA's zero fill turns its outputs into NaN.
    M, K, N = 75, 56, 40
    a = in_nan_storage(rand(M, K, dtype=dtype, seed=70), transpose=not a_k_major)
    b = in_nan_storage(rand(K, N, dtype=dtype, seed=71), transpose=b_k_major)
    bias = rand(N, dtype=dtype, seed=72)
    out = matmul(a, b, bias=bias, activation="leaky_relu", leaky_relu_slope=0.2)
    assert_close(out, reference(a, b, bias, "leaky_relu", 0.2), dtype)
    assert len(tma_forced) == 1
    assert (tma_forced[0][0][1] == 1) == a_k_major and (tma_forced[0][1][0] == 1) == b_k_major


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_tma_kernel_epilogues_and_unaligned_output_rows(activation, tma_forced):
    # N = 36: output rows of 72 bytes, not a multiple of 16, so the tile is stored through
    # masked pointers instead of a TMA store. (B = w.t(), K-major, is what a descriptor can read.)
    a, b = rand(64, 48, dtype=torch.float16, seed=73), rand(36, 48, dtype=torch.float16, seed=74).t()
    bias = rand(36, dtype=torch.float32, seed=75)
    assert_close(matmul(a, b, bias=bias, activation=activation),
                 reference(a, b, bias, activation), torch.float16)
    assert len(tma_forced) == 1


def test_tma_kernel_not_taken_where_it_does_not_apply(tma_forced, monkeypatch):
    # Batched, fp32, and operands a descriptor cannot describe (no unit stride) keep
    # matmul_kernel. (With align_operands on, as on a GPU, the strided operand would first be
    # copied into an aligned buffer, which a descriptor can describe: switched off here.)
    set_tuning(monkeypatch, align_operands=False)
    a16, b16 = rand(2, 40, 48, dtype=torch.float16, seed=76), rand(48, 24, dtype=torch.float16, seed=77)
    assert_close(matmul(a16, b16), reference(a16, b16), torch.float16)
    a, b = rand(40, 48, seed=78), rand(48, 24, seed=79)
    assert_close(matmul(a, b), reference(a, b), torch.float32)
    strided = rand(48, 48, dtype=torch.float16, seed=80)[:, ::2]
    assert_close(matmul(a16[0], strided), reference(a16[0], strided), torch.float16)
    assert tma_forced == []


def test_tma_kernel_gradients(tma_forced):
    # The forward through the TMA kernel; the backward's products (the recomputed Z, dA, dB)
    # are torch's GEMMs, with nothing of ours to launch.
    a = rand(48, 64, dtype=torch.float16, seed=81).requires_grad_()
    b = rand(64, 40, dtype=torch.float16, seed=82).requires_grad_()
    grad = rand(48, 40, dtype=torch.float16, seed=83)
    matmul(a, b, activation="gelu").backward(grad)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    F.gelu(a64 @ b64, approximate="tanh").backward(grad.double())
    assert_close(a.grad, a64.grad, torch.float16)
    assert_close(b.grad, b64.grad, torch.float16)
    assert len(tma_forced) == 1  # the forward only


def test_tma_picked_only_for_large_products_on_hopper(monkeypatch):
    # Auto mode: never in the interpreter or off Hopper; on Hopper only with a wave of tiles.
    tuning = dataclasses.replace(matmul_module.TUNING, tma_matmul=None)
    # As an op's launcher asks it: launching directly (eager), not traced by torch.compile.
    use_tma = runtime.launch_directly(matmul_module._use_tma)
    a, b = rand(64, 512, dtype=torch.float16), rand(512, 64, dtype=torch.float16)
    out = a.new_empty(64, 64)
    if runtime.INTERPRET or not torch.cuda.is_available():
        assert not use_tma(a, b, out, "ieee", tuning)
        return
    monkeypatch.setattr(matmul_module, "_is_hopper", lambda index: True)
    assert not use_tma(a, b, out, "ieee", tuning)  # 1 tile: matmul_kernel's small tiles
    big_a = a.new_empty(4096, 1024)
    big_b = a.new_empty(1024, 4096)
    big_out = a.new_empty(4096, 4096)
    assert use_tma(big_a, big_b, big_out, "ieee", tuning)
    # Dropout's epilogue does not fit the kernel's shared memory at its tiles.
    assert not use_tma(big_a, big_b, big_out, "ieee", tuning, True)
    # Below tma_min_volume (2**34 = 4096 x 4096 x 1024) the descriptors' host time is not earned back.
    mid_a, mid_b = a.new_empty(4096, 512), a.new_empty(512, 4096)
    assert not use_tma(mid_a, mid_b, big_out, "ieee", tuning)
    assert use_tma(mid_a, mid_b, big_out, "ieee", dataclasses.replace(tuning, tma_min_volume=0))
    assert not matmul_module._use_tma(big_a, big_b, big_out, "ieee", tuning)  # traced
    # A wave of the tuning's tiles is what counts: 4096x4096 in 2048-wide tiles is 4 of them.
    wide = dataclasses.replace(tuning, tma_block_m=2048, tma_block_n=2048)
    assert not use_tma(big_a, big_b, big_out, "ieee", wide)
    assert not use_tma(big_a, big_b, big_out, "ieee",
                       dataclasses.replace(tuning, tma_matmul=False))
    monkeypatch.setattr(matmul_module, "_is_hopper", lambda index: False)
    assert not use_tma(big_a, big_b, big_out, "ieee", tuning)


# --------------------------------------------------------------------------------------------
# Kept call signatures: a repeat launches x and the weight as they are (linear) or the kept plan
# (matmul), forward and backward, and stays right on fresh data.
# --------------------------------------------------------------------------------------------
def _close(out, ref, tol):
    """``out`` within ``tol`` of the float64 ``ref`` (relative Frobenius norm of the error)."""
    assert out.shape == ref.shape
    err = (out.double() - ref).norm() / ref.norm().clamp_min(1e-30)
    assert err.item() <= tol, err.item()


def _x_of(layout, dtype, seed):
    """x of (6, 16) features in a few layouts: rows, a column-major view, 3-D, one vector."""
    if layout == "rows":
        return rand(6, 16, dtype=dtype, seed=seed)
    if layout == "column_major":
        return rand(16, 6, dtype=dtype, seed=seed).t()
    if layout == "3d":
        return rand(2, 3, 16, dtype=dtype, seed=seed)
    if layout == "3d_batched":  # leading dims that cannot merge: a batched product
        return rand(3, 2, 16, dtype=dtype, seed=seed).transpose(0, 1)
    return rand(16, dtype=dtype, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["rows", "column_major", "3d", "3d_batched", "vector"])
@pytest.mark.parametrize("activation,slope", [(None, 0.01), ("relu", 0.01), ("gelu", 0.01),
                                              ("leaky_relu", -0.5)])
@pytest.mark.parametrize("weight_layout", ["rows", "column_major"])
def test_linear_kept_signature_repeats(dtype, layout, activation, slope, weight_layout):
    """Every call of one signature (the first checked and planned, the others kept): values
    and the gradients of x, the weight and a bias against float64, each gradient laid out as
    its operand."""
    matmul_module._LINEAR_CALLS.clear()
    for step in range(3):
        seed = 100 + 10 * step
        x = _x_of(layout, dtype, seed).requires_grad_()
        weight = (rand(8, 16, dtype=dtype, seed=seed + 1) if weight_layout == "rows"
                  else rand(16, 8, dtype=dtype, seed=seed + 1).t()).requires_grad_()
        bias = rand(8, dtype=dtype, seed=seed + 2).requires_grad_()
        g = rand(*x.shape[:-1], 8, dtype=dtype, seed=seed + 3)
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, weight, bias))
        want = ref_epilogue(F.linear(x64, w64, b64), activation, slope)
        want.backward(g.double())
        with torch.no_grad():  # the plain kept path
            _close(linear(x, weight, bias, activation, leaky_relu_slope=slope), want,
                         TOL[dtype])
        out = linear(x, weight, bias, activation, leaky_relu_slope=slope)
        assert out.shape == want.shape
        _close(out, want, TOL[dtype])
        out.backward(g)
        for mine, ref, operand in ((x.grad, x64.grad, x), (weight.grad, w64.grad, weight),
                                   (bias.grad, b64.grad, bias)):
            assert mine.dtype == dtype
            _close(mine, ref, 4 * TOL[dtype])
            if operand.dim() == 2:
                assert mine.stride() == operand.stride()
    kept = [call[4] for call in matmul_module._LINEAR_CALLS.values()]
    assert kept and None not in kept, kept  # the signature was decided at its first call
    # On a GPU an operand whose strides are not multiples of 16 elements is copied to an aligned
    # buffer every call (the general path, nothing kept): the column-major x (stride 6) and the
    # column-major weight, whose transpose has stride 8. The interpreter launches every layout
    # as it lies.
    if runtime.INTERPRET or (weight_layout == "rows" and layout != "column_major"):
        assert all(kept), kept
        assert all(k.linear == (layout != "3d_batched") for k in kept)
    else:
        assert not any(kept), kept


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_linear_kept_signature_with_a_bias_of_another_dtype(bias_dtype):
    """A bias of another dtype than x (added in the promoted dtype): its gradient in its own
    dtype, on every repeat, through the recomputed pre-activation (GELU)."""
    matmul_module._LINEAR_CALLS.clear()
    for step in range(3):
        x = rand(2, 5, 16, dtype=torch.bfloat16, seed=200 + step).requires_grad_()
        weight = rand(8, 16, dtype=torch.bfloat16, seed=210 + step).requires_grad_()
        bias = rand(8, dtype=bias_dtype, seed=220 + step).requires_grad_()
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, weight, bias))
        out = linear(x, weight, bias, "gelu")
        want = F.gelu(F.linear(x64, w64, b64), approximate="tanh")
        _close(out, want, TOL[torch.bfloat16])
        out.sum().backward()
        want.sum().backward()
        assert bias.grad.dtype == bias_dtype
        for mine, ref in ((x.grad, x64.grad), (weight.grad, w64.grad), (bias.grad, b64.grad)):
            _close(mine, ref, 4e-2)


# N = 16: b's row stride a multiple of 16 elements, so that a GPU launches it as it lies too.
@pytest.mark.parametrize("shapes", [((6, 16), (16, 16)), ((2, 6, 16), (16, 16)),
                                    ((2, 6, 16), (2, 16, 16))], ids=str)
def test_matmul_kept_signature_repeats_with_a_bias(shapes):
    """matmul's kept signatures, 2-D and batched, with a bias of another dtype: values and
    gradients against float64 on fresh data, every repeat through the kept plan."""
    matmul_module._READY.clear()
    for step in range(3):
        a = rand(*shapes[0], dtype=torch.bfloat16, seed=300 + step).requires_grad_()
        b = rand(*shapes[1], dtype=torch.bfloat16, seed=310 + step).requires_grad_()
        bias = rand(16, seed=320 + step).requires_grad_()
        a64, b64, c64 = (t.detach().double().requires_grad_() for t in (a, b, bias))
        out = matmul(a, b, bias=bias, activation="gelu")
        want = F.gelu(a64 @ b64 + c64, approximate="tanh")
        _close(out, want, TOL[torch.bfloat16])
        g = rand(*out.shape, seed=330 + step)
        out.backward(g.to(out.dtype))
        want.backward(g.double().to(torch.bfloat16).double())
        assert bias.grad.dtype == torch.float32
        for mine, ref in ((a.grad, a64.grad), (b.grad, b64.grad), (bias.grad, c64.grad)):
            _close(mine, ref, 4e-2)
    assert all(matmul_module._READY.values())


def test_a_kept_linear_signature_still_refuses_a_changed_bad_argument():
    """After a signature is kept, a call that differs from it in one bad argument is checked
    (and refused, naming it), never launched as the kept one."""
    x, weight, bias = rand(6, 16, seed=400), rand(8, 16, seed=401), rand(8, seed=402)
    for _ in range(2):
        linear(x, weight, bias)
    with pytest.raises(TypeError, match="weight"):
        linear(x, weight.double(), bias)
    with pytest.raises(ValueError, match="bias"):
        linear(x, weight, rand(7, seed=403))
    with pytest.raises(ValueError, match="in_features"):
        linear(rand(6, 15, seed=404), weight, bias)
    with pytest.raises(ValueError, match="activation"):
        linear(x, weight, bias, "tanh")
    with pytest.raises(ValueError, match="dropout_p"):
        linear(x, weight, bias, dropout_p=1.5)
    if DEVICE.type == "cuda":
        with pytest.raises(ValueError, match="bias"):
            linear(x, weight, bias.cpu())
    a, b = rand(6, 16, seed=405), rand(16, 8, seed=406)
    for _ in range(2):
        matmul(a, b)
    with pytest.raises(TypeError, match="b"):
        matmul(a, b.half())
