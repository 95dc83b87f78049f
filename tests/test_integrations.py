"""``triton_workshop.integrations.transformers``: the registered attention implementation and
``patch_model`` on GPT-2 and Llama models built from small configs (random weights, nothing
downloaded), against the same models untouched: logits, loss and every gradient; padded batches
and dropout on the kernel; the calls it cannot take handed to an implementation that computes
every feature of the call (SDPA, or the model's eager attention for soft-capping and sinks);
generation with a KV cache. Every family: tests/test_hf_families.py.

transformers is optional: without it these tests are skipped (``pip install transformers``).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import triton_workshop  # noqa: F401  (first: decides interpreter-or-GPU before transformers loads)
from conftest import assert_same_gradients
from triton_workshop.nn.patch import InterpreterWarning, PatchWarning
from triton_workshop.ops.matmul import tf32_enabled
from triton_workshop.runtime import DEVICE

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install transformers)"
)
hf = pytest.importorskip("triton_workshop.integrations.transformers")

from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def ieee_fp32():
    before = tf32_enabled()
    torch.backends.cuda.matmul.allow_tf32 = False
    hf._warned.clear()  # each test sees the fallback warnings afresh
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture
def attention_calls(monkeypatch):
    """The (q, k) shapes of every call that reached triton-workshop's attention kernel."""
    calls = []
    original = hf.attention

    def spy(q, k, v, **kwargs):
        calls.append((tuple(q.shape), tuple(k.shape), kwargs.get("causal"), kwargs))
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(hf, "attention", spy)
    return calls


def gpt2(**overrides):
    config = dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, attn_pdrop=0.0,
                  resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    config.update(overrides)
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**config)).to(DEVICE)


def llama():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(DEVICE)


def tokens(batch=2, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (batch, length), generator=g).to(DEVICE)


def assert_same_training_step(model, reference, **inputs):
    ids = inputs.pop("input_ids")
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, **inputs).logits,
                                   reference(input_ids=ids, **inputs).logits, **TOL)  # fmt: skip
    out = model(input_ids=ids, labels=ids, **inputs)
    ref = reference(input_ids=ids, labels=ids, **inputs)
    assert out.logits is None  # the fused loss never builds them
    torch.testing.assert_close(out.loss, ref.loss, **TOL)
    assert_same_gradients(model, reference, out.loss, ref.loss, **TOL)


def test_registered_with_transformers():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert hf.ATTN_IMPLEMENTATION == "triton_workshop"
    assert AttentionInterface._global_mapping["triton_workshop"] is hf.attention_forward
    assert "triton_workshop" in AttentionMaskInterface._global_mapping


def test_gpt2_patch_model(attention_calls):
    model = gpt2()
    reference = copy.deepcopy(model)
    state_keys = list(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        warnings.simplefilter("ignore", InterpreterWarning)
        counts = hf.patch_model(model)
    assert {k: v for k, v in counts.items() if v} == {
        "attention": 2, "conv1d": 2, "cross_entropy": 1}  # fmt: skip
    assert counts.fused == {"layer_norm_linear": 0, "linear_activation": 2,
                            "linear_dropout": 0}  # the MLPs' GELUs
    # c_attn, c_proj (x2 layers) and lm_head: plain matmuls, left to cuBLAS by the linear= rule;
    # the LayerNorms, each on its own, left to torch by the layer_norm= rule
    assert sorted(s.name for s in counts.skipped if s.policy) == sorted(
        [f"transformer.h.{i}.{m}" for i in (0, 1) for m in ("attn.c_attn", "attn.c_proj",
                                                             "mlp.c_proj", "ln_1", "ln_2")]
        + ["lm_head", "transformer.ln_f"])
    assert model.config._attn_implementation == "triton_workshop"
    block = model.transformer.h[0]
    assert type(block.attn.c_attn) is transformers.pytorch_utils.Conv1D
    assert type(block.mlp.c_fc) is hf.Conv1D and block.mlp.c_fc.activation == "gelu"
    assert isinstance(block.mlp.c_fc, transformers.pytorch_utils.Conv1D)
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    assert list(model.state_dict()) == state_keys
    assert_same_training_step(model, reference, input_ids=tokens())
    assert len(attention_calls) == 4  # both layers, two forwards; causal, all 4 heads
    assert all(q == (2, 4, 12, 8) and causal for q, _, causal, _ in attention_calls)
    again = hf.patch_model(model)
    assert not any(again.values()) and not any(again.fused.values())
    assert not [s for s in again.skipped if not s.policy]


def test_gpt2_layer_norm_fused_rule_leaves_its_layer_norms_on_torch():
    """GPT-2's LayerNorms run on their own (none feeds a fusable Linear): layer_norm="fused"
    leaves all five on torch, listed by choice, and the model trains as before."""
    model = gpt2()
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        warnings.simplefilter("ignore", InterpreterWarning)
        counts = hf.patch_model(model, layer_norm="fused")
    assert counts["layer_norm"] == 0 and counts["attention"] == 2 and counts["conv1d"] == 2
    left = sorted(s.name for s in counts.skipped if s.kind == "layer_norm")
    assert left == sorted([f"transformer.h.{i}.ln_{j}" for i in (0, 1) for j in (1, 2)]
                          + ["transformer.ln_f"])
    assert all(s.policy for s in counts.skipped if s.kind == "layer_norm")
    assert type(model.transformer.ln_f) is torch.nn.LayerNorm
    assert_same_training_step(model, reference, input_ids=tokens())
    with pytest.raises(ValueError, match="layer_norm must be"):
        hf.patch_model(gpt2(), layer_norm="sometimes")


def test_linear_always_swaps_every_conv1d_and_linear():
    model = gpt2()
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpreterWarning)
        counts = hf.patch_model(model, linear="always")
    assert counts["conv1d"] == 8 and counts["linear"] == 1
    assert {s.kind for s in counts.skipped} == {"layer_norm"}  # each on its own: torch's
    assert type(model.transformer.h[0].attn.c_attn) is hf.Conv1D
    assert model.lm_head.weight is model.transformer.wte.weight
    assert_same_training_step(model, reference, input_ids=tokens())


def test_linear_never_leaves_every_conv1d_and_its_gelu_and_dropout_on_torch():
    model = gpt2()
    model.config.resid_pdrop = 0.1
    for block in model.transformer.h:
        block.mlp.dropout.p = block.attn.resid_dropout.p = 0.1
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpreterWarning)
        counts = hf.patch_model(model, linear="never")
    assert counts["conv1d"] == 0 and counts["linear"] == 0 and counts["attention"] == 2
    assert not any(counts.fused.values())
    block = model.transformer.h[0]
    assert type(block.mlp.c_fc) is transformers.pytorch_utils.Conv1D
    assert type(block.mlp.act) is not torch.nn.Identity  # the GELU runs as it did
    assert type(block.mlp.dropout) is torch.nn.Dropout and block.mlp.dropout.p == 0.1
    model.eval(), reference.eval()  # dropout off: the two models compare
    assert_same_training_step(model, reference, input_ids=tokens())


def test_padded_batch_and_dropout_reach_the_kernel(attention_calls, monkeypatch):
    model = gpt2()
    reference = copy.deepcopy(model)
    hf.patch_model(model)
    ids = tokens()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)  # no fallback
        out = model(input_ids=ids, attention_mask=mask).logits
    expected = reference(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(out[mask.bool()], expected[mask.bool()], **TOL)
    assert len(attention_calls) == 2
    padding = attention_calls[0][3]["key_padding_mask"]
    assert torch.equal(padding, mask.bool()) and attention_calls[0][2] is True

    keywords = []
    monkeypatch.setattr(hf, "attention", lambda q, k, v, **kw: keywords.append(kw) or
                        torch.zeros_like(q))  # fmt: skip
    dropping = gpt2(attn_pdrop=0.2)
    hf.patch_model(dropping)
    dropping.train()
    dropping(input_ids=ids)
    assert [kw.get("dropout_p") for kw in keywords] == [0.2, 0.2]
    dropping.eval()  # no dropout in eval
    dropping(input_ids=ids)
    assert [kw.get("dropout_p") for kw in keywords[2:]] == [None, None]


def _attention_module(family: str):
    """One attention module of a tiny config of ``family``, and its modeling module."""
    import importlib

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    if family == "gemma2":
        config = transformers.Gemma2Config(hidden_size=32, num_attention_heads=4, head_dim=8,
                                           num_key_value_heads=2, vocab_size=64)  # fmt: skip
        return module.Gemma2Attention(config, 0).to(DEVICE), module
    config = transformers.GptOssConfig(hidden_size=32, num_attention_heads=4, head_dim=8,
                                       num_key_value_heads=2, vocab_size=64)  # fmt: skip
    attn = module.GptOssAttention(config, 0).to(DEVICE)
    torch.nn.init.normal_(attn.sinks)
    return attn, module


@pytest.mark.parametrize("family, feature", [("gemma2", "softcap"), ("gpt_oss", "sinks")])
def test_features_the_kernel_lacks_go_to_the_eager_attention(family, feature, monkeypatch):
    """SDPA raises on soft-capping and drops GPT-OSS's sinks silently: a call the kernel cannot
    take with either goes to the model's eager attention, which computes them."""
    attn, modeling = _attention_module(family)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g).to(DEVICE)
    k, v = (torch.randn(2, 2, 5, 8, generator=g).to(DEVICE) for _ in range(2))
    kwargs = {"softcap": 2.0} if feature == "softcap" else {"s_aux": attn.sinks}
    causal = torch.ones(5, 5, dtype=torch.bool, device=DEVICE).tril()
    expected, _ = modeling.eager_attention_forward(
        attn, q, k, v, torch.where(causal, 0.0, torch.finfo(q.dtype).min), dropout=0.0,
        scaling=0.5, **kwargs)  # fmt: skip
    # On the kernel where it has the keyword ...
    out, _ = hf.attention_forward(attn, q, k, v, None, scaling=0.5, **kwargs)
    torch.testing.assert_close(out, expected, **TOL)
    # ... and on the eager attention where it has not (never SDPA, which would drop or refuse it).
    monkeypatch.setattr(hf, "kernel_keywords", lambda: frozenset({"causal", "scale"}))
    with pytest.warns(PatchWarning, match=f"{feature}.*eager attention"):
        out, _ = hf.attention_forward(attn, q, k, v, None, scaling=0.5, **kwargs)
    torch.testing.assert_close(out, expected, **TOL)


def test_a_mask_the_kernel_cannot_express_goes_to_sdpa(attention_calls):
    model = llama()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 6, 8, generator=g).to(DEVICE)
    k, v = (torch.randn(2, 2, 6, 8, generator=g).to(DEVICE) for _ in range(2))
    attn = model.model.layers[0].self_attn
    mask = torch.rand(2, 1, 6, 6, generator=g).to(DEVICE) > 0.3
    mask[..., 0] = True
    with pytest.warns(PatchWarning, match="cannot express"):
        out, _ = hf.attention_forward(attn, q, k, v, mask, scaling=0.25)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True).transpose(1, 2)  # fmt: skip
    torch.testing.assert_close(out, expected, **TOL)
    assert attention_calls == []
    # A causal mask with key padding and a window is read back exactly: the kernel.
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    padding = torch.tensor([[False, True, True, True, True, True], [True] * 6])
    built = ((j <= i) & (i - j < 3))[None, None] & padding[:, None, None, :]
    out, _ = hf.attention_forward(attn, q, k, v, built.to(DEVICE), scaling=0.25, sliding_window=3)
    assert len(attention_calls) == 1 and attention_calls[0][3]["window"] == 3
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=built.to(DEVICE), scale=0.25, enable_gqa=True).transpose(1, 2)
    keep = built.any(-1)[:, 0]  # rows that see a key (row 0 of sequence 0 sees none)
    torch.testing.assert_close(out[keep], expected[keep], **TOL)


def test_llama_grouped_query_attention(attention_calls):
    model = llama()
    reference = copy.deepcopy(model)
    counts = hf.patch_model(model, rope=False)  # RoPE: tests/test_hf_families.py (slow here)
    # 7 Linears per layer (q, k, v, o, gate, up, down) and the head: plain matmuls, left to cuBLAS
    assert counts["linear"] == 0 and len([s for s in counts.skipped if s.policy]) == 15
    assert counts["attention"] == 2 and counts["conv1d"] == 0
    assert counts["rms_norm"] == 5 and counts["rope"] == 0 and counts["swiglu"] == 2
    assert_same_training_step(model, reference, input_ids=tokens())
    # K/V keep their 2 heads (no repeat_kv copy): the kernel reads them grouped.
    assert attention_calls and all(q[1] == 4 and k[1] == 2 for q, k, _, _ in attention_calls)


def test_generation_with_a_kv_cache(attention_calls):
    model = llama()
    reference = copy.deepcopy(model)
    hf.patch_model(model, rope=False)  # RoPE: tests/test_hf_families.py (slow here)
    prompt = tokens(length=5)
    kwargs = dict(max_new_tokens=4, do_sample=False, attention_mask=torch.ones_like(prompt))
    with torch.no_grad():
        ours = model.generate(prompt, **kwargs)
        theirs = reference.generate(prompt, **kwargs)
    assert torch.equal(ours, theirs)
    # The prefill is causal over 5 queries; each decoding step is one query over the whole cache.
    assert attention_calls[0][0][2] == 5 and attention_calls[0][2] is True
    assert any(q[2] == 1 and k[2] > 5 and causal is False for q, k, causal, _ in attention_calls)


def test_attn_implementation_by_name(attention_calls):
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel._from_config(config, attn_implementation="triton_workshop").to(DEVICE)
    reference = copy.deepcopy(model)
    reference.set_attn_implementation("sdpa")
    ids = tokens()
    torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, **TOL)
    assert len(attention_calls) == 1


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_conv1d_matches_transformers(activation):
    torch.manual_seed(0)
    theirs = transformers.pytorch_utils.Conv1D(24, 16).to(DEVICE)
    torch.nn.init.normal_(theirs.bias)
    ours = hf.Conv1D(24, 16, activation=activation).to(DEVICE)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 16, device=DEVICE)
    expected = theirs(x)
    if activation == "gelu":
        expected = transformers.activations.NewGELUActivation()(expected)
    torch.testing.assert_close(ours(x), expected, **TOL)
    with pytest.raises(ValueError, match="activation"):
        hf.Conv1D(4, 4, activation="swish")


def test_compiled_model_refused_and_subclasses_listed():
    model = gpt2()
    with pytest.raises(ValueError, match="already compiled"):
        hf.patch_model(torch.compile(model))
    assert type(model.transformer.h[0].attn.c_attn) is transformers.pytorch_utils.Conv1D
    assert model.config._attn_implementation != "triton_workshop"

    class MyConv1D(transformers.pytorch_utils.Conv1D):
        pass

    model.transformer.h[0].attn.c_proj = MyConv1D(32, 32).to(DEVICE)
    with pytest.warns(PatchWarning, match="MyConv1D"):
        counts = hf.patch_model(model)
    assert counts["conv1d"] == 2  # the GELU-fused c_fc's; the plain ones by the linear= rule
    assert [s.name for s in counts.skipped if not s.policy] == ["transformer.h.0.attn.c_proj"]


@pytest.mark.parametrize("padded", [False, True])
def test_compiled_causal_attention_builds_no_mask(monkeypatch, padded):
    """Under torch.compile, as eagerly, a causal call with no padding mask gets no mask from the
    registered mask builder, so the kernel takes it (transformers' own builder builds the full
    mask while tracing, which would send every call to a masked SDPA); with a padding mask the
    mask is built, and the call goes to SDPA, which reads it."""
    model = llama()
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpreterWarning)
        hf.patch_model(model, rms_norm=False, rope=False, mlp=False, cross_entropy=False)
    fell_back = []
    original = hf._fallback

    def counted(*args, **kwargs):
        fell_back.append(args[4] is not None)  # with a mask
        return original(*args, **kwargs)

    monkeypatch.setattr(hf, "_fallback", counted)
    # With torch 2.11 a compile trace reads torch.compiler.is_exporting() as True, and
    # transformers' own builder never skips a mask there: the same here, on any version.
    monkeypatch.setattr(transformers.masking_utils, "is_torchdynamo_exporting", lambda: True,
                        raising=False)  # fmt: skip
    ids = tokens()
    inputs = {}
    if padded:
        inputs["attention_mask"] = torch.ones_like(ids)
        inputs["attention_mask"][0, :2] = 0
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    loss = compiled(input_ids=ids, labels=ids, **inputs).loss
    torch.testing.assert_close(loss, reference(input_ids=ids, labels=ids, **inputs).loss, **TOL)
    assert fell_back == ([True, True] if padded else [])


# ---------------------------------------------------------------------------------------------
# The loss of the logits (compiled=True, return_logits=True): transformers' ForCausalLMLoss on
# our cross-entropy.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["mean", "num_items", "shift_labels"])
def test_logits_loss_is_transformers_causal_lm_loss(dtype, variant):
    """``logits_loss`` gives ForCausalLMLoss's value (fp32, from the logits' own dtype: no fp32
    copy) and gradient, with ignored labels, a ``num_items_in_batch`` sum, given shift_labels."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 7, 37, generator=g) * 3).to(DEVICE, dtype).requires_grad_()
    labels = torch.randint(0, 37, (2, 7), generator=g).to(DEVICE)
    labels[0, :2] = -100
    kwargs = {}
    if variant == "num_items":
        kwargs["num_items_in_batch"] = torch.tensor(9, device=DEVICE)
    elif variant == "shift_labels":
        kwargs["shift_labels"] = torch.roll(labels, 2, dims=1)
    ref_logits = logits.detach().clone().requires_grad_()
    loss = hf.loss.logits_loss(logits, labels, 37, **kwargs)
    ref = ForCausalLMLoss(ref_logits, labels, 37, **kwargs)
    assert loss.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    ref.backward()
    assert logits.grad.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-4)
    torch.testing.assert_close(logits.grad, ref_logits.grad, **tol)


def test_return_logits_takes_the_models_head_and_our_cross_entropy(monkeypatch):
    """An eagerly patched model called with ``return_logits=True``: its own head's logits, and
    their loss on our cross-entropy; the unpatched model's loss and gradients."""
    model = llama()
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpreterWarning)
        assert hf.patch_model(model)["cross_entropy"] == 1
    calls = []
    original = hf.loss.cross_entropy

    def spy(logits, target, **kwargs):
        calls.append(kwargs.get("dtype"))
        return original(logits, target, **kwargs)

    monkeypatch.setattr(hf.loss, "cross_entropy", spy)
    ids = tokens()
    out = model(input_ids=ids, labels=ids, return_logits=True)
    ref = reference(input_ids=ids, labels=ids)
    assert calls == [torch.float32]
    torch.testing.assert_close(out.logits, ref.logits, **TOL)
    torch.testing.assert_close(out.loss, ref.loss, **TOL)
    assert_same_gradients(model, reference, out.loss, ref.loss, **TOL)
