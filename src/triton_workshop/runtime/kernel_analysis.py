"""Inductor's analysis of a Triton kernel launched in a compiled graph, done once per signature.

Under ``torch.compile`` every launch of a Triton kernel in the graph (``torch.library.wrap_triton``,
what a ``triton_op`` runs) is analysed to learn which of its tensors it writes: torch generates
the kernel's Triton IR from its source and walks it (``identify_accessed_tensors``,
``identify_mutated_tensors`` before torch 2.12). It does so for each launch site, and several
times per site (functionalisation, the graph's lowering, the IR node), so a model whose twelve
layers launch the same few kernels generates the same IR a hundred times, most of the compiled
first step's time beyond torch.compile's own (docs/results.md).

The analysis reads only the kernel, the dtypes of its tensor arguments, the values of its
constexprs and what Triton specialises its other arguments on (an int's divisibility by 16, its
being 1, its integer type): torch builds the IR from stand-in tensors (``torch.empty(2,
dtype=...)``) and stand-in sizes (2 for a symbolic one). :func:`install` keeps each result under that key, so each kernel
signature is analysed once a process. Arguments it cannot key soundly (a real tensor, whose
address alignment the IR specialises on; a value that cannot be hashed) go to torch every time.

``TRITON_WORKSHOP_KEEP_KERNEL_ANALYSIS=0`` leaves torch's functions as they are (for measuring
the difference, or should a torch release change what the analysis reads).
"""

from __future__ import annotations

import copy
import functools
import os

import torch

#: torch's analysis functions, newest name first (each takes ``(kernel, kwargs, tma_metadata)``).
FUNCTIONS = ("identify_accessed_tensors", "identify_mutated_tensors")

#: key -> (kernel, result): the kernel is kept so that its id (or its function's) is never
#: reused for another.
_RESULTS: dict = {}

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _int_class(value: int) -> tuple:
    """What Triton specialises an int argument on (not its value): 1, divisibility by 16, and the
    integer type its range takes (i32, u32, i64, u64; Triton's versions differ in which of these
    they use, so every boundary is kept)."""
    return ("int", value == 1, value % 16 == 0, value < -2**31, value < 2**31, value < 2**32,
            value < 2**63)


def _argument_key(value, constexpr: bool):
    """What the analysis reads of one argument, or None where it cannot be keyed soundly."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, FakeTensor):
        return ("tensor", value.dtype)
    if isinstance(value, torch.Tensor):
        return None  # a real tensor: its address's alignment is part of the IR's specialisation
    if type(value).__name__ == "TensorBox":  # Inductor's IR node: a stand-in tensor of its dtype
        return ("tensor", value.get_dtype())
    if isinstance(value, _SYMBOLIC) or type(value).__module__.startswith("sympy"):
        return ("symbolic",)
    if type(value) is int and not constexpr:  # an offset, a size: the IR sees its class only
        return _int_class(value)
    try:
        hash(value)
    except TypeError:
        return None
    return (type(value), value)


def _constexpr_names(kernel) -> frozenset | None:
    """The names of ``kernel``'s constexpr parameters (a JITFunction's, or an autotuner's
    function's), or None where it has none to read."""
    fn = kernel  # a JITFunction has them; an Autotuner (or Heuristics) wraps one as .fn
    while getattr(fn, "params", None) is None and hasattr(fn, "fn"):
        fn = fn.fn
    params = getattr(fn, "params", None)
    if params is None:
        return None
    return frozenset(p.name for p in params if p.is_constexpr)


def _kernel_key(kernel):
    """The kernel's part of the key. An autotuner counts as its function and its first config's
    arguments, all the analysis reads of it (torch analyses ``configs[0]``): torch.compile wraps
    a kernel launched with ``num_warps=`` in a new autotuner at each launch site, so its
    identity would never repeat."""
    from triton.runtime.autotuner import Autotuner

    if isinstance(kernel, Autotuner):
        configs = getattr(kernel, "configs", None) or ()
        first = tuple(sorted(configs[0].kwargs.items())) if configs else ()
        return ("autotuned", _kernel_key(kernel.fn), first)
    return id(kernel)


def signature_key(kernel, kwargs: dict, tma_metadata) -> tuple | None:
    """The key of one analysis, or None (not to be kept)."""
    constexprs = _constexpr_names(kernel)
    if constexprs is None:
        return None
    try:
        parts = [_kernel_key(kernel)]
        hash(parts[0])
    except (TypeError, AttributeError):
        return None
    for name, value in kwargs.items():
        part = _argument_key(value, name in constexprs)
        if part is None:
            return None
        parts.append((name, part))
    try:
        parts.append(repr(sorted(tma_metadata.items())) if tma_metadata else None)
    except (TypeError, AttributeError):
        return None
    return tuple(parts)


def _kept(analyse):
    # The parameters are named as torch's, so that a call by keyword reaches them too; a call
    # with anything else goes to torch as it is.
    @functools.wraps(analyse)
    def analyse_once(kernel, kwargs, tma_descriptor_metadata, *args, **options):
        key = None if args or options else signature_key(kernel, kwargs, tma_descriptor_metadata)
        if key is None:
            return analyse(kernel, kwargs, tma_descriptor_metadata, *args, **options)
        found = _RESULTS.get(key)
        if found is None:
            found = _RESULTS[key] = (kernel, analyse(kernel, kwargs, tma_descriptor_metadata))
        # A copy: the callers own what they are given (an IR node keeps it).
        return copy.deepcopy(found[1])

    analyse_once.triton_workshop_kept = True
    return analyse_once


_installed = False


def install() -> list[str]:
    """Keep torch's kernel analyses per signature (see the module docstring), from the first
    call on (the launchers call it when torch.compile traces them: the module it wraps takes a
    third of a second to import); returns the names of the functions it wrapped now."""
    global _installed
    if _installed:
        return []
    _installed = True
    if os.environ.get("TRITON_WORKSHOP_KEEP_KERNEL_ANALYSIS", "1") == "0":
        return []
    try:
        from torch._higher_order_ops import triton_kernel_wrap
    except ImportError:
        return []
    wrapped = []
    for name in FUNCTIONS:
        analyse = getattr(triton_kernel_wrap, name, None)
        if analyse is None or getattr(analyse, "triton_workshop_kept", False):
            continue
        setattr(triton_kernel_wrap, name, _kept(analyse))
        wrapped.append(name)
    return wrapped
