"""runtime.kernel_analysis: Inductor's analysis of a Triton kernel in a compiled graph, kept per
signature (the kernel, its tensors' dtypes, its other arguments' values), never across anything
the analysis reads."""

from __future__ import annotations

import pytest
import torch
import triton
from triton.runtime.autotuner import Autotuner
from torch._subclasses.fake_tensor import FakeTensorMode

from triton_workshop.runtime import kernel_analysis

triton_kernel_wrap = pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")


class Param:
    def __init__(self, name, is_constexpr=False):
        self.name, self.is_constexpr = name, is_constexpr


def body(x, n, BLOCK, shape):
    pass


class Kernel:  # stands in for a JITFunction (its parameters, and its Python function as .fn)
    params = [Param("x"), Param("n"), Param("BLOCK", is_constexpr=True), Param("shape")]
    fn = staticmethod(body)


class Autotuned(Autotuner):  # the JITFunction's parameters are read through .fn
    def __init__(self, fn, *first_kwargs):  # Autotuner's own __init__ reads a real kernel
        self.fn = fn
        self.configs = [triton.Config(kwargs) for kwargs in first_kwargs]


@pytest.fixture
def analysed(monkeypatch):
    """torch's analysis functions replaced by one that counts its calls, then kept by install()."""
    calls = []

    def analyse(kernel, kwargs, tma_metadata):
        calls.append((kernel, dict(kwargs)))
        return ["out"]  # a fresh list each call, as torch's

    names = [n for n in kernel_analysis.FUNCTIONS if hasattr(triton_kernel_wrap, n)]
    assert names, "this torch has none of the analysis functions the module knows"
    for name in names:
        monkeypatch.setattr(triton_kernel_wrap, name, analyse)
    monkeypatch.setattr(kernel_analysis, "_installed", False)
    monkeypatch.setattr(kernel_analysis, "_RESULTS", {})
    monkeypatch.delenv("TRITON_WORKSHOP_KEEP_KERNEL_ANALYSIS", raising=False)
    assert kernel_analysis.install() == names
    assert kernel_analysis.install() == []  # once a process
    return getattr(triton_kernel_wrap, names[0]), calls


def fake(*shape, dtype=torch.float32):
    with FakeTensorMode():
        return torch.empty(*shape, dtype=dtype)


def test_one_analysis_per_signature(analysed):
    analyse, calls = analysed
    kernel, other = Kernel(), Kernel()
    x, y = fake(8, 4), fake(16)  # other shapes, same dtype: the same IR
    first = analyse(kernel, {"x": x, "n": 8, "BLOCK": 64}, {})
    again = analyse(kernel, {"x": y, "n": 8, "BLOCK": 64}, {})
    assert first == again == ["out"] and first is not again  # each caller owns its copy
    assert len(calls) == 1
    # An int that is not a constexpr: Triton specialises on its class, not its value.
    analyse(kernel, {"x": x, "n": 24, "BLOCK": 64}, {})
    assert len(calls) == 1
    # What the IR depends on makes another analysis: dtype, a constexpr's value, an int's
    # class (1, a multiple of 16, beyond int32), a type, the kernel.
    analyse(kernel, {"x": fake(8, dtype=torch.bfloat16), "n": 8, "BLOCK": 64}, {})
    analyse(kernel, {"x": x, "n": 1, "BLOCK": 64}, {})
    analyse(kernel, {"x": x, "n": 32, "BLOCK": 64}, {})
    analyse(kernel, {"x": x, "n": 2**31 + 8, "BLOCK": 64}, {})
    analyse(kernel, {"x": x, "n": 8, "BLOCK": 128}, {})
    analyse(kernel, {"x": x, "n": 8.0, "BLOCK": 64}, {})  # a float is another type
    analyse(other, {"x": x, "n": 8, "BLOCK": 64}, {})
    assert len(calls) == 8
    analyse(kernel, {"x": fake(3), "n": 40, "BLOCK": 128}, {})
    analyse(kernel, {"x": fake(3), "n": 48, "BLOCK": 64}, {})
    analyse(kernel=kernel, kwargs={"x": x, "n": 8, "BLOCK": 64}, tma_descriptor_metadata={})
    assert len(calls) == 8
    tuned = Autotuned(Kernel(), {"BLOCK": 64}, {"BLOCK": 128})
    analyse(tuned, {"x": x, "n": 8}, {})
    analyse(tuned, {"x": x, "n": 24}, {})
    assert len(calls) == 9


def test_autotuners_of_one_kernel_and_first_config_share_one_analysis(analysed):
    """torch.compile wraps a kernel launched with num_warps= in a new autotuner at each launch
    site: what the analysis reads of one is its function and its first config's arguments."""
    analyse, calls = analysed
    kernel, x = Kernel(), fake(8)
    for _ in range(3):
        analyse(Autotuned(kernel, {"BLOCK": 64}), {"x": x, "n": 8}, {})
    assert len(calls) == 1
    analyse(Autotuned(kernel, {"BLOCK": 128}), {"x": x, "n": 8}, {})  # another first config
    analyse(Autotuned(Kernel(), {"BLOCK": 64}), {"x": x, "n": 8}, {})  # another kernel
    analyse(Autotuned(kernel, {"BLOCK": 128}, {"BLOCK": 64}), {"x": x, "n": 8}, {})
    assert len(calls) == 3


def test_a_kernel_without_parameters_to_read_is_never_kept(analysed):
    analyse, calls = analysed
    kernel = object()
    analyse(kernel, {"x": fake(4)}, {})
    analyse(kernel, {"x": fake(4)}, {})
    assert len(calls) == 2


def test_real_tensors_and_unhashable_values_are_never_kept(analysed):
    analyse, calls = analysed
    kernel = Kernel()
    real = torch.empty(4)  # its address's alignment is part of the IR's specialisation
    for _ in range(2):
        analyse(kernel, {"x": real}, {})
        analyse(kernel, {"x": fake(4), "shape": [1, 2]}, {})
    assert len(calls) == 4


def test_symbolic_sizes_share_one_analysis(analysed):
    analyse, calls = analysed
    kernel = Kernel()
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    s0 = env.create_unbacked_symint()
    s1 = env.create_unbacked_symint()
    analyse(kernel, {"x": fake(4), "n": s0}, {})
    analyse(kernel, {"x": fake(4), "n": s1}, {})  # torch analyses a symbolic size as 2
    assert len(calls) == 1


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(kernel_analysis, "_installed", False)
    monkeypatch.setenv("TRITON_WORKSHOP_KEEP_KERNEL_ANALYSIS", "0")
    before = {n: getattr(triton_kernel_wrap, n, None) for n in kernel_analysis.FUNCTIONS}
    assert kernel_analysis.install() == []
    assert {n: getattr(triton_kernel_wrap, n, None) for n in kernel_analysis.FUNCTIONS} == before
