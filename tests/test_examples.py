"""The examples run: ``examples/train_gpt2.py`` and ``examples/train_resnet.py`` at tiny sizes (on
the CPU in interpreter mode), with and without ``--patch``, from the same weights and batches: the losses must agree
step for step (fp32, IEEE on both sides, so only summation order differs). Each also runs once as
a script, in a fresh interpreter, without transformers or torchvision being imported.

On a GPU, a convergence test: a small GPT-2 trained for 40 steps under bf16 autocast, patched and
not; the patched run's losses must stay within the run-to-run noise of torch against itself
(torch with its math attention instead of flash: the same model, other roundings).
"""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest
import torch

import triton_workshop  # noqa: F401  (decides interpreter-or-GPU before the kernels import)
from conftest import EXAMPLES, load_example
from triton_workshop.runtime import DEVICE



pytestmark = pytest.mark.usefixtures("ieee_fp32")  # conftest.py
load = load_example


def run_both(name: str, *args: str) -> tuple[list[float], list[float]]:
    example = load(name)
    # fp32 on both sides (no autocast), IEEE (the fixture turns TF32 off).
    common = ["--tiny", "--device", str(DEVICE), "--no-amp", *args]
    return example.main([*common, "--patch"]), example.main([*common, "--no-patch"])


def test_train_gpt2_patched_matches_torch(capsys):
    patched, plain = run_both("train_gpt2", "--steps", "4", "--lr", "3e-3")
    printed = capsys.readouterr().out
    # Eagerly the attention wins; the LayerNorms and the Linear+GELUs stay torch's (patch's rules).
    assert "patched: attention 2" in printed
    assert printed.count(" ms") >= 8 and "median" in printed
    assert len(patched) == len(plain) == 4
    torch.testing.assert_close(torch.tensor(patched), torch.tensor(plain), rtol=1e-5, atol=1e-5)
    assert patched[-1] != patched[0]  # the weights moved: later steps compare the updates too


def test_train_resnet_patched_matches_torch(capsys):
    # Two steps: at 16 x 16 pixels the last stage is 1 x 1, and BatchNorm over 4 values, most of
    # them ReLU's zeros, divides rounding differences by sqrt(eps) (x300) from the third step on.
    patched, plain = run_both("train_resnet", "--steps", "2", "--lr", "0.001")
    printed = capsys.readouterr().out
    assert "patched: conv2d 20" in printed
    assert len(patched) == len(plain) == 2
    torch.testing.assert_close(torch.tensor(patched), torch.tensor(plain), rtol=2e-4, atol=2e-4)


def test_flags_parse():
    args = load("train_resnet").parse_args(["--tiny", "--device", "cpu", "--channels-last", "--compile"])
    assert args.channels_last and args.compile and not args.amp and args.batch == 4
    args = load("train_gpt2").parse_args(["--tiny", "--batch", "3", "--device", "cpu", "--no-patch"])
    assert args.batch == 3 and args.layers == 2 and not args.patch  # --tiny sets defaults only
    args = load("train_gpt2").parse_args(["--device", "cuda"])
    assert (args.layers, args.embd, args.batch, args.seq, args.amp) == (12, 768, 8, 1024, True)


def test_train_gpt2_with_transformers_model():
    pytest.importorskip("transformers", reason="transformers is not installed (optional)")
    patched, plain = run_both("train_gpt2", "--hf", "--steps", "2", "--lr", "3e-3")
    torch.testing.assert_close(torch.tensor(patched), torch.tensor(plain), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["train_gpt2", "train_resnet"])
def test_runs_as_a_script_without_optional_libraries(name):
    check = (
        "import runpy, sys\n"
        # --no-patch: the patched runs are compared above; this is about the script itself.
        f"sys.argv = [{str(EXAMPLES / (name + '.py'))!r}, '--tiny', '--device', 'cpu', '--steps', '2',"
        " '--no-patch']\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as exit_:\n"
        "    assert not exit_.code, exit_.code\n"
        "loaded = [m for m in ('transformers', 'torchvision') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "print('ran without', 'transformers', 'torchvision')\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step    2/2" in result.stdout and "ran without" in result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or triton_workshop.INTERPRET,
                    reason="needs a CUDA GPU (bf16 autocast training)")
def test_gpt2_losses_converge_with_torch_on_gpu():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    example = load("train_gpt2")
    common = ["--device", "cuda", "--layers", "4", "--heads", "4", "--embd", "256", "--seq", "256",
              "--batch", "8", "--vocab", "512", "--steps", "40", "--lr", "1e-3"]
    patched = example.main([*common, "--patch"])
    torch_flash = example.main([*common, "--no-patch"])
    with sdpa_kernel(SDPBackend.MATH):
        torch_math = example.main([*common, "--no-patch"])
    assert torch_flash[-1] < torch_flash[0] - 0.5  # it learns: the comparison is not of noise

    def tail(losses):
        return statistics.mean(losses[-10:])

    noise = max(abs(a - b) for a, b in zip(torch_flash, torch_math))
    worst = max(abs(a - b) for a, b in zip(patched, torch_flash))
    assert worst <= 3 * noise + 0.02, (worst, noise)
    assert abs(tail(patched) - tail(torch_flash)) <= 3 * abs(tail(torch_math) - tail(torch_flash)) + 0.02
