"""The benchmark suite, without a GPU: the CLI's refusal and errors, the spec registry, every
workload's inputs and peers at a tiny scale against triton-workshop's op, the byte/FLOP accounting,
the measurement's bookkeeping (statuses, ratios, ceilings) with a fake timer, and the reports."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_workshop import runtime
from triton_workshop.bench import SPEC_NAMES, SPECS, cli, load_spec, main, report
from triton_workshop.bench.measure import (
    Row, Timer, evaluate, grad_leaves, measure_case, needs_copy_ceiling, output_gradient, outputs,
    time_in_both_orders,
)
from triton_workshop.bench.report import CSV_COLUMNS
from triton_workshop.bench.spec import (
    GBPS, OURS, TFLOPS, Spec, Workload, dtype_name, liger, rate_of, size_label,
)

SRC = Path(__file__).resolve().parents[1] / "src"


def _workloads():
    return [
        pytest.param(w, id=f"{name}-{w.name}-{dtype_name(w.dtype)}")
        for name in SPEC_NAMES
        for w in load_spec(name).workloads
    ]


def _find(spec: str, name: str, dtype: torch.dtype = None) -> Workload:
    found = [
        w for w in load_spec(spec).workloads
        if w.name == name and (dtype is None or w.dtype == dtype)
    ]
    assert len(found) == 1, (spec, name, dtype)
    return found[0]


# --------------------------------------------------------------------------------------------
# The command line.
# --------------------------------------------------------------------------------------------
def test_refuses_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "INTERPRET", True)
    monkeypatch.setattr(runtime, "INTERPRET_REASON", "no CUDA device found")
    assert main(["--quick", "softmax"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err
    assert "interpreter" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the module would benchmark")
def test_module_entry_point_refuses_on_cpu():
    env = {**os.environ, "PYTHONPATH": str(SRC), "TRITON_WORKSHOP_QUIET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "triton_workshop.bench", "--quick"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr


def test_unknown_name_lists_valid_names(capsys):
    assert main(["softmax", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err
    for name in SPEC_NAMES:
        assert name in err


def test_names_select_specs_in_suite_order():
    assert cli.resolve_names([]) == list(SPEC_NAMES)
    assert cli.resolve_names(["matmul", "softmax"]) == ["softmax", "matmul"]
    assert cli.resolve_names(["layer-norm"]) == ["layer_norm"]


def test_help_and_list_exit_zero(capsys):
    assert main(["--help"]) == 0
    assert main(["--list", "matmul"]) == 0
    out = capsys.readouterr().out
    assert "5012×2100×7777" in out and "FLOPs = 2·M·N·K" in out


# --------------------------------------------------------------------------------------------
# The registry and each workload at a tiny scale.
# --------------------------------------------------------------------------------------------
def test_registry_lists_the_expected_specs():
    assert SPEC_NAMES == (
        "elementwise", "image", "softmax", "layer_norm", "rms_norm", "rope", "glu",
        "cross_entropy", "linear_cross_entropy", "matmul", "conv", "attention",
    )
    names = {name: [w.name for w in load_spec(name).workloads] for name in SPEC_NAMES}
    assert names["elementwise"] == ["sqrt(a*b+c)", "add"]
    assert names["image"] == ["greyscale", "sepia", "filter2d 3x3", "filter2d 5x5"]
    assert names["softmax"] == ["softmax fwd", "softmax fwd+bwd"]
    assert names["layer_norm"] == ["layer_norm fwd", "layer_norm fwd+bwd"]
    assert names["rms_norm"] == ["rms_norm fwd", "rms_norm fwd+bwd", "add+rms_norm fwd+bwd"]
    assert names["rope"] == ["rope fwd", "rope fwd+bwd"]
    assert names["glu"] == ["swiglu fwd", "swiglu fwd+bwd", "geglu fwd", "geglu fwd+bwd"]
    assert names["cross_entropy"] == ["cross_entropy fwd", "cross_entropy fwd+bwd"]
    assert names["linear_cross_entropy"] == ["linear_cross_entropy fwd+bwd"]
    assert names["matmul"] == [
        "matmul", "matmul", "matmul IEEE", "matmul TF32", "matmul+leaky_relu", "matmul+leaky_relu",
        "layer_norm+linear", "layer_norm+linear",
    ]
    assert names["conv"] == ["conv2d 3x3 NCHW", "conv2d 3x3 channels_last"]
    assert names["attention"] == [
        "attention fwd D=128", "attention fwd D=64", "attention fwd causal D=128",
        "attention fwd causal D=64", "attention fwd+bwd causal D=128", "attention fwd+bwd causal D=64",
    ]
    for name in SPEC_NAMES:
        spec = load_spec(name)
        assert isinstance(spec, Spec) and spec.name == name
        assert {w.unit for w in spec.workloads} == {spec.unit}
        for w in spec.workloads:
            assert len(w.quick) == 1 and w.headlines, w.name


def test_specs_reference_the_ops_themselves():
    """Each workload holds triton-workshop's op as an object (no module names in strings), and the
    suite is the tuple of the spec objects, in run order."""
    import triton_workshop as tw

    assert SPECS == tuple(load_spec(name) for name in SPEC_NAMES)
    assert _find("elementwise", "add").ours is tw.add
    assert _find("elementwise", "sqrt(a*b+c)").ours is tw.fused_mul_add_sqrt
    assert _find("image", "greyscale").ours is tw.greyscale
    assert _find("image", "sepia").ours is tw.sepia
    assert _find("matmul", "layer_norm+linear", torch.float16).ours is tw.layer_norm_linear
    for spec in SPECS:
        for w in spec.workloads:
            assert callable(w.ours) and not hasattr(w, "module"), w.name
    with pytest.raises(KeyError):
        load_spec("nope")


def test_table_sizes_are_headlines():
    assert (1 << 28,) in _find("elementwise", "sqrt(a*b+c)").headlines
    assert (3, 8192, 8192) in _find("image", "filter2d 5x5").headlines
    assert {(8192, 8192), (65536, 1024)} <= set(_find("softmax", "softmax fwd").headlines)
    assert (32768, 4096) in _find("layer_norm", "layer_norm fwd").headlines
    assert (8192, 8192) in _find("layer_norm", "layer_norm fwd+bwd").headlines
    fp16 = _find("matmul", "matmul", torch.float16)
    assert {(4096,) * 3, (8192,) * 3, (5012, 2100, 7777)} <= set(fp16.headlines)
    for layout in ("NCHW", "channels_last"):
        conv = _find("conv", f"conv2d 3x3 {layout}")
        assert conv.headlines == conv.quick == ((32, 64, 56, 56),)
    for w in load_spec("attention").workloads:
        d = w.sizes[0][-1]
        assert w.sizes == tuple((4, 32, n, d) for n in (1024, 2048, 4096))
        assert w.headlines == w.quick == ((4, 32, 4096, d),)


@pytest.mark.parametrize("w", _workloads())
def test_tiny_inputs_and_peers_match_ours(w: Workload):
    ours = w.ours
    size = w.shrink(w.quick[0])
    assert sum(size) < sum(w.quick[0]) and w.work(size, w.dtype) > 0
    # Fixed inputs: on the CPU, PyTorch's fp16 layer_norm backward accumulates dweight with
    # errors of a few 1e-2 on some draws (measured against float64: ours 0.008, eager 0.027), past
    # the runner's fp16 tolerance; a fixed seed keeps this smoke test deterministic.
    torch.manual_seed(0)
    with w.context():
        inputs = w.make_inputs(size, w.dtype, runtime.DEVICE)
        assert all(t.dtype == w.dtype for t in inputs)
        assert all(bool(t.detach().abs().sum() > 0) for t in inputs), "inputs must be random"
        dy = output_gradient(w, inputs)
        got = evaluate(w, ours, inputs, dy)
        n_out = len(outputs(w.reference(*inputs)))
        assert len(got) == (n_out + len(grad_leaves(inputs)) if w.backward else n_out)
        peers = w.candidates(with_compile=False)
        assert list(peers)[:2] == [OURS, w.reference_name]
        for name, fn in peers.items():
            if name == OURS or (isinstance(fn, str) and fn.startswith("not importable")):
                continue
            assert callable(fn), f"{name}: {fn}"
            problem = w.check(got, evaluate(w, fn, inputs, dy))
            assert problem is None, f"{name}: {problem}"
        if w.ceiling is not None:
            assert w.ceiling(*inputs).shape == got[0].shape


# --------------------------------------------------------------------------------------------
# Accounting.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, name, dtype, size, expected",
    [
        ("elementwise", "sqrt(a*b+c)", torch.float32, (2**28,), 4 * 4 * 2**28),  # 4 GiB
        ("elementwise", "add", torch.float32, (2**28,), 3 * 4 * 2**28),
        ("image", "greyscale", torch.float32, (3, 8192, 8192), 1_073_741_824),  # (3 + 1) planes
        ("image", "sepia", torch.float32, (3, 8192, 8192), 1_610_612_736),  # (3 + 3) planes
        ("image", "filter2d 5x5", torch.float32, (3, 8192, 8192), 1_610_612_736 + 25 * 4),
        ("softmax", "softmax fwd", torch.float16, (8192, 8192), 268_435_456),
        ("softmax", "softmax fwd+bwd", torch.float16, (8192, 8192), 671_088_640),
        # (2·M·N + 2·N)·2 = 536,870,912 + 16,384
        ("layer_norm", "layer_norm fwd", torch.float16, (32768, 4096), 536_887_296),
        # (5·M·N + 5·N)·2 + 16·M = 671,088,640 + 81,920 + 131,072
        ("layer_norm", "layer_norm fwd+bwd", torch.float16, (8192, 8192), 671_301_632),
        ("matmul", "matmul", torch.float16, (4096, 4096, 4096), 137_438_953_472),
        ("matmul", "matmul", torch.bfloat16, (5012, 2100, 7777), 163_708_960_800),
        ("matmul", "matmul+leaky_relu", torch.float16, (4096, 4096, 4096), 137_438_953_472),
        # 2·N·F·OH·OW·C·9 = 2·32·64·56·56·64·9, and 2·32·256·28·28·256·9
        ("conv", "conv2d 3x3 NCHW", torch.float16, (32, 64, 56, 56), 7_398_752_256),
        ("conv", "conv2d 3x3 channels_last", torch.float16, (32, 256, 28, 28), 29_595_009_024),
        # FlashAttention-2's convention: 4·B·H·N²·D = 2^40 at 4×32×4096×128; causal half of it;
        # fwd+bwd = 3.5 × the forward.
        ("attention", "attention fwd D=128", torch.float16, (4, 32, 4096, 128), 2**40),
        ("attention", "attention fwd D=64", torch.float16, (4, 32, 1024, 64), 2**35),
        ("attention", "attention fwd causal D=128", torch.float16, (4, 32, 4096, 128), 2**39),
        ("attention", "attention fwd+bwd causal D=128", torch.float16, (4, 32, 4096, 128),
         7 * 2**38),
        ("attention", "attention fwd+bwd causal D=64", torch.float16, (4, 32, 2048, 64),
         240_518_168_576),
    ],
)
def test_work_accounting(spec, name, dtype, size, expected):
    w = _find(spec, name, dtype)
    assert w.work(size, w.dtype) == expected


def test_gemm_ceilings_do_the_workloads_flops():
    """The TFLOP/s ceilings are cuBLAS GEMMs whose 2·m·n·k is exactly the workload's count, so the
    runner's rate for them (work / their time) is cuBLAS's true rate."""
    from triton_workshop.bench import attention, conv

    for w in load_spec("attention").workloads:
        for size in w.sizes:
            m, n, k = attention.gemm_shape(size, w.work(size, w.dtype))
            assert 2 * m * n * k == w.work(size, w.dtype), (w.name, size)
    for size in conv.SIZES:
        batch, channels, height, width = size
        m, n, k = conv.gemm_shape(size, (channels, channels, 3, 3))
        assert (m, n, k) == (batch * height * width, channels, channels * 9)
        assert 2 * m * n * k == conv.conv_flops(size, torch.float16)


def test_rates_and_labels():
    assert rate_of(4 * 4 * 2**28, 1.5, GBPS) == pytest.approx(2863.31, rel=1e-5)
    assert rate_of(137_438_953_472, 0.2, TFLOPS) == pytest.approx(687.19, rel=1e-5)
    assert size_label((2**24,)) == "2^24"
    assert size_label((3, 8192, 8192)) == "3×8192×8192"
    assert _find("softmax", "softmax fwd").shrink((8192, 8192)) == (64, 64)
    # Attention's tiny shapes stay ones every SDPA backend takes (D % 8 == 0, N % 64 == 0).
    assert _find("attention", "attention fwd D=128").shrink((4, 32, 4096, 128)) == (2, 2, 128, 16)
    assert _find("attention", "attention fwd D=64").shrink((4, 32, 4096, 64)) == (2, 2, 128, 8)


def test_check_catches_a_wrong_result_at_any_scale():
    w = _find("softmax", "softmax fwd")
    ref = torch.softmax(torch.randn(64, 8192), dim=-1).half()
    assert w.check((ref.clone(),), (ref,)) is None
    assert "max abs error" in w.check((torch.zeros_like(ref),), (ref,))
    assert "shape" in w.check((ref[:, :-1],), (ref,))


# --------------------------------------------------------------------------------------------
# The measurement's bookkeeping, on the CPU with a fake timer.
# --------------------------------------------------------------------------------------------
CALLED: list[str] = []


def _logged(name, fn):
    def call(*args):
        CALLED.append(name)
        return fn(*args)

    return call


class FakeTimer:
    """A time per function: ours 1 ms, the reference 2 ms, the ceiling 0.5 ms; counts calls."""

    TIMES = {"ours": 1.0, "reference": 2.0, "ceiling": 0.5}
    warmup, rep, graphs = 0, 0, False  # what run_suite prints

    def __init__(self):
        self.timed: list[str] = []

    def __call__(self, fn):
        return self.time(fn)[0]

    def time(self, fn):
        CALLED.clear()
        fn()
        self.timed.append(CALLED[-1])
        return self.TIMES[CALLED[-1]], ""


def _toy(ours, *, ceiling=None, backward=False) -> Workload:
    def make(size, dtype, device):
        return tuple(torch.rand(size, dtype=dtype, device=device, requires_grad=backward)
                     for _ in range(2))

    return Workload(
        name="toy", dtype=torch.float32, unit=GBPS, sizes=((1000,),), quick=((1000,),),
        headlines=((1000,),), make_inputs=make, work=lambda size, dtype: 3_000_000_000,
        work_formula="3 GB", ours=_logged("ours", ours),
        reference=_logged("reference", torch.mul),
        peers={"broken peer": lambda x, y: 1 / 0}, ceiling=ceiling, ceiling_name="ref",
        optional_peers={"Liger-Kernel": liger("no_such_liger_module", "Fn")},
        backward=backward,
    )


def test_graph_timer_uses_cuda_graphs_and_says_when_a_call_cannot_be_captured(monkeypatch):
    import triton.testing

    calls = []

    def graph(fn, rep, return_mode):
        calls.append(("graph", rep, return_mode))
        if getattr(fn, "uncapturable", False):
            raise RuntimeError("operation not permitted when stream is capturing")
        return 0.25

    def plain(fn, warmup, rep, return_mode):
        calls.append(("plain", rep, return_mode))
        return 0.5

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", graph)
    monkeypatch.setattr(triton.testing, "do_bench", plain)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    timer = Timer(10, 40, graphs=True)
    assert timer.time(lambda: None) == (0.25, "") and timer(lambda: None) == 0.25

    def host_sync():
        pass

    host_sync.uncapturable = True
    ms, note = timer.time(host_sync)
    assert ms == 0.5 and "not capturable in a CUDA graph" in note and "timed plainly" in note
    assert calls[-2:] == [("graph", 40, "median"), ("plain", 40, "median")]
    # The note reaches the case's row.
    results = time_in_both_orders(timer, [("ours", lambda: None), ("peer", host_sync)])
    assert results["ours"] == (0.25, "ok", "") and results["peer"][2] == note
    # Without graphs: do_bench alone, no note.
    assert Timer(10, 40).time(host_sync) == (0.5, "")


def test_measure_case_times_checks_and_reports():
    spec = Spec(name="toy", title="Toy", workloads=[])
    timer = FakeTimer()
    rows = measure_case(spec, _toy(lambda x, y: x * y), (1000,), timer,
                        torch.device("cpu"), 3000.0, with_compile=False)
    by = {r.candidate: r for r in rows}
    assert list(by) == [OURS, "torch eager", "broken peer", "Liger-Kernel"]
    assert by[OURS].status == "ok" and by[OURS].ms == 1.0 and by[OURS].rate == 3000.0
    assert by[OURS].pct_ceiling == pytest.approx(100.0) and by[OURS].headline
    assert by["torch eager"].ratio == 2.0  # 2 ms against our 1 ms
    assert by["broken peer"].status == "unavailable" and "ZeroDivisionError" in by["broken peer"].note
    assert by["Liger-Kernel"].status == "unavailable"
    # Each timed twice, in order then in reverse order.
    assert timer.timed == ["ours", "reference", "reference", "ours"]


def test_measure_case_never_times_a_wrong_kernel_and_measures_its_own_ceiling():
    spec = Spec(name="toy", title="Toy", workloads=[])
    timer = FakeTimer()
    w = _toy(lambda x, y: x + y, ceiling=_logged("ceiling", torch.mul))
    rows = measure_case(spec, w, (1000,), timer, torch.device("cpu"), None, with_compile=False)
    ours = rows[0]
    assert ours.status == "wrong" and ours.ms is None and "max abs error" in ours.note
    assert "ours" not in timer.timed and timer.timed.count("ceiling") == 2
    assert ours.ceiling == rows[1].ceiling == 6000.0  # 3 GB in 0.5 ms


def test_measure_case_reuses_the_reference_timing_as_ceiling():
    spec = Spec(name="toy", title="Toy", workloads=[])
    w = _toy(lambda x, y: x * y)
    w.ceiling = w.reference
    timer = FakeTimer()
    rows = measure_case(spec, w, (1000,), timer, torch.device("cpu"), None, with_compile=False)
    assert rows[0].ceiling == rows[1].rate == 1500.0 and rows[0].pct_ceiling == 200.0
    assert timer.timed.count("reference") == 2


def test_measure_case_fwd_bwd_checks_gradients():
    spec = Spec(name="toy", title="Toy", workloads=[])

    class WrongGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g, g

    rows = measure_case(spec, _toy(WrongGrad.apply, backward=True), (1000,), FakeTimer(),
                        torch.device("cpu"), 3000.0, with_compile=False)
    assert rows[0].status == "wrong" and "grad" in rows[0].note
    rows = measure_case(spec, _toy(lambda x, y: x * y, backward=True), (1000,), FakeTimer(),
                        torch.device("cpu"), 3000.0, with_compile=False)
    assert rows[0].status == "ok"


def test_only_gb_per_s_workloads_fall_back_to_the_copy_ceiling():
    """A workload without its own ceiling is compared with the copy bandwidth only when it counts
    bytes; in another unit it has no ceiling (no % of a bandwidth for FLOPs)."""
    import dataclasses

    spec = Spec(name="toy", title="Toy", workloads=[])
    bytes_toy = _toy(lambda x, y: x * y)
    flops_toy = dataclasses.replace(bytes_toy, unit=TFLOPS)
    assert needs_copy_ceiling(bytes_toy) and not needs_copy_ceiling(flops_toy)
    rows = measure_case(spec, flops_toy, (1000,), FakeTimer(), torch.device("cpu"), 3000.0,
                        with_compile=False)
    assert rows[0].status == "ok" and rows[0].rate == pytest.approx(3.0)  # 3e9 FLOPs in 1 ms
    assert all(r.ceiling is None and r.pct_ceiling is None for r in rows)
    with pytest.raises(ValueError, match="unit"):
        dataclasses.replace(bytes_toy, unit="ms")


def _run_toy_suite(tmp_path, monkeypatch, spec: Spec, *, match=(), graphs=False, seen=None):
    """run_suite on the CPU: a fake device, environment, copy ceiling (2000 GB/s) and clock
    (``seen``, a list, gets the timer the ceiling was measured with)."""
    import io

    from rich.console import Console

    copy = Row(spec="ceiling", op="copy (dst.copy_(src))", size="1 GiB", dtype="fp32",
               candidate="torch", status="ok", ms=1.0, rate=2000.0, unit=GBPS, ceiling=2000.0,
               ceiling_source="copy", role="ceiling")
    monkeypatch.setattr(cli, "_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(cli, "_environment", lambda: {
        "gpu": "Fake GPU", "torch": torch.__version__, "triton": "0", "cuda": None, "python": "3"})
    def ceiling(timer, device):
        if seen is not None:
            seen.append(timer)
        return copy

    monkeypatch.setattr(cli, "measure_copy_ceiling", ceiling)

    def fake_timer(warmup, rep, graphs=False):
        timer = FakeTimer()
        timer.graphs = graphs
        return timer

    monkeypatch.setattr(cli, "Timer", fake_timer)
    buffer = io.StringIO()
    code = cli.run_suite([spec], quick=True, out=tmp_path, match=match, graphs=graphs,
                         console=Console(file=buffer, width=200, color_system=None))
    return code, buffer.getvalue()


def test_run_suite_with_graphs_says_so_and_times_the_copy_ceiling_plainly(tmp_path, monkeypatch):
    import dataclasses

    w = dataclasses.replace(_toy(lambda x, y: x * y), compile_peer=False)
    seen = []
    code, out = _run_toy_suite(tmp_path, monkeypatch, Spec(name="toy", title="Toy", workloads=[w]),
                               graphs=True, seen=seen)
    assert code == 0 and "do_bench_cudagraph" in out
    assert [t.graphs for t in seen] == [False]  # a graph's memcpy node is no ceiling
    timing = json.loads((tmp_path / "meta.json").read_text())["timing"]
    assert timing["cuda_graphs"] and not timing["l2_flushed"]


def test_run_suite_writes_the_tables_csv_plot_and_meta(tmp_path, monkeypatch):
    import dataclasses

    w = dataclasses.replace(_toy(lambda x, y: x * y), compile_peer=False)
    code, out = _run_toy_suite(tmp_path, monkeypatch, Spec(name="toy", title="Toy", workloads=[w]))
    assert code == 0
    assert "Fake GPU" in out and "Summary" in out and "(150% of ref)" in out
    with open(tmp_path / "results.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [(r["spec"], r["candidate"], r["status"]) for r in read] == [
        ("ceiling", "torch", "ok"), ("toy", OURS, "ok"), ("toy", "torch eager", "ok"),
        ("toy", "broken peer", "unavailable"), ("toy", "Liger-Kernel", "unavailable")]
    assert float(read[1]["pct_of_ceiling"]) == pytest.approx(150.0)
    assert (tmp_path / "toy.png").read_bytes()[:4] == b"\x89PNG"
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["files"] == ["results.csv", "toy.png", "meta.json"]
    assert meta["specs"] == ["toy"] and meta["copy_ceiling_gbps"] == 2000.0 and meta["quick"]
    assert meta["summary"][0]["speedup"]["torch eager"] == pytest.approx(2.0)


def test_run_suite_fails_on_a_wrong_result_and_on_no_match(tmp_path, monkeypatch):
    import dataclasses

    w = dataclasses.replace(_toy(lambda x, y: x + y), compile_peer=False)
    spec = Spec(name="toy", title="Toy", workloads=[w])
    code, out = _run_toy_suite(tmp_path, monkeypatch, spec)
    assert code == 1 and "1 triton-workshop result(s) not ok" in out and "WRONG" in out
    code, out = _run_toy_suite(tmp_path / "none", monkeypatch, spec, match=["nothing like it"])
    assert code == 1 and "no benchmark case matches" in out


# --------------------------------------------------------------------------------------------
# Reports, from a fake result set.
# --------------------------------------------------------------------------------------------
def _fake_rows() -> list[Row]:
    rows = []
    for size, ours_ms in (("2^24", 0.1), ("2^26", 0.35)):
        for candidate, role, ms in ((OURS, "ours", ours_ms), ("torch eager", "reference", 2 * ours_ms),
                                    ("torch.compile", "compile", 1.1 * ours_ms)):
            rate = 4 * 4 * 2**24 / ms / 1e6
            rows.append(Row(
                spec="elementwise", op="sqrt(a*b+c)", size=size, dtype="fp32", candidate=candidate,
                status="ok", ms=ms, rate=rate, unit=GBPS, ceiling=3000.0, ceiling_source="copy",
                role=role, ratio=ms / ours_ms, headline=size == "2^26",
            ))
    rows.append(Row(spec="elementwise", op="add", size="2^26", dtype="fp32", candidate=OURS,
                    status="wrong", ms=None, rate=None, unit=GBPS, ceiling=3000.0,
                    ceiling_source="copy", role="ours", headline=True, note="output: max abs error 1"))
    rows.append(Row(spec="elementwise", op="add", size="2^26", dtype="fp32",
                    candidate="torch.compile", status="unavailable", ms=None, rate=None, unit=GBPS,
                    ceiling=3000.0, ceiling_source="copy", role="compile", headline=True,
                    note="BackendCompilerFailed: boom"))
    return rows


def test_csv_plot_meta_and_tables(tmp_path):
    rows = _fake_rows()
    csv_path = report.write_csv(tmp_path / "out" / "results.csv", rows)
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        read = list(reader)
    assert len(read) == len(rows)
    eager = next(r for r in read if r["candidate"] == "torch eager" and r["size"] == "2^26")
    assert float(eager["ratio_vs_triton_workshop"]) == pytest.approx(2.0)
    assert eager["unit"] == "GB/s" and float(eager["ms"]) == pytest.approx(0.7)
    ours = next(r for r in read if r["candidate"] == OURS and r["size"] == "2^26")
    assert float(ours["pct_of_ceiling"]) == pytest.approx(100 * (4 * 4 * 2**24 / 0.35 / 1e6) / 3000, abs=0.01)
    wrong = next(r for r in read if r["op"] == "add" and r["candidate"] == OURS)
    assert wrong["status"] == "wrong" and wrong["ms"] == "" and wrong["rate"] == ""

    png = report.write_plot(tmp_path / "out" / "elementwise.png", "Elementwise", rows, "Fake GPU")
    data = png.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"

    summary = report.summary_rows(rows)
    assert [(e["op"], e["size"], e["status"]) for e in summary] == [
        ("sqrt(a*b+c)", "2^26", "ok"), ("add", "2^26", "wrong")]
    assert summary[0]["speedup"] == {"torch eager": pytest.approx(2.0),
                                     "torch.compile": pytest.approx(1.1)}
    text = report.render_text(report.summary_table(rows))
    assert "2.00×" in text and "1.10×" in text and "WRONG" in text
    table = report.render_text(report.spec_table("Elementwise", rows))
    assert "WRONG" in table and "n/a" in table and "2.00×" in table
    assert any("BackendCompilerFailed" in p for p in report.problems(rows))

    meta = report.write_meta(tmp_path / "out" / "meta.json", {"gpu": "Fake GPU", "summary": summary})
    assert json.loads(meta.read_text())["gpu"] == "Fake GPU"


# --------------------------------------------------------------------------------------------
# The attention and conv specs through the runner, on the CPU, with a timer that only calls.
# --------------------------------------------------------------------------------------------
def _one_ms(fn):
    fn()
    return 1.0


def test_attention_case_reports_unavailable_backends_and_measures_its_ceiling():
    """An SDPA backend that cannot run the case (here: cuDNN on the CPU) is n/a, never a crash;
    the case still checks ours against SDPA math and times the GEMM ceiling."""
    import dataclasses

    from triton_workshop.bench import attention

    w = dataclasses.replace(
        _find("attention", "attention fwd causal D=64"),
        optional_peers={},
        peers={attention.SDPA_FLASH: attention.sdpa("FLASH_ATTENTION", True),
               attention.SDPA_CUDNN: attention.sdpa("CUDNN_ATTENTION", True)},
    )
    size = (1, 2, 40, 16)
    spec = Spec(name="attention", title="Attention", workloads=[w])
    rows = measure_case(spec, w, size, _one_ms, runtime.DEVICE, None, with_compile=False,
                        headline=True)
    by = {r.candidate: r for r in rows}
    assert list(by) == [OURS, attention.SDPA_MATH, attention.SDPA_FLASH, attention.SDPA_CUDNN]
    assert by[OURS].status == by[attention.SDPA_MATH].status == "ok"
    if not torch.cuda.is_available():
        assert by[attention.SDPA_CUDNN].status == "unavailable" and by[attention.SDPA_CUDNN].note
    assert by[OURS].ceiling == pytest.approx(rate_of(w.work(size, w.dtype), 1.0, TFLOPS))
    table = report.render_text(report.spec_table(spec.title, rows))
    assert attention.SDPA_CUDNN in table and "TFLOP/s" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the backends exist")
def test_attention_cuda_backends_are_reported_missing_on_the_cpu():
    from triton_workshop.bench import attention

    found = _find("attention", "attention fwd D=128").candidates(with_compile=False)
    for name in (attention.SDPA_FLASH, attention.SDPA_CUDNN):
        assert isinstance(found[name], str) and "needs a CUDA GPU" in found[name]


def test_attention_gemm_ceiling_runs_forward_and_backward():
    from triton_workshop.bench import attention

    w = _find("attention", "attention fwd+bwd causal D=64")
    size = (1, 2, 8, 4)
    q, k, v = w.make_inputs(size, w.dtype, runtime.DEVICE)
    grads = torch.autograd.grad(w.ceiling(q, k, v), (q, k, v), torch.ones_like(q))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    m, n, inner = attention.gemm_shape(size, w.work(size, w.dtype))
    assert [t.shape for t in attention._OPERANDS[q]] == [(m, inner), (inner, n)]


def test_conv_case_times_both_cudnn_layouts_and_the_gemm_ceiling():
    from triton_workshop.bench import conv

    w = _find("conv", "conv2d 3x3 channels_last")
    size = (2, 8, 6, 6)
    spec = Spec(name="conv", title="Conv", workloads=[w])
    rows = measure_case(spec, w, size, _one_ms, runtime.DEVICE, None, with_compile=False,
                        headline=True)
    assert [(r.candidate, r.status) for r in rows] == [
        (OURS, "ok"), (conv.CUDNN_CHANNELS_LAST, "ok"), (conv.CUDNN_NCHW, "ok")]
    assert rows[0].ceiling == pytest.approx(rate_of(w.work(size, w.dtype), 1.0, TFLOPS))
    assert rows[0].ceiling_source == conv.CEILING_NAME


def test_conv_inputs_layouts_and_peers():
    from triton_workshop.bench import conv

    nchw, last = _find("conv", "conv2d 3x3 NCHW"), _find("conv", "conv2d 3x3 channels_last")
    x, weight = nchw.make_inputs((2, 8, 6, 6), torch.float16, runtime.DEVICE)
    assert x.is_contiguous() and weight.is_contiguous()
    x, weight = last.make_inputs((2, 8, 6, 6), torch.float16, runtime.DEVICE)
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert weight.is_contiguous(memory_format=torch.channels_last)
    # The other layout's copy is made once and reused by every timed call.
    nchw_x = conv.in_layout(x, torch.contiguous_format)
    assert nchw_x.is_contiguous() and conv.in_layout(x, torch.contiguous_format) is nchw_x
    torch.testing.assert_close(nchw_x, x)
    # The ceiling's GEMM has the conv's output shape (channels-last in memory, as an NHWC GEMM).
    out = last.ceiling(x, weight)
    assert out.shape == (2, 8, 6, 6) and out.is_contiguous(memory_format=torch.channels_last)
