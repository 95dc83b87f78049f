"""RMSNorm benchmarks (fp16, normalised over the last dimension, with a weight).

Memory-bound like layer norm: each size holds a fixed number of elements and the row length is
swept (the same sizes as layer norm's, so the two read side by side). Headlines: forward at
32768×4096, forward + backward at 8192×8192.

Bytes counted, the minimum a fused implementation must move (``w`` of length ``N``; the per-row
1/rms is fp32):

* forward: ``x`` read, ``y`` written, ``w`` read: ``(2·M·N + N)·itemsize``;
* forward + backward: the forward also writes 1/rms (``4·M`` bytes); the backward reads ``x``,
  ``dy``, ``w`` and 1/rms and writes ``dx``, ``dw``: ``(5·M·N + 3·N)·itemsize + 8·M``;
* add + RMSNorm forward + backward, ``y = rms_norm(x + residual)`` with the gradient reaching
  ``x`` and ``residual`` through ``y``: the forward reads ``x``, ``residual``, ``w`` and writes
  ``y``, the sum (which the backward needs: one write is less than reading ``x`` and
  ``residual`` again) and 1/rms; the backward reads the sum, ``dy``, ``w``, 1/rms and writes one
  gradient (``x``'s and ``residual``'s are the same tensor) and ``dw``:
  ``(7·M·N + 3·N)·itemsize + 8·M``. There is no forward-only add workload: a workload returns one
  tensor, and with the sum unused torch.compile would skip writing it, which a model never can.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.rms_norm import add_rms_norm, rms_norm
from .spec import GBPS, Spec, Workload, liger

EPS = 1e-6
FWD_ELEMENTS = 1 << 27  # 256 MiB of fp16, the size of the 32768×4096 table entry
BWD_ELEMENTS = 1 << 26  # 128 MiB, the size of 8192×8192

FWD_SIZES = tuple((FWD_ELEMENTS // n, n) for n in (1024, 4096, 8192, 16384))
BWD_SIZES = tuple((BWD_ELEMENTS // n, n) for n in (1024, 4096, 8192, 16384))
FWD_HEADLINE = (32768, 4096)
BWD_HEADLINE = (8192, 8192)


def rms_norm_eager(x, weight):
    return F.rms_norm(x, x.shape[-1:], weight, EPS)


def add_rms_norm_eager(x, residual, weight):
    return F.rms_norm(x + residual, x.shape[-1:], weight, EPS)


def _inputs(requires_grad: bool, residual: bool = False):
    def make(size, dtype, device):
        rows, cols = size
        x = torch.randn(rows, cols, dtype=dtype, device=device)
        weight = 1.0 + 0.1 * torch.randn(cols, dtype=dtype, device=device)
        tensors = (x, torch.randn_like(x), weight) if residual else (x, weight)
        return tuple(t.requires_grad_(requires_grad) for t in tensors)

    return make


def fwd_bytes(size, dtype) -> int:
    """x read, y written, weight read."""
    rows, cols = size
    return (2 * rows * cols + cols) * dtype.itemsize


def fwd_bwd_bytes(size, dtype) -> int:
    """fwd: x, w read, y written, fp32 1/rms written; bwd: x, dy, w, 1/rms read, dx, dw
    written."""
    rows, cols = size
    return (5 * rows * cols + 3 * cols) * dtype.itemsize + 8 * rows


def add_fwd_bwd_bytes(size, dtype) -> int:
    """fwd: x, residual, w read, y, the sum, fp32 1/rms written; bwd: the sum, dy, w, 1/rms read,
    d(x) = d(residual), dw written."""
    rows, cols = size
    return (7 * rows * cols + 3 * cols) * dtype.itemsize + 8 * rows


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
            "bytes = (5·M·N + 3·N)·itemsize + 8·M (fwd: x, w read, y written, fp32 1/rms "
            "written; bwd: x, dy, w, 1/rms read, dx, dw written)"
            if backward
            else "bytes = (2·M·N + N)·itemsize (x, w read, y written)"
        ),
        ours=lambda x, weight: rms_norm(x, x.shape[-1:], weight, EPS),
        reference=rms_norm_eager,
        optional_peers={
            "Liger-Kernel": _liger_rms_norm,
        },
        backward=backward,
    )


def _add_workload() -> Workload:
    return Workload(
        name="add+rms_norm fwd+bwd",
        dtype=torch.float16,
        unit=GBPS,
        sizes=BWD_SIZES,
        quick=(BWD_HEADLINE,),
        headlines=(BWD_HEADLINE,),
        make_inputs=_inputs(True, residual=True),
        work=add_fwd_bwd_bytes,
        work_formula=(
            "bytes = (7·M·N + 3·N)·itemsize + 8·M (fwd: x, residual, w read, y, x + residual, "
            "fp32 1/rms written; bwd: x + residual, dy, w, 1/rms read, one dx = dresidual, dw "
            "written)"
        ),
        ours=lambda x, residual, weight: add_rms_norm(x, residual, x.shape[-1:], weight, EPS)[0],
        reference=add_rms_norm_eager,
        reference_name="torch eager (x + residual, F.rms_norm)",
        optional_peers={
            "Liger-Kernel": _liger_add_rms_norm,
        },
        backward=True,
    )


# Liger's functions take (..., eps, offset, casting_mode, in_place): in_place=False, because an
# in-place backward writes dx over the benchmark's fixed output gradient.
def _liger_rms_norm():
    apply = liger("liger_kernel.ops.rms_norm", "LigerRMSNormFunction")()
    return lambda x, weight: apply(x, weight, EPS, 0.0, "llama", False)


def _liger_add_rms_norm():
    apply = liger("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction")()
    return lambda x, residual, weight: apply(x, residual, weight, EPS, 0.0, "llama", False)[0]


SPEC = Spec(
    name="rms_norm",
    title="RMSNorm over rows (fp16, with weight, row length swept; and fused with a residual add)",
    workloads=[
        _workload("rms_norm fwd", FWD_SIZES, FWD_HEADLINE, backward=False),
        _workload("rms_norm fwd+bwd", BWD_SIZES, BWD_HEADLINE, backward=True),
        _add_workload(),
    ],
)
