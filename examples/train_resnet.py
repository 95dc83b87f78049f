"""Train ResNet-18 with every convolution through triton-workshop's ``conv2d``, by one call.

What you will see: the same network, initial weights and batches, trained with torch's
``nn.Conv2d`` (``--no-patch``) or with :class:`triton_workshop.nn.Conv2d` (``--patch``, the
default; ``patch(model)`` also takes the classifier's Linear). BatchNorm, ReLU and pooling stay
torch's. The losses follow each other (up to rounding), ms/step tells the speed. Channels-last
(NHWC) is the layout the implicit GEMM reads fastest: ``--channels-last`` (the default on a GPU).
The example asks for every convolution (``patch(model, conv2d="always")``): by default ``patch``
leaves convolutions on cuDNN, the faster one in a training step (see ``patch``'s docstring).

The network is :func:`triton_workshop.bench.models.resnet18` (torchvision's ResNet-18 layout,
written out with ``torch.nn``; ``--torchvision`` uses torchvision's own), from random weights; the
data is a fixed set of random images and labels (the loss falls as the network memorises them).
Nothing is downloaded.

    python examples/train_resnet.py                      # batch 64, 224 x 224, 20 steps
    python examples/train_resnet.py --no-patch           # torch's convolutions, for comparison
    python examples/train_resnet.py --compile            # patched, then torch.compile
    python examples/train_resnet.py --tiny --device cpu  # a toy size, runs in the interpreter

On a GPU the forward runs under bf16 autocast (``--no-amp`` for fp32).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import triton_workshop as tw  # first: decides GPU or interpreter before any kernel is defined

import torch
import torch.nn.functional as F
from triton_workshop.bench.models.zoo import resnet18

# The training loop is train_gpt2.py's: one loop for all the examples.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import train_gpt2  # noqa: E402

TINY = {"batch": 4, "image_size": 16, "width": 8, "classes": 10}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="training steps (default: %(default)s)")
    p.add_argument("--patch", action=argparse.BooleanOptionalAction, default=True,
                   help="swap in triton-workshop's modules (default: on)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (after patch)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast (default: on a GPU only)")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="NHWC activations and weights (default: on a GPU only)")
    p.add_argument("--tiny", action="store_true", help=f"a toy size: {TINY}")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--width", type=int, default=64, help="channels of the first stage (64: ResNet-18)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torchvision", action="store_true",
                   help="torchvision.models.resnet18(weights=None) instead (pip install torchvision)")
    if p.parse_known_args(argv)[0].tiny:  # the toy sizes become the defaults; flags still win
        p.set_defaults(**TINY)
    args = p.parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    args.amp = on_gpu if args.amp is None else args.amp
    args.channels_last = on_gpu if args.channels_last is None else args.channels_last
    return args


def build_model(args) -> torch.nn.Module:
    if args.torchvision:
        import torchvision

        return torchvision.models.resnet18(weights=None, num_classes=args.classes)
    return resnet18(num_classes=args.classes, width=args.width)


def batches(args, device, count: int = 4):
    g = torch.Generator().manual_seed(args.seed + 1)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    out = []
    for _ in range(count):
        images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g)
        labels = torch.randint(0, args.classes, (args.batch,), generator=g)
        out.append((images.to(device).contiguous(memory_format=memory_format), labels.to(device)))
    return out


def main(argv=None) -> list[float]:
    """Train; print the loss and time of every step; return the losses."""
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = build_model(args).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    print(f"ResNet-18: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"batch {args.batch} x 3 x {args.image_size}², {device}, "
          f"{'channels-last' if args.channels_last else 'NCHW'}, "
          f"{'bf16 autocast' if args.amp else 'fp32'}, {tw.runtime.mode_description()}")
    if args.patch:
        # Every convolution, as this example is about: by default patch() leaves convolutions on
        # cuDNN, the faster one in a training step.
        counts = tw.nn.patch(model, conv2d="always")
        print("patched:", counts.describe())
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = batches(args, device)
    return train_gpt2.train(model, optimizer, data,
                            lambda images, labels: F.cross_entropy(model(images).float(), labels),
                            args.steps, device, args.amp)

if __name__ == "__main__":
    main()
    sys.exit(0)
