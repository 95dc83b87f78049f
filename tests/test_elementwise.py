"""The public elementwise ops: ``triton_workshop.add`` and ``triton_workshop.fused_mul_add_sqrt``.

Every result is compared with a float64 reference computed from the very same (already rounded)
inputs, so the only error allowed is the op's own rounding. Tensors live on ``DEVICE``: the CPU in
interpreter mode, the GPU when there is one, so the same file tests both.
"""

from __future__ import annotations

import dataclasses
import gc
import zlib

import pytest
import torch

import triton_workshop as tw
from triton_workshop import DEVICE, INTERPRET
from triton_workshop.ops import elementwise as elementwise_ops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
# 4096 is the kernels' block (ElementwiseTuning.block_size): one element, a partial block,
# exactly one block, one past it, several blocks with a partial tail, and a 3-D shape (5883
# elements, two blocks, the last partial).
SHAPES = [(1,), (7,), (4095,), (4096,), (4097,), (10_000,), (3, 37, 53)]
SHAPE_IDS = ["1", "7", "4095", "4096", "4097", "10000", "3x37x53"]

ON_GPU = torch.cuda.is_available() and not INTERPRET
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device with compiled kernels")

ADD_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
]


def tol(dtype: torch.dtype) -> dict:
    """fp32: the op rounds once (2**-24 relative); fp16/bf16: one rounding to 11/8 bits."""
    if dtype == torch.float32:
        return dict(rtol=1e-6, atol=1e-7)
    return dict(rtol=1e-2, atol=1e-5)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, dtype, g, device=DEVICE) -> torch.Tensor:
    """Standard normal, never exactly zero (so a kernel that writes nothing cannot pass)."""
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    t = torch.where(t == 0, torch.ones_like(t), t)
    return t.to(dtype).to(device)


def positive(shape, dtype, g, device=DEVICE) -> torch.Tensor:
    """Uniform in [0.1, 2.1): strictly positive, so a*b + c > 0 and sqrt is defined."""
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 + 0.1).to(dtype).to(device)


def seed_of(*parts) -> int:
    """A stable seed per test case (``hash`` of a str changes from run to run)."""
    return zlib.crc32(repr(parts).encode())


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, shape) -> None:
    assert out.shape == torch.Size(shape)
    assert out.dtype == dtype
    assert out.device.type == DEVICE.type
    assert not torch.isnan(out).any(), "output holds NaN: some elements were never written"
    torch.testing.assert_close(out.double(), ref.double(), **tol(dtype))


# --------------------------------------------------------------------------------------------
# Values: dtypes x sizes.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", ADD_DTYPES, ids=DTYPE_IDS)
def test_add_matches_float64_reference(dtype, shape):
    g = gen(seed_of("add", dtype, shape))
    x, y = randn(shape, dtype, g), randn(shape, dtype, g)
    out = tw.add(x, y)
    check(out, x.double() + y.double(), dtype, shape)


def test_add_bf16_exact_small_values():
    """The shortest reproduction of the bf16 bug: 1+1, 2+2, -1.5+-1.5 are exact in bf16."""
    x = torch.tensor([1.0, 2.0, -1.5], dtype=torch.bfloat16, device=DEVICE)
    out = tw.add(x, x)  # interpreter: [1.7014e+38, -0.0, inf]
    assert out.tolist() == [2.0, 4.0, -3.0]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_mul_add_sqrt_matches_float64_reference(dtype, shape):
    g = gen(seed_of("fmas", dtype, shape))
    a, b, c = (positive(shape, dtype, g) for _ in range(3))
    out = tw.fused_mul_add_sqrt(a, b, c)
    check(out, torch.sqrt(a.double() * b.double() + c.double()), dtype, shape)


def test_inputs_are_not_modified():
    g = gen(1)
    a, b, c = (positive((5000,), torch.float32, g) for _ in range(3))
    copies = [t.clone() for t in (a, b, c)]
    tw.fused_mul_add_sqrt(a, b, c)
    tw.add(a, b)
    for t, t0 in zip((a, b, c), copies):
        assert torch.equal(t, t0)


@pytest.mark.parametrize("n", [1, 63, 64, 65, 200])
def test_replaced_tuning_takes_effect(n, monkeypatch, planned_launches):
    """Plans are keyed on TUNING: a smaller block gives a grid of more programs at once (and
    the ragged last block stays masked), and the default comes back with the default's plans."""
    g = gen(seed_of("tuning", n))
    a, b, c = (positive((n,), torch.float16, g) for _ in range(3))
    with monkeypatch.context() as m:
        m.setattr(elementwise_ops, "TUNING",
                  dataclasses.replace(elementwise_ops.TUNING, block_size=64, num_warps=2))
        check(tw.fused_mul_add_sqrt(a, b, c), torch.sqrt(a.double() * b.double() + c.double()),
              torch.float16, (n,))
        check(tw.add(a, b), a.double() + b.double(), torch.float16, (n,))
    check(tw.add(a, b), a.double() + b.double(), torch.float16, (n,))
    blocks = (-(-n // 64),)
    assert planned_launches == [("mul_add_sqrt_kernel", blocks), ("add_kernel", blocks),
                                ("add_kernel", (1,))]


def test_zero_dim_tensors():
    out = tw.add(torch.tensor(1.5, device=DEVICE), torch.tensor(2.25, device=DEVICE))
    assert out.shape == () and out.item() == 3.75


# --------------------------------------------------------------------------------------------
# Broadcasting and dtype promotion, like torch.add.
# --------------------------------------------------------------------------------------------
def test_add_broadcasts_like_torch():
    g = gen(2)
    x, y = randn((4, 1, 5), torch.float32, g), randn((3, 5), torch.float32, g)
    out = tw.add(x, y)
    assert out.shape == torch.add(x, y).shape == (4, 3, 5)
    check(out, x.double() + y.double(), torch.float32, (4, 3, 5))
    # The other way round too.
    check(tw.add(y, x), y.double() + x.double(), torch.float32, (4, 3, 5))


def test_fused_mul_add_sqrt_broadcasts():
    g = gen(3)
    a = positive((4, 1, 5), torch.float32, g)
    b = positive((3, 5), torch.float32, g)
    c = positive((1,), torch.float32, g)
    out = tw.fused_mul_add_sqrt(a, b, c)
    check(out, torch.sqrt(a.double() * b.double() + c.double()), torch.float32, (4, 3, 5))


@pytest.mark.parametrize(
    "dx, dy",
    [
        (torch.float16, torch.float32),
        (torch.float32, torch.float16),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.bfloat16),  # torch promotes this pair to float32
    ],
    ids=["fp16+fp32", "fp32+fp16", "bf16+fp32", "fp16+bf16"],
)
def test_add_promotes_like_torch(dx, dy):
    g = gen(seed_of("promote", dx, dy))
    x, y = randn((1000,), dx, g), randn((1000,), dy, g)
    want = torch.add(x, y).dtype
    out = tw.add(x, y)
    assert out.dtype == want == torch.float32
    check(out, x.double() + y.double(), want, (1000,))


def test_fused_mul_add_sqrt_promotes():
    g = gen(4)
    a = positive((300,), torch.float16, g)
    b = positive((300,), torch.float32, g)
    c = positive((300,), torch.bfloat16, g)
    out = tw.fused_mul_add_sqrt(a, b, c)
    assert out.dtype == torch.float32
    check(out, torch.sqrt(a.double() * b.double() + c.double()), torch.float32, (300,))


# --------------------------------------------------------------------------------------------
# Non-contiguous inputs and empty tensors.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ADD_DTYPES, ids=DTYPE_IDS)
def test_add_transposed_inputs(dtype):
    g = gen(seed_of("t", dtype))
    x = randn((70, 90), dtype, g).t()
    y = randn((90, 70), dtype, g)
    assert not x.is_contiguous()
    check(tw.add(x, y), x.double() + y.double(), dtype, (90, 70))
    check(tw.add(y, x), y.double() + x.double(), dtype, (90, 70))


def _strided(dtype, seed):
    base = positive((3 * 5000,), dtype, gen(seed))
    a, b, c = base[::3], base[1::3], base[2::3]  # strided, b and c also start at an offset
    assert not a.is_contiguous() and b.storage_offset() == 1
    return base, a, b, c


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_inputs_sliced_with_step_and_offset(dtype):
    _, a, b, c = _strided(dtype, seed_of("sf", dtype))
    check(tw.fused_mul_add_sqrt(a, b, c),
          torch.sqrt(a.double() * b.double() + c.double()), dtype, a.shape)


@pytest.mark.parametrize("dtype", ADD_DTYPES, ids=DTYPE_IDS)
def test_add_inputs_sliced_with_step_and_offset(dtype):
    base, a, _, c = _strided(dtype, seed_of("sa", dtype))
    check(tw.add(a, c), a.double() + c.double(), dtype, a.shape)
    # A contiguous slice that starts at an offset into its storage.
    x, y = base[7:4103], base[:4096]
    check(tw.add(x, y), x.double() + y.double(), dtype, (4096,))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_transposed_inputs(dtype):
    g = gen(seed_of("tf", dtype))
    a = positive((70, 90), dtype, g).t()
    b, c = positive((90, 70), dtype, g), positive((90, 1), dtype, g)
    check(tw.fused_mul_add_sqrt(a, b, c),
          torch.sqrt(a.double() * b.double() + c.double()), dtype, (90, 70))


def test_channels_last_input():
    g = gen(5)
    x = randn((2, 3, 8, 9), torch.float32, g).to(memory_format=torch.channels_last)
    y = randn((2, 3, 8, 9), torch.float32, g)
    check(tw.add(x, y), x.double() + y.double(), torch.float32, (2, 3, 8, 9))


@pytest.mark.parametrize("shape", [(0,), (3, 0)], ids=["0", "3x0"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_tensors(dtype, shape):
    x = torch.empty(shape, dtype=dtype, device=DEVICE)
    out = tw.add(x, x)
    assert out.shape == torch.Size(shape) and out.dtype == dtype and out.numel() == 0
    out = tw.fused_mul_add_sqrt(x, x, x)
    assert out.shape == torch.Size(shape) and out.dtype == dtype and out.numel() == 0


def test_empty_broadcast_result():
    out = tw.add(torch.ones(3, 0, device=DEVICE), torch.ones(1, device=DEVICE))
    assert out.shape == (3, 0) and out.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# Autograd.
# --------------------------------------------------------------------------------------------
def _leaves(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


def test_fused_mul_add_sqrt_gradients_match_torch():
    g = gen(6)
    a, b, c = _leaves(*(positive((37, 53), torch.float32, g) for _ in range(3)))
    ra, rb, rc = _leaves(a, b, c)
    grad = randn((37, 53), torch.float32, g)
    tw.fused_mul_add_sqrt(a, b, c).backward(grad)
    torch.sqrt(ra * rb + rc).backward(grad)
    for mine, ref in ((a, ra), (b, rb), (c, rc)):
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-5, atol=1e-6)


def test_fused_mul_add_sqrt_gradients_with_broadcasting():
    g = gen(7)
    a, b, c = _leaves(positive((4, 1, 5), torch.float32, g), positive((3, 5), torch.float32, g),
                      positive((5,), torch.float32, g))
    ra, rb, rc = _leaves(a, b, c)
    tw.fused_mul_add_sqrt(a, b, c).sum().backward()
    torch.sqrt(ra * rb + rc).sum().backward()
    for mine, ref in ((a, ra), (b, rb), (c, rc)):
        assert mine.grad.shape == mine.shape
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-5, atol=1e-6)


def test_add_gradients_match_torch():
    g = gen(8)
    x, y = _leaves(randn((4, 1, 5), torch.float32, g), randn((3, 5), torch.float32, g))
    rx, ry = _leaves(x, y)
    grad = randn((4, 3, 5), torch.float32, g)
    tw.add(x, y).backward(grad)
    torch.add(rx, ry).backward(grad)
    assert x.grad.shape == x.shape and y.grad.shape == y.shape
    torch.testing.assert_close(x.grad, rx.grad)
    torch.testing.assert_close(y.grad, ry.grad)


def test_add_gradient_keeps_input_dtype_under_promotion():
    x = torch.ones(6, dtype=torch.float16, device=DEVICE, requires_grad=True)
    y = torch.ones(6, dtype=torch.float32, device=DEVICE, requires_grad=True)
    tw.add(x, y).sum().backward()
    assert x.grad.dtype == torch.float16 and y.grad.dtype == torch.float32
    assert torch.equal(x.grad.float(), torch.ones(6, device=DEVICE))


@pytest.mark.parametrize("which", ["a", "b", "c"])
def test_float64_rejected_so_no_gradcheck(which):
    """gradcheck needs float64; the ops accept fp32/fp16/bf16 only, and say which argument."""
    args = {n: torch.rand(5, dtype=torch.float32, device=DEVICE) + 0.1 for n in "abc"}
    args[which] = args[which].double().requires_grad_(True)
    with pytest.raises(TypeError, match=rf"^{which} must have dtype in .*float64"):
        tw.fused_mul_add_sqrt(**args)
    if which != "c":
        xy = {"x": args["a"].float(), "y": args["b"].float()}
        name = {"a": "x", "b": "y"}[which]
        xy[name] = args[which]
        with pytest.raises(TypeError, match=rf"^{name} must have dtype in .*float64"):
            tw.add(**xy)
    with pytest.raises(TypeError, match="float64"):
        torch.autograd.gradcheck(tw.add, (args[which], args[which]))


# --------------------------------------------------------------------------------------------
# Bad inputs: clear errors naming the argument, raised before any launch.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, None], ids=["list", "float", "None"])
def test_not_a_tensor(bad):
    t = torch.ones(2, device=DEVICE)
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor"):
        tw.add(bad, t)
    with pytest.raises(TypeError, match=r"^y must be a torch\.Tensor"):
        tw.add(t, bad)
    with pytest.raises(TypeError, match=r"^b must be a torch\.Tensor"):
        tw.fused_mul_add_sqrt(t, bad, t)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_int_dtype_rejected(dtype):
    t = torch.ones(4, device=DEVICE)
    i = torch.ones(4, dtype=dtype, device=DEVICE)
    with pytest.raises(TypeError, match=r"^y must have dtype in"):
        tw.add(t, i)
    with pytest.raises(TypeError, match=r"^c must have dtype in"):
        tw.fused_mul_add_sqrt(t, t, i)


@pytest.mark.parametrize("which", ["x", "y"])
def test_meta_tensor_rejected_naming_argument(which):
    args = {"x": torch.ones(4, device=DEVICE), "y": torch.ones(4, device=DEVICE)}
    args[which] = torch.ones(4, device="meta")
    with pytest.raises(ValueError, match=rf"^{which} must be on .*meta"):
        tw.add(**args)


def test_meta_tensor_rejected_in_fused():
    t = torch.ones(4, device=DEVICE)
    with pytest.raises(ValueError, match=r"^c must be on .*meta"):
        tw.fused_mul_add_sqrt(t, t, torch.ones(4, device="meta"))


def test_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"shapes do not broadcast: x \(3,\), y \(4,\)"):
        tw.add(torch.ones(3, device=DEVICE), torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match=r"do not broadcast.*c \(2, 5\)"):
        tw.fused_mul_add_sqrt(*(torch.ones(s, device=DEVICE) for s in [(4, 5), (5,), (2, 5)]))


# --------------------------------------------------------------------------------------------
# torch.compile.
# --------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script_method, inside torch
def test_torch_compile_fullgraph_matches_eager():
    def f(a, b, c):
        return tw.add(tw.fused_mul_add_sqrt(a, b, c), a) * 2 - b

    g = gen(9)
    a, b, c = (positive((3, 700), torch.float32, g) for _ in range(3))
    eager = f(a, b, c)
    compiled = torch.compile(f, fullgraph=True)(a, b, c)
    assert compiled.shape == eager.shape and compiled.dtype == eager.dtype
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)
    ref = (torch.sqrt(a.double() * b.double() + c.double()) + a.double()) * 2 - b.double()
    torch.testing.assert_close(compiled.double(), ref, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------
# GPU only.
# --------------------------------------------------------------------------------------------
@pytest.mark.big_memory
@pytest.mark.gpu
@pytest.mark.slow
@gpu_only
def test_add_past_2_to_the_31_elements():
    n = 2**31 + 5
    need = 3 * n * 2 + (1 << 30)  # three fp16 tensors and a margin
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    before = torch.cuda.memory_allocated()
    g = torch.Generator(device="cuda").manual_seed(10)
    x = y = out = None
    try:
        x = torch.randn(n, dtype=torch.float16, device="cuda", generator=g)
        y = torch.randn(n, dtype=torch.float16, device="cuda", generator=g)
        out = tw.add(x, y)
        assert out.shape == (n,) and out.dtype == torch.float16
        idx = torch.tensor(
            [0, 1, 2**31 - 4097, 2**31 - 1, 2**31, 2**31 + 1, n - 4097, n - 2, n - 1],
            device="cuda",
        )
        expected = (x[idx].double() + y[idx].double())
        got = out[idx]
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got.double(), expected, rtol=1e-2, atol=1e-3)
        # Past 2**31 an int32 offset would wrap: make sure the tail is not the head again.
        assert not torch.equal(out[n - 5:], out[:5])
    finally:
        del x, y, out
        gc.collect()
        torch.cuda.empty_cache()
    # the 8 GiB of operands are freed (small allocations such as the index tensor may stay cached)
    assert torch.cuda.memory_allocated() - before < 2**20


@pytest.mark.gpu
@pytest.mark.skipif(
    not (ON_GPU and torch.cuda.device_count() >= 2), reason="needs 2 CUDA devices, not interpreted"
)
def test_launches_on_the_tensors_own_device():
    torch.cuda.set_device(0)
    g = gen(11)
    x = randn((10_000,), torch.float32, g, device="cuda:1")
    y = randn((10_000,), torch.float32, g, device="cuda:1")
    a, b, c = (positive((10_000,), torch.float32, g, device="cuda:1") for _ in range(3))
    out = tw.add(x, y)
    out2 = tw.fused_mul_add_sqrt(a, b, c)
    torch.cuda.synchronize(1)
    assert out.device == out2.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0  # the guard restores the current device
    check(out, x.double() + y.double(), torch.float32, (10_000,))
    check(out2, torch.sqrt(a.double() * b.double() + c.double()), torch.float32, (10_000,))


def test_plans_are_per_dtype():
    """A plan's prepared launches are compiled for one dtype: fp32 and fp16 calls of the same
    size must not share a plan (on the GPU an fp32 launch reused for fp16 tensors computed
    garbage: found by the GPU run)."""
    from triton_workshop.ops import elementwise as ew

    n = 1000
    plans = {dtype: ew._plan(ew.add_kernel, n, dtype, ew.TUNING)
             for dtype in (torch.float32, torch.float16, torch.bfloat16)}
    assert len({id(p) for p in plans.values()}) == 3
    for dtype in plans:
        x = torch.randn(n, device=DEVICE).to(dtype)
        y = torch.randn(n, device=DEVICE).to(dtype)
        torch.testing.assert_close(tw.add(x, y), x + y)


# --------------------------------------------------------------------------------------------
# A kept eager signature: repeated calls on fresh data, recording or not.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kept_signature_values_and_grads_on_fresh_data(dtype):
    """The calls after a signature's first launch its kept plan (and, recording, the kept
    autograd forward and backward): values and gradients against float64 torch each time, for
    a gradient of the output's dtype and one of float64 (autograd casts it first)."""
    elementwise_ops._READY.clear()
    # (6, 1, 40) with a stride of its own on the size-1 dim: contiguous, but empty_like would
    # copy that stride, so its kept output is allocated contiguous.
    for shape, strides in (((6, 40), None), ((6, 1, 40), (40, 7, 1))):
        for seed in range(4):
            g = gen(seed_of("kept", dtype, shape, seed))
            x, y, c = (positive(shape, dtype, g) for _ in range(3))
            if strides is not None:
                x, y, c = (t.as_strided(shape, strides) for t in (x, y, c))
            leaves = [t.clone().requires_grad_() for t in (x, y, c)]
            refs = [t.detach().double().requires_grad_() for t in (x, y, c)]
            dout = randn(shape, dtype if seed % 2 else torch.float64, g)
            for ours, theirs, n in ((tw.add, torch.add, 2),
                                    (tw.fused_mul_add_sqrt,
                                     lambda a, b, c_: torch.sqrt(a * b + c_), 3)):
                check(ours(*(x, y, c)[:n]), theirs(*refs[:n]), dtype, shape)
                out = ours(*leaves[:n])
                assert out.is_contiguous() and out.stride() == torch.empty(shape).stride()
                check(out, theirs(*refs[:n]), dtype, shape)
                grads = torch.autograd.grad(out, leaves[:n], dout)
                want = torch.autograd.grad(theirs(*refs[:n]), refs[:n], dout.to(dtype).double())
                for got, ref in zip(grads, want):
                    assert got.dtype == dtype
                    torch.testing.assert_close(got.double(), ref, rtol=3 * tol(dtype)["rtol"],
                                               atol=3 * tol(dtype)["atol"])


def test_fused_mul_add_sqrt_backward_doubles_like_torch():
    """The backward's ``grad / (out + out)`` is torch's ``grad / (2 * result)``, bit for bit,
    large and tiny results included."""
    for dtype in DTYPES:
        out = torch.tensor([1e-20, 0.5, 3.0, 1e18, float("inf")], dtype=dtype, device=DEVICE)
        grad = torch.tensor([1.0, -2.0, 0.25, 3.0, 1.0], dtype=dtype, device=DEVICE)
        torch.testing.assert_close(grad / (out + out), grad / (2 * out), rtol=0, atol=0,
                                   equal_nan=True)
