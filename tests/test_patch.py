"""``triton_workshop.nn.patch``: swapped modules compute what torch's did (forward and backward,
same parameters), in place (same objects, Parameters, hooks, state_dict keys, optimisers), with
the fusions inside ``nn.Sequential`` only where they are provably adjacent, the unsupported
modules left on torch and listed, and the refused models refused before anything changes.
The ``linear=`` rule: by default a Linear is swapped only where something runs fused with it.

fp32 with TF32 off: both sides compute IEEE fp32 and differ only in summation order.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop import nn as tw
from triton_workshop.nn.patch import (
    COUNT_KEYS,
    FusedSequential,
    InterpreterWarning,
    PatchCounts,
    PatchedMultiheadAttention,
    PatchWarning,
)
from triton_workshop.ops.matmul import tf32_enabled
from triton_workshop.runtime import DEVICE

TOL = dict(rtol=1e-4, atol=1e-5)
# The module (the attribute triton_workshop.nn.patch is the function).
patch_module = importlib.import_module("triton_workshop.nn.patch")


@pytest.fixture(autouse=True)
def ieee_fp32():
    before = tf32_enabled(), torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


def counts(**nonzero) -> dict:
    return {key: nonzero.get(key, 0) for key in COUNT_KEYS}


def fused(result) -> dict:
    """The nonzero fusion counts of a patch result."""
    return {key: n for key, n in result.fused.items() if n}


def assert_same_function(patched: nn.Module, reference: nn.Module, *inputs, call=None, tol=TOL):
    """Outputs, input gradients and parameter gradients (by name) of the patched model and of
    the untouched copy, on the same random data."""
    call = call or (lambda m, *xs: m(*xs))
    leaves = [x.clone().requires_grad_() for x in inputs]
    ref_leaves = [x.clone().requires_grad_() for x in inputs]
    out, ref_out = call(patched, *leaves), call(reference, *ref_leaves)
    torch.testing.assert_close(out, ref_out, **tol)
    dy = rand(*out.shape, seed=42)
    (out * dy).sum().backward()
    (ref_out * dy).sum().backward()
    for x, r in zip(leaves, ref_leaves):
        torch.testing.assert_close(x.grad, r.grad, **tol)
    ref_params = dict(reference.named_parameters())
    for name, p in patched.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, ref_params[name].grad, **tol, msg=name)


def patch_quietly(model, **flags):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)  # nothing should be skipped here
        warnings.simplefilter("ignore", InterpreterWarning)  # said once a process (tested below)
        return tw.patch(model, **flags)


def left_by_rule(result) -> list[str]:
    """The names of the modules the linear= rule left on torch."""
    return [s.name for s in result.skipped if s.policy]


class MLPBlock(nn.Module):
    """LayerNorm → Linear → ReLU → Linear, written as a forward (not a Sequential): swapped, never
    fused, since patch cannot see how the outputs flow."""

    def __init__(self, width=24):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width, bias=False)

    def forward(self, x):
        return x + self.down(F.relu(self.up(self.norm(x))))


# ---------------------------------------------------------------------------------------------
# Each kind, values and gradients.
# ---------------------------------------------------------------------------------------------
def test_linear_and_layer_norm_in_a_custom_forward():
    torch.manual_seed(0)
    model = nn.Sequential(MLPBlock(), MLPBlock()).to(DEVICE)
    reference = copy.deepcopy(model)
    by_default = copy.deepcopy(model)
    # Nothing runs fused with these Linears or LayerNorms (their forward is opaque): torch keeps
    # them ...
    result = patch_quietly(by_default)
    assert result == counts()
    assert sorted(left_by_rule(result)) == ["0.down", "0.norm", "0.up", "1.down", "1.norm", "1.up"]
    assert type(by_default[0].up) is nn.Linear and type(by_default[0].norm) is nn.LayerNorm
    # ... unless asked.
    assert patch_quietly(model, linear="always", layer_norm="always") == counts(layer_norm=2,
                                                                                linear=4)
    assert type(model[0].norm) is tw.LayerNorm and type(model[1].up) is tw.Linear
    assert type(model) is nn.Sequential  # MLPBlock → MLPBlock: nothing to fuse
    assert_same_function(model, reference, rand(3, 5, 24, seed=1))


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_conv2d(channels_last):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False),
        nn.Conv2d(8, 4, 1, dilation=1, padding="same"),
    ).to(DEVICE)  # fmt: skip
    x = rand(2, 3, 9, 11, seed=3)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    reference = copy.deepcopy(model)
    # By default every convolution stays on cuDNN (the faster one in a training step), listed by
    # choice (no warning), whatever its layout.
    result = patch_quietly(model)
    assert result == counts()
    assert [(s.name, s.kind, s.policy) for s in result.skipped] == [
        ("0", "conv2d", True), ("3", "conv2d", True), ("4", "conv2d", True)]
    assert "conv2d='always'" in result.skipped[0].reason
    assert all(type(model[i]) is nn.Conv2d for i in (0, 3, 4))
    assert_same_function(model, reference, x)
    assert patch_quietly(model, conv2d="always") == counts(conv2d=3)
    assert all(type(model[i]) is tw.Conv2d for i in (0, 3, 4))
    assert isinstance(model[0], nn.Conv2d)  # init loops that look for nn.Conv2d still find it
    assert_same_function(model, reference, x)


def test_layer_norm_fused_rule_keeps_only_the_fused_layer_norms():
    """layer_norm="fused": a LayerNorm → Linear pair in a Sequential runs fused; a LayerNorm on its
    own (here inside a custom forward) stays on torch, listed by choice; the values stay the
    unpatched model's."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.LayerNorm(24), nn.Linear(24, 24)),  # no activation: LN + Linear fuse
        MLPBlock(),
    ).to(DEVICE)  # fmt: skip
    reference = copy.deepcopy(model)
    result = patch_quietly(model, layer_norm="fused")
    assert result == counts(layer_norm=1, linear=1)
    assert fused(result) == {"layer_norm_linear": 1}
    assert type(model[0][0]) is tw.LayerNorm and type(model[1].norm) is nn.LayerNorm
    norm_left = [s for s in result.skipped if s.kind == "layer_norm"]
    assert [(s.name, s.policy) for s in norm_left] == [("1.norm", True)]
    assert "layer_norm='fused'" in norm_left[0].reason
    assert_same_function(model, reference, rand(3, 5, 24, seed=2))
    # The other values, and bad ones refused by name before anything changes.
    assert patch_quietly(copy.deepcopy(reference), layer_norm="always")["layer_norm"] == 2
    assert patch_quietly(copy.deepcopy(reference), layer_norm=True)["layer_norm"] == 1
    assert patch_quietly(copy.deepcopy(reference))["layer_norm"] == 1  # "fused": the default
    assert patch_quietly(copy.deepcopy(reference), layer_norm="never")["layer_norm"] == 0
    assert patch_quietly(copy.deepcopy(reference), layer_norm=False)["layer_norm"] == 0
    with pytest.raises(ValueError, match="layer_norm must be"):
        tw.patch(copy.deepcopy(reference), layer_norm="sometimes")
    with pytest.raises(TypeError, match="layer_norm must be"):
        tw.patch(copy.deepcopy(reference), layer_norm=1)


def test_compiled_leaves_the_standalone_norms_to_inductor():
    """compiled=True (a model about to be compiled): the LayerNorm fused with the Linear after it
    stays swapped, the LayerNorm and the RMSNorm that run on their own stay on torch, listed by
    choice with the reason; the values stay the unpatched model's."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.LayerNorm(24), nn.Linear(24, 24)),  # no activation: LN + Linear fuse
        MLPBlock(),
        nn.RMSNorm(24),
    ).to(DEVICE)  # fmt: skip
    reference = copy.deepcopy(model)
    result = patch_quietly(model, compiled=True)
    assert result == counts(layer_norm=1, linear=1)
    assert fused(result) == {"layer_norm_linear": 1}
    assert type(model[0][0]) is tw.LayerNorm
    assert type(model[1].norm) is nn.LayerNorm and type(model[2]) is nn.RMSNorm
    left = {(s.name, s.kind, s.policy) for s in result.skipped if "norm" in s.kind}
    assert left == {("1.norm", "layer_norm", True), ("2", "rms_norm", True)}
    assert all("compiled=True" in s.reason for s in result.skipped if "norm" in s.kind)
    assert_same_function(model, reference, rand(3, 5, 24, seed=2))
    # Not compiled (the default): the RMSNorm swapped too; the LayerNorm on its own stays.
    assert patch_quietly(copy.deepcopy(reference)) == counts(layer_norm=1, rms_norm=1, linear=1)
    with pytest.raises(TypeError, match="compiled must be a bool"):
        tw.patch(copy.deepcopy(reference), compiled="yes")


def test_conv2d_policy_values():
    model = nn.Sequential(nn.Conv2d(3, 4, 3)).to(DEVICE).to(memory_format=torch.channels_last)
    assert patch_quietly(copy.deepcopy(model), conv2d=False) == counts()
    assert patch_quietly(copy.deepcopy(model), conv2d="never") == counts()
    assert patch_quietly(copy.deepcopy(model), conv2d="auto") == counts()
    assert patch_quietly(copy.deepcopy(model), conv2d="always") == counts(conv2d=1)
    with pytest.raises(ValueError, match="conv2d must be"):
        patch_quietly(model, conv2d="sometimes")
    with pytest.raises(TypeError, match="conv2d must be"):
        patch_quietly(model, conv2d=1)


@pytest.mark.parametrize("linear", ["fused", "always"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_self_and_cross(batch_first, linear):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first).to(DEVICE)
    holder = nn.ModuleDict({"attn": mha})
    reference = copy.deepcopy(holder)
    assert patch_quietly(holder, linear=linear) == counts(attention=1)
    assert type(holder["attn"]) is PatchedMultiheadAttention
    assert isinstance(holder["attn"], tw.MultiheadAttention)
    # The projections are plain matmuls: on cuBLAS unless every Linear is asked for.
    every = linear == "always"
    assert holder["attn"].cublas_projections is not every
    assert (type(holder["attn"].out_proj) is tw.Linear) is every
    assert "out_proj" not in [s.name.rsplit(".", 1)[-1] for s in patch_quietly(holder).skipped]
    x = rand(3, 5, 16, seed=4) if batch_first else rand(5, 3, 16, seed=4)
    kv = rand(3, 7, 16, seed=5) if batch_first else rand(7, 3, 16, seed=5)

    def self_attention(m, x):
        return m["attn"](x, x, x, need_weights=False)[0]

    def cross_attention(m, x, kv):
        return m["attn"](x, kv, kv, need_weights=False)[0]

    def causal(m, x):
        length = x.shape[1] if batch_first else x.shape[0]
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        return m["attn"](x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]

    assert_same_function(holder, reference, x, call=self_attention)
    holder.zero_grad(), reference.zero_grad()
    assert_same_function(holder, reference, x, kv, call=cross_attention)
    holder.zero_grad(), reference.zero_grad()
    assert_same_function(holder, reference, x, call=causal)


def test_transformer_encoder_in_training():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(DEVICE)
    reference = copy.deepcopy(model)
    by_default = copy.deepcopy(model)
    # linear1/linear2: plain matmuls, left to cuBLAS; the norms run on their own: torch's.
    result = patch_quietly(by_default)
    assert result == counts(attention=2)
    assert sorted(left_by_rule(result)) == sorted(
        [f"layers.{i}.{m}{j}" for i in (0, 1) for m in ("linear", "norm") for j in (1, 2)])
    assert patch_quietly(model, linear="always", layer_norm="always") == counts(
        layer_norm=4, linear=4, attention=2)
    assert_same_function(model, reference, rand(2, 6, 16, seed=6))


# ---------------------------------------------------------------------------------------------
# In place: the same objects, Parameters, state_dict, hooks, optimisers.
# ---------------------------------------------------------------------------------------------
def test_parameters_state_dict_and_identity_carry_over():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.MultiheadAttention(8, 2)).to(DEVICE)
    modules_before = list(model.modules())
    params_before = list(model.parameters())
    names_before = [n for n, _ in model.named_parameters()]
    state_before = model.state_dict(keep_vars=True)
    model[0].custom_tag = "kept"  # an attribute someone set: it carries over
    patch_quietly(model, linear="always")
    assert type(model[0]) is tw.Linear
    assert [id(m) for m in model.modules()] == [id(m) for m in modules_before]
    assert all(a is b for a, b in zip(model.parameters(), params_before))
    assert [n for n, _ in model.named_parameters()] == names_before
    state_after = model.state_dict(keep_vars=True)
    assert list(state_after) == list(state_before)
    assert all(state_after[k] is state_before[k] for k in state_before)
    assert model[0].custom_tag == "kept"
    # A torch model's checkpoint loads into the patched one, and the other way round.
    other = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.MultiheadAttention(8, 2)).to(DEVICE)
    model.load_state_dict(other.state_dict())
    other.load_state_dict(model.state_dict())


def test_optimizer_built_before_patch_trains_the_patched_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(12), nn.Linear(12, 20), nn.GELU(approximate="tanh"),
                          nn.Linear(20, 3)).to(DEVICE)  # fmt: skip
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    patch_quietly(model)
    for step in range(3):
        x, target = rand(6, 12, seed=10 + step), rand(6, 3, seed=20 + step)
        for m, o in ((model, opt), (reference, ref_opt)):
            F.mse_loss(m(x), target).backward()
            o.step()
            o.zero_grad()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r, **TOL)


def test_swapped_norms_are_still_torchs_norms_to_isinstance():
    """Training code finds norms by class (weight-decay groups, wrapping policies): a swapped
    LayerNorm or RMSNorm is still an instance of torch's, so the groups built after the patch
    are the groups built before it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(12), nn.Linear(12, 12), nn.RMSNorm(12), nn.Linear(12, 3),
                          nn.Softmax(dim=-1)).to(DEVICE)  # fmt: skip

    def no_decay(m):
        return [id(p) for mod in m.modules() if isinstance(mod, (nn.LayerNorm, nn.RMSNorm))
                for p in mod.parameters()]  # fmt: skip

    before = no_decay(model)
    assert patch_quietly(model, layer_norm="always", linear="always") == counts(
        layer_norm=1, rms_norm=1, linear=2)
    assert type(model[0]) is tw.LayerNorm and type(model[2]) is tw.RMSNorm
    assert no_decay(model) == before and len(before) == 3
    assert isinstance(tw.Softmax(), nn.Softmax) and tw.Softmax().dim == -1
    # tw.Linear is not a torch Linear: with an activation it computes more than one.
    assert not isinstance(model[1], nn.Linear)
    # Patching again finds nothing more to swap: our norms are not taken for torch's.
    assert patch_quietly(model, layer_norm="always", linear="always") == counts()


def test_tied_and_shared_modules_stay_tied_and_shared():
    torch.manual_seed(0)
    shared = nn.Linear(6, 6)
    model = nn.ModuleDict({"a": shared, "b": nn.Sequential(shared, nn.ReLU()),
                           "emb": nn.Embedding(10, 6), "head": nn.Linear(6, 10, bias=False)})
    model["head"].weight = model["emb"].weight
    model.to(DEVICE)
    by_default = copy.deepcopy(model)
    result = patch_quietly(by_default)
    assert result["linear"] == 0  # eagerly, a Linear and its ReLU alone stay torch's
    assert sorted(left_by_rule(result)) == ["a", "head"]
    result = patch_quietly(by_default, linear="fused")
    assert result["linear"] == 1  # fused with the ReLU where it is shared; the head is plain
    assert left_by_rule(result) == ["head"] and type(by_default["a"]) is tw.Linear
    result = patch_quietly(model, linear="always")
    assert result["linear"] == 2  # the shared Linear is one module, swapped once
    assert model["a"] is model["b"][0] and type(model["a"]) is tw.Linear
    assert model["head"].weight is model["emb"].weight


def test_hooks_are_kept_and_a_hook_keeps_a_pair_unfused(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(DEVICE)
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    reference = copy.deepcopy(model)
    result = patch_quietly(model, linear="always")
    assert result["linear"] == 2 and not fused(result)  # the hook must see Linear's output
    x = rand(3, 8, seed=1)
    torch.testing.assert_close(model(x), reference(x), **TOL)
    assert len(seen) == 2  # reference's copy of the hook ran once, the patched module's once


# ---------------------------------------------------------------------------------------------
# Fusions inside a Sequential.
# ---------------------------------------------------------------------------------------------
def spy(monkeypatch, name):
    """Count the calls FusedSequential makes to the fused op ``name``."""
    calls = []
    original = getattr(patch_module, name)

    def wrapped(*args, **kwargs):
        calls.append(args[3] if len(args) > 3 else None)
        return original(*args, **kwargs)

    monkeypatch.setattr(patch_module, name, wrapped)
    return calls


def test_fusions_in_a_sequential(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(approximate="tanh"),  # Linear+GELU wins
        nn.Linear(32, 32), nn.LeakyReLU(0.2),
        nn.LayerNorm(32), nn.Linear(32, 8),  # LayerNorm+Linear
        nn.Linear(8, 8), nn.GELU(),  # exact GELU: not what the epilogue computes
    ).to(DEVICE)
    reference = copy.deepcopy(model)
    # By default (eagerly), a Linear followed by an activation alone stays on torch, and so does
    # a LayerNorm that runs on its own: only the LayerNorm + Linear pair is swapped.
    by_default = patch_quietly(copy.deepcopy(reference))
    assert by_default == counts(layer_norm=1, linear=1)
    assert fused(by_default) == {"layer_norm_linear": 1}
    left = {s.name: s.reason for s in by_default.skipped}
    assert set(left) == {"0", "1", "3", "7"}
    assert all("activation alone" in left[name] for name in ("1", "3"))
    # Every fusion, and every LayerNorm, when asked for.
    result = patch_quietly(model, linear="fused", layer_norm="always")
    assert result == counts(layer_norm=2, linear=3)  # the Linear before the exact GELU stays
    assert left_by_rule(result) == ["7"] and type(model[7]) is nn.Linear
    assert fused(result) == {"layer_norm_linear": 1, "linear_activation": 2}
    assert type(model) is FusedSequential
    fused_ln = spy(monkeypatch, "layer_norm_linear")
    fused_act = spy(monkeypatch, "linear_op")
    assert_same_function(model, reference, rand(4, 3, 16, seed=2))
    assert len(fused_ln) == 1 and len(fused_act) == 2
    # The modules stay correct on their own, outside the Sequential.
    x = rand(5, 16, seed=3)
    torch.testing.assert_close(model[0](x), reference[0](x), **TOL)
    torch.testing.assert_close(model[1](model[0](x)), reference[1](reference[0](x)), **TOL)


def test_no_fusion_where_adjacency_is_not_proven():
    class MySequential(nn.Sequential):  # its forward may do anything
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.ModuleList([
        MySequential(nn.LayerNorm(8), nn.Linear(8, 8)),
        nn.Sequential(nn.LayerNorm((2, 8)), nn.Linear(8, 8)),  # normalises two dims
        nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.ReLU()),  # Linear+ReLU instead
    ]).to(DEVICE)  # fmt: skip
    result = patch_quietly(model, linear="fused")
    assert fused(result) == {"linear_activation": 1}
    assert type(model[0]) is MySequential and type(model[1]) is nn.Sequential
    x = rand(3, 2, 8, seed=4)
    assert model[1](x).shape == (3, 2, 8)


# ---------------------------------------------------------------------------------------------
# What stays on torch, listed.
# ---------------------------------------------------------------------------------------------
class MyLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x) + 1


def test_unsupported_modules_stay_on_torch_and_are_listed():
    torch.manual_seed(0)
    model = nn.ModuleDict({
        "reflect": nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
        "fp64": nn.Linear(4, 4).double(),
        "subclass": MyLinear(4, 4),
        "kdim": nn.MultiheadAttention(8, 2, kdim=4, vdim=4),
        "bias_kv": nn.MultiheadAttention(8, 2, add_bias_kv=True),
        "wrapped": nn.LayerNorm(4),
        "ok": nn.Linear(4, 4),
    }).to(DEVICE)  # fmt: skip
    wrapped = model["wrapped"]
    wrapped.forward = lambda x, inner=wrapped.forward: inner(x) * 2  # as wrapper libraries do
    reference = copy.deepcopy(model)
    by_default = copy.deepcopy(model)
    with pytest.warns(PatchWarning, match="left 6 module") as record:
        result = tw.patch(model, linear="always")
    assert isinstance(result, dict) and isinstance(result, PatchCounts)
    assert result == {"layer_norm": 0, "rms_norm": 0, "linear": 1, "conv2d": 0, "attention": 0}
    assert not any(s.policy for s in result.skipped)
    reasons = {s.name: s.reason for s in result.skipped}
    assert set(reasons) == {"reflect", "fp64", "subclass", "kdim", "bias_kv", "wrapped"}
    assert "forward is replaced" in reasons["wrapped"]
    assert "padding_mode='reflect'" in reasons["reflect"]
    assert "float64" in reasons["fp64"]
    assert "subclass" in reasons["subclass"]
    assert "kdim" in reasons["kdim"] and "add_bias_kv" in reasons["bias_kv"]
    assert all(name in str(record[0].message) for name in reasons)
    for name in reasons:  # untouched: torch's class, torch's result
        assert type(model[name]) is type(reference[name])
    # By default the plain "ok" Linear is also left, by the rule: listed, not warned about.
    with pytest.warns(PatchWarning, match="left 6 module") as record:
        result = tw.patch(by_default)
    assert result["linear"] == 0 and left_by_rule(result) == ["ok"]
    assert "ok (linear)" not in str(record[0].message)
    x = rand(2, 3, 6, 6, seed=1)
    torch.testing.assert_close(model["reflect"](x), reference["reflect"](x))
    q, kv = rand(5, 2, 8, seed=2), rand(6, 2, 4, seed=3)
    torch.testing.assert_close(model["kdim"](q, kv, kv)[0], reference["kdim"](q, kv, kv)[0])


def test_attention_calls_the_kernel_cannot_take_run_on_torch():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, dropout=0.5, batch_first=True).to(DEVICE)
    holder = nn.ModuleDict({"attn": mha})
    reference = copy.deepcopy(holder)
    assert patch_quietly(holder)["attention"] == 1
    x = rand(2, 5, 16, seed=1)
    padding = torch.zeros(2, 5, dtype=torch.bool, device=x.device)
    padding[0, -2:] = True
    holder.eval(), reference.eval()
    with pytest.warns(PatchWarning, match="key_padding_mask"):
        out = holder["attn"](x, x, x, key_padding_mask=padding)[0]
    torch.testing.assert_close(out, reference["attn"](x, x, x, key_padding_mask=padding)[0], **TOL)
    with warnings.catch_warnings():  # said once per module and reason
        warnings.simplefilter("error", PatchWarning)
        holder["attn"](x, x, x, key_padding_mask=padding)
        # In eval, dropout does not apply: the fused path, no warning.
        torch.testing.assert_close(holder["attn"](x, x, x)[0], reference["attn"](x, x, x)[0], **TOL)
    holder.train()
    with pytest.warns(PatchWarning, match="dropout=0.5 while training with need_weights=True"):
        out, weights = holder["attn"](x, x, x)
    assert out.shape == x.shape and weights.shape == (2, 5, 5)
    float_padding = torch.zeros(2, 5, device=x.device).masked_fill(padding, float("-inf"))
    with pytest.warns(PatchWarning, match="a float key_padding_mask"):
        holder["attn"](x, x, x, key_padding_mask=float_padding, need_weights=False)


def test_attention_with_a_padding_mask_or_dropout_runs_in_the_kernel(monkeypatch):
    """A bool key_padding_mask, and dropout while training, with need_weights=False (what
    nn.TransformerEncoderLayer asks): the fused kernel, no warning; the mask as torch's."""
    import triton_workshop.nn.modules as modules

    calls = []
    real = modules.attention
    monkeypatch.setattr(modules, "attention", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    torch.manual_seed(0)
    holder = nn.ModuleDict({"attn": nn.MultiheadAttention(16, 4, dropout=0.5, batch_first=True)})
    holder = holder.to(DEVICE)
    reference = copy.deepcopy(holder)
    patch_quietly(holder)
    x = rand(2, 5, 16, seed=1)
    padding = torch.zeros(2, 5, dtype=torch.bool, device=x.device)
    padding[0, -2:] = True
    holder.eval(), reference.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        out = holder["attn"](x, x, x, key_padding_mask=padding, need_weights=False)[0]
        torch.testing.assert_close(
            out, reference["attn"](x, x, x, key_padding_mask=padding, need_weights=False)[0], **TOL)
        assert calls[-1]["dropout_p"] == 0.0 and calls[-1]["key_padding_mask"].tolist() == [
            [True, True, True, False, False], [True] * 5]
        holder.train()
        holder["attn"](x, x, x, need_weights=False)
        assert calls[-1]["dropout_p"] == 0.5


# ---------------------------------------------------------------------------------------------
# Refusals (before anything changes), and the models that work.
# ---------------------------------------------------------------------------------------------
def torch_types(model):
    return [type(m) for m in model.modules()]


def test_compiled_models_are_refused_untouched():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to(DEVICE)
    before = torch_types(model)
    with pytest.raises(ValueError, match="already compiled.*patch\\(model\\); model = torch.compile"):
        tw.patch(torch.compile(model))
    holder = nn.Sequential(nn.Linear(4, 4), torch.compile(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="submodule '1' is already compiled"):
        tw.patch(holder)
    assert type(holder[0]) is nn.Linear
    model.compile()
    with pytest.raises(ValueError, match="already compiled"):
        tw.patch(model)
    assert torch_types(model) == before


def test_bad_arguments():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        tw.patch(lambda x: x)
    for flag in ("layer_norm", "rms_norm", "linear", "conv2d", "attention"):
        with pytest.raises(TypeError, match=flag):
            tw.patch(nn.Linear(2, 2), **{flag: 1})
    with pytest.raises(ValueError, match="linear must be a bool or one of"):
        tw.patch(nn.Linear(2, 2), linear="sometimes")


def test_several_device_kinds_are_refused_untouched():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, device="meta"))
    with pytest.raises(ValueError, match="several kinds of device"):
        tw.patch(model)
    assert torch_types(model) == [nn.Sequential, nn.Linear, nn.Linear]


def test_a_model_where_kernels_cannot_run_is_refused(monkeypatch):
    monkeypatch.setattr(triton_workshop.runtime.mode, "INTERPRET", False)  # as on a GPU machine
    model = nn.Sequential(nn.Linear(4, 4))  # on the CPU
    with pytest.raises(ValueError, match="move it first"):
        tw.patch(model)
    assert type(model[0]) is nn.Linear


def test_meta_model_is_patched_and_materialises():
    torch.manual_seed(0)
    reference = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).to(DEVICE)
    with torch.device("meta"):
        model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    result = patch_quietly(model, linear="fused", layer_norm="always")
    assert result == counts(layer_norm=1, linear=1) and fused(result) == {"linear_activation": 1}
    assert left_by_rule(result) == ["3"]
    model.to_empty(device=DEVICE)
    model.load_state_dict(reference.state_dict())
    assert_same_function(model, reference, rand(3, 8, seed=1))


def test_the_model_itself_is_swapped_in_place():
    layer = nn.Linear(6, 3).to(DEVICE)
    reference = copy.deepcopy(layer)
    assert patch_quietly(layer, linear=False) == counts() and type(layer) is nn.Linear
    assert patch_quietly(layer) == counts() and type(layer) is nn.Linear  # nothing to fuse
    assert patch_quietly(layer, linear="always") == counts(linear=1)
    assert type(layer) is tw.Linear
    assert_same_function(layer, reference, rand(4, 6, seed=1))


def test_patch_twice_and_flags():
    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.Conv2d(1, 1, 1)).to(DEVICE)
    assert patch_quietly(model, linear=False, conv2d=False, layer_norm="always") == counts(
        layer_norm=1)
    assert type(model[1]) is nn.Linear and type(model[2]) is nn.Conv2d
    result = patch_quietly(model)  # the Conv2d stays on cuDNN by default
    assert result == counts(linear=1) and fused(result) == {"layer_norm_linear": 1}
    result = patch_quietly(model, conv2d="always")  # only the Conv2d is new
    assert result == counts(conv2d=1) and not fused(result)
    result = patch_quietly(model, conv2d="always")
    assert result == counts() and not fused(result)  # nothing new


def test_patched_model_deepcopies_and_compiles():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).to(DEVICE)
    reference = copy.deepcopy(model)
    patch_quietly(model, linear="fused", layer_norm="always")
    clone = copy.deepcopy(model)
    assert type(clone) is FusedSequential and type(clone[1]) is tw.Linear
    # aot_eager traces forward and backward as Inductor would, without a C++ toolchain.
    compiled = torch.compile(model, backend="aot_eager")
    assert_same_function(compiled._orig_mod, reference, rand(4, 8, seed=5),
                         call=lambda m, x: (compiled if m is model else m)(x))


def test_encoder_in_eval_calls_the_swapped_attention(monkeypatch):
    """torch's fused inference path of TransformerEncoderLayer reads in_proj_weight itself; the
    swapped attention must still be called (not bypassed silently), with the same result."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(DEVICE)
    reference = copy.deepcopy(model)
    handle = model.layers[0].self_attn.register_forward_hook(lambda *args: None)
    patch_quietly(model)
    calls = []
    original = PatchedMultiheadAttention.forward

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PatchedMultiheadAttention, "forward", counted)
    model.eval(), reference.eval()
    x = rand(2, 6, 16, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), **TOL)
    assert len(calls) == 2
    assert len(model.layers[0].self_attn._forward_hooks) == 1
    handle.remove()  # the user's handle still removes its hook after the swap
    assert not model.layers[0].self_attn._forward_hooks


# ---------------------------------------------------------------------------------------------
# torch.nn.RMSNorm, the linear= rule, padded batches in an encoder, the interpreter warning.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm(eps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.RMSNorm(24, eps=eps), nn.Linear(24, 8), nn.ReLU()).to(DEVICE)
    with torch.no_grad():
        model[0].weight.add_(rand(24, seed=2) * 0.3)
    reference = copy.deepcopy(model)
    assert patch_quietly(model, linear="fused") == counts(rms_norm=1, linear=1)
    assert type(model[0]) is tw.RMSNorm and model[0].eps == eps
    assert_same_function(model, reference, rand(3, 5, 24, seed=1))
    assert patch_quietly(nn.RMSNorm(4).to(DEVICE), rms_norm=False) == counts()


def test_linear_true_is_the_auto_rule_and_false_swaps_none():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).to(DEVICE)

    flags = (True, "auto", "fused", False)
    results = {flag: patch_quietly(m := build(), linear=flag) for flag in flags}
    # auto (the default), eagerly: the Linear and its ReLU alone stay torch's, listed.
    assert results[True] == results["auto"] == counts()
    assert left_by_rule(results[True]) == ["0", "2"]
    assert "activation alone" in results[True].skipped[0].reason
    # fused: the pair runs fused; so it does with auto for a model to compile.
    assert results["fused"] == counts(linear=1)
    assert left_by_rule(results["fused"]) == ["2"]
    assert patch_quietly(build(), compiled=True) == counts(linear=1)
    assert results[False] == counts() and not results[False].skipped  # not asked: not listed
    assert type(m[0]) is nn.Linear and type(m) is nn.Sequential


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_padded_batch_in_a_patched_encoder_in_eval_mode():
    """A default TransformerEncoder (nested-tensor fast path on) in eval under no_grad with a
    src_key_padding_mask packed the batch into a nested tensor, which the swapped attention
    refused ("nested tensors are not supported"); patch keeps that encoder off the nested path,
    and the padding mask goes to torch's attention."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2).to(DEVICE)  # enable_nested_tensor=True
    assert model.use_nested_tensor
    reference = copy.deepcopy(model)
    patch_quietly(model)
    assert not model.use_nested_tensor and reference.use_nested_tensor
    model.eval(), reference.eval()
    x = rand(2, 7, 16, seed=8)
    padding = torch.zeros(2, 7, dtype=torch.bool, device=DEVICE)
    padding[1, 5:] = True
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)  # the fallback to torch's attention, said
        out = model(x, src_key_padding_mask=padding)
        expected = reference(x, src_key_padding_mask=padding)
    # torch's nested path leaves padded rows as zeros; compare the tokens that exist
    keep = ~padding
    torch.testing.assert_close(out[keep], expected.to_padded_tensor(0.0)[keep] if expected.is_nested
                               else expected[keep], **TOL)  # fmt: skip
    with torch.no_grad():  # and without a mask, the kernels
        torch.testing.assert_close(model(x), reference(x), **TOL)


def test_interpreter_warning_is_said_once(monkeypatch):
    monkeypatch.setattr(triton_workshop.runtime.mode, "INTERPRET", True)
    monkeypatch.setattr(patch_module, "_interpreter_warning_given", False)
    model = nn.Sequential(nn.LayerNorm(4)).to(DEVICE)
    with pytest.warns(InterpreterWarning, match="interpreter.*50-90x slower"):
        tw.patch(model, layer_norm="always")
    with warnings.catch_warnings():
        warnings.simplefilter("error", InterpreterWarning)
        tw.patch(nn.Sequential(nn.LayerNorm(4)).to(DEVICE), layer_norm="always")  # once a process
    monkeypatch.setattr(patch_module, "_interpreter_warning_given", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InterpreterWarning)
        tw.patch(nn.Sequential(nn.Linear(4, 4)).to(DEVICE))  # nothing swapped: nothing to say
    monkeypatch.setattr(triton_workshop.runtime.mode, "INTERPRET", False)
    monkeypatch.setattr(patch_module, "_interpreter_warning_given", False)
    if DEVICE.type == "cuda":
        with warnings.catch_warnings():
            warnings.simplefilter("error", InterpreterWarning)
            tw.patch(nn.Sequential(nn.LayerNorm(4)).to(DEVICE), layer_norm="always")
