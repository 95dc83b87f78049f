"""Train a Llama-class model on several GPUs with FSDP2, on triton-workshop's kernels.

What you will see: a ``LlamaForCausalLM`` built from a ``LlamaConfig`` with random weights (by
default the 16-layer, hidden-2048, 32/8-head, vocab-128256 configuration that ``workshop bench
models llama_train`` measures on one GPU), patched with
``triton_workshop.integrations.transformers.patch_model`` (RMSNorm, RoPE, SwiGLU, attention and the
loss through the library's kernels), then sharded with FSDP2: ``fully_shard`` on every decoder
layer and on the whole model, parameters kept in fp32 and computed in bf16
(``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``). Each process owns one GPU
(``cuda:LOCAL_RANK``) and is started by ``torchrun``. ``--checkpoint`` recomputes each decoder
layer in the backward instead of keeping its activations (less memory, about a third more work).

Two ways to scale, picked by ``--scaling``:

* ``weak`` (default): every GPU takes ``--batch`` sequences, so N GPUs train on N times the tokens
  of one per step; ideal tokens/s grows N-fold.
* ``strong``: ``--batch`` is the global batch, split over the GPUs; a run on N GPUs computes the
  losses of a run on one (up to the summation order of the gradients).

::

    torchrun --nproc-per-node 2 examples/train_llama_fsdp.py              # 2 GPUs, patched
    torchrun --nproc-per-node 2 examples/train_llama_fsdp.py --no-patch   # torch's modules
    python examples/train_llama_fsdp.py                                   # one GPU
    torchrun --nproc-per-node 2 examples/train_llama_fsdp.py --checkpoint --scaling strong
    torchrun --nproc-per-node 2 examples/train_llama_fsdp.py --tiny --device cpu   # no GPU
    python examples/train_llama_fsdp.py --plot llama.jsonl --out llama.png         # the figure

Each step prints the loss and tokens/s of all ranks together; the end prints the median step and
the peak memory of each GPU. ``--record FILE`` appends that summary as a JSON line; ``--plot FILE``
draws tokens/s and per-GPU peak memory against the number of GPUs from such lines (patched
against unpatched, weak and strong scaling) and prints a Markdown table. Nothing is downloaded:
the tokens are random, drawn from a seeded generator, the same for any number of processes.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import triton_workshop as tw  # first: decides GPU or interpreter before any kernel is defined

import torch
import torch.distributed as dist
from torch import nn

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import train_ddp  # noqa: E402  (process setup and devices: one way for all the examples)

#: ``workshop bench models llama_train``'s model.
LLAMA = dict(layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8, vocab=128256,
             seq=2048, batch=4)
#: A toy size for the CPU (gloo and Triton's interpreter) and the tests.
TINY = dict(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=128, seq=16,
            batch=2)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="training steps (default: %(default)s)")
    p.add_argument("--patch", action=argparse.BooleanOptionalAction, default=True,
                   help="put the model on triton-workshop's kernels with patch_model (default: on)")
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing: recompute each decoder layer in the backward")
    p.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                   help="weak: --batch sequences per GPU; strong: --batch over all GPUs together")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda (each rank takes cuda:LOCAL_RANK) or cpu (gloo, the interpreter)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 compute with fp32 parameters (default: on a GPU only)")
    p.add_argument("--tiny", action="store_true", help=f"a toy size: {TINY}")
    for name, value in LLAMA.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", type=Path, metavar="FILE",
                   help="append this run's summary as a JSON line")
    p.add_argument("--plot", type=Path, metavar="FILE",
                   help="do not train: draw the scaling figure from the JSON lines in FILE")
    p.add_argument("--out", type=Path, default=Path("llama-fsdp-scaling.png"),
                   help="the PNG --plot writes (default: %(default)s)")
    if p.parse_known_args(argv)[0].tiny:
        p.set_defaults(**TINY)
    args = p.parse_args(argv)
    if args.amp is None:
        args.amp = args.device.startswith("cuda")
    return args


# --------------------------------------------------------------------------------------------
# The model, its shards, the data.
# --------------------------------------------------------------------------------------------
def llama_config(args):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=max(args.seq, 128),
        tie_word_embeddings=False, use_cache=False, attention_dropout=0.0,
    )  # fmt: skip


def build_model(args, device: torch.device) -> tuple[nn.Module, dict | None]:
    """The Llama with ``args.seed``'s weights (the same on every rank), on ``device``, patched
    (unless ``--no-patch``), checkpointed per layer with ``--checkpoint``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(llama_config(args)).to(device)
    counts = None
    if args.patch:
        from triton_workshop.integrations.transformers import patch_model

        counts = patch_model(model)
    if args.checkpoint:
        # transformers' own per-layer checkpointing (non-reentrant: works with FSDP2's hooks),
        # under its newer name where the installed transformers has it.
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    return model, counts


def shard(model: nn.Module, rank: train_ddp.Rank, amp: bool) -> nn.Module:
    """FSDP2: each decoder layer, then the whole model (embeddings, final norm and head in the
    root group). patch_model comes first: fully_shard turns each module's class into an FSDP
    subclass, and the patched modules then see whole, plain tensors inside their forward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(rank.device.type, (rank.world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if amp else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def sequences_per_rank(args, world: int) -> int:
    if args.scaling == "weak":
        return args.batch
    if args.batch % world:
        raise ValueError(f"--batch {args.batch} must be divisible by the number of processes "
                         f"({world}) with --scaling strong")
    return args.batch // world


def rank_batches(args, rank: train_ddp.Rank, n_batches: int = 4) -> list[torch.Tensor]:
    """This rank's token rows of ``n_batches`` global batches, drawn from one seeded generator so
    that ranks together see exactly what one process sees (strong scaling) or its N-fold
    continuation (weak scaling: rank r takes global rows r*B .. (r+1)*B)."""
    per_rank = sequences_per_rank(args, rank.world)
    generator = torch.Generator().manual_seed(args.seed + 1)
    global_rows = per_rank * rank.world
    rows = slice(rank.rank * per_rank, (rank.rank + 1) * per_rank)
    return [torch.randint(0, args.vocab, (global_rows, args.seq), generator=generator)[rows]
            .to(rank.device) for _ in range(n_batches)]  # fmt: skip


def forward_backward(model: nn.Module, tokens: torch.Tensor, world: int) -> torch.Tensor:
    """The causal-LM loss of this rank's rows (labels = the tokens: the model shifts them), its
    backward, and the mean loss over all ranks (detached, the same on every rank)."""
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    loss = loss.detach().float()
    if world > 1:
        dist.all_reduce(loss)  # a sum: gloo has no ReduceOp.AVG
        loss /= world
    return loss


# --------------------------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------------------------
def train(args, rank: train_ddp.Rank) -> dict:
    leader = rank.rank == 0
    say = print if leader else (lambda *a, **k: None)
    model, counts = build_model(args, rank.device)
    n_params = sum(p.numel() for p in model.parameters())
    per_rank = sequences_per_rank(args, rank.world)
    say(f"Llama: {n_params / 1e9:.2f}B parameters, {args.layers} layers x {args.hidden}, "
        f"{per_rank} x {args.seq} tokens per rank ({args.scaling} scaling), {rank.world} "
        f"process(es), FSDP2 over {dist.get_backend()}, "
        f"{'bf16 compute, fp32 parameters' if args.amp else 'fp32'}"
        f"{', activation checkpointing' if args.checkpoint else ''}, {tw.runtime.mode_description()}")
    if counts is not None:
        say("patched:", counts.describe() if hasattr(counts, "describe") else counts)
    data = rank_batches(args, rank)
    model = shard(model, rank, args.amp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                                  fused=rank.device.type == "cuda")
    tokens = per_rank * rank.world * args.seq  # per step, all ranks together
    if rank.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rank.device)
    losses, times = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        loss = forward_backward(model, data[step % len(data)], rank.world)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train_ddp.synchronize(rank.device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        say(f"step {step + 1:4d}/{args.steps}  loss {losses[-1]:.4f}  {times[-1] * 1e3:8.1f} ms  "
            f"{tokens / times[-1]:12,.0f} tokens/s")
    peak = _peak_gib(rank)
    steady = times[1:] or times  # the first step compiles and autotunes
    seconds = statistics.median(steady)
    summary = {
        "world": rank.world, "patched": bool(args.patch), "checkpoint": bool(args.checkpoint),
        "scaling": args.scaling, "tokens_per_s": tokens / seconds, "ms_per_step": seconds * 1e3,
        "first_step_s": times[0] if times else None, "peak_gib_per_gpu": peak, "losses": losses,
        "batch_per_rank": per_rank, "seq": args.seq, "layers": args.layers, "hidden": args.hidden,
        "vocab": args.vocab, "amp": bool(args.amp), "device": train_ddp.device_name(rank.device),
        "torch": torch.__version__,
    }  # fmt: skip
    if times:
        say(f"first step {times[0]:.1f} s, then median {seconds * 1e3:.1f} ms/step, "
            f"{summary['tokens_per_s']:,.0f} tokens/s, peak {max(peak):.1f} GiB per GPU")
    return summary


def _peak_gib(rank: train_ddp.Rank) -> list[float]:
    """Every rank's peak allocated memory in GiB (0 on the CPU), gathered to all ranks."""
    if rank.device.type != "cuda":
        return [0.0] * rank.world
    mine = torch.tensor([torch.cuda.max_memory_allocated(rank.device) / 2**30],
                        device=rank.device)
    if rank.world == 1:
        return [mine.item()]
    gathered = [torch.zeros_like(mine) for _ in range(rank.world)]
    dist.all_gather(gathered, mine)
    return [g.item() for g in gathered]


def main(argv=None) -> list[float]:
    """Train (or, with ``--plot``, draw); return the losses, the same on every rank."""
    args = parse_args(argv)
    if args.plot is not None:
        plot(args.plot, args.out)
        return []
    rank = train_ddp.setup(args)
    finished = False
    try:
        summary = train(args, rank)
        if args.record is not None and rank.rank == 0:
            train_ddp.record(args.record, summary)
        finished = True
    finally:
        gc.collect()  # the sharded model must be gone before its process group (see train_ddp)
        if finished or rank.world == 1:
            dist.destroy_process_group()
    return summary["losses"]


# --------------------------------------------------------------------------------------------
# The scaling figure.
# --------------------------------------------------------------------------------------------
def _setup(row: dict) -> tuple:
    return (row["scaling"], bool(row.get("checkpoint")), row["patched"])


def _label(setup: tuple) -> str:
    scaling, checkpoint, patched = setup
    kernels = "triton-workshop" if patched else "torch"
    return f"{kernels}, {scaling}{', checkpointed' if checkpoint else ''}"


def scaling_table(rows: list[dict]) -> str:
    """A Markdown table: per run tokens/s, the speed-up over the same setup on one GPU, and the
    peak memory per GPU against one GPU's. The latest line wins when a run was recorded twice."""
    latest = {(r["world"], *_setup(r)): r for r in rows}
    lines = ["| GPUs | kernels, scaling | tokens/s | vs 1 GPU | peak GiB per GPU | vs 1 GPU |",
             "|---:|---|---:|---:|---:|---:|"]
    for key in sorted(latest, key=lambda k: (k[1], k[2], not k[3], k[0])):
        r, one = latest[key], latest.get((1, *key[1:]))
        peak = max(r["peak_gib_per_gpu"])
        speed = f"{r['tokens_per_s'] / one['tokens_per_s']:.2f}x" if one else "n/a"
        memory = (f"{peak / max(one['peak_gib_per_gpu']):.2f}x"
                  if one and max(one["peak_gib_per_gpu"]) else "n/a")
        lines.append(f"| {key[0]} | {_label(key[1:])} | {r['tokens_per_s']:,.0f} | {speed} | "
                     f"{peak:.1f} | {memory} |")
    return "\n".join(lines)


def plot(records: Path, out: Path) -> Path:
    """Two panels against the number of GPUs: tokens/s and peak memory per GPU, one bar per
    setup (kernels, scaling, checkpointing); prints the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(records).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{records} holds no runs: record some with --record {records}")
    latest = {(r["world"], *_setup(r)): r for r in rows}
    worlds = sorted({k[0] for k in latest})
    setups = sorted({k[1:] for k in latest}, key=lambda s: (s[0], s[1], not s[2]))
    width = 0.8 / len(setups)
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 4 * len(worlds)), 4.5))
    for i, setup in enumerate(setups):
        xs, speed, memory = [], [], []
        for j, world in enumerate(worlds):
            r = latest.get((world, *setup))
            if r is not None:
                xs.append(j + (i - (len(setups) - 1) / 2) * width)
                speed.append(r["tokens_per_s"])
                memory.append(max(r["peak_gib_per_gpu"]))
        axes[0].bar(xs, speed, width, label=_label(setup))
        axes[1].bar(xs, memory, width, label=_label(setup))
    last = rows[-1]
    for ax, ylabel in zip(axes, ("tokens/s, all GPUs (higher is better)",
                                 "peak memory per GPU, GiB (lower is better)")):
        ax.set_xticks(range(len(worlds)))
        ax.set_xticklabels([f"{w} GPU{'s' if w > 1 else ''}" for w in worlds])
        ax.set_ylabel(ylabel)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Llama {last['layers']} layers x {last['hidden']}, vocab {last['vocab']}, FSDP2, "
                 f"{last['batch_per_rank']} x {last['seq']} tokens per GPU, {last['device']}")
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
