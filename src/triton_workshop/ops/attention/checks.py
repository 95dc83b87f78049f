"""The attention family's argument checks, each a TypeError or ValueError naming the argument and
run once per call signature (``SignatureCache``): the public function's (:func:`check_public`;
for packed sequences :func:`check_cu_seqlens` and :func:`longest_sequence`), and the registered
ops' own (:func:`check_op_inputs`, :func:`check_saved`), which can be called directly
(``torch.ops.triton_workshop.attention_forward``) and must not launch on bad input.
"""

from __future__ import annotations

import math
import numbers

import torch

from ... import runtime
from ...runtime import FLOAT_DTYPES
from .._common import SignatureCache, layout_key
from .features import MAX_HEAD_DIM, Features, lse_shape


# --------------------------------------------------------------------------------------------
# The public function's checks: (B, H, N, D) or (H, N, D) inputs; packed sequences.
# --------------------------------------------------------------------------------------------
def check_scale(scale, *, allow_none: bool) -> None:
    if scale is None and allow_none:
        return
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")


def _check_int(value, name: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_qkv(q, k, v, *, ndims=(3, 4)) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES, ndim=ndims)
    runtime.check_same_dtype(q=q, k=k, v=v)
    runtime.check_same_device(q=q, k=k, v=v)
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(
                f"{name} must have as many dimensions as q ({q.dim()}), got shape {tuple(t.shape)}"
            )
    if q.dim() == 4:
        for name, t in (("k", k), ("v", v)):
            if t.shape[0] != q.shape[0]:
                raise ValueError(
                    f"{name} has batch size {t.shape[0]} but q has {q.shape[0]}: they must match"
                )
    head_dim = q.shape[-1]
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != head_dim:
            raise ValueError(
                f"{name} has head dim {t.shape[-1]} but q has {head_dim}: they must match"
            )
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"q has head dim {head_dim}; supported head dims are 1 to {MAX_HEAD_DIM} "
            "(any size: non-powers of two are padded)"
        )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v has sequence length {v.shape[-2]} but k has {k.shape[-2]}: they must match"
        )
    if v.shape[-3] != k.shape[-3]:
        raise ValueError(f"v has {v.shape[-3]} heads but k has {k.shape[-3]}: they must match")
    n_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_kv_heads == 0 and n_heads != 0 or n_kv_heads != 0 and n_heads % n_kv_heads != 0:
        raise ValueError(
            f"q has {n_heads} heads, which is not a multiple of k's {n_kv_heads} heads "
            "(grouped-query attention needs H divisible by H_kv)"
        )


def check_features(q, k, key_padding_mask, window, softcap, sinks, dropout_p) -> None:
    """The optional features' types, shapes and ranges, on (B, H, N, D) q and k."""
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor):
            raise TypeError(f"key_padding_mask must be a tensor or None, "
                            f"got {type(key_padding_mask).__name__}")
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be a bool tensor (True = attend), "
                            f"got {key_padding_mask.dtype}")
        want = (q.shape[0], k.shape[2])
        if tuple(key_padding_mask.shape) != want:
            raise ValueError(f"key_padding_mask must have shape (B, Nk) = {want}, "
                             f"got {tuple(key_padding_mask.shape)}")
        runtime.check_same_device(q=q, key_padding_mask=key_padding_mask)
    if window is not None:
        _check_int(window, "window", minimum=1)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap must be a float or None, got {type(softcap).__name__}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be a finite number > 0, got {softcap}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"sinks must be a tensor or None, got {type(sinks).__name__}")
        runtime.check_tensor(sinks, "sinks", dtypes=FLOAT_DTYPES, ndim=1)
        if sinks.shape[0] != q.shape[1]:
            raise ValueError(f"sinks must have shape (H,) = ({q.shape[1]},), one logit per query "
                             f"head, got {tuple(sinks.shape)}")
        runtime.check_same_device(q=q, sinks=sinks)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")


def check_cu_seqlens(cu, name: str, q, *, like=None) -> None:
    """Type, dtype, shape and device of cumulative sequence offsets (not their values)."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with n_seqs + 1 >= 1 entries, "
                         f"got shape {tuple(cu.shape)}")
    if like is not None and cu.shape != like.shape:
        raise ValueError(f"{name} must have one entry per sequence as cu_seqlens does: "
                         f"{tuple(like.shape)}, got {tuple(cu.shape)}")
    runtime.check_same_device(**{"q": q, name: cu})


def longest_sequence(cu: torch.Tensor, name: str, total: int, max_seqlen, max_name: str) -> int:
    """Check the offsets' values (0 first, non-decreasing, ``total`` last) and ``max_seqlen``
    against them; return the longest sequence (``max_seqlen`` when given). Reads the offsets
    (one wait for the device) unless being traced by torch.compile, where ``max_seqlen`` must
    be given."""
    if max_seqlen is not None:
        _check_int(max_seqlen, max_name, minimum=0)
    if torch.compiler.is_compiling():
        if max_seqlen is None:
            raise ValueError(f"{max_name} must be given under torch.compile")
        return int(max_seqlen)
    lengths = cu[1:] - cu[:-1]
    first, last = cu[0], cu[-1]
    summary = torch.stack([first, last, lengths.min(), lengths.max()]) if lengths.numel() else (
        torch.stack([first, last, first * 0, first * 0]))
    first, last, shortest, longest = summary.tolist()
    if first != 0 or shortest < 0 or last != total:
        raise ValueError(f"{name} must start at 0, never decrease, and end at the number of "
                         f"rows ({total}); got first {first}, last {last}, "
                         f"{'a decrease' if shortest < 0 else 'no decrease'}")
    if max_seqlen is not None and max_seqlen < longest:
        raise ValueError(f"{max_name} is {max_seqlen} but {name} holds a sequence of {longest}")
    return int(longest if max_seqlen is None else max_seqlen)


def public_key(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
               dropout_p) -> tuple:
    """Everything :func:`check_public` reads."""
    return (layout_key(q), layout_key(k), layout_key(v), causal, type(causal), type(scale),
            layout_key(key_padding_mask), window, type(window), softcap, type(softcap),
            layout_key(sinks), dropout_p, type(dropout_p))


#: attention's checked call signatures (the value is only a mark: the checks passed).
PUBLIC_CALLS = SignatureCache()


def check_public(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                 dropout_p) -> bool:
    """attention's checks on its (B, H, N, D) or (H, N, D) arguments."""
    check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    check_scale(scale, allow_none=True)
    if q.dim() == 3:
        q, k = q[None], k[None]
        if isinstance(key_padding_mask, torch.Tensor):
            if key_padding_mask.dim() != 1:
                raise ValueError(f"key_padding_mask must have shape (Nk,) = ({k.shape[2]},) for "
                                 f"3-D inputs, got {tuple(key_padding_mask.shape)}")
            key_padding_mask = key_padding_mask[None]
    check_features(q, k, key_padding_mask, window, softcap, sinks, dropout_p)
    return True


# --------------------------------------------------------------------------------------------
# The registered ops' checks: (B, H, N, D) inputs, called directly or by the public function.
# --------------------------------------------------------------------------------------------
def check_op_inputs(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                    dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k) -> Features:  # fmt: skip
    """The public checks again, on (B, H, N, D) only (packed sequences: (1, H, total, D)): the
    registered ops can also be called directly (``torch.ops.triton_workshop.attention_forward``),
    and must not launch on bad input. The values inside ``cu_seqlens_*`` are the public
    function's to check (reading them waits for the device). Checked once per call signature
    (:data:`OP_CALLS`); the features are the call's own."""
    OP_CALLS.checked(_op_key, _check_op_args, q, k, v, causal, scale, key_padding_mask, window,
                     softcap, sinks, dropout_p, dropout_seed, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k)  # fmt: skip
    return Features(key_padding_mask, window, softcap, sinks, float(dropout_p), dropout_seed,
                    cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))


def _op_key(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks, dropout_p,
            dropout_seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> tuple:
    """Everything :func:`_check_op_args` reads (values where it checks a range, types where it
    checks a type)."""
    return (*public_key(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks,
                        dropout_p),
            layout_key(dropout_seed), layout_key(cu_seqlens_q), layout_key(cu_seqlens_k),
            max_seqlen_q, type(max_seqlen_q), max_seqlen_k, type(max_seqlen_k))  # fmt: skip


#: The registered ops' checked call signatures (the value is only a mark: the checks passed).
OP_CALLS = SignatureCache()


def _check_op_args(q, k, v, causal, scale, key_padding_mask, window, softcap, sinks, dropout_p,
                   dropout_seed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k) -> bool:  # fmt: skip
    check_qkv(q, k, v, ndims=(4,))
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    check_scale(scale, allow_none=False)
    check_features(q, k, key_padding_mask, window, softcap, sinks, dropout_p)
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    if cu_seqlens_q is not None:
        if q.shape[0] != 1:
            raise ValueError(f"with cu_seqlens, q must be (1, H, total, D), got {tuple(q.shape)}")
        check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q)
        check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q, like=cu_seqlens_q)
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            _check_int(value, name, minimum=0)
    if dropout_p > 0:
        if not isinstance(dropout_seed, torch.Tensor):
            raise TypeError("dropout_seed must be a tensor when dropout_p > 0")
        if dropout_seed.dtype != torch.int64 or dropout_seed.numel() != 1:
            raise ValueError("dropout_seed must hold one int64")
        runtime.check_same_device(q=q, dropout_seed=dropout_seed)
    return True


def saved_key(q, grad_out, out, lse) -> tuple:
    return ("backward", layout_key(q), layout_key(grad_out), layout_key(out), layout_key(lse),
            lse.is_contiguous())


def check_saved(q, grad_out, out, lse) -> bool:
    """The backward's own tensors: the incoming gradient and the forward's out and lse."""
    for name, t in (("grad_out", grad_out), ("out", out)):
        runtime.check_tensor(t, name, dtypes=(q.dtype,), ndim=4)
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
    runtime.check_tensor(lse, "lse", dtypes=(torch.float32,), ndim=3)
    if lse.shape != lse_shape(q) or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous {lse_shape(q)} tensor, got {tuple(lse.shape)}")
    runtime.check_same_device(q=q, grad_out=grad_out, out=out, lse=lse)
    return True
