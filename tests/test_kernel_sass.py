"""scripts/kernel_sass.py, which nothing else runs: an attention kernel compiled for sm_90 on this
machine (no GPU needed), its registers, spills and the SASS instructions of its loops."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernel_sass.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=900)


def _nvidia_tools() -> bool:
    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return False
    return (Path(nvidia.__file__).parent / "bin" / "cuobjdump").is_file()


@pytest.mark.skipif(not _nvidia_tools(), reason="this Triton ships no NVIDIA backend tools")
def test_counts_each_loop_of_the_dkdv_kernel():
    result = _run("--config", "32,64,4,3")
    assert result.returncode == 0, result.stderr[-2000:]
    head, *loops = result.stdout.splitlines()
    assert re.search(r"dkdv D=64 .*\(32, 64, 4, 3\).*: \d+ registers, \d+ bytes of stack", head)
    # The diagonal, full, and tail runs of the query loop, then the loop over a group's heads.
    steps = [int(m.group(1)) for m in (re.search(r"(\d+) instructions a step", x) for x in loops)
             if m]
    assert len(steps) >= 4, result.stdout
    assert all(re.match(r"  loop 0x[0-9a-f]+-0x[0-9a-f]+: \d+ instructions a step \(", x)
               for x in loops), result.stdout
    assert max(steps) == steps[-1]  # the outer loop spans the others


def test_refuses_an_unknown_feature_by_name():
    result = _run("--features", "WINDOW,SLIDING")
    assert result.returncode == 2
    assert "--features: unknown SLIDING" in result.stderr
