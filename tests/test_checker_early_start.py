"""`workshop check` on a GPU machine starts its two child processes before it imports torch, and
the check adopts them (teach.early_start). Simulated on any machine: a GPU is "likely", the
children are spawned rather than forked, and the check reruns in the interpreter as on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from triton_workshop import cli
from triton_workshop.teach import early_start, sandbox, session

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.name != "posix", reason="the children talk through POSIX pipes")


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """Children spawned (not forked) and the interpreter rerun on, as on a GPU machine; returns
    the list of (role, adopted) that the check's children saw."""
    seen = []
    adopt = early_start.adopt

    def spy(role, argv, env):
        child = adopt(role, argv, env)
        seen.append((role, child is not None))
        return child

    monkeypatch.setattr(early_start, "gpu_likely", lambda: True)
    monkeypatch.setattr(early_start, "adopt", spy)
    monkeypatch.setattr(sandbox, "forks_children", lambda: False)
    monkeypatch.setattr(session, "compiled_natively", lambda: True)
    yield seen
    early_start.discard()


@pytest.mark.timeout(600)
def test_check_adopts_both_children_started_early(as_on_a_gpu, capsys):
    assert cli.main(["check", "1", "--solution", "--seed", "3"]) == 0
    assert sorted(as_on_a_gpu) == [("main", True), ("memcheck", True)]
    assert early_start._STARTED == {}
    assert "All checks passed" in capsys.readouterr().out


@pytest.mark.timeout(600)
def test_a_learners_bug_is_still_found_through_adopted_children(as_on_a_gpu, tmp_path, capsys):
    source = (ROOT / "solutions" / "solution_1.py").read_text()
    assert "mask=mask" in source
    broken = tmp_path / "exercise_1.py"
    broken.write_text(source.replace("mask=mask", "mask=None", 1))
    assert cli.main(["check", "1", "--file", str(broken), "--seed", "3"]) == 1
    assert ("main", True) in as_on_a_gpu
    assert "❌" in capsys.readouterr().out


def test_a_child_started_for_another_command_line_is_killed():
    path = ROOT / "solutions" / "solution_1.py"
    argv = early_start.child_argv(1, path, 5, -1, done={}, memcheck="off", time_limit=60.0)
    env = early_start.child_env(False)
    early_start.start("main", argv, env)
    child = early_start._STARTED["main"]
    other = early_start.child_argv(1, path, 6, 99, done={}, memcheck="off", time_limit=60.0)
    assert early_start.adopt("main", other, env) is None
    assert child.proc.poll() is not None and "main" not in early_start._STARTED


def test_discard_kills_what_nobody_adopted():
    path = ROOT / "solutions" / "solution_1.py"
    early_start.start("memcheck", early_start.child_argv(1, path, 5, -1, done={}, memcheck="on",
                                                        time_limit=60.0), early_start.child_env(True))
    child = early_start._STARTED["memcheck"]
    early_start.discard()
    assert early_start._STARTED == {} and child.proc.poll() is not None


@pytest.mark.parametrize("env, expected", [({"TRITON_INTERPRET": "1"}, False),
                                           ({"CUDA_VISIBLE_DEVICES": ""}, False),
                                           ({"CUDA_VISIBLE_DEVICES": "-1"}, False)])
def test_no_gpu_is_guessed_where_kernels_will_not_compile(monkeypatch, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert early_start.gpu_likely() is expected
    assert early_start.start_children(1, ROOT / "solutions" / "solution_1.py", seed=None,
                                      time_limit=None) is None


def _modules_after(argv: list[str], code: str) -> list[str]:
    """What a fresh Python prints after setting ``sys.argv`` to ``argv`` and running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.argv = {argv!r}\n{code}"],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    return out.stdout.split()


def test_the_check_command_imports_no_torch_before_its_children_start():
    assert _modules_after(["workshop", "check", "1"], (
        "import triton_workshop.cli, triton_workshop.teach.early_start\n"
        "print('torch' in sys.modules, 'triton' in sys.modules)")) == ["False", "False"]


def test_any_other_process_decides_the_mode_on_import():
    assert _modules_after(["python", "check"], (
        "import triton_workshop\n"
        "print('torch' in sys.modules, triton_workshop.INTERPRET in (True, False))")) == ["True", "True"]
