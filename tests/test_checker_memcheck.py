"""Bounds-checked memory (teach/memcheck.py) and the checker's thread-safe allocations.

The hooks wrap Triton's interpreter; on a GPU machine (kernels compiled) they do not apply, and
the checker reruns cases in an interpreter subprocess instead (tests/test_checker_sandbox.py).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop import runtime
from triton_workshop.teach import memcheck
from triton_workshop.teach.poison import GUARD, guarded_copy, guarded_empty, poisoned_allocations

interpreter_only = pytest.mark.skipif(not runtime.INTERPRET, reason="the hooks wrap Triton's interpreter")


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, extra, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASKED:
        mask = offsets < n + extra
        tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)
    else:
        tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets))


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr, PRECISION: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    if PRECISION == "default":
        c = tl.dot(a, b)
    else:
        c = tl.dot(a, b, input_precision=PRECISION)
    tl.store(c_ptr + r[:, None] * N + r[None, :], c)


@triton.jit
def _to_bf16_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))


def test_hooks_install_on_this_triton():
    """Fails loudly if the installed Triton's interpreter changed shape (method names or the
    create_masked_load signature): then the bounds checks would be silently off."""
    interp = memcheck.interpreter_module()
    assert interp.interpreter_builder is not None
    with memcheck.memory_checked():
        assert memcheck.hooks_installed()
        assert "create_masked_store" in vars(interp.interpreter_builder)
    assert not memcheck.hooks_installed()
    assert "create_masked_store" not in vars(interp.interpreter_builder)  # the class's own again


@interpreter_only
def test_out_of_bounds_store_is_dropped_and_reported():
    n = 100
    src, dst = guarded_copy(torch.randn(n)), guarded_empty((n,), torch.float32, "cpu")
    with memcheck.memory_checked(__file__) as report:
        _copy_kernel[(2,)](src, dst.view, n, 1, BLOCK=64, MASKED=True)  # mask lets offset 100 in
    assert torch.equal(dst.view, src)
    assert dst.spill() == (0, 0), "the stray store reached memory"
    stores = report.violations_of("store")
    assert len(stores) == 1
    v = stores[0]
    assert v.tensor.label == "dst" and v.first_offsets == [100] and v.programs == [(1,)]
    assert v.site.file == __file__ and "tl.store" in v.site.code
    text = "\n".join(report.describe())
    assert "store at offsets 100 of dst (100 elements) in program 1" in text
    assert "test_checker_memcheck.py:" in text and "lets offset 100 through" in text


@interpreter_only
def test_out_of_bounds_load_reads_poison_and_names_the_missing_mask():
    n = 70
    src = guarded_copy(torch.randn(n))
    # The guard zone after src holds NaN; make it a number to prove the load never reads it.
    buffer = torch.empty(0).set_(src.untyped_storage(), 0, (n + 2 * GUARD,))
    buffer[GUARD + n:] = 7.0
    dst = torch.zeros(128)
    with memcheck.memory_checked(__file__) as report:
        _copy_kernel[(1,)](src, dst, n, 0, BLOCK=128, MASKED=False)
    assert torch.equal(dst[:n], src)
    assert torch.isnan(dst[n:]).all(), "an out-of-bounds lane must read the poison, not memory"
    loads = report.violations_of("load")
    assert len(loads) == 1 and loads[0].lowest == n and loads[0].highest == 127 and not loads[0].masked
    assert "has no mask=" in "\n".join(report.describe())


@interpreter_only
def test_write_map_records_each_program():
    n = 150
    src, dst = guarded_copy(torch.randn(n)), guarded_empty((n,), torch.float32, "cpu")
    with memcheck.memory_checked() as report:
        _copy_kernel[(3,)](src, dst.view, n, 0, BLOCK=64, MASKED=True)
    assert report.clean
    wm = report.writes[dst.view.data_ptr()]
    assert (wm.count == 1).all()
    programs = [memcheck.decode_program(c, 1)[0] for c in wm.writer]
    assert programs == [i // 64 for i in range(n)]
    assert wm.spans[memcheck.encode_program((2,))] == (128, 149, 22)
    assert src.data_ptr() not in report.writes  # loads are not writes


@interpreter_only
@pytest.mark.parametrize("precision", ["tf32", "default", "ieee"])
def test_tf32_is_emulated_where_a_gpu_would_use_it(precision):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)
    c = torch.empty(16, 16)
    with memcheck.memory_checked() as report:
        _dot_kernel[(1,)](a, b, c, N=16, PRECISION=precision)
    exact = a.double() @ b.double()
    tf32 = (torch.from_numpy(memcheck.round_to_tf32(a.numpy())).double()
            @ torch.from_numpy(memcheck.round_to_tf32(b.numpy())).double())
    if precision == "ieee":
        assert report.tf32_dots == 0 and torch.allclose(c.double(), exact, rtol=1e-6, atol=1e-5)
    else:
        assert report.tf32_dots == 1
        assert torch.allclose(c.double(), tf32, rtol=1e-6, atol=1e-5)
        assert (c.double() - exact).abs().max() > 1e-4  # the lesson is visible
    # Outside a check the interpreter stays exact.
    _dot_kernel[(1,)](a, b, c, N=16, PRECISION=precision)
    assert torch.allclose(c.double(), exact, rtol=1e-6, atol=1e-5)


def test_tf32_rounding_matches_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-10 + 2**-12, -2.5, np.inf, np.nan],
                 dtype=np.float32)
    got = memcheck.round_to_tf32(x)
    assert got[0] == 1.0 and got[1] == 1.0  # a tie goes to the even neighbour
    assert got[2] == np.float32(1.0 + 4 * 2**-11)  # a tie with an odd neighbour goes up
    assert got[3] == np.float32(1.0 + 2**-10)
    assert got[4] == -2.5 and np.isinf(got[5]) and np.isnan(got[6])


@interpreter_only
def test_bf16_conversion_rounds_to_nearest_even_in_checked_runs():
    x = torch.randn(256, generator=torch.Generator().manual_seed(1)) * 3
    y = torch.empty(256, dtype=torch.bfloat16)
    with memcheck.memory_checked() as report:
        _to_bf16_kernel[(1,)](x, y, BLOCK=256)
    assert report.bf16_rounded >= 1
    assert torch.equal(y, x.to(torch.bfloat16))  # torch rounds to nearest even, as a GPU does


def test_round_to_bf16_bits_matches_torch():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2)) * 100
    x[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    bits = memcheck.round_to_bf16_bits(x.numpy())
    expected = x.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
    assert (bits[3:] == expected[3:]).all()
    assert bits[1] == expected[1] and bits[2] == expected[2]
    assert np.isnan(torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()[0])


@interpreter_only
def test_another_threads_kernel_is_not_checked():
    """While one thread holds a check open, a kernel of another thread runs unchecked: its stray
    store reaches the guard zone (the hooks pass it straight to Triton)."""
    entered, release = threading.Event(), threading.Event()

    def hold():
        with memcheck.memory_checked():
            entered.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(30) and memcheck.hooks_installed()
        # src is longer than n: the stray lane stores a number into dst's NaN guard.
        src, dst = torch.randn(16), guarded_empty((10,), torch.float32, "cpu")
        _copy_kernel[(1,)](src, dst.view, 10, 1, BLOCK=16, MASKED=True)
        assert dst.spill() == (0, 1)
    finally:
        release.set()
        holder.join()
    assert not memcheck.hooks_installed()


def test_poisoned_allocations_are_per_thread():
    """The process-wide torch.empty swap poisons only the thread that asked, and the last
    thread out puts the real functions back, whatever the order of entry and exit."""
    real_empty, real_empty_like = torch.empty, torch.empty_like
    a_in, b_in, a_out, b_checked = (threading.Event() for _ in range(4))
    seen = {}

    def guarded(t):  # a poisoned allocation is a view into a larger, NaN-filled buffer
        return t.untyped_storage().nbytes() > t.numel() * t.element_size()

    def thread_a():
        with poisoned_allocations() as made:
            a_in.set()
            b_in.wait(30)
            seen["a"] = torch.empty(5)
            seen["a_made"] = len(made)
        a_out.set()

    def thread_b():
        a_in.wait(30)
        seen["b_outside"] = torch.empty(5)  # A is inside, B is not: plain
        with poisoned_allocations() as made:
            b_in.set()
            a_out.wait(30)  # A leaves first: B must still be poisoned
            seen["b"] = torch.empty_like(torch.zeros(3))
            seen["b_made"] = len(made)
        b_checked.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert guarded(seen["a"]) and torch.isnan(seen["a"]).all() and seen["a_made"] == 1
    assert not guarded(seen["b_outside"])
    assert guarded(seen["b"]) and torch.isnan(seen["b"]).all() and seen["b_made"] == 1
    assert torch.empty is real_empty and torch.empty_like is real_empty_like
    assert not guarded(torch.empty(4))


def test_second_poison_is_finite_and_exact():
    g = guarded_empty((8,), torch.float16, "cpu", poison=-1024.0)
    assert (g.view == -1024.0).all() and g.spill() == (0, 0)
