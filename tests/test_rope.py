"""rope against transformers' own ``apply_rotary_pos_emb`` (Llama, Phi-3's partial rotary, GLM,
Cohere, gpt-oss) and against a float64 evaluation of the same formula: values and gradients.

Tolerances: ours computes in fp32 and rounds once, so against float64 it is within one rounding
of the output dtype (bf16: two ulps, for the interpreter's truncation). transformers rounds each
product and the sum in the output dtype: against it, two more roundings (fp16: ~3 ulps, bf16:
~3 ulps of 2**-8). fp32 inputs agree with transformers to a few fp32 ulps.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from conftest import view_past_2_31
from triton_workshop.ops import rope as rope_ops
from triton_workshop.ops.rope import rope
from triton_workshop.runtime import DEVICE, INTERPRET

hf = pytest.importorskip("transformers", reason="transformers is not installed")
from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb as cohere_rope  # noqa: E402
from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm_rope  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import apply_rotary_pos_emb as gpt_oss_rope  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rope  # noqa: E402
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_rope  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: Against float64: one rounding of the output (bf16 two, see above).
TOL = {
    torch.float32: dict(rtol=2e-6, atol=2e-6),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=8e-3, atol=8e-3),
}
#: Against transformers in the same dtype: its three roundings and ours.
HF_TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=4e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
}
gpu_only = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                              reason="needs a CUDA device with compiled kernels")

#: convention -> (transformers' function, how its rotary module lays out cos: "cat" for
#: cat(freqs, freqs), "interleave" for repeat_interleave(freqs, 2), "half" for freqs once).
FAMILIES = {
    "llama": (phi3_rope, "cat"),  # Phi-3's is Llama's plus partial rotary
    "glm": (glm_rope, "cat"),
    "cohere": (cohere_rope, "interleave"),
    "gpt_oss": (gpt_oss_rope, "half"),
}


def _randn(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    return torch.where(t == 0, torch.full_like(t, 0.5), t).to(dtype).to(DEVICE)


def _cos_sin(shape_tokens, rot, layout="cat", dtype=torch.float32, seed=3):
    """cos/sin as transformers' rotary modules build them, for random positions: ``rot`` lanes
    wide (``layout`` "half": rot // 2 wide)."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4096, shape_tokens, generator=g).double()
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot // 2, dtype=torch.float64) * 2 / rot))
    freqs = positions[..., None] * inv_freq
    emb = {"cat": lambda f: torch.cat((f, f), -1),
           "interleave": lambda f: f.repeat_interleave(2, -1),
           "half": lambda f: f}[layout](freqs)
    return emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)


@pytest.fixture
def nan_outputs(monkeypatch):
    """Every tensor the launchers allocate starts as NaN, so an element never written shows."""
    empty_like = torch.empty_like

    def poisoned(*args, **kwargs):
        t = empty_like(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty_like", poisoned)


def _check(q, k, cos, sin, unsqueeze_dim=1, convention="llama", reference=None):
    """rope and its gradients against ``reference`` (transformers' function) in the inputs'
    dtypes and in float64."""
    reference = reference or FAMILIES[convention][0]
    q_out, k_out = rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, convention=convention)
    with torch.no_grad():
        q_hf, k_hf = reference(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    for ours, theirs, x in ((q_out, q_hf, q), (k_out, k_hf, k)):
        assert ours.shape == x.shape and ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, **HF_TOL[ours.dtype])

    def as64(t):
        return t.detach().double().requires_grad_(t.requires_grad)

    q64, k64, cos64, sin64 = map(as64, (q, k, cos, sin))
    q_ref, k_ref = reference(q64, k64, cos64, sin64, unsqueeze_dim=unsqueeze_dim)
    if convention == "cohere":  # computes in fp32 and returns q's dtype: the reference too
        q_ref, k_ref = q_ref.to(q.dtype).double(), k_ref.to(q.dtype).double()
    for ours, ref in ((q_out, q_ref), (k_out, k_ref)):
        torch.testing.assert_close(ours.double(), ref, **TOL[ours.dtype])
    inputs = [t for t in (q, k, cos, sin) if t.requires_grad]
    if not inputs:
        return
    dq = _randn(q_out.shape, q_out.dtype, seed=21)
    dk = _randn(k_out.shape, k_out.dtype, seed=22)
    grads = torch.autograd.grad((q_out, k_out), inputs, (dq, dk))
    refs = torch.autograd.grad(
        (q_ref, k_ref), [t for t in (q64, k64, cos64, sin64) if t.requires_grad],
        (dq.double(), dk.double()))
    for t, g, r in zip(inputs, grads, refs):
        assert g.dtype == t.dtype and g.shape == t.shape
        tol = TOL[t.dtype]
        # cos/sin gradients sum over heads (and broadcast batch): a few more roundings.
        scale = 4 * float(r.abs().max()) * tol["rtol"]
        torch.testing.assert_close(g.double(), r, rtol=4 * tol["rtol"], atol=tol["atol"] + scale)


@pytest.fixture(params=["by halves", "by halves in tiles", "lane by lane"])
def rotate_half_path(request, monkeypatch):
    """Every way the kernel reads rotate_half's pairs: two contiguous halves of each head (the
    default for an even rotated width), all of a token's heads in one step where they fit and
    every lane rotates, or a tile of heads at a time; or each lane with its gathered partner
    (odd widths)."""
    monkeypatch.setattr(rope_ops, "TUNING", dataclasses.replace(
        rope_ops.TUNING, by_halves=request.param != "lane by lane",
        token_tile_elems=rope_ops.TUNING.token_tile_elems if request.param == "by halves" else 0))
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim,rot", [(64, 64), (80, 80), (128, 128), (80, 32), (64, 16),
                                          (128, 24), (96, 40)], ids=str)
def test_llama_layout_against_transformers(nan_outputs, rotate_half_path, head_dim, rot, dtype):
    # Hugging Face's layout: the projection's (batch, tokens, heads, head_dim) transposed to
    # (batch, heads, tokens, head_dim), cos/sin (batch, tokens, rot) unsqueezed at 1. GQA: k has
    # fewer heads.
    q = _randn((2, 5, 4, head_dim), dtype).transpose(1, 2).requires_grad_()
    k = _randn((2, 5, 2, head_dim), dtype, seed=1).transpose(1, 2).requires_grad_()
    cos, sin = _cos_sin((2, 5), rot, dtype=dtype)
    _check(q, k, cos, sin)
    if rot == head_dim:  # Llama's own function (no partial rotary) computes the same
        _check(q.detach(), k.detach(), cos, sin, reference=llama_rope)


@pytest.mark.parametrize("head_dim,rot", [(64, 64), (80, 48)], ids=str)
def test_heads_in_several_tiles(nan_outputs, rotate_half_path, monkeypatch, head_dim, rot):
    """More heads than one tile holds (the default tile is 8 heads of 128 lanes: Llama's 32 q
    heads take four): here 2 heads a tile, q's 5 heads in three tiles and k's 3 in two, the last
    of each ragged."""
    monkeypatch.setattr(rope_ops, "TUNING", dataclasses.replace(
        rope_ops.TUNING, tile_elems=2 * triton.next_power_of_2(head_dim), token_tile_elems=0))
    q = _randn((2, 3, 5, head_dim)).transpose(1, 2).requires_grad_()
    k = _randn((2, 3, 3, head_dim), seed=1).transpose(1, 2).requires_grad_()
    cos, sin = _cos_sin((2, 3), rot)
    _check(q, k, cos, sin)


@pytest.mark.parametrize("convention", ["glm", "cohere", "gpt_oss"])
@pytest.mark.parametrize("head_dim,rot", [(64, 64), (80, 40), (128, 128)], ids=str)
def test_other_conventions_against_transformers(nan_outputs, rotate_half_path, convention,
                                                head_dim, rot):
    if convention != "glm" and rot != head_dim:
        pytest.skip("Cohere's and gpt-oss's functions rotate whole heads")
    layout = FAMILIES[convention][1]
    for dtype in DTYPES:
        q = _randn((1, 3, 7, head_dim), dtype).requires_grad_()
        k = _randn((1, 1, 7, head_dim), dtype, seed=1).requires_grad_()
        cos, sin = _cos_sin((1, 7), rot, layout, dtype=dtype)
        _check(q, k, cos, sin, convention=convention)


def test_tokens_heads_layout_and_shared_cos(nan_outputs):
    # (batch, tokens, heads, head_dim) with unsqueeze_dim=2; cos (tokens, rot) shared by the
    # batch with unsqueeze_dim=1 (it then aligns as (1, tokens, 1, rot)); 3-D q without batch.
    q = _randn((3, 6, 4, 64)).requires_grad_()
    k = _randn((3, 6, 1, 64), seed=1).requires_grad_()
    cos, sin = _cos_sin((3, 6), 64)
    _check(q, k, cos, sin, unsqueeze_dim=2)
    cos2, sin2 = _cos_sin((6,), 64)
    _check(q, k, cos2, sin2, unsqueeze_dim=1)
    _check(q[0], k[0], cos2, sin2, unsqueeze_dim=1)
    cos_b1, sin_b1 = _cos_sin((1, 6), 64)  # batch 1, broadcast over q's batch of 3
    _check(q.transpose(1, 2), k.transpose(1, 2), cos_b1, sin_b1, unsqueeze_dim=1)


def test_odd_rotary_width_follows_rotate_half(nan_outputs):
    # torch's rotate_half on an odd width is a cyclic shift (cat((-x2, x1)) with halves of 3 and
    # 4 lanes); transformers' rotary modules never build one, but the formula is defined.
    q = _randn((1, 2, 3, 16)).requires_grad_()
    k = _randn((1, 1, 3, 16), seed=1).requires_grad_()
    cos, sin = _randn((1, 3, 7), seed=5), _randn((1, 3, 7), seed=6)
    _check(q, k, cos, sin)


def test_strided_slices_of_a_fused_projection(nan_outputs):
    # q, k as slices of one (batch, tokens, heads_q + 2 heads_kv, head_dim) projection, and a
    # cos that is itself a strided view: all read in place.
    qkv = _randn((2, 5, 4 + 2 * 2, 32)).requires_grad_()
    q, k, _ = qkv.split([4, 2, 2], dim=2)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos_full, sin_full = _cos_sin((2, 5), 48)
    cos, sin = cos_full[..., :32], sin_full[..., :32]
    assert not (q.is_contiguous() or cos.is_contiguous())
    _check(q, k, cos, sin)


def test_mixed_dtypes_promote_like_torch():
    # Under autocast, models pass bf16 q/k with fp32 cos/sin: torch's product is fp32.
    q = _randn((1, 2, 4, 32), torch.bfloat16).requires_grad_()
    k = _randn((1, 2, 4, 32), torch.float16, seed=1).requires_grad_()
    cos, sin = _cos_sin((1, 4), 32)
    _check(q, k, cos, sin)
    q_out, k_out = rope(q, k, cos.half(), sin.half())
    assert q_out.dtype == torch.float32 and k_out.dtype == torch.float16  # bf16 x fp16: fp32
    q_out, k_out = rope(q, k, cos, sin, convention="cohere")
    assert q_out.dtype == k_out.dtype == torch.bfloat16  # Cohere returns q's dtype


def test_autocast_changes_nothing():
    q = _randn((1, 2, 3, 16), torch.bfloat16)
    cos, sin = _cos_sin((1, 3), 16)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        ours = rope(q, q, cos, sin)
        theirs = llama_rope(q, q, cos, sin)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, **HF_TOL[torch.float32])


@pytest.mark.parametrize("convention", ["llama", "gpt_oss"])
def test_dtype_writes_the_rotation_rounded_once(nan_outputs, convention):
    """``dtype=``: the fp32 rotation of bf16 q/k with fp32 cos/sin, written in bf16 (what an
    attention under autocast reads); gradients as without it. The interpreter truncates where a
    GPU rounds: one bf16 ulp there."""
    q = _randn((2, 4, 5, 32), torch.bfloat16).requires_grad_()
    k = _randn((2, 2, 5, 32), torch.bfloat16, seed=1).requires_grad_()
    cos, sin = _cos_sin((2, 5), 16 if convention == "gpt_oss" else 32,
                        "half" if convention == "gpt_oss" else "cat")
    wide = rope(q, k, cos, sin, convention=convention)
    narrow = rope(q, k, cos, sin, convention=convention, dtype=torch.bfloat16)
    ulp = dict(rtol=2 ** -7, atol=2 ** -7) if INTERPRET else dict(rtol=0, atol=0)
    for a, b in zip(wide, narrow):
        assert a.dtype is torch.float32 and b.dtype is torch.bfloat16
        torch.testing.assert_close(b, a.bfloat16(), **ulp)
    grads = [_randn(t.shape, torch.bfloat16, seed=5 + i) for i, t in enumerate(narrow)]
    torch.autograd.backward(narrow, grads)
    dq, dk = q.grad, k.grad
    q.grad = k.grad = None
    torch.autograd.backward(wide, [g.float() for g in grads])
    assert dq.dtype is q.grad.dtype is torch.bfloat16
    torch.testing.assert_close(dq, q.grad, rtol=0, atol=0)
    torch.testing.assert_close(dk, k.grad, rtol=0, atol=0)
    fp16 = rope(q, k, cos, sin, convention=convention, dtype=torch.float16)
    assert fp16[0].dtype is fp16[1].dtype is torch.float16


def test_cos_sin_gradients_when_they_require_grad():
    q = _randn((2, 3, 4, 20)).requires_grad_()
    k = _randn((2, 1, 4, 20), seed=1).requires_grad_()
    for convention, (_, layout) in FAMILIES.items():
        rot = 20 if convention in ("cohere", "gpt_oss") else 12
        cos, sin = _cos_sin((4,), rot, layout)  # (tokens, rot): broadcast over the batch too
        cos.requires_grad_()
        sin.requires_grad_()
        _check(q.transpose(1, 2), k.transpose(1, 2), cos, sin, convention=convention)


def test_grads_only_where_needed():
    q = _randn((1, 2, 3, 8)).requires_grad_()
    k = _randn((1, 2, 3, 8), seed=1)
    cos, sin = _cos_sin((1, 3), 8)
    q_out, k_out = rope(q, k, cos, sin)
    assert not k_out.requires_grad or k_out.grad_fn is not None
    (q_out.sum() + k_out.sum()).backward()
    assert q.grad is not None and k.grad is None


@pytest.mark.parametrize("shape_q,shape_k,shape_cos", [
    ((2, 4, 0, 32), (2, 2, 0, 32), (2, 0, 32)),   # no tokens
    ((0, 4, 3, 32), (0, 2, 3, 32), (0, 3, 32)),   # no batch
    ((1, 4, 3, 32), (1, 0, 3, 32), (1, 3, 32)),   # no k heads
], ids=str)
def test_empty(shape_q, shape_k, shape_cos):
    q = _randn(shape_q).requires_grad_()
    k = _randn(shape_k, seed=1).requires_grad_()
    cos, sin = _randn(shape_cos, seed=2), _randn(shape_cos, seed=3)
    q_out, k_out = rope(q, k, cos, sin)
    assert q_out.shape == shape_q and k_out.shape == shape_k
    q_hf, k_hf = llama_rope(q, k, cos, sin)
    torch.testing.assert_close(q_out, q_hf)
    torch.testing.assert_close(k_out, k_hf)
    dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (torch.ones_like(q_out),
                                                          torch.ones_like(k_out)))
    assert dq.shape == shape_q and dk.shape == shape_k


def test_pass_through_lanes_are_exact():
    q = _randn((1, 1, 2, 8))
    q[..., 6] = float("inf")
    q[..., 7] = -0.0
    cos, sin = _cos_sin((1, 2), 4)
    q_out, _ = rope(q, q, cos, sin)
    assert torch.equal(q_out[..., 4:], q[..., 4:])
    assert torch.signbit(q_out[..., 7]).all()


@pytest.mark.slow  # a CPU compile of forward and backward: tens of seconds
def test_torch_compile_fullgraph_matches_eager():
    def f(q, k, cos, sin):
        q_out, k_out = rope(q * 2.0, k, cos, sin)
        return (q_out.square().sum() + (k_out * 3.0).sum())

    q = _randn((1, 4, 5, 16)).requires_grad_()
    k = _randn((1, 2, 5, 16), seed=1).requires_grad_()
    cos, sin = _cos_sin((1, 5), 16)
    compiled = torch.compile(f, fullgraph=True)
    out_c = compiled(q, k, cos, sin)
    grads_c = torch.autograd.grad(out_c, (q, k))
    out_e = f(q, k, cos, sin)
    grads_e = torch.autograd.grad(out_e, (q, k))
    torch.testing.assert_close(out_c, out_e)
    for a, b in zip(grads_c, grads_e):
        torch.testing.assert_close(a, b)


def _t(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("args,kwargs,error,match", [
    (lambda: ([1.0], _t(1, 2, 3, 8), _t(1, 3, 8), _t(1, 3, 8)), {}, TypeError,
     "q must be a torch.Tensor"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8, dtype=torch.int64), _t(1, 3, 8), _t(1, 3, 8)), {},
     TypeError, "k must have dtype"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 8, dtype=torch.float64), _t(1, 3, 8)),
     {}, TypeError, "cos must have dtype"),
    (lambda: (_t(2, 3, 4, 5, 8), _t(2, 3, 4, 5, 8), _t(1, 3, 8), _t(1, 3, 8)), {}, ValueError,
     "q must have 3 or 4"),
    (lambda: (_t(1, 2, 3, 8), _t(2, 3, 8), _t(1, 3, 8), _t(1, 3, 8)), {}, ValueError,
     "k must have as many"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 6), _t(1, 3, 6), _t(1, 3, 6)), {}, ValueError,
     "k must have q's head_dim"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 8), _t(1, 3, 6)), {}, ValueError,
     "cos and sin must have the same shape"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 10), _t(1, 3, 10)), {}, ValueError,
     "more than q's head_dim"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 4, 8), _t(1, 4, 8)), {}, ValueError,
     "must broadcast to q"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 4, 8), _t(1, 1, 8), _t(1, 1, 8)), {}, ValueError,
     "same batch and token"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 8), _t(1, 3, 8)), {"unsqueeze_dim": 4},
     ValueError, "unsqueeze_dim must be in"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 8), _t(1, 3, 8)), {"unsqueeze_dim": 1.0},
     TypeError, "unsqueeze_dim must be an int"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 8), _t(1, 3, 8)),
     {"convention": "neox"}, ValueError, "convention must be one of"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 5), _t(1, 3, 5)),
     {"convention": "cohere"}, ValueError, "even width"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 8), _t(1, 3, 8)),
     {"dtype": "bfloat16"}, TypeError, "dtype must be None or one of"),
    (lambda: (_t(1, 2, 3, 8), _t(1, 2, 3, 8), _t(1, 3, 8), _t(1, 3, 8)),
     {"dtype": torch.int32}, TypeError, "dtype must be None or one of"),
])
def test_bad_input_is_refused_before_launch(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        rope(*args(), **kwargs)


@pytest.mark.big_memory
@pytest.mark.parametrize("far", ["tokens", "heads"])
def test_offsets_past_2_31_elements(rotate_half_path, far):
    """q's last elements lie past 2**31 from its first: its tokens 2**30 elements apart (a
    token's heads close: the one-step path's int32 offsets within a token from a 64-bit token
    base) or its heads (the tiles' 64-bit offsets)."""
    values = _randn((1, 3, 3, 8), torch.bfloat16, seed=5).requires_grad_()
    far_apart, near = 2**30 + 64, {"tokens": 8, "heads": 24}[far]
    strides = (1, near, far_apart, 1) if far == "tokens" else (1, far_apart, near // 3, 1)
    q = view_past_2_31(values, strides)
    k = _randn((1, 2, 3, 8), torch.bfloat16, seed=6).requires_grad_()
    cos, sin = _cos_sin((1, 3), 8, dtype=torch.bfloat16)
    _check(q, k, cos, sin)


def test_one_step_only_where_offsets_within_a_token_fit_int32():
    """The one-step path indexes a token's heads with int32 offsets: a layout whose heads lie
    2**31 elements apart or more takes the tiles (int64) instead. Only the plan is asked for:
    no tensor that large is made."""
    def plan(head_stride):
        strides = (2**40, 4096, head_stride, 1) * 4 + (4096 * 64, 64, 1) * 2
        return rope_ops._plan(4, 2, 32, 8, 128, 128, strides, "llama", False,
                              (torch.bfloat16,) * 6, rope_ops.TUNING)
    assert plan(128).consts["ONE_STEP"]
    assert not plan(2**27).consts["ONE_STEP"]  # 31 heads x 2**27 > 2**31


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("token_tile_elems", [8192, 0], ids=["one step", "tiles"])
def test_llama_sizes_on_the_gpu(monkeypatch, token_tile_elems):
    # A Llama-3-8B attention block's shapes (32 q heads, 8 kv heads, head_dim 128) in bf16.
    monkeypatch.setattr(rope_ops, "TUNING", dataclasses.replace(
        rope_ops.TUNING, token_tile_elems=token_tile_elems))
    q = torch.randn(2, 300, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = _cos_sin((2, 300), 128, dtype=torch.bfloat16)
    _check(q, k, cos, sin)
