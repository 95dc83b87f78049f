"""The nn modules against their torch counterparts: Linear, LayerNormLinear, MultiheadSelfAttention,
and a few SGD steps of a small MLP built either way.

fp32 runs with TF32 off, so both sides compute IEEE fp32 and differ only in summation order.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop import nn as tw
from triton_workshop.nn.modules import keep_off_fused_encoder_path
from triton_workshop.ops.matmul import tf32_enabled
from triton_workshop.runtime import DEVICE

FP32 = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def ieee_fp32():
    before = tf32_enabled()
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def outputs_and_grads(module, x, seed=99):
    """The module's output and the gradients of a fixed random projection of it, with respect
    to the input and to every parameter (in ``named_parameters`` order)."""
    x = x.clone().requires_grad_()
    out = module(x)
    dy = rand(*out.shape, seed=seed, dtype=out.dtype)
    params = [p for _, p in module.named_parameters()]
    grads = torch.autograd.grad(out, [x, *params], dy)
    return out, grads


# ---------------------------------------------------------------------------------------------
# Linear.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("x_shape", [(5, 20), (2, 7, 20), (20,)], ids=str)
def test_linear_matches_torch_after_load_state_dict(bias, x_shape):
    ref = nn.Linear(20, 13, bias=bias, device=DEVICE)
    ours = tw.Linear(20, 13, bias=bias, device=DEVICE)
    ours.load_state_dict(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x = rand(*x_shape, seed=1)
    out, grads = outputs_and_grads(ours, x)
    ref_out, ref_grads = outputs_and_grads(ref, x)
    torch.testing.assert_close(out, ref_out, **FP32)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **FP32)


def test_linear_initialises_like_torch():
    torch.manual_seed(3)
    ref = nn.Linear(24, 10, device=DEVICE)
    torch.manual_seed(3)
    ours = tw.Linear(24, 10, device=DEVICE)
    torch.testing.assert_close(ours.weight, ref.weight, rtol=0, atol=0)
    torch.testing.assert_close(ours.bias, ref.bias, rtol=0, atol=0)
    assert tw.Linear(4, 3, dtype=torch.float16, device=DEVICE).weight.dtype == torch.float16


@pytest.mark.parametrize(
    "activation, slope, reference",
    [
        ("relu", 0.01, torch.relu),
        ("leaky_relu", 0.2, lambda z: F.leaky_relu(z, 0.2)),
        ("gelu", 0.01, lambda z: F.gelu(z, approximate="tanh")),
    ],
    ids=["relu", "leaky_relu", "gelu"],
)
def test_linear_activation(activation, slope, reference):
    ref = nn.Linear(16, 9, device=DEVICE)
    ours = tw.Linear(16, 9, device=DEVICE, activation=activation, leaky_relu_slope=slope)
    ours.load_state_dict(ref.state_dict())
    x = rand(6, 16, seed=2)
    out, grads = outputs_and_grads(ours, x)
    ref_out, ref_grads = outputs_and_grads(_Then(ref, reference), x)
    torch.testing.assert_close(out, ref_out, **FP32)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **FP32)
    assert activation in repr(ours)
    with pytest.raises(ValueError, match="activation must be one of"):
        tw.Linear(4, 3, activation="tanh")


class _Then(nn.Module):
    """``fn(module(x))``, with module's parameters as its own."""

    def __init__(self, module, fn):
        super().__init__()
        self.module, self.fn = module, fn

    def forward(self, x):
        return self.fn(self.module(x))


# ---------------------------------------------------------------------------------------------
# LayerNormLinear.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ln_kwargs, bias",
    [({}, True), ({"bias": False}, True), ({"elementwise_affine": False}, False)],
    ids=["affine", "ln_no_bias", "no_affine_no_bias"],
)
def test_layer_norm_linear_equals_layer_norm_then_linear(ln_kwargs, bias):
    ln = nn.LayerNorm(24, eps=1e-4, device=DEVICE, **ln_kwargs)
    fc = nn.Linear(24, 11, bias=bias, device=DEVICE)
    with torch.no_grad():  # non-trivial LayerNorm parameters
        for p in ln.parameters():
            p.add_(rand(*p.shape, seed=5) * 0.3)
    ours = tw.LayerNormLinear.from_modules(ln, fc)
    assert ours.eps == 1e-4
    assert (ours.ln_weight is None) == (ln.weight is None)
    assert (ours.ln_bias is None) == (ln.bias is None)
    x = rand(3, 5, 24, seed=6) * 2 + 1
    ref = nn.Sequential(ln, fc)
    out, grads = outputs_and_grads(ours, x)
    ref_out, ref_grads = outputs_and_grads(ref, x)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    # Parameters are in the same order on both sides: LayerNorm's, then Linear's.
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_layer_norm_linear_module_defaults_and_errors():
    torch.manual_seed(0)
    module = tw.LayerNormLinear(8, 4, device=DEVICE)
    assert [n for n, _ in module.named_parameters()] == ["ln_weight", "ln_bias", "weight", "bias"]
    assert torch.equal(module.ln_weight, torch.ones(8, device=DEVICE))
    torch.manual_seed(0)
    fc = nn.Linear(8, 4, device=DEVICE)
    torch.testing.assert_close(module.weight, fc.weight, rtol=0, atol=0)
    with pytest.raises(ValueError, match="normalized_shape == \\(in_features,\\)"):
        tw.LayerNormLinear.from_modules(nn.LayerNorm(6), nn.Linear(8, 4))
    with pytest.raises(ValueError, match="activation"):
        tw.LayerNormLinear.from_modules(nn.LayerNorm(8), tw.Linear(8, 4, activation="relu"))


# ---------------------------------------------------------------------------------------------
# MultiheadSelfAttention.
# ---------------------------------------------------------------------------------------------
def mhsa_reference(module, x):
    """The same computation written with torch ops and SDPA, reading the module's weights."""
    batch, seq, embed = x.shape
    heads, kv_heads, dim = module.num_heads, module.num_kv_heads, module.head_dim
    qkv = F.linear(x, module.qkv_proj.weight, module.qkv_proj.bias)
    q, k, v = qkv.split([embed, kv_heads * dim, kv_heads * dim], dim=-1)
    q = q.reshape(batch, seq, heads, dim).transpose(1, 2)
    k = k.reshape(batch, seq, kv_heads, dim).transpose(1, 2)
    v = v.reshape(batch, seq, kv_heads, dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q, k, v, is_causal=module.causal, enable_gqa=kv_heads != heads
    )
    out = out.transpose(1, 2).reshape(batch, seq, embed)
    return F.linear(out, module.out_proj.weight, module.out_proj.bias)


class _Reference(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return mhsa_reference(self.module, x)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
def test_multihead_self_attention_matches_sdpa(causal, num_kv_heads):
    torch.manual_seed(1)
    module = tw.MultiheadSelfAttention(
        32, 4, causal=causal, num_kv_heads=num_kv_heads, device=DEVICE
    )
    x = rand(2, 19, 32, seed=7)
    out, grads = outputs_and_grads(module, x)
    ref_out, ref_grads = outputs_and_grads(_Reference(module), x)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_from_torch_multihead_attention(causal):
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(24, 3, batch_first=True, device=DEVICE)
    with torch.no_grad():  # non-zero biases, so that a mix-up of them shows
        mha.in_proj_bias.copy_(rand(72, seed=8) * 0.1)
        mha.out_proj.bias.copy_(rand(24, seed=9) * 0.1)
    module = tw.MultiheadSelfAttention.from_torch(mha, causal=causal)
    x = rand(2, 10, 24, seed=10)
    mask = nn.Transformer.generate_square_subsequent_mask(10, device=DEVICE) if causal else None
    with torch.no_grad():
        ref, _ = mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=causal)
        torch.testing.assert_close(module(x), ref, rtol=1e-4, atol=1e-4)


def test_multihead_self_attention_errors():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        tw.MultiheadSelfAttention(30, 4)
    with pytest.raises(ValueError, match="num_kv_heads \\(3\\) must be > 0 and divide num_heads"):
        tw.MultiheadSelfAttention(32, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="x must be \\(batch, seq, embed_dim=32\\)"):
        tw.MultiheadSelfAttention(32, 4, device=DEVICE)(rand(5, 32))


# ---------------------------------------------------------------------------------------------
# Training.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True], ids=["modules", "layer_norm_linear"])
def test_sgd_training_matches_torch(fused):
    """Three SGD steps on a Linear -> ReLU -> LayerNorm -> Linear MLP: the same losses (which
    fall) and the same parameters, whether built from torch modules or ours."""

    def torch_mlp():
        return nn.Sequential(
            nn.Linear(12, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 5)
        ).to(DEVICE)

    torch.manual_seed(0)
    ref = torch_mlp()
    first = tw.Linear(12, 32, activation="relu", device=DEVICE)
    first.load_state_dict(ref[0].state_dict())
    if fused:
        ours = nn.Sequential(first, tw.LayerNormLinear.from_modules(ref[2], ref[3]))
    else:
        ln, last = tw.LayerNorm(32, device=DEVICE), tw.Linear(32, 5, device=DEVICE)
        ln.load_state_dict(ref[2].state_dict())
        last.load_state_dict(ref[3].state_dict())
        ours = nn.Sequential(first, ln, last)

    x, target = rand(64, 12, seed=11), rand(64, 5, seed=12)
    losses = {}
    for name, model in (("torch", ref), ("ours", ours)):
        optimiser = torch.optim.SGD(model.parameters(), lr=0.2)
        losses[name] = []
        for _ in range(3):
            optimiser.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            optimiser.step()
            losses[name].append(loss.item())
    assert losses["ours"][2] < losses["ours"][0]
    torch.testing.assert_close(losses["ours"], losses["torch"], rtol=1e-5, atol=1e-6)
    for p, r in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# MultiheadAttention: a drop-in for torch.nn.MultiheadAttention.
# --------------------------------------------------------------------------------------------
def _torch_and_ours(embed=24, heads=3, bias=True, batch_first=False, seed=3):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(embed, heads, bias=bias, batch_first=batch_first, device=DEVICE)
    if bias:
        with torch.no_grad():  # non-zero biases, so that a mix-up of them shows
            ref.in_proj_bias.copy_(rand(3 * embed, seed=seed + 1) * 0.1)
            ref.out_proj.bias.copy_(rand(embed, seed=seed + 2) * 0.1)
    ours = tw.MultiheadAttention(embed, heads, bias=bias, batch_first=batch_first, device=DEVICE)
    ours.load_state_dict(ref.state_dict())  # the same names and shapes
    return ref, ours


def test_multihead_attention_initialises_like_torch():
    torch.manual_seed(5)
    ref = nn.MultiheadAttention(16, 2, device=DEVICE)
    torch.manual_seed(5)
    ours = tw.MultiheadAttention(16, 2, device=DEVICE)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], value, rtol=0, atol=0)


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq-first", "batch-first"])
@pytest.mark.parametrize("need_weights, average", [(False, True), (True, True), (True, False)],
                         ids=["no-weights", "mean-weights", "head-weights"])
def test_multihead_attention_self_attention_matches_torch(batch_first, need_weights, average):
    ref, ours = _torch_and_ours(batch_first=batch_first)
    x = rand(2, 11, 24, seed=20) if batch_first else rand(11, 2, 24, seed=20)
    _self_attention_matches(ref, ours, x, need_weights=need_weights, average_attn_weights=average)


def _self_attention_matches(ref, ours, x, **kwargs):
    """Self-attention of ``x`` through torch's module and ours: outputs, weights (if asked) and
    the gradients of the input and of every parameter."""
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, w_ref = ref(x_ref, x_ref, x_ref, **kwargs)
    out, w = ours(x_ours, x_ours, x_ours, **kwargs)
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)
    if kwargs.get("need_weights", True):
        torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-5)
    else:
        assert w is None and w_ref is None
    dy = rand(*out.shape, seed=21)
    out_ref.backward(dy)
    out.backward(dy)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_multihead_attention_cross_attention_and_no_bias():
    ref, ours = _torch_and_ours(bias=False, batch_first=True)
    query, memory = rand(2, 7, 24, seed=30), rand(2, 13, 24, seed=31)
    other_values = rand(2, 13, 24, seed=32)
    with torch.no_grad():
        out_ref, w_ref = ref(query, memory, other_values)
        out, w = ours(query, memory, other_values)
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-5)
    assert w.shape == (2, 7, 13)


def test_multihead_attention_causal_and_unbatched():
    ref, ours = _torch_and_ours()
    x = rand(9, 24, seed=40)  # unbatched (L, E)
    mask = nn.Transformer.generate_square_subsequent_mask(9, device=DEVICE)
    with torch.no_grad():
        out_ref, w_ref = ref(x, x, x, attn_mask=mask, is_causal=True)
        out, w = ours(x, x, x, attn_mask=mask, is_causal=True)
        alone, _ = ours(x, x, x, is_causal=True, need_weights=False)  # no mask needed here
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w, w_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alone, out, rtol=0, atol=0)
    assert out.shape == (9, 24) and w.shape == (9, 9)


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq-first", "batch-first"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["no-weights", "weights"])
def test_multihead_attention_key_padding_mask_matches_torch(batch_first, need_weights):
    ref, ours = _torch_and_ours(batch_first=batch_first)
    x = rand(3, 7, 24, seed=60) if batch_first else rand(7, 3, 24, seed=60)
    padding = torch.zeros(3, 7, dtype=torch.bool, device=DEVICE)
    padding[0, 4:] = True
    padding[1, 0] = True
    if not need_weights:  # every key padding: torch's training path gives the projected zeros
        padding[2] = True
    _self_attention_matches(ref, ours, x, key_padding_mask=padding, need_weights=need_weights)


def test_multihead_attention_dropout_while_training():
    """Dropout in the kernel: a seeded run repeats, another seed differs, eval mode is torch's
    output without dropout, and the backward regenerates the forward's mask."""
    ref, ours = _torch_and_ours(batch_first=True)
    ref.dropout = ours.dropout = 0.3
    x = rand(2, 9, 24, seed=70)

    def run(seed):
        torch.manual_seed(seed)
        xg = x.clone().requires_grad_()
        out = ours(xg, xg, xg, need_weights=False)[0]
        out.backward(torch.ones_like(out))
        return out.detach(), xg.grad

    (a, grad_a), (b, grad_b), (c, _) = run(1), run(1), run(2)
    assert torch.equal(a, b) and torch.equal(grad_a, grad_b) and not torch.equal(a, c)
    ours.eval(), ref.eval()
    with torch.no_grad():
        plain = ours(x, x, x, need_weights=False)[0]
        torch.testing.assert_close(plain, ref(x, x, x, need_weights=False)[0], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a, plain, atol=1e-3)


def test_multihead_attention_errors():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        tw.MultiheadAttention(30, 4)
    with pytest.raises(ValueError, match="add_bias_kv"):
        tw.MultiheadAttention(16, 2, add_bias_kv=True)
    with pytest.raises(ValueError, match="kdim"):
        tw.MultiheadAttention(16, 2, kdim=8)
    mha = tw.MultiheadAttention(16, 2, dropout=0.1, device=DEVICE)
    x = rand(5, 2, 16, seed=50)
    with pytest.raises(ValueError, match="dropout .* need_weights=True"):
        mha(x, x, x)  # torch would return the weights after its dropout
    mha(x, x, x, need_weights=False)  # dropout in the kernel
    mha.eval()
    mha(x, x, x)  # dropout is off in eval mode
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 5\)"):
        mha(x, x, x, key_padding_mask=torch.zeros(2, 5, device=DEVICE))  # float: torch's module
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        mha(x, x, x, key_padding_mask=torch.zeros(5, 2, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="attn_mask"):
        mha(x, x, x, attn_mask=torch.zeros(5, 5, device=DEVICE))
    with pytest.raises(ValueError, match="query must be"):
        mha(rand(5, 2, 8, seed=51), x, x)
    with pytest.raises(ValueError, match="key and value"):
        mha(x, x, rand(6, 2, 16, seed=52))
    with pytest.raises(ValueError, match="batch size"):
        other = rand(7, 3, 16, seed=53)
        mha(x, other, other)


def test_multihead_attention_in_a_transformer_encoder_layer():
    """Swapped into nn.TransformerEncoderLayer as its self_attn: training mode calls our forward
    (need_weights=False), and so does eval mode under no_grad (see the fast-path tests below)."""
    torch.manual_seed(6)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True,
                                       device=DEVICE)
    ref_attn = layer.self_attn
    ours = tw.MultiheadAttention(16, 2, batch_first=True, device=DEVICE)
    ours.load_state_dict(ref_attn.state_dict())
    x = rand(2, 9, 16, seed=60)
    expected = layer(x)
    layer.self_attn = ours
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    layer.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)


def test_multihead_attention_seq_first_output_is_contiguous():
    _, ours = _torch_and_ours()
    x = rand(5, 2, 24, seed=61)
    out, _ = ours(x, x, x, need_weights=False)
    assert out.shape == (5, 2, 24) and out.is_contiguous()


# ---------------------------------------------------------------------------------------------
# torch's fused encoder path must never bypass the module silently.
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def mha_calls(monkeypatch):
    """Counts calls of tw.MultiheadAttention.forward. Patched on the class, not through a hook:
    a hook on the module would itself keep torch off its fused path."""
    calls = []
    forward = tw.MultiheadAttention.forward

    def counted(self, *args, **kwargs):
        calls.append(self)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(tw.MultiheadAttention, "forward", counted)
    return calls


def _encoder_layer_with_ours(seed=62, batch_first=True):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                       batch_first=batch_first, device=DEVICE)
    with torch.no_grad():  # non-zero biases, so that a mix-up of them shows
        layer.self_attn.in_proj_bias.copy_(rand(48, seed=seed + 1) * 0.1)
    ours = tw.MultiheadAttention(16, 2, batch_first=batch_first, device=DEVICE)
    ours.load_state_dict(layer.self_attn.state_dict())
    return layer, ours


@pytest.mark.parametrize("grad_off", [torch.no_grad, torch.inference_mode],
                         ids=["no_grad", "inference_mode"])
def test_transformer_encoder_layer_calls_our_attention_in_eval_mode(mha_calls, grad_off):
    layer, ours = _encoder_layer_with_ours()
    layer.eval()
    x = rand(2, 9, 16, seed=64)
    with grad_off():
        expected = layer(x)  # torch's fused path, with torch's MultiheadAttention
        layer.self_attn = ours
        out = layer(x)
    assert mha_calls == [ours]
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_the_fast_path_bypasses_a_module_without_the_guard(mha_calls):
    """The premise of the tests above: without its guard, torch computes the layer itself and
    never calls self_attn (so a counter of 0 is what a silent bypass looks like)."""
    layer, ours = _encoder_layer_with_ours()
    layer.self_attn = ours
    layer.eval()
    ours._forward_pre_hooks.clear()
    with torch.no_grad():
        layer(rand(2, 9, 16, seed=65))
    assert mha_calls == []
    keep_off_fused_encoder_path(ours)
    keep_off_fused_encoder_path(ours)  # idempotent: one guard
    assert len(ours._forward_pre_hooks) == 1
    with torch.no_grad():
        layer(rand(2, 9, 16, seed=65))
    assert mha_calls == [ours]


def test_guard_installed_on_eval_for_a_module_made_without_init(mha_calls):
    """An in-place swap (a torch module given this class without __init__) gets the guard when
    the model is put in eval mode, which the fused path needs anyway."""
    layer, _ = _encoder_layer_with_ours()
    torch_attn = layer.self_attn
    x = rand(2, 9, 16, seed=66)
    layer.eval()
    with torch.no_grad():
        expected = layer(x)
    torch_attn.__class__ = tw.MultiheadAttention
    layer.train()
    layer.eval()
    with torch.no_grad():
        out = layer(x)
    assert mha_calls == [torch_attn]
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_transformer_encoder_calls_our_attention_in_every_layer(mha_calls):
    layer, ours = _encoder_layer_with_ours()
    layer.self_attn = ours
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = rand(2, 7, 16, seed=67)
    with torch.no_grad():
        encoder(x)
    assert len(mha_calls) == 2 and mha_calls[0] is not mha_calls[1]  # the deep copies too


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_input_from_the_encoder_fast_path_is_refused_clearly():
    """With a padding mask in eval mode, torch.nn.TransformerEncoder packs its input into a
    NestedTensor before calling the layers: an error that says so, never a silent result."""
    layer, ours = _encoder_layer_with_ours()
    encoder = nn.TransformerEncoder(layer, num_layers=1).eval()  # enable_nested_tensor=True
    encoder.layers[0].self_attn = ours
    x = rand(2, 7, 16, seed=68)
    padding = torch.zeros(2, 7, dtype=torch.bool, device=DEVICE)
    padding[1, 5:] = True
    with torch.no_grad(), pytest.raises(ValueError, match="nested tensors are not supported"):
        encoder(x, src_key_padding_mask=padding)
