"""The patched modules under torch.distributed: DDP and FSDP2 (``fully_shard``), and the example
``examples/train_ddp.py`` that trains with them.

On the CPU (gloo, Triton's interpreter, tiny sizes): two processes, each on its half of the global
batch, give the gradients of one process on the whole batch (all-reduced by DDP, reduce-scattered
by FSDP2 and gathered back here), to rounding, and the same losses as ``train_gpt2.py`` step for
step; the example runs under ``torchrun`` with 2 processes, and alone as a world of one.

On a machine with two GPUs or more (skipped elsewhere): the same over NCCL, one GPU per rank, with
the losses of a single-GPU run; a profiler shows every kernel of a rank on that rank's GPU; and a
model on ``cuda:1`` trains while ``cuda:0`` is the current device, allocating nothing there.

Each group of processes runs under a time limit, so that a hung collective fails the test.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from conftest import EXAMPLES, load_example

ON_GPU = torch.cuda.is_available() and not triton_workshop.INTERPRET
TWO_GPUS = ON_GPU and torch.cuda.device_count() >= 2
needs_two_gpus = pytest.mark.skipif(
    not TWO_GPUS, reason="needs 2 CUDA devices with compiled kernels (NCCL, one GPU per rank)"
)
# The gloo tests run the kernels in Triton's interpreter on CPU tensors: in GPU mode the package
# (rightly) refuses to patch a model on the CPU. On a GPU machine: TRITON_INTERPRET=1 runs them.
interpreter_only = pytest.mark.skipif(
    not triton_workshop.INTERPRET,
    reason="gloo on the CPU with the interpreter's kernels: run with TRITON_INTERPRET=1 on a GPU machine",
)
#: Seconds a group of processes may take, start-up included, before the test fails.
TIME_LIMIT_S = 300

# NVLink multicast stays off in every process started here (the workers inherit the variables).
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):  # fmt: skip
    os.environ.setdefault(_name, _value)

#: Tiny sizes on the CPU: fp32 and IEEE everywhere, so only summation order differs.
CPU_ARGS = ["--tiny", "--device", "cpu", "--no-amp", "--lr", "3e-3", "--steps", "3"]
#: A small GPT-2 on the GPU, fp32 (TF32 off) for the same reason.
GPU_ARGS = ["--device", "cuda", "--no-amp", "--layers", "2", "--heads", "4", "--embd", "128",
            "--seq", "128", "--batch", "8", "--vocab", "512", "--lr", "1e-3", "--steps", "4"]


pytestmark = pytest.mark.usefixtures("ieee_fp32")  # conftest.py
load = load_example


# --------------------------------------------------------------------------------------------
# The workers: one process per rank, started by spawn.
# --------------------------------------------------------------------------------------------
def spawn(fn, args: tuple, nprocs: int, time_limit_s: float = TIME_LIMIT_S) -> None:
    """``fn(rank, *args)`` in ``nprocs`` fresh processes; a worker's exception fails the test
    with its traceback, and so does running past ``time_limit_s`` (the workers are killed)."""
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + time_limit_s
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"{nprocs} processes ran past {time_limit_s} s (a hung collective?)")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU: an FSDP2 shard (a DTensor) is gathered from all ranks."""
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.detach().cpu().clone()


def _kernels_of(prof) -> list[tuple[str, int]]:
    """(kernel name, device index) of every GPU kernel the profiler saw."""
    from torch.autograd import DeviceType

    events = prof.events()
    return sorted({(e.name, e.device_index) for e in events if e.device_type == DeviceType.CUDA})


def _profiler(device: torch.device):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities)


def _train_one(example, args, rank, fsdp: bool) -> dict:
    """The example's model, wrapper, data and step, for ``args.steps`` steps: the global losses,
    the gradients of the first step and the parameters after it (whole tensors, by name), and
    the GPU kernels of the last step with their devices."""
    model, _ = example.build_model(args, rank.device)
    inner = model  # names without DDP's "module." (fully_shard keeps the object)
    data = example.rank_batches(args, rank)
    model = example.wrap(model, fsdp, rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    out = {"losses": [], "kernels": []}
    for step in range(args.steps):
        x, y = data[step % len(data)]
        last = step == args.steps - 1
        with _profiler(rank.device) if last else contextlib.nullcontext() as prof:
            loss = example.forward_backward(model, x, y, args.amp, rank.world)
            if step == 0:
                out["grads"] = {n: _full(p.grad) for n, p in inner.named_parameters()}
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            example.synchronize(rank.device)
        if step == 0:
            out["params"] = {n: _full(p) for n, p in inner.named_parameters()}
        if last:
            out["kernels"] = _kernels_of(prof)
        out["losses"].append(loss.item())
    return out


def _worker(rank: int, world: int, init_file: str, out_dir: str, argv: list[str]) -> None:
    torch.set_num_threads(1)  # two processes on two cores
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    example = load("train_ddp")
    args = example.parse_args(argv)
    device = example.device_for(args.device, rank, world)
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
        where = example.Rank(rank, rank, world, device)
        for fsdp in (False, True):
            results["fsdp" if fsdp else "ddp"] = _train_one(example, args, where, fsdp)
            gc.collect()  # each wrapped model gone before the next, and before the group
    finally:
        gc.collect()
        dist.destroy_process_group()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def run_ranks(tmp_path: Path, argv: list[str], world: int = 2) -> list[dict]:
    spawn(_worker, (world, str(tmp_path / "rendezvous"), str(tmp_path), argv), nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def reference(argv: list[str], device: str) -> dict:
    """One process, no wrapper, the whole global batch: the first step's gradients and the
    parameters after it (the example's own functions), and train_gpt2.py's losses."""
    example = load("train_ddp")
    args = example.parse_args(argv)
    model, _ = example.build_model(args, torch.device(device))
    x, y = (t.to(device) for t in load("train_gpt2").batches(args, "cpu")[0])
    example.forward_backward(model, x, y, args.amp, world=1)
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    optimizer.step()
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    # Rank 0's half alone, to show the comparison can fail: without the gradients' reduction
    # a rank would hold these.
    model.zero_grad(set_to_none=True)
    half = args.batch // 2
    example.forward_backward(model, x[:half], y[:half], args.amp, world=1)
    rank0_alone = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
    losses = load("train_gpt2").main([*argv, "--device", device])
    return {"grads": grads, "params": params, "rank0_alone": rank0_alone, "losses": losses}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


# --------------------------------------------------------------------------------------------
# CPU: gloo, the interpreter.
# --------------------------------------------------------------------------------------------
@interpreter_only
def test_ddp_and_fsdp2_on_gloo_match_one_process(tmp_path):
    ranks = run_ranks(tmp_path, CPU_ARGS)
    ref = reference(CPU_ARGS, "cpu")
    names = set(ref["grads"])
    assert len(names) > 10
    # The reduction matters: rank 0's own half differs from the global gradient by far more than
    # the tolerance below, in every parameter.
    close = [n for n in names if relative_error(ref["rank0_alone"][n], ref["grads"][n]) < 1e-2]
    assert not close, close
    for mode in ("ddp", "fsdp"):
        for r, result in enumerate(ranks):
            got = result[mode]
            assert set(got["grads"]) == set(got["params"]) == names, (mode, r)
            for n in sorted(names):
                torch.testing.assert_close(got["grads"][n], ref["grads"][n], rtol=1e-5, atol=1e-7,
                                           msg=lambda m: f"{mode} rank {r} grad of {n}: {m}")  # noqa: B023
                # AdamW's first step is about lr·sign(grad): grads within rounding of zero may
                # take either sign, so the parameters are compared by norm.
                assert relative_error(got["params"][n], ref["params"][n]) < 1e-5, (mode, r, n)
            torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]),
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
            assert got["losses"][-1] != got["losses"][0]  # the weights moved
            assert got["kernels"] == []  # no GPU here: the kernels ran in the interpreter
        # Every rank ends with the same whole gradients: one all-reduce (or gather) result.
        for n in names:
            assert torch.equal(ranks[0][mode]["grads"][n], ranks[1][mode]["grads"][n]), (mode, n)


@interpreter_only
def test_fsdp2_shards_parameters_as_dtensors_on_gloo(tmp_path):
    """FSDP2 really shards (each rank holds half of every parameter between steps) while the
    patched modules compute with whole tensors: checked on the model the example builds."""
    spawn(_shard_worker, (2, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2)
    for r in range(2):
        seen = json.loads((tmp_path / f"shards{r}.json").read_text())
        assert seen["sharded"] and seen["classes"] == ["DTensor"], seen
        assert seen["forward_weight_class"] == "Parameter"  # gathered: a plain tensor, not a DTensor
        assert seen["forward_weight_shape"] == seen["full_shape"]
        assert seen["local_rows"] * 2 == seen["full_shape"][0]
        assert seen["patched_class"] == "PatchedMultiheadAttention"
        assert seen["patched_module"].startswith("triton_workshop")


def _shard_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    example = load("train_ddp")
    args = example.parse_args(CPU_ARGS)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=TIME_LIMIT_S))  # fmt: skip
    try:
        where = example.Rank(rank, rank, world, torch.device("cpu"))
        model, _ = example.build_model(args, where.device)
        attn = model.blocks[0].attn  # patched: the attention (its kernel wins in GPT-2's steps)
        patched_class = type(attn)
        model = example.wrap(model, True, where)
        weight = attn.in_proj_weight
        seen = {
            "classes": sorted({type(p).__name__ for p in model.parameters()}),
            "sharded": all(p.to_local().shape[0] <= -(-p.shape[0] // world)
                           for p in model.parameters()),
            "full_shape": list(weight.shape), "local_rows": weight.to_local().shape[0],
            "patched_class": patched_class.__name__, "patched_module": patched_class.__module__,
        }  # fmt: skip

        def record_weight(module, *inputs):
            seen["forward_weight_class"] = type(module.in_proj_weight).__name__
            seen["forward_weight_shape"] = list(module.in_proj_weight.shape)

        attn.register_forward_pre_hook(record_weight, with_kwargs=True)
        x, y = example.rank_batches(args, where)[0]
        example.forward_backward(model, x, y, False, world)
    finally:
        gc.collect()
        dist.destroy_process_group()
    (Path(out_dir) / f"shards{rank}.json").write_text(json.dumps(seen))


def test_device_and_batch_errors():
    example = load("train_ddp")
    with pytest.raises(ValueError, match="cuda:LOCAL_RANK"):
        example.device_for("cuda:1", 0, 2)
    assert example.device_for("cpu", 1, 2) == torch.device("cpu")
    args = example.parse_args(["--tiny", "--device", "cpu", "--batch", "3"])
    with pytest.raises(ValueError, match="--batch 3 must be divisible"):
        example.rank_batches(args, example.Rank(0, 0, 2, torch.device("cpu")))
    args = example.parse_args(["--tiny", "--device", "cpu", "--fsdp"])
    assert args.fsdp and args.batch == 4 and args.layers == 2 and not args.amp and args.patch


# --------------------------------------------------------------------------------------------
# The example itself: torchrun with 2 processes, and a plain run (a world of one).
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """The example at tiny size: alone (in this process), then DDP and FSDP2 under torchrun with
    2 processes; all three append to one record file. Returns the file, each run's output and
    train_gpt2.py's losses for the same arguments."""
    folder = tmp_path_factory.mktemp("train_ddp")
    records = folder / "scaling.jsonl"
    argv = [*CPU_ARGS, "--record", str(records)]
    alone = load("train_ddp").main(argv)
    outputs = {}
    for mode in ("ddp", "fsdp"):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(EXAMPLES / "train_ddp.py"), *argv,
                   *(["--fsdp"] if mode == "fsdp" else [])]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIME_LIMIT_S)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        outputs[mode] = result.stdout
    gpt2 = load("train_gpt2").main(["--tiny", "--device", "cpu", "--no-amp", "--lr", "3e-3",
                                    "--steps", "3"])  # fmt: skip
    return {"records": records, "alone": alone, "outputs": outputs, "gpt2": gpt2, "folder": folder}


@interpreter_only
def test_example_alone_is_train_gpt2(example_runs):
    # A world of one: DDP divides the gradients by 1; the same steps as train_gpt2.py.
    torch.testing.assert_close(torch.tensor(example_runs["alone"]), torch.tensor(example_runs["gpt2"]),
                               rtol=1e-6, atol=1e-6)  # fmt: skip


@interpreter_only
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_example_under_torchrun_matches_one_process(example_runs, mode):
    printed = example_runs["outputs"][mode]
    name = {"ddp": "DDP", "fsdp": "FSDP2"}[mode]
    assert f"2 process(es), {name} over gloo" in printed
    assert "patched: attention 2" in printed  # patch's rules: the attention wins eagerly
    assert printed.count("tokens/s") == 4 and "step    3/3" in printed  # rank 0 prints, alone
    rows = [json.loads(line) for line in example_runs["records"].read_text().splitlines()]
    row = next(r for r in rows if r["world"] == 2 and r["parallel"] == mode)
    assert row["patched"] and row["tokens_per_s"] > 0 and row["batch"] == 4
    torch.testing.assert_close(torch.tensor(row["losses"]), torch.tensor(example_runs["gpt2"]),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@interpreter_only
def test_scaling_figure_from_records(example_runs, capsys):
    png = example_runs["folder"] / "scaling.png"
    assert load("train_ddp").main(["--plot", str(example_runs["records"]), "--out", str(png)]) == []
    printed = capsys.readouterr().out
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 1 | triton-workshop, DDP |" in printed
    assert "| 2 | triton-workshop, DDP |" in printed and "| 2 | triton-workshop, FSDP2 |" in printed
    lines = printed.splitlines()
    ddp_two = next(line for line in lines if line.startswith("| 2 | triton-workshop, DDP"))
    assert ddp_two.rstrip().endswith("(2) |")  # a speed-up against the 1-process DDP run
    fsdp_two = next(line for line in lines if "FSDP2" in line)
    assert fsdp_two.rstrip().endswith("n/a |")  # no 1-process FSDP2 run was recorded


# --------------------------------------------------------------------------------------------
# Two GPUs: NCCL, one GPU per rank.
# --------------------------------------------------------------------------------------------
def our_kernel_names() -> set[str]:
    """The names of the package's @triton.jit functions (what the profiler calls their kernels)."""
    names = set()
    for info in pkgutil.iter_modules(importlib.import_module("triton_workshop.ops").__path__):
        try:
            module = importlib.import_module(f"triton_workshop.ops.{info.name}.kernels")
        except ModuleNotFoundError:
            continue
        for value in vars(module).values():
            obj, wrapped = value, False
            while hasattr(obj, "fn"):  # Autotuner / heuristics -> JITFunction -> function
                obj, wrapped = obj.fn, True
            if wrapped and callable(obj) and hasattr(obj, "__name__"):
                names.add(obj.__name__)
    return names


def test_our_kernel_names_are_found():
    names = our_kernel_names()
    assert {"matmul_kernel"} <= names and any("layer_norm" in n for n in names), sorted(names)


@pytest.mark.gpu
@needs_two_gpus
def test_ddp_and_fsdp2_on_nccl_match_one_gpu(tmp_path):
    ranks = run_ranks(tmp_path, GPU_ARGS)
    torch.cuda.set_device(0)
    ref = reference(GPU_ARGS, "cuda:0")
    ours = our_kernel_names()
    for mode in ("ddp", "fsdp"):
        for r, result in enumerate(ranks):
            got = result[mode]
            # fp32 with TF32 off; only the order of the gradients' sums differs (the batch split,
            # the all-reduce): losses within 1e-4 over 4 AdamW steps.
            torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]),
                                       rtol=1e-4, atol=1e-4)  # fmt: skip
            for n, want in ref["grads"].items():
                assert relative_error(got["grads"][n], want) < 1e-4, (mode, r, n)
            devices = {index for _, index in got["kernels"]}
            assert devices == {r}, f"{mode} rank {r} ran kernels on devices {devices}"
            names = {name for name, _ in got["kernels"]}
            assert names & ours, f"{mode} rank {r}: none of our kernels among {sorted(names)[:20]}"


@pytest.mark.gpu
@needs_two_gpus
def test_model_on_cuda1_alone_runs_there():
    """A patched GPT-2 on cuda:1 trains while cuda:0 is the current device: every kernel (ours,
    torch's, autotuning's) runs on cuda:1, nothing is allocated on cuda:0, and the losses are
    those of the same run on cuda:0."""
    example = load("train_gpt2")
    argv = [a for a in GPU_ARGS if a not in ("--device", "cuda")]
    argv[argv.index("--steps") + 1] = "3"
    torch.cuda.set_device(0)
    gc.collect()
    torch.cuda.synchronize(0)
    torch.cuda.reset_peak_memory_stats(0)
    before = torch.cuda.memory_allocated(0)
    with _profiler(torch.device("cuda", 1)) as prof:
        on_one = example.main([*argv, "--device", "cuda:1"])
        torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    assert torch.cuda.max_memory_allocated(0) == before, "memory was allocated on cuda:0"
    kernels = _kernels_of(prof)
    assert {index for _, index in kernels} == {1}, kernels[:20]
    assert {name for name, _ in kernels} & our_kernel_names()
    on_zero = example.main([*argv, "--device", "cuda:0"])
    torch.testing.assert_close(torch.tensor(on_one), torch.tensor(on_zero), rtol=1e-4, atol=1e-4)
