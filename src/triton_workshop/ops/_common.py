"""What several op families share: dtype sets, the checking of a ``dim`` argument, the shapes
and checks of the normalisations over trailing dims (layer_norm, rms_norm), the cache of checked
call signatures, and the shared memory of a pipelined GEMM config."""

from __future__ import annotations

import math
import numbers
import operator
import sys
import types
from typing import Callable

import torch

from .. import runtime
from ..runtime import FLOAT_DTYPES

#: The float dtypes of the row-wise ops (softmax, layer_norm): fp64 too, computed in fp64.
FLOAT_DTYPES_WITH_FP64 = FLOAT_DTYPES + (torch.float64,)


class DimError(ValueError, IndexError):
    """``dim`` out of range: a ``ValueError`` like every bad argument here, and an ``IndexError``
    like PyTorch raises (the same double parentage as numpy's ``AxisError``)."""


def normalize_dim(dim, ndim: int, name: str = "dim") -> int:
    """``dim`` as an index in ``[0, ndim)``, accepting negatives like PyTorch; a 0-d tensor has
    one position (``dim`` 0 or -1)."""
    if isinstance(dim, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}") from None
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise DimError(f"{name} must be in [{-size}, {size - 1}] for a {ndim}-d tensor, got {dim}")
    return dim % size


def gemm_shared_memory_bytes(config, element_size: int) -> int:
    """Shared memory a software-pipelined GEMM config (``BLOCK_M``, ``BLOCK_N``, ``BLOCK_K``,
    ``num_stages``) keeps: one A and one B slice per stage. Config pruning compares it with
    :func:`runtime.shared_memory_limit` (a config over it fails to launch)."""
    kw = config.kwargs
    return config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * element_size


# --------------------------------------------------------------------------------------------
# Call signatures: a public function checks its arguments once per signature.
# --------------------------------------------------------------------------------------------
#: Whether torch.compile is tracing now: then checks run as written (sizes may be symbolic, and
#: the tracer sees them) and no signature is looked up or remembered.
is_compiling = torch.compiler.is_compiling


#: What a key that cannot be built raises: the call is then checked in full, unremembered.
UNKEYABLE = (AttributeError, TypeError, RuntimeError)


def layout_key(t):
    """What an argument check reads from a tensor (shape, dtype, device, layout; not the
    strides), as a hashable key; None for None. Raises one of :data:`UNKEYABLE` where ``t`` is
    no tensor or a tensor without a plain shape (a nested one)."""
    if t is None:
        return None
    return (t.shape, t.dtype, t.device, t.layout)


def shape_key(normalized_shape):
    """``normalized_shape`` as a key: an int, or a tuple of ints (exactly ``int``: a bool or
    another integral type takes the full check). Raises TypeError otherwise."""
    if type(normalized_shape) is int:
        return normalized_shape
    if type(normalized_shape) in (tuple, list, torch.Size):
        if len(normalized_shape) == 1 and type(normalized_shape[0]) is int:
            return (normalized_shape[0],)
        if all(type(d) is int for d in normalized_shape):
            return tuple(normalized_shape)
    raise TypeError("normalized_shape has no key")


class SignatureCache(dict):
    """What was worked out once per call signature: a public function's checks (keys built from
    :func:`layout_key` and the other arguments, values what the checks concluded; only checks
    that passed are kept) or a launcher's plans by the layouts of its tensors. Every step of a
    training loop calls each op with the same few signatures, and on a slow host the checks and
    the planning cost as much as a launch. Bounded: past ``maxsize`` entries it starts over."""

    def __init__(self, maxsize: int = 1024):
        super().__init__()
        self.maxsize = maxsize
        #: The tuning object the entries were worked out under (see :meth:`under`).
        self.tuning = None

    def under(self, tuning) -> "SignatureCache":
        """This cache, emptied first if its entries were worked out under another tuning object
        than ``tuning``: a launcher's plans keyed without the tuning (hashing a dataclass costs
        more than the rest of the key) are still never stale when a test replaces it."""
        if tuning is not self.tuning:
            self.clear()
            self.tuning = tuning
        return self

    def checked(self, key_of: Callable, check: Callable, *args):
        """``check(*args)`` (the checks, which raise on a bad argument, and what they conclude),
        run once per key ``key_of(*args)``; every call while torch.compile traces, and every
        call whose arguments have no key (:data:`UNKEYABLE`)."""
        if is_compiling():
            return check(*args)
        try:
            key = key_of(*args)
            value = self.get(key)
        except UNKEYABLE:
            return check(*args)
        if value is None:
            value = self.remember(key, check(*args))
        return value

    def remember(self, key, value):
        """``value``, kept under ``key`` (None: not kept, the call had no key)."""
        if key is not None:
            if len(self) >= self.maxsize:
                self.clear()
            self[key] = value
        return value

    def found(self, tuning, key, make: Callable):
        """What ``make()`` works out for ``key`` (a launcher's plan), made once under ``tuning``
        and kept (None too); made again on every call whose key cannot be hashed (symbolic
        sizes: torch.compile with dynamic shapes)."""
        try:
            value = self.under(tuning).get(key, _MISSING)
        except TypeError:
            return make()
        if value is _MISSING:
            value = self.remember(key, make())
        return value


_MISSING = object()


# --------------------------------------------------------------------------------------------
# Normalisations over trailing dims (layer_norm, rms_norm).
# --------------------------------------------------------------------------------------------
def rows_cols(x: torch.Tensor, norm_ndim: int) -> tuple[int, int]:
    """``(rows, columns)`` of ``x`` normalised over its last ``norm_ndim`` dims."""
    shape = x.shape
    if norm_ndim == 1 and shape[-1]:  # the common case, without slicing the shape twice
        return x.numel() // shape[-1], shape[-1]
    return math.prod(shape[: len(shape) - norm_ndim]), math.prod(shape[len(shape) - norm_ndim :])


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The statistics (mean, rstd) and the partial sums are kept in the kernels' arithmetic
    type: fp64 for fp64 rows, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_normalized_shape(normalized_shape, x: torch.Tensor) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of ints, checked against the trailing dims of ``x``."""
    # Fast path (every training step calls this): one int, or a 1-tuple/list of an int, equal to
    # the last dimension.
    if type(normalized_shape) is int:
        shape = (normalized_shape,)
    elif type(normalized_shape) in (tuple, list, torch.Size) and len(normalized_shape) == 1 \
            and type(normalized_shape[0]) is int:
        shape = (normalized_shape[0],)
    else:
        shape = None
    if shape is not None and x.dim() >= 1 and x.shape[-1] == shape[0]:
        return shape
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        shape = (int(normalized_shape),)
    elif isinstance(normalized_shape, (tuple, list, torch.Size)) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in normalized_shape
    ):
        shape = tuple(int(d) for d in normalized_shape)
    else:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        )
    if not shape:
        raise ValueError("normalized_shape must name at least one dimension, got ()")
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise ValueError(
            f"normalized_shape {list(shape)} must match the trailing dimensions of x, "
            f"got x of shape {tuple(x.shape)}"
        )
    return shape


def check_norm_param(t, name: str, shape: tuple[int, ...]) -> None:
    """An optional weight or bias of a normalisation: a float tensor of ``normalized_shape``."""
    if t is None:
        return
    runtime.check_tensor(t, name, dtypes=FLOAT_DTYPES_WITH_FP64)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape normalized_shape {shape}, got {tuple(t.shape)}")


def dropout_seed(device: torch.device) -> torch.Tensor:
    """The seed of one call's dropout mask (Philox's in linear's epilogue, the index hash's in
    attention), drawn from torch's default generator of ``device`` (the CUDA generator on a
    GPU), so that ``torch.manual_seed`` repeats a run. One int64 on the device: the kernels read
    it there (no host sync, traceable)."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


class FamilyPackage(types.ModuleType):
    """A family package whose names are its modules' too: a name set on the package (its
    ``TUNING``, a test's monkeypatch) is set in each of the family's modules that holds it (under
    its new name, for a name the package keeps from before a split), so it takes effect at the
    next call wherever it is read. :func:`join_family` makes a package one."""

    family_parts: tuple = ()
    family_renamed: dict = {}

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        name = self.family_renamed.get(name, name)
        for part in self.family_parts:
            if name in vars(part):
                setattr(part, name, value)


def join_family(package: str, parts: tuple, renamed: dict | None = None,
                base: type = FamilyPackage) -> None:
    """Make the module named ``package`` a :class:`FamilyPackage` (or ``base``, a subclass of
    it) over its modules ``parts``; ``renamed`` maps a name the package keeps to the name its
    module now uses."""
    family = type(f"{package.rpartition('.')[2]}_family", (base,),
                  {"family_parts": tuple(parts), "family_renamed": dict(renamed or {})})
    sys.modules[package].__class__ = family
