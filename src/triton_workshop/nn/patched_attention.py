"""The attention ``patch`` swaps in: triton-workshop's, with torch's for the calls it cannot take.

:class:`PatchedMultiheadAttention` is :class:`triton_workshop.nn.MultiheadAttention` (the fused
kernel) for the calls that kernel computes, and ``torch.nn.MultiheadAttention.forward`` on the same
parameters for the rest (a float key padding mask, a mask other than the causal hint, a key padding
mask or dropout while training together with ``need_weights=True``), each reason said once per
module in a :class:`~.patch_report.PatchWarning`.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from . import modules as tw
from .patch_report import PatchWarning


class PatchedMultiheadAttention(tw.MultiheadAttention):
    """:class:`triton_workshop.nn.MultiheadAttention` that hands the calls its fused path cannot
    take to torch's own ``nn.MultiheadAttention.forward`` on the same parameters (a
    float ``key_padding_mask``, an ``attn_mask`` that is not the causal hint, a key padding mask or
    dropout while training with ``need_weights=True``), saying so once per module and reason in a
    :class:`PatchWarning`. The rest runs in Triton."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        reason = None
        if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
            reason = "a float key_padding_mask"
        elif key_padding_mask is not None and need_weights:
            # torch's weights path computes a batch element whose keys are all padding as NaN,
            # the kernel as zeros: identical results only without weights.
            reason = "a key_padding_mask with need_weights=True"
        elif attn_mask is not None and not is_causal:
            reason = "an attn_mask other than the causal hint"
        elif self.training and self.dropout > 0.0 and need_weights:
            reason = f"dropout={self.dropout} while training with need_weights=True"
        if reason is None:
            return super().forward(
                query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal,
            )  # fmt: skip
        self._warn_fallback(reason)
        return nn.MultiheadAttention.forward(
            self, query, key, value, key_padding_mask, need_weights, attn_mask,
            average_attn_weights, is_causal,
        )  # fmt: skip

    def _warn_fallback(self, reason: str) -> None:
        if torch.compiler.is_compiling():
            return
        warned = self.__dict__.setdefault("_fallback_warned", set())
        if reason not in warned:
            warned.add(reason)
            warnings.warn(
                f"MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}) got "
                f"{reason}: torch's MultiheadAttention computes these calls (the fused "
                "attention takes bool key padding masks, the causal mask and dropout, with "
                "need_weights=False)",
                PatchWarning,
                stacklevel=3,
            )
