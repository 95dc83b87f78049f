"""Train GPT-2 with triton-workshop's kernels swapped in by one call, ``patch(model)``.

What you will see: the same model, the same initial weights and the same batches, trained with
torch's modules (``--no-patch``) or with triton-workshop's (``--patch``, the default): fused
LayerNorm, matmuls with the GELU in their epilogue, flash attention, and the loss computed from
the LM head's input without the logits in memory (``linear_cross_entropy``). The losses follow each other
step for step (they differ only by rounding), and ms/step tells the speed. ``--compile`` adds
``torch.compile`` on top of either.

The model is GPT-2 small (124M parameters: 12 layers, 12 heads, 768 wide) written nanoGPT-style
with ``torch.nn`` modules (:class:`triton_workshop.bench.models.GPT`, the one ``workshop bench
models`` measures), from random weights; the data is a synthetic token stream (a fixed random
corpus, so the loss falls as the model memorises it). Nothing is downloaded.

    python examples/train_gpt2.py                      # GPT-2 124M, batch 8 x 1024, 20 steps
    python examples/train_gpt2.py --no-patch           # torch's modules, for comparison
    python examples/train_gpt2.py --compile            # patched (compiled=True), then
                                                       # torch.compile
    python examples/train_gpt2.py --tiny --device cpu  # a toy size, runs in the interpreter
    python examples/train_gpt2.py --hf                 # transformers' GPT2LMHeadModel instead
                                                       # (pip install transformers)

On a GPU the forward runs under bf16 autocast (``--no-amp`` for fp32).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import triton_workshop as tw  # first: decides GPU or interpreter before any kernel is defined

import torch
import torch.nn.functional as F
from triton_workshop.bench.models.zoo import GPT, GPTConfig

TINY = {"layers": 2, "heads": 2, "embd": 32, "seq": 16, "batch": 4, "vocab": 64}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="training steps (default: %(default)s)")
    p.add_argument("--patch", action=argparse.BooleanOptionalAction, default=True,
                   help="swap in triton-workshop's modules (default: on)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (after patch)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast (default: on a GPU only)")
    p.add_argument("--tiny", action="store_true", help=f"a toy size: {TINY}")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf", action="store_true",
                   help="transformers' GPT2LMHeadModel (built from a config) and "
                        "triton_workshop.integrations.transformers.patch_model")
    if p.parse_known_args(argv)[0].tiny:  # the toy sizes become the defaults; flags still win
        p.set_defaults(**TINY)
    args = p.parse_args(argv)
    if args.amp is None:
        args.amp = args.device.startswith("cuda")
    return args


def build_model(args) -> torch.nn.Module:
    if not args.hf:
        config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers,
                           n_head=args.heads, n_embd=args.embd)
        return GPT(config)
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.embd,
                        n_layer=args.layers, n_head=args.heads, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0)
    return GPT2LMHeadModel(config)


def patch(model, args) -> None:
    # A model that will be compiled leaves its LayerNorms to Inductor, which fuses each with the
    # residual add before it (compiled=True; the rest is swapped as usual).
    if args.hf:
        from triton_workshop.integrations.transformers import patch_model

        counts = patch_model(model, compiled=args.compile)
    else:
        counts = tw.nn.patch(model, compiled=args.compile)
        if not args.compile:  # compiled, Inductor's own loss is the faster one
            fuse_loss(model)
    print("patched:", counts.describe())


def fuse_loss(model: GPT) -> None:
    """The GPT's loss from its LM head's input (linear_cross_entropy: no logits in memory)."""
    model.fused_loss = lambda weight, hidden, targets: tw.linear_cross_entropy(
        hidden, weight, targets)


def batches(args, device, count: int = 8):
    """``count`` (input, target) windows of a fixed random corpus: targets are inputs shifted by
    one token, as in language modelling."""
    g = torch.Generator().manual_seed(args.seed + 1)
    corpus = torch.randint(0, args.vocab, (args.batch * args.seq * 4 + 1,), generator=g)
    out = []
    for _ in range(count):
        starts = torch.randint(0, corpus.numel() - args.seq - 1, (args.batch,), generator=g)
        rows = torch.stack([corpus[s : s + args.seq + 1] for s in starts.tolist()])
        out.append((rows[:, :-1].to(device), rows[:, 1:].to(device)))
    return out


def loss_of(model, x, y, hf: bool) -> torch.Tensor:
    if hf:
        logits = model(input_ids=x).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
    return model(x, y)[1]


def main(argv=None) -> list[float]:
    """Train; print the loss and time of every step; return the losses."""
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = build_model(args).to(device)
    print(f"GPT-2: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"batch {args.batch} x {args.seq} tokens, {device}, "
          f"{'bf16 autocast' if args.amp else 'fp32'}, {tw.runtime.mode_description()}")
    if args.patch:
        patch(model, args)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    data = batches(args, device)
    return train(model, optimizer, data, lambda x, y: loss_of(model, x, y, args.hf), args.steps,
                 device, args.amp)

def train(model, optimizer, data, loss_fn, steps: int, device: torch.device, amp: bool) -> list:
    """``steps`` training steps over ``data`` (pairs of inputs, cycled), each timed to the GPU's
    end; prints loss and ms per step, then the first step and the median of the rest. Returns
    the losses. Shared by the examples (train_resnet.py uses it too)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses, times = [], []
    for step in range(steps):
        inputs, targets = data[step % len(data)]
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item())
        print(f"step {step + 1:4d}/{steps}  loss {losses[-1]:.4f}  {times[-1]:8.1f} ms")
    if len(times) > 1:
        print(f"first step {times[0] / 1e3:.1f} s (compiling and tuning included), then "
              f"median {statistics.median(times[1:]):.1f} ms/step")
    return losses


if __name__ == "__main__":
    main()
    sys.exit(0)
