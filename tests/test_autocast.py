"""torch.autocast: every op and module follows it as the torch op it replaces does.

Each case runs our op and torch's equivalent under the same ``torch.autocast`` (CPU here, CUDA on
a GPU) and asks for torch's output dtype; values are compared with a float64 reference computed
from the inputs rounded as torch's autocast rounds them (to the autocast dtype for the
matmul-family ops, not at all for the others). Fresh seeded random data, ragged sizes.

The interpreter computes a ``tl.dot`` of bf16 operands wrongly (INTERPRETER.md); the
matmul-family kernels upcast bf16 operands there (``DOT_IN_FP32``), so bf16 values are checked on
the CPU too, with a tolerance of two bf16 ulps because the interpreter truncates fp32 -> bf16
where a GPU rounds. On a GPU the same tests check CUDA autocast (softmax and layer_norm then
compute in fp32, as on torch's CUDA fp32 list).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triton_workshop as tw
from triton_workshop import runtime
from triton_workshop.nn import (
    LayerNorm,
    LayerNormLinear,
    Linear,
    MultiheadAttention,
    MultiheadSelfAttention,
    Softmax,
)
from triton_workshop.ops.matmul import tf32_enabled
from triton_workshop.runtime import registry

DEVICE = runtime.DEVICE
DEVICE_TYPE = DEVICE.type
AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]
# Relative error bounds by the dtype a result is computed in: fp32 accumulation plus one rounding
# of the output (bf16: two ulps, for the interpreter's truncation).
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
GPU_ONLY = pytest.mark.skipif(
    not torch.cuda.is_available() or tw.INTERPRET,
    reason="needs a CUDA GPU with compiled kernels (not the interpreter)",
)


@pytest.fixture(autouse=True)
def ieee_fp32():
    """fp32 results compare with exact fp32: TF32 off (matmul's and conv2d's settings), then
    restored."""
    before = tf32_enabled(), torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def rand(*shape, seed, dtype=torch.float32, positive=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g)
    return (t.abs() + 0.1 if positive else t).to(DEVICE, dtype)


def autocast(dtype):
    return torch.autocast(DEVICE_TYPE, dtype=dtype)


def assert_close(out, ref, dtype, factor=1.0, computed_in=None):
    """``out`` has ``dtype`` and is within the tolerance of the dtype it was computed in
    (``computed_in``, by default ``dtype``), times ``factor``."""
    assert out.dtype == dtype, (out.dtype, dtype)
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()
    err = out.double() - ref
    tol = TOL[computed_in or dtype] * factor
    assert (err.norm() / ref.norm().clamp_min(1e-30)).item() <= tol
    assert (err.abs().max() / ref.abs().max().clamp_min(1e-30)).item() <= 4 * tol


# ---------------------------------------------------------------------------------------------
# The ops, each against the torch op it replaces.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    ours: Callable
    torch_fn: Callable
    inputs: Callable  # autocast dtype -> tuple of tensors
    lowers: bool  # torch casts the inputs to the autocast dtype (its lower_precision_fp list)
    factor: float = 1.0  # attention on a GPU rounds P (and dS) to the low precision before its dots


def _gelu_addmm(bias, a, b):
    return F.gelu(torch.addmm(bias, a, b), approximate="tanh")


CASES = [
    Case("matmul_bias_gelu",
         lambda a, b, bias: tw.matmul(a, b, bias=bias, activation="gelu"),
         lambda a, b, bias: _gelu_addmm(bias, a, b),
         lambda dt: (rand(33, 40, seed=1), rand(40, 27, seed=2), rand(27, seed=3)), True),
    Case("matmul_batched_mixed", tw.matmul, torch.matmul,
         lambda dt: (rand(3, 17, 24, seed=4, dtype=dt), rand(24, 19, seed=5)), True),
    Case("linear", tw.linear, F.linear,
         lambda dt: (rand(2, 7, 40, seed=6), rand(24, 40, seed=7), rand(24, seed=8)), True),
    # The input of a Linear that follows any autocast op: low precision, the weight fp32.
    Case("linear_mixed", tw.linear, F.linear,
         lambda dt: (rand(9, 40, seed=9, dtype=dt), rand(24, 40, seed=10), rand(24, seed=11)),
         True),
    Case("conv2d",
         lambda x, w, b: tw.conv2d(x, w, b, stride=2, padding=1),
         lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
         lambda dt: (rand(2, 6, 9, 11, seed=12), rand(8, 6, 3, 3, seed=13), rand(8, seed=14)),
         True),
    Case("attention_causal",
         lambda q, k, v: tw.attention(q, k, v, causal=True),
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         lambda dt: (rand(1, 2, 13, 16, seed=15), rand(1, 2, 13, 16, seed=16),
                     rand(1, 2, 13, 16, seed=17, dtype=dt)), True, factor=3.0),
    Case("layer_norm_linear", tw.layer_norm_linear,
         lambda x, g, b, w, bias: F.linear(F.layer_norm(x, (32,), g, b), w, bias),
         lambda dt: (rand(3, 5, 32, seed=18), rand(32, seed=19), rand(32, seed=20),
                     rand(20, 32, seed=21), rand(20, seed=22)), True),
    Case("layer_norm",
         lambda x, w, b: tw.layer_norm(x, (30,), w, b),
         lambda x, w, b: F.layer_norm(x, (30,), w, b),
         lambda dt: (rand(6, 30, seed=23), rand(30, seed=24), rand(30, seed=25)), False),
    Case("layer_norm_mixed",
         lambda x, w, b: tw.layer_norm(x, (30,), w, b),
         lambda x, w, b: F.layer_norm(x, (30,), w, b),
         lambda dt: (rand(6, 30, seed=26, dtype=dt), rand(30, seed=27), rand(30, seed=28)), False),
    Case("softmax", tw.softmax, lambda x: torch.softmax(x, -1),
         lambda dt: (rand(5, 37, seed=29),), False),
    Case("softmax_low_precision", tw.softmax, lambda x: torch.softmax(x, -1),
         lambda dt: (rand(5, 37, seed=30, dtype=dt),), False),
    # Not on any autocast list: torch promotes mixed inputs, and so does ours.
    Case("add_mixed", tw.add, torch.add,
         lambda dt: (rand(4, 33, seed=31, dtype=dt), rand(4, 33, seed=32)), False),
    Case("fused_mul_add_sqrt_mixed", tw.fused_mul_add_sqrt,
         lambda a, b, c: torch.sqrt(a * b + c),
         lambda dt: (rand(50, seed=33, positive=True), rand(50, seed=34, dtype=dt, positive=True),
                     rand(50, seed=35, positive=True)), False),
]


def _rounded(tensors, dtype, lowers):
    """The inputs as torch's autocast hands them to the op, in float64."""
    return [(t.to(dtype) if lowers and t.is_floating_point() else t).double() for t in tensors]


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_follows_autocast_like_torch(case, dtype):
    inputs = case.inputs(dtype)
    with autocast(dtype):
        out = case.ours(*inputs)
        want_dtype = case.torch_fn(*inputs).dtype
    if case.lowers:
        assert want_dtype == dtype  # the premise: torch computes these in the autocast dtype
    reference = case.torch_fn(*_rounded(inputs, dtype, case.lowers))
    assert_close(out, reference, want_dtype, factor=case.factor)


@pytest.mark.parametrize("case", [c for c in CASES if c.lowers], ids=lambda c: c.name)
def test_matmul_family_fp32_inputs_are_unchanged_without_autocast(case):
    inputs = case.inputs(torch.float32)
    out = case.ours(*inputs)
    assert_close(out, case.torch_fn(*[t.double() for t in inputs]), torch.float32)


LOWER_GRAD_CASES = ["matmul_bias_gelu", "linear", "conv2d", "attention_causal", "layer_norm_linear"]


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("case", [c for c in CASES if c.name in LOWER_GRAD_CASES],
                         ids=lambda c: c.name)
def test_gradients_reach_fp32_leaves_in_fp32(case, dtype):
    """The casts sit on the autograd graph: the fp32 leaves get fp32 gradients, those of the
    computation at the rounded inputs (the cast passes its gradient straight through)."""
    inputs = case.inputs(dtype)
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    with autocast(dtype):
        out = case.ours(*leaves)
    assert out.dtype == dtype
    dy = rand(*out.shape, seed=99)
    (out.float() * dy).sum().backward()  # outside autocast, as torch recommends

    ref_leaves = [t.requires_grad_(True) for t in _rounded(inputs, dtype, True)]
    ref_out = case.torch_fn(*ref_leaves)
    ref_out.backward(dy.to(dtype).double())  # the gradient reaches the op in the autocast dtype
    assert any(leaf.dtype == torch.float32 for leaf in leaves)
    for leaf, ref in zip(leaves, ref_leaves):
        assert leaf.grad.dtype == leaf.dtype  # fp32 leaves: fp32 gradients
        # The backward runs in the autocast dtype: a few roundings of that dtype.
        assert_close(leaf.grad, ref.grad, leaf.dtype, factor=2 * case.factor, computed_in=dtype)


# ---------------------------------------------------------------------------------------------
# Mixed dtypes outside autocast: the clear error of before.
# ---------------------------------------------------------------------------------------------
def test_mixed_dtypes_outside_autocast_still_raise():
    x, w = rand(4, 8, seed=40, dtype=torch.bfloat16), rand(3, 8, seed=41)
    with pytest.raises(TypeError, match=r"^weight has dtype torch\.float32 but x has torch\.bf"):
        tw.linear(x, w)
    with pytest.raises(TypeError, match=r"^b has dtype torch\.float32 but a has torch\.bfloat16"):
        tw.matmul(x, w.t())
    with pytest.raises(TypeError, match=r"weight has dtype torch\.float32 but x has torch\.fl"):
        tw.conv2d(rand(1, 2, 5, 5, seed=42, dtype=torch.float16), rand(3, 2, 3, 3, seed=43))
    q = rand(1, 1, 4, 8, seed=44, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"k has dtype torch\.float32 but q has torch\.float16"):
        tw.attention(q, q.float(), q)


def test_mixed_dtypes_under_autocast_of_another_device_type_still_raise():
    """Autocast is per device type: on for another one, these tensors are not cast."""
    other = "cuda" if DEVICE_TYPE == "cpu" else "cpu"
    x, w = rand(4, 8, seed=45, dtype=torch.bfloat16), rand(3, 8, seed=46)
    before = torch.is_autocast_enabled(other)
    torch.set_autocast_enabled(other, True)  # without the context manager's device checks
    try:
        assert torch.is_autocast_enabled(other) and not torch.is_autocast_enabled(DEVICE_TYPE)
        with pytest.raises(TypeError, match="weight has dtype"):
            tw.linear(x, w)
        assert tw.linear(x.float(), w).dtype == torch.float32
    finally:
        torch.set_autocast_enabled(other, before)


# ---------------------------------------------------------------------------------------------
# Ops that torch's autocast does not touch.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
def test_image_ops_are_not_on_autocast_lists(dtype):
    img, kernel = rand(2, 3, 11, 13, seed=50).sigmoid(), rand(3, 3, seed=51)
    without = (tw.greyscale(img), tw.sepia(img), tw.filter2d(img, kernel))
    with autocast(dtype):
        under = (tw.greyscale(img), tw.sepia(img), tw.filter2d(img, kernel))
    for a, b in zip(without, under):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# The modules.
# ---------------------------------------------------------------------------------------------
def _seeded(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def _module_pair(name):
    """(ours, torch's equivalent with the same parameters, input)."""
    if name == "linear":
        theirs = _seeded(nn.Linear(40, 24, device=DEVICE), 60)
        ours = Linear(40, 24, device=DEVICE)
        ours.load_state_dict(theirs.state_dict())
        return ours, theirs, rand(3, 5, 40, seed=61)
    if name == "layer_norm":
        theirs = _seeded(nn.LayerNorm(36, device=DEVICE), 62)
        ours = LayerNorm(36, device=DEVICE)
        ours.load_state_dict(theirs.state_dict())
        return ours, theirs, rand(4, 36, seed=63)
    if name == "softmax":
        return Softmax(-1), nn.Softmax(-1), rand(4, 29, seed=64)
    if name == "layer_norm_linear":
        ln = _seeded(nn.LayerNorm(32, device=DEVICE), 65)
        lin = _seeded(nn.Linear(32, 12, device=DEVICE), 66)
        return LayerNormLinear.from_modules(ln, lin), nn.Sequential(ln, lin), rand(7, 32, seed=67)
    if name == "mlp":  # a Linear after an autocast op, a LayerNorm after a Linear
        theirs = _seeded(nn.Sequential(nn.Linear(20, 32), nn.GELU(), nn.Linear(32, 16),
                                       nn.LayerNorm(16), nn.Linear(16, 8)).to(DEVICE), 68)
        ours = nn.Sequential(Linear(20, 32), nn.GELU(), Linear(32, 16), LayerNorm(16),
                             Linear(16, 8)).to(DEVICE)
        ours.load_state_dict(theirs.state_dict())
        return ours, theirs, rand(6, 20, seed=69)
    raise AssertionError(name)


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["linear", "layer_norm", "softmax", "layer_norm_linear", "mlp"])
def test_module_follows_autocast_like_torch(name, dtype):
    ours, theirs, x = _module_pair(name)
    with autocast(dtype):
        out = ours(x)
        want = theirs(x)
    reference = copy.deepcopy(theirs).double()(x.double())  # what both approximate
    assert out.dtype == want.dtype
    # Low-precision roundings at every layer boundary, as torch's own module has them (a module
    # torch's autocast leaves alone computes in its input's dtype).
    computed_in = dtype if name in ("linear", "layer_norm_linear", "mlp") else x.dtype
    assert_close(out, reference, out.dtype, factor=3, computed_in=computed_in)


def _mha_pair(seed, **kwargs):
    theirs = nn.MultiheadAttention(24, 3, device=DEVICE, **kwargs)
    ours = MultiheadAttention(24, 3, device=DEVICE, **kwargs)
    _seeded(theirs, seed)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_multihead_attention_follows_autocast_like_torch(self_attention, dtype):
    ours, theirs = _mha_pair(70, batch_first=True)
    query = rand(2, 9, 24, seed=71)
    key = query if self_attention else rand(2, 6, 24, seed=72)
    value = query if self_attention else rand(2, 6, 24, seed=73)
    with autocast(dtype):
        out, weights = ours(query, key, value)
        want, want_weights = theirs(query, key, value)
    ref_out, ref_weights = copy.deepcopy(theirs).double()(query.double(), key.double(),
                                                           value.double())
    assert (out.dtype, weights.dtype) == (want.dtype, want_weights.dtype)
    assert out.dtype == dtype  # projections and attention in the autocast dtype, as torch's
    assert_close(out, ref_out, out.dtype, factor=3)
    # From q and k in the autocast dtype, whatever dtype the weights are returned in.
    assert_close(weights, ref_weights, weights.dtype, factor=3, computed_in=dtype)


def test_multihead_self_attention_module_follows_autocast():
    torch_mha = _seeded(nn.MultiheadAttention(24, 2, batch_first=True, device=DEVICE), 74)
    ours = MultiheadSelfAttention.from_torch(torch_mha)
    x = rand(2, 10, 24, seed=75)
    with autocast(torch.bfloat16):
        out = ours(x)
    x64 = x.double()
    ref, _ = copy.deepcopy(torch_mha).double()(x64, x64, x64, need_weights=False)
    assert_close(out, ref, torch.bfloat16, factor=3)


def test_module_gradients_reach_fp32_parameters():
    ours, theirs = _mha_pair(76, batch_first=True)
    x = rand(2, 7, 24, seed=77).requires_grad_(True)
    with autocast(torch.float16):
        out, _ = ours(x, x, x, need_weights=False)
    out.float().square().sum().backward()
    assert x.grad.dtype == torch.float32
    for name, p in ours.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------------------------
# torch.compile and torch's dispatcher see the same casts.
# ---------------------------------------------------------------------------------------------
def _block(x, ln_w, w, b, w2):
    h = tw.layer_norm(x, (x.shape[-1],), ln_w)
    h = tw.linear(h, w, b, activation="gelu")
    return tw.softmax(tw.linear(h, w2), -1)


def test_torch_compile_fullgraph_under_autocast():
    torch._dynamo.reset()
    inputs = (rand(6, 32, seed=80), rand(32, seed=81), rand(48, 32, seed=82), rand(48, seed=83),
              rand(16, 48, seed=84))
    compiled = torch.compile(_block, fullgraph=True)
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    eager_leaves = [t.clone().requires_grad_(True) for t in inputs]
    with autocast(torch.float16):
        out = compiled(*leaves)
        want = _block(*eager_leaves)
    assert out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=2e-3, atol=2e-3)
    out.float().sum().backward()
    want.float().sum().backward()
    for leaf, eager in zip(leaves, eager_leaves):
        assert leaf.grad.dtype == torch.float32
        torch.testing.assert_close(leaf.grad, eager.grad, rtol=2e-2, atol=2e-3)
    # Without autocast the same compiled function computes in fp32 (a guard, not a stale graph).
    assert compiled(*inputs).dtype == torch.float32


def test_torch_compile_fullgraph_with_autocast_inside_and_mixed_dtypes():
    torch._dynamo.reset()

    def fn(x, w, b):
        with torch.autocast(DEVICE_TYPE, dtype=torch.float16):
            return tw.linear(x, w, b)

    x, w, b = rand(5, 24, seed=85, dtype=torch.float16), rand(12, 24, seed=86), rand(12, seed=87)
    out = torch.compile(fn, fullgraph=True)(x, w, b)
    assert out.dtype == torch.float16
    assert_close(out, F.linear(*_rounded((x, w, b), torch.float16, True)), torch.float16)


def test_dispatcher_path_applies_the_same_policy():
    """``torch.ops.triton_workshop.*`` and calls under a dispatch mode go through the op's
    ``Autocast<Device>`` kernel; the mode sees the op called with the cast tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "triton_workshop" in str(func):
                dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor)]
                self.seen.append((str(func), dtypes))
            return func(*args, **(kwargs or {}))

    a, b = rand(9, 16, seed=88), rand(16, 5, seed=89)
    with autocast(torch.bfloat16):
        direct = torch.ops.triton_workshop.matmul(a, b, None, "none", 0.0)
        with Record() as record:
            recorded = tw.matmul(a, b)
    assert direct.dtype == recorded.dtype == torch.bfloat16
    assert record.seen == [("triton_workshop.matmul.default", [torch.bfloat16, torch.bfloat16])]
    assert_close(direct, a.bfloat16().double() @ b.bfloat16().double(), torch.bfloat16)


PAIRS = [  # our registered op, the torch op it follows
    ("matmul", "aten::matmul"), ("conv2d", "aten::conv2d"),
    ("attention_forward", "aten::scaled_dot_product_attention"),
    ("layer_norm_linear_forward", "aten::linear"), ("layer_norm_forward", "aten::layer_norm"),
    ("softmax_forward", "aten::softmax.int"), ("add", "aten::add.Tensor"),
]


@pytest.mark.parametrize("ours, theirs", PAIRS, ids=[p[0] for p in PAIRS])
@pytest.mark.parametrize("key", ["AutocastCPU", "AutocastCUDA"])
def test_autocast_kernels_registered_where_torchs_are(ours, theirs, key):
    """Our op has an autocast kernel for a device type exactly where torch's op has one (is on
    one of that device type's autocast lists)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(f"triton_workshop::{ours}", key) == has(theirs, key)


def test_cuda_rules_mirror_torchs_cuda_lists():
    """softmax and layer_norm are on torch's CUDA fp32 list; the matmul family on its lower
    precision list (torch.amp docs, "CUDA Ops that can autocast to float32/float16"). The CUDA
    autocast *state* can be set without a GPU; the rules are read for that device type."""
    from triton_workshop.ops.attention import attention_forward
    from triton_workshop.ops.conv import _conv2d
    from triton_workshop.ops.layer_norm import layer_norm_forward
    from triton_workshop.ops.layer_norm_linear import layer_norm_linear_forward
    from triton_workshop.ops.matmul import _matmul
    from triton_workshop.ops.softmax import softmax_forward

    before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    try:
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        for op in (_matmul, _conv2d, attention_forward, layer_norm_linear_forward):
            assert op.autocast_policy.dtype_for("cuda") == torch.bfloat16
        for op in (softmax_forward, layer_norm_forward):
            assert op.autocast_policy.dtype_for("cuda") == torch.float32
            assert op.autocast_policy.dtype_for("cpu") is None
    finally:
        torch.set_autocast_enabled("cuda", before[0])
        torch.set_autocast_dtype("cuda", before[1])


# ---------------------------------------------------------------------------------------------
# The policy itself.
# ---------------------------------------------------------------------------------------------
def test_policy_casts_what_torch_casts():
    policy = registry.AutocastPolicy("lower_precision_fp")
    x32, x64 = rand(3, seed=90), rand(3, seed=91, dtype=torch.float64)
    ints, x16 = torch.arange(3, device=DEVICE), rand(3, seed=92, dtype=torch.float16)
    args = (x32, x64, ints, None, 2.5, "gelu")
    assert policy.cast(args, {"w": x32}) == (args, {"w": x32})  # autocast off: untouched
    with autocast(torch.bfloat16):
        cast, kwargs = policy.cast(args, {"w": x32, "h": x16})
    assert [type(a) for a in cast] == [type(a) for a in args]
    assert cast[0].dtype == torch.bfloat16 and torch.equal(cast[0], x32.bfloat16())
    assert cast[1] is x64 and cast[2] is ints and cast[3:] == args[3:]  # never float64, ints
    assert kwargs["w"].dtype == kwargs["h"].dtype == torch.bfloat16


def test_policy_is_off_inside_an_ops_own_implementation():
    """As torch runs an op's kernel below its autocast key: ops a launcher calls do not cast."""
    policy = registry.AutocastPolicy("fp32")
    x = rand(4, seed=93, dtype=torch.float16)
    with autocast(torch.bfloat16):
        assert policy.cast((x,))[0][0].dtype == torch.float32
        inside = runtime.launch_directly(lambda t: policy.cast((t,))[0][0])(x)
    assert inside is x


def test_autocast_off_costs_one_check(monkeypatch):
    """With autocast off nothing past ``torch._C._is_any_autocast_enabled`` runs: the per-device
    queries would raise here."""
    def boom(*args, **kwargs):
        raise AssertionError("autocast queried per device with autocast off")

    monkeypatch.setattr(torch, "is_autocast_enabled", boom)
    monkeypatch.setattr(torch, "get_autocast_dtype", boom)
    x, w = rand(5, 8, seed=94), rand(3, 8, seed=95)
    torch.testing.assert_close(tw.linear(x, w), (x.double() @ w.double().t()).float(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec, error, match", [
    ("bf16", ValueError, "autocast rules must be one of"),
    ({"mps": "fp32"}, ValueError, "names device types"),
    ({"cuda": "lower"}, ValueError, "autocast rules must be one of"),
    (3, TypeError, "autocast must be None"),
])
def test_register_op_rejects_bad_autocast(spec, error, match):
    with pytest.raises(error, match=match):
        runtime.register_op("_test_bad_autocast", fake=lambda x: x, autocast=spec)
    assert not hasattr(torch.ops.triton_workshop, "_test_bad_autocast")


# ---------------------------------------------------------------------------------------------
# On a GPU: CUDA autocast, bf16 values on the tensor cores.
# ---------------------------------------------------------------------------------------------
@GPU_ONLY
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
def test_cuda_softmax_and_layer_norm_compute_in_fp32(dtype):
    x = rand(8, 257, seed=96, dtype=dtype)
    with torch.autocast("cuda", dtype=dtype):
        s, n = tw.softmax(x), tw.layer_norm(x, (257,))
        assert (s.dtype, n.dtype) == (torch.softmax(x, -1).dtype, F.layer_norm(x, (257,)).dtype)
    assert s.dtype == n.dtype == torch.float32
    assert_close(s, torch.softmax(x.double(), -1), torch.float32)
    assert_close(n, F.layer_norm(x.double(), (257,)), torch.float32, factor=10)


@GPU_ONLY
def test_cuda_bf16_linear_matches_torch_autocast():
    x, w, b = rand(300, 512, seed=97), rand(384, 512, seed=98), rand(384, seed=99)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, want = tw.linear(x, w, b), F.linear(x, w, b)
    assert out.dtype == want.dtype == torch.bfloat16
    ref = F.linear(*_rounded((x, w, b), torch.bfloat16, True))
    assert_close(out, ref, torch.bfloat16)
    assert_close(want, ref, torch.bfloat16)  # the premise: torch's own is as close
