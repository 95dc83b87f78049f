"""Rotary position embedding benchmarks: q and k of a Llama-3-8B attention block (32 query heads,
8 key/value heads, head_dim 128) rotated in bf16, batch x tokens swept.

The inputs are laid out as transformers' models pass them: the projections' ``(batch, tokens,
heads, head_dim)`` transposed to ``(batch, heads, tokens, head_dim)``, and ``cos``/``sin`` of
shape ``(batch, tokens, head_dim)``. Eager PyTorch runs transformers' formula as several kernels
per tensor (``rotate_half``'s two slices and cat, two products, a sum). Each candidate returns
``(q_rotated, k_rotated)``. Bytes counted, the minimum a fused implementation must move (``T``
tokens, ``Hq``/``Hk`` heads of ``D`` lanes; cos/sin read once per token):

* forward: q, k read and written, cos, sin read: ``(2·T·(Hq + Hk)·D + 2·T·D)·itemsize``;
* forward + backward: the forward, then the outputs' gradients read, q's and k's written, cos,
  sin read again: ``(4·T·(Hq + Hk)·D + 4·T·D)·itemsize``.
"""

from __future__ import annotations

import torch

from ..ops.rope import rope
from .spec import GBPS, Spec, Workload, liger

#: (batch, tokens, q heads, kv heads, head_dim): Llama-3-8B's heads, batch x tokens swept.
SIZES = tuple((batch, tokens, 32, 8, 128) for batch, tokens in ((1, 2048), (4, 2048), (4, 4096),
                                                                (8, 4096)))
HEADLINE = (4, 4096, 32, 8, 128)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_eager(q, k, cos, sin):
    """transformers' ``apply_rotary_pos_emb`` (Llama), unsqueeze_dim=1."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _inputs(requires_grad: bool):
    def make(size, dtype, device):
        batch, tokens, q_heads, kv_heads, head_dim = size
        q, k = (torch.randn(batch, tokens, heads, head_dim, dtype=dtype, device=device)
                .transpose(1, 2).requires_grad_(requires_grad) for heads in (q_heads, kv_heads))
        positions = torch.arange(tokens, device=device, dtype=torch.float32).expand(batch, -1)
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=device,
                                                    dtype=torch.float32) / head_dim))
        freqs = positions[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return q, k, emb.cos().to(dtype), emb.sin().to(dtype)

    return make


def _bytes(passes: int):
    def count(size, dtype) -> int:
        batch, tokens, q_heads, kv_heads, head_dim = size
        n = batch * tokens
        return passes * (n * (q_heads + kv_heads) * head_dim + n * head_dim) * dtype.itemsize

    return count


def _liger_rope():
    apply = liger("liger_kernel.ops.rope", "LigerRopeFunction")()
    # Newer releases also return cos and sin. Liger rotates a contiguous (batch, tokens, heads,
    # head_dim) layout in place: with transformers' transposed views, the inputs themselves.
    return lambda q, k, cos, sin: tuple(apply(q, k, cos, sin)[:2])


class RopeWorkload(Workload):
    def shrink(self, size, target: int = 4096):
        """A few tokens of a few heads: the interpreter runs one program per token, slowly, so
        the CPU check takes 16 tokens rather than the ~1000 an even shrink would leave."""
        batch, tokens, q_heads, kv_heads, head_dim = size
        return (min(batch, 2), min(tokens, 8), min(q_heads, 4), min(kv_heads, 2),
                min(head_dim, 16))


def _workload(backward: bool) -> Workload:
    return RopeWorkload(
        name="rope fwd+bwd" if backward else "rope fwd",
        dtype=torch.bfloat16,
        unit=GBPS,
        sizes=SIZES,
        quick=(HEADLINE,),
        headlines=(HEADLINE,),
        make_inputs=_inputs(backward),
        work=_bytes(4 if backward else 2),
        work_formula=(
            "bytes = (4·T·(Hq + Hk)·D + 4·T·D)·itemsize (fwd: q, k read and written, cos, sin "
            "read; bwd: dq_out, dk_out read, dq, dk written, cos, sin read)"
            if backward
            else "bytes = (2·T·(Hq + Hk)·D + 2·T·D)·itemsize (q, k read and written, cos, sin read)"
        ),
        ours=lambda q, k, cos, sin: rope(q, k, cos, sin),
        reference=rope_eager,
        optional_peers={"Liger-Kernel": _liger_rope},
        backward=backward,
    )


SPEC = Spec(
    name="rope",
    title="Rotary position embedding, q and k (bf16, 32 q / 8 kv heads of 128, tokens swept)",
    workloads=[_workload(backward=False), _workload(backward=True)],
)
