"""linear's dropout epilogue (``linear(..., dropout_p=p)``) and its fusion inside a patched
``nn.Sequential`` (Linear → [activation] → Dropout).

The mask is not a torch one (Philox inside the kernel), so references take it from
``ops.matmul.dropout_keep_mask``, which redraws it for the seed the call drew; everything else of
a reference is float64 on the same rounded inputs: ``act(x @ w.T + b) * keep / (1 - p)``, and
its gradients by autograd through that expression.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import warnings

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

import triton_workshop as tw  # first: it decides the interpreter mode the kernel below needs
from triton_workshop import runtime
from triton_workshop.nn.patch import FusedSequential, InterpreterWarning, PatchWarning
from triton_workshop.ops import matmul as matmul_module
from triton_workshop.ops.matmul import linear

from test_matmul import ref_epilogue as act  # the epilogue in torch: act(z, activation, slope)

DEVICE = runtime.DEVICE
# Relative error bounds (Frobenius norm of the error over that of the reference, and max error
# over max |reference|), as tests/test_matmul.py: fp32 exact accumulation, fp16/bf16 one rounding
# of the output (gradients: a rounding of the output gradient and of the product more).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


pytestmark = pytest.mark.usefixtures("ieee_fp32")  # conftest.py: fp32 compared exactly


@pytest.fixture
def seeds(monkeypatch):
    """The Philox seeds linear draws, in order (the draw itself unchanged)."""
    drawn = []
    draw = matmul_module.dropout_seed

    def recorded(device):
        seed = draw(device)
        drawn.append(seed)
        return seed

    monkeypatch.setattr(matmul_module, "dropout_seed", recorded)
    return drawn


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)


def reference(x, w, b, activation, keep, p, slope=0.01):
    """float64 ``act(x @ w.T + b) * keep / (1 - p)`` (differentiable in x, w, b)."""
    z = x.double() @ w.double().t()
    if b is not None:
        z = z + b.double()
    return act(z, activation, slope) * keep.double() / (1 - p)


def assert_close(out, ref, tol):
    assert out.shape == ref.shape
    if out.numel() == 0:
        return
    assert torch.isfinite(out).all()
    err = out.double() - ref
    assert (err.norm() / ref.norm().clamp_min(1e-30)).item() <= tol
    assert (err.abs().max() / ref.abs().max().clamp_min(1e-30)).item() <= 4 * tol


def check_against_reference(x, w, b, activation, p, seeds, dtype, slope=0.01):
    """linear's values and gradients (x, w, b) against the masked float64 reference."""
    leaves = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    out = linear(*leaves[:2], leaves[2] if b is not None else None, activation,
                 leaky_relu_slope=slope, dropout_p=p)
    assert out.dtype == dtype and out.shape == (*x.shape[:-1], w.shape[0])
    keep = matmul_module.dropout_keep_mask(seeds[-1], out.shape, p)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = reference(ref_leaves[0], ref_leaves[1], ref_leaves[2] if b is not None else None,
                    activation, keep, p, slope)
    assert_close(out, ref.detach(), TOL[dtype])
    assert (out[~keep] == 0).all()
    grad_out = rand(*out.shape, dtype=dtype, seed=99)
    out.backward(grad_out)
    ref.backward(grad_out.double())
    for leaf, ref_leaf in zip(leaves, ref_leaves):
        assert leaf.grad.dtype == leaf.dtype
        assert_close(leaf.grad, ref_leaf.grad, GRAD_TOL[dtype])
    return out, keep


# ---------------------------------------------------------------------------------------------
# Values and gradients.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "leaky_relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_values_and_gradients_match_the_masked_reference(activation, dtype, seeds,
                                                         poisoned_new_empty):
    # Ragged against every tile (M = 37, K = 19, N = 45); several tiles: see further below.
    x, w, b = rand(37, 19, dtype=dtype, seed=1), rand(45, 19, dtype=dtype, seed=2), rand(45, seed=3)
    check_against_reference(x, w, b.to(dtype), activation, 0.3, seeds, dtype,
                            slope=-0.2 if activation == "leaky_relu" else 0.01)
    assert len(seeds) == 1


def test_bf16_values_and_gradients(seeds):
    # bf16 dots run on fp32-widened operands in the interpreter (tests/test_matmul.py); the
    # epilogue's dropout is the same in every dtype.
    dtype = torch.bfloat16
    x, w, b = rand(9, 24, dtype=dtype, seed=4), rand(20, 24, dtype=dtype, seed=5), rand(20, seed=6)
    check_against_reference(x, w, b, "relu", 0.25, seeds, dtype)


@pytest.mark.parametrize("shape", [(2, 3, 17), (2, 2, 3, 17), (17,)], ids=str)
def test_batch_dims_and_vectors(shape, seeds):
    # Leading dims flattened into M (and a vector as one row): the mask is numbered over the
    # output as it is returned.
    x, w, b = rand(*shape, seed=7), rand(10, 17, seed=8), rand(10, seed=9)
    check_against_reference(x, w, b, "gelu", 0.4, seeds, torch.float32)


@pytest.mark.parametrize("shape", [(13, 32), (2, 5, 32)], ids=str)
def test_repeated_calls_take_the_kept_launch_with_a_fresh_mask(shape, seeds, monkeypatch):
    # From the second call of a signature on, the eager path launches the kept plan with the
    # call's own seed, forward and backward (the mask redrawn from it, not by the op's
    # backward): each call matches its masked reference on fresh data, and each draws a mask of
    # its own. Rows of 16-byte multiples: on a GPU, others are copied aligned at every call
    # (launch_matmul's general path, which keeps no plan).
    op_backwards = []
    op = matmul_module.matmul_dropout_backward
    monkeypatch.setattr(matmul_module, "matmul_dropout_backward",
                        lambda *args: op_backwards.append(1) or op(*args))
    keeps = []
    for step in range(3):
        x, w, b = rand(*shape, seed=30 + step), rand(16, 32, seed=40 + step), rand(16, seed=50)
        keeps.append(check_against_reference(x, w, b, "gelu", 0.3, seeds, torch.float32)[1])
    assert len(op_backwards) == 1  # the first call's (the general path): none since
    assert len(seeds) == 3 and not torch.equal(keeps[1], keeps[2])


def test_strided_inputs_and_the_batched_path(seeds):
    # x.transpose(0, 1) cannot be flattened without a copy: a batched product (B, M, N) against
    # the shared weight, whose output batch the mask numbers first. w.t().t() non-contiguous.
    x = rand(5, 4, 33, seed=10).transpose(0, 1)
    w = rand(33, 12, seed=11).t()
    assert not x.is_contiguous() and not w.is_contiguous()
    check_against_reference(x, w, None, "relu", 0.5, seeds, torch.float32)


def test_several_tiles_in_both_dims(seeds):
    # 130 x 140: past the interpreter's 128-wide tile in M and N, so the flat numbering must hold
    # across tile boundaries.
    x, w = rand(130, 8, seed=12), rand(140, 8, seed=13)
    check_against_reference(x, w, None, None, 0.2, seeds, torch.float32)


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_empty_inner_dim_and_empty_outputs(activation, seeds):
    # K = 0: the output is dropout(act(bias)), computed without the product kernel.
    x, w, b = rand(6, 0), rand(10, 0), rand(10, seed=14)
    check_against_reference(x, w, b, activation, 0.5, seeds, torch.float32)
    empty = linear(rand(0, 5), rand(10, 5), dropout_p=0.5)
    assert empty.shape == (0, 10)


def test_persistent_tma_kernel_epilogue(monkeypatch, seeds):
    # Hopper's TMA kernel, forced on in the interpreter with small tiles (each program walks
    # several tiles): the same flat numbering as matmul_kernel's.
    tuning = dataclasses.replace(matmul_module.TUNING, tma_matmul=True, tma_block_m=32,
                                 tma_block_n=32, tma_block_k=16)
    monkeypatch.setattr(matmul_module, "TUNING", tuning)
    launched = []
    launch = matmul_module._launch_matmul_tma
    monkeypatch.setattr(matmul_module, "_launch_matmul_tma",
                        lambda *a, **kw: launched.append(kw["dropout_p"]) or launch(*a, **kw))
    x, w, b = (rand(70, 48, dtype=torch.float16, seed=15), rand(40, 48, dtype=torch.float16, seed=16),
               rand(40, dtype=torch.float16, seed=17))  # fmt: skip
    check_against_reference(x, w, b, "gelu", 0.3, seeds, torch.float16)
    assert launched[0] == 0.3


# ---------------------------------------------------------------------------------------------
# The random numbers.
# ---------------------------------------------------------------------------------------------
def test_manual_seed_repeats_a_run_and_each_call_draws_anew():
    x, w = rand(16, 8, seed=18), rand(24, 8, seed=19)
    torch.manual_seed(123)
    first, second = linear(x, w, dropout_p=0.5), linear(x, w, dropout_p=0.5)
    torch.manual_seed(123)
    again = linear(x, w, dropout_p=0.5)
    assert torch.equal(first, again)
    assert not torch.equal(first == 0, second == 0)


@triton.jit
def _philox4x_kernel(seed_ptr, out_ptr, n_counters):
    """Philox's four uniform numbers for counters 0 .. n_counters - 1, as (n_counters, 4)."""
    counters = tl.arange(0, 256)
    u0, u1, u2, u3 = tl.rand4x(tl.load(seed_ptr), counters)
    inside = counters < n_counters
    tl.store(out_ptr + counters * 4, u0, mask=inside)
    tl.store(out_ptr + counters * 4 + 1, u1, mask=inside)
    tl.store(out_ptr + counters * 4 + 2, u2, mask=inside)
    tl.store(out_ptr + counters * 4 + 3, u3, mask=inside)


def test_mask_numbering_is_philox_four_columns_a_call(seeds):
    # The documented numbering (kernels.dropout_factor), drawn independently: columns 4g .. 4g+3
    # of row r take the four numbers of counter r * cdiv(N, 4) + g. N = 10 is not a multiple of
    # 4: each row ends in a partial group.
    x, w = rand(7, 5, seed=45).abs() + 0.1, rand(10, 5, seed=46).abs() + 0.1  # outputs > 0
    out = linear(x, w, dropout_p=0.5)
    uniform = torch.empty(7 * 3, 4, device=DEVICE)
    _philox4x_kernel[(1,)](seeds[0], uniform, uniform.shape[0])
    expected = uniform.reshape(7, 12)[:, :10] >= 0.5
    assert torch.equal(out != 0, expected)
    assert 0 < expected.sum() < expected.numel()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_and_scale(p, seeds):
    x, w = rand(64, 4, seed=20).abs() + 0.1, rand(128, 4, seed=21).abs() + 0.1  # all outputs > 0
    out = linear(x, w, dropout_p=p)
    kept = out != 0
    # 8192 Bernoulli draws: the standard deviation of the fraction is at most 0.0056.
    assert abs(kept.double().mean().item() - (1 - p)) < 0.03
    assert torch.equal(kept, matmul_module.dropout_keep_mask(seeds[-1], out.shape, p))
    torch.testing.assert_close(out[kept], (x @ w.t())[kept] / (1 - p), rtol=1e-5, atol=0)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_p_zero_is_the_plain_kernel(activation, seeds, planned_launches):
    # K = 32: rows of 128 bytes, launched as they lie on a GPU too (an unaligned operand would
    # be copied first, the general path, which has no cached plan to look at).
    x, w, b = rand(19, 32, seed=22), rand(31, 32, seed=23), rand(31, seed=24)
    state = torch.get_rng_state()
    plain = linear(x, w, b, activation)
    assert torch.equal(linear(x, w, b, activation, dropout_p=0.0), plain)
    assert torch.equal(linear(x, w, b, activation, dropout_p=0), plain)
    assert not seeds and torch.equal(torch.get_rng_state(), state)  # no seed drawn
    # The same layout with dropout on takes its own plan, and the plain one is left as it was.
    dropped = linear(x, w, b, activation, dropout_p=0.5)
    assert (dropped == 0).any() and torch.equal(linear(x, w, b, activation), plain)
    assert len(seeds) == 1
    # The kernel compiles without dropout (a constexpr) where p is 0.
    product_plan = runtime.launch_directly(matmul_module._product_plan)
    epilogue = (plain, b, activation or "none", 0.01)
    assert product_plan(x, w.t(), *epilogue).consts["DROPOUT"] is False
    assert product_plan(x, w.t(), *epilogue, 0.5).consts["DROPOUT"] is True


def test_double_backward_through_the_mask(seeds):
    # The backward's own masking op is differentiable (it is linear in the gradient).
    x, w = rand(6, 5, seed=25).double(), rand(7, 5, seed=26)
    x32 = x.float().requires_grad_()
    out = linear(x32, w, None, "gelu", dropout_p=0.5)
    (g,) = torch.autograd.grad(out.sum(), x32, create_graph=True)
    (gg,) = torch.autograd.grad((g * g).sum(), x32)
    keep = matmul_module.dropout_keep_mask(seeds[-1], out.shape, 0.5)
    x64 = x.requires_grad_()
    ref = reference(x64, w, None, "gelu", keep, 0.5)
    (rg,) = torch.autograd.grad(ref.sum(), x64, create_graph=True)
    (rgg,) = torch.autograd.grad((rg * rg).sum(), x64)
    assert_close(g, rg.detach(), 1e-5)
    assert_close(gg, rgg, 1e-4)


# ---------------------------------------------------------------------------------------------
# Arguments.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "p, error",
    [(True, TypeError), ("0.1", TypeError), (None, TypeError), (torch.tensor(0.1), TypeError),
     (1.0, ValueError), (1, ValueError), (-0.1, ValueError), (float("nan"), ValueError)],
    ids=["bool", "str", "None", "tensor", "one", "int-one", "negative", "nan"],
)
def test_bad_dropout_p_raises_before_any_launch(p, error, planned_launches, seeds):
    x, w = rand(4, 8, seed=27), rand(6, 8, seed=28)
    for _ in range(2):  # the second call would find a remembered signature if one were kept
        with pytest.raises(error, match="dropout_p"):
            linear(x, w, dropout_p=p)
    assert not planned_launches and not seeds


def test_the_registered_op_refuses_dropout_without_a_seed():
    a, b = rand(4, 8, seed=29), rand(8, 6, seed=30)
    with pytest.raises(ValueError, match="seed"):
        matmul_module._matmul(a, b, None, "none", 0.0, 0.5, None)


# ---------------------------------------------------------------------------------------------
# torch.compile and autocast.
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # compiling the graph takes most of its 15 s in the interpreter
def test_torch_compile_fullgraph():
    # The seed is drawn inside the graph (Inductor's own generator): the output tells the mask
    # (GELU of these inputs is never exactly 0: the products stay within a few units, where the
    # GPU's tanh-form GELU, which is exactly 0 below about -5.8, still is not), and the
    # gradients must use that same mask.
    torch._dynamo.reset()

    def fn(x, w, b):
        return linear(x, w, b, "gelu", dropout_p=0.25)

    compiled = torch.compile(fn, fullgraph=True)
    x, w, b = rand(20, 30, seed=31) * 0.3, rand(12, 30, seed=32) * 0.3, rand(12, seed=33)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    out = compiled(*leaves)
    keep = out != 0
    assert 0.6 < keep.double().mean().item() < 0.9
    ref_leaves = [t.double().requires_grad_() for t in (x, w, b)]
    ref = reference(*ref_leaves, "gelu", keep, 0.25)
    assert_close(out.detach(), ref.detach(), TOL[torch.float32])
    grad_out = rand(*out.shape, seed=34)
    out.backward(grad_out)
    ref.backward(grad_out.double())
    for leaf, ref_leaf in zip(leaves, ref_leaves):
        assert_close(leaf.grad, ref_leaf.grad, GRAD_TOL[torch.float32])


def test_autocast(seeds):
    x, w, b = rand(8, 16, seed=35), rand(12, 16, seed=36), rand(12, seed=37)
    with torch.autocast(DEVICE.type if isinstance(DEVICE, torch.device) else DEVICE,
                        dtype=torch.bfloat16):
        out = linear(x, w, b, "relu", dropout_p=0.3)
    assert out.dtype == torch.bfloat16
    keep = matmul_module.dropout_keep_mask(seeds[-1], out.shape, 0.3)
    ref = reference(x.bfloat16(), w.bfloat16(), b.bfloat16(), "relu", keep, 0.3)
    assert_close(out, ref, TOL[torch.bfloat16])


# ---------------------------------------------------------------------------------------------
# nn.patch: Linear → [activation] → Dropout inside a Sequential.
# ---------------------------------------------------------------------------------------------
def patch_quietly(model, **flags):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        warnings.simplefilter("ignore", InterpreterWarning)
        return tw.nn.patch(model, **flags)


def fused(result) -> dict:
    return {key: n for key, n in result.fused.items() if n}


@pytest.fixture
def linear_calls(monkeypatch):
    """The dropout_p of every linear call the patched Sequentials make."""
    patch_module = importlib.import_module("triton_workshop.nn.patch")  # not the function
    calls = []

    def recorded(*args, **kwargs):
        calls.append(kwargs.get("dropout_p", 0.0))
        return linear(*args, **kwargs)

    monkeypatch.setattr(patch_module, "linear_op", recorded)
    return calls


def gpt2_mlp():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.LayerNorm(16), nn.Linear(16, 64), nn.GELU(approximate="tanh"), nn.Dropout(0.1),
        nn.Linear(64, 16), nn.Dropout(0.1),
    ).to(DEVICE)


def test_sequential_fuses_the_dropout_in_training(linear_calls, seeds):
    model = gpt2_mlp()
    reference_model = copy.deepcopy(model)
    result = patch_quietly(model)
    assert type(model) is FusedSequential
    assert fused(result) == {"linear_dropout": 2}
    assert result["linear"] == 2  # the LayerNorm runs on its own: torch's (layer_norm="fused")
    assert result["layer_norm"] == 0
    x = rand(3, 5, 16, seed=38)
    out = model(x)
    assert linear_calls == [0.1, 0.1] and len(seeds) == 2
    # The same computation by hand, with the masks the two calls drew.
    h = reference_model[0](x)
    keep1 = matmul_module.dropout_keep_mask(seeds[0], (3, 5, 64), 0.1)
    h = F.gelu(reference_model[1](h), approximate="tanh") * keep1 / 0.9
    keep2 = matmul_module.dropout_keep_mask(seeds[1], (3, 5, 16), 0.1)
    torch.testing.assert_close(out, reference_model[4](h) * keep2 / 0.9, rtol=1e-4, atol=1e-5)


def test_sequential_in_eval_mode_is_linear_and_activation(linear_calls, seeds):
    model = gpt2_mlp()
    reference_model = copy.deepcopy(model).eval()
    patch_quietly(model)
    model.eval()
    x = rand(4, 16, seed=39)
    torch.testing.assert_close(model(x), reference_model(x), rtol=1e-4, atol=1e-5)
    # Linear+GELU fused without dropout; the last Linear runs as its module (nothing to fuse).
    assert linear_calls == [0.0] and not seeds


def test_only_a_training_dropout_joins(linear_calls, seeds):
    # The Dropout's own mode decides (model.train() / .eval() set it with the rest).
    model = gpt2_mlp()
    patch_quietly(model)
    model[3].eval()
    model(rand(2, 16, seed=40))
    assert linear_calls == [0.0, 0.1]


def test_dropout_chains_that_do_not_fuse(linear_calls):
    model = nn.ModuleList([
        nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.0)),  # p = 0: nothing to fuse
        nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.5)),  # exact GELU: no epilogue
        nn.Sequential(nn.Linear(8, 8), nn.AlphaDropout(0.5)),  # another dropout
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Dropout(0.5)),  # fused
        nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)),  # fused, no activation
    ]).to(DEVICE)  # fmt: skip
    result = patch_quietly(model)
    assert fused(result) == {"linear_dropout": 2}
    assert [type(m) for m in model] == [nn.Sequential] * 3 + [FusedSequential] * 2
    torch.manual_seed(1)
    x = rand(3, 8, seed=41)
    assert model[3](x).shape == model[4](x).shape == (3, 8)
    assert linear_calls == [0.5, 0.5]


def test_a_hook_on_the_dropout_keeps_it_separate(linear_calls):
    model = gpt2_mlp()
    patch_quietly(model)
    seen = []
    model[5].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    model(rand(2, 16, seed=42))
    assert seen == [(2, 16)]
    # The first chain is fused; the second Linear runs as its module (its dropout has a hook).
    assert linear_calls == [0.1]


# ---------------------------------------------------------------------------------------------
# GPT-2 (transformers): the residual dropouts after c_proj.
# ---------------------------------------------------------------------------------------------
def gpt2(resid_pdrop):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=4,
                                     attn_pdrop=0.0, resid_pdrop=resid_pdrop, embd_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to(DEVICE)


def patch_gpt2(model):
    hf = pytest.importorskip("triton_workshop.integrations.transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        warnings.simplefilter("ignore", InterpreterWarning)
        return hf, hf.patch_model(model)


@pytest.mark.slow  # importing transformers takes most of its 9 s
def test_gpt2_residual_dropouts_run_in_c_proj(seeds):
    model = gpt2(0.1)
    reference = copy.deepcopy(model)
    hf, counts = patch_gpt2(model)
    assert counts["conv1d"] == 3  # c_fc (GELU) and c_proj (dropout) of the MLP, attention c_proj
    assert fused(counts) == {"linear_activation": 1, "linear_dropout": 2}
    block = model.transformer.h[0]
    assert type(block.mlp.dropout) is nn.Identity and type(block.attn.resid_dropout) is nn.Identity
    assert block.mlp.c_proj.dropout_p == block.attn.c_proj.dropout_p == 0.1
    assert list(model.state_dict()) == list(reference.state_dict())
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(47)).to(DEVICE)
    # Eval: no dropout anywhere, the model's own result.
    model.eval(), reference.eval()
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)
    assert not seeds
    # Training: the MLP is dropout(c_proj(gelu(c_fc(h)))) with the mask its c_proj call drew,
    # forward and backward.
    model.train()
    h = rand(2, 8, 32, seed=48).requires_grad_()
    ref_h = h.detach().clone().requires_grad_()
    out = block.mlp(h)
    ref_mlp = reference.transformer.h[0].mlp
    keep = matmul_module.dropout_keep_mask(seeds[-1], out.shape, 0.1)
    expected = ref_mlp.c_proj(ref_mlp.act(ref_mlp.c_fc(ref_h))) * keep / 0.9
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    grad_out = rand(*out.shape, seed=49)
    out.backward(grad_out)
    expected.backward(grad_out)
    torch.testing.assert_close(h.grad, ref_h.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(block.mlp.c_proj.weight.grad, ref_mlp.c_proj.weight.grad,
                               rtol=1e-4, atol=1e-5)


def test_gpt2_without_residual_dropout_keeps_c_proj_on_torch():
    model = gpt2(0.0)
    hf, counts = patch_gpt2(model)
    assert fused(counts) == {"linear_activation": 1}
    assert type(model.transformer.h[0].mlp.c_proj) is not hf.Conv1D  # nothing to fuse: cuBLAS
