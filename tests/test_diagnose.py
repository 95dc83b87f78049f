"""scripts/diagnose.py, which nothing else runs: its arguments, its section list, every section's
cases run once at a tiny size (``--check``, on the CPU too), and that it reaches the library only
through public names, so a refactor of the ops cannot break it silently."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_workshop.bench import SPEC_NAMES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "diagnose.py"
HOST_SECTIONS = ("overhead", "waits", "thread", "cpu")


@pytest.fixture(scope="module")
def diagnose():
    spec = importlib.util.spec_from_file_location("diagnose", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sections_are_the_benchmark_specs_and_the_host_sections(diagnose):
    assert tuple(diagnose.SECTIONS) == (*SPEC_NAMES, *HOST_SECTIONS)


def test_list_names_every_section_with_its_summary(diagnose, capsys):
    assert diagnose.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(diagnose.SECTIONS)
    assert all(len(line.split()) > 3 for line in lines), lines  # a summary after each name
    assert any(line.startswith("waits") and "wait for the GPU" in line for line in lines)


def test_arguments(diagnose, capsys):
    args = diagnose.parse_args(["softmax", "cpu", "--check"])
    assert args.sections == ["softmax", "cpu"] and args.check and not args.list
    assert diagnose.parse_args([]).sections == []
    with pytest.raises(SystemExit) as exc:
        diagnose.parse_args(["softmax", "no_such_section"])
    assert exc.value.code == 2
    assert "no_such_section" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU it would measure")
def test_refuses_to_time_without_a_gpu(diagnose, capsys):
    assert diagnose.main(["softmax"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("section", [*SPEC_NAMES, *HOST_SECTIONS])
def test_check_runs_every_case_of_a_section(diagnose, section, capsys):
    assert diagnose.main(["--check", section]) == 0
    out = capsys.readouterr().out
    assert "--check" in out.splitlines()[0] and f"({section}: " in out
    if section in SPEC_NAMES:
        # Ours and the reference of every workload, each on its own line.
        from triton_workshop.bench import load_spec

        for w in load_spec(section).workloads:
            assert f"{w.name} " in out and f"· {w.reference_name}:" in out
        assert out.count("· triton-workshop:") == len(load_spec(section).workloads)
    else:
        assert "tw." in out or "softmax" in out


def test_dry_run_sizes_are_tiny(diagnose):
    from triton_workshop.bench import load_spec

    clock = diagnose.DryRun(torch.device("cpu"))
    assert clock.shape((8192, 8192)) == (16, 16) and clock.shape((3, 8)) == (3, 8)
    w = load_spec("image").workloads[0]
    assert torch.Size(clock.workload_size(w)).numel() < torch.Size(w.quick[0]).numel() // 1000
    assert diagnose.Clock(torch.device("cpu")).workload_size(w) == w.quick[0]


def test_uses_only_public_names_of_the_package():
    """No ``from triton_workshop... import _name``, no private attribute of a triton_workshop
    module read: the only private attributes it touches are torch's (``torch.cuda._sleep``)."""
    tree = ast.parse(SCRIPT.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("triton_workshop"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private and "._" not in node.module, (node.module, private)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            root = node
            while isinstance(root, ast.Attribute):
                root = root.value
            assert isinstance(root, ast.Name) and root.id == "torch", ast.unparse(node)


def test_script_entry_point_lists_its_sections():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_WORKSHOP_QUIET": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == SPEC_NAMES[0] and "overhead" in done.stdout
