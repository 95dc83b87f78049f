"""Poisoned, guarded memory: what the learner's kernel is given to write into.

While the learner's launcher runs, ``torch.empty``/``torch.empty_like`` hand out tensors filled
with NaN (or the largest integer). An element the kernel never wrote still holds the poison, so
"not written" and "written wrong" are told apart; where it is not sure (the kernel may compute NaN
itself), the case runs again with a second poison. Inputs and those outputs are views into larger
buffers, a poisoned guard zone before and after: on a GPU a load past the end (a missing
``mask=``) reads NaN, and a store past the end lands in the zone, where the checker sees it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["GUARD", "Guarded", "guarded_copy", "guarded_empty", "is_poison", "poison_value",
           "poisoned_allocations", "second_poison_value"]

GUARD = 4096  # elements of poison before and after every guarded buffer


def poison_value(dtype: torch.dtype):
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def second_poison_value(dtype: torch.dtype):
    """A second, finite poison: an element that holds it after a second run was never written
    (exact in float16/bfloat16 too, and an unlikely result)."""
    if dtype.is_floating_point:
        return -1024.0
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min


def is_poison(t: torch.Tensor, poison=None) -> torch.Tensor:
    if poison is None:
        if t.dtype.is_floating_point:
            return torch.isnan(t)
        return t == poison_value(t.dtype)
    return t == torch.tensor(poison, dtype=t.dtype, device=t.device)


@dataclass
class Guarded:
    """A tensor that is a view into the middle of a poisoned buffer."""

    buffer: torch.Tensor
    view: torch.Tensor
    poison: object = None

    @property
    def n(self) -> int:
        return self.view.numel()

    def spill(self) -> tuple[int, int]:
        """How many guard elements before and after the tensor were overwritten."""
        before = (~is_poison(self.buffer[:GUARD], self.poison)).sum().item()
        after = (~is_poison(self.buffer[GUARD + self.n :], self.poison)).sum().item()
        return int(before), int(after)


_REAL_EMPTY = torch.empty
_REAL_EMPTY_LIKE = torch.empty_like


def guarded_empty(shape, dtype, device, poison=None) -> Guarded:
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    buffer = _REAL_EMPTY(n + 2 * GUARD, dtype=dtype, device=device)  # never the patched one
    buffer.fill_(poison_value(dtype) if poison is None else poison)
    return Guarded(buffer, buffer[GUARD : GUARD + n].view(shape), poison)


def guarded_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into a contiguous view with NaN guard zones around it."""
    g = guarded_empty(t.shape, t.dtype, t.device)
    g.view.copy_(t)
    return g.view


# torch.empty is process-wide, the checker's run is one thread's: the swap dispatches on a
# thread-local, so another thread's allocations are never poisoned, and the last user to leave
# puts the real functions back.
_alloc_lock = threading.Lock()
_alloc_users = 0
_alloc_local = threading.local()
_PLAIN_FORMATS = (None, torch.contiguous_format, torch.preserve_format)


class _Poisoner:
    def __init__(self, poison):
        self.poison = poison
        self.made: list[Guarded] = []

    def empty(self, *size, dtype=None, device=None, requires_grad=False, **kwargs):
        if "size" in kwargs:
            size = (kwargs.pop("size"),)
        if kwargs.get("out") is not None or kwargs.pop("memory_format", None) not in _PLAIN_FORMATS:
            return _REAL_EMPTY(*size, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        dtype = dtype or torch.get_default_dtype()
        g = guarded_empty(size, dtype, device or "cpu", self._poison_for(dtype))
        self.made.append(g)
        return g.view.requires_grad_(requires_grad)

    def empty_like(self, t, *, dtype=None, device=None, requires_grad=False, **kwargs):
        if kwargs.pop("memory_format", None) not in _PLAIN_FORMATS or not t.is_contiguous():
            return _REAL_EMPTY_LIKE(t, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
        dtype = dtype or t.dtype
        g = guarded_empty(t.shape, dtype, device or t.device, self._poison_for(dtype))
        self.made.append(g)
        return g.view.requires_grad_(requires_grad)

    def _poison_for(self, dtype):
        return None if self.poison is None else self.poison(dtype)


def _empty(*args, **kwargs):
    poisoner = getattr(_alloc_local, "poisoner", None)
    return (poisoner.empty if poisoner else _REAL_EMPTY)(*args, **kwargs)


def _empty_like(*args, **kwargs):
    poisoner = getattr(_alloc_local, "poisoner", None)
    return (poisoner.empty_like if poisoner else _REAL_EMPTY_LIKE)(*args, **kwargs)


@contextlib.contextmanager
def poisoned_allocations(poison: Callable[[torch.dtype], object] | None = None):
    """Within the block, this thread's ``torch.empty`` and ``torch.empty_like`` return poisoned,
    guarded tensors (``poison(dtype)`` gives the fill; NaN / the largest integer by default).

    Yields the list of allocations made, so that the caller can find the returned output and
    check its guard zones. Other threads allocate as usual meanwhile.
    """
    global _alloc_users
    poisoner = _Poisoner(poison)
    previous = getattr(_alloc_local, "poisoner", None)
    with _alloc_lock:
        if _alloc_users == 0:
            torch.empty, torch.empty_like = _empty, _empty_like
        _alloc_users += 1
    _alloc_local.poisoner = poisoner
    try:
        yield poisoner.made
    finally:
        _alloc_local.poisoner = previous
        with _alloc_lock:
            _alloc_users -= 1
            if _alloc_users == 0:
                torch.empty, torch.empty_like = _REAL_EMPTY, _REAL_EMPTY_LIKE

