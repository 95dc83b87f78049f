"""Layer norm benchmarks (fp16, normalised over the last dimension, with weight and bias).

Memory-bound like softmax: each size holds a fixed number of elements and the row length is
swept. Headlines: forward at 32768×4096, forward + backward at 8192×8192.

Bytes counted, the minimum a fused implementation must move (``w``, ``b`` of length ``N``; the
per-row mean and 1/std are fp32):

* forward: ``x`` read, ``y`` written, ``w``, ``b`` read: ``(2·M·N + 2·N)·itemsize``;
* forward + backward: the forward also writes mean and 1/std (``8·M`` bytes); the backward reads
  ``x``, ``dy``, ``w``, mean and 1/std and writes ``dx``, ``dw``, ``db``:
  ``(5·M·N + 5·N)·itemsize + 16·M``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.layer_norm import layer_norm
from .spec import GBPS, Spec, Workload, liger

EPS = 1e-5
FWD_ELEMENTS = 1 << 27  # 256 MiB of fp16, the size of the 32768×4096 table entry
BWD_ELEMENTS = 1 << 26  # 128 MiB, the size of 8192×8192

FWD_SIZES = tuple((FWD_ELEMENTS // n, n) for n in (1024, 4096, 8192, 16384))
BWD_SIZES = tuple((BWD_ELEMENTS // n, n) for n in (1024, 4096, 8192, 16384))
FWD_HEADLINE = (32768, 4096)
BWD_HEADLINE = (8192, 8192)


def layer_norm_eager(x, weight, bias):
    return F.layer_norm(x, x.shape[-1:], weight, bias, EPS)


def _inputs(requires_grad: bool):
    def make(size, dtype, device):
        rows, cols = size
        x = torch.randn(rows, cols, dtype=dtype, device=device)
        weight = 1.0 + 0.1 * torch.randn(cols, dtype=dtype, device=device)
        bias = 0.1 * torch.randn(cols, dtype=dtype, device=device)
        return tuple(t.requires_grad_(requires_grad) for t in (x, weight, bias))

    return make


def fwd_bytes(size, dtype) -> int:
    """x read, y written, weight and bias read."""
    rows, cols = size
    return (2 * rows * cols + 2 * cols) * dtype.itemsize


def fwd_bwd_bytes(size, dtype) -> int:
    """fwd: x, w, b read, y written, fp32 mean and 1/std written;
    bwd: x, dy, w read, mean and 1/std read, dx, dw, db written."""
    rows, cols = size
    return (5 * rows * cols + 5 * cols) * dtype.itemsize + 16 * rows


def _workload(name, sizes, headline, backward: bool) -> Workload:
    return Workload(
        name=name,
        dtype=torch.float16,
        unit=GBPS,
        sizes=sizes,
        quick=(headline,),
        headlines=(headline,),
        make_inputs=_inputs(backward),
        work=fwd_bwd_bytes if backward else fwd_bytes,
        work_formula=(
            "bytes = (5·M·N + 5·N)·itemsize + 16·M (fwd: x, w, b read, y written, fp32 mean/rstd "
            "written; bwd: x, dy, w, mean/rstd read, dx, dw, db written)"
            if backward
            else "bytes = (2·M·N + 2·N)·itemsize (x, w, b read, y written)"
        ),
        ours=lambda x, weight, bias: layer_norm(x, x.shape[-1:], weight, bias, EPS),
        reference=layer_norm_eager,
        optional_peers={
            "Liger-Kernel": _liger_layer_norm,
        },
        backward=backward,
    )


def _liger_layer_norm():
    apply = liger("liger_kernel.ops.layer_norm", "LigerLayerNormFunction")()
    return lambda x, weight, bias: apply(x, weight, bias, EPS)


SPEC = Spec(
    name="layer_norm",
    title="Layer norm over rows (fp16, with weight and bias, row length swept)",
    workloads=[
        _workload("layer_norm fwd", FWD_SIZES, FWD_HEADLINE, backward=False),
        _workload("layer_norm fwd+bwd", BWD_SIZES, BWD_HEADLINE, backward=True),
    ],
)
