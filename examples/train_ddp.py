"""Train GPT-2 with triton-workshop's kernels on several GPUs: DDP, or FSDP2 with ``--fsdp``.

What you will see: the GPT-2 of ``train_gpt2.py`` (same model, same initial weights, same batches),
patched with ``triton_workshop.nn.patch`` and trained by N processes, one per GPU, launched by
``torchrun``. Each rank computes on its own slice of the global batch, on its own device
(``cuda:{LOCAL_RANK}``); torch.distributed averages the gradients. The modules need nothing
special for it:

* **DDP** (``DistributedDataParallel``): every rank holds the whole model; gradients are
  all-reduced in buckets while the backward still runs.
* **FSDP2** (``torch.distributed.fsdp.fully_shard``, ``--fsdp``): each block's parameters are
  sharded across the ranks as DTensors and all-gathered just before the block runs, so the
  patched modules see whole, plain tensors in their forward and backward; gradients are
  reduce-scattered back to the shards, and AdamW updates the shards.

Because ``--batch`` is the *global* batch, a run on N GPUs computes the same losses as a run on
one (up to the summation order of the gradients): compare them step by step. Nothing is
downloaded; the data is ``train_gpt2.py``'s synthetic token stream.

    torchrun --nproc-per-node 2 examples/train_ddp.py             # DDP on 2 GPUs, patched
    torchrun --nproc-per-node 2 examples/train_ddp.py --fsdp      # FSDP2
    torchrun --nproc-per-node 2 examples/train_ddp.py --no-patch  # torch's modules
    python examples/train_ddp.py                                  # one process, one GPU
    torchrun --nproc-per-node 2 examples/train_ddp.py --tiny --device cpu   # no GPU: gloo,
                                                                  # the interpreter, a toy size
    python examples/train_ddp.py --plot scaling.jsonl             # the scaling figure (see --record)

Each step prints the loss (the mean over the global batch) and the tokens/s of all ranks
together; the end prints the median. ``--record FILE`` appends that summary as one JSON line,
and ``--plot FILE`` draws tokens/s against the number of GPUs from such lines (patched against
unpatched, DDP and FSDP2) into a PNG and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import triton_workshop as tw  # first: decides GPU or interpreter before any kernel is defined

import torch
import torch.distributed as dist
from torch import nn

# The GPT, its sizes and its data come from train_gpt2.py: one GPT for all the examples.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import train_gpt2  # noqa: E402

# NVLink multicast (NVLS) off unless the caller decided otherwise: on shared multi-GPU hosts an
# NVLS failure can take the GPUs out of service for everyone; the all-reduce works without it.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):  # fmt: skip
    os.environ.setdefault(_name, _value)

TINY = train_gpt2.TINY
PARALLEL_NAMES = {"ddp": "DDP", "fsdp": "FSDP2"}


class Rank(NamedTuple):
    """Where this process stands: its rank among ``world`` processes, its rank on this host (the
    GPU it owns) and the device it computes on."""

    rank: int
    local_rank: int
    world: int
    device: torch.device


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="training steps (default: %(default)s)")
    p.add_argument("--fsdp", action="store_true",
                   help="FSDP2 (fully_shard per block, then the whole model) instead of DDP")
    p.add_argument("--patch", action=argparse.BooleanOptionalAction, default=True,
                   help="swap in triton-workshop's modules (default: on)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda (each rank takes cuda:LOCAL_RANK) or cpu (gloo, the interpreter); "
                        "cuda:K picks a GPU for a single process")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast (default: on a GPU only)")
    p.add_argument("--tiny", action="store_true", help=f"a toy size: {TINY}")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=16,
                   help="sequences per step over all ranks together (the global batch; each "
                        "rank takes batch / world of them)")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", type=Path, metavar="FILE",
                   help="append this run's summary (tokens/s, losses, sizes) as a JSON line")
    p.add_argument("--plot", type=Path, metavar="FILE",
                   help="do not train: draw the scaling figure from the JSON lines in FILE")
    p.add_argument("--out", type=Path, default=Path("scaling.png"),
                   help="the PNG --plot writes (default: %(default)s)")
    if p.parse_known_args(argv)[0].tiny:  # the toy sizes become the defaults; flags still win
        p.set_defaults(**TINY)
    args = p.parse_args(argv)
    if args.amp is None:
        args.amp = args.device.startswith("cuda")
    args.hf = False  # train_gpt2's builders also serve transformers' GPT-2, not used here
    return args


# --------------------------------------------------------------------------------------------
# Processes and devices.
# --------------------------------------------------------------------------------------------
def device_for(requested: str, local_rank: int, world: int) -> torch.device:
    """This rank's device: ``cuda:{local_rank}`` under torchrun, never a shared ``cuda:0``."""
    device = torch.device(requested)
    if device.type != "cuda":
        return device
    if device.index is not None and world > 1:
        raise ValueError(f"--device {requested}: with {world} processes each takes cuda:LOCAL_RANK;"
                         " pass --device cuda")
    index = local_rank if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"rank with LOCAL_RANK={local_rank} wants cuda:{index}, but "
                         f"{torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device("cuda", index)


def setup(args) -> Rank:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT``), or make a group of one for a plain ``python`` run, so that
    the same code runs in both. NCCL on CUDA, gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = device_for(args.device, local_rank, world)
    if device.type == "cuda":
        # The current device too: NCCL's own buffers and torch's default stream follow it.
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    options = {"device_id": device} if backend == "nccl" else {}
    if "RANK" in os.environ:
        dist.init_process_group(backend, rank=rank, world_size=world, **options)
    else:
        # No torchrun: an in-memory store, no port to pick.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **options)
    return Rank(rank, local_rank, world, device)


# --------------------------------------------------------------------------------------------
# The model, its parallel wrapper, the data of each rank.
# --------------------------------------------------------------------------------------------
def build_model(args, device: torch.device) -> tuple[nn.Module, dict | None]:
    """train_gpt2's GPT-2 with the same seed (the same initial weights on every rank and in
    train_gpt2.py), moved to ``device`` and patched, its loss fused with the LM head as there.
    Returns the model and patch's counts."""
    torch.manual_seed(args.seed)
    model = train_gpt2.build_model(args).to(device)
    counts = None
    if args.patch:
        counts = tw.nn.patch(model)
        train_gpt2.fuse_loss(model)
    return model, counts


def wrap(model: nn.Module, fsdp: bool, rank: Rank) -> nn.Module:
    """DDP, or FSDP2 per transformer block and then the whole model (the embeddings, the tied
    head and the final LayerNorm in the root group). patch comes first: it swaps exact torch
    classes, and fully_shard turns each module's class into an FSDP subclass."""
    if not fsdp:
        device_ids = [rank.device.index] if rank.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(rank.device.type, (rank.world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def rank_batches(args, rank: Rank) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's rows of train_gpt2's global batches, on its device: rank r of N takes rows
    ``r*B/N`` to ``(r+1)*B/N``, so the ranks together see exactly the one-process batch."""
    if args.batch % rank.world:
        raise ValueError(f"--batch {args.batch} must be divisible by the number of processes "
                         f"({rank.world}): every rank takes the same number of sequences")
    per_rank = args.batch // rank.world
    rows = slice(rank.rank * per_rank, (rank.rank + 1) * per_rank)
    return [(x[rows].to(rank.device), y[rows].to(rank.device))
            for x, y in train_gpt2.batches(args, "cpu")]  # fmt: skip


def forward_backward(model: nn.Module, x, y, amp: bool, world: int) -> torch.Tensor:
    """Loss and backward on this rank's rows. Each rank's loss is the mean over its own rows and
    DDP/FSDP2 average the gradients over the ranks: with equal shares that is the gradient of the
    mean over the global batch. Returns that global mean loss (detached, the same on all ranks)."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        loss = train_gpt2.loss_of(model, x, y, hf=False)
    loss.backward()
    loss = loss.detach()
    if world > 1:
        dist.all_reduce(loss)  # a sum: gloo has no ReduceOp.AVG
        loss /= world
    return loss


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------------------------
def train(args, rank: Rank) -> dict:
    """Build, wrap and train; rank 0 prints. Returns the run's summary (the losses included)."""
    leader = rank.rank == 0
    say = print if leader else (lambda *a, **k: None)
    model, counts = build_model(args, rank.device)
    n_params = sum(p.numel() for p in model.parameters())
    parallel = "fsdp" if args.fsdp else "ddp"
    say(f"GPT-2: {n_params / 1e6:.1f}M parameters, global batch {args.batch} x {args.seq} tokens "
        f"({args.batch // max(rank.world, 1)} sequences per rank), {rank.world} process(es), "
        f"{PARALLEL_NAMES[parallel]} over {dist.get_backend()}, "
        f"{'bf16 autocast' if args.amp else 'fp32'}, {tw.runtime.mode_description()}")
    if counts is not None:
        say("patched:", counts.describe())
    data = rank_batches(args, rank)
    model = wrap(model, args.fsdp, rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    tokens = args.batch * args.seq  # per step, all ranks together
    losses, times = [], []
    for step in range(args.steps):
        x, y = data[step % len(data)]
        start = time.perf_counter()
        loss = forward_backward(model, x, y, args.amp, rank.world)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(rank.device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        say(f"step {step + 1:4d}/{args.steps}  loss {losses[-1]:.4f}  {times[-1] * 1e3:8.1f} ms  "
            f"{tokens / times[-1]:12,.0f} tokens/s")
    steady = times[1:] or times  # the first step compiles and autotunes
    seconds = statistics.median(steady)
    summary = {
        "world": rank.world, "parallel": parallel, "patched": bool(args.patch),
        "tokens_per_s": tokens / seconds, "ms_per_step": seconds * 1e3,
        "first_step_s": times[0] if times else None, "losses": losses,
        "batch": args.batch, "seq": args.seq, "layers": args.layers, "embd": args.embd,
        "heads": args.heads, "vocab": args.vocab, "amp": bool(args.amp),
        "device": device_name(rank.device), "torch": torch.__version__,
    }  # fmt: skip
    if times:
        say(f"first step {times[0]:.1f} s (compiling and tuning included), then median "
            f"{seconds * 1e3:.1f} ms/step, {summary['tokens_per_s']:,.0f} tokens/s "
            f"({summary['tokens_per_s'] / rank.world:,.0f} per process)")
    return summary


def device_name(device: torch.device) -> str:
    """The GPU's name, or what computes on the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({'interpreter' if tw.INTERPRET else 'no kernels'})"


def record(path: Path, summary: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    with open(path, "a") as f:
        f.write(json.dumps({**summary, "time": stamp}) + "\n")


def main(argv=None) -> list[float]:
    """Train (or, with ``--plot``, draw); return the losses, the same on every rank."""
    args = parse_args(argv)
    if args.plot is not None:
        plot(args.plot, args.out)
        return []
    rank = setup(args)
    finished = False
    try:
        summary = train(args, rank)
        if args.record is not None and rank.rank == 0:
            record(args.record, summary)
        finished = True
    finally:
        # The wrapped model must be gone before its process group: a DDP or FSDP2 model that
        # outlives destroy_process_group (held by reference cycles until the interpreter exits)
        # aborts some gloo runs with "terminate called without an active exception".
        gc.collect()
        # After an error another rank may be waiting in a collective, and destroying the group
        # would wait with it: the error ends this process, and torchrun stops the others.
        if finished or rank.world == 1:
            dist.destroy_process_group()
    return summary["losses"]


# --------------------------------------------------------------------------------------------
# The scaling figure.
# --------------------------------------------------------------------------------------------
def _label(row: dict) -> str:
    kernels = "triton-workshop" if row["patched"] else "torch"
    return f"{kernels}, {PARALLEL_NAMES.get(row['parallel'], row['parallel'])}"


def scaling_table(rows: list[dict]) -> str:
    """A Markdown table: tokens/s per run, per GPU, and the speed-up over the same setup on one
    GPU with its ideal (N: the scaling efficiency is their ratio). The latest line wins when a
    setup was recorded twice."""
    latest = {(r["world"], r["parallel"], r["patched"]): r for r in rows}
    lines = ["| GPUs | kernels, parallelism | tokens/s | per GPU | vs 1 GPU (ideal N) |",
             "|---:|---|---:|---:|---:|"]
    order = sorted(latest, key=lambda key: (key[1], not key[2], key[0]))  # setup, then GPUs
    for world, parallel, patched in order:
        r, one = latest[(world, parallel, patched)], latest.get((1, parallel, patched))
        speedup = f"{r['tokens_per_s'] / one['tokens_per_s']:.2f}x ({world})" if one else "n/a"
        lines.append(f"| {world} | {_label(r)} | {r['tokens_per_s']:,.0f} | "
                     f"{r['tokens_per_s'] / world:,.0f} | {speedup} |")
    return "\n".join(lines)


def plot(records: Path, out: Path) -> Path:
    """Bars of tokens/s per number of GPUs, one per (kernels, parallelism); prints the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(records).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{records} holds no runs: record some with --record {records}")
    latest = {(r["world"], r["parallel"], r["patched"]): r for r in rows}
    worlds = sorted({w for w, _, _ in latest})
    setups = sorted({(p, patched) for _, p, patched in latest}, key=lambda s: (s[0], not s[1]))
    width = 0.8 / len(setups)
    fig, ax = plt.subplots(figsize=(max(6, 2.5 * len(worlds)), 4.5))
    for i, (parallel, patched) in enumerate(setups):
        xs, heights = [], []
        for j, world in enumerate(worlds):
            r = latest.get((world, parallel, patched))
            if r is not None:
                xs.append(j + (i - (len(setups) - 1) / 2) * width)
                heights.append(r["tokens_per_s"])
        ax.bar(xs, heights, width, label=_label({"parallel": parallel, "patched": patched}))
    last = rows[-1]
    ax.set_xticks(range(len(worlds)))
    ax.set_xticklabels([f"{w} GPU{'s' if w > 1 else ''}" for w in worlds])
    ax.set_ylabel("tokens/s (all GPUs together, higher is better)")
    ax.set_title(f"GPT-2 {last['layers']} layers x {last['embd']}, global batch "
                 f"{last['batch']} x {last['seq']}, {last['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(scaling_table(rows))
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
