"""Drop-in ``torch.nn`` modules over the Triton ops.

Each module keeps PyTorch's constructor signature and parameter names, so swapping the import is
the whole migration (a ``torch.nn.LayerNorm`` or ``torch.nn.Linear`` state_dict loads as is). The
modules hold parameters and call the functional op; the kernels live in :mod:`triton_workshop.ops`.

* :class:`LayerNorm`, :class:`Softmax`, :class:`Linear`: drop-ins for their ``torch.nn`` namesakes
  (``Linear`` adds an optional fused activation). LayerNorm and Softmax subclass theirs; Linear
  does not: with an activation it computes more than a ``torch.nn.Linear``, and code that finds
  Linears by ``isinstance`` to rewrite them (quantisation, adapters) would drop it.
* :class:`LayerNormLinear`: ``LayerNorm`` then ``Linear`` in one op that never writes the
  normalised activations (:mod:`triton_workshop.ops.layer_norm_linear`).
* :class:`MultiheadSelfAttention`: fused QKV projection, fused attention, output projection.
* :class:`MultiheadAttention`: a drop-in for ``torch.nn.MultiheadAttention`` (its state_dict,
  forward signature and return value) over the same ops.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..ops.attention import attention
from ..ops.layer_norm import layer_norm
from ..ops.layer_norm_linear import layer_norm_linear
from ..ops.matmul import check_activation, linear
from ..ops.softmax import softmax, softmax_forward


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` computed by :func:`triton_workshop.ops.layer_norm.layer_norm`.

    A subclass that replaces only ``forward``: the constructor, parameters, initialisation and
    ``extra_repr`` are torch's, and a patched model's norms still answer
    ``isinstance(module, torch.nn.LayerNorm)`` (the test that training code uses to keep norms
    out of weight decay, or a wrapping policy to find them)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class Softmax(nn.Softmax):
    """``torch.nn.Softmax`` computed by :func:`triton_workshop.ops.softmax.softmax` (a subclass
    that replaces ``forward``; ``dim`` defaults to the last dimension, where torch's ``None``
    picks one with a deprecation warning)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__(dim)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return softmax(input, self.dim)


def _reset_linear_parameters(weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``torch.nn.Linear.reset_parameters``, step for step (the same random draws in the same
    order, so a seeded model initialises identically with either module)."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(bias, -bound, bound)


class Linear(nn.Module):
    """``torch.nn.Linear`` computed by :func:`triton_workshop.ops.matmul.linear`, plus an optional
    fused activation (``None``, ``"relu"``, ``"leaky_relu"`` with ``leaky_relu_slope``, or
    ``"gelu"``, tanh approximation) applied in the matmul's epilogue.

    Same parameters (``weight`` (out, in), ``bias`` (out,)), same initialisation, and a
    ``torch.nn.Linear`` state_dict loads as is. ``input`` (..., in_features) must have the
    weight's dtype (fp16, bf16 or fp32) and live where the kernels run; under ``torch.autocast``
    both are cast to the autocast dtype first, as ``torch.nn.Linear``'s are.
    """

    __constants__ = ["in_features", "out_features", "activation", "leaky_relu_slope"]

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        activation: str | None = None,
        leaky_relu_slope: float = 0.01,
    ) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        check_activation(activation, leaky_relu_slope)
        self.in_features = in_features
        self.out_features = out_features
        self.activation = activation
        self.leaky_relu_slope = float(leaky_relu_slope)
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory_kwargs))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory_kwargs))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_linear_parameters(self.weight, self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(
            input, self.weight, self.bias, self.activation, leaky_relu_slope=self.leaky_relu_slope
        )

    def extra_repr(self) -> str:
        text = (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )
        if self.activation is not None:
            text += f", activation={self.activation!r}"
            if self.activation == "leaky_relu":
                text += f", leaky_relu_slope={self.leaky_relu_slope}"
        return text


class LayerNormLinear(nn.Module):
    """``nn.LayerNorm(in_features, eps)`` followed by ``nn.Linear(in_features, out_features,
    bias)``, computed by :func:`triton_workshop.ops.layer_norm_linear.layer_norm_linear` without
    writing the normalised activations to memory.

    Parameters: ``ln_weight`` (ones) and ``ln_bias`` (zeros) of shape (in_features,), ``weight``
    (out, in) and ``bias`` (out,) initialised like ``nn.Linear``. :meth:`from_modules` builds one
    from an existing LayerNorm and Linear pair (a LayerNorm without affine parameters, or a Linear
    without bias, gives ``None`` for those parameters).
    """

    __constants__ = ["in_features", "out_features", "eps"]

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        eps: float = 1e-5,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory_kwargs = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.eps = eps
        self.ln_weight = nn.Parameter(torch.empty(in_features, **factory_kwargs))
        self.ln_bias = nn.Parameter(torch.empty(in_features, **factory_kwargs))
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory_kwargs))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory_kwargs))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.ln_weight is not None:
            nn.init.ones_(self.ln_weight)
        if self.ln_bias is not None:
            nn.init.zeros_(self.ln_bias)
        _reset_linear_parameters(self.weight, self.bias)

    @classmethod
    def from_modules(cls, layer_norm: nn.Module, linear: nn.Module) -> "LayerNormLinear":
        """A LayerNormLinear with copies of the parameters of ``layer_norm`` (a
        ``torch.nn.LayerNorm`` or :class:`LayerNorm` over the last dimension) and ``linear`` (a
        ``torch.nn.Linear`` or :class:`Linear` without activation), on ``linear``'s device and
        dtype."""
        shape = tuple(layer_norm.normalized_shape)
        in_features, out_features = linear.in_features, linear.out_features
        if shape != (in_features,):
            raise ValueError(
                f"layer_norm normalises over {shape} but linear has in_features={in_features}: "
                "LayerNormLinear needs normalized_shape == (in_features,)"
            )
        if getattr(linear, "activation", None) is not None:
            raise ValueError("linear has an activation; LayerNormLinear has none")
        weight = linear.weight
        module = cls(
            in_features, out_features, bias=linear.bias is not None, eps=layer_norm.eps,
            device=weight.device, dtype=weight.dtype,
        )  # fmt: skip
        with torch.no_grad():
            for name, source in (("ln_weight", layer_norm.weight), ("ln_bias", layer_norm.bias)):
                if source is None:
                    module.register_parameter(name, None)
                else:
                    getattr(module, name).copy_(source)
            module.weight.copy_(weight)
            if linear.bias is not None:
                module.bias.copy_(linear.bias)
        return module

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm_linear(
            input, self.ln_weight, self.ln_bias, self.weight, self.bias, self.eps
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, eps={self.eps}"
        )


class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention over (B, N, E) inputs, with :func:`triton_workshop.attention`.

    ``qkv_proj`` is one fused :class:`Linear` from E to ``E + 2·E_kv`` (``E_kv = num_kv_heads ·
    head_dim``; rows ``[q; k; v]``), so the three projections are one matmul. Its output is split
    and reshaped into q (B, H, N, D), k and v (B, H_kv, N, D) as *views* (the attention kernel reads
    strided inputs in place), attended with ``causal`` as SDPA's ``is_causal``, and projected back
    by ``out_proj`` (E to E). ``num_kv_heads`` < ``num_heads`` is grouped-query attention (it must
    divide ``num_heads``; 1 is multi-query attention).

    **Against torch.nn.MultiheadAttention.** With ``num_kv_heads=None`` this computes
    ``nn.MultiheadAttention(E, H, bias=bias, batch_first=True)(x, x, x, need_weights=False)[0]``
    (and with ``causal=True``, the same with ``is_causal=True`` and a causal ``attn_mask``):
    ``in_proj_weight``/``in_proj_bias`` are ``qkv_proj.weight``/``qkv_proj.bias`` (same
    ``[q; k; v]`` row order) and ``out_proj`` has the same names. :meth:`from_torch` copies them.
    Not supported: separate query/key/value inputs (self-attention only), ``batch_first=False``
    (pass ``x.transpose(0, 1)``), ``attn_mask``/``key_padding_mask``, dropout, ``add_bias_kv``,
    ``add_zero_attn``, returning attention weights. Fresh parameters are initialised like two
    ``nn.Linear`` layers (``nn.MultiheadAttention`` uses Xavier weights and zero biases).

    **Swapping SDPA in an existing model.** In a model that already builds q, k, v of shape
    (B, H, N, D) itself, replace only the call::

        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)           # before
        out = triton_workshop.attention(q, k, v, causal=True)                    # after

    (``scale=`` carries over; K/V with fewer heads work as with ``enable_gqa=True``; models that
    pass ``attn_mask`` or ``dropout_p`` keep SDPA). Or swap the whole block for this module and
    load its weights with :meth:`from_torch` or by renaming state_dict keys.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        bias: bool = True,
        causal: bool = False,
        num_kv_heads: int | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads <= 0 or embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}) > 0"
            )
        if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads ({num_kv_heads}) must be > 0 and divide num_heads ({num_heads})"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        kv_dim = num_kv_heads * self.head_dim
        self.qkv_proj = Linear(embed_dim, embed_dim + 2 * kv_dim, bias, device, dtype)
        self.out_proj = Linear(embed_dim, embed_dim, bias, device, dtype)

    @classmethod
    def from_torch(
        cls, mha: nn.MultiheadAttention, causal: bool = False
    ) -> "MultiheadSelfAttention":
        """This module with the weights of a ``torch.nn.MultiheadAttention`` (packed in-projection,
        no bias_k/bias_v). It computes ``mha(x, x, x, need_weights=False)[0]`` for batch-first
        ``x``, whatever ``mha.batch_first`` was."""
        if not mha._qkv_same_embed_dim or mha.bias_k is not None:
            raise ValueError("from_torch needs a packed in_proj_weight and no add_bias_kv")
        weight = mha.in_proj_weight
        module = cls(
            mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None, causal=causal,
            device=weight.device, dtype=weight.dtype,
        )  # fmt: skip
        with torch.no_grad():
            module.qkv_proj.weight.copy_(weight)
            module.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                module.qkv_proj.bias.copy_(mha.in_proj_bias)
                module.out_proj.bias.copy_(mha.out_proj.bias)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be (batch, seq, embed_dim={self.embed_dim}), got {shape}")
        batch, seq, _ = x.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        # (B, N, H + 2 H_kv, D): one projection, then views; nothing is copied before attention.
        qkv = self.qkv_proj(x).view(batch, seq, heads + 2 * kv_heads, self.head_dim)
        q = qkv[:, :, :heads].transpose(1, 2)
        k = qkv[:, :, heads : heads + kv_heads].transpose(1, 2)
        v = qkv[:, :, heads + kv_heads :].transpose(1, 2)
        out = attention(q, k, v, causal=self.causal)  # (B, H, N, D)
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq, self.embed_dim))

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, causal={self.causal}"
        )


def _runs_its_own_forward(module: nn.Module, args) -> None:
    """A forward pre-hook that changes nothing: being there is its job (see
    :func:`keep_off_fused_encoder_path`)."""
    return None


def keep_off_fused_encoder_path(module: nn.Module) -> nn.Module:
    """Make ``torch.nn.TransformerEncoderLayer`` call ``module``, its ``self_attn``, in eval mode.

    In eval mode under ``no_grad`` the layer takes torch's fused path
    (``torch._transformer_encoder_layer_fwd``), which reads ``self_attn.in_proj_weight`` and the
    other parameters itself and never calls ``self_attn``: a drop-in there would be bypassed
    silently. torch leaves that path when any of the layer's modules has a forward hook or
    pre-hook, since the fused path would skip those too (the ``why_not_sparsity_fast_path``
    checks of ``TransformerEncoderLayer.forward``); a pre-hook that changes nothing is therefore
    what keeps the module called, at the cost of a hook call per forward. Idempotent. Run by
    :class:`MultiheadAttention`'s ``__init__`` and ``train``/``eval``; code that gives a module
    this class without its ``__init__`` (an in-place swap) calls it too."""
    if not any(hook is _runs_its_own_forward for hook in module._forward_pre_hooks.values()):
        module.register_forward_pre_hook(_runs_its_own_forward)
    return module


class MultiheadAttention(nn.Module):
    """Drop-in for ``torch.nn.MultiheadAttention``: same constructor, parameter names
    (``in_proj_weight``, ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias``, so its
    state_dict loads as is), initialisation, ``forward`` signature and return value, with the
    projections through :class:`Linear`'s matmul and attention through
    :func:`triton_workshop.attention` (nothing N×N is materialised unless weights are asked for).

    Self-attention (``query is key is value``) projects q, k, v with one matmul; cross-attention
    (other keys/values, any source length) with three. Inputs are (L, N, E), or (N, L, E) with
    ``batch_first=True``, or unbatched (L, E).

    ``need_weights=True`` (torch's default) also returns the attention weights, (N, L, S) averaged
    over heads or (N, H, L, S), which this computes separately with PyTorch (an N×N tensor per
    head, as torch does): pass ``need_weights=False`` for the fused path alone.
    ``is_causal=True`` applies the causal mask (key j hidden from query i when j > i, as
    ``F.scaled_dot_product_attention``); ``attn_mask`` may accompany it as torch's hint, and is
    then taken to be that causal mask (its values are not read). A bool ``key_padding_mask``
    ((N, S), True for a padding key) and ``dropout`` while training run in the kernel (dropout
    with ``need_weights=False``: torch returns the weights its dropout was applied to); a batch
    element whose keys are all padding gives the out-projection of zeros, as torch's training
    path does. Not supported, with a ``ValueError``: float key padding masks, other
    ``attn_mask``\\ s, ``add_bias_kv``, ``add_zero_attn``, ``kdim``/``vdim`` other than
    ``embed_dim``.

    Under ``torch.autocast`` it computes as torch's module does: projections and attention in
    the autocast dtype, weights (``need_weights``) in the dtype torch's softmax gives. As the
    ``self_attn`` of a ``torch.nn.TransformerEncoderLayer`` it is always called, eval mode and
    ``no_grad`` included: torch's fused inference path, which would bypass it, is kept off (see
    :func:`keep_off_fused_encoder_path`).
    """

    __constants__ = ["batch_first"]

    #: True: the projections are ``F.linear`` (cuBLAS) instead of :func:`linear`, as
    #: :func:`~triton_workshop.nn.patch` sets them unless asked for every Linear: nothing is
    #: fused into them, and torch's call costs less host time.
    cublas_projections: bool = False

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}), both > 0"
            )
        if add_bias_kv or add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        if kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise ValueError(f"kdim and vdim must equal embed_dim ({embed_dim}), got {kdim}, {vdim}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout must be in [0, 1], got {dropout}")
        factory_kwargs = {"device": device, "dtype": dtype}
        self.embed_dim = self.kdim = self.vdim = embed_dim
        self._qkv_same_embed_dim = True
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.in_proj_weight = nn.Parameter(torch.empty((3 * embed_dim, embed_dim), **factory_kwargs))
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory_kwargs))
        else:
            self.register_parameter("in_proj_bias", None)
        # Created after in_proj, as torch does: the same random draws in the same order.
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, **factory_kwargs)
        # torch's attributes for the unsupported options, which code around the module reads
        # (nn.TransformerEncoderLayer, for one).
        self.register_parameter("q_proj_weight", None)
        self.register_parameter("k_proj_weight", None)
        self.register_parameter("v_proj_weight", None)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()
        keep_off_fused_encoder_path(self)

    # torch's, for code that calls it on any self_attn (the encoder fast path no longer reaches
    # this module: see keep_off_fused_encoder_path).
    merge_masks = nn.MultiheadAttention.merge_masks

    def train(self, mode: bool = True):
        # eval() is how a TransformerEncoderLayer becomes eligible for torch's fused path: make
        # sure the guard is there then, also on an instance made without __init__.
        keep_off_fused_encoder_path(self)
        return super().train(mode)

    def _reset_parameters(self) -> None:
        """``torch.nn.MultiheadAttention._reset_parameters``: Xavier in-projection, zero biases."""
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)

    def _check(self, query, key, value, key_padding_mask, attn_mask, is_causal,
               need_weights=False) -> None:
        if any(isinstance(t, torch.Tensor) and t.is_nested for t in (query, key, value)):
            raise ValueError(
                "nested tensors are not supported (torch.nn.TransformerEncoder makes them from a "
                "src_key_padding_mask in eval mode: build it with enable_nested_tensor=False, or "
                "use torch's MultiheadAttention with padding masks)"
            )
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor) or t.dim() not in (2, 3) or t.shape[-1] != self.embed_dim:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"{name} must be (L, E), (L, N, E) or (N, L, E) with E = embed_dim "
                    f"({self.embed_dim}), got {shape}"
                )
        batch_dim = 0 if self.batch_first else 1
        if (not (query.dim() == key.dim() == value.dim()) or key.shape != value.shape
                or (query.dim() == 3 and query.shape[batch_dim] != key.shape[batch_dim])):
            raise ValueError(
                f"key and value must have one shape, and query their rank and batch size, got "
                f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
                f" (batch_first={self.batch_first})"
            )
        if key_padding_mask is not None:
            keys = key.shape[0] if query.dim() == 2 or not self.batch_first else key.shape[1]
            want = (keys,) if query.dim() == 2 else (key.shape[batch_dim], keys)
            if (not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool
                    or tuple(key_padding_mask.shape) != want):
                got = (f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
                       if isinstance(key_padding_mask, torch.Tensor) else type(key_padding_mask).__name__)
                raise ValueError(f"key_padding_mask must be a bool tensor of shape {want} (True: a "
                                 f"padding key, ignored), got {got}; float masks need torch's module")
        if attn_mask is not None and not is_causal:
            raise ValueError(
                "attn_mask is supported only as the causal hint (with is_causal=True); "
                "other masks need torch.nn.MultiheadAttention"
            )
        if self.training and self.dropout > 0.0 and need_weights:
            raise ValueError(
                f"dropout ({self.dropout}) while training with need_weights=True: torch returns the "
                "weights its dropout was applied to; pass need_weights=False, or use .eval()"
            )

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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._check(query, key, value, key_padding_mask, attn_mask, is_causal, need_weights)
        self_attention = query is key and key is value
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        elif not self.batch_first:  # (L, N, E) -> (N, L, E): views, read in place
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        batch, tgt_len, embed = query.shape
        src_len = key.shape[1]
        heads, head_dim = self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        project = F.linear if self.cublas_projections else linear

        def heads_of(t, length):  # (N, L, E) -> (N, H, L, D), a view
            return t.reshape(batch, length, heads, head_dim).transpose(1, 2)

        if self_attention:
            qkv = project(query, w, b).view(batch, tgt_len, 3, heads, head_dim)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        else:
            bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
            wq, wk, wv = w.chunk(3)
            q = heads_of(project(query, wq, bq), tgt_len)
            k = heads_of(project(key, wk, bk), src_len)
            v = heads_of(project(value, wv, bv), src_len)
        # torch's key_padding_mask is True for a padding key, the kernel's for a key it may see.
        keep = None if key_padding_mask is None else ~key_padding_mask.reshape(batch, src_len)
        out = attention(q, k, v, causal=is_causal, key_padding_mask=keep,
                        dropout_p=self.dropout if self.training else 0.0)  # (N, H, L, D)
        out = self.out_proj(out.transpose(1, 2).reshape(batch, tgt_len, embed))
        weights = None
        if need_weights:
            weights = self._weights(q, k, is_causal, average_attn_weights, keep)
            if unbatched:
                weights = weights.squeeze(0)
        if unbatched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1).contiguous()  # torch returns it contiguous (L, N, E)
        return out, weights

    def _weights(self, q, k, causal: bool, average: bool, keep=None) -> torch.Tensor:
        """softmax(q kᵀ / sqrt(D)) with PyTorch, (N, L, S) averaged over heads or (N, H, L, S)."""
        # In fp32 whatever the caller's autocast (which would compute the product in its low
        # precision); the result takes the dtype torch.softmax gives under it (see the return).
        with torch.autocast(q.device.type, enabled=False):
            scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        if causal:
            tgt_len, src_len = scores.shape[-2:]
            hidden = torch.ones(tgt_len, src_len, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(hidden, float("-inf"))
        if keep is not None:
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if average:
            weights = weights.mean(dim=1)
        # torch's MultiheadAttention returns its softmax's output: under autocast fp32 where
        # torch.softmax is on the fp32 list (CUDA), else the dtype of the scores (q's).
        return weights.to(softmax_forward.autocast_policy.dtype_for(q.device.type) or q.dtype)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
