"""``workshop progress``: a learner's real state, read from a temporary copy of the repository's
layout in which exercises get solved, started, broken and deleted."""

import shutil
from pathlib import Path

import pytest

from triton_workshop import cli
from triton_workshop.teach import EXERCISES
from triton_workshop.teach.progress import (
    CORE_PASSED,
    FAILING,
    IN_PROGRESS,
    MISSING,
    NOT_STARTED,
    PASSED,
    READY,
    exercise_status,
    next_step,
    next_step_after,
    progress,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clone(tmp_path):
    """A learner's clone: every template, untouched, under exercises/."""
    (tmp_path / "exercises").mkdir()
    for number in EXERCISES:
        shutil.copy(ROOT / "exercises" / f"exercise_{number}.py", tmp_path / "exercises")
    return tmp_path


def solve(clone, number, edits=()):
    """Exercise ``number`` answered with the solution (edited by ``(old, new)`` pairs)."""
    source = (ROOT / "solutions" / f"solution_{number}.py").read_text()
    for old, new in edits:
        assert old in source
        source = source.replace(old, new)
    (clone / "exercises" / f"exercise_{number}.py").write_text(source)


def fill_first_todo(clone, number, answer):
    """The learner's first step: TODO 1 replaced by ``answer`` (its comment kept)."""
    path = clone / "exercises" / f"exercise_{number}.py"
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if "...  # TODO 1:" in line)
    lines[index] = lines[index].replace("...", answer, 1)
    path.write_text("".join(lines))


def flat(text):
    return " ".join(text.split())


def test_a_fresh_clone_is_not_started(clone):
    statuses = progress(clone)
    assert [s.state for s in statuses] == [NOT_STARTED] * len(EXERCISES)
    assert "start at TODO 1" in statuses[0].detail
    text, command = next_step(statuses)
    assert text.startswith("Start exercise 1 (Vector addition)") and command == "workshop check 1"


def test_solving_starting_breaking_and_deleting(clone):
    solve(clone, 1)
    fill_first_todo(clone, 2, "pid_0 * BLOCK_H + tl.arange(0, BLOCK_H)")
    solve(clone, 3, [("    grid = (C, cdiv(H, BLOCK_H), cdiv(W, BLOCK_W))",
                      "    grid = (C, H // BLOCK_H, cdiv(W, BLOCK_W))")])
    solve(clone, 6, [("        dw_rows = tl.sum(dy * xhat, axis=0)\n",
                      "        dw_rows = ...  # TODO 12 (stretch): partial dweight\n")])
    (clone / "exercises" / "exercise_8.py").unlink()

    by_number = {s.number: s for s in progress(clone)}
    assert by_number[1].state == PASSED
    assert by_number[2].state == IN_PROGRESS and by_number[2].next_todo[0] == 2
    assert "TODO 2 next" in by_number[2].detail
    assert by_number[3].state == FAILING and "filter2d(" in by_number[3].detail
    assert "wrong" in by_number[3].detail
    assert by_number[4].state == NOT_STARTED
    assert by_number[6].state == CORE_PASSED and by_number[6].stretch_open
    assert "layer_norm_weight_grads" in by_number[6].detail
    assert by_number[8].state == MISSING
    assert by_number[8].command == "git checkout -- exercises/exercise_8.py"

    # The next step is the first exercise not done: 2, where TODO 2 is next.
    text, command = next_step(list(by_number.values()))
    assert "exercise 2" in text and "TODO 2" in text and command == "workshop check 2"


def test_the_command_prints_the_table_and_the_next_step(clone, capsys):
    solve(clone, 1)
    assert cli.main(["progress", "--root", str(clone)]) == 0
    out = flat(capsys.readouterr().out)
    assert "Your progress" in out and "1 of 8 exercises done" in out
    assert "passed" in out and "not started" in out
    assert "Next step: Start exercise 2 (Greyscale and sepia)" in out
    assert "workshop check 2" in out


def test_progress_reads_the_current_directory(clone, capsys, monkeypatch):
    solve(clone, 1)
    solve(clone, 2)
    monkeypatch.chdir(clone)
    assert cli.main(["progress"]) == 0
    out = flat(capsys.readouterr().out)
    assert "2 of 8 exercises done" in out and str(clone) in out


def test_all_core_passed_points_at_the_stretch_then_at_profiling(clone):
    statuses = [exercise_status(n, clone) for n in EXERCISES]
    for s in statuses:  # as if every exercise passed, exercise 8 with its stretch open
        s.state = PASSED
    statuses[-1].state, statuses[-1].detail = CORE_PASSED, "stretch open: attention_causal(...)"
    text, command = next_step(statuses)
    assert "stretch of exercise 8" in text and command == "workshop check 8"
    statuses[-1].state = PASSED
    text, command = next_step(statuses)
    assert "workshop profile" in text and command.startswith("workshop profile")


def test_a_learner_who_kept_the_todo_comment_has_started(clone):
    fill_first_todo(clone, 1, "pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)")
    status = exercise_status(1, clone)
    assert status.state == IN_PROGRESS and status.next_todo[0] == 2


def test_every_todo_filled_but_unchecked_is_ready_in_quick_mode(clone):
    solve(clone, 5)
    assert exercise_status(5, clone, run_checks=False).state == READY
    assert exercise_status(5, clone).state == PASSED


def test_a_file_that_does_not_import_is_failing(clone):
    (clone / "exercises" / "exercise_4.py").write_text("def matmul(:\n")
    status = exercise_status(4, clone)
    assert status.state == FAILING and "could not import" in status.detail


def test_a_printing_kernel_does_not_spill_into_the_table(clone, capsys):
    solve(clone, 1, [("    tl.store(out_ptr + offsets, x + y, mask=mask)\n",
                      "    tl.store(out_ptr + offsets, x + y, mask=mask)\n"
                      "    print_if('HELLO FROM PROGRAM 0', '=0')\n")])
    assert exercise_status(1, clone).state == PASSED
    assert "HELLO FROM PROGRAM 0" not in capsys.readouterr().out


def test_next_step_after_a_pass_skips_to_the_next_unfinished(clone):
    solve(clone, 1)
    solve(clone, 2)
    text, command = next_step_after(1, clone)
    assert "Check exercise 2" in text and command == "workshop check 2"
    text, command = next_step_after(2, clone)
    assert "Start exercise 3" in text and command == "workshop check 3"
    text, command = next_step_after(8, clone)
    assert command == "workshop progress"


def test_a_passing_check_ends_with_the_next_step(clone, capsys, monkeypatch):
    solve(clone, 1)
    monkeypatch.chdir(clone)
    assert cli.main(["check", "1", "--seed", "1"]) == 0
    out = flat(capsys.readouterr().out)
    assert "All checks passed" in out
    assert "Next step: Start exercise 2 (Greyscale and sepia)" in out and "workshop check 2" in out


def test_bad_exercise_numbers_and_missing_files_are_one_sentence_and_exit_2(clone, capsys,
                                                                             monkeypatch):
    assert cli.main(["check", "9"]) == 2
    out = flat(capsys.readouterr().out)
    assert "exercise must be one of [1, 2, 3, 4, 5, 6, 7, 8], got 9" in out
    assert "workshop list" in out and "Traceback" not in out
    assert cli.main(["check", "6", "--file", str(clone / "nope.py")]) == 2
    out = flat(capsys.readouterr().out)
    assert "does not exist" in out and "exercises/exercise_6.py" in out
    with pytest.raises(ValueError, match="got 9"):
        exercise_status(9, clone)


def test_the_tour_ends_with_the_next_step(clone, capsys, monkeypatch):
    from triton_workshop.teach.images import sample_image, save_image
    from triton_workshop.teach.tour import run_tour

    solve(clone, 1)
    monkeypatch.chdir(clone)
    image = save_image(sample_image(24, 31), clone / "small.png")
    assert run_tour(clone / "out", image=image) == 0
    out = flat(capsys.readouterr().out)
    assert out.index("Tour complete") < out.index("Next step: Start exercise 2")
