"""``workshop bench models`` without a GPU: the models' sizes, the measuring loop (with a fake
timer), the comparison with torch eager, the table, CSV and plot, whole runs at tiny sizes on the
CPU (patched losses against torch's), the per-case process with its timeout and error report, and
the refusal without a GPU (exit code 2).
"""

from __future__ import annotations

import csv
import io
import math
import time

import pytest
import torch
from rich.console import Console

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from triton_workshop.bench import models as bm
from triton_workshop.ops.matmul import tf32_enabled
from triton_workshop.runtime import DEVICE


@pytest.fixture(autouse=True)
def ieee_fp32():
    before = tf32_enabled()
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


class FakeTimer:
    """A clock that moves only when told, and step times read from a list."""

    def __init__(self, step_ms):
        self.clock = 100.0
        self.step_ms = list(step_ms)
        self.syncs = self.resets = 0

    def now(self):
        return self.clock

    def sync(self):
        self.syncs += 1

    def time_ms(self, fn):
        fn()
        return self.step_ms.pop(0)

    def reset_peak(self):
        self.resets += 1

    def peak_bytes(self):
        return 12345


def test_model_sizes_are_the_real_ones():
    with torch.device("meta"):
        gpt = bm.GPT(bm.GPTConfig())
        resnet = bm.resnet18()
    gpt_params = sum(p.numel() for p in gpt.parameters())  # the tied head counts once
    assert 124.0e6 < gpt_params < 124.6e6, gpt_params  # GPT-2 small, vocabulary padded to 50304
    assert gpt.lm_head.weight is gpt.wte.weight
    assert 11.6e6 < sum(p.numel() for p in resnet.parameters()) < 11.8e6  # ResNet-18
    for w in bm.WORKLOADS.values():
        assert set(w.sizes) == set(bm.SIZE_NAMES), w.name
    assert bm.WORKLOADS["gpt2_train"].sizes["full"]["batch"] == 8
    assert bm.WORKLOADS["gpt2_train"].sizes["full"]["seq"] == 1024
    assert bm.WORKLOADS["resnet18_train"].sizes["full"] == {"batch": 64, "image": 224, "width": 64,
                                                            "classes": 1000}  # fmt: skip
    assert bm.WORKLOADS["encoder_train"].sizes["full"]["layers"] == 4


def test_measure_with_a_fake_timer():
    timer = FakeTimer(step_ms=[5.0, 9.0, 4.0, 6.0, 100.0])
    seen, losses = [], iter([3.0, 2.5, 2.0] + [1.0] * 20)

    def step(batch):
        if not seen:
            timer.clock += 7.5  # the first step compiles and tunes
        seen.append(batch)
        return torch.tensor(next(losses))

    steps = bm.Steps(loss=3, warmup=2, timed=5)
    m = bm.measure(step, ["a", "b", "c", "d"], steps, timer)
    assert m.first_step_s == 7.5
    assert m.losses == [3.0, 2.5, 2.0]
    assert m.step_ms == [5.0, 9.0, 4.0, 6.0, 100.0]
    assert m.ms_per_step == 6.0  # the median: one slow step does not move it
    assert m.peak_bytes == 12345 and timer.resets == 1 and timer.syncs >= 1
    assert seen == ["a", "b", "c", "d", "a", "b", "c", "d", "a", "b"]  # loss, warm-up, timed

    with pytest.raises(ValueError, match="steps needs"):
        bm.measure(step, ["a"], bm.Steps(loss=0, warmup=0, timed=1), timer)
    with pytest.raises(ValueError, match="batches"):
        bm.measure(step, [], steps, timer)


def row(candidate, status="ok", ms=None, losses=(), model="gpt2_train", note=""):
    r = bm.ModelResult(model, "GPT-2", candidate, status, ms_per_step=ms, note=note)
    r.losses = list(losses)
    if status == "ok":
        r.first_step_s, r.peak_gib, r.final_loss = 1.5, 2.0, r.losses[-1]
    return r


def sample_rows():
    rows = [
        row(bm.TORCH_EAGER, ms=10.0, losses=[4.0, 3.0]),
        row(bm.TORCH_COMPILE, ms=5.0, losses=[4.0, 3.1]),
        row(bm.OURS, ms=4.0, losses=[4.0, 3.5]),
        row(bm.OURS_COMPILED, status="timeout", note="not finished within 600 s (killed)"),
        row(bm.LIGER, status="n/a", note="No module named 'liger_kernel' [/not markup]"),
        row(bm.TORCH_EAGER, ms=20.0, losses=[1.0], model="resnet18_train"),
        row(bm.OURS, ms=25.0, losses=[float("nan")], model="resnet18_train"),
    ]
    bm.compare(rows)
    return rows


def test_compare_fills_speedups_and_loss_differences():
    eager, compiled, ours, timed_out, liger, r_eager, r_ours = sample_rows()
    assert eager.vs_eager == 1.0 and eager.loss_diff == 0.0
    assert compiled.vs_eager == 2.0 and compiled.vs_compile == 1.0
    assert ours.vs_eager == 2.5 and ours.vs_compile == 1.25
    assert ours.loss_diff == pytest.approx(0.5)
    assert timed_out.vs_eager is None and timed_out.loss_diff is None
    assert r_ours.vs_eager == 0.8 and r_ours.vs_compile is None  # no torch.compile row there
    assert r_ours.loss_diff == math.inf  # a NaN loss is the worst difference, not a small one
    assert bm.verdicts(sample_rows())[0] == (
        "gpt2_train: triton-workshop at its best (triton-workshop) runs 1.25× torch.compile's speed"
    )


def test_table_csv_and_plot(tmp_path):
    rows = sample_rows()
    console = Console(file=io.StringIO(), width=220)
    console.print(bm.table(rows))
    text = console.file.getvalue()
    for expected in ("gpt2_train", "resnet18_train", "2.50×", "1.25×", "timeout", "n/a",
                     "not finished within 600 s", "[/not markup]", "0.5", "1.5 s"):
        assert expected in text, expected

    path = bm.write_csv(tmp_path / "models.csv", rows)
    with open(path) as f:
        records = list(csv.DictReader(f))
    assert list(records[0]) == list(bm.CSV_COLUMNS) and "losses" not in records[0]
    assert len(records) == len(rows)
    assert records[2]["candidate"] == bm.OURS and float(records[2]["vs_compile"]) == 1.25
    assert records[3]["status"] == "timeout" and records[3]["ms_per_step"] == ""

    png = bm.write_plot(tmp_path / "models.png", rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_refuses_without_a_gpu(capsys, tmp_path):
    if not triton_workshop.INTERPRET and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bm.run_models(quick=True, out=tmp_path)
    assert bm.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert bm.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in bm.WORKLOADS) and bm.LIGER in listed
    assert bm.main(["--no-such-flag"]) == 2


def test_bad_selections(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        bm.run_models(quick=True, out=tmp_path, device="cpu", models=["gpt5"])
    with pytest.raises(ValueError, match="unknown candidate"):
        bm.run_models(quick=True, out=tmp_path, device="cpu", candidates=["tensorflow"])
    with pytest.raises(ValueError, match="size"):
        bm.run_models(quick=True, out=tmp_path, device="cpu", size="huge")


def test_tiny_run(tmp_path):
    """Whole runs at tiny sizes, fp32, in this process (on the CPU in interpreter mode)."""
    console = Console(file=io.StringIO(), width=220)
    rows = bm.run_models(
        quick=True, out=tmp_path, console=console, device=str(DEVICE), size="tiny", amp=False,
        isolate=False, models=["gpt2_train", "gpt2_prefill", "encoder_train"],
        candidates=[bm.LIGER, bm.OURS, bm.TORCH_EAGER],
    )  # fmt: skip
    assert [(r.model, r.candidate) for r in rows] == [
        (m, c) for m in ("gpt2_train", "gpt2_prefill", "encoder_train")
        for c in (bm.TORCH_EAGER, bm.OURS, bm.LIGER)  # torch eager first: the reference
    ]  # fmt: skip
    for r in rows:
        if r.candidate == bm.LIGER:
            assert r.status in ("n/a", "ok", "failed")
            continue
        assert r.status == "ok", (r.model, r.candidate, r.note)
        assert len(r.losses) == bm.STEPS["tiny"].loss and all(map(math.isfinite, r.losses))
        assert r.ms_per_step > 0 and r.first_step_s > 0 and r.vs_eager > 0
        # fp32 from the same weights and batches, two optimiser steps: rounding only.
        assert r.loss_diff < 1e-4, (r.model, r.candidate, r.losses)
    for name in ("models.csv", "models.png", "models.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert "Whole models" in console.file.getvalue()


# ---------------------------------------------------------------------------------------------
# A case in its own process: the result crosses back; a crash or a hang is reported.
# ---------------------------------------------------------------------------------------------
def _sleepy_model(size):
    time.sleep(600)


def _broken_model(size):
    raise ZeroDivisionError("boom")


def _workload(model):
    base = bm.WORKLOADS["gpt2_train"]
    return bm.Workload("test", "test", model, base.batches, base.loss, base.sizes)


def tiny_case(workload):
    return bm.Case(workload, bm.TORCH_EAGER, size="tiny", device="cpu", amp=False)


def test_isolated_case_reports_its_result():
    status, payload = bm.run_isolated(tiny_case(bm.WORKLOADS["gpt2_train"]), timeout_s=300)
    assert status == "ok", payload
    assert len(payload["losses"]) == bm.STEPS["tiny"].loss and payload["ms_per_step"] > 0


def test_isolated_case_failure_and_timeout_are_reported():
    status, note = bm.run_isolated(tiny_case(_workload(_broken_model)), timeout_s=300)
    assert status == "failed" and "ZeroDivisionError: boom" in note and "test_bench_models.py" in note
    started = time.perf_counter()
    status, note = bm.run_isolated(tiny_case(_workload(_sleepy_model)), timeout_s=8)
    assert status == "timeout" and "killed" in note
    assert time.perf_counter() - started < 60


# ---------------------------------------------------------------------------------------------
# The LLaMA workloads, and `models` among the suite's names.
# ---------------------------------------------------------------------------------------------
def test_llama_workloads_have_the_stated_shapes():
    big, small = bm.WORKLOADS["llama_train"], bm.WORKLOADS["llama_train_small"]
    assert big.sizes["full"]["config"] == {
        "num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 2048}  # fmt: skip
    assert (big.sizes["full"]["batch"], big.sizes["full"]["seq"]) == (4, 2048)
    config = small.sizes["full"]["config"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (8, 1024, 32000)
    assert config["num_attention_heads"] == 16 and config["num_key_value_heads"] == 4
    assert (small.sizes["full"]["batch"], small.sizes["full"]["seq"]) == (8, 1024)
    for w in (big, small):
        assert w.optimizer == "adamw_fused" and w.liger is not None and w.liger_process_wide
        assert w.tokens(w.sizes["full"]) == w.sizes["full"]["batch"] * w.sizes["full"]["seq"]
    with torch.device("meta"):
        model = bm.llama(big.sizes["full"]["config"])
    assert 1.45e9 < sum(p.numel() for p in model.parameters()) < 1.55e9


def test_llama_tiny_run_reports_tokens_and_keeps_liger_out_of_this_process(tmp_path):
    """torch eager at the tiny size, in this process: a loss, tokens/s; Liger-Kernel's LLaMA patch
    holds for the whole process, so inline it is refused (its cases run in processes of their own)."""
    console = Console(file=io.StringIO(), width=220)
    rows = bm.run_models(quick=True, out=tmp_path, console=console, device="cpu", size="tiny",
                         amp=False, isolate=False, models=["llama_train"],
                         candidates=[bm.LIGER_COMPILED, bm.TORCH_EAGER, bm.LIGER])
    eager, liger, liger_compiled = rows
    assert (eager.candidate, liger.candidate, liger_compiled.candidate) == (
        bm.TORCH_EAGER, bm.LIGER, bm.LIGER_COMPILED)
    assert eager.status == "ok" and all(map(math.isfinite, eager.losses)), eager.note
    tiny = bm.WORKLOADS["llama_train"].sizes["tiny"]
    assert eager.tokens_per_s == pytest.approx(tiny["batch"] * tiny["seq"] / (eager.ms_per_step / 1e3))
    for r in (liger, liger_compiled):
        assert r.status == "n/a" and "whole process" in r.note
    assert "tokens/s" in console.file.getvalue()


def test_transformers_gpt2_workload_is_gpt2_small_with_its_dropout():
    workload = bm.WORKLOADS["gpt2_hf_train"]
    assert workload.sizes["full"]["batch"] == 8 and workload.sizes["full"]["seq"] == 1024
    assert workload.liger is None  # Liger-Kernel has no patch for it: n/a
    with torch.device("meta"):
        model = bm.gpt2_hf(workload.sizes["full"]["config"])
    params = sum(p.numel() for p in model.parameters())  # the tied head counts once
    assert 124.0e6 < params < 124.6e6, params
    assert model.config.attn_pdrop == model.config.resid_pdrop == 0.1


@pytest.mark.slow
def test_transformers_gpt2_tiny_patched_matches_torch(tmp_path):
    """transformers' GPT-2 patched by patch_model against torch eager, in fp32. Its dropout is
    on in both and their masks differ (torch's generator against Philox in our kernels), so the
    losses agree within dropout's noise, not exactly."""
    rows = bm.run_models(quick=True, out=tmp_path, console=Console(file=io.StringIO()),
                         device=str(DEVICE), size="tiny", amp=False, isolate=False,
                         models=["gpt2_hf_train"], candidates=[bm.TORCH_EAGER, bm.OURS])
    assert [r.status for r in rows] == ["ok", "ok"], [r.note for r in rows]
    assert all(math.isfinite(x) for r in rows for x in r.losses), [r.losses for r in rows]
    assert rows[1].loss_diff < 0.1, [r.losses for r in rows]


@pytest.mark.slow
def test_llama_tiny_patched_matches_torch(tmp_path):
    """triton-workshop's LLaMA (patch_model) against torch eager: the same losses in fp32."""
    rows = bm.run_models(quick=True, out=tmp_path, console=Console(file=io.StringIO()),
                         device=str(DEVICE), size="tiny", amp=False, isolate=False,
                         models=["llama_train_small"], candidates=[bm.TORCH_EAGER, bm.OURS])
    assert [r.status for r in rows] == ["ok", "ok"], [r.note for r in rows]
    assert rows[1].loss_diff < 1e-4, [r.losses for r in rows]


def test_models_is_listed_with_the_suite(capsys):
    from triton_workshop.bench import main

    assert main(["--help"]) == 0
    assert "models" in capsys.readouterr().out
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "models:" in listed and "llama_train" in listed and "llama_train_small" in listed
    assert main(["nope"]) == 2
    assert "valid names:" in (err := capsys.readouterr().err) and err.rstrip().endswith("models")
    assert main(["softmax", "models"]) == 2
    assert "runs on its own" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# --interleave: one model's candidates built in one process and timed in turn.
# ---------------------------------------------------------------------------------------------
def test_interleaved_candidates_take_turns_and_match_the_isolated_losses(monkeypatch):
    steps = bm.Steps(loss=2, warmup=1, timed=6)
    cases = [bm.Case(bm.WORKLOADS["gpt2_train"], c, size="tiny", device=str(DEVICE), amp=False,
                     steps=steps) for c in (bm.TORCH_EAGER, bm.OURS)]
    seen = []
    from triton_workshop.bench.measure import timed_steps as real
    from triton_workshop.bench.models import interleave

    def recording(step, batches, first, count, timer):
        seen.append((step, first, count))
        return real(step, batches, first, count, timer)

    monkeypatch.setattr(interleave, "timed_steps", recording)
    results = bm.run_interleaved(cases, rounds=3, timer=FakeTimer([1.0] * 12))
    assert [status for status, _ in results] == ["ok", "ok"], results
    # Three rounds, each candidate's turn of 6 // 3 = 2 steps, in order, the batches advancing.
    torch_step, ours_step = seen[0][0], seen[1][0]
    assert torch_step is not ours_step
    assert [(s is torch_step, first, count) for s, first, count in seen] == [
        (True, 3, 2), (False, 3, 2), (True, 5, 2), (False, 5, 2), (True, 7, 2), (False, 7, 2)]
    for (status, payload), case in zip(results, cases):
        assert len(payload["step_ms"]) == 6 and payload["ms_per_step"] == 1.0
        assert payload["peak_bytes"] is None and payload["first_step_s"] >= 0
        alone = bm.run_case(case, FakeTimer([1.0] * 6))
        assert payload["losses"] == pytest.approx(alone["losses"], abs=1e-6)


def test_interleaved_run_keeps_a_process_wide_candidate_apart(tmp_path):
    """--interleave: torch eager and a failing candidate share the process; Liger-Kernel's LLaMA
    (a patch for the whole process) is not built there (inline: refused, as without it)."""
    console = Console(file=io.StringIO(), width=220)
    rows = bm.run_models(quick=True, out=tmp_path, console=console, device="cpu", size="tiny",
                         amp=False, isolate=False, models=["llama_train"], interleave=2,
                         candidates=[bm.TORCH_EAGER, bm.LIGER])
    eager, liger = rows
    assert eager.status == "ok" and len(eager.losses) == bm.STEPS["tiny"].loss, eager.note
    assert eager.peak_gib is None
    assert liger.status == "n/a" and "whole process" in liger.note
    assert "in turn, 2 rounds" in console.file.getvalue()
    with pytest.raises(ValueError, match="whole process"):
        bm.run_interleaved([bm.Case(bm.WORKLOADS["llama_train"], bm.LIGER, size="tiny",
                                    device="cpu", amp=False)])
    with pytest.raises(ValueError, match="rounds"):
        bm.run_interleaved([], rounds=0)
    with pytest.raises(ValueError, match="interleave"):
        bm.run_models(quick=True, out=tmp_path, console=console, device="cpu", size="tiny",
                      interleave=-1)


def test_interleaved_failure_is_reported_and_the_others_still_run():
    cases = [tiny_case(_workload(_broken_model)), tiny_case(bm.WORKLOADS["gpt2_train"])]
    (status, note), (ok, payload) = bm.run_interleaved(cases, rounds=2)
    assert status == "failed" and "ZeroDivisionError: boom" in note
    assert ok == "ok" and payload["ms_per_step"] > 0


def test_the_compiled_candidate_patches_for_torch_compile():
    """triton-workshop's compiled candidate is patched with compiled=True (its standalone norms
    left to Inductor, its Linear+GELU fused) and its GPT-2 keeps torch's loss; the eager one
    leaves the Linear+GELU to cuBLAS and torch and fuses the GPT-2's loss with its LM head."""
    workload = bm.WORKLOADS["gpt2_train"]
    size = workload.sizes["tiny"]
    torch.manual_seed(0)
    eager = bm.prepare(workload.model(size).to(DEVICE), bm.OURS, workload)
    torch.manual_seed(0)
    compiled = bm.prepare(workload.model(size).to(DEVICE), bm.OURS_COMPILED, workload)
    inner = compiled._orig_mod  # torch.compile's wrapper: nothing compiled until it is called
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert type(eager.ln_f) is torch.nn.LayerNorm and eager.fused_loss is not None
    assert type(inner.ln_f) is torch.nn.LayerNorm and inner.fused_loss is None
    assert type(eager.blocks[0].mlp[0]) is torch.nn.Linear
    assert type(inner.blocks[0].mlp[0]) is triton_workshop.nn.Linear
    assert type(inner.blocks[0].attn) is not torch.nn.MultiheadAttention  # attention swapped
    x, y = workload.batches(size, 1)[0]
    x, y = x.to(DEVICE), y.to(DEVICE)
    with torch.no_grad():  # the fused loss is the model's loss
        torch.testing.assert_close(eager(x, y)[1], inner(x, y)[1], rtol=1e-4, atol=1e-5)
