"""``triton_workshop.integrations.transformers``: the registered attention implementation and
``patch_model`` on GPT-2 and Llama models built from small configs (random weights, nothing
downloaded), against the same models untouched: logits, loss and every gradient; padded batches
and dropout handed to transformers' SDPA path; generation with a KV cache.

transformers is optional: without it these tests are skipped (``pip install transformers``).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import triton_workshop  # noqa: F401  (first: decides interpreter-or-GPU before transformers loads)
from triton_workshop.nn.patch import PatchWarning
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
        calls.append((tuple(q.shape), tuple(k.shape), kwargs.get("causal")))
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
    out = model(input_ids=ids, labels=ids, **inputs)
    ref = reference(input_ids=ids, labels=ids, **inputs)
    torch.testing.assert_close(out.logits, ref.logits, **TOL)
    torch.testing.assert_close(out.loss, ref.loss, **TOL)
    out.loss.backward()
    ref.loss.backward()
    ref_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_params[name].grad, **TOL, msg=name)


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
        counts = hf.patch_model(model)
    assert counts == {"layer_norm": 5, "linear": 1, "conv2d": 0, "attention": 2, "conv1d": 8}
    assert counts.fused == {"layer_norm_linear": 0, "linear_activation": 2}  # the MLPs' GELUs
    assert model.config._attn_implementation == "triton_workshop"
    block = model.transformer.h[0]
    assert type(block.attn.c_attn) is hf.Conv1D and block.mlp.c_fc.activation == "gelu"
    assert isinstance(block.mlp.c_fc, transformers.pytorch_utils.Conv1D)
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    assert list(model.state_dict()) == state_keys
    assert_same_training_step(model, reference, input_ids=tokens())
    assert len(attention_calls) == 2  # both layers, forward; causal, all 4 heads
    assert all(q == (2, 4, 12, 8) and causal for q, _, causal in attention_calls)
    again = hf.patch_model(model)
    assert not any(again.values()) and not any(again.fused.values()) and not again.skipped


def test_padded_batch_and_dropout_go_to_sdpa(attention_calls):
    model = gpt2()
    reference = copy.deepcopy(model)
    hf.patch_model(model)
    ids = tokens()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    with pytest.warns(PatchWarning, match="attention mask"):
        out = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(out, reference(input_ids=ids, attention_mask=mask).logits, **TOL)
    assert attention_calls == []

    dropping = gpt2(attn_pdrop=0.2)
    hf.patch_model(dropping)
    dropping.train()
    with pytest.warns(PatchWarning, match="attention dropout 0.2"):
        dropping(input_ids=ids)
    dropping.eval()  # no dropout: the kernel again
    dropping(input_ids=ids)
    assert len(attention_calls) == 2


def test_llama_grouped_query_attention(attention_calls):
    model = llama()
    reference = copy.deepcopy(model)
    counts = hf.patch_model(model)
    # 7 Linears per layer (q, k, v, o, gate, up, down) and the head; RMSNorm stays transformers'.
    assert counts["linear"] == 15 and counts["attention"] == 2 and counts["conv1d"] == 0
    assert_same_training_step(model, reference, input_ids=tokens())
    # K/V keep their 2 heads (no repeat_kv copy): the kernel reads them grouped.
    assert attention_calls and all(q[1] == 4 and k[1] == 2 for q, k, _ in attention_calls)


def test_generation_with_a_kv_cache(attention_calls):
    model = llama()
    reference = copy.deepcopy(model)
    hf.patch_model(model)
    prompt = tokens(length=5)
    kwargs = dict(max_new_tokens=4, do_sample=False, attention_mask=torch.ones_like(prompt))
    with torch.no_grad():
        ours = model.generate(prompt, **kwargs)
        theirs = reference.generate(prompt, **kwargs)
    assert torch.equal(ours, theirs)
    # The prefill is causal over 5 queries; each decoding step is one query over the whole cache.
    assert attention_calls[0][0][2] == 5 and attention_calls[0][2] is True
    assert any(q[2] == 1 and k[2] > 5 and causal is False for q, k, causal in attention_calls)


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
    assert counts["conv1d"] == 7
    assert [s.name for s in counts.skipped] == ["transformer.h.0.attn.c_proj"]
