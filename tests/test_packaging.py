"""The package as a user installs it: a wheel built from this tree, its metadata and files, and
the wheel installed into a fresh virtual environment that sees torch, Triton and NumPy (and their
own dependencies) but not pillow, rich or matplotlib, nor this checkout.

The library must import and run there (``tw.nn.patch`` on a model, a forward pass) without
importing a workshop package; the workshop's commands must say in one sentence what they need
(the ``[workshop]`` extra, or a clone's solutions) instead of a traceback."""

from __future__ import annotations

import email.parser
import os
import re
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
WORKSHOP_MODULES = ("PIL", "rich", "matplotlib")
#: What ``pip install .`` needs, by distribution name.
LIBRARY_REQUIREMENTS = {"torch", "triton", "numpy"}

pytestmark = pytest.mark.slow  # a wheel build, a venv and three interpreters: ~30 s


def _run(argv, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("timeout", 300)
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)


def _setuptools_builds_this() -> bool:
    """Whether the installed setuptools reads this pyproject (SPDX ``license``: setuptools 77)."""
    try:
        import setuptools
    except ImportError:
        return False
    return tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:1]) >= (77,)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the project's packaging inputs (the build writes its
    ``build/`` and ``*.egg-info`` there, not into this checkout)."""
    src = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (src / name).write_bytes((ROOT / name).read_bytes())
    ignore = ("__pycache__", ".egg-info", ".pyc")
    for path in (ROOT / "src").rglob("*"):
        if path.is_file() and not any(part.endswith(ignore) for part in path.parts):
            dest = src / path.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
    out = tmp_path_factory.mktemp("dist")
    # Without build isolation when setuptools is new enough (offline, fast: [dev] installs it);
    # else pip fetches the build requirements into an isolated environment.
    flags = ["--no-build-isolation"] if _setuptools_builds_this() else []
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *flags, "-w", out, src])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list(out.glob("triton_workshop-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(zf.read(name).decode())


def _requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower()


def test_wheel_metadata_requires_only_torch_triton_numpy(wheel):
    meta = _metadata(wheel)
    assert meta["Name"] == "triton-workshop"
    assert meta["Version"] == VERSION
    assert meta["License-Expression"] == "MIT"
    requires = meta.get_all("Requires-Dist")
    core = {_requirement_name(r) for r in requires if "extra ==" not in r}
    assert core == LIBRARY_REQUIREMENTS, requires
    # Upper bounds where the runtime relies on torch's and Triton's internals.
    bounded = {_requirement_name(r): r for r in requires if "extra ==" not in r}
    assert "<" in bounded["torch"] and "<" in bounded["triton"], requires
    extras = set(meta.get_all("Provides-Extra"))
    assert {"workshop", "transformers", "docs", "dev"} <= extras
    workshop = {_requirement_name(r) for r in requires if 'extra == "workshop"' in r}
    assert workshop == {"pillow", "rich", "matplotlib"}, requires
    assert any(_requirement_name(r) == "transformers" and 'extra == "transformers"' in r
               for r in requires)
    # dev pulls in everything, so the README's `pip install -e ".[dev]"` sets up all the tests.
    dev = [r for r in requires if 'extra == "dev"' in r]
    assert any("workshop" in r and "transformers" in r and "docs" in r for r in dev), dev


def test_wheel_files(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "triton_workshop/py.typed" in names
    assert "triton_workshop/__init__.py" in names and "triton_workshop/nn/__init__.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert not [n for n in names if n.startswith(("tests/", "exercises/", "solutions/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert {n.split("/")[0] for n in names} == {"triton_workshop",
                                               f"triton_workshop-{VERSION}.dist-info"}
    for script in ("workshop", "triton-workshop", "setup-check", "exercise_1", "solution_8"):
        assert re.search(rf"^{re.escape(script)} = triton_workshop\.", entry_points, re.M), script


@pytest.fixture(scope="module")
def user_env(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed (no dependencies), seeing this environment's
    site-packages through a folder of links that leaves out the workshop's packages, this
    checkout and every ``.pth`` file (an editable install of the checkout is one)."""
    base = tmp_path_factory.mktemp("user")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    proc = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                 "--no-index", "--disable-pip-version-check", "-q", wheel])
    assert proc.returncode == 0, proc.stdout + proc.stderr

    library, workshop = base / "library-deps", base / "workshop-deps"
    library.mkdir()
    workshop.mkdir()
    import torch  # noqa: F401  (where this environment's packages are)

    site_dirs = {Path(torch.__file__).resolve().parents[1], *map(Path, site.getsitepackages())}
    for site_dir in site_dirs:
        if not site_dir.is_dir():  # site.getsitepackages() also names folders never created
            continue
        for entry in site_dir.iterdir():
            name = entry.name
            if name.endswith(".pth") or name.startswith(("triton_workshop", "__editable__")):
                continue
            is_workshop = name.split(".")[0].split("-")[0].lower() in (
                {m.lower() for m in WORKSHOP_MODULES} | {"pillow"})
            link = (workshop if is_workshop else library) / name
            if not link.exists():
                link.symlink_to(entry)
    env_site = next((env_dir / "lib").glob("python3*/site-packages"))
    (env_site / "library_deps.pth").write_text(f"{library}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cwd = base / "elsewhere"  # not a clone: no exercises/ or solutions/ here
    cwd.mkdir()
    return {"python": python, "bin": env_dir / "bin", "env": env, "cwd": cwd,
            "workshop_deps": workshop}


#: Run in the user's venv, without the workshop's packages: the library in use, then what the
#: workshop's commands say there (in this one process: each new interpreter imports torch again).
IN_USER_ENV = """
import contextlib, io, json, sys
import torch
import triton_workshop as tw
import triton_workshop.nn
# On a GPU machine the kernels run on the GPU (patch refuses a CPU model there).
device = 'cuda' if torch.cuda.is_available() else 'cpu'
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(approximate='tanh')).to(device)
counts = tw.nn.patch(m, linear='fused')  # a kernel of the wheel's runs
y = m(torch.randn(2, 8, device=device))
result = {'shape': list(y.shape), 'linear': counts['linear'], 'file': tw.__file__,
          'workshop_modules': sorted(m for m in sys.modules if m.split('.')[0] in %r)}
try:
    import rich
except ImportError:
    result['rich'] = 'missing'
from triton_workshop import cli
commands = {'list': lambda: cli.main(['list']), 'tour': lambda: cli.main(['tour']),
            'check': lambda: cli.main(['check', '1', '--solution']),
            'bench': lambda: cli.main(['bench', '--quick']), 'exercise_1': cli.exercise_1,
            'solution_8': cli.solution_8, 'setup-check': lambda: cli.main(['setup-check'])}
for name, command in commands.items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = command()
    result[name] = {'code': code, 'output': out.getvalue() + err.getvalue()}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def in_user_env(user_env):
    import json

    code = IN_USER_ENV % (set(WORKSHOP_MODULES),)
    proc = _run([user_env["python"], "-c", code], env=user_env["env"], cwd=user_env["cwd"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_library_runs_from_the_wheel_without_the_workshop_packages(in_user_env):
    assert in_user_env["shape"] == [2, 8] and in_user_env["linear"] == 1
    assert "site-packages" in in_user_env["file"] and str(ROOT) not in in_user_env["file"]
    assert in_user_env["workshop_modules"] == []
    assert in_user_env["rich"] == "missing"  # out of reach there: the check above means something


@pytest.mark.parametrize("command", ["list", "tour", "check", "bench", "exercise_1", "solution_8"])
def test_workshop_commands_name_the_extra_when_it_is_missing(in_user_env, command):
    result = in_user_env[command]
    assert result["code"] == 2, result
    assert "pip install 'triton-workshop[workshop]'" in result["output"], result


def test_console_script_names_the_extra_when_it_is_missing(user_env):
    proc = _run([user_env["bin"] / "triton-workshop", "list"], env=user_env["env"],
                cwd=user_env["cwd"])
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    assert output.strip().splitlines()[-1] == (
        "This command needs the workshop's dependencies (rich is not installed): "
        "pip install 'triton-workshop[workshop]'"), output


def test_setup_check_runs_without_the_workshop_packages(in_user_env):
    result = in_user_env["setup-check"]
    assert result["code"] == 1, result
    out = result["output"]
    assert "a tiny Triton kernel" in out and "right answer" in out
    assert "the library is ready" in out
    assert out.strip().splitlines()[-1] == "pip install 'triton-workshop[workshop]'"


def test_tour_outside_a_clone_says_what_it_needs(user_env):
    """With the workshop's packages, but no clone: one sentence, exit status 2."""
    env = dict(user_env["env"], PYTHONPATH=str(user_env["workshop_deps"]))
    proc = _run([user_env["bin"] / "workshop", "tour"], env=env, cwd=user_env["cwd"])
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output
    words = " ".join(output.split())  # rich wraps lines at the terminal's width
    assert "clone of triton-workshop" in words and "solution_1.py" in words, output


def test_version_is_the_same_in_pyproject_and_the_package():
    """``triton_workshop.__version__`` is what pip reports (pyproject.toml's version)."""
    import triton_workshop

    assert triton_workshop.__version__ == VERSION, (
        f"src/triton_workshop/__init__.py says {triton_workshop.__version__!r}, pyproject.toml "
        f"{VERSION!r}: make them the same")
