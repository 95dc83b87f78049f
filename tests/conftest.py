"""Shared test settings: tests that take several GiB of GPU memory (``@pytest.mark.big_memory``,
the ones past 2**31 elements) run one at a time and give their memory back. Also the NaN poison
that the matmul-based tests plant where a kernel may read but must never let reach a result."""

from __future__ import annotations

import dataclasses

import gc
import importlib.util
import os
from pathlib import Path

import pytest

# scripts/gpu_tests.py runs the suite as one pytest-xdist run over every GPU of the machine
# (TRITON_WORKSHOP_WORKER_GPUS=n): worker gw<i> takes GPU i mod n, set before torch first asks
# CUDA for its devices (importing torch does not), so each worker sees its GPU as cuda:0 and
# the workers share one queue of tests (no GPU idles while another's files are left).
_WORKER_GPUS = int(os.environ.get("TRITON_WORKSHOP_WORKER_GPUS", "0") or 0)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER_GPUS > 0 and _WORKER.startswith("gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_WORKER[2:]) % _WORKER_GPUS)

import torch  # noqa: E402  (after the GPU is chosen)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


#: Tests allowed this long (pytest-timeout's marker) are the suite's slowest: minutes each.
SLOW_SECONDS = 300


def _allowed_seconds(item) -> float:
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker is not None and marker.args else 0.0


def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist with --dist loadgroup (scripts/gpu_check.sh) one worker runs them all, in
    # turn: two at once in different workers could exhaust an 80 GB GPU.
    for item in items:
        if item.get_closest_marker("big_memory") is not None:
            item.add_marker(pytest.mark.xdist_group("big_memory"))
    # The slowest tests first (a stable sort keeps the rest in order): xdist deals tests in
    # this order, and one of minutes dealt last keeps a whole run waiting for it alone.
    items.sort(key=lambda item: _allowed_seconds(item) < SLOW_SECONDS)


def pytest_runtest_logreport(report):
    # With TRITON_WORKSHOP_FAILURE_LOG set (scripts/gpu_check.sh), each failure's report is
    # appended there as it happens: a run cut off by a time limit keeps its tracebacks, which
    # pytest prints only at the end.
    path = os.environ.get("TRITON_WORKSHOP_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a") as log:
            log.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n")


@pytest.fixture(autouse=True)
def _release_big_gpu_memory(request):
    yield
    # The caching allocator keeps what a test freed for its worker: after a test that took GiBs
    # (a big_memory one, or a loss at a 128k vocabulary), the 14 or more workers sharing a GPU
    # would each hold their largest test's memory until the GPU ran out for all of them.
    if torch.cuda.is_initialized() and (request.node.get_closest_marker("big_memory") is not None
                                        or torch.cuda.memory_reserved() > (1 << 30)):
        gc.collect()
        torch.cuda.empty_cache()


NAN = float("nan")


@pytest.fixture
def poisoned_new_empty(monkeypatch):
    """Every ``new_empty`` (a launcher's outputs, padded copies, scratch) starts as NaN, so an
    element never written shows up."""
    new_empty = torch.Tensor.new_empty

    def poisoned(self, *args, **kwargs):
        out = new_empty(self, *args, **kwargs)
        return out.fill_(NAN) if out.is_floating_point() else out

    monkeypatch.setattr(torch.Tensor, "new_empty", poisoned)


def view_past_2_31(values: torch.Tensor, strides: tuple) -> torch.Tensor:
    """``values`` copied into a view with ``strides`` (elements) over a storage of more than
    2**31 elements, where the view's last elements lie past 2**31 from the first: the kernels'
    offsets must be computed in 64 bits. Only the view is written: the rest of the storage is
    never touched (on the CPU its pages are never even committed), so the test costs the
    view's size in time and memory, and 4 GiB of address space (bf16/fp16)."""
    span = 1 + sum((n - 1) * st for n, st in zip(values.shape, strides))
    assert span > 2**31, f"the view spans {span} elements, not past 2**31"
    storage = torch.empty(span, dtype=values.dtype, device=values.device)
    view = storage.as_strided(values.shape, strides)
    with torch.no_grad():
        view.copy_(values)
    return view.detach().requires_grad_(values.requires_grad)


def _in_nan_storage(values: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """``values`` as a view into NaN-filled storage whose rows are padded to 16 elements, with
    2 more NaN rows below: aligned as Triton sees it, so it is read in place, padding and all.
    ``transpose`` stores ``values.T`` that way and returns its transpose (the other dim
    contiguous)."""
    stored = values.t() if transpose else values
    rows, cols = stored.shape
    buf = torch.full((rows + 2, -(-cols // 16) * 16), NAN, dtype=values.dtype, device=values.device)
    buf[:rows, :cols] = stored
    view = buf[:rows, :cols]
    return view.t() if transpose else view


@pytest.fixture
def planned_launches(monkeypatch):
    """``(kernel name, grid)`` of every launch made through a launch plan from now on, in order
    (``LaunchPlan.launch`` goes through ``runtime.registry.launch_kernel``)."""
    from triton_workshop import runtime

    launched = []
    real_launch = runtime.registry.launch_kernel

    def spy(kernel, grid, *args, **kwargs):
        launched.append((getattr(kernel, "fn", kernel).__name__, grid))
        return real_launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(runtime.registry, "launch_kernel", spy)
    return launched


@pytest.fixture
def in_nan_storage():
    """:func:`_in_nan_storage`, for tests of kernels that read past the edges they are given."""
    return _in_nan_storage


# --------------------------------------------------------------------------------------------
# The examples/ scripts (tests/test_examples.py, tests/test_distributed.py).
# --------------------------------------------------------------------------------------------
def assert_same_gradients(model, reference, loss, ref_loss, **tol):
    """Backward through both losses: every parameter of ``model`` has the gradient of the one of
    the same name in ``reference`` (within ``tol``, ``torch.testing.assert_close``'s)."""
    loss.backward()
    ref_loss.backward()
    ref_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_params[name].grad, **tol, msg=name)


def load_example(name: str):
    """``examples/<name>.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def ieee_fp32():
    """TF32 off for the test (torch's products and ours), so that runs compared step for step
    differ only in summation order."""
    from triton_workshop.ops.matmul import tf32_enabled

    before = tf32_enabled(), torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def shorter_norm_paths(tuning, path: str):
    """A norm family's tuning (layer_norm's, rms_norm's) with thresholds lowered so that short rows
    take ``path``: "single_block" as it is; "dx_rows", the backward for rows too long for the
    fused kernel but not for dx alone (single-block dx, column-tiled sums); "chunked", every row
    of more than 2 columns in chunks of at most 64 (so 1000 columns take 16 chunks)."""
    if path != "single_block":
        tuning = dataclasses.replace(tuning, backward_single_block_max_cols=2, chunk_cols=64)
    if path == "chunked":
        tuning = dataclasses.replace(tuning, single_block_max_cols=2, forward_chunk_cols=64,
                                     backward_dx_single_block_max_cols=2)
    return tuning
