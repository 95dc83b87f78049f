"""Candidates of one model timed in turn, in one process (``workshop bench models --interleave``).

Where a step is bound by the host (the Python and launch work of each op call, at small batches),
its time moves by tens of percent from one process, or one machine, to the next: the same commit
timed a patched GPT-2 at 0.89x and 1.04x torch eager on two H200 machines (docs/results.md,
2026-11-28, 13bbc96). Candidates timed in processes of their own then compare that noise too.
Here every candidate's model is built in this process and runs its loss and warm-up steps; then
the candidates take turns, each round timing a few steps of each, so that whatever slows the host
slows them all alike, and each candidate's ms/step is the median of its steps over all rounds.

What it costs: every candidate's model, optimiser state included, is on the device at once (too
much for the LLaMA 1.5B at its full size on one GPU); the peak memory is not a candidate's own
(reported as none); a candidate's first step may find caches warmed by the one before it; and
nothing can stop a case that hangs (no timeout). A Liger-Kernel patch that holds for the whole
process (its LLaMA replaces transformers' functions) would change the other candidates' models:
such a candidate is left out here and measured alone, in its own process, by the caller.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch

from ..measure import start_steps, timed_steps
from .run import Case, build_case, default_timer, failure
from .workloads import LIGER_CANDIDATES

__all__ = ["interleavable", "run_interleaved"]


def interleavable(case: Case) -> bool:
    """Whether ``case`` may share a process with the other candidates of its model."""
    return not (case.candidate in LIGER_CANDIDATES and case.workload.liger_process_wide)


def run_interleaved(cases: Sequence[Case], rounds: int = 5, timer=None) -> list[tuple[str, Any]]:
    """``(status, payload)`` for each of ``cases`` (one model's candidates, all interleavable), as
    :func:`.run.run_isolated` reports a case: each built and started here, then its
    ``steps.timed`` steps spread over ``rounds`` rounds in which every candidate takes its turn
    (at least one step a round). ``peak_bytes`` is None: the models share the device."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    results: list[tuple[str, Any] | None] = [None] * len(cases)
    running = []  # (index, step, batches, first timed batch, steps a round, payload, timer)
    for i, case in enumerate(cases):
        if not interleavable(case):
            raise ValueError(f"{case.candidate} on {case.workload.name} patches the whole process: "
                             "it cannot share one")
        clock = timer or default_timer(case)
        try:
            step, batches, steps = build_case(case)
            first_step_s, losses = start_steps(step, batches, steps, clock)
        except Exception as exc:  # reported in the table: one case failing must not end the run
            results[i] = failure(exc)
            continue
        payload = {"ms_per_step": None, "first_step_s": first_step_s, "peak_bytes": None,
                   "losses": losses, "step_ms": []}
        per_round = max(1, steps.timed // rounds)
        running.append((i, step, batches, steps.loss + steps.warmup, per_round, payload, clock))
    for r in range(rounds):
        for i, step, batches, first, per_round, payload, clock in running:
            if results[i] is not None:  # failed in an earlier round
                continue
            try:
                payload["step_ms"] += timed_steps(step, batches, first + r * per_round, per_round,
                                                  clock)
            except Exception as exc:  # noqa: BLE001 - as above
                results[i] = failure(exc)
    for i, _, _, _, _, payload, _ in running:
        if results[i] is None:
            payload["ms_per_step"] = statistics.median(payload["step_ms"])
            results[i] = ("ok", payload)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results  # type: ignore[return-value]
