"""Attention benchmarks: fused attention (fp16, (B, H, N, D)), compute-bound, in TFLOP/s.

Sizes are ``B×H×N×D`` (batch, heads, sequence length, head dim; Nq = Nk = N): B = 4, H = 32,
N ∈ {1024, 2048, 4096} (--quick and the summary: N = 4096), D = 128 and D = 64. Workloads: the
forward, non-causal and causal, and forward + backward, causal.

**FLOPs**, the FlashAttention-2 convention (``benchmarks/benchmark_flash_attention.py``), so that
the rates are comparable with published ones:

* forward, non-causal: ``4·B·H·Nq·Nk·D``, two matrix products (``Q Kᵀ`` and ``P V``) of
  ``2·Nq·Nk·D`` each; the softmax is not counted;
* forward, causal: half of that, ``2·B·H·N·N·D`` (the masked half is not work; the diagonal
  tiles' extra is not counted either);
* forward + backward: ``3.5 ×`` the forward (the backward counted as ``2.5 ×`` the forward: the
  five products ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dQ = dS K``, ``dK = dSᵀ Q`` and the recomputed
  ``S = Q Kᵀ``); causal fwd+bwd = ``7·B·H·N·N·D``. Work a kernel chooses to redo (ours recomputes
  ``dP`` in its dQ kernel: 7 products, not 5) is not counted, so every candidate is credited with
  the same FLOPs.

**Peers, in the same run** (no ``torch.compile``: SDPA is the fused peer):

* ``SDPA math``: ``F.scaled_dot_product_attention`` restricted to the math backend, the unfused
  eager expression (it materialises the N×N scores; PyTorch computes it in fp32 for fp16 inputs).
  It is the correctness reference: triton-workshop's output (and for fwd+bwd its dQ, dK, dV) must
  match it within rtol 1e-2, atol 2e-2 × max|reference| before it is timed;
* ``SDPA flash``: SDPA restricted to its FlashAttention-2 backend
  (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``);
* ``SDPA cuDNN``: SDPA restricted to its cuDNN backend (``SDPBackend.CUDNN_ATTENTION``).

Never a crash: a backend this GPU or torch build does not run at all (a tiny probe of the
workload fails) is n/a, its reason in ``results.csv``; one that refuses a particular size is
unavailable at that size, PyTorch's reason printed under the table.

**Ceiling**: cuBLAS doing the same FLOPs as one dense fp16 product, measured in the same run at
every size: ``(B·N × k) @ (k × N)`` with ``k`` chosen so that ``2·(B·N)·N·k`` equals the
workload's FLOPs (``k = 2·H·D`` for the non-causal forward, ``H·D`` causal, ``3.5·H·D`` causal
fwd+bwd). The best peer's rate is not a ceiling; cuBLAS's rate on a large GEMM is what the tensor
cores sustain on fp16 here. For fwd+bwd workloads the whole GEMM runs in the forward of a tiny
autograd function whose backward only allocates the gradients, so the runner's fwd+bwd timing of
the ceiling is the GEMM's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from ..ops.attention import attention
from .spec import TFLOPS, Spec, Workload

BATCH, HEADS = 4, 32
SEQ_LENS = (1024, 2048, 4096)
QUICK_SEQ = 4096

SDPA_MATH = "SDPA math"
SDPA_FLASH = "SDPA flash"
SDPA_CUDNN = "SDPA cuDNN"
CEILING_NAME = "cuBLAS GEMM"

#: (rtol, atol × max|reference|): the outputs and gradients are O(1); P and dS are rounded to fp16
#: before their products (errors ~1e-3 of the largest value), a wrong kernel is off by O(1).
TOLERANCE = (1e-2, 2e-2)


def sizes(head_dim: int) -> tuple[tuple[int, int, int, int], ...]:
    return tuple((BATCH, HEADS, n, head_dim) for n in SEQ_LENS)


def attention_flops(causal: bool, backward: bool):
    def count(size, dtype) -> int:
        """FlashAttention-2's convention (module docstring)."""
        batch, heads, n, head_dim = size
        forward = 4 * batch * heads * n * n * head_dim // (2 if causal else 1)
        return forward * 7 // 2 if backward else forward

    return count


def _formula(causal: bool, backward: bool) -> str:
    if backward:
        return ("FLOPs = 3.5 × causal forward = 7·B·H·N²·D (FA2 convention: backward = 2.5 × "
                "forward; recomputation not counted)")
    if causal:
        return "FLOPs = 2·B·H·N²·D (causal: half of 4·B·H·N²·D; softmax not counted)"
    return "FLOPs = 4·B·H·N²·D (Q Kᵀ and P V; softmax not counted)"


def _inputs(requires_grad: bool):
    def make(size, dtype, device):
        return tuple(
            torch.randn(size, dtype=dtype, device=device, requires_grad=requires_grad)
            for _ in range(3)
        )

    return make


def _backend(name: str):
    """``SDPBackend.<name>``; raises (the peer is then "not importable") on a torch without it."""
    from torch.nn.attention import SDPBackend

    backend = getattr(SDPBackend, name, None)
    if backend is None:
        raise RuntimeError(f"this torch ({torch.__version__}) has no SDPBackend.{name}")
    return backend


def sdpa(backend_name: str, causal: bool):
    """SDPA restricted to one backend: raises at the call if that backend cannot run the case
    (the runner then reports the peer unavailable, with PyTorch's reason)."""
    from torch.nn.attention import sdpa_kernel

    backend = _backend(backend_name)

    def fn(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def _cuda_peer(backend_name: str, causal: bool, head_dim: int, backward: bool):
    """A factory for ``Workload.optional_peers``: the backend, if it runs on this GPU and torch at
    all (a tiny probe of the workload's head dim, forward or forward + backward); otherwise it
    raises and the peer is reported n/a. A backend that runs the probe but refuses a benchmark
    size is reported unavailable at that size, with PyTorch's reason."""

    def factory():
        if not torch.cuda.is_available():
            raise RuntimeError(f"SDPBackend.{backend_name} needs a CUDA GPU")
        fn = sdpa(backend_name, causal)
        probe = [
            torch.randn(1, 1, 64, head_dim, dtype=torch.float16, device="cuda",
                        requires_grad=backward)
            for _ in range(3)
        ]
        out = fn(*probe)
        if backward:
            torch.autograd.grad(out, probe, torch.ones_like(out))
        return fn

    return factory


class AttentionWorkload(Workload):
    def shrink(self, size, target: int = 4096):
        """The tiny shape of the checks: 2 heads of 128 queries, D / 8 (at least 8): head dims a
        multiple of 8 and lengths a multiple of 64, which every SDPA backend takes, so the
        CPU-sized checks run on a GPU as well (ragged shapes are ``tests/test_attention.py``'s)."""
        batch, heads, n, head_dim = size
        return (min(batch, 2), min(heads, 2), min(n, 128), max(8, head_dim // 8))


# --------------------------------------------------------------------------------------------
# The ceiling: one cuBLAS GEMM with the workload's FLOPs.
# --------------------------------------------------------------------------------------------
#: q → (a, b): the GEMM's operands live exactly as long as the case's inputs.
_OPERANDS: WeakIdKeyDictionary = WeakIdKeyDictionary()


class _GemmInForward(torch.autograd.Function):
    """Runs ``a @ b`` and returns an (unwritten) tensor like ``q``; its backward only allocates
    gradients like q, k, v. Timed forward + backward, it costs the GEMM and nothing else."""

    @staticmethod
    def forward(ctx, q, k, v, a, b):
        ctx.save_for_backward(q, k, v)
        torch.mm(a, b)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        return (*(torch.empty_like(t) for t in ctx.saved_tensors), None, None)


def gemm_shape(size, flops: int) -> tuple[int, int, int]:
    """(m, n, k) of a product with ``flops`` = 2·m·n·k: m = B·N, n = N."""
    batch, _, n, _ = size
    m = batch * n
    return m, n, max(1, round(flops / (2 * m * n)))


def _same_flops_ceiling(flops):
    def ceiling(q, k, v):
        operands = _OPERANDS.get(q)
        if operands is None:
            m, n, inner = gemm_shape(tuple(q.shape), flops(tuple(q.shape), q.dtype))
            operands = (
                torch.randn(m, inner, dtype=q.dtype, device=q.device),
                torch.randn(inner, n, dtype=q.dtype, device=q.device),
            )
            _OPERANDS[q] = operands
        return _GemmInForward.apply(q, k, v, *operands)

    return ceiling


# --------------------------------------------------------------------------------------------
# The workloads.
# --------------------------------------------------------------------------------------------
def _workload(head_dim: int, *, causal: bool, backward: bool = False) -> Workload:
    kind = "fwd+bwd" if backward else "fwd"
    flops = attention_flops(causal, backward)
    quick = (BATCH, HEADS, QUICK_SEQ, head_dim)
    return AttentionWorkload(
        name=f"attention {kind}{' causal' if causal else ''} D={head_dim}",
        dtype=torch.float16,
        unit=TFLOPS,
        sizes=sizes(head_dim),
        quick=(quick,),
        headlines=(quick,),
        make_inputs=_inputs(backward),
        work=flops,
        work_formula=_formula(causal, backward),
        ours=lambda q, k, v: attention(q, k, v, causal=causal),
        reference=sdpa("MATH", causal),
        reference_name=SDPA_MATH,
        optional_peers={
            SDPA_FLASH: _cuda_peer("FLASH_ATTENTION", causal, head_dim, backward),
            SDPA_CUDNN: _cuda_peer("CUDNN_ATTENTION", causal, head_dim, backward),
        },
        compile_peer=False,
        backward=backward,
        ceiling=_same_flops_ceiling(flops),
        ceiling_name=CEILING_NAME,
        tolerance=TOLERANCE,
    )


SPEC = Spec(
    name="attention",
    title="Attention B×H×N×D, fp16 (TFLOP/s, ceiling = cuBLAS GEMM of the same FLOPs)",
    workloads=[
        _workload(128, causal=False),
        _workload(64, causal=False),
        _workload(128, causal=True),
        _workload(64, causal=True),
        _workload(128, causal=True, backward=True),
        _workload(64, causal=True, backward=True),
    ],
)
