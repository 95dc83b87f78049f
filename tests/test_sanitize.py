"""scripts/sanitize.py, the parts that run without a GPU: its cases cover every public op and
every kernel, each case launches the kernels it names, and the sanitizer's output is read right
(counts, which case a report belongs to, a process that stopped half-way)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import triton_workshop as tw

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sanitize.py"


def _load():
    spec = importlib.util.spec_from_file_location("sanitize_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


sanitize = _load()

#: What the package exports that launches no kernel of its own.
NOT_OPS = {
    "get_filter",  # returns a filter's weights: a small CPU tensor
    "autocast_linear",  # torch's GEMMs (cuBLAS) under autocast, no Triton kernel
}


def test_every_public_op_is_in_a_case():
    from triton_workshop.ops import layout

    ops = {name for name in tw.__all__
           if getattr(getattr(tw, name), "__module__", "").startswith("triton_workshop.ops.")}
    ops -= NOT_OPS
    assert {"add", "matmul", "linear", "conv2d", "attention", "layer_norm_linear"} <= ops
    ops |= {"transpose_copy", "to_channels_last"}  # layout's, used by conv2d
    covered = {op for case in sanitize.CASES for op in case.ops}
    assert ops - covered == set(), f"public ops without a case: {sorted(ops - covered)}"
    assert covered - ops == set(), f"cases name unknown ops: {sorted(covered - ops)}"
    assert callable(layout.transpose_copy) and callable(layout.to_channels_last)


def test_every_kernel_is_in_a_case():
    kernels = sanitize.library_kernels()
    assert len(kernels) >= 25, sorted(kernels)
    named = {k for case in sanitize.CASES for k in case.kernels}
    incidental = {k for case in sanitize.CASES for k in case.incidental}
    assert set(kernels) - named - incidental == set(), "kernels no case launches"
    assert named | incidental <= set(kernels), "cases name kernels that do not exist"
    # The paths the issue lists, each in a case of its own.
    for path, kernel in [("softmax_online", "softmax_fwd_online_kernel"),
                         ("layer_norm_chunked", "layer_norm_bwd_dwdb_chunked_kernel"),
                         ("layer_norm_wide", "layer_norm_bwd_dx_chunked_kernel"),
                         ("matmul_tma", "matmul_tma_kernel"),
                         ("conv2d_channels_last", "conv2d_implicit_gemm_kernel"),
                         ("attention", "attn_bwd_dq_kernel")]:
        assert kernel in sanitize.CASES_BY_NAME[path].kernels
    assert sanitize.CASES_BY_NAME["matmul_tma"].needs_hopper
    assert len(sanitize.CASES_BY_NAME) == len(sanitize.CASES)


@pytest.mark.slow
@pytest.mark.skipif(not tw.INTERPRET, reason="the GPU run of the script checks this there")
def test_each_case_launches_its_kernels_in_the_interpreter():
    """Every case runs (forward and backward) and launches the kernels it names, and no other
    but its incidental ones."""
    torch.manual_seed(0)
    launched_by = {}
    for case in sanitize.CASES:
        launched: set = set()
        with sanitize.recording_launches(launched):
            case.run("cpu")
        launched_by[case.name] = launched
        assert set(case.kernels) <= launched, (case.name, launched)
        assert launched <= set(case.kernels) | set(case.incidental), (case.name, launched)
    assert launched_by["layout"] == {"transpose_kernel"}
    # The hooks are gone afterwards.
    assert all(sanitize._launch_recorder_target(k).pre_run_hooks == []
               for k in sanitize.library_kernels().values())


# --------------------------------------------------------------------------------------------
# Reading compute-sanitizer's output (samples in its format).
# --------------------------------------------------------------------------------------------
MEMCHECK_CLEAN = """\
========= COMPUTE-SANITIZER
@@sanitize begin add
@@sanitize end add ok
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_RUN = """\
========= COMPUTE-SANITIZER
@@sanitize begin add
@@sanitize end add ok
@@sanitize begin matmul
========= Invalid __global__ read of size 16 bytes
=========     at matmul_kernel+0x1b40 in /work/src/triton_workshop/ops/matmul.py:262
=========     by thread (5,0,0) in block (2,0,0)
=========     Address 0x7f3c9e000ffc is out of bounds
=========     and is 4 bytes after the nearest allocation at 0x7f3c9e000000 of size 4092 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2dfbef] in libcuda.so.1
=========         Host Frame: launch in __triton_launcher.so
=========
========= Invalid __global__ read of size 16 bytes
=========     at matmul_kernel+0x1b40 in /work/src/triton_workshop/ops/matmul.py:262
=========     by thread (6,0,0) in block (2,0,0)
=========
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMemcpyAsync.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x333] in libtorch_cuda.so
=========
@@sanitize end matmul ok
@@sanitize begin softmax
========= Invalid __global__ write of size 4 bytes
=========     at void at::native::vectorized_elementwise_kernel<4>(int, at::native::FillFunctor<float>)+0x90
=========     by thread (0,0,0) in block (0,0,0)
=========
Traceback (most recent call last):
RuntimeError: CUDA error: unspecified launch failure
@@sanitize end softmax failed: RuntimeError: CUDA error: unspecified launch failure
========= Invalid __global__ read of size 4 bytes
=========     at add_kernel+0x10 in elementwise.py:35
=========
========= Target application returned an error
========= ERROR SUMMARY: 5 errors
"""

RACECHECK_RUN = """\
========= COMPUTE-SANITIZER
@@sanitize begin attention
========= Error: Race reported between Write access at attn_fwd_kernel+0x1a40 in attention.py:402
=========     and Read access at attn_fwd_kernel+0x1b00 in attention.py:405 [512 hazards]
=========
========= Warning: Race reported between Read access at attn_bwd_dq_kernel+0x100 in attention.py:720
=========     and Write access at attn_bwd_dq_kernel+0x180 in attention.py:722 [4 hazards]
=========
@@sanitize end attention ok
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""


def test_parse_summary_reads_the_closing_counts():
    assert sanitize.parse_summary(MEMCHECK_CLEAN) == {"errors": 0, "warnings": None}
    assert sanitize.parse_summary(MEMCHECK_RUN) == {"errors": 5, "warnings": None}
    assert sanitize.parse_summary("========= ERROR SUMMARY: 1 error\n") == {"errors": 1, "warnings": None}
    assert sanitize.parse_summary(RACECHECK_RUN) == {"errors": 1, "warnings": 1}
    # Two processes' summaries in one text: the last one.
    both = MEMCHECK_RUN + "\n" + MEMCHECK_CLEAN
    assert sanitize.parse_summary(both)["errors"] == 0
    assert sanitize.parse_summary("Traceback ...\nKilled\n") == {"errors": None, "warnings": None}


def test_reports_are_put_down_to_the_case_that_ran_them():
    names = ["add", "matmul", "softmax", "layout"]
    results, outside = sanitize.split_by_case(MEMCHECK_RUN, names)
    assert results["add"].status == "ok" and results["add"].reports == []
    matmul = results["matmul"]
    assert matmul.status == "ok"
    assert [r.kind for r in matmul.reports] == ["error", "error", "api"]
    assert matmul.count("error") == 2 and matmul.count("api") == 1
    first = matmul.reports[0]
    assert first.headline == "Invalid __global__ read of size 16 bytes"
    assert "Address 0x7f3c9e000ffc is out of bounds" in first.lines
    assert first.kernel(["add_kernel", "matmul_kernel"]) == "matmul_kernel"
    assert matmul.reports[2].kernel(["matmul_kernel"]) is None  # a CUDA call, no kernel
    softmax = results["softmax"]
    assert softmax.status == "failed" and "unspecified launch failure" in softmax.detail
    assert softmax.reports[0].kernel(["softmax_fwd_kernel"]) is None  # torch's fill kernel
    assert results["layout"].status == "not run"
    # After the last case: not any case's.
    assert [r.headline for r in outside] == ["Invalid __global__ read of size 4 bytes"]


def test_racecheck_errors_and_warnings():
    results, outside = sanitize.split_by_case(RACECHECK_RUN, ["attention"])
    attention = results["attention"]
    assert [r.kind for r in attention.reports] == ["error", "warning"]
    assert attention.reports[0].kernel(["attn_fwd_kernel", "attn_bwd_dq_kernel"]) == "attn_fwd_kernel"
    assert outside == []


def test_a_process_that_ends_inside_a_case():
    text = ("@@sanitize begin add\n@@sanitize end add ok\n@@sanitize begin conv2d_nchw\n"
            "========= Invalid __global__ write of size 2 bytes\n"
            "=========     at conv2d_implicit_gemm_kernel+0x40 in conv.py:400\n"
            "Segmentation fault\n")
    results, outside = sanitize.split_by_case(text, ["add", "conv2d_nchw", "layout"])
    crashed = results["conv2d_nchw"]
    assert crashed.status == "crashed" and crashed.count("error") == 1
    assert "ended during this case" in crashed.detail
    assert results["layout"].status == "not run" and outside == []


def test_coverage_records_the_kernels_a_case_launched():
    text = ("@@sanitize begin matmul\n@@sanitize kernels matmul matmul_kernel,pad_copy_kernel\n"
            "@@sanitize end matmul ok\n@@sanitize begin layout\n"
            "@@sanitize kernels layout \n@@sanitize end layout ok\n")
    results, _ = sanitize.split_by_case(text, ["matmul", "layout"])
    assert results["matmul"].kernels == ("matmul_kernel", "pad_copy_kernel")
    cases = [sanitize.CASES_BY_NAME["matmul"], sanitize.CASES_BY_NAME["layout"]]
    assert sanitize.coverage_problems(cases, results) == {
        "layout": {"missing": ["transpose_kernel"], "unexpected": []}}


def _pass(text, names):
    results, outside = sanitize.split_by_case(text, names)
    return {"cases": results, "outside": outside, "summaries": [sanitize.parse_summary(text)],
            "returncodes": [0], "refused": ""}


def test_table_and_verdict():
    names = ["add", "matmul", "softmax", "layout"]
    cases = [sanitize.CASES_BY_NAME[n] for n in names]
    clean = ("========= COMPUTE-SANITIZER\n"
             + "".join(f"@@sanitize begin {n}\n@@sanitize end {n} ok\n" for n in names)
             + "========= ERROR SUMMARY: 0 errors\n")
    passes = {"memcheck": _pass(MEMCHECK_RUN, names), "initcheck": _pass(clean, names)}
    table = sanitize.format_table(cases, ["memcheck", "initcheck"], passes,
                                  sorted(sanitize.library_kernels()))
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:]}
    assert rows["add"] == ["0", "0"]
    assert rows["matmul"] == ["2", "+1", "other", "0"]
    assert rows["softmax"] == ["0", "+1", "other", "failed", "0"]
    assert rows["layout"] == ["not", "run", "0"]
    assert rows["(outside"] == ["cases)", "1", "0"]
    assert rows["ERROR"] == ["SUMMARY", "5", "0"]
    assert sanitize.pass_failed(passes["memcheck"])
    assert not sanitize.pass_failed(passes["initcheck"])
    clean_but_api = _pass(MEMCHECK_CLEAN.replace(
        "@@sanitize end add ok", "========= Program hit cudaErrorNotReady (error 600)\n"
                                 "@@sanitize end add ok"), ["add"])
    assert sanitize.pass_failed(clean_but_api)  # a failed CUDA call counts too


def test_a_pass_goes_on_in_a_new_process_after_a_case_breaks_the_context(monkeypatch, tmp_path):
    """The child stops at a case that lost the CUDA context; the cases after it run in a new
    child, and the results of both are put together."""
    calls = []
    outputs = [
        ("@@sanitize begin add\n@@sanitize end add ok\n@@sanitize begin matmul\n"
         "========= Invalid __global__ read of size 4 bytes\n=========     at matmul_kernel+0x1\n"
         "=========\n@@sanitize end matmul failed: RuntimeError: CUDA error: an illegal memory access\n"
         "========= ERROR SUMMARY: 1 error\n", 3),
        ("@@sanitize begin softmax\n@@sanitize end softmax ok\n@@sanitize begin layout\n"
         "@@sanitize end layout ok\n========= ERROR SUMMARY: 0 errors\n", 0),
    ]

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        text, code = outputs[len(calls) - 1]
        return subprocess.CompletedProcess(cmd, code, stdout=text)

    monkeypatch.setattr(sanitize.subprocess, "run", fake_run)
    with open(tmp_path / "memcheck.log", "w") as log:
        result = sanitize.run_pass(["add", "matmul", "softmax", "layout"],
                                   ["compute-sanitizer", "--tool", "memcheck"], False, 60, log)
    assert [c[c.index("--run") + 1] for c in calls] == ["add,matmul,softmax,layout", "softmax,layout"]
    assert calls[0][:3] == ["compute-sanitizer", "--tool", "memcheck"]
    statuses = {n: c.status for n, c in result["cases"].items()}
    assert statuses == {"add": "ok", "matmul": "failed", "softmax": "ok", "layout": "ok"}
    assert result["cases"]["matmul"].count("error") == 1
    assert [s["errors"] for s in result["summaries"]] == [1, 0] and result["returncodes"] == [3, 0]
    log_text = (tmp_path / "memcheck.log").read_text()
    assert "an illegal memory access" in log_text and log_text.count("$ compute-sanitizer") == 2


def test_a_refusing_sanitizer_is_recognised(monkeypatch, tmp_path):
    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(
            cmd, 1, stdout="========= COMPUTE-SANITIZER\n========= Error: Device not supported\n")

    monkeypatch.setattr(sanitize.subprocess, "run", fake_run)
    with open(tmp_path / "log", "w") as log:
        result = sanitize.run_pass(["add"], ["compute-sanitizer"], False, 60, log)
    assert result["refused"] == "Device not supported"


def test_children_run_with_one_config_and_uncached_memory():
    env = sanitize._child_env(sanitized=True)
    assert env["TRITON_WORKSHOP_AUTOTUNE"] == "0"
    assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT / "src")
    plain = sanitize._child_env(sanitized=False)
    assert plain["TRITON_WORKSHOP_AUTOTUNE"] == "0"
    assert plain.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")


def test_find_sanitizer_honours_an_explicit_path(tmp_path, monkeypatch):
    tool = tmp_path / "compute-sanitizer"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert sanitize.find_sanitizer(str(tool)) == str(tool)
    monkeypatch.setenv("COMPUTE_SANITIZER", str(tool))
    assert sanitize.find_sanitizer() == str(tool)


def _stand_in_children(failing_tool=None):
    """subprocess.run for main(): children that print what the real ones print (markers, the
    coverage pass's kernels, the sanitizer's summary); ``failing_tool``'s reports one error in
    the attention case."""
    seen = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        names = cmd[cmd.index("--run") + 1].split(",")
        tool = cmd[cmd.index("--tool") + 1] if "--tool" in cmd else None
        lines = ["========= COMPUTE-SANITIZER"] if tool else []
        for name in names:
            lines.append(f"@@sanitize begin {name}")
            if "--record" in cmd:  # as on a GPU: the incidental copies too
                case = sanitize.CASES_BY_NAME[name]
                lines.append(f"@@sanitize kernels {name} {','.join(case.kernels + case.incidental)}")
            if tool == failing_tool and name == "attention":
                lines += ["========= Invalid __global__ read of size 2 bytes",
                          "=========     at attn_fwd_kernel+0x40 in attention.py:470", "========="]
            lines.append(f"@@sanitize end {name} ok")
        if tool:
            errors = int(tool == failing_tool)
            lines.append(f"========= ERROR SUMMARY: {errors} error{'s' * (errors != 1)}")
        return subprocess.CompletedProcess(cmd, 0, stdout="\n".join(lines) + "\n")

    return run, seen


@pytest.mark.parametrize("failing_tool", [None, "racecheck"], ids=["clean", "an-error"])
def test_main_runs_coverage_then_each_tool(monkeypatch, tmp_path, capsys, failing_tool):
    tool = tmp_path / "compute-sanitizer"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU stand-in")
    run, seen = _stand_in_children(failing_tool)
    monkeypatch.setattr(sanitize.subprocess, "run", run)
    out = tmp_path / "logs"
    code = sanitize.main(["--sanitizer", str(tool), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == (1 if failing_tool else 0), printed
    # The plain pass first (no sanitizer, recording), then one child per tool.
    assert "--record" in seen[0] and str(tool) not in seen[0]
    assert [c[c.index("--tool") + 1] for c in seen[1:]] == list(sanitize.DEFAULT_TOOLS)
    assert all(c[c.index("--run") + 1].split(",") == [k.name for k in sanitize.CASES]
               for c in seen)
    assert sorted(p.name for p in out.iterdir()) == [
        "coverage.log", "initcheck.log", "memcheck.log", "racecheck.log", "summary.json"]
    table = printed[printed.index("case "):]
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:] if line.strip()}
    assert rows["attention"] == (["0", "1", "0"] if failing_tool else ["0", "0", "0"])
    assert rows["matmul_tma"] == ["0", "0", "0"] and len(rows) >= len(sanitize.CASES)
    summary = __import__("json").loads((out / "summary.json").read_text())
    assert summary["coverage"] == {"problems": {}, "not_ok": {}, "uncovered": [],
                                   "launched": {c.name: list(c.kernels + c.incidental)
                                                for c in sanitize.CASES}}
    assert summary["passes"]["racecheck"]["cases"]["attention"]["errors"] == int(bool(failing_tool))
    assert ("clean" in printed.splitlines()[-1]) is (failing_tool is None)


def test_list_prints_every_case():
    done = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()]
    assert listed == [c.name for c in sanitize.CASES]


def test_unknown_case_or_tool_is_refused():
    assert sanitize.main(["--cases", "nope"]) == 2
    assert sanitize.main(["--tools", "leakcheck"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert "no CUDA GPU" in done.stderr and "nothing was run" in done.stderr
