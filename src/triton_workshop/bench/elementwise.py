"""Elementwise benchmarks: memory-bound, so the measure is bytes moved per second.

``sqrt(a*b+c)`` is the fusion lesson: eager PyTorch runs it as three kernels (``a*b``, ``+c``,
``sqrt``), each reading its inputs from DRAM and writing a temporary back: 5 reads + 3 writes of
``n`` elements. The fused kernel reads ``a``, ``b``, ``c`` once and writes once: 4 passes, so it
can be up to 2× faster, and the copy bandwidth is its ceiling. ``add`` is one kernel in eager too:
it shows how close a plain Triton kernel gets to the copy ceiling, with nothing to fuse.
"""

from __future__ import annotations

import torch

from ..ops.elementwise import add, fused_mul_add_sqrt
from .spec import GBPS, Spec, Workload

#: 2^22 (16 MiB of fp32 a tensor) to 2^28 (1 GiB a tensor, 4 GiB for sqrt(a*b+c)).
SIZES = tuple((1 << k,) for k in (22, 24, 26, 28))
QUICK = ((1 << 26,),)
HEADLINE = ((1 << 28,),)


def _uniform(n: int, count: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
    # rand, not randn: a*b+c stays >= 0, so sqrt has no NaNs to hide a wrong result behind.
    return tuple(torch.rand(n, dtype=dtype, device=device) for _ in range(count))


def _normal(n: int, count: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(n, dtype=dtype, device=device) for _ in range(count))


def mul_add_sqrt_eager(a, b, c):
    return torch.sqrt(a * b + c)


def add_eager(x, y):
    return x + y


def mul_add_sqrt_bytes(size, dtype) -> int:
    """a, b, c read once, out written once."""
    (n,) = size
    return 4 * n * dtype.itemsize


def add_bytes(size, dtype) -> int:
    """x, y read once, out written once."""
    (n,) = size
    return 3 * n * dtype.itemsize


SPEC = Spec(
    name="elementwise",
    title="Elementwise: sqrt(a*b+c) (fused) and add",
    workloads=[
        Workload(
            name="sqrt(a*b+c)",
            dtype=torch.float32,
            unit=GBPS,
            sizes=SIZES,
            quick=QUICK,
            headlines=HEADLINE,
            make_inputs=lambda size, dtype, device: _uniform(size[0], 3, dtype, device),
            work=mul_add_sqrt_bytes,
            work_formula="bytes = 4·n·itemsize (a, b, c read once; out written once)",
            ours=fused_mul_add_sqrt,
            reference=mul_add_sqrt_eager,
        ),
        Workload(
            name="add",
            dtype=torch.float32,
            unit=GBPS,
            sizes=SIZES,
            quick=QUICK,
            headlines=HEADLINE,
            make_inputs=lambda size, dtype, device: _normal(size[0], 2, dtype, device),
            work=add_bytes,
            work_formula="bytes = 3·n·itemsize (x, y read once; out written once)",
            ours=add,
            reference=add_eager,
        ),
    ],
)
