"""scripts/gpu_tests.py: the suite dealt into one shard a GPU, and the outcome counted from each
shard's log (finished or cut off)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_tests", ROOT / "scripts" / "gpu_tests.py")
gpu_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_tests)


def test_every_file_lands_in_exactly_one_shard_of_about_equal_size(tmp_path):
    sizes = [900, 700, 500, 400, 300, 200, 100, 50]
    files = []
    for i, size in enumerate(sizes):
        f = tmp_path / f"test_{i}.py"
        f.write_text("x" * size)
        files.append(f)
    shards = gpu_tests.deal(files, 3)
    assert sorted(p.name for g in shards for p in g) == sorted(f.name for f in files)
    totals = [sum(p.stat().st_size for p in g) for g in shards]
    assert max(totals) - min(totals) <= max(sizes)


def test_outcomes_are_counted_from_a_cut_off_xdist_log_and_a_serial_one():
    xdist = ("[gw0] [ 10%] PASSED tests/test_a.py::t1 \n[gw1] [ 20%] FAILED tests/test_a.py::t2 \n"
             "[gw0] [ 30%] SKIPPED tests/test_b.py::t3 \n[gw2] [ 40%] ERROR tests/test_b.py::t4 \n"
             "tests/test_b.py::t5 \n")
    assert gpu_tests.count(xdist) == {"PASSED": 1, "FAILED": 1, "ERROR": 1, "SKIPPED": 1}
    serial = "tests/test_a.py::t1 PASSED [ 50%]\ntests/test_a.py::t2 FAILED [100%]\n"
    assert gpu_tests.count(serial) == {"PASSED": 1, "FAILED": 1, "ERROR": 0, "SKIPPED": 0}


def test_a_run_on_this_machine_writes_the_table(tmp_path):
    # test_elementwise.py holds a big-memory test (skipped without a GPU): only that one of it.
    code = gpu_tests.main(["--out", str(tmp_path), "--shards", "2", "--workers", "1", "--deadline", "300",
                           "--", "tests/test_layout.py", "tests/test_debug.py",
                           "tests/test_elementwise.py", "-x", "-k", "not test_elementwise or past_2_to_the_31"])
    table = (tmp_path / "summary.txt").read_text()
    assert code == 0, table
    assert "| shard0 |" in table and "| shard1 |" in table
    # Only the files with big-memory tests are run for them (one process a GPU; one here).
    big = [line for line in table.splitlines() if line.startswith("| big-memory")]
    # The one (passed on a GPU, skipped without).
    assert len(big) == 1 and int(big[0].split("|")[2]) + int(big[0].split("|")[5]) == 1, table
    passed = sum(int(line.split("|")[2]) for line in table.splitlines() if line.startswith("| shard"))
    assert passed > 0


def test_a_spread_run_gives_each_worker_its_gpu():
    """tests/conftest.py: with TRITON_WORKSHOP_WORKER_GPUS=n, xdist worker gw<i> sees GPU i mod n
    alone (what gpu_tests.py's one queue over every GPU relies on)."""
    import os
    import subprocess
    import sys

    for worker, want in (("gw0", "0"), ("gw5", "1"), ("gw11", "3")):
        env = dict(os.environ, PYTEST_XDIST_WORKER=worker, TRITON_WORKSHOP_WORKER_GPUS="4",
                   EXPECT_VISIBLE_GPU=want)
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              f"{__file__}::test_the_worker_sees_its_gpu"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-2000:]


def test_the_worker_sees_its_gpu():
    import os

    import pytest

    want = os.environ.get("EXPECT_VISIBLE_GPU")
    if want is None:
        pytest.skip("run by test_a_spread_run_gives_each_worker_its_gpu")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == want


def test_the_slowest_tests_are_collected_first():
    """tests/conftest.py puts the tests allowed minutes (pytest-timeout's marker) at the front:
    xdist deals in collection order, and one dealt last would keep the whole queue waiting."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/test_readme.py", "tests/test_slides.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert ids and ids[0].startswith("tests/test_slides.py::test_python_blocks_run"), ids[:3]
    assert any(i.startswith("tests/test_readme.py") for i in ids[1:])
