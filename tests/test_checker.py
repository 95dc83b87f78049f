"""The checker recognises the classic bugs: each test plants one in a copy of a solution."""

from pathlib import Path

import pytest
import torch

from triton_workshop.teach import EXERCISES, check_exercise, check_module, load_module
from triton_workshop.teach.diagnose import diagnose
from triton_workshop.teach.learner_file import unfinished_todos
from triton_workshop.teach.verdict import Tolerance

ROOT = Path(__file__).resolve().parents[1]


def plant(tmp_path, number, old, new, name=None):
    """A copy of solution ``number`` with ``old`` replaced by ``new`` (which must occur)."""
    source = (ROOT / "solutions" / f"solution_{number}.py").read_text()
    assert old in source, f"{old!r} not in solution_{number}.py"
    path = tmp_path / (name or f"planted_{number}.py")
    path.write_text(source.replace(old, new))
    return path


def verdicts(number, path, seed=0):
    module = load_module(path, name=f"_planted_{path.stem}_{id(path)}")
    reports = check_module(EXERCISES[number], module, seed=seed)
    return [c.verdict for r in reports for c in r.cases]


def failing_text(vs):
    failed = [v for v in vs if not v.passed]
    assert failed, "the planted bug went unnoticed"
    return "\n".join(v.headline + "\n" + "\n".join(v.details) for v in failed)


@pytest.mark.parametrize("number", sorted(EXERCISES))
def test_every_solution_passes(number):
    path = ROOT / "solutions" / f"solution_{number}.py"
    assert all(v.passed for v in verdicts(number, path))


@pytest.mark.parametrize("number", sorted(EXERCISES))
def test_untouched_template_says_start_at_todo_1(number, capsys):
    path = ROOT / "exercises" / f"exercise_{number}.py"
    assert check_exercise(number, path=path, seed=0) == 1
    out = capsys.readouterr().out
    assert "not implemented yet: start at TODO 1" in out
    assert "Traceback" not in out


def test_grid_rounded_down_leaves_the_tail_unwritten(tmp_path):
    path = plant(tmp_path, 1, "grid = (cdiv(n, BLOCK_SIZE),)", "grid = (n // BLOCK_SIZE,)")
    text = failing_text(verdicts(1, path))
    assert "partial block" in text and "never written" in text and "cdiv" in text


def test_offsets_without_program_id_repeat_the_first_block(tmp_path):
    path = plant(tmp_path, 1, "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
                 "offsets = tl.arange(0, BLOCK_SIZE)")
    text = failing_text(verdicts(1, path))
    assert "only the first block is right" in text and "program id" in text


def test_loads_offsets_without_program_id_copy_block_zero_everywhere(tmp_path):
    # Loads ignore the program id but stores use it: every block holds a copy of block 0.
    source_old = "    x = tl.load(x_ptr + offsets, mask=mask)\n    y = tl.load(y_ptr + offsets, mask=mask)"
    source_new = ("    local = tl.arange(0, BLOCK_SIZE)\n"
                  "    x = tl.load(x_ptr + local, mask=mask)\n    y = tl.load(y_ptr + local, mask=mask)")
    path = plant(tmp_path, 1, source_old, source_new)
    text = failing_text(verdicts(1, path))
    assert "repeated it" in text


def test_missing_store_mask_is_caught_in_the_guard_zone(tmp_path):
    path = plant(tmp_path, 1, "tl.store(out_ptr + offsets, x + y, mask=mask)",
                 "tl.store(out_ptr + offsets, x + y)")
    text = failing_text(verdicts(1, path))
    assert "past the end" in text and "mask=" in text


def test_wrong_mask_in_the_partial_block(tmp_path):
    path = plant(tmp_path, 1, "mask = offsets < n_elements", "mask = offsets < n_elements - 1")
    text = failing_text(verdicts(1, path))
    assert "partial block" in text


def test_transposed_greyscale(tmp_path):
    path = plant(tmp_path, 2, "    tl.store(out_ptr + offsets, grey, mask=mask)",
                 "    tl.store(out_ptr + cols[None, :] * H + rows[:, None], grey, mask=mask)")
    text = failing_text(verdicts(2, path))
    assert "transposed" in text


def test_tf32_rounding_is_named(tmp_path):
    # Emulate TF32 (the interpreter computes dots exactly): keep 10 mantissa bits of each input.
    path = plant(
        tmp_path, 4, "        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)",
        "        if a.dtype == tl.float32:\n"
        "            a = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)\n"
        "            b = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)\n"
        "        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)",
    )
    text = failing_text(verdicts(4, path))
    assert "TF32" in text and "ieee" in text


def test_matmul_without_k_mask_reads_the_guard(tmp_path):
    path = plant(tmp_path, 4, "mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0",
                 "mask=(cols[None, :] < N), other=0.0")
    assert not all(v.passed for v in verdicts(4, path))


def test_softmax_padding_loaded_as_zero_is_caught(tmp_path):
    # other=0.0: each padded lane adds exp(0 - max) to the row sum, so every row whose length is
    # not a power of two comes out too small.
    path = plant(tmp_path, 5, 'other=-float("inf")', "other=0.0")
    vs = verdicts(5, path)
    text = failing_text(vs)
    assert "elements wrong" in text and "pid (row)" in text
    assert not vs[0].passed  # 37 x 100: 28 padded lanes per row


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_softmax_without_max_subtraction_overflows(tmp_path):
    # exp(x) of x * 1000 overflows to inf, and inf / inf = NaN: only the large-value case fails.
    path = plant(tmp_path, 5, "numerator = tl.exp(x - tl.max(x, axis=0))", "numerator = tl.exp(x)")
    vs = verdicts(5, path)
    text = failing_text(vs)
    assert "NaN" in text and "inf" in text and "subtract the row max" in text
    assert "never written: check the grid" not in text
    assert [v.passed for v in vs].count(False) == 1


def test_softmax_store_mask_too_strict_is_not_called_overflow(tmp_path):
    # A NaN tail at the end of each row is a hole the store left, not a computed NaN.
    path = plant(tmp_path, 5, "y.to(out_ptr.dtype.element_ty), mask=mask)",
                 "y.to(out_ptr.dtype.element_ty), mask=cols < n_cols - 1)")
    text = failing_text(verdicts(5, path))
    assert "never written" in text and "subtract the row max" not in text


def test_report_names_programs_and_masked_region():
    ref = torch.arange(300, dtype=torch.float32)
    out = ref.clone()
    out[260:] = float("nan")
    v = diagnose(out, ref, block=(128,), tol=Tolerance(1e-5, 1e-5))
    assert not v.passed
    text = "\n".join(v.details)
    assert "programs (pid_0) with wrong elements: 2 " in text
    assert "40 of the wrong elements are in the partial (masked) block" in text


def test_wrong_shape_and_dtype_are_reported():
    ref = torch.rand(4, 6)
    assert "transposed" in "\n".join(diagnose(torch.rand(6, 4), ref, block=(2, 2),
                                              tol=Tolerance(1e-5, 1e-5)).details)
    assert diagnose(ref.half(), ref, block=(2, 2), tol=Tolerance(1e-5, 1e-5)).headline == "wrong output dtype"
    assert "not a tensor" in diagnose(None, ref, block=(2, 2), tol=Tolerance(1e-5, 1e-5)).headline


def test_todo_scanner(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("a = 1\nb = ...  # TODO 2: second\n# c = ...  # TODO 9: a comment\nc = ...  # TODO 1: first\n")
    assert unfinished_todos(path) == [(1, 4, "first"), (2, 2, "second")]


def test_partial_progress_points_at_the_next_todo(tmp_path):
    # TODO 1-5 done, TODO 6 (the grid) still open.
    source = (ROOT / "exercises" / "exercise_1.py").read_text()
    answers = {
        "offsets = ...": "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
        "mask = ...": "mask = offsets < n_elements",
        "x = ...": "x = tl.load(x_ptr + offsets, mask=mask)",
        "y = ...": "y = tl.load(y_ptr + offsets, mask=mask)",
        "    ...  # TODO 5": "    tl.store(out_ptr + offsets, x + y, mask=mask)  # TODO 5",
    }
    for old, new in answers.items():
        assert old in source
        source = source.replace(old, new, 1)
    path = tmp_path / "exercise_1.py"
    path.write_text(source)
    text = failing_text(verdicts(1, path))
    assert "start at TODO 6" in text


def test_kernel_that_ignores_strides_is_caught(tmp_path):
    # Without the contiguity check the flat kernel reads a column-major image as if row-major.
    path = plant(tmp_path, 2, "    check_tensors_gpu_ready(img)\n", "")
    text = failing_text(verdicts(2, path))
    assert "non-contiguous" in text and "strides" in text


def test_solutions_refuse_or_handle_non_contiguous_inputs():
    for number in sorted(EXERCISES):
        vs = verdicts(number, ROOT / "solutions" / f"solution_{number}.py")
        strided = [v for v in vs if v.headline.startswith(("refused clearly", "correct"))]
        assert all(v.passed for v in vs) and strided


def test_wrong_sepia_coefficient_is_diagnosed_not_crashed(tmp_path):
    # Outputs with a leading channel dim (sepia, filter2d) are diagnosed slice by slice.
    path = plant(tmp_path, 2, "new_g = tl.minimum(0.349 * r", "new_g = tl.minimum(0.449 * r")
    text = failing_text(verdicts(2, path))
    assert "elements wrong" in text and "slice 1" in text


def test_sepia_grid_rounded_down_names_the_tail(tmp_path):
    path = plant(tmp_path, 2, "    grid = (cdiv(H, BLOCK_H), cdiv(W, BLOCK_W))\n    sepia_kernel",
                 "    grid = (H // BLOCK_H, cdiv(W, BLOCK_W))\n    sepia_kernel")
    text = failing_text(verdicts(2, path))
    assert "never written" in text and "cdiv" in text


def test_output_allocated_with_size_keyword_is_fine(tmp_path):
    path = plant(tmp_path, 1, "out = torch.empty_like(x)",
                 "out = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)")
    assert all(v.passed for v in verdicts(1, path))


def test_arithmetic_bug_in_a_single_partial_block_is_not_blamed_on_the_mask():
    ref = torch.rand(97)
    out = ref - 1.0
    v = diagnose(out, ref, block=(128,), tol=Tolerance(1e-5, 1e-5))
    assert not v.passed and "check the mask" not in "\n".join(v.details)
