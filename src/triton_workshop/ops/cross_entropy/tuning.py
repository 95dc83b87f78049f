"""The cross-entropy family's tuning object: the launch decisions its host code reads at each
call (:class:`CrossEntropyTuning`, :data:`TUNING`), and the reductions it knows.

Part of every launch plan's key. The package re-exports :data:`TUNING`, and setting
``cross_entropy.TUNING`` there (a test's ``monkeypatch.setattr``) replaces it in every module of
the family that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class CrossEntropyTuning:
    """The launch decisions of the cross-entropy family: part of every plan's key (tests replace
    :data:`TUNING` with ``dataclasses.replace`` to cut a vocabulary into many chunks and a batch
    of tokens into many chunks of logits)."""

    #: Elements of a row a loop step takes (a power of two): a row of any length is streamed,
    #: so only one chunk is held in registers. H100, 8192 x 128256 bf16: 2048 to 16384 within
    #: 4% of each other (forward ~2.85 TB/s, backward ~2.8 TB/s); 32768 is slower.
    chunk_cols: int = 4096
    #: cross_entropy, called eagerly with fp32/bf16 logits that require grad. True: the forward
    #: writes the gradient and the backward scales it in place, a pass skipped when the
    #: incoming gradient is 1 (2·N·V elements moved by forward + backward if the forward's
    #: second read of a row hit L2, 4·N·V for another incoming gradient). False: the backward
    #: recomputes it from the logits (3·N·V whatever the incoming gradient). See :mod:`.loss`.
    #: Measured on an H100 (8192 x 128256 bf16, fwd+bwd): True took 2.18 ms with an incoming
    #: gradient of 1 and 3.67 ms with 0.5; False takes 2.22 ms for both. The forward's second
    #: read of each 250 KB row does not stay in L2 beside the other rows in flight, so True
    #: saves nothing at 1 and loses at a loss divided by accumulation steps: False.
    grad_in_forward: bool = False
    #: linear_cross_entropy: the most bytes one chunk of logits may take (``rows x V`` in the
    #: input's dtype) and the most tokens a chunk takes (a power of two). The chunk's rows are
    #: the largest power of two within both (at least 1).
    #:
    #: The trade-off. Peak memory is grad_weight + grad_input + one chunk of logits (their
    #: gradient is written over them); at 8192 tokens, H = 2048, V = 128256 in bf16 that is
    #: 501 + 32 + 250.5 MiB for 1024 rows (783.5 MiB), + 125.3 for 512 (658.3), + 62.6 for 256
    #: (595.6: Liger-Kernel's chunk, and its 597 MiB peak). What a smaller chunk costs is the
    #: weight's gradient: each chunk adds ``dlogitsᵀ @ x_chunk`` into the whole V x H
    #: grad_weight, which cuBLAS reads and writes once a chunk (1 GB here) for 2·rows·V·H
    #: FLOPs: rows / 2 FLOPs a byte, against the ~300 an H100 needs to stay compute-bound
    #: (990 TFLOP/s over 3.35 TB/s). 1024 rows (512 a byte) keep it compute-bound; 512 are at
    #: the edge; 256 (128 a byte) make it memory-bound: ~0.35 ms a chunk where 0.18 ms would
    #: do. Measured on an H100 at that size (fwd+bwd, time and peak above the inputs): 256 MiB
    #: chunks 22.2 ms and 785 MiB, 128 MiB 24.9 ms and 659 MiB, 64 MiB 34.7 ms and 597 MiB;
    #: Liger-Kernel 34.7 ms and 597 MiB; torch.compile 19.9 ms and 2538 MiB. So the rows stop at
    #: 1024, where the products run at full speed, and the bytes cap them for vocabularies so
    #: large that 1024 rows of logits would take more than 256 MiB. ``logits_chunk_bytes =
    #: 64 MiB`` trades that time for Liger-Kernel's memory.
    logits_chunk_bytes: int = 256 * 1024 * 1024
    max_chunk_rows: int = 1024


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = CrossEntropyTuning()
