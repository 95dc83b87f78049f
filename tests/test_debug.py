"""Debug helpers: cdiv, program-id conditions, print_if / breakpoint_if, check_tensors_gpu_ready."""

from __future__ import annotations

import math
import pdb
import re

import pytest
import torch

import triton_workshop  # first: decides interpreter mode before any kernel below is decorated
from triton_workshop import debug
from triton_workshop.debug import (
    breakpoint_if,
    cdiv,
    ceiling_divide,
    check_tensors_gpu_ready,
    print_if,
    test_pid_conds,
)
import triton
import triton.language as tl

INTERPRET = triton_workshop.INTERPRET
interpreter_only = pytest.mark.skipif(
    not INTERPRET, reason="kernel bodies run as Python in interpreter mode only"
)


# --------------------------------------------------------------------------------------------
# Kernels that call the helpers (plain Python calls work in the interpreter only).
# --------------------------------------------------------------------------------------------
@triton.jit
def _print_kernel(COND: tl.constexpr):
    print_if(f"pid {tl.program_id(0)} {tl.program_id(1)}", COND)


@triton.jit
def _breakpoint_kernel(x_ptr, COND: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    breakpoint_if(COND)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1)


def _printed_pids(out: str) -> list[tuple[int, int]]:
    """Each printed line is ``pid <p0> <p1>`` (the interpreter shows a program id as ``[n]``)."""
    pids = []
    for line in out.splitlines():
        m = re.fullmatch(r"pid \[?(\d+)\]? \[?(\d+)\]?", line.strip())
        assert m, f"unexpected output line {line!r}"
        pids.append((int(m[1]), int(m[2])))
    return pids


@pytest.fixture
def fresh_interpreter(monkeypatch):
    """The interpreter's state as in a process that has launched no kernel yet."""
    from triton.runtime.interpreter import interpreter_builder

    monkeypatch.setattr(interpreter_builder, "grid_idx", None, raising=False)
    return interpreter_builder


# --------------------------------------------------------------------------------------------
# cdiv.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n, d, want",
    [(10, 3, 4), (9, 3, 3), (0, 4, 0), (1, 4096, 1), (4095, 4096, 1), (4096, 4096, 1),
     (4097, 4096, 2), (10_000, 4096, 3), (2**31 + 5, 4096, 2**19 + 1), (7, 1, 7)],
)
def test_cdiv_values(n, d, want):
    assert cdiv(n, d) == want
    assert ceiling_divide(n, d) == want


def test_cdiv_agrees_with_math_ceil_and_triton():
    assert ceiling_divide is cdiv
    assert triton_workshop.cdiv is cdiv
    for n in range(0, 200):
        for d in (1, 2, 3, 7, 16, 64):
            assert cdiv(n, d) == math.ceil(n / d) == triton.cdiv(n, d)


def test_cdiv_exact_multiples_add_no_block():
    for d in (1, 8, 128, 4096):
        for k in (0, 1, 5, 1000):
            assert cdiv(k * d, d) == k
            assert cdiv(k * d + 1, d) == k + 1


def test_cdiv_by_zero():
    with pytest.raises(ZeroDivisionError):
        cdiv(5, 0)


# --------------------------------------------------------------------------------------------
# test_pid_conds with explicit program ids.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "conds, pids, want",
    [
        ("=0", (0, 0, 0), True),
        ("=0", (1, 0, 0), False),
        ("==2", (2, 5, 7), True),
        (",>1", (0, 2, 0), True),
        (",>1", (9, 1, 0), False),
        (">=1,<3", (1, 2, 0), True),
        (">=1,<3", (0, 2, 0), False),
        (">=1,<3", (4, 3, 0), False),
        ("!=0", (0, 0, 0), False),
        ("!=0", (3, 0, 0), True),
        ("<=2", (2, 0, 0), True),
        ("<=2", (3, 0, 0), False),
        (",,=4", (0, 0, 4), True),
        (",,=4", (4, 4, 3), False),
        ("=1,=2,=3", (1, 2, 3), True),
        ("=1,=2,=3", (1, 2, 4), False),
        ("", (0, 0, 0), True),
        ("", (17, 3, 2), True),
        (",", (5, 6, 0), True),
        (" = 1 , >= 2 ", (1, 2, 0), True),
        (" = 1 , >= 2 ", (1, 1, 0), False),
        ("=-1", (0, 0, 0), False),
    ],
)
def test_pid_conds_with_int_pids(conds, pids, want):
    assert test_pid_conds(conds, *pids) is want


@pytest.mark.parametrize("conds, pids, want", [
    ("=0", ([0], [0], [0]), True),
    ("=0", ([1], [0], [0]), False),
    (",>1", ([0], [2], [0]), True),
    (">=1,<3", ([2], [2], [0]), True),
    ("!=0", ([0], [5], [5]), False),
])
def test_pid_conds_with_list_pids(conds, pids, want):
    """The notebooks' convention: program ids as one-element lists."""
    assert test_pid_conds(conds, *pids) is want


def test_pid_conds_with_numpy_and_tensor_pids():
    import numpy as np

    assert test_pid_conds("=3", np.array([3]), np.int64(0), torch.tensor(0))
    assert not test_pid_conds(",=1", 0, torch.tensor([2]), 0)


def test_pid_conds_empty_needs_no_program(fresh_interpreter):
    # '' constrains nothing, so no program ids are needed, even outside a kernel.
    assert test_pid_conds("") is True
    assert test_pid_conds(" , ,") is True


@pytest.mark.parametrize("conds", ["~1", "1", "a=1", "=>1x", "?", "=1,<>2", "≥1"])
def test_bad_operator(conds):
    with pytest.raises(ValueError, match=r"condition .*(must start with one of|whole number)"):
        test_pid_conds(conds, 0, 0, 0)


@pytest.mark.parametrize("conds", ["~1", "1", "?"])
def test_unknown_operator_message_lists_the_operators(conds):
    with pytest.raises(ValueError) as info:
        test_pid_conds(conds, 0, 0, 0)
    msg = str(info.value)
    assert repr(conds) in msg
    for op in ("=", "!=", "<", "<=", ">", ">="):
        assert op in msg


@pytest.mark.parametrize("conds", ["=a", "=1.5", "=", ">=x", ",<", "!=0x1"])
def test_non_number(conds):
    with pytest.raises(ValueError, match=r"expected a whole number after"):
        test_pid_conds(conds, 0, 0, 0)


@pytest.mark.parametrize("conds", ["=0,=0,=0,=0", ",,,", "=1,,,=2"])
def test_more_than_three_conditions(conds):
    with pytest.raises(ValueError, match=r"at most 3 \(one per grid axis\), got 4"):
        test_pid_conds(conds, 0, 0, 0)


def test_pid_conds_is_not_collected_by_pytest():
    assert test_pid_conds.__test__ is False


def test_bad_pid_type():
    with pytest.raises(TypeError, match="program id must be an integer"):
        test_pid_conds("=0", "zero", 0, 0)


# --------------------------------------------------------------------------------------------
# print_if / breakpoint_if outside a kernel.
# --------------------------------------------------------------------------------------------
def test_print_if_outside_kernel_with_explicit_pids(capsys):
    print_if("one", "=1", 1, 0, 0)
    print_if("not me", "=1", 0, 0, 0)
    print_if("two", ",>1", [0], [2], [0])
    print_if("always", "", 5, 5, 5)
    assert capsys.readouterr().out.splitlines() == ["one", "two", "always"]


@interpreter_only
def test_print_if_without_pids_outside_kernel_raises(fresh_interpreter, capsys):
    with pytest.raises(RuntimeError, match="inside a running kernel"):
        print_if("nope", "=0")
    with pytest.raises(RuntimeError, match="inside a running kernel"):
        breakpoint_if("=0")
    assert capsys.readouterr().out == ""


@interpreter_only
def test_print_if_without_pids_outside_kernel_raises_after_a_kernel_ran(capsys):
    _print_kernel[(4,)](COND="=9")  # any launch; prints nothing
    # grid_idx is now (3, 0, 0) for good: '=3' matches the stale id and prints.
    with pytest.raises(RuntimeError, match="inside a running kernel"):
        print_if("stale", "=3")


def test_breakpoint_if_outside_kernel_with_explicit_pids(monkeypatch):
    calls = []
    monkeypatch.setattr(pdb.Pdb, "set_trace", lambda self, frame=None: calls.append(frame))
    breakpoint_if("=2", 1, 0, 0)
    assert calls == []
    breakpoint_if("=2", 2, 0, 0)
    assert len(calls) == 1
    # The frame handed to pdb is the caller's (this test), not breakpoint_if's own.
    assert calls[0].f_code.co_name == "test_breakpoint_if_outside_kernel_with_explicit_pids"


# --------------------------------------------------------------------------------------------
# print_if / breakpoint_if inside a real interpreted kernel.
# --------------------------------------------------------------------------------------------
@interpreter_only
def test_print_if_in_kernel_prints_in_matching_program_only(capsys):
    _print_kernel[(4,)](COND="=1")
    assert _printed_pids(capsys.readouterr().out) == [(1, 0)]


@interpreter_only
def test_print_if_in_kernel_2d_grid_second_axis(capsys):
    _print_kernel[(2, 3)](COND=",=0")
    assert _printed_pids(capsys.readouterr().out) == [(0, 0), (1, 0)]


@interpreter_only
@pytest.mark.parametrize(
    "grid, cond, want",
    [
        ((4,), "", [(0, 0), (1, 0), (2, 0), (3, 0)]),
        ((4,), "!=0", [(1, 0), (2, 0), (3, 0)]),
        ((4,), ">3", []),
        ((3, 4), ">=1,<3", [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]),
        ((3, 4), "=2, =3", [(2, 3)]),
    ],
)
def test_print_if_in_kernel_conditions(capsys, grid, cond, want):
    _print_kernel[grid](COND=cond)
    assert _printed_pids(capsys.readouterr().out) == want


@interpreter_only
def test_breakpoint_if_in_kernel_stops_in_matching_programs_only(monkeypatch):
    calls = []

    def fake_set_trace(self, frame=None):
        calls.append((debug._current_pids(), frame.f_code.co_name if frame else None))

    monkeypatch.setattr(pdb.Pdb, "set_trace", fake_set_trace)
    x = torch.zeros(16)
    _breakpoint_kernel[(4,)](x, COND="=2", BLOCK=4)
    assert calls == [((2, 0, 0), "_breakpoint_kernel")]
    assert torch.equal(x, torch.ones(16))  # the kernel itself ran in every program

    calls.clear()
    _breakpoint_kernel[(4,)](x, COND=">=1,", BLOCK=4)
    assert [pids for pids, _ in calls] == [(1, 0, 0), (2, 0, 0), (3, 0, 0)]
    assert torch.equal(x, torch.full((16,), 2.0))


# --------------------------------------------------------------------------------------------
# check_tensors_gpu_ready.
# --------------------------------------------------------------------------------------------
@interpreter_only
def test_gpu_ready_accepts_contiguous_cpu_tensors_in_interpreter():
    check_tensors_gpu_ready(torch.ones(3), torch.zeros(2, 5), torch.empty(0))
    check_tensors_gpu_ready()  # nothing to check


def test_gpu_ready_accepts_device_tensors():
    device = triton_workshop.DEVICE
    check_tensors_gpu_ready(torch.ones(3, device=device), torch.ones(4, 4, device=device))


def test_gpu_ready_rejects_non_contiguous_naming_the_index():
    device = triton_workshop.DEVICE
    ok = torch.ones(4, 4, device=device)
    with pytest.raises(ValueError, match=r"^tensor 1 \(shape \(4, 4\).*not contiguous"):
        check_tensors_gpu_ready(ok, ok.t())
    with pytest.raises(ValueError, match=r"^tensor 2 .*contiguous"):
        check_tensors_gpu_ready(ok, ok, torch.ones(10, device=device)[::2])


def test_gpu_ready_rejects_non_tensor():
    with pytest.raises(TypeError, match=r"^tensor 0 must be a torch\.Tensor, got list"):
        check_tensors_gpu_ready([1.0, 2.0])
    with pytest.raises(TypeError, match=r"^tensor 1 must be a torch\.Tensor, got int"):
        check_tensors_gpu_ready(torch.ones(1, device=triton_workshop.DEVICE), 3)


def test_gpu_ready_rejects_meta_tensor_naming_the_device():
    with pytest.raises(ValueError, match=r"^tensor 1 must be on .*device.*meta"):
        check_tensors_gpu_ready(torch.ones(2, device=triton_workshop.DEVICE),
                                torch.ones(2, device="meta"))
