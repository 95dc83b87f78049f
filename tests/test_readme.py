"""Every command in the README runs: the two install commands are what CI runs (.ci/run), the
rest are run here, from the repository root, with this environment's console scripts."""

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _installed() -> bool:
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        distribution("triton-workshop")
    except PackageNotFoundError:
        return False
    return True


# The README's commands use the console scripts an install creates; CI installs the project as
# the README says. A checkout run from PYTHONPATH=src (the GPU machine) has no scripts to call.
pytestmark = pytest.mark.skipif(not _installed(), reason="triton-workshop is not pip-installed here")
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent


def bash_commands():
    lines = []
    for block in re.findall(r"```bash\n(.*?)\n```", README, flags=re.S):
        lines += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    return lines


def readme_command(n):
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_command.py"), str(n)],
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


INSTALL = [readme_command(1), readme_command(2)]
EXPECT_FAIL = {"python exercises/exercise_1.py", "exercise_1", "workshop check 1"}  # untouched template


def test_ci_runs_the_two_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme_command.py 1" in ci and "readme_command.py 2" in ci
    assert INSTALL[0].endswith("workshop tour")
    assert "pytest" in INSTALL[1]
    assert all(cmd in bash_commands() for cmd in INSTALL)


@pytest.mark.parametrize("command", [c for c in bash_commands()
                                     if c not in INSTALL and not c.startswith("uv ")])
def test_readme_command_runs(command, tmp_path):
    if command.startswith("workshop filter"):
        from triton_workshop.teach.images import sample_image, save_image
        save_image(sample_image(48, 64), ROOT / "workshop-output" / "original.png")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    argv = command.split()
    if argv[0] == "python":
        argv[0] = sys.executable
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    if command in EXPECT_FAIL:
        assert proc.returncode == 1, output
        assert "start at TODO 1" in output
    else:
        assert proc.returncode == 0, output
    if command.startswith("workshop filter"):
        assert (ROOT / "sepia.png").is_file()
        (ROOT / "sepia.png").unlink()


UV_COMMANDS = [c for c in bash_commands() if c.startswith("uv ")]


def package_index_hosts(env=None) -> list[str]:
    """The hosts ``uv sync`` downloads from: the index uv is pointed at (``UV_DEFAULT_INDEX``,
    ``UV_INDEX_URL``), else PyPI and the host of its files."""
    env = os.environ if env is None else env
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        host = urlparse(env.get(name, "")).hostname
        if host:
            return [host]
    return ["pypi.org", "files.pythonhosted.org"]


def no_network_reason(env=None, timeout: float = 2.0) -> str | None:
    """Why the package index cannot be reached from here (None when it can): uv told to stay
    offline, or a 2-second connection attempt to each index host that fails."""
    env = os.environ if env is None else env
    if env.get("UV_OFFLINE", "") not in ("", "0", "false"):
        return "UV_OFFLINE is set"
    for host in package_index_hosts(env):
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
        except OSError as exc:
            return f"no network: cannot reach {host}:443 ({exc})"
    return None


#: What uv prints when a download failed for want of a network (not a fault of the project).
UV_NETWORK_ERRORS = re.compile(
    r"error sending request for url|dns error|failed to lookup address information|"
    r"Temporary failure in name resolution|Network is unreachable|tcp connect error|"
    r"Network connectivity is disabled|Could not connect to|Connection refused|timed out while")


def uv_network_error(output: str) -> str | None:
    """The line of uv's output that says it could not download, if there is one."""
    for line in output.splitlines():
        if UV_NETWORK_ERRORS.search(line):
            return line.strip()
    return None


@pytest.mark.skipif(shutil.which("uv") is None and not (BIN / "uv").exists(),
                    reason="uv is not installed here (.ci/run installs it so that CI runs these)")
def test_readme_uv_commands_run_in_a_fresh_copy(tmp_path):
    """The uv path, in order, in a copy of the project (uv sync makes its own .venv there)."""
    reason = no_network_reason()
    if reason:
        pytest.skip(f"the README's uv commands download packages: {reason}")
    uv = shutil.which("uv") or str(BIN / "uv")
    project = tmp_path / "project"
    shutil.copytree(ROOT, project, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "*.egg-info", "workshop-output", "bench-results", ".whl"))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    assert UV_COMMANDS and UV_COMMANDS[0].startswith("uv sync")
    for command in UV_COMMANDS:
        argv = [uv, *command.split()[1:]]
        proc = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True,
                              timeout=1500)
        output = proc.stdout + proc.stderr
        offline = proc.returncode != 0 and uv_network_error(output)
        if offline:  # the network went away while uv downloaded
            pytest.skip(f"{command}: uv could not download ({offline})")
        if command == "uv run exercise_1":  # the untouched template
            assert proc.returncode == 1 and "start at TODO 1" in output, output
        else:
            assert proc.returncode == 0, f"{command}:\n{output}"


def test_no_network_is_a_reason_to_skip(monkeypatch, tmp_path):
    def unreachable(address, timeout=None):
        assert timeout == 2.0  # a quick check, not uv's own retries
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    assert no_network_reason({}) == "no network: cannot reach pypi.org:443 ([Errno 101] Network is unreachable)"
    assert package_index_hosts({"UV_DEFAULT_INDEX": "https://mirror.example:8443/simple"}) == ["mirror.example"]
    assert "mirror.example" in no_network_reason({"UV_INDEX_URL": "https://mirror.example/simple"})
    assert no_network_reason({"UV_OFFLINE": "1"}) == "UV_OFFLINE is set"
    # The uv test itself skips, before it copies anything or calls uv.
    monkeypatch.delenv("UV_OFFLINE", raising=False)
    monkeypatch.delenv("UV_DEFAULT_INDEX", raising=False)
    monkeypatch.delenv("UV_INDEX_URL", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no network: cannot reach pypi.org"):
        test_readme_uv_commands_run_in_a_fresh_copy(tmp_path)
    assert not any(tmp_path.iterdir())


def test_network_is_reachable_when_a_connection_opens(monkeypatch):
    opened = []

    class Connection:
        def close(self):
            opened.append("closed")

    monkeypatch.setattr(socket, "create_connection", lambda address, timeout=None: Connection())
    assert no_network_reason({}) is None
    assert opened == ["closed", "closed"]  # the index and the host of its files


def test_uv_network_errors_are_recognised():
    offline = """Resolved 80 packages in 2ms
error: Failed to fetch: `https://pypi.org/simple/torch/`
  Caused by: Request failed after 3 retries
  Caused by: error sending request for url (https://pypi.org/simple/torch/)
  Caused by: client error (Connect)
  Caused by: dns error: failed to lookup address information: Temporary failure in name resolution"""
    assert uv_network_error(offline) == "Caused by: error sending request for url (https://pypi.org/simple/torch/)"
    assert uv_network_error("error: Network connectivity is disabled, but the requested data "
                            "wasn't found in the cache for: `torch`")
    failed = """error: Failed to build `triton-workshop @ file:///tmp/project`
  Caused by: The build backend returned an error
  Caused by: Call to `setuptools.build_meta.build_editable` failed (exit status: 1)"""
    assert uv_network_error(failed) is None  # a fault of the project: the test fails on it
    assert uv_network_error("Traceback (most recent call last):\nAssertionError") is None


def test_readme_example_diagnosis_is_what_the_checker_says(tmp_path):
    """The README's example output comes from the real checker on the planted bug it names."""
    from triton_workshop.teach import EXERCISES, check_module, load_module

    source = (ROOT / "solutions" / "solution_1.py").read_text()
    path = tmp_path / "grid_bug.py"
    path.write_text(source.replace("grid = (cdiv(n, BLOCK_SIZE),)", "grid = (n // BLOCK_SIZE,)"))
    reports = check_module(EXERCISES[1], load_module(path, "_readme_grid_bug"), seed=0)
    case = next(c for c in reports[0].cases if c.label == "n=1000")
    assert case.verdict.headline in README
    example = README.split("```text", 1)[1].split("```", 1)[0]
    for line in case.verdict.details:
        first_words = " ".join(line.split()[:6])
        assert first_words in " ".join(example.split()), line


def test_readme_python_blocks_run():
    """The README's Python examples run as written."""
    blocks = re.findall(r"```python\n(.*?)\n```", README, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
