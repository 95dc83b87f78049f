"""swiglu and geglu against torch's own formulas (``F.silu(gate) * up``, ``F.gelu(gate,
approximate=...) * up``): values and gradients, computed in float64 from the very same inputs, so
the only error allowed is the op's own rounding (fp32 arithmetic, one rounding of each output).

Torch itself rounds twice in fp16/bf16 (the activation, then the product), so against torch's
same-dtype result two ulps are allowed. The interpreter truncates fp32 -> bf16 where a GPU
rounds: one bf16 ulp either way. Ragged sizes, the strided halves of a fused projection,
non-collapsible views, mixed dtypes, empty and 0-d tensors, poisoned outputs, torch.compile.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop.ops.glu import geglu, glu_halves, swiglu
from triton_workshop.runtime import DEVICE, INTERPRET

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: Relative error of one rounding (bf16: two, for the interpreter's truncation), and an absolute
#: floor for results near 0 (gelu(x) for large negative x is tiny and rounds to subnormals).
TOL = {
    torch.float32: dict(rtol=2e-6, atol=1e-6),
    torch.float16: dict(rtol=1e-3, atol=1e-5),
    torch.bfloat16: dict(rtol=8e-3, atol=1e-5),
}
#: Against torch in the same dtype: its two roundings plus ours (fp32: torch's own erf/tanh are
#: a few ulps off float64, more than ours).
TORCH_TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float16: dict(rtol=2e-3, atol=1e-4),
    torch.bfloat16: dict(rtol=2e-2, atol=1e-3),
}
gpu_only = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                              reason="needs a CUDA device with compiled kernels")

ACTIVATIONS = {
    "swiglu": (lambda g, u: swiglu(g, u), lambda g, u: F.silu(g) * u),
    "geglu_tanh": (lambda g, u: geglu(g, u), lambda g, u: F.gelu(g, approximate="tanh") * u),
    "geglu_none": (lambda g, u: geglu(g, u, approximate="none"), lambda g, u: F.gelu(g) * u),
}


def _randn(*shape, dtype=torch.float32, seed=0, scale=2.0):
    """Normal data scaled to reach the activations' curved part, never exactly zero."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    return torch.where(t == 0, torch.full_like(t, 0.5), t).to(dtype).to(DEVICE)


@pytest.fixture
def nan_outputs(monkeypatch):
    """Every tensor the launchers allocate starts as NaN: an element the kernels never write
    shows up (a recycled allocation could otherwise hold the right answer already)."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(fn):
        def make(*args, **kwargs):
            t = fn(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return make

    monkeypatch.setattr(torch, "empty", poisoned(empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(empty_like))


def _check(name, gate, up, dout=None):
    """Values and, where the inputs require grad, gradients, against float64 torch."""
    ours_fn, torch_fn = ACTIVATIONS[name]
    out = ours_fn(gate, up)
    out_dtype = torch.promote_types(gate.dtype, up.dtype)
    assert out.shape == gate.shape and out.dtype == out_dtype
    g64 = gate.detach().double().requires_grad_(gate.requires_grad)
    u64 = up.detach().double().requires_grad_(up.requires_grad)
    ref = torch_fn(g64, u64)
    torch.testing.assert_close(out.double(), ref, **TOL[out_dtype])
    # Torch in the same dtypes: its own roundings. With mixed dtypes torch rounds the activation
    # to gate's dtype before the product; ours keeps it in fp32 (closer to float64, checked
    # above), so the narrower input's tolerance applies.
    torch_tol = max(TORCH_TOL[gate.dtype], TORCH_TOL[up.dtype], key=lambda t: t["rtol"])
    with torch.no_grad():
        torch.testing.assert_close(out, torch_fn(gate, up), **torch_tol)
    inputs = [t for t in (gate, up) if t.requires_grad]
    if not inputs:
        return
    if dout is None:
        dout = _randn(*out.shape, dtype=out_dtype, seed=9, scale=1.0)
    grads = torch.autograd.grad(out, inputs, dout)
    refs = torch.autograd.grad(ref, [t for t in (g64, u64) if t.requires_grad], dout.double())
    for t, g, r in zip(inputs, grads, refs):
        assert g.dtype == t.dtype and g.shape == t.shape
        tol = TOL[t.dtype]
        # dgate is a product of three rounded factors (dout, up, act'), and act' crosses zero
        # (gelu' near x = -0.75): errors are a few ulps of the gradient's scale, not of each value.
        scale = float(r.abs().max()) if r.numel() else 0.0
        torch.testing.assert_close(g.double(), r, rtol=4 * tol["rtol"],
                                   atol=4 * tol["atol"] + 4 * tol["rtol"] * scale)


SHAPES = [(1,), (7,), (4097,), (3, 37, 53), (2, 5, 1000)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_values_and_grads(nan_outputs, name, shape, dtype):
    gate = _randn(*shape, dtype=dtype).requires_grad_()
    up = _randn(*shape, dtype=dtype, seed=1).requires_grad_()
    _check(name, gate, up)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_halves_of_a_fused_projection_are_read_in_place(nan_outputs, name):
    # x @ [w_gate; w_up].T chunked in two: rows of stride 2 * 48, read without a copy.
    fused = _randn(6, 11, 2 * 48).requires_grad_()
    gate, up = fused.chunk(2, dim=-1)
    assert not gate.is_contiguous()
    _check(name, gate, up)
    dout = _randn(6, 11, 48, seed=5)
    grad, = torch.autograd.grad(ACTIVATIONS[name][0](gate, up), fused, dout)
    ref_fused = fused.detach().double().requires_grad_()
    ref_gate, ref_up = ref_fused.chunk(2, dim=-1)
    ref, = torch.autograd.grad(ACTIVATIONS[name][1](ref_gate, ref_up), ref_fused, dout.double())
    torch.testing.assert_close(grad.double(), ref, rtol=1e-5, atol=1e-5)


#: glu_halves's activation for each of ACTIVATIONS.
HALVES = {"swiglu": "silu", "geglu_tanh": "gelu_tanh", "geglu_none": "gelu"}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 2), (7, 2 * 5), (3, 37, 2 * 53), (2, 2 * 1000)], ids=str)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_glu_halves_is_the_glu_of_the_chunks(nan_outputs, name, shape, dtype):
    """glu_halves(x) = act(gate) * up for gate, up = x.chunk(2, -1): values and x's gradient,
    one tensor written whole (poisoned allocations show any element left out), against float64
    torch; a strided x too."""
    x = _randn(*shape, dtype=dtype).requires_grad_()
    out = glu_halves(x, HALVES[name])
    x64 = x.detach().double().requires_grad_()
    ref = ACTIVATIONS[name][1](*x64.chunk(2, dim=-1))
    assert out.shape == ref.shape and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    dout = _randn(*out.shape, dtype=dtype, seed=9, scale=1.0)
    grad, = torch.autograd.grad(out, x, dout)
    ref_grad, = torch.autograd.grad(ref, x64, dout.double())
    assert grad.dtype == dtype and grad.shape == x.shape
    tol = TOL[dtype]
    scale = float(ref_grad.abs().max())
    torch.testing.assert_close(grad.double(), ref_grad, rtol=4 * tol["rtol"],
                               atol=4 * tol["atol"] + 4 * tol["rtol"] * scale)
    if len(shape) == 2 and shape[0] > 1:  # strided: every other row of a taller tensor
        tall = _randn(2 * shape[0], shape[1], dtype=dtype, seed=3).requires_grad_()
        rows = tall[::2]
        out = glu_halves(rows, HALVES[name])
        torch.testing.assert_close(out, glu_halves(rows.detach().contiguous(), HALVES[name]))
        grad, = torch.autograd.grad(out, tall, dout)
        assert grad[1::2].abs().max() == 0
        ref_rows = rows.detach().double().requires_grad_()
        ref_grad, = torch.autograd.grad(ACTIVATIONS[name][1](*ref_rows.chunk(2, dim=-1)),
                                        ref_rows, dout.double())
        torch.testing.assert_close(grad[::2].double(), ref_grad, rtol=4 * tol["rtol"],
                                   atol=4 * tol["atol"] + 4 * tol["rtol"] * scale)


def _graph_nodes(fn) -> list[str]:
    names, todo = [], [fn]
    while todo:
        node = todo.pop()
        if node is not None:
            names.append(type(node).__name__)
            todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def test_glu_halves_writes_one_gradient_without_a_cat():
    """x's gradient comes straight from the GLU's backward: no split of x in the graph (whose
    backward would copy the two halves' gradients together), as there is for the chunks."""
    x = _randn(4, 2 * 24).requires_grad_()
    # The outputs are kept: a custom Function's node lives only as long as its output.
    out, out_chunked = glu_halves(x), swiglu(*x.chunk(2, dim=-1))
    ours = _graph_nodes(out.grad_fn)
    chunked = _graph_nodes(out_chunked.grad_fn)
    assert any("Split" in name for name in chunked)
    assert not any("Split" in name or "Cat" in name for name in ours)
    assert ours[-1] == "AccumulateGrad" and len(ours) == 2


@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (2, 0, 6)], ids=str)
def test_glu_halves_empty(shape):
    x = torch.zeros(shape, device=DEVICE, requires_grad=True)
    out = glu_halves(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_glu_halves_refuses_bad_input():
    with pytest.raises(TypeError, match="gate_up must be a torch.Tensor"):
        glu_halves([1.0, 2.0])
    with pytest.raises(ValueError, match="last dimension must be even"):
        glu_halves(_randn(3, 5))
    with pytest.raises(ValueError, match="activation must be one of"):
        glu_halves(_randn(3, 4), "relu")
    with pytest.raises(TypeError, match="activation must be a str"):
        glu_halves(_randn(3, 4), None)
    with pytest.raises(TypeError, match="gate_up must have dtype"):
        glu_halves(_randn(3, 4).double())


@pytest.mark.slow  # a CPU compile of forward and backward
def test_glu_halves_compiles_in_one_graph():
    x = _randn(5, 2 * 16).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    compiled = torch.compile(lambda t: glu_halves(t, "gelu_tanh"), fullgraph=True)
    out, ref = compiled(x), glu_halves(x2, "gelu_tanh")
    torch.testing.assert_close(out, ref)
    dout = _randn(*out.shape, seed=4)
    out.backward(dout)
    ref.backward(dout)
    torch.testing.assert_close(x.grad, x2.grad)


def test_strided_views_and_strided_gradient(nan_outputs):
    transposed = _randn(40, 30).t().requires_grad_()         # column-major
    every_other = _randn(30, 80)[:, ::2].requires_grad_()    # a column stride of 2
    permuted = _randn(5, 6, 8).permute(2, 0, 1).requires_grad_()  # leading dims do not collapse
    other = _randn(8, 5, 6, seed=3).requires_grad_()
    dout = _randn(40, 30, seed=4).t()  # a strided output gradient too
    for name in ACTIVATIONS:
        _check(name, transposed, every_other, dout=dout)
        _check(name, permuted, other)


@pytest.mark.parametrize(
    "gate_dtype,up_dtype",
    [(torch.bfloat16, torch.float32), (torch.float32, torch.float16),
     (torch.float16, torch.bfloat16)],
    ids=str,
)
def test_mixed_dtypes_promote_like_torch(gate_dtype, up_dtype):
    gate = _randn(9, 33, dtype=gate_dtype).requires_grad_()
    up = _randn(9, 33, dtype=up_dtype, seed=2).requires_grad_()
    for name in ACTIVATIONS:
        with torch.no_grad():
            assert ACTIVATIONS[name][0](gate, up).dtype == ACTIVATIONS[name][1](gate, up).dtype
        _check(name, gate, up)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 2)], ids=str)
def test_empty(shape):
    gate = torch.empty(shape, device=DEVICE, requires_grad=True)
    up = torch.empty(shape, device=DEVICE, requires_grad=True)
    for name in ACTIVATIONS:
        out = ACTIVATIONS[name][0](gate, up)
        assert out.shape == shape
        dgate, dup = torch.autograd.grad(out, (gate, up), torch.empty(shape, device=DEVICE))
        assert dgate.shape == shape and dup.shape == shape


def test_zero_dim(nan_outputs):
    gate = torch.tensor(-0.75, device=DEVICE, requires_grad=True)
    up = torch.tensor(1.5, device=DEVICE, requires_grad=True)
    for name in ACTIVATIONS:
        _check(name, gate, up)


def test_grads_only_where_needed():
    gate = _randn(4, 16).requires_grad_()
    up = _randn(4, 16, seed=1)
    swiglu(gate, up).sum().backward()
    assert gate.grad is not None and up.grad is None
    torch.testing.assert_close(gate.grad, torch.autograd.grad(
        (F.silu(gate) * up).sum(), gate)[0], rtol=1e-5, atol=1e-6)


def test_non_finite_inputs_as_torch():
    gate = torch.tensor([float("inf"), float("-inf"), float("nan"), 30.0, -30.0, 0.0],
                        device=DEVICE)
    up = torch.full_like(gate, 2.0)
    # Against torch in float64: torch's float32 GELU on some CPUs (AVX512) gives NaN for +inf when
    # the same vector holds a NaN (F.gelu of [inf, -inf, nan] is [nan, nan, nan], of [inf] is
    # [inf]); its float64 kernel gives inf, as the formula does.
    for name in ACTIVATIONS:
        ours_fn, torch_fn = ACTIVATIONS[name]
        want = torch_fn(gate.double(), up.double()).float()
        torch.testing.assert_close(ours_fn(gate, up), want, equal_nan=True)


@pytest.mark.slow  # a CPU compile of forward and backward: tens of seconds
def test_torch_compile_fullgraph_matches_eager():
    def f(fused):
        gate, up = fused.chunk(2, dim=-1)
        return (swiglu(gate, up) + geglu(gate * 0.5, up)).square().sum()

    fused = _randn(5, 2 * 24).requires_grad_()
    compiled = torch.compile(f, fullgraph=True)
    out_c = compiled(fused)
    grad_c, = torch.autograd.grad(out_c, fused)
    out_e = f(fused)
    grad_e, = torch.autograd.grad(out_e, fused)
    torch.testing.assert_close(out_c, out_e)
    torch.testing.assert_close(grad_c, grad_e)


def test_autocast_leaves_dtypes_as_torch():
    # silu, gelu and mul are on no autocast list: under autocast the dtypes are as without.
    dtype = torch.bfloat16
    gate = _randn(3, 20)
    up = _randn(3, 20, dtype=dtype, seed=1)
    with torch.autocast(DEVICE.type, dtype=dtype):
        for name in ACTIVATIONS:
            ours_fn, torch_fn = ACTIVATIONS[name]
            assert ours_fn(gate, up).dtype == torch_fn(gate, up).dtype == torch.float32


def _t(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        (lambda: ([1.0], _t(1)), {}, TypeError, "gate must be a torch.Tensor"),
        (lambda: (_t(1), None), {}, TypeError, "up must be a torch.Tensor"),
        (lambda: (_t(2, dtype=torch.int32), _t(2)), {}, TypeError, "gate must have dtype"),
        (lambda: (_t(2), _t(2, dtype=torch.float64)), {}, TypeError, "up must have dtype"),
        (lambda: (_t(2, 3), _t(3)), {}, ValueError, "gate and up must have the same shape"),
        (lambda: (_t(2), _t(2)), {"approximate": "fast"}, ValueError, "approximate"),
        (lambda: (_t(2), _t(2)), {"approximate": True}, TypeError, "approximate"),
    ],
)
def test_bad_input_is_refused_before_launch(args, kwargs, error, match):
    gate, up = args()
    with pytest.raises(error, match=match):
        geglu(gate, up, **kwargs)
    if not kwargs:
        with pytest.raises(error, match=match):
            swiglu(gate, up)


@gpu_only
@pytest.mark.gpu
def test_cpu_tensor_refused_on_gpu():
    with pytest.raises(ValueError, match="up must be on a CUDA device"):
        swiglu(_t(4), torch.ones(4))


@pytest.mark.big_memory
@pytest.mark.gpu
@pytest.mark.slow
@gpu_only
def test_past_2_to_the_31_elements():
    n = 2**31 + 4099
    need = 6 * n * 2 + (1 << 30)  # gate, up, out, dgate, dup in bf16 and a margin
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    g = torch.Generator(device="cuda").manual_seed(11)
    gate = torch.randn(n, dtype=torch.bfloat16, device="cuda", generator=g).requires_grad_()
    up = torch.randn(n, dtype=torch.bfloat16, device="cuda", generator=g).requires_grad_()
    out = swiglu(gate, up)
    # A gradient broadcast from one value (stride 0): the strided path, also past 2**31.
    dout = torch.full((1,), 0.5, dtype=torch.bfloat16, device="cuda").expand(n)
    dgate, dup = torch.autograd.grad(out, (gate, up), dout)
    idx = torch.tensor([0, 1, 2**31 - 4097, 2**31 - 1, 2**31, 2**31 + 1, n - 2, n - 1],
                       device="cuda")
    g64 = gate.detach()[idx].double().requires_grad_()
    u64 = up.detach()[idx].double().requires_grad_()
    ref = F.silu(g64) * u64
    ref_dgate, ref_dup = torch.autograd.grad(ref, (g64, u64), torch.full_like(ref, 0.5))
    for got, want in ((out, ref), (dgate, ref_dgate), (dup, ref_dup)):
        torch.testing.assert_close(got.detach()[idx].double(), want.detach(), rtol=1e-2,
                                   atol=1e-3)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_kept_signature_values_and_grads_on_fresh_data(nan_outputs, name):
    """The calls after a signature's first launch its kept plans (recording: the kept autograd
    forward and backward): values and gradients against float64 torch each time; contiguous
    operands, mixed dtypes, the strided halves of a fused projection, a gradient of float64
    (autograd casts it first) and a strided one."""
    from triton_workshop.ops import glu as glu_module

    glu_module._READY.clear()
    for seed in range(4):
        for gate_dtype, up_dtype in ((torch.bfloat16, torch.bfloat16),
                                     (torch.float32, torch.float32),
                                     (torch.bfloat16, torch.float32)):
            gate = _randn(5, 24, dtype=gate_dtype, seed=50 + seed)
            up = _randn(5, 24, dtype=up_dtype, seed=60 + seed)
            _check(name, gate, up)
            out_dtype = torch.promote_types(gate_dtype, up_dtype)
            dout = _randn(5, 24, dtype=out_dtype, seed=70 + seed, scale=1.0)
            if seed == 1:  # float64 values of out_dtype: autograd's cast is exact
                dout = dout.double()
            if seed == 3:
                dout = _randn(24, 5, dtype=out_dtype, seed=70 + seed, scale=1.0).t()
            _check(name, gate.requires_grad_(), up.requires_grad_(), dout)
            fused = _randn(5, 48, seed=80 + seed)
            _check(name, fused[:, :24].requires_grad_(), fused[:, 24:].requires_grad_())
            _check(name, fused[:, :24].detach(), fused[:, 24:].detach())
