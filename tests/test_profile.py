"""``workshop profile``: every piece that needs no GPU (the work each op must do, the occupancy
arithmetic, the verdict, the roofline picture, reading a profiler trace, the ncu command) on the
CPU; the whole command on a GPU; and on a CPU, a clear refusal with exit code 2."""

import json
import shlex
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from triton_workshop import cli, runtime
from triton_workshop.teach.profile import (
    EXERCISE_TARGETS,
    TARGETS,
    DeviceLimits,
    Roofline,
    export_trace,
    find_compiled,
    kernel_info,
    kernels_by_annotation,
    ncu_command,
    occupancy,
    parse_dtype,
    parse_size,
    resolve,
    roofline_png,
    run_profile,
    uses_tensor_cores,
    waves,
    work,
)

gpu_only = pytest.mark.skipif(runtime.INTERPRET or not torch.cuda.is_available(),
                              reason="needs a CUDA GPU")
cpu_only = pytest.mark.skipif(not runtime.INTERPRET, reason="on a GPU the profile runs")

SMALL = {"add": (1000,), "fused_mul_add_sqrt": (999,), "greyscale": (17, 23),
         "sepia": (17, 23), "filter2d": (17, 23, 3), "softmax": (7, 33), "layer_norm": (7, 33),
         "matmul": (7, 9, 11), "attention": (1, 2, 8, 16), "conv2d": (2, 3, 8, 8, 4, 3)}


def flat(text):
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------
# The work per op.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_bytes_moved_are_the_inputs_and_the_output(name):
    """Each input read once and the output written once: the formula agrees with the tensors."""
    target = TARGETS[name]
    size = SMALL[name]
    gen = torch.Generator().manual_seed(0)
    out_numel = target.torch_op(*target.make_inputs(size, torch.float32, torch.device("cpu"),
                                                    gen)).numel()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        inputs = target.make_inputs(size, dtype, torch.device("cpu"), gen)
        actual = (sum(t.numel() * t.element_size() for t in inputs)
                  + out_numel * torch.empty((), dtype=dtype).element_size())
        assert work(target, size, dtype)[0] == actual, dtype


@pytest.mark.parametrize("name", ["matmul", "conv2d"])
def test_flops_agree_with_torch_flop_counter(name):
    target = TARGETS[name]
    size = SMALL[name]
    inputs = target.make_inputs(size, torch.float32, torch.device("cpu"),
                                torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        target.torch_op(*inputs)
    assert work(target, size, torch.float32)[1] == counter.get_total_flops()


def test_attention_flops_are_its_two_products():
    b, h, n, d = SMALL["attention"]
    q, k, v = TARGETS["attention"].make_inputs((b, h, n, d), torch.float32, torch.device("cpu"),
                                               torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    assert work(TARGETS["attention"], (b, h, n, d), torch.float32)[1] == counter.get_total_flops()


def test_elementwise_flops_per_element():
    assert work(TARGETS["add"], (1000,), torch.float32) == (12000, 1000)
    assert work(TARGETS["fused_mul_add_sqrt"], (10,), torch.float16) == (80, 30)
    assert work(TARGETS["softmax"], (4, 8), torch.float16) == (128, 160)
    assert work(TARGETS["layer_norm"], (4, 8), torch.float32) == ((64 + 16) * 4, 224)


def test_every_exercise_has_a_target():
    assert sorted(EXERCISE_TARGETS) == list(range(1, 9))
    assert all(name in TARGETS for name, _ in EXERCISE_TARGETS.values())


# --------------------------------------------------------------------------------------------
# Parsing what the user typed.
# --------------------------------------------------------------------------------------------
def test_sizes_and_dtypes():
    matmul = TARGETS["matmul"]
    assert parse_size("4096,2048,1024", matmul) == (4096, 2048, 1024)
    assert parse_size("64x32x16", matmul) == (64, 32, 16)
    assert parse_size(None, matmul) == matmul.default_size
    with pytest.raises(ValueError, match=r"--size for matmul is M,N,K \(3 whole numbers\)"):
        parse_size("4096,4096", matmul)
    with pytest.raises(ValueError, match="whole numbers"):
        parse_size("a,b,c", matmul)
    with pytest.raises(ValueError, match="at least 1"):
        parse_size("0,4,4", matmul)
    assert parse_dtype("bf16", matmul) == torch.bfloat16
    assert parse_dtype(None, TARGETS["add"]) == torch.float32
    with pytest.raises(ValueError, match="--dtype must be one of"):
        parse_dtype("int8", matmul)


def test_resolve_ops_and_exercises():
    plan = resolve("layer_norm", "128,256", "float32")
    assert plan.exercise is None and plan.size == (128, 256) and plan.dtype == torch.float32
    assert plan.label == "triton_workshop.layer_norm"
    plan = resolve("6")
    assert plan.exercise == 6 and plan.target.name == "layer_norm"
    assert plan.path.name == "exercise_6.py"
    assert resolve("8", solution=True).path.name == "solution_8.py"
    with pytest.raises(ValueError, match="exercise must be one of .*got 9"):
        resolve("9")
    with pytest.raises(ValueError, match="unknown op or exercise 'nope'"):
        resolve("nope")
    with pytest.raises(ValueError, match="--solution goes with an exercise number"):
        resolve("matmul", solution=True)


# --------------------------------------------------------------------------------------------
# Occupancy, waves, the roofline and the verdict.
# --------------------------------------------------------------------------------------------
def test_occupancy_bounds():
    h100 = DeviceLimits()
    # 128 registers x 256 threads = 32768 of 65536: two programs, 16 of 64 warps.
    occ = occupancy(128, 0, 8, h100)
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.limiter) == (2, 16, "registers")
    assert occ.fraction == pytest.approx(0.25)
    # 32 registers, 4 warps: 16 programs fill all 64 warp slots.
    occ = occupancy(32, 0, 4, h100)
    assert (occ.blocks_per_sm, occ.fraction) == (16, 1.0)
    # 100 KiB of shared memory each (+1 KiB reserved): two fit in 228 KiB.
    occ = occupancy(64, 100 * 1024, 4, h100)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared memory")
    # Tiny single-warp programs hit the 32-programs-per-SM limit.
    occ = occupancy(16, 0, 1, h100)
    assert (occ.blocks_per_sm, occ.limiter, occ.fraction) == (32, "blocks", 0.5)
    # Registers are allocated per warp in chunks of 256: 33 registers cost as much as 40.
    assert occupancy(33, 0, 4, h100) == occupancy(40, 0, 4, h100)
    with pytest.raises(ValueError, match="num_warps"):
        occupancy(32, 0, 0, h100)


def test_waves():
    assert waves(132 * 2, 2, 132) == 1.0
    assert waves(1000, 1, 132) == pytest.approx(7.58, abs=0.01)


def test_memory_bound_verdict():
    # 1 GB moved and 1 GFLOP in 1 ms: 1000 GB/s, 1 FLOP/byte, far below a ridge of ~233.
    point = Roofline(bytes=10**9, flops=10**9, seconds=1e-3, copy_gbps=3000.0, peak_tflops=700.0)
    assert point.bound == "memory"
    assert point.ridge == pytest.approx(233.3, abs=0.1)
    assert point.gbps == pytest.approx(1000.0) and point.tflops == pytest.approx(1.0)
    assert point.roof_tflops == pytest.approx(3.0)  # 1 FLOP/byte at 3000 GB/s
    text = point.verdict()
    assert text.startswith("memory-bound") and "33% of the copy bandwidth" in text
    assert "Far below the roof" in text


def test_compute_bound_verdict():
    n = 4096
    point = Roofline(bytes=3 * n * n * 2, flops=2 * n ** 3, seconds=2 * n ** 3 / 600e12,
                     copy_gbps=3000.0, peak_tflops=700.0)
    assert point.bound == "compute" and point.intensity == pytest.approx(1365.3, abs=0.1)
    assert point.roof_tflops == pytest.approx(700.0)
    text = point.verdict()
    assert text.startswith("compute-bound") and "86% of cuBLAS's 700 TFLOP/s" in text
    assert "Far below" not in text


def test_roofline_png(tmp_path):
    ours = Roofline(10**9, 10**9, 1e-3, 3000.0, 700.0)
    theirs = Roofline(10**9, 10**9, 2e-3, 3000.0, 700.0)
    path = roofline_png(tmp_path / "sub" / "roofline.png", [("ours", ours), ("torch", theirs)],
                        title="softmax 8192x8192 float16")
    with Image.open(path) as img:
        assert img.format == "PNG" and img.width >= 600 and img.height >= 400
        colours = img.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 20  # axes, roof, points, text: not blank
    with pytest.raises(ValueError, match="at least one"):
        roofline_png(tmp_path / "empty.png", [])


# --------------------------------------------------------------------------------------------
# Kernels: what the profiler recorded, completed from the compiled kernel.
# --------------------------------------------------------------------------------------------
def _event(name, ts, dur=5.0, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": args}


def _annotation(name, ts, dur, cat="gpu_user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_kernels_are_grouped_by_their_annotation(tmp_path):
    trace = {"traceEvents": [
        _annotation("ours", 100, 50), _annotation("torch", 200, 50),
        _annotation("ours", 90, 70, cat="user_annotation"),
        _event("matmul_kernel", 110, grid=[64, 1, 1], block=[256, 1, 1]),
        _event("epilogue_kernel", 130),
        _event("sm90_xmma_gemm", 210),
        _event("stray", 400),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 205, "dur": 3},
    ]}
    grouped = kernels_by_annotation(trace, ["ours", "torch"])
    assert [e["name"] for e in grouped["ours"]] == ["matmul_kernel", "epilogue_kernel"]
    assert [e["name"] for e in grouped["torch"]] == ["sm90_xmma_gemm"]
    assert [e["name"] for e in grouped["other"]] == ["stray"]
    # Without GPU-side annotations the CPU ranges are used; a file path works too.
    cpu_only_trace = {"traceEvents": [_annotation("ours", 100, 20, cat="user_annotation"),
                                      _event("k", 105)]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(cpu_only_trace))
    assert [e["name"] for e in kernels_by_annotation(path, ["ours"])["ours"]] == ["k"]


def _compiled(name, warps, regs, shared, spills=0, ptx=""):
    meta = SimpleNamespace(shared=shared, num_warps=warps, num_stages=3, warp_size=32)
    return SimpleNamespace(name=name, metadata=meta, n_regs=regs, n_spills=spills,
                           asm={"ptx": ptx})


def test_kernel_info_from_the_trace_and_the_compiled_kernel():
    event = _event("matmul_kernel", 0, dur=812.5, grid=[528, 1, 1], block=[256, 1, 1],
                   **{"registers per thread": 168, "shared memory": 131072})
    # Two autotuned variants share the name; the launched one matches the threads and registers.
    other = _compiled("matmul_kernel", 4, 96, 65536)
    launched = _compiled("matmul_kernel", 8, 168, 131072, spills=0,
                         ptx="wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16")
    assert find_compiled(event, [other, launched, _compiled("x", 8, 168, 131072)]) is launched
    assert find_compiled(event, [_compiled("x", 8, 168, 131072)]) is None
    info = kernel_info(event, launched)
    assert (info.grid, info.programs, info.threads, info.num_warps) == ((528, 1, 1), 528, 256, 8)
    assert (info.regs, info.spills, info.shared, info.num_stages) == (168, 0, 131072, 3)
    assert info.tensor_cores is True and info.gpu_us == 812.5
    # From the trace alone: no spills or tensor-core answer, warps from the threads.
    bare = kernel_info(_event("k", 0, grid=[10, 2, 1], block=[128, 1, 1],
                              **{"registers per thread": 40}))
    assert (bare.num_warps, bare.regs, bare.spills, bare.tensor_cores) == (4, 40, None, None)


def test_tensor_cores_from_the_ptx():
    assert uses_tensor_cores("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    assert uses_tensor_cores("wgmma.mma_async.sync.aligned.m64n64k16")
    assert not uses_tensor_cores("fma.rn.f32 %f1, %f2, %f3, %f4; ld.global.v4.f32")


def test_export_trace_writes_a_chrome_trace_with_the_ranges(tmp_path):
    a = torch.randn(64, 64)
    path = export_trace([("ours: mm", lambda: a @ a), ("torch: softmax", lambda: a.softmax(-1))],
                        tmp_path / "trace.json", cuda=False)
    trace = json.loads(path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"ours: mm", "torch: softmax"} <= names
    grouped = kernels_by_annotation(trace, ["ours: mm", "torch: softmax"])
    assert set(grouped) == {"ours: mm", "torch: softmax", "other"}


def test_ncu_command():
    plan = resolve("matmul", "4096,4096,4096", "fp16")
    command = ncu_command(plan, ["matmul_kernel", "matmul_kernel"], "workshop-output/profile-matmul")
    argv = shlex.split(command)
    assert argv[0] == "ncu" and "--profile-from-start" in argv and "off" in argv
    assert "regex:matmul_kernel" in argv
    tail = argv[argv.index("workshop"):]
    assert tail == ["workshop", "profile", "matmul", "--size", "4096,4096,4096",
                    "--dtype", "float16", "--run-once"]
    assert argv[argv.index("-o") + 1] == "workshop-output/profile-matmul/ncu-matmul"
    exercise = ncu_command(resolve("6", solution=True), ["layer_norm_fwd_kernel"], "out")
    assert exercise.endswith("--run-once --solution")


# --------------------------------------------------------------------------------------------
# The command.
# --------------------------------------------------------------------------------------------
@cpu_only
def test_without_a_gpu_it_says_what_and_why_and_exits_2(capsys):
    assert cli.main(["profile", "matmul", "--size", "256,256,256"]) == 2
    out = flat(capsys.readouterr().out)
    assert "triton_workshop.matmul, float16, M,N,K = 256,256,256" in out
    assert "393 kB moved and 33.6 MFLOP, 85.3 FLOP per byte" in out
    assert "registers per thread" in out and "roofline PNG" in out and "ncu" in out
    assert "It cannot run here" in out and "machine with an NVIDIA GPU" in out
    assert cli.main(["profile", "6"]) == 2
    assert "exercises/exercise_6.py" in flat(capsys.readouterr().out)


def test_bad_input_is_one_sentence_and_exit_2(capsys):
    for argv, expected in ((["profile", "nope"], "unknown op or exercise 'nope'"),
                           (["profile", "9"], "exercise must be one of"),
                           (["profile", "matmul", "--size", "1,2"], "--size for matmul is M,N,K"),
                           (["profile", "softmax", "--dtype", "int4"], "--dtype must be one of")):
        assert cli.main(argv) == 2
        out = flat(capsys.readouterr().out)
        assert out.startswith("❌") and expected in out and "Traceback" not in out


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("argv", [["matmul", "1024,1024,1024"], ["layer_norm", "4096,1024"]],
                         ids=["matmul", "layer_norm"])
def test_profile_on_a_gpu(tmp_path, capsys, argv):
    assert run_profile(argv[0], argv[1], out=tmp_path) == 0
    out = capsys.readouterr().out
    assert "Kernels launched" in out and "Verdict" in out and "ncu --set full" in out
    assert (tmp_path / "roofline.png").stat().st_size > 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])


@gpu_only
@pytest.mark.gpu
def test_profile_an_exercise_solution_on_a_gpu(tmp_path, capsys):
    assert run_profile("6", "4096,1024", solution=True, out=tmp_path) == 0
    out = capsys.readouterr().out
    assert "layer_norm_fwd_kernel" in out and "Verdict: memory-bound" in flat(out)
    assert run_profile("6", "4096,1024", solution=True, run_once=True, out=tmp_path) == 0
