"""The command line: setup-check, workshop check/list/tour/filter/bench, the console scripts."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_workshop import cli
from triton_workshop.teach.images import load_image, sample_image, save_image
from triton_workshop.teach.tour import run_tour

ROOT = Path(__file__).resolve().parents[1]


def test_setup_check_passes_and_names_the_mode(capsys):
    assert cli.main(["setup-check"]) == 0
    out = capsys.readouterr().out
    assert "interpreter mode" in out or "GPU:" in out
    assert "tiny Triton kernel" in out and "right answer" in out
    assert out.strip().splitlines()[-1].startswith("Ready")


def test_setup_check_console_script():
    exe = shutil.which("setup-check") or str(Path(sys.executable).parent / "setup-check")
    argv = [exe] if Path(exe).exists() else [sys.executable, "-m", "triton_workshop.cli", "setup-check"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "✅" in proc.stdout


def test_workshop_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "Vector addition" in out and "exercise_4.py" in out


def test_check_solution_and_template(capsys):
    assert cli.main(["check", "1", "--solution", "--seed", "3"]) == 0
    assert cli.main(["check", "1", "--file", str(ROOT / "exercises" / "exercise_1.py")]) == 1
    out = capsys.readouterr().out
    assert "All checks passed" in out and "start at TODO 1" in out


def test_check_unknown_exercise_is_a_clear_error(capsys):
    assert cli.main(["check", "9"]) == 2
    assert "exercise must be one of [1, 2, 3, 4, 5, 6, 7, 8], got 9" in capsys.readouterr().out


def test_check_reports_a_syntax_error_in_the_learner_file(tmp_path, capsys):
    bad = tmp_path / "exercise_1.py"
    bad.write_text("def add(:\n")
    assert cli.main(["check", "1", "--file", str(bad)]) == 1
    assert "could not import" in capsys.readouterr().out


def test_filter_command(tmp_path, capsys):
    src = save_image(sample_image(40, 50), tmp_path / "in.png")
    for name in ("sepia", "greyscale", "sobel_x"):
        dst = tmp_path / f"{name}.png"
        assert cli.main(["filter", str(src), "--filter", name, "-o", str(dst)]) == 0
        img = load_image(dst)
        assert img.shape == (3, 40, 50)
    # sepia of the sample image is warm: red >= green >= blue on average
    sep = load_image(tmp_path / "sepia.png").mean(dim=(1, 2))
    assert sep[0] >= sep[1] >= sep[2]


def test_filter_command_bad_inputs(tmp_path, capsys):
    src = save_image(sample_image(8, 8), tmp_path / "in.png")
    assert cli.main(["filter", str(src), "--filter", "nope", "-o", str(tmp_path / "o.png")]) == 2
    assert "filter must be one of" in capsys.readouterr().out
    assert cli.main(["filter", str(tmp_path / "missing.png"), "--filter", "sepia",
                     "-o", str(tmp_path / "o.png")]) == 2


def test_bench_refuses_without_a_gpu(capsys):
    if torch.cuda.is_available() and not cli.__dict__.get("INTERPRET", False):
        from triton_workshop import runtime
        if not runtime.INTERPRET:
            pytest.skip("a GPU is present: bench would run")
    assert cli.main(["bench", "--quick"]) != 0


@pytest.mark.slow
def test_tour_writes_images_and_passes(tmp_path, capsys):
    assert run_tour(tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert "Tour complete" in out
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"original.png", "greyscale.png", "sepia.png", "gaussian.png", "sobel_y.png"} <= names
    grey = load_image(tmp_path / "out" / "greyscale.png")
    assert torch.allclose(grey[0], grey[1]) and torch.allclose(grey[1], grey[2])


def test_tour_with_a_user_image(tmp_path, capsys):
    src = save_image(sample_image(30, 41), tmp_path / "mine.jpg")
    assert run_tour(tmp_path / "out", image=src) == 0
    assert load_image(tmp_path / "out" / "sepia.png").shape == (3, 30, 41)


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "triton_workshop.cli", "list"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Tiled matrix multiplication" in proc.stdout


# ----------------------------------------------------------------------------------------------
# Without the [workshop] extra (pillow, rich, matplotlib): one sentence, not a traceback.
# ----------------------------------------------------------------------------------------------
def _missing(name):
    def command():
        raise ModuleNotFoundError(f"No module named '{name}'", name=name)
    return command


@pytest.mark.parametrize("module, package", [("rich", "rich"), ("PIL", "pillow"),
                                             ("matplotlib.pyplot", "matplotlib")])
def test_a_workshop_command_without_the_extra_names_the_install(module, package, capsys):
    assert cli.run_workshop_command(_missing(module)) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"This command needs the workshop's dependencies ({package} is not "
                           "installed): pip install 'triton-workshop[workshop]'")


def test_other_import_errors_are_not_hidden():
    with pytest.raises(ModuleNotFoundError, match="transformers"):
        cli.run_workshop_command(_missing("transformers"))
    assert cli.missing_workshop_package(ValueError("rich")) is None


def test_a_command_whose_import_fails_on_rich_says_so(monkeypatch, capsys):
    """The whole path: ``workshop list`` importing teach/ with rich absent (a fresh import)."""
    for name in [m for m in sys.modules if m.startswith("triton_workshop.teach")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    assert cli.main(["list"]) == 2
    assert "pip install 'triton-workshop[workshop]'" in capsys.readouterr().err


def test_setup_check_prints_without_rich(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # `from rich.console import ...` fails
    assert cli.main(["setup-check"]) == 0
    out = capsys.readouterr().out
    assert "✅ a tiny Triton kernel" in out
    assert out.strip().splitlines()[-1].startswith("Ready") and "[bold" not in out


def test_console_scripts_resolve():
    """Every script in pyproject.toml names a callable; the README's names are all there."""
    import importlib
    import re

    block = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"', block, re.M))
    expected = {"workshop", "triton-workshop", "setup-check",
                *(f"{kind}_{n}" for kind in ("exercise", "solution") for n in range(1, 9))}
    assert expected <= set(scripts), expected - set(scripts)
    for name, target in scripts.items():
        module, attr = target.split(":")
        assert callable(getattr(importlib.import_module(module), attr)), name
    assert scripts["triton-workshop"] == scripts["workshop"]
