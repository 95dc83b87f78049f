"""``patch_model`` on every family it covers (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3
text, Phi-3, GPT-OSS, GPT-2), each from a tiny random config (hidden 64, 2 layers, 4 heads over 2
KV heads, vocabulary 128, 16 tokens, fp32; nothing downloaded), against the same model untouched:

* what is counted and what is listed as left on torch, per family;
* the residual add fused into the RMSNorm after it in every decoder layer (``add_rms_norm``, run
  in every forward), and not in a layer whose forward is not transformers' own (listed);
* logits; the loss with labels (the fused ``linear_cross_entropy`` where the family takes it) and
  every parameter's gradient; with a sliding window shorter than the sequence where the family
  has one, so the window reaches the kernel;
* greedy ``generate()`` on a left-padded batch (attention masks with zeros, a KV cache);
* no attention call handed to another implementation (a fallback warns: here it fails the test);
* patching one model leaves another of the same class, built from the same config object, as it
  was (bit-identical logits).

transformers is optional: without it (or without a family in the installed version) these tests
are skipped with the reason.
"""

from __future__ import annotations

import copy
import importlib
import io
import pickle
import subprocess
import sys
import warnings

import pytest
import torch

import triton_workshop  # noqa: F401  (first: decides interpreter-or-GPU before transformers loads)
from conftest import assert_same_gradients
from triton_workshop.nn.patch import InterpreterWarning, PatchWarning
from triton_workshop.runtime import DEVICE

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install transformers)"
)
hf = pytest.importorskip("triton_workshop.integrations.transformers")
from triton_workshop.integrations.transformers import decoder, families  # noqa: E402

pytestmark = pytest.mark.usefixtures("ieee_fp32")

TOL = dict(rtol=1e-4, atol=1e-5)
VOCAB, SEQ = 128, 16
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, attention_dropout=0.0)  # fmt: skip

#: family -> (config class, model class, config overrides). Sliding windows of 6 (< 16 tokens)
#: where the family has one.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=6)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=6)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=6)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5, sliding_window=6)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0,
                  embd_pdrop=0.0)),
}  # fmt: skip

#: family -> the nonzero counts patch_model gives (linear: the default rule leaves plain
#: Linears on cuBLAS).
EXPECTED = {
    "llama": dict(rms_norm=5, rope=2, swiglu=2, attention=2, cross_entropy=1, add_rms_norm=2),
    "mistral": dict(rms_norm=5, rope=2, swiglu=2, attention=2, cross_entropy=1, add_rms_norm=2),
    "qwen2": dict(rms_norm=5, rope=2, swiglu=2, attention=2, cross_entropy=1, add_rms_norm=2),
    "qwen3": dict(rms_norm=9, rope=2, swiglu=2, attention=2, cross_entropy=1,  # q/k norms
                  add_rms_norm=2),
    "gemma": dict(rms_norm=5, rope=2, geglu=2, attention=2, cross_entropy=1, add_rms_norm=2),
    "gemma2": dict(rms_norm=9, rope=2, geglu=2, attention=2,  # soft-capped logits: their loss
                   cross_entropy=1, add_rms_norm=2),
    "gemma3": dict(rms_norm=13, rope=2, geglu=2, attention=2, cross_entropy=1, add_rms_norm=2),
    "phi3": dict(rms_norm=5, rope=2, swiglu=2, attention=2, cross_entropy=1, add_rms_norm=2),
    "gpt_oss": dict(rms_norm=5, rope=2, attention=2, cross_entropy=1,  # experts stay
                    add_rms_norm=2),
    "gpt2": dict(conv1d=2, attention=2, cross_entropy=1),  # its 5 LayerNorms: each on its own
}
#: family -> {(kind, name)} of what is listed as left on torch for a limitation.
EXPECTED_SKIPPED = {
    "gpt_oss": {("swiglu", "model.layers.0.mlp.experts"), ("swiglu", "model.layers.1.mlp.experts")},
}


def build(family: str, seed: int = 0, config=None):
    config_name, model_name, overrides = FAMILIES[family]
    config_cls = getattr(transformers, config_name, None)
    model_cls = getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    if config is None:
        kwargs = dict(COMMON, **overrides)
        if family == "gpt2":
            kwargs = dict(overrides, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
                          pad_token_id=0)  # fmt: skip
        config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(config).to(DEVICE)
    with torch.no_grad():  # non-zero norm weights (Gemma's start at 0, Llama's at 1)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("sinks"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)).to(p) * 0.1)
    return model


def tokens(batch=2, length=SEQ, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g).to(DEVICE)


def patched(family):
    model = build(family)
    reference = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = hf.patch_model(model)
    return model, reference, counts, caught


@pytest.fixture
def no_fallback():
    """Any attention call handed to another implementation fails the test (it warns)."""
    hf._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        warnings.simplefilter("ignore", InterpreterWarning)
        yield


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    original = hf.attention

    def spy(q, k, v, **kwargs):
        calls.append((tuple(q.shape), tuple(k.shape), kwargs))
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(hf, "attention", spy)
    return calls


@pytest.fixture
def fused_adds(monkeypatch):
    """The shapes of every residual add that ran fused with its RMSNorm."""
    calls = []
    original = decoder.add_rms_norm

    def spy(x, residual, *args, **kwargs):
        calls.append(tuple(x.shape))
        return original(x, residual, *args, **kwargs)

    monkeypatch.setattr(decoder, "add_rms_norm", spy)
    return calls


# ---------------------------------------------------------------------------------------------
# What is patched, per family.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_counts_and_skipped(family):
    model, _, counts, caught = patched(family)
    nonzero = {k: v for k, v in counts.items() if v}
    assert nonzero == EXPECTED[family]
    limited = {(s.kind, s.name) for s in counts.skipped if not s.policy}
    assert limited == EXPECTED_SKIPPED.get(family, set())
    by_policy = [s for s in counts.skipped if s.policy]
    assert by_policy and all(s.kind in ("linear", "conv1d", "layer_norm") for s in by_policy)
    # A LayerNorm that runs on its own stays on torch by default (GPT-2's five).
    assert sum(s.kind == "layer_norm" for s in by_policy) == (5 if family == "gpt2" else 0)
    # One warning names the limited ones, none the Linears left by the rule.
    texts = [str(w.message) for w in caught if issubclass(w.category, PatchWarning)
             and not issubclass(w.category, InterpreterWarning)]  # fmt: skip
    assert len(texts) == (1 if limited else 0)
    assert all(name in texts[0] for _, name in limited) if limited else True
    assert model.config._attn_implementation == "triton_workshop"
    again = hf.patch_model(model)
    assert not any(again.values())
    assert not [s for s in again.skipped if not s.policy] or family in EXPECTED_SKIPPED


@pytest.mark.parametrize("family", ["llama", "gemma", "gpt2"])
def test_compiled_leaves_the_norms_to_inductor(family, monkeypatch):
    """compiled=True: every RMSNorm (and with it each layer's residual add) or LayerNorm stays on
    torch, listed by choice; the rest is counted as without it; the loss is the model's own head,
    then our cross-entropy on its logits (counted), equal to the unpatched model's."""
    model = build(family)
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)  # nothing left for a limitation
        warnings.simplefilter("ignore", InterpreterWarning)
        counts = hf.patch_model(model, compiled=True)
    norms = {"rms_norm", "add_rms_norm", "layer_norm"}
    expected = {k: v for k, v in EXPECTED[family].items() if k not in norms}
    assert {k: v for k, v in counts.items() if v} == expected
    assert counts["cross_entropy"] == 1
    left = [s for s in counts.skipped if s.kind in norms]
    standalone_layer_norms = 5 if family == "gpt2" else 0  # left in either mode
    assert len(left) == sum(v for k, v in EXPECTED[family].items() if k in norms) + (
        standalone_layer_norms)
    assert all(s.policy for s in left)
    assert not [name for name, m in model.named_modules()  # as they were: not ours
                if name.endswith(("norm", "ln_1", "ln_2", "ln_f"))
                and (type(m).__module__.startswith("triton_workshop")
                     or families.patched_kind(m) is not None)]
    losses = []
    original = hf.loss.cross_entropy

    def spy(logits, target, **kwargs):
        losses.append(tuple(logits.shape))
        return original(logits, target, **kwargs)

    monkeypatch.setattr(hf.loss, "cross_entropy", spy)
    ids = tokens(batch=1)
    out = model(input_ids=ids, labels=ids)
    ref = reference(input_ids=ids, labels=ids)
    assert losses == [(SEQ, VOCAB)]  # the logits the model made, on our kernel
    assert out.logits is None  # with a loss, as the fused path gives it
    torch.testing.assert_close(out.loss, ref.loss, **TOL)
    assert_same_gradients(model, reference, out.loss, ref.loss, **TOL)
    with torch.no_grad():
        kept = model(input_ids=ids, labels=ids, return_logits=True)
    torch.testing.assert_close(kept.logits, ref.logits, **TOL)
    torch.testing.assert_close(kept.loss, ref.loss, **TOL)
    with pytest.raises(TypeError, match="compiled must be a bool"):
        hf.patch_model(build(family), compiled=1)


def _compiled_llama(compiled: bool, backend: str = "inductor"):
    """A tiny Llama patched (``compiled`` as patch_model's), its unpatched copy, the model
    under ``torch.compile(fullgraph=True)``, and one sequence of tokens."""
    model = build("llama")
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpreterWarning)
        hf.patch_model(model, compiled=compiled)
    torch._dynamo.reset()
    return model, reference, torch.compile(model, backend=backend, fullgraph=True), tokens(batch=1)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True])
def test_a_patched_model_compiles_in_one_graph(compiled):
    """torch.compile(fullgraph=True) of a patched Llama, with the loss: no graph break (traced,
    the loss is the model's head and our cross-entropy), the unpatched model's loss and
    gradients."""
    model, reference, traced, ids = _compiled_llama(compiled)
    out = traced(input_ids=ids, labels=ids)
    # With a loss the logits are dropped, as the fused path drops them eagerly: the compiled
    # graph does not return them (their gradient would be a zero-filled logits-sized tensor).
    assert out.logits is None
    ref = reference(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(out.loss, ref, **TOL)
    assert_same_gradients(model, reference, out.loss, ref, **TOL)


def test_a_compiled_patched_model_returns_logits_when_asked_or_without_labels():
    """Traced, ``return_logits=True`` keeps the head's logits beside the loss, and a call without
    labels (generation) returns them as always: the unpatched model's logits and loss."""
    _, reference, compiled, ids = _compiled_llama(True, backend="aot_eager")
    out = compiled(input_ids=ids, labels=ids, return_logits=True)
    ref = reference(input_ids=ids, labels=ids)
    torch.testing.assert_close(out.logits, ref.logits, **TOL)
    torch.testing.assert_close(out.loss, ref.loss, **TOL)
    with torch.no_grad():
        torch.testing.assert_close(compiled(input_ids=ids).logits,
                                   reference(input_ids=ids).logits, **TOL)


# ---------------------------------------------------------------------------------------------
# Parity: logits, loss, gradients (training mode: the fused loss path), generation.
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_loss_and_gradients(family, no_fallback, kernel_calls, fused_adds):
    model, reference, counts, _ = patched(family)
    model.train(), reference.train()
    ids = tokens(batch=1)  # one sequence: the interpreter's time grows with the tokens
    labels = ids.clone()
    labels[:, :3] = -100  # ignored positions, as a prompt's are
    out = model(input_ids=ids, labels=labels)
    ref = reference(input_ids=ids, labels=labels)
    assert len(fused_adds) == counts["add_rms_norm"]  # one per layer, each forward
    if counts["cross_entropy"]:
        kind = families.patched_kind(model)
        # the fused loss: logits never materialised; Gemma 2's capped logits: their loss on our
        # cross-entropy
        assert kind == ("cross_entropy_logits" if family == "gemma2" else "cross_entropy")
        assert (out.logits is None) == (kind == "cross_entropy")
    torch.testing.assert_close(out.loss, ref.loss, **TOL)
    out.loss.backward()
    ref.loss.backward()
    ref_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        if ref_params[name].grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, ref_params[name].grad, **TOL, msg=name)
    assert len(kernel_calls) == 2
    windows = [kw.get("window") for _, _, kw in kernel_calls]
    has_window = "sliding_window" in FAMILIES[family][2] and family != "gpt2"
    assert any(windows) == has_window
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits,
                                   **TOL)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_generate_a_padded_batch(family, no_fallback, kernel_calls, fused_adds):
    model, reference, counts, _ = patched(family)
    model.eval(), reference.eval()
    prompt = tokens(length=6, seed=3)
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0  # left padding
    prompt = prompt.masked_fill(mask == 0, 0)
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0,
                  output_logits=True, return_dict_in_generate=True)  # fmt: skip
    with torch.no_grad():
        ours = model.generate(prompt, **kwargs)
        theirs = reference.generate(prompt, **kwargs)
    assert_same_greedy_tokens(ours, theirs, prompt.shape[1])
    assert any(kw.get("key_padding_mask") is not None for _, _, kw in kernel_calls)
    assert any(q[2] == 1 for q, _, _ in kernel_calls)  # decoding steps on the kernel too
    assert bool(fused_adds) == bool(counts["add_rms_norm"])
    assert any(shape[1] == 1 for shape in fused_adds) or not fused_adds  # decoding steps too


def assert_same_greedy_tokens(ours, theirs, prompt_len: int) -> None:
    """The same tokens, step by step, with the same logits; a step may pick another token only
    where the reference's two candidates tie to within the logits' tolerance (summation order:
    a tiny random model often has near-equal logits), and the comparison stops there."""
    for step, (a, b) in enumerate(zip(ours.logits, theirs.logits)):
        torch.testing.assert_close(a, b, **TOL, msg=f"step {step}")
        mine = ours.sequences[:, prompt_len + step]
        their = theirs.sequences[:, prompt_len + step]
        if not torch.equal(mine, their):
            rows = torch.nonzero(mine != their)[:, 0]
            gap = (b[rows, mine[rows]] - b[rows, their[rows]]).abs()
            assert float(gap.max()) <= TOL["atol"] + TOL["rtol"] * float(b[rows].abs().max())
            return
    assert torch.equal(ours.sequences, theirs.sequences)


# ---------------------------------------------------------------------------------------------
# Per instance: another model is untouched.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_patching_one_model_leaves_another_unchanged(family):
    first = build(family, seed=0)
    second = build(family, seed=1, config=first.config)  # the same config object
    ids = tokens()
    with torch.no_grad():
        before = second(input_ids=ids).logits
    classes = [type(m) for m in second.modules()]
    implementation = second.config._attn_implementation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        hf.patch_model(first)
    assert first.config is not second.config
    assert second.config._attn_implementation == implementation
    assert [type(m) for m in second.modules()] == classes
    module = importlib.import_module(type(second).__module__)
    assert module.apply_rotary_pos_emb.__module__ == module.__name__
    with torch.no_grad():
        after = second(input_ids=ids, labels=ids)
    assert torch.equal(after.logits, before)


def _kinds(model) -> list:
    return [(name, families.patched_kind(m)) for name, m in model.named_modules()]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_patched_model_pickles_with_its_patch(family):
    """``torch.save(model)`` (and a process spawned with the model) pickles it: each patched
    module as the class it was made from and how, loaded as the same patched module."""
    model, _, _, _ = patched(family)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert _kinds(loaded) == _kinds(model) and any(kind for _, kind in _kinds(model))
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
    ids = tokens()
    with torch.no_grad():
        want, got = model(input_ids=ids, labels=ids), loaded(input_ids=ids, labels=ids)
    assert torch.equal(got.loss, want.loss)


def test_a_patched_attention_whose_class_is_unknown_at_load_is_refused(monkeypatch):
    """Loaded under a transformers whose attention class patch_model does not know (here: the
    recipe lookup finds none, the made classes forgotten), the load says so by name."""
    model, _, _, _ = patched("llama")
    data = pickle.dumps(model.model.layers[0].self_attn)
    monkeypatch.setattr(families, "_forward_with_rope", lambda cls: None)
    families._subclass.cache_clear()
    with pytest.raises(RuntimeError, match="LlamaAttention patched for rope cannot be loaded"):
        pickle.loads(data)
    families._subclass.cache_clear()


def test_a_patched_model_loads_in_a_new_process(tmp_path):
    """The classes patch_model made do not exist in a fresh process: unpickling builds them
    again from the importable classes, and the loaded model computes what the saved one did."""
    model, _, _, _ = patched("llama")
    ids = tokens()
    with torch.no_grad():
        want = model(input_ids=ids, labels=ids).loss.item()
    torch.save((model, ids), tmp_path / "model.pt")
    script = (
        "import sys, torch, warnings; warnings.simplefilter('ignore')\n"
        "import triton_workshop\n"
        "from triton_workshop.integrations.transformers import families\n"
        "model, ids = torch.load(sys.argv[1], weights_only=False)\n"
        "kinds = sorted({families.patched_kind(m) or '' for m in model.modules()} - {''})\n"
        "with torch.no_grad():\n"
        "    print(','.join(kinds), repr(model(input_ids=ids, labels=ids).loss.item()))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model.pt")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    kinds, loss = out.stdout.split()[-2:]
    assert kinds.split(",") == sorted({k for _, k in _kinds(model) if k})
    torch.testing.assert_close(float(loss), want, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------
# The residual add fused into the norm: only in transformers' own layers; checkpointing.
# ---------------------------------------------------------------------------------------------
def test_a_decoder_layer_with_its_own_forward_is_left_unfused_and_listed(fused_adds):
    model = build("llama")
    layer_class = type(model.model.layers[0])

    class LoggingLayer(layer_class):  # its own forward: whatever it computes stays as it is
        def forward(self, hidden_states, *args, **kwargs):
            return super().forward(hidden_states, *args, **kwargs)

    class RenamedLayer(layer_class):  # transformers' forward, inherited: fused
        pass

    model.model.layers[0].__class__ = LoggingLayer
    model.model.layers[1].__class__ = RenamedLayer
    reference = copy.deepcopy(model)
    with pytest.warns(PatchWarning, match="model.layers.0 .add_rms_norm.: its forward is none"):
        counts = hf.patch_model(model, attention=False, rope=False)
    assert counts["add_rms_norm"] == 1 and counts["rms_norm"] == 5
    assert [(s.kind, s.name) for s in counts.skipped if not s.policy] == [
        ("add_rms_norm", "model.layers.0")]
    assert type(model.model.layers[0]) is LoggingLayer
    assert isinstance(model.model.layers[1], RenamedLayer)
    ids = tokens(batch=1, length=8)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits,
                                   **TOL)
    assert len(fused_adds) == 1


def test_a_hook_on_the_norm_keeps_its_add_apart(fused_adds):
    model = build("llama")
    seen = []
    norm = model.model.layers[1].post_attention_layernorm
    norm.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with pytest.warns(PatchWarning, match="a hook on its post_attention_layernorm"):
        counts = hf.patch_model(model, attention=False, rope=False)
    assert counts["add_rms_norm"] == 1
    with torch.no_grad():
        model(input_ids=tokens(batch=1, length=8))
    assert len(fused_adds) == 1 and len(seen) == 1  # the hook still ran
    # A hook added after patching: that call runs the add and the norm apart, the hook sees it.
    model.model.layers[0].post_attention_layernorm.register_forward_hook(
        lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        model(input_ids=tokens(batch=1, length=8))
    assert len(fused_adds) == 1 and len(seen) == 3


def test_terms_of_two_dtypes_add_as_torch_does():
    model = build("llama")
    hf.patch_model(model, attention=False, rope=False)
    norm = model.model.layers[0].post_attention_layernorm
    x = torch.randn(2, 3, 64, device=DEVICE, dtype=torch.float64)
    residual = torch.randn(2, 3, 64, device=DEVICE)
    normed, total = decoder.add_then_norm(norm, x, residual)
    assert total.dtype == torch.float64
    torch.testing.assert_close(total, residual + x)
    torch.testing.assert_close(normed, norm(residual + x))


@pytest.mark.slow
def test_fused_layers_under_gradient_checkpointing(fused_adds):
    model, reference, counts, _ = patched("llama")
    kwargs = {"use_reentrant": False}
    for m in (model, reference):
        if hasattr(m, "activation_checkpointing_enable"):  # the newer name
            m.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        m.train()
    ids = tokens(batch=1, length=8)
    out = model(input_ids=ids, labels=ids, output_hidden_states=True)
    ref = reference(input_ids=ids, labels=ids, output_hidden_states=True)
    for ours, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        torch.testing.assert_close(ours, theirs, **TOL)
    out.loss.backward()
    ref.loss.backward()
    assert len(fused_adds) == 2 * counts["add_rms_norm"]  # the forward, then its recomputation
    ref_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_params[name].grad, **TOL, msg=name)


def test_fused_layer_takes_the_older_cache_argument_name():
    """transformers before the rename (5.17 and earlier) calls a layer's cache argument
    ``past_key_values`` and passes it on under that name: the fused body follows."""
    import inspect

    from torch import nn

    written = decoder.llama_layer_forward
    names = tuple("past_key_values" if n == "cache" else n
                  for n in inspect.signature(written).parameters)
    body = decoder.body_for(written, names)
    assert body is not None and tuple(inspect.signature(body).parameters) == names
    assert decoder.body_for(written, names + ("something_else",)) is None

    seen = {}

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = self.post_attention_layernorm = nn.Identity()
            self.mlp = nn.Identity()

        def self_attn(self, **kwargs):
            seen.update(kwargs)
            return kwargs["hidden_states"] * 2, None

    h = torch.randn(2, 3, 4)
    out = body(Layer(), h, past_key_values="the cache")
    assert seen["past_key_values"] == "the cache" and "cache" not in seen
    torch.testing.assert_close(out, 2 * (h + 2 * h))  # h + attn, then + mlp of it


@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_under_autocast_rope_writes_what_the_attention_reads(family, monkeypatch):
    """Under bf16 autocast (fp32 weights, transformers' fp32 cos/sin) the rotated q and k are
    written in bf16, the dtype every attention casts them to; logits, loss and gradients stay
    the unpatched model's under the same autocast (bf16's tolerance)."""
    model = build(family)
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)  # GPT-OSS's experts, listed
        hf.patch_model(model)
    seen = []
    original = families.rope  # the name the patched attention's rotation calls

    def spy(q, k, cos, sin, **kwargs):
        out = original(q, k, cos, sin, **kwargs)
        seen.append((q.dtype, cos.dtype, kwargs.get("dtype"), out[0].dtype))
        return out

    monkeypatch.setattr(families, "rope", spy)
    ids = tokens()
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids, return_logits=True)
        ref = reference(input_ids=ids, labels=ids)
    bf16 = torch.bfloat16
    assert seen and all(s == (bf16, torch.float32, bf16, bf16) for s in seen)
    tol = dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(out.logits.float(), ref.logits.float(), **tol)
    torch.testing.assert_close(out.loss, ref.loss, **tol)
    assert_same_gradients(model, reference, out.loss, ref.loss, **tol)
    seen.clear()
    model(input_ids=ids)  # without autocast: transformers' dtypes (fp32 here)
    assert seen and all(s[2] is None and s[3] is torch.float32 for s in seen)


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_mlp_projections_run_as_autocast_linear_unless_hooked(family, monkeypatch):
    """A patched gated MLP computes its plain Linears' products through autocast_linear (under
    autocast an fp32 weight's gradient comes from the GEMM in fp32), the Linears themselves
    unchanged; a Linear with a hook is called as a module, so the hook runs. Values, loss and
    gradients stay the unpatched model's under autocast."""
    model = build(family)
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpreterWarning)
        hf.patch_model(model)
    mlp = model.model.layers[0].mlp
    linears = [m for m in mlp.children() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is torch.nn.Linear for m in linears)  # left as they were
    original = families.autocast_linear  # the name the patched MLP's forward calls
    products = []

    def spy(x, weight, bias=None):
        products.append(weight.shape)
        return original(x, weight, bias)

    monkeypatch.setattr(families, "autocast_linear", spy)
    ids = tokens()
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids, return_logits=True)
        ref = reference(input_ids=ids, labels=ids)
    per_layer = 3 if family == "llama" else 2  # gate, up, down / gate_up, down
    assert len(products) == per_layer * COMMON["num_hidden_layers"]
    tol = dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(out.logits.float(), ref.logits.float(), **tol)
    assert_same_gradients(model, reference, out.loss, ref.loss, **tol)
    seen = []
    linears[0].register_forward_hook(lambda module, args, output: seen.append(output.shape))
    products.clear()
    model(input_ids=ids)
    assert len(seen) == 1 and len(products) == per_layer * COMMON["num_hidden_layers"] - 1
