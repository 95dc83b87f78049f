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
    #: Warps of the forward that reads each row once for its loss (the gradient not written
    #: there); 0: as many as for the other kernels (``runtime.num_warps_for`` the chunk, 8 at
    #: 4096). Fewer warps a row leave room for more rows in flight on an SM, each thread with
    #: more loads of its own. H200, 8192 x 128256 bf16, in CUDA graphs: 8 warps 577-587 us
    #: (84-86% of copy), 4 warps 524-539 (92-95%), 2 warps 512-519 (95-97%); the backward, which
    #: also writes, is slower with fewer warps (1770 us at 4 against 1635 at 8 for forward +
    #: backward), so it keeps 8.
    forward_num_warps: int = 2
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
    #: linear_cross_entropy (:func:`.linear.chunk_plan`): the most bytes one chunk of logits
    #: may take, in the input's dtype (the kernels turn them into their gradient in place: no
    #: second buffer); the most tokens a chunk of whole rows takes; and the fewest tokens a
    #: chunk takes: where that many whole rows do not fit, a chunk of ``min_chunk_rows`` tokens
    #: is cut into as few blocks of the vocabulary as fit.
    #:
    #: Peak memory is grad_weight + grad_input + one chunk (+ 8 bytes a token): at 8192 tokens,
    #: H = 2048, V = 128256 in bf16, 501 + 32 MiB + the chunk. Whole rows trade time for it:
    #: 1024 rows (250.5 MiB, 22.4 ms fwd+bwd on an H100), 512 (125.3 MiB, 25.1 ms), 256 (62.6
    #: MiB, 34.5 ms: Liger-Kernel's chunk, 34.7 ms, 597 MiB peak). Fewer rows cost time through
    #: grad_weight: each chunk adds ``dlogitsᵀ @ x_chunk`` into all of it, reading and writing
    #: 1 GB for 2·rows·V·H FLOPs, rows / 2 FLOPs a byte against the ~300 an H100 needs; 256 rows
    #: make it memory-bound. Blocks trade FLOPs instead: a block's gradient needs the whole
    #: row's logsumexp, so each block's logits are made twice (once for the loss, once for the
    #: gradient; the last block's once), 3 + (blocks - 1) / blocks products a chunk where whole
    #: rows take 3. 64 MiB with chunks of 512 tokens: 512 x 2 blocks of 64128 classes x 2 bytes
    #: = 62.6 MiB, Liger-Kernel's chunk exactly; peak 501 + 32 + 62.6 = 595.7 MiB by
    #: :func:`.linear.estimated_peak_bytes` (596.7 measured, as Liger-Kernel's), 3.5 products a
    #: chunk: 28.3 ms. Measured beside it on an H100: 1024 tokens in 4 blocks 29.3 ms, 2048 in 8
    #: 33.3 ms (more recomputed); 512 in 3 blocks (48 MiB: 575.8 MiB peak) 31.7 ms, 1024 in 6
    #: (48 MiB) 30.4 ms. fp32 inputs: 512 tokens in 4 blocks of fp32 within the same 64 MiB.
    #: Whole rows stay whole where ``min_chunk_rows`` of them fit (V <= 65536 in bf16 at 64 MiB,
    #: up to 1024 rows where V <= 32768); ``logits_chunk_bytes = 256 * 2**20, min_chunk_rows =
    #: 1`` buys back the 22.4 ms with 785 MiB.
    logits_chunk_bytes: int = 64 * 1024 * 1024
    max_chunk_rows: int = 1024
    min_chunk_rows: int = 512


#: The tuning every launch reads (at call time: a replaced object takes effect at once).
TUNING = CrossEntropyTuning()
