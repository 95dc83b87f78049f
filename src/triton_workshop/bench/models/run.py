"""Running one model case: the model built (seeded, the same weights for every candidate),
prepared for the candidate, and timed a step at a time (:func:`..measure.measure_steps`).

Each case runs in a fresh process (``spawn``, :func:`run_isolated`): a crash, an out-of-memory or
a compile that does not end within the timeout is reported for that case and the run goes on;
each starts with a clean GPU (so its peak memory is its own), the same on-disk compile caches, and
none of another candidate's patches (Liger-Kernel's LLaMA patch replaces transformers' classes
process-wide). :func:`run_inline` runs a case here, for the CPU tests and debugging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import queue as queue_module
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..measure import CudaTimer, Steps, WallTimer, measure_steps
from .workloads import (CANDIDATES, LIGER, LIGER_CANDIDATES, LIGER_COMPILED, OURS, OURS_COMPILED,
                        STEPS, TORCH_COMPILE, TORCH_EAGER, ModelWorkload, patch_torch_modules)

__all__ = ["Case", "NotApplicable", "make_step", "prepare", "run_case", "run_inline", "run_isolated"]


class NotApplicable(Exception):
    """The candidate has nothing for this model (Liger-Kernel and the ResNet), or cannot run it
    here."""


def prepare(model: nn.Module, candidate: str, workload: ModelWorkload | None = None) -> nn.Module:
    """The model as ``candidate`` runs it: torch's candidates and triton-workshop's (patched by
    ``workload.patch``, by default :func:`triton_workshop.nn.patch`; with ``compiled=True`` for
    the compiled candidate). Liger-Kernel's are applied by :func:`run_case`, before the model
    moves to its device."""
    if candidate == TORCH_EAGER:
        return model
    if candidate == TORCH_COMPILE:
        return torch.compile(model)
    if candidate in (OURS, OURS_COMPILED):
        patch = workload.patch if workload is not None else patch_torch_modules
        patch(model, candidate == OURS_COMPILED)
        return torch.compile(model) if candidate == OURS_COMPILED else model
    raise ValueError(f"unknown candidate {candidate!r}; valid: {', '.join(CANDIDATES)}")


def _to_device(batch, device: torch.device, channels_last: bool):
    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, non_blocking=True)
        return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t

    return tuple(move(t) for t in batch)


def make_step(model: nn.Module, workload: ModelWorkload, device: torch.device, amp: bool):
    """One training step (forward under autocast, backward, optimiser step) or one inference
    forward; returns the loss, detached."""
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    if not workload.train:
        model.eval()

        def infer(batch):
            with torch.no_grad(), autocast():
                return workload.loss(model, batch).detach()

        return infer
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if workload.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    elif workload.optimizer == "adamw_fused" and device.type == "cuda":
        # One kernel for every parameter's update (PyTorch's fused AdamW) on the GPU.
        optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, fused=True)
    else:
        optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)

    def train(batch):
        with autocast():
            loss = workload.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return train


@dataclasses.dataclass(frozen=True)
class Case:
    workload: ModelWorkload
    candidate: str
    size: str = "full"
    device: str = "cuda"
    amp: bool = True
    steps: Steps | None = None  # None: STEPS[size]
    seed: int = 0


def run_case(case: Case, timer=None) -> dict:
    """Build the model (seeded, the same for every candidate), prepare it for the candidate,
    measure. Returns a plain dict (it crosses a process boundary)."""
    step, batches, steps = build_case(case)
    timer = timer or default_timer(case)
    return dataclasses.asdict(measure_steps(step, batches, steps, timer))


def default_timer(case: Case):
    """CUDA events on a GPU, wall time elsewhere."""
    return CudaTimer() if torch.device(case.device).type == "cuda" else WallTimer()


def build_case(case: Case):
    """``(step, batches, steps)`` of a case: its model built (seeded, the same for every
    candidate) and prepared for the candidate, on its device, with its optimiser; nothing run."""
    workload, size = case.workload, case.workload.sizes[case.size]
    device = torch.device(case.device)
    steps = case.steps or STEPS[case.size]
    torch.manual_seed(case.seed)
    if case.candidate in LIGER_CANDIDATES and workload.liger is None:
        raise NotApplicable(f"{LIGER} has no kernels for {workload.name}")
    model = workload.model(size)
    if case.candidate in LIGER_CANDIDATES:
        workload.liger(model)  # on the CPU model, as built; ImportError when it is not installed
    model = model.to(device)
    if workload.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if case.candidate == LIGER_COMPILED:
        model = torch.compile(model)
    elif case.candidate != LIGER:
        model = prepare(model, case.candidate, workload)
    count = max(steps.loss, 4)
    batches = [_to_device(b, device, workload.channels_last) for b in workload.batches(size, count)]
    return make_step(model, workload, device, case.amp), batches, steps


def failure(exc: Exception) -> tuple[str, str]:
    """How the table reports a case that raised ``exc``: ``(status, note)``."""
    if isinstance(exc, (NotApplicable, ImportError)):
        return "n/a", str(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "oom", str(exc).splitlines()[0]
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return "failed", f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"


def _child(case: Case, results) -> None:
    """A fresh process's whole life: one case, its result (or its error) on the queue."""
    try:
        results.put(("ok", run_case(case)))
    except Exception as exc:  # reported in the table: one case failing must not end the run
        results.put(failure(exc))


def run_isolated(case: Case, timeout_s: float) -> tuple[str, Any]:
    """:func:`run_case` in a fresh process; ``("timeout", note)`` when it has not finished
    within ``timeout_s`` (it is killed), ``("failed", note)`` when it died without a word."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_child, args=(case, results), daemon=True)
    process.start()
    deadline = time.monotonic() + timeout_s
    try:
        # get before join: a child blocks on exit until its queued result has been read. Polled,
        # so that a child killed outright (a segfault, the OOM killer) is noticed at once.
        while True:
            try:
                return results.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue_module.Empty:
                pass
            if not process.is_alive():
                try:  # it may have put its result just before it ended
                    return results.get(timeout=1.0)
                except queue_module.Empty:
                    return "failed", f"the process died (exit code {process.exitcode})"
            if time.monotonic() >= deadline:
                return "timeout", f"not finished within {timeout_s:.0f} s (killed)"
    finally:
        if process.is_alive():
            process.kill()
        process.join(5)


def run_inline(case: Case, timer=None) -> tuple[str, Any]:
    """:func:`run_case` in this process, errors caught as :func:`run_isolated` reports them (no
    timeout: nothing can stop a compile that hangs). A candidate whose patch holds for the whole
    process (Liger-Kernel's LLaMA) is not run here: it would leak into the cases after it."""
    if case.candidate in LIGER_CANDIDATES and case.workload.liger_process_wide:
        return "n/a", (f"{LIGER}'s patch of {case.workload.name} holds for the whole process: "
                       "it runs isolated only")
    try:
        return "ok", run_case(case, timer)
    except Exception as exc:  # reported in the table: one case failing must not end the run
        return failure(exc)
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

