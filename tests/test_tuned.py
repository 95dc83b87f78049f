"""Tuned configurations kept as data (runtime.tuned) and ``workshop tune`` (triton_workshop.tune).

On the CPU the autotuner runs in Triton's interpreter with a stubbed timer (each candidate is
launched once, the timer says which is "fastest"): the table written from what it chose is read
back by a fresh autotuner, which then launches the table's config without timing anything, keyed
exactly as Triton keys a call.
"""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels below)
from triton_workshop import runtime, tune
from triton_workshop.runtime import tuned

CONFIGS = [triton.Config({"BLOCK": 32}, num_warps=4), triton.Config({"BLOCK": 64}, num_warps=4),
           triton.Config({"BLOCK": 128}, num_warps=2)]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


class StubTimer:
    """do_bench for the autotuner: launches the candidate once and reports ``times[i]`` for the
    i-th candidate it is asked to time."""

    def __init__(self, times):
        self.times, self.calls = list(times), 0

    def __call__(self, kernel_call, quantiles=None, **kwargs):
        kernel_call()
        t = self.times[self.calls % len(self.times)]
        self.calls += 1
        return [t, t, t] if quantiles is not None else t


def make_tuner(timer):
    return tuned.table_tuner(
        triton.autotune(configs=list(CONFIGS), key=["n"], do_bench=timer)(add_kernel))


def launch(tuner, n: int, dtype=torch.float32):
    x = torch.randn(n, dtype=dtype, device=runtime.DEVICE)
    y = torch.randn(n, dtype=dtype, device=runtime.DEVICE)
    out = torch.full((n,), float("nan"), dtype=dtype, device=runtime.DEVICE)
    tuner[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    torch.testing.assert_close(out, x + y)
    return (x, y, out, n)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """An empty user table folder and package folder, the cache of read tables cleared."""
    user, package = tmp_path / "user", tmp_path / "package"
    monkeypatch.setenv("TRITON_WORKSHOP_TUNED_DIR", str(user))
    monkeypatch.delenv("TRITON_WORKSHOP_TUNED", raising=False)
    monkeypatch.setattr(tuned, "PACKAGE_DIR", package)
    tuned._entries.cache_clear()
    yield user, package
    tuned._entries.cache_clear()


def test_tuning_key_is_the_autotuners_own():
    timer = StubTimer([3.0, 1.0, 2.0])
    tuner = make_tuner(timer)
    args = launch(tuner, 100)
    assert timer.calls == 3
    (key, config), = tuner.cache.items()
    assert key == tuned.tuning_key(tuner, args, {}) == (100, "torch.float32", "torch.float32",
                                                         "torch.float32")
    assert config.kwargs == {"BLOCK": 64}  # the stub timer's fastest


def test_a_written_table_is_launched_without_timing(tables):
    user, _ = tables
    first = make_tuner(StubTimer([3.0, 1.0, 2.0]))
    launch(first, 100)
    launch(first, 1000, torch.float16)
    kernels = tuned.snapshot([first])
    path = tuned.write_table(user / "sm90.json", kernels, arch="sm90", gpu="test GPU")
    data = json.loads(path.read_text())
    assert data["format"] == tuned.FORMAT and data["arch"] == "sm90"
    (name, rows), = data["kernels"].items()
    assert name.endswith("add_kernel") and len(rows) == 2

    timer = StubTimer([1.0, 2.0, 3.0])  # would pick BLOCK 32 if it timed anything
    fresh = make_tuner(timer)
    assert tuned.preload(fresh, arch="sm90") == 2
    launch(fresh, 100)
    launch(fresh, 1000, torch.float16)
    assert timer.calls == 0
    assert {c.kwargs["BLOCK"] for c in fresh.cache.values()} == {64}
    # The table's configs are the tuner's own candidate objects.
    assert all(any(c is own for own in fresh.configs) for c in fresh.cache.values())
    # A key the table does not know is tuned as before.
    launch(fresh, 5000)
    assert timer.calls == 3


def test_prune_hook_names_the_table_pick_once(tables):
    user, _ = tables
    row = [[100, "torch.float32", "torch.float32", "torch.float32"],
           {"kwargs": {"BLOCK": 128}, "num_warps": 2, "num_stages": 3}]
    tuned.write_table(user / "sm90.json", {tuned.kernel_name(make_tuner(None)): [row]},
                      arch="sm90", gpu="test GPU")
    tuner = make_tuner(StubTimer([1.0]))
    tuned.preload(tuner, arch="sm90")
    x = torch.randn(100)
    tuner.nargs = dict(zip(tuner.arg_names, (x, x, x, 100)))
    assert [c.kwargs for c in tuner.prune_configs({})] == [{"BLOCK": 128}]
    assert tuned.take_table_pick() is True and tuned.take_table_pick() is False
    tuner.nargs = dict(zip(tuner.arg_names, (x, x, x, 7)))  # not in the table: all candidates
    assert len(tuner.prune_configs({})) == 3
    assert tuned.take_table_pick() is False


def test_user_table_wins_and_stale_entries_are_skipped(tables):
    user, package = tables
    name = tuned.kernel_name(make_tuner(None))
    key = [100, "torch.float32", "torch.float32", "torch.float32"]
    tuned.write_table(package / "sm90.json", {name: [
        [key, {"kwargs": {"BLOCK": 32}, "num_warps": 4, "num_stages": 3}],
        [[7] + key[1:], {"kwargs": {"BLOCK": 512}, "num_warps": 4, "num_stages": 3}],  # stale
    ]}, arch="sm90", gpu="g")
    tuned.write_table(user / "sm90.json", {name: [
        [key, {"kwargs": {"BLOCK": 128}, "num_warps": 2, "num_stages": 3}]]}, arch="sm90", gpu="g")
    tuner = make_tuner(None)
    assert tuned.preload(tuner, arch="sm90") == 1
    assert tuner.cache[tuple(key)].kwargs == {"BLOCK": 128}
    assert tuned.preload(tuner, arch="sm90") == 0  # once per tuner
    other = make_tuner(None)
    assert tuned.preload(other, arch="sm80") == 0  # no table for that architecture


def test_tables_off_and_damaged_tables(tables, monkeypatch):
    user, _ = tables
    user.mkdir(parents=True)
    (user / "sm90.json").write_text("{ not json")
    assert tuned.preload(make_tuner(None), arch="sm90") == 0
    monkeypatch.setenv("TRITON_WORKSHOP_TUNED", "0")
    assert not tuned.enabled()
    assert tuned.preload(make_tuner(None), arch="sm90") == 0


def test_write_table_merges_with_the_file(tables):
    user, _ = tables
    path = user / "sm90.json"
    a = [[1, "torch.float32"], {"kwargs": {"BLOCK": 32}, "num_warps": 4, "num_stages": 3}]
    b = [[2, "torch.float32"], {"kwargs": {"BLOCK": 64}, "num_warps": 4, "num_stages": 3}]
    b2 = [[2, "torch.float32"], {"kwargs": {"BLOCK": 128}, "num_warps": 2, "num_stages": 3}]
    tuned.write_table(path, {"k": [a, b]}, arch="sm90", gpu="g")
    tuned.write_table(path, {"k": [b2]}, arch="sm90", gpu="g")
    rows = json.loads(path.read_text())["kernels"]["k"]
    assert sorted(map(repr, rows)) == sorted(map(repr, [a, b2]))
    tuned.write_table(path, {"k": [b2]}, arch="sm90", gpu="g", merge=False)
    assert json.loads(path.read_text())["kernels"]["k"] == [b2]


def test_single_config_for_a_traced_graph(tables):
    tuner = make_tuner(StubTimer([3.0, 1.0, 2.0]))
    args = launch(tuner, 100)
    one = tuned.single_config(tuner, args, {})
    assert one is not tuner and [c.kwargs for c in one.configs] == [{"BLOCK": 64}]
    assert one is tuned.single_config(tuner, args, {})  # one object per config
    unknown = (*args[:3], 31)
    assert tuned.single_config(tuner, unknown, {}) is tuner


def test_package_kernels_are_registered_for_tune():
    names = {tuned.kernel_name(t) for t in tuned.tuners()}
    if runtime.INTERPRET:  # one config each in the interpreter: nothing to tune, none wrapped
        assert names == set()
    else:
        assert any(n.endswith("matmul_kernel") for n in names)


def test_tune_cases_and_refusal_without_a_gpu(capsys):
    cases = tune.cases()
    assert {c.name.split()[0] for c in cases} == {"linear", "attention", "conv2d"}
    assert len({c.name for c in cases}) == len(cases)
    if runtime.INTERPRET:
        assert tune.main(["--quick"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
        from triton_workshop import cli

        assert cli.main(["tune", "--quick"]) == 2  # the same through `workshop tune`
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_run_cases_reports_failures_and_goes_on():
    ok = tune.Case("ok", lambda device, dtype: None)
    bad = tune.Case("bad", lambda device, dtype: (_ for _ in ()).throw(ValueError("too big")))
    lines = []
    rows = tune.run_cases([bad, ok], [torch.float32], torch.device("cpu"), say=lines.append)
    assert [(r[0], r[3]) for r in rows] == [("bad", "ValueError: too big"), ("ok", None)]
    assert "FAILED ValueError: too big" in lines[0]


def test_a_small_tune_case_runs_in_the_interpreter():
    case = next(c for c in tune.cases() if c.name.startswith("attention"))
    small = tune.attention_case(1, 2, 1, 16, 16, True)
    small(torch.device(runtime.DEVICE), torch.float32)
    assert case.quick


def test_traced_launch_gets_the_known_config():
    """runtime.wrap_triton outside a direct launch (what torch.compile traces) hands an autotuned
    kernel of one known config to torch.library.wrap_triton; the call still computes x + y."""
    timer = StubTimer([3.0, 1.0, 2.0])
    tuner = make_tuner(timer)
    launch(tuner, 100)
    x, y = torch.randn(100, device=runtime.DEVICE), torch.randn(100, device=runtime.DEVICE)
    out = torch.full((100,), float("nan"), device=runtime.DEVICE)
    traced = runtime.wrap_triton(tuner)
    assert traced is not tuner
    traced[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, out, 100)
    torch.testing.assert_close(out, x + y)
    assert timer.calls == 3  # nothing timed again
