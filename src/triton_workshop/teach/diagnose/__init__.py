"""Naming the bug: what is wrong with a case's output, in words a learner can act on.

* :mod:`.rules`: the generic rules, read from the pattern of the wrong elements (the grid, the
  masks, the offsets, rounding); :func:`diagnose` is the entry point;
* :mod:`.memory`: what a bounds-checked run adds (out-of-bounds accesses, misplaced stores);
* :mod:`.suspects`: an exercise's classic mistakes, recognised by their output;
* one module per exercise with its suspects: :mod:`.vector_add`, :mod:`.image_filters`,
  :mod:`.conv2d`, :mod:`.matmul`, :mod:`.softmax`, :mod:`.layer_norm`, :mod:`.fast_matmul` (the
  tuning list launched config by config), :mod:`.flash_attention`.
"""

from .memory import memory_findings
from .rules import diagnose
from .suspects import Suspect, match_suspects

__all__ = ["Suspect", "diagnose", "match_suspects", "memory_findings"]
