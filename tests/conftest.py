"""Shared test settings: tests that take several GiB of GPU memory (``@pytest.mark.big_memory``,
the ones past 2**31 elements) run one at a time and give their memory back."""

from __future__ import annotations

import gc

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist with --dist loadgroup (scripts/gpu_check.sh) one worker runs them all, in
    # turn: two at once in different workers could exhaust an 80 GB GPU.
    for item in items:
        if item.get_closest_marker("big_memory") is not None:
            item.add_marker(pytest.mark.xdist_group("big_memory"))


@pytest.fixture(autouse=True)
def _release_big_gpu_memory(request):
    yield
    if request.node.get_closest_marker("big_memory") is not None and torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()  # the caching allocator would keep the GiBs for this worker
