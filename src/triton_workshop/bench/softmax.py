"""Softmax benchmarks (fp16, over the last dimension): memory-bound row reductions.

Every size holds 2^26 elements (128 MiB of fp16) and only the row length changes, from rows far
shorter than a block to rows far longer than one, so the plot shows how the kernel copes with the
shape rather than with the amount of data. The table sizes 8192×8192 and 65536×1024 are headlines.

Bytes counted, the minimum a fused kernel must move:

* forward: ``x`` read once, ``y`` written once: ``2·M·N·itemsize``;
* forward + backward: the forward as above, then the backward reads ``y`` (saved) and ``dy`` and
  writes ``dx``: ``5·M·N·itemsize``.
"""

from __future__ import annotations

import torch

from ..ops.softmax import softmax
from .spec import GBPS, Spec, Workload, liger

ELEMENTS = 1 << 26


def _shape(n_cols: int) -> tuple[int, int]:
    return (ELEMENTS // n_cols, n_cols)


FWD_SIZES = tuple(_shape(n) for n in (256, 1024, 4096, 8192, 32768))
BWD_SIZES = tuple(_shape(n) for n in (1024, 4096, 8192, 32768))
SQUARE = (8192, 8192)
NARROW = (65536, 1024)


def softmax_eager(x):
    return torch.softmax(x, dim=-1)


def _inputs(requires_grad: bool):
    def make(size, dtype, device):
        return (torch.randn(size, dtype=dtype, device=device, requires_grad=requires_grad),)

    return make


def fwd_bytes(size, dtype) -> int:
    """x read, y written."""
    rows, cols = size
    return 2 * rows * cols * dtype.itemsize


def fwd_bwd_bytes(size, dtype) -> int:
    """forward: x read, y written; backward: y and dy read, dx written."""
    rows, cols = size
    return 5 * rows * cols * dtype.itemsize


def _workload(name, sizes, headlines, backward: bool) -> Workload:
    return Workload(
        name=name,
        dtype=torch.float16,
        unit=GBPS,
        sizes=sizes,
        quick=(SQUARE,),
        headlines=headlines,
        make_inputs=_inputs(backward),
        work=fwd_bwd_bytes if backward else fwd_bytes,
        work_formula=(
            "bytes = 5·M·N·itemsize (fwd: x read, y written; bwd: y, dy read, dx written)"
            if backward
            else "bytes = 2·M·N·itemsize (x read, y written)"
        ),
        ours=lambda x: softmax(x, dim=-1),
        reference=softmax_eager,
        optional_peers={"Liger-Kernel": liger("liger_kernel.ops.softmax", "LigerSoftmaxFunction")},
        backward=backward,
    )


SPEC = Spec(
    name="softmax",
    title="Softmax over rows (fp16, 2^26 elements, row length swept)",
    workloads=[
        _workload("softmax fwd", FWD_SIZES, (SQUARE, NARROW), backward=False),
        _workload("softmax fwd+bwd", BWD_SIZES, (SQUARE,), backward=True),
    ],
)
