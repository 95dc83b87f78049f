"""Fused attention's features against one float64 reference built from explicit masks: key padding
mask, sliding window, logit soft-capping, attention sinks, dropout (with the kernels' own mask),
packed variable-length sequences, and their combinations; values and gradients (q, k, v, sinks),
GQA, ragged lengths, head dims 16/64/80, fp32/fp16/bf16, empty rows and sequences, bad inputs,
torch.compile and autocast.

Most tests run with small tiles (``small_tiles``): with the interpreter's default 128-row tiles a
short sequence is one query tile, and the window's skipped, masked and full key runs would never
all occur. bf16 runs through the interpreter's path (tiles rounded to bf16, widened before each
dot; see tests/test_attention.py).
"""

from __future__ import annotations

import zlib

import pytest
import torch
import triton
import triton.language as tl

import triton_workshop.ops.attention as attention_module
from triton_workshop import DEVICE, INTERPRET, runtime
from triton_workshop.ops.attention import attention
from triton_workshop.ops.attention.kernel_helpers import key_ranges, query_ranges

ON_GPU = torch.cuda.is_available() and not INTERPRET
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU with compiled kernels")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
# (atol, rtol) against float64, as in tests/test_attention.py.
TOL = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 5e-2),
}


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _config(block_m, block_n):
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_stages=1, num_warps=4)


@pytest.fixture
def small_tiles(monkeypatch):
    """16/32-row tiles for the three autotuned kernels, so that sequences of a few dozen tokens
    span several query and key tiles."""
    for kernel, config in ((attention_module.attn_fwd_kernel, _config(32, 16)),
                           (attention_module.attn_bwd_dkdv_kernel, _config(16, 32)),
                           (attention_module.attn_bwd_dq_kernel, _config(32, 16))):
        monkeypatch.setattr(kernel, "configs", [config])


def make_qkv(B, H, H_kv, n_q, n_k, D, dtype, seed, *, q_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n_q, D, generator=g) * q_scale
    k = torch.randn(B, H_kv, n_k, D, generator=g)
    v = torch.randn(B, H_kv, n_k, D, generator=g)
    return [t.to(dtype).to(DEVICE).requires_grad_(True) for t in (q, k, v)]


def make_mask(B, n_k, seed, *, empty_rows=()):
    """A ragged key padding mask (True = attend): entry b keeps a random ~70 %, at least one
    key; entries in ``empty_rows`` keep none."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, n_k, generator=g) < 0.7
    mask[:, 0] = True
    for b in empty_rows:
        mask[b] = False
    return mask.to(DEVICE)


def make_sinks(H, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(H, generator=g) * 2).to(dtype).to(DEVICE).requires_grad_(True)


def allowed_pairs(n_q, n_k, *, causal=False, window=None, key_padding_mask=None, B=1):
    """(B, 1, Nq, Nk) bool: which key each query may attend, written out pair by pair."""
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    ok = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= i - j < window
    ok = ok.expand(B, 1, n_q, n_k)
    if key_padding_mask is not None:
        ok = ok & key_padding_mask.cpu()[:, None, None, :]
    return ok


def leaves_of(q, k, v, sinks=None):
    """float64 CPU copies of the inputs that the reference differentiates."""
    tensors = (q, k, v) if sinks is None else (q, k, v, sinks)
    return [t.detach().cpu().double().requires_grad_(True) for t in tensors]


def attention_math(q, k, v, sinks=None, *, causal=False, scale=None, key_padding_mask=None,
                   window=None, softcap=None, keep=None, dropout_p=0.0):  # fmt: skip
    """Attention from explicit masks, in the inputs' (float64) precision: scale, soft-cap, mask,
    softmax over [scores, sink] with the sink's column dropped, dropout with the given ``keep``
    mask. A row with nothing to attend gives 0."""
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    group = H // k.shape[1] if k.shape[1] else 1
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = D**-0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    ok = allowed_pairs(n_q, n_k, causal=causal, window=window,
                       key_padding_mask=key_padding_mask, B=B)  # fmt: skip
    s = s.masked_fill(~ok, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, n_q, 1)], dim=-1)
    if s.shape[-1] == 0:  # no keys, no sink: an empty weighted sum
        return s @ v
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    p = (e / torch.where(total == 0, torch.ones_like(total), total))[..., :n_k]
    if keep is not None:
        p = p * keep.cpu().double() / (1 - dropout_p)
    return p @ v


def reference(q, k, v, *, sinks=None, **features):
    """(float64 output, leaves): :func:`attention_math` on float64 copies of the inputs, whose
    gradients the test compares (q, k, v[, sinks])."""
    leaves = leaves_of(q, k, v, sinks)
    return attention_math(*leaves, **features), leaves


def assert_close(actual, expected, dtype, what, tol=None):
    atol, rtol = tol or TOL[dtype]
    assert torch.isfinite(actual).all(), f"{what} holds NaN/inf"
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach(), atol=atol,
                               rtol=rtol, msg=lambda m: f"{what}: {m}")  # fmt: skip


def assert_grads_close(out, ref, tensors, leaves, dtype, seed, tol=None):
    """Backpropagate one random gradient through ``out`` and the reference ``ref``, and compare
    the gradients of ``tensors`` (q, k, v[, sinks]) with those of the float64 ``leaves``."""
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    out.backward(grad.to(out.device))
    ref.backward(grad.double())
    atol, rtol = tol or TOL[dtype]
    for name, t, leaf in zip(("dq", "dk", "dv", "dsinks"), tensors, leaves):
        assert t.grad is not None and t.grad.shape == t.shape, name
        assert t.grad.dtype == t.dtype, name
        # dsinks sums over every row of the batch: a looser absolute bound in fp16/bf16.
        scale = 4 if name == "dsinks" and dtype != torch.float32 else 1
        assert_close(t.grad, leaf.grad, dtype, name, (atol * scale, rtol))


def check(q, k, v, *, seed=0, tol=None, **features):
    """Forward and backward (q, k, v and sinks when given) against :func:`reference`."""
    dtype = q.dtype
    out = attention(q, k, v, **features)
    ref, leaves = reference(q, k, v, **features)
    assert out.shape == q.shape and out.dtype == dtype
    assert_close(out, ref, dtype, "out", tol)
    sinks = features.get("sinks")
    tensors = [q, k, v] + ([sinks] if sinks is not None else [])
    assert_grads_close(out, ref, tensors, leaves, dtype, seed, tol)


# --------------------------------------------------------------------------------------------
# Each feature, and their combinations.
# --------------------------------------------------------------------------------------------
# name -> (causal, key padding mask, window, softcap, sinks)
COMBOS = {
    "mask": (False, True, None, None, False),
    "mask-causal": (True, True, None, None, False),
    "window": (False, False, 7, None, False),
    "window-causal": (True, False, 20, None, False),
    "softcap": (False, False, None, 2.0, False),
    "softcap-causal": (True, False, None, 2.0, False),
    "sinks": (False, False, None, None, True),
    "sinks-causal": (True, False, None, None, True),
    "window-softcap-sinks": (True, False, 17, 3.0, True),
    "mask-window": (True, True, 9, None, False),
    "all": (True, True, 24, 3.0, True),
    "all-noncausal": (False, True, 5, 1.5, True),
}


def features_for(name, B, H, n_k, seed):
    causal, mask, window, softcap, sinks = COMBOS[name]
    return dict(
        causal=causal,
        key_padding_mask=make_mask(B, n_k, seed) if mask else None,
        window=window,
        softcap=softcap,
        sinks=make_sinks(H, seed) if sinks else None,
    )


# Every combination in fp32; fp16 and bf16 (rounded P and dS, bf16's truncating interpreter
# casts) on the ones that hold every feature.
HALF_COMBOS = ["mask-causal", "window-softcap-sinks", "all", "all-noncausal"]
COMBO_CASES = [(torch.float32, name) for name in COMBOS] + [
    (dtype, name) for dtype in (torch.float16, torch.bfloat16) for name in HALF_COMBOS
]


@pytest.mark.parametrize("dtype, name", COMBO_CASES,
                         ids=[f"{str(d)[6:]}-{n}" for d, n in COMBO_CASES])  # fmt: skip
def test_features_match_reference(dtype, name, small_tiles):
    # Ragged lengths, Nq != Nk, GQA; q scaled so that soft-capping bends the scores.
    seed = seed_of("combo", name, dtype)
    q, k, v = make_qkv(2, 4, 2, 37, 45, 16, dtype, seed, q_scale=3.0)
    check(q, k, v, seed=seed, **features_for(name, 2, 4, 45, seed))


@pytest.mark.parametrize("name", ["mask-causal", "all", "all-noncausal"])
@pytest.mark.parametrize("n_q, n_k", [(70, 33), (20, 67)])
def test_features_with_default_tiles(name, n_q, n_k):
    # The interpreter's own configs (128 x 64 forward tiles): one query tile, partial key tiles.
    seed = seed_of("default", name, n_q, n_k)
    q, k, v = make_qkv(1, 2, 1, n_q, n_k, 16, torch.float32, seed, q_scale=2.0)
    check(q, k, v, seed=seed, **features_for(name, 1, 2, n_k, seed))


@pytest.mark.parametrize("head_dim", [16, 64, 80])
def test_head_dims(head_dim, small_tiles):
    seed = seed_of("hd", head_dim)
    q, k, v = make_qkv(1, 2, 2, 29, 37, head_dim, torch.float32, seed, q_scale=2.0)
    check(q, k, v, seed=seed, **features_for("all", 1, 2, 37, seed))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", [1, 16, 21, 200])
@pytest.mark.parametrize("n_q, n_k", [(67, 67), (40, 66), (66, 23)])
def test_sliding_window(window, causal, n_q, n_k, small_tiles):
    # Windows narrower than a tile, equal to one, across several, longer than the sequence;
    # Nq > Nk + window leaves non-causal rows with no key at all (output 0).
    seed = seed_of("window", window, causal, n_q, n_k)
    q, k, v = make_qkv(1, 2, 1, n_q, n_k, 16, torch.float32, seed)
    check(q, k, v, seed=seed, causal=causal, window=window)


def test_window_matches_transformers_convention():
    # transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window, on a causal mask.
    masking_utils = pytest.importorskip("transformers.masking_utils")
    window, n = 5, 12
    overlay = masking_utils.sliding_window_overlay(window)
    want = torch.tensor([[bool(overlay(0, 0, i, j)) and j <= i for j in range(n)]
                         for i in range(n)])  # fmt: skip
    assert torch.equal(allowed_pairs(n, n, causal=True, window=window)[0, 0], want)
    q, k, v = make_qkv(1, 1, 1, n, n, 16, torch.float32, 3)
    out = attention(q, k, v, causal=True, window=window)
    ref, _ = reference(q, k, v, causal=True, window=window)
    assert_close(out, ref, torch.float32, "out")


def test_softcap_bends_large_scores(small_tiles):
    # Scores in the hundreds: capped at ±softcap, the softmax is far from the uncapped one.
    q, k, v = make_qkv(1, 2, 2, 33, 40, 16, torch.float32, 5, q_scale=30.0)
    check(q, k, v, softcap=4.0, causal=True)
    uncapped = attention(q, k, v, causal=True)
    capped = attention(q, k, v, causal=True, softcap=4.0)
    assert (uncapped - capped).abs().max() > 0.1
    # A cap far above every score changes nothing measurable.
    wide = attention(q, k, v, causal=True, softcap=1e6)
    torch.testing.assert_close(wide, uncapped, atol=1e-4, rtol=1e-4)


def test_sinks_gradient_and_dtype(small_tiles):
    # fp32 sinks (a model's parameter) beside fp16 activations; the gradient keeps its dtype.
    q, k, v = make_qkv(2, 4, 1, 30, 30, 32, torch.float16, 7)
    sinks = make_sinks(4, 8)
    check(q, k, v, sinks=sinks, causal=True, seed=3)
    # Large sinks take most of the mass: the output shrinks towards 0.
    big = torch.full((4,), 30.0, device=DEVICE)
    assert attention(q, k, v, sinks=big).abs().max() < 1e-3


# --------------------------------------------------------------------------------------------
# Empty rows and sequences: output 0, gradients 0, no NaN.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_sinks", [False, True], ids=["plain", "sinks"])
def test_fully_masked_rows_give_zero(with_sinks, small_tiles):
    B, H, n_q, n_k = 3, 2, 21, 37
    q, k, v = make_qkv(B, H, H, n_q, n_k, 16, torch.float32, 11)
    mask = make_mask(B, n_k, 12, empty_rows=(1,))
    sinks = make_sinks(H, 13) if with_sinks else None
    out = attention(q, k, v, key_padding_mask=mask, sinks=sinks)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    check(q, k, v, key_padding_mask=mask, sinks=sinks, seed=4)
    # Batch entry 1 contributes nothing: its rows' dq and its keys' dk, dv are 0.
    for t in (q, k, v):
        assert torch.equal(t.grad[1], torch.zeros_like(t.grad[1]))


def test_causal_rows_before_first_unmasked_key(small_tiles):
    # Left padding with a causal mask (batched generation): the first rows see only padding.
    B, H, n = 2, 2, 40
    q, k, v = make_qkv(B, H, 1, n, n, 16, torch.float16, 14)
    mask = torch.ones(B, n, dtype=torch.bool, device=DEVICE)
    mask[0, :19] = False
    out = attention(q, k, v, causal=True, key_padding_mask=mask)
    assert torch.equal(out[0, :, :19], torch.zeros_like(out[0, :, :19]))
    check(q, k, v, causal=True, key_padding_mask=mask, seed=5)


@pytest.mark.parametrize("n_q, n_k", [(0, 5), (5, 0), (0, 0)])
def test_empty_inputs_with_features(n_q, n_k):
    q, k, v = make_qkv(2, 2, 1, n_q, n_k, 16, torch.float32, 15)
    sinks = make_sinks(2, 16)
    mask = torch.ones(2, n_k, dtype=torch.bool, device=DEVICE)
    out = attention(q, k, v, causal=True, window=3, softcap=2.0, sinks=sinks,
                    key_padding_mask=mask, dropout_p=0.2)  # fmt: skip
    assert out.shape == q.shape and torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for t in (q, k, v, sinks):
        assert t.grad is not None and torch.equal(t.grad, torch.zeros_like(t))


# --------------------------------------------------------------------------------------------
# Layouts: 3-D inputs, strided views.
# --------------------------------------------------------------------------------------------
def test_three_dim_inputs_take_a_1d_mask(small_tiles):
    q, k, v = make_qkv(1, 4, 2, 25, 31, 16, torch.float32, 17)
    mask = make_mask(1, 31, 18)
    sinks = make_sinks(4, 19)
    q3, k3, v3 = (t.detach()[0].requires_grad_(True) for t in (q, k, v))
    out3 = attention(q3, k3, v3, key_padding_mask=mask[0], sinks=sinks, window=6, causal=True)
    out4 = attention(q, k, v, key_padding_mask=mask, sinks=sinks, window=6, causal=True)
    torch.testing.assert_close(out3, out4[0], atol=0, rtol=0)


def test_strided_inputs_and_mask(small_tiles):
    # (B, N, H, D) viewed as (B, H, N, D), and a mask sliced out of a wider one.
    g = torch.Generator().manual_seed(20)
    qkv = torch.randn(2, 37, 3, 2, 16, generator=g).to(DEVICE)
    q, k, v = (qkv[:, :, i].transpose(1, 2).requires_grad_(True) for i in range(3))
    wide = make_mask(2, 74, 21)
    mask = wide[:, ::2]
    assert not mask.is_contiguous()
    check(q, k, v, causal=True, key_padding_mask=mask, window=11, sinks=make_sinks(2, 22))


# --------------------------------------------------------------------------------------------
# Packed variable-length sequences.
# --------------------------------------------------------------------------------------------
def make_packed(lengths_q, lengths_k, H, H_kv, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = torch.randn(total_q, H, D, generator=g)
    k = torch.randn(total_k, H_kv, D, generator=g)
    v = torch.randn(total_k, H_kv, D, generator=g)
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    qkv = [t.to(dtype).to(DEVICE).requires_grad_(True) for t in (q, k, v)]
    return (*qkv, cu_q.to(DEVICE), cu_k.to(DEVICE))


def varlen_reference(q, k, v, cu_q, cu_k, *, sinks=None, keep=None, **features):
    """:func:`attention_math` sequence by sequence, on one set of float64 leaves for the whole
    pack; ``keep`` is the pack's (1, H, total_q, total_k) dropout mask."""
    leaves = leaves_of(q, k, v, sinks)
    q64, k64, v64 = (t.transpose(0, 1)[None] for t in leaves[:3])
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    outs = []
    for s in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        seq_keep = None if keep is None else keep[:, :, qs, ks]
        out = attention_math(q64[:, :, qs], k64[:, :, ks], v64[:, :, ks],
                             leaves[3] if sinks is not None else None, keep=seq_keep,
                             **features)  # fmt: skip
        outs.append(out[0].transpose(0, 1))
    return torch.cat(outs, dim=0), leaves


def check_varlen(q, k, v, cu_q, cu_k, *, seed=0, **features):
    """Packed attention against :func:`varlen_reference`, values and gradients."""
    dtype = q.dtype
    kwargs = dict(features)
    if cu_k is not cu_q:
        kwargs["cu_seqlens_k"] = cu_k
    out = attention(q, k, v, cu_seqlens=cu_q, **kwargs)
    ref, leaves = varlen_reference(q, k, v, cu_q, cu_k, **features)
    assert out.shape == q.shape and out.dtype == dtype
    assert_close(out, ref, dtype, "out")
    sinks = features.get("sinks")
    tensors = [q, k, v] + ([sinks] if sinks is not None else [])
    assert_grads_close(out, ref, tensors, leaves, dtype, seed)


VARLEN_FEATURES = {
    "plain": {},
    "causal": dict(causal=True),
    "window-causal": dict(causal=True, window=9),
    "softcap-sinks": dict(softcap=2.0, sinks=True),
    "all": dict(causal=True, window=13, softcap=3.0, sinks=True),
}


@pytest.mark.parametrize("name", list(VARLEN_FEATURES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_varlen_matches_per_sequence_reference(dtype, name, small_tiles):
    # Ragged lengths (not multiples of a tile), an empty sequence, GQA.
    lengths = [5, 0, 33, 1, 26]
    q, k, v, cu, _ = make_packed(lengths, lengths, 2, 1, 16, dtype, seed_of("varlen", name))
    features = dict(VARLEN_FEATURES[name])
    if features.pop("sinks", False):
        features["sinks"] = make_sinks(2, 23)
    check_varlen(q, k, v, cu, cu, **features)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_with_separate_key_offsets(causal, small_tiles):
    # Keys packed apart from the queries (cross-attention, or a prefix of cached keys): a
    # sequence with queries but no keys gives 0, one with keys but no queries nothing.
    lengths_q, lengths_k = [7, 3, 0, 40, 12], [20, 0, 9, 35, 1]
    q, k, v, cu_q, cu_k = make_packed(lengths_q, lengths_k, 2, 1, 16, torch.float32,
                                      seed_of("varlen-k", causal))  # fmt: skip
    check_varlen(q, k, v, cu_q, cu_k, causal=causal, window=11, sinks=make_sinks(2, 24))


def test_varlen_equals_batched_attention(small_tiles):
    # Equal lengths: packing changes nothing.
    B, n, H = 3, 29, 2
    q, k, v = make_qkv(B, H, H, n, n, 16, torch.float32, 25)
    cu = torch.arange(0, (B + 1) * n, n, dtype=torch.int32, device=DEVICE)
    pack = [t.detach().transpose(1, 2).reshape(B * n, H, 16) for t in (q, k, v)]
    packed = attention(*pack, cu_seqlens=cu, max_seqlen=n, causal=True, window=10, softcap=2.0)
    batched = attention(q, k, v, causal=True, window=10, softcap=2.0)
    torch.testing.assert_close(packed, batched.transpose(1, 2).reshape(B * n, H, 16),
                               atol=1e-6, rtol=1e-6)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Dropout.
# --------------------------------------------------------------------------------------------
def dropout_mask_of(seed: int, shape, p):
    """The mask a call made right after ``torch.manual_seed(seed)`` drew (True = kept)."""
    torch.manual_seed(seed)
    philox_seed = attention_module.dropout_seed(torch.device(DEVICE))
    return attention_module.dropout_keep_mask(philox_seed, shape, p)


def test_dropout_repeats_with_the_seed(small_tiles):
    q, k, v = make_qkv(1, 2, 1, 30, 40, 16, torch.float32, 26)
    torch.manual_seed(1)
    a = attention(q, k, v, dropout_p=0.3, causal=True)
    torch.manual_seed(1)
    b = attention(q, k, v, dropout_p=0.3, causal=True)
    c = attention(q, k, v, dropout_p=0.3, causal=True)  # the generator moved on
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, attention(q, k, v, causal=True))


def test_dropout_kept_fraction():
    p, shape = 0.3, (2, 3, 70, 90)
    keep = dropout_mask_of(2, shape, p)
    n = keep.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * sigma
    # Independent across rows, heads and batch entries (no repeated pattern).
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0], keep[1])
    assert not torch.equal(keep[0, 0, 0], keep[0, 0, 1])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_is_independent_across_neighbours_and_seeds(p):
    # The mask is a hash of the element's index: check what dropout needs of it, that each
    # element is kept with probability 1 - p independently of its neighbours (next key, next
    # query, next head) and of another call's mask. Each statistic within 5 sigma.
    shape = (2, 4, 64, 256)
    keep = dropout_mask_of(6, shape, p).float()
    other = dropout_mask_of(7, shape, p).float()
    q = 1 - p

    def close(values, want):
        sigma = (want * (1 - want) / values.numel()) ** 0.5
        assert abs(values.mean().item() - want) < 5 * sigma, (values.mean().item(), want)

    close(keep, q)
    close(keep[..., 1:] * keep[..., :-1], q * q)  # neighbouring keys
    close(keep[:, :, 1:] * keep[:, :, :-1], q * q)  # neighbouring queries
    close(keep[:, 1:] * keep[:, :-1], q * q)  # neighbouring heads
    close(keep * other, q * q)  # another seed
    # Per-row counts spread as a binomial's: a hash that repeated itself along a row would not.
    rows = keep.sum(-1).flatten()
    assert rows.var().item() == pytest.approx(256 * p * q, rel=0.25)


@pytest.mark.slow  # 96 calls
def test_dropout_mean_approaches_no_dropout():
    # E[out] = the output without dropout (kept weights are scaled by 1 / (1 - p)).
    q, k, v = make_qkv(1, 1, 1, 16, 16, 16, torch.float32, 27)  # one program a call
    with torch.no_grad():
        want = attention(q, k, v)
        torch.manual_seed(3)
        runs = torch.stack([attention(q, k, v, dropout_p=0.25) for _ in range(96)])
    err = (runs.mean(0) - want).abs().max().item()
    spread = runs.std(0).max().item() / 96**0.5
    assert err < 5 * spread, (err, spread)


@pytest.mark.parametrize("name", ["plain", "all"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_dropout_gradients_match_same_mask(dtype, name, small_tiles):
    B, H, H_kv, n_q, n_k, p = 2, 4, 2, 37, 45, 0.2
    seed = seed_of("dropout", name, dtype)
    q, k, v = make_qkv(B, H, H_kv, n_q, n_k, 16, dtype, seed, q_scale=2.0)
    features = features_for(name if name == "all" else "mask", B, H, n_k, seed)
    if name == "plain":
        features = {}
    torch.manual_seed(seed)
    out = attention(q, k, v, dropout_p=p, **features)
    keep = dropout_mask_of(seed, (B, H, n_q, n_k), p)
    ref, leaves = reference(q, k, v, keep=keep, dropout_p=p, **features)
    assert_close(out, ref, dtype, "out")
    tensors = [q, k, v] + ([features["sinks"]] if features.get("sinks") is not None else [])
    assert_grads_close(out, ref, tensors, leaves, dtype, seed)


def test_repeated_dropout_calls_take_the_kept_launches_with_a_fresh_mask(planned_launches):
    """Eager calls of one signature with dropout: from the second on, the forward and the
    backward launch what was kept for it, each with its own call's seed (a mask drawn anew,
    as the general path draws it: the seed repeats a run), and every call's output and
    gradients match the reference under that call's mask."""
    B, H, n, p = 2, 2, 29, 0.25
    masks = []
    for step in range(3):
        seed = seed_of("kept dropout", step)
        q, k, v = make_qkv(B, H, H, n, n, 16, torch.float32, seed)
        planned_launches.clear()
        torch.manual_seed(seed)
        out = attention(q, k, v, dropout_p=p, causal=True)
        keep = dropout_mask_of(seed, (B, H, n, n), p)
        masks.append(keep)
        ref, leaves = reference(q, k, v, causal=True, keep=keep, dropout_p=p)
        assert_close(out, ref, torch.float32, f"step {step} out")
        assert_grads_close(out, ref, [q, k, v], leaves, torch.float32, seed)
        if step:  # the kept launches, forward and backward
            assert [name for name, _ in planned_launches] == [
                "attn_fwd_kernel", "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel",
                "attn_bwd_dq_kernel"], planned_launches
    assert not torch.equal(masks[1], masks[2])


def test_dropout_varlen_uses_the_packed_mask(small_tiles):
    lengths, H, p = [9, 30, 0, 17], 2, 0.3
    q, k, v, cu, _ = make_packed(lengths, lengths, H, 1, 16, torch.float32, 28)
    torch.manual_seed(4)
    out = attention(q, k, v, cu_seqlens=cu, causal=True, dropout_p=p)
    total = sum(lengths)
    keep = dropout_mask_of(4, (1, H, total, total), p)
    ref, leaves = varlen_reference(q, k, v, cu, cu, causal=True, keep=keep, dropout_p=p)
    assert_close(out, ref, torch.float32, "out")
    assert_grads_close(out, ref, [q, k, v], leaves, torch.float32, 5)


# --------------------------------------------------------------------------------------------
# Bad inputs: the argument is named, before any launch.
# --------------------------------------------------------------------------------------------
def _bad_cases():
    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape).to(dtype).to(DEVICE)

    def cu(*values):
        return torch.tensor(values, dtype=torch.int32, device=DEVICE)

    mask = torch.ones(1, 8, dtype=torch.bool, device=DEVICE)
    packed = {n: t(10, 2, 16) for n in "qkv"}
    return [
        ("mask not a tensor", dict(key_padding_mask=[[True] * 8]), TypeError, "key_padding_mask"),
        ("mask dtype", dict(key_padding_mask=mask.float()), TypeError, "key_padding_mask"),
        ("mask shape", dict(key_padding_mask=mask[:, :7]), ValueError, "key_padding_mask"),
        ("mask batch", dict(key_padding_mask=mask.expand(2, 8)), ValueError, "key_padding_mask"),
        ("window 0", dict(window=0), ValueError, "window"),
        ("window float", dict(window=4.0), TypeError, "window"),
        ("window bool", dict(window=True), TypeError, "window"),
        ("softcap 0", dict(softcap=0.0), ValueError, "softcap"),
        ("softcap negative", dict(softcap=-1.0), ValueError, "softcap"),
        ("softcap inf", dict(softcap=float("inf")), ValueError, "softcap"),
        ("softcap str", dict(softcap="2"), TypeError, "softcap"),
        ("sinks list", dict(sinks=[0.0, 0.0]), TypeError, "sinks"),
        ("sinks shape", dict(sinks=t(3)), ValueError, "sinks"),
        ("sinks 2-D", dict(sinks=t(1, 2)), ValueError, "sinks"),
        ("sinks int", dict(sinks=torch.zeros(2, dtype=torch.int32, device=DEVICE)), TypeError,
         "sinks"),
        ("dropout 1", dict(dropout_p=1.0), ValueError, "dropout_p"),
        ("dropout negative", dict(dropout_p=-0.1), ValueError, "dropout_p"),
        ("dropout bool", dict(dropout_p=True), TypeError, "dropout_p"),
        ("max_seqlen alone", dict(max_seqlen=8), ValueError, "max_seqlen"),
        ("cu_seqlens_k alone", dict(cu_seqlens_k=cu(0, 8)), ValueError, "cu_seqlens_k"),
        ("cu int64", dict(**packed, cu_seqlens=cu(0, 4, 10).long()), TypeError, "cu_seqlens"),
        ("cu 2-D", dict(**packed, cu_seqlens=cu(0, 4, 10)[None]), ValueError, "cu_seqlens"),
        ("cu not monotonic", dict(**packed, cu_seqlens=cu(0, 6, 4, 10)), ValueError, "cu_seqlens"),
        ("cu not from 0", dict(**packed, cu_seqlens=cu(1, 4, 10)), ValueError, "cu_seqlens"),
        ("cu short of total", dict(**packed, cu_seqlens=cu(0, 4, 9)), ValueError, "cu_seqlens"),
        ("max_seqlen too small", dict(**packed, cu_seqlens=cu(0, 4, 10), max_seqlen=5),
         ValueError, "max_seqlen"),
        ("max_seqlen negative", dict(**packed, cu_seqlens=cu(0, 4, 10), max_seqlen=-1),
         ValueError, "max_seqlen"),
        ("cu_k length", dict(**packed, cu_seqlens=cu(0, 4, 10), cu_seqlens_k=cu(0, 10)),
         ValueError, "cu_seqlens_k"),
        ("varlen 4-D q", dict(cu_seqlens=cu(0, 8)), ValueError, "q"),
        ("varlen with mask", dict(**packed, cu_seqlens=cu(0, 4, 10),
                                  key_padding_mask=torch.ones(2, 10, dtype=torch.bool)),
         ValueError, "key_padding_mask"),
        ("varlen k rows", dict(q=t(10, 2, 16), k=t(12, 2, 16), v=t(12, 2, 16),
                               cu_seqlens=cu(0, 4, 10)), ValueError, "cu_seqlens_k"),
    ]


_GOOD = lambda: {n: torch.randn(1, 2, 8, 16).to(DEVICE) for n in "qkv"}  # noqa: E731
_CASES = _bad_cases()


@pytest.mark.parametrize("change, error, match", [c[1:] for c in _CASES], ids=[c[0] for c in _CASES])
def test_bad_inputs_raise_before_launch(change, error, match, monkeypatch):
    def no_launch(kernel, *args, **kwargs):
        raise AssertionError("a kernel launched before the arguments were checked")

    monkeypatch.setattr(attention_module, "wrap_triton", no_launch)
    monkeypatch.setattr(runtime.registry, "launch_kernel", no_launch)
    args = {**_GOOD(), **change}
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(error, match=match):
        attention(q, k, v, **args)


def test_registered_op_checks_its_features(monkeypatch):
    monkeypatch.setattr(attention_module, "wrap_triton", None)  # any launch would fail
    q, k, v = _GOOD().values()
    op = attention_module.attention_forward
    with pytest.raises(ValueError, match="window"):
        op(q, k, v, False, 0.25, None, 0)
    with pytest.raises(TypeError, match="dropout_seed"):
        op(q, k, v, False, 0.25, None, None, None, None, 0.5, None)
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k"):
        op(q, k, v, False, 0.25, None, None, None, None, 0.0, None,
           torch.zeros(2, dtype=torch.int32, device=DEVICE))  # fmt: skip


# --------------------------------------------------------------------------------------------
# torch.compile, autocast.
# --------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph_with_features(small_tiles):
    torch._dynamo.reset()
    mask = make_mask(2, 40, 29)
    sinks = make_sinks(4, 30)

    def fn(q, k, v, sinks):
        return attention(q, k, v, causal=True, window=12, softcap=2.5, sinks=sinks,
                         key_padding_mask=mask)  # fmt: skip

    compiled = torch.compile(fn, fullgraph=True)
    q, k, v = make_qkv(2, 4, 2, 33, 40, 16, torch.float32, 31)
    grad = torch.randn(2, 4, 33, 16, generator=torch.Generator().manual_seed(32)).to(DEVICE)
    compiled(q, k, v, sinks).backward(grad)
    grads_c = [t.grad.clone() for t in (q, k, v, sinks)]
    for t in (q, k, v, sinks):
        t.grad = None
    out_e = fn(q, k, v, sinks)
    out_e.backward(grad)
    torch.testing.assert_close(compiled(q, k, v, sinks), out_e, atol=0, rtol=0)
    for a, t in zip(grads_c, (q, k, v)):
        torch.testing.assert_close(a, t.grad, atol=0, rtol=0)
    # dsinks is a sum over rows in torch ops, which Inductor may fuse and order differently.
    torch.testing.assert_close(grads_c[3], sinks.grad, atol=1e-6, rtol=1e-6)


def test_torch_compile_fullgraph_varlen_and_dropout(small_tiles):
    torch._dynamo.reset()
    lengths = [9, 20, 4]
    q, k, v, cu, _ = make_packed(lengths, lengths, 2, 2, 16, torch.float32, 33)

    def fn(q, k, v):
        return attention(q, k, v, cu_seqlens=cu, max_seqlen=20, causal=True, dropout_p=0.1)

    out = torch.compile(fn, fullgraph=True)(q, k, v)
    assert out.shape == q.shape and torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    # Without dropout, compiled and eager agree exactly.
    torch._dynamo.reset()

    def fn_eval(q, k, v):
        return attention(q, k, v, cu_seqlens=cu, max_seqlen=20, causal=True)

    torch.testing.assert_close(torch.compile(fn_eval, fullgraph=True)(q, k, v), fn_eval(q, k, v),
                               atol=0, rtol=0)  # fmt: skip


def test_autocast_reaches_fp32_sinks(small_tiles):
    # Under autocast q, k, v and the sinks run in the autocast dtype; the fp32 leaves get fp32
    # gradients.
    device_type = "cuda" if ON_GPU else "cpu"
    dtype = torch.float16 if ON_GPU else torch.bfloat16
    q, k, v = make_qkv(1, 2, 1, 20, 24, 16, torch.float32, 34)
    sinks = make_sinks(2, 35)
    with torch.autocast(device_type, dtype=dtype):
        out = attention(q, k, v, sinks=sinks, causal=True, softcap=3.0)
    assert out.dtype == dtype
    out.float().sum().backward()
    for t in (q, k, v, sinks):
        assert t.grad is not None and t.grad.dtype == torch.float32
    ref, leaves = reference(*(t.to(dtype) for t in (q, k, v)), sinks=sinks.to(dtype),
                            causal=True, softcap=3.0)  # fmt: skip
    assert_close(out, ref, dtype, "out")


# --------------------------------------------------------------------------------------------
# GPU: realistic sizes.
# --------------------------------------------------------------------------------------------
@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mask-causal", "window-causal", "all", "all-noncausal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_features_long_sequence(dtype, head_dim, name):
    B, H, H_kv, n = 2, 8, 2, 2048
    seed = seed_of("gpu", name, head_dim, dtype)
    q, k, v = make_qkv(B, H, H_kv, n, n, head_dim, dtype, seed, q_scale=2.0)
    features = features_for(name, B, H, n, seed)
    if features["window"] is not None:
        features["window"] = 500  # several tiles, not a multiple of any
    out = attention(q, k, v, **features)
    grad = torch.randn_like(out)
    out.backward(grad)
    # fp32 reference on the GPU from the same explicit masks (float64 is slow at this size).
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    sinks = features.pop("sinks")
    if sinks is not None:
        leaves.append(sinks.detach().float().requires_grad_(True))
    mask = features.pop("key_padding_mask")
    ref = _gpu_reference(*leaves[:3], leaves[3] if sinks is not None else None, mask, **features)
    ref.backward(grad.float())
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    tensors = [q, k, v] + ([sinks] if sinks is not None else [])
    for t, leaf in zip(tensors, leaves):
        torch.testing.assert_close(t.grad.float(), leaf.grad, atol=tol * 4, rtol=tol)


def _gpu_reference(q, k, v, sinks, key_padding_mask, *, causal, window, softcap):
    """:func:`attention_math`'s steps in fp32 on the GPU."""
    B, H, n_q, D = q.shape
    n_k = k.shape[2]
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * D**-0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(n_q, device=q.device)[:, None]
    j = torch.arange(n_k, device=q.device)[None, :]
    ok = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= i - j < window
    ok = ok[None, None]
    if key_padding_mask is not None:
        ok = ok & key_padding_mask[:, None, None, :]
    s = s.masked_fill(~ok, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, H, 1, 1).expand(B, H, n_q, 1)], dim=-1)
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    return (e / torch.where(total == 0, torch.ones_like(total), total))[..., :n_k] @ v


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_varlen_and_dropout(dtype):
    lengths, H, p = [1000, 37, 2048, 511], 8, 0.1
    q, k, v, cu, _ = make_packed(lengths, lengths, H, 2, 64, dtype, seed_of("gpu-varlen", dtype))
    torch.manual_seed(5)
    out = attention(q, k, v, cu_seqlens=cu, max_seqlen=2048, causal=True, window=700,
                    dropout_p=p)  # fmt: skip
    total = sum(lengths)
    keep = dropout_mask_of(5, (1, H, total, total), p)
    ref, _ = varlen_reference(q, k, v, cu, cu, causal=True, window=700, keep=keep, dropout_p=p)
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    torch.testing.assert_close(out.double().cpu(), ref.detach(), atol=tol, rtol=tol)


@triton.jit
def _tile_runs_kernel(out_ptr, n, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, WINDOW: tl.constexpr, KEYS: tl.constexpr):  # fmt: skip
    # The four bounds of the runs that program ``pid``'s tile visits (key_ranges for a query
    # tile, query_ranges for a key tile), as the kernels compute them.
    pid = tl.program_id(0)
    if KEYS:
        a, b, c, d = key_ranges(pid, n, window, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
    else:
        a, b, c, d = query_ranges(pid, n, window, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
    tl.store(out_ptr + pid * 4 + tl.arange(0, 4), tl.join(tl.join(a, c), tl.join(b, d)).reshape(4))


def _tile_runs(n, window, block_m, block_n, keys):
    tiles = triton.cdiv(n, block_m if keys else block_n)
    out = torch.full((tiles * 4,), -1, dtype=torch.int32, device=DEVICE)
    _tile_runs_kernel[(tiles,)](out, n, window, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=True,
                                WINDOW=window > 0, KEYS=keys)  # fmt: skip
    return out.view(tiles, 4).tolist()


@pytest.mark.parametrize("n, window", [(8192, 512), (1000, 300), (700, 50)])
def test_sliding_window_tiles_skip_what_no_row_sees(n, window):
    # What a window buys: the kernels visit only the key tiles (forward, dQ) or query tiles
    # (dK/dV) that some row of the tile sees, and mask only those at the window's edges. At
    # N = 8192 a 512-token window is about 1/8 of causal attention's work.
    i = torch.arange(n)
    seen = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)  # [query, key]
    # The forward's tiles (128 queries, 64-key steps), then dK/dV's (64 keys, 32-query steps).
    for keys, bm, bn in ((True, 128, 64), (False, 32, 64)):
        size, other = (bm, bn) if keys else (bn, bm)
        runs = _tile_runs(n, window, bm, bn, keys)
        total = 0
        for t, (lo, full_lo, full_end, end) in enumerate(runs):
            assert lo <= full_lo <= full_end <= end
            # Each non-empty run starts on a tile boundary of the loop's step.
            for start, stop in ((lo, full_lo), (full_lo, full_end), (full_end, end)):
                assert start == stop or start % other == 0, (t, lo, full_lo, full_end, end)
            block = seen[t * size:(t + 1) * size] if keys else seen[:, t * size:(t + 1) * size].T
            cols = block.any(0).nonzero().flatten()
            if len(cols):  # every key (query) some row sees lies within the visited runs
                assert lo <= cols.min() and cols.max() < end
            # Tiles in the unmasked run are seen whole by every row of the tile.
            assert bool(block[:, full_lo:full_end].all()) or full_lo == full_end
            total += end - lo
        causal = sum(r[3] for r in _tile_runs(n, 0, bm, bn, keys)) if keys else sum(
            n - r[0] for r in _tile_runs(n, 0, bm, bn, keys))  # fmt: skip
        if n == 8192:
            assert total < 0.2 * causal, (keys, total, causal)
