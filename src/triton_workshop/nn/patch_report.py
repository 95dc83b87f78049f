"""What ``patch`` reports: the counts it returns, the modules it left on torch, and its warnings.

The vocabulary shared by :mod:`.patch` (which fills it), :mod:`.swap_rules` (the reasons) and
``integrations.transformers`` (which adds its own kinds): :class:`PatchCounts` (a ``dict`` of
modules swapped per kind, with ``fused`` and ``skipped``), :class:`Skipped`, :class:`PolicyReason`
for a choice rather than a limitation, and the :class:`PatchWarning` that names what stayed.
"""

from __future__ import annotations

import dataclasses
import warnings

#: The keys of the counts ``patch`` returns, always all present: modules swapped, per kind.
COUNT_KEYS = ("layer_norm", "rms_norm", "linear", "conv2d", "attention")
#: The keys of ``PatchCounts.fused``: chains that run fused inside a Sequential, per fusion
#: (``linear_dropout``: Linear → [activation] → Dropout, fused while the Dropout trains).
FUSION_KEYS = ("layer_norm_linear", "linear_activation", "linear_dropout")


class PatchWarning(UserWarning):
    """What ``patch`` left on torch (and why), and calls a patched module handed to torch."""


class InterpreterWarning(PatchWarning):
    """The patched model will run its kernels in Triton's interpreter (no GPU): correct, but
    50-90x slower than torch on the CPU. Said once a process."""


class PolicyReason(str):
    """A reason for leaving a module on torch that is a choice (cuBLAS is as fast or faster
    there), not a limitation: listed in ``skipped`` with ``policy=True``, not warned about."""


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A module ``patch`` left on torch: where it is, what it is, and why."""

    name: str
    kind: str
    reason: str
    #: True where the module was left by the ``linear=`` rule (a choice), not for a limitation.
    policy: bool = False

    def __str__(self) -> str:
        return f"{self.name or '<model>'} ({self.kind}): {self.reason}"


class PatchCounts(dict):
    """``dict[str, int]``: modules swapped per kind (:data:`COUNT_KEYS`). Two attributes say
    more: ``fused``, the adjacent chains that run fused inside Sequentials (:data:`FUSION_KEYS`;
    each swapped module of a chain is also counted as swapped), and ``skipped``, the list of
    :class:`Skipped` modules (also said in a :class:`PatchWarning`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fused: dict[str, int] = {key: 0 for key in FUSION_KEYS}
        self.skipped: list[Skipped] = []

    def __reduce__(self):  # pickles as a plain dict
        return (dict, (dict(self),))

    def describe(self) -> str:
        """One line: modules swapped per kind, then the pairs run fused."""
        text = ", ".join(f"{k} {v}" for k, v in self.items() if v)
        fused = ", ".join(f"{k} {v}" for k, v in self.fused.items() if v)
        return text + (f" (fused: {fused})" if fused else "")


def warn_skipped(skipped: list[Skipped], stacklevel: int = 4) -> None:
    """One :class:`PatchWarning` naming the modules left on torch for a limitation (those left
    by choice, ``policy=True``, are in the list only)."""
    limited = [s for s in skipped if not s.policy]
    if limited:
        lines = "\n  ".join(str(s) for s in limited)
        warnings.warn(
            f"patch left {len(limited)} module(s) on torch (they work as before):\n  {lines}",
            PatchWarning,
            stacklevel=stacklevel,
        )
