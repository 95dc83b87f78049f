"""A patched Llama sharded with FSDP2 (and wrapped by DDP): ``examples/train_llama_fsdp.py``.

On the CPU (gloo, Triton's interpreter, a tiny Llama): two processes, each on its half of the global
batch, give the first step's gradients of one process on the whole batch (FSDP2 reduce-scatters
them into DTensor shards, gathered back here; DDP all-reduces them); activation checkpointing
recomputes the same values. On two GPUs (skipped elsewhere) the same over NCCL, with every kernel
of a rank on that rank's GPU; the scaling figure is drawn from recorded runs.
"""

from __future__ import annotations

import datetime
import gc
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from conftest import load_example
from test_distributed import (
    TIME_LIMIT_S,
    _full,
    _kernels_of,
    _profiler,
    interpreter_only,
    needs_two_gpus,
    relative_error,
    spawn,
)

pytest.importorskip("transformers", reason="the example builds transformers' LlamaForCausalLM")

#: The tiny Llama in fp32, the global batch split over the ranks (strong scaling).
CPU_ARGS = ["--tiny", "--device", "cpu", "--no-amp", "--scaling", "strong", "--batch", "2",
            "--steps", "1"]
GPU_ARGS = ["--device", "cuda", "--no-amp", "--scaling", "strong", "--layers", "2", "--hidden",
            "256", "--intermediate", "512", "--heads", "4", "--kv-heads", "2", "--vocab", "1024",
            "--seq", "128", "--batch", "4", "--steps", "1"]

pytestmark = pytest.mark.usefixtures("ieee_fp32")  # conftest.py


def example():
    return load_example("train_llama_fsdp")


def _first_step(ex, args, rank, parallel: str) -> dict:
    """One forward and backward of this rank's rows under ``parallel`` ("fsdp", "ddp" or
    "none"): the global loss, the gradients by name (whole tensors) and the GPU kernels seen."""
    model, _ = ex.build_model(args, rank.device)
    inner = model
    tokens = ex.rank_batches(args, rank)[0]
    if parallel == "fsdp":
        model = ex.shard(model, rank, args.amp)
    elif parallel == "ddp":
        ids = [rank.device.index] if rank.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    with _profiler(rank.device) as prof:
        loss = ex.forward_backward(model, tokens, rank.world)
        ex.train_ddp.synchronize(rank.device)
    return {"loss": loss.item(), "kernels": _kernels_of(prof),
            "grads": {n: _full(p.grad) for n, p in inner.named_parameters()}}


def _worker(rank: int, world: int, init_file: str, out_dir: str, argv: list[str]) -> None:
    torch.set_num_threads(1)  # two processes on two cores
    torch.backends.cuda.matmul.allow_tf32 = False
    ex = example()
    args = ex.parse_args(argv)
    device = ex.train_ddp.device_for(args.device, rank, world)
    options = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        options["device_id"] = device
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", init_method=f"file://{init_file}",
        rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIME_LIMIT_S), **options,
    )  # fmt: skip
    results = {}
    try:
        where = ex.train_ddp.Rank(rank, rank, world, device)
        for parallel in ("fsdp", "ddp"):
            results[parallel] = _first_step(ex, args, where, parallel)
            gc.collect()
    finally:
        gc.collect()
        dist.destroy_process_group()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def run_ranks(tmp_path: Path, argv: list[str], world: int = 2) -> list[dict]:
    spawn(_worker, (world, str(tmp_path / "rendezvous"), str(tmp_path), argv), nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def one_process(argv: list[str], device: str) -> dict:
    """The whole global batch in one process, no wrapper: the reference gradients."""
    ex = example()
    args = ex.parse_args(argv)
    model, counts = ex.build_model(args, torch.device(device))
    rank = ex.train_ddp.Rank(0, 0, 1, torch.device(device))
    tokens = ex.rank_batches(args, rank)[0]
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return {"loss": loss.item(), "counts": counts,
            "grads": {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}}


def assert_same_grads(got: dict, want: dict, tol: float) -> None:
    assert got.keys() == want.keys()
    worst = max(relative_error(got[n], want[n]) for n in want)
    assert worst < tol, f"largest relative gradient difference {worst:.2e}"


# --------------------------------------------------------------------------------------------
# CPU: gloo, the interpreter.
# --------------------------------------------------------------------------------------------
@interpreter_only
def test_fsdp2_and_ddp_on_gloo_match_one_process(tmp_path):
    ranks = run_ranks(tmp_path, CPU_ARGS)
    ref = one_process(CPU_ARGS, "cpu")
    assert ref["counts"] is not None and sum(ref["counts"].values()) > 0
    for parallel in ("fsdp", "ddp"):
        for r in ranks:
            assert r[parallel]["loss"] == pytest.approx(ref["loss"], rel=1e-5)
            assert_same_grads(r[parallel]["grads"], ref["grads"], 1e-4)
    # The comparison can fail: rank 0's half of the batch alone gives other gradients.
    ex = example()
    args = ex.parse_args(CPU_ARGS)
    model, _ = ex.build_model(args, torch.device("cpu"))
    tokens = ex.rank_batches(args, ex.train_ddp.Rank(0, 0, 2, torch.device("cpu")))[0]
    model(input_ids=tokens, labels=tokens).loss.backward()
    alone = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    assert max(relative_error(alone[n], ref["grads"][n]) for n in alone) > 1e-2


@interpreter_only
def test_checkpointed_model_equals_the_plain_one():
    plain = one_process(CPU_ARGS, "cpu")
    checkpointed = one_process([*CPU_ARGS, "--checkpoint"], "cpu")
    assert checkpointed["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert_same_grads(checkpointed["grads"], plain["grads"], 1e-5)


@interpreter_only
def test_example_trains_alone_and_records(tmp_path, capsys):
    records = tmp_path / "runs.jsonl"
    losses = example().main([*CPU_ARGS, "--steps", "2", "--record", str(records)])
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    row = json.loads(records.read_text())
    assert row["world"] == 1 and row["patched"] and row["scaling"] == "strong"
    # A second setup recorded, then the figure and the table drawn from both.
    example().main([*CPU_ARGS, "--steps", "2", "--no-patch", "--record", str(records)])
    out = example().main(["--plot", str(records), "--out", str(tmp_path / "fig.png")])
    assert out == [] and (tmp_path / "fig.png").stat().st_size > 1000
    table = capsys.readouterr().out
    assert "triton-workshop, strong" in table and "torch, strong" in table


def test_batch_must_split_evenly_under_strong_scaling():
    ex = example()
    args = ex.parse_args(["--tiny", "--device", "cpu", "--scaling", "strong", "--batch", "3"])
    with pytest.raises(ValueError, match="--batch 3 must be divisible"):
        ex.sequences_per_rank(args, 2)
    weak = ex.parse_args(["--tiny", "--device", "cpu", "--batch", "3"])
    assert ex.sequences_per_rank(weak, 2) == 3


# --------------------------------------------------------------------------------------------
# Two GPUs: NCCL.
# --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_two_gpus
def test_fsdp2_and_ddp_on_nccl_match_one_gpu(tmp_path):
    ranks = run_ranks(tmp_path, GPU_ARGS)
    ref = one_process(GPU_ARGS, "cuda:0")
    for parallel in ("fsdp", "ddp"):
        for index, r in enumerate(ranks):
            assert r[parallel]["loss"] == pytest.approx(ref["loss"], rel=1e-4)
            assert_same_grads(r[parallel]["grads"], ref["grads"], 1e-3)
            devices = {device for _, device in r[parallel]["kernels"]}
            assert devices == {index}, f"rank {index} ran kernels on {devices}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or triton_workshop.INTERPRET,
                    reason="needs a CUDA device with compiled kernels")
def test_checkpointed_model_equals_the_plain_one_on_gpu():
    plain = one_process(GPU_ARGS, "cuda")
    checkpointed = one_process([*GPU_ARGS, "--checkpoint"], "cuda")
    assert checkpointed["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert_same_grads(checkpointed["grads"], plain["grads"], 1e-4)

