"""Exercises 6-8 (layer norm, fast matmul, flash attention): each solution passes its checker, each
untouched template fails with guidance, and each classic bug, planted in a copy of a solution,
returns exactly what its Suspect predicts (and neither the reference nor another suspect's
output), so the checker can name it."""

from pathlib import Path

import pytest
import torch

from triton_workshop import cli, runtime
from triton_workshop.teach import EXERCISES, check_exercise, check_module, load_module
from triton_workshop.teach.verdict import tolerance_for
from triton_workshop.teach.exercises.part_two import (
    ATTENTION_BLOCK_M,
    ATTENTION_BLOCK_N,
    ATTENTION_HEAD_DIM_MAX,
    LAYER_NORM_BLOCK_ROWS,
    LAYER_NORM_MAX_COLS,
    MATMUL_FIRST_BLOCK,
    MATMUL_FIRST_GROUP,
    PART_TWO,
    attention_reference,
    every_tile_once,
    grouped_tile_order,
    is_stretch,
    online_softmax_attention,
    row_major_tile_order,
    tile_visit_counts,
)

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = sorted(PART_TWO)


def plant(tmp_path, number, edits, name=None):
    """A copy of solution ``number`` with each ``(old, new)`` of ``edits`` applied (old must
    occur)."""
    source = (ROOT / "solutions" / f"solution_{number}.py").read_text()
    for old, new in edits:
        assert old in source, f"{old!r} not in solution_{number}.py"
        source = source.replace(old, new)
    path = tmp_path / (name or f"planted_{number}.py")
    path.write_text(source)
    return path


def load(path):
    return load_module(path, name=f"_part_two_{path.stem}_{abs(hash(str(path)))}")


def same(out, expected) -> bool:
    """``out`` equals ``expected`` within the checker's tolerance for the dtype (NaN = NaN)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(expected.shape):
        return False
    tol = tolerance_for(expected.dtype)
    return bool(torch.isclose(out.detach().cpu().double(), expected.detach().cpu().double(),
                              rtol=tol.rtol, atol=tol.atol, equal_nan=True).all())


@pytest.fixture
def nan_empty(monkeypatch):
    """``torch.empty``/``empty_like`` filled with NaN, as under the checker: an output the kernel
    never writes reads NaN (not leftover memory)."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))


def cases_of(number, task_index, seed=0):
    task = EXERCISES[number].tasks[task_index]
    return task, task.make_cases(torch.Generator().manual_seed(seed), runtime.DEVICE)


def verdicts(number, path, seed=0):
    reports = check_module(EXERCISES[number], load(path), seed=seed)
    return [[case.verdict for case in report.cases] for report in reports]


# --------------------------------------------------------------------------------------------
# Registered, passing, failing with guidance.
# --------------------------------------------------------------------------------------------
def test_exercises_six_to_eight_are_registered():
    for number in NUMBERS:
        assert EXERCISES[number] is PART_TWO[number]
        assert EXERCISES[number].number == number
    assert [t.function for t in EXERCISES[6].tasks] == [
        "layer_norm", "layer_norm_statistics", "layer_norm_backward", "layer_norm_weight_grads"]
    assert [t.function for t in EXERCISES[7].tasks] == ["tile_visits", "tile_order", "matmul"]
    assert [(t.function, is_stretch(t)) for t in EXERCISES[8].tasks] == [
        ("attention", False), ("attention_causal", True)]


@pytest.mark.parametrize("number", NUMBERS)
def test_solution_passes_through_workshop_check(number, capsys):
    assert cli.main(["check", str(number), "--solution", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "All checks passed" in out and "❌" not in out


@pytest.mark.parametrize("number", NUMBERS)
def test_untouched_template_fails_with_guidance(number, capsys):
    path = ROOT / "exercises" / f"exercise_{number}.py"
    assert check_exercise(number, path=path, seed=0) == 1
    out = " ".join(capsys.readouterr().out.split())  # whatever the terminal's width
    assert f"not implemented yet: start at TODO 1 (exercise_{number}.py:" in out
    assert "TODO(s) left" in out and "Traceback" not in out


@pytest.mark.parametrize("number", NUMBERS)
def test_template_and_solution_differ_only_in_the_todos(number):
    """Every TODO of the template is answered by the solution, numbered 1..n in file order."""
    from triton_workshop.teach.learner_file import unfinished_todos

    todos = unfinished_todos(ROOT / "exercises" / f"exercise_{number}.py")
    assert [t[0] for t in todos] == list(range(1, len(todos) + 1))
    assert [t[1] for t in todos] == sorted(t[1] for t in todos)
    assert unfinished_todos(ROOT / "solutions" / f"solution_{number}.py") == []


def test_templates_use_the_tiling_the_suspects_assume():
    for folder, stem in (("exercises", "exercise"), ("solutions", "solution")):
        six = load(ROOT / folder / f"{stem}_6.py")
        assert (six.BLOCK_ROWS, six.MAX_COLS) == (LAYER_NORM_BLOCK_ROWS, LAYER_NORM_MAX_COLS)
        eight = load(ROOT / folder / f"{stem}_8.py")
        assert (eight.BLOCK_M, eight.BLOCK_N, eight.HEAD_DIM_MAX) == (
            ATTENTION_BLOCK_M, ATTENTION_BLOCK_N, ATTENTION_HEAD_DIM_MAX)
        assert eight.BLOCK_M % eight.BLOCK_N == 0  # the causal loop's end is a whole key block
        first = load(ROOT / folder / f"{stem}_7.py").CONFIGS[0]
        assert (first.kwargs["BLOCK_M"], first.kwargs["BLOCK_N"]) == MATMUL_FIRST_BLOCK
        assert first.kwargs["GROUP_SIZE_M"] == MATMUL_FIRST_GROUP


@pytest.mark.parametrize("number, reopen, todo", [
    (6, [("        dw_rows = tl.sum(dy * xhat, axis=0)\n        db_rows = tl.sum(dy, axis=0)\n",
          "        dw_rows = ...  # TODO 12 (stretch): partial dweight\n"
          "        db_rows = ...  # TODO 13 (stretch): partial dbias\n")], 12),
    (8, [("    return keys[None, :] <= rows[:, None]\n",
          "    return ...  # TODO 10 (stretch): the causal mask\n")], 10),
], ids=["layer-norm-weight-grads", "causal"])
def test_core_done_stretch_open(tmp_path, number, reopen, todo):
    results = verdicts(number, plant(tmp_path, number, reopen))
    for task, task_verdicts in zip(EXERCISES[number].tasks, results):
        if is_stretch(task):
            assert f"not implemented yet: start at TODO {todo}" in task_verdicts[0].headline
        else:
            assert all(v.passed for v in task_verdicts)


def test_unfinished_config_list_is_named(tmp_path):
    path = plant(tmp_path, 7, [(
        '        config = triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,\n'
        '                                "GROUP_SIZE_M": group}, num_warps=warps, num_stages=stages)\n',
        "        config = ...  # TODO 8: a triton.Config\n")])
    visits, order, matmul = verdicts(7, path)
    assert all(v.passed for v in visits + order)
    assert "not implemented yet: start at TODO 8" in matmul[0].headline
    module = load(path)
    a = torch.randn(8, 8, device=runtime.DEVICE)
    with pytest.raises(TypeError, match=r"CONFIGS\[1\] is Ellipsis, not a triton.Config"):
        module.matmul(a, a)


# --------------------------------------------------------------------------------------------
# Each suspect against a planted bug.
# --------------------------------------------------------------------------------------------
LN = {
    "unbiased": [("    var = tl.sum(xc * xc, axis=1, keep_dims=True) / n_cols\n",
                  "    var = tl.sum(xc * xc, axis=1, keep_dims=True) / (n_cols - 1)\n")],
    "eps outside": [("    rstd = 1.0 / tl.sqrt(var + eps)\n",
                     "    rstd = 1.0 / (tl.sqrt(var) + eps)\n")],
    # Checked before TODO 6 (saving the statistics) is written: with it, the (1, BLOCK_COLS)
    # statistics fail to store into their (BLOCK_ROWS, 1) column (a shape error, tested below).
    "axis 0": [("    mean = tl.sum(x, axis=1, keep_dims=True) / n_cols\n",
                "    mean = tl.sum(x, axis=0, keep_dims=True) / n_cols\n"),
               ("    var = tl.sum(xc * xc, axis=1, keep_dims=True) / n_cols\n",
                "    var = tl.sum(xc * xc, axis=0, keep_dims=True) / n_cols\n"),
               ("    tl.store(mean_ptr + rows[:, None], mean, mask=row_mask)\n"
                "    tl.store(rstd_ptr + rows[:, None], rstd, mask=row_mask)\n", "")],
    "not saved": [("    tl.store(mean_ptr + rows[:, None], mean, mask=row_mask)\n"
                   "    tl.store(rstd_ptr + rows[:, None], rstd, mask=row_mask)\n", "")],
    "std saved": [("tl.store(rstd_ptr + rows[:, None], rstd, mask=row_mask)",
                   "tl.store(rstd_ptr + rows[:, None], 1.0 / rstd, mask=row_mask)")],
    "constants": [("    dx = (wdy - (xhat * c1 + c2)) * rstd\n", "    dx = wdy * rstd\n")],
    "dweight from x": [("dw_rows = tl.sum(dy * xhat, axis=0)", "dw_rows = tl.sum(dy * x, axis=0)")],
}
TILES = {
    "row-major": [("    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m\n"
                   "    pid_n = (pid % num_pid_in_group) // group_size_m\n",
                   "    pid_m = pid // num_pid_n\n    pid_n = pid % num_pid_n\n")],
    "last group": [("    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)\n",
                    "    group_size_m = GROUP_SIZE_M\n")],
}
ATTN = {
    "no rescale": [("acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision",
                    "acc = tl.dot(p.to(v.dtype), v, acc, input_precision")],
    "no division": [("    out = acc / l_i[:, None]\n", "    out = acc\n")],
    "diagonal": [("return keys[None, :] <= rows[:, None]", "return keys[None, :] < rows[:, None]")],
    "one more": [("return keys[None, :] <= rows[:, None]",
                  "return keys[None, :] <= rows[:, None] + 1")],
    "reversed": [("return keys[None, :] <= rows[:, None]", "return keys[None, :] >= rows[:, None]")],
    "no mask": [("return keys[None, :] <= rows[:, None]",
                 "return (keys[None, :] >= 0) & (rows[:, None] >= 0)")],
}

PLANTED = [
    # (exercise, task index, suspect name, edits)
    (6, 0, "unbiased variance", LN["unbiased"]),
    (6, 1, "unbiased variance", LN["unbiased"]),
    (6, 0, "eps outside the square root", LN["eps outside"]),
    (6, 1, "eps outside the square root", LN["eps outside"]),
    (6, 0, "wrong reduction axis", LN["axis 0"]),
    (6, 1, "statistics not saved", LN["not saved"]),
    (6, 1, "standard deviation saved instead of rstd", LN["std saved"]),
    (6, 2, "mean and rstd treated as constants", LN["constants"]),
    (6, 3, "dweight from x instead of x̂", LN["dweight from x"]),
    (7, 0, "last group not shortened", TILES["last group"]),
    (7, 1, "last group not shortened", TILES["last group"]),
    (7, 1, "row-major order", TILES["row-major"]),
    (8, 0, "accumulator not rescaled", ATTN["no rescale"]),
    (8, 0, "final division missing", ATTN["no division"]),
    (8, 1, "causal mask off by one (diagonal excluded)", ATTN["diagonal"]),
    (8, 1, "causal mask off by one (one key too many)", ATTN["one more"]),
    (8, 1, "causal mask reversed", ATTN["reversed"]),
    (8, 1, "causal mask not applied", ATTN["no mask"]),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a planted bug may compute 0 / 0 on purpose
@pytest.mark.parametrize("number, task_index, suspect_name, edits", PLANTED,
                         ids=[f"{n}-{t}-{s}" for n, t, s, _ in PLANTED])
def test_planted_bug_returns_what_its_suspect_predicts(tmp_path, nan_empty, number, task_index,
                                                       suspect_name, edits):
    module = load(plant(tmp_path, number, edits))
    task, cases = cases_of(number, task_index)
    suspect = next(s for s in task.suspects if s.name == suspect_name)
    others = [s for s in task.suspects if s is not suspect]
    launcher = getattr(module, task.function)
    telling = 0
    for case in cases:
        predicted = suspect.output(case)
        if same(predicted, case.reference):
            continue  # this case cannot tell the bug from the right answer
        out = launcher(*case.inputs, **case.kwargs)
        assert same(out, predicted), f"{case.label}: the planted bug is not what {suspect_name!r} predicts"
        assert not same(out, case.reference), case.label
        assert not any(same(out, o.output(case)) for o in others), case.label
        telling += 1
    assert telling >= 1, f"no case tells {suspect_name!r} from the reference"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("number, task_index, suspect_name, edits",
                         [p for p in PLANTED if p[2] in ("unbiased variance", "row-major order",
                                                        "accumulator not rescaled")],
                         ids=["6-y-unbiased", "6-stats-unbiased", "7-row-major", "8-no-rescale"])
def test_planted_bug_fails_the_check(tmp_path, number, task_index, suspect_name, edits):
    results = verdicts(number, plant(tmp_path, number, edits))
    assert not all(v.passed for v in results[task_index])


def test_row_major_order_still_visits_every_tile_once(tmp_path):
    visits, order, matmul = verdicts(7, plant(tmp_path, 7, TILES["row-major"]))
    assert all(v.passed for v in visits) and all(v.passed for v in matmul)
    assert not all(v.passed for v in order)


def test_wrong_axis_with_the_statistics_saved_fails_at_their_store(tmp_path):
    path = plant(tmp_path, 6, LN["axis 0"][:2])
    y = verdicts(6, path)[0]
    assert not y[0].passed and "raised" in y[0].headline
    assert "tl.store(mean_ptr" in y[0].headline


def test_backward_is_checked_apart_from_a_broken_forward(tmp_path):
    y, stats, dx, dwdb = verdicts(6, plant(tmp_path, 6, LN["eps outside"]))
    assert not all(v.passed for v in y) and not all(v.passed for v in stats)
    assert all(v.passed for v in dx + dwdb)


@pytest.mark.parametrize("number", NUMBERS)
def test_solution_matches_no_suspect_and_every_suspect_is_visible(number):
    module = load(ROOT / "solutions" / f"solution_{number}.py")
    for index, task in enumerate(EXERCISES[number].tasks):
        _, cases = cases_of(number, index, seed=11)
        visible = {s.name: 0 for s in task.suspects}
        for case in cases:
            out = getattr(module, task.function)(*case.inputs, **case.kwargs)
            assert same(out, case.reference), case.label
            for suspect in task.suspects:
                predicted = suspect.output(case)
                if not same(predicted, case.reference):
                    visible[suspect.name] += 1
                    assert not same(out, predicted), f"{case.label} looks like {suspect.name}"
        assert all(visible.values()), f"{task.function}: suspects no case shows: {visible}"


# --------------------------------------------------------------------------------------------
# Exercise 7: the grouped order itself.
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m, n, g", [(1, 1, 1), (5, 3, 2), (8, 8, 4), (7, 4, 3), (1, 6, 4),
                                     (6, 1, 8), (9, 5, 4), (13, 7, 8), (3, 5, 1)])
def test_grouped_order_visits_every_tile_once_and_walks_down_groups(m, n, g):
    order = grouped_tile_order(m, n, g)
    assert every_tile_once(order, m, n) == []
    assert torch.equal(tile_visit_counts(order, m, n), torch.ones(m, n, dtype=torch.int32))
    # Consecutive programs walk down the rows of one group before moving right.
    for pid in range(1, m * n):
        (m0, n0), (m1, n1) = order[pid - 1].tolist(), order[pid].tolist()
        assert (m1 == m0 + 1 and n1 == n0) or m1 // g != m0 // g or (n1 == n0 + 1 and m1 <= m0)
    # GROUP_SIZE_M = 1 is exercise 4's row-major order.
    assert torch.equal(grouped_tile_order(m, n, 1), row_major_tile_order(m, n))


def test_every_tile_once_names_what_is_wrong():
    unshortened = grouped_tile_order(5, 3, 2, shorten_last_group=False)
    problems = every_tile_once(unshortened, 5, 3)
    assert any("outside the 5 x 3 grid" in p for p in problems)
    assert any("never computed" in p for p in problems)
    twice = grouped_tile_order(4, 4, 2)
    twice[3] = twice[2]
    problems = every_tile_once(twice, 4, 4)
    assert any("computed more than once" in p for p in problems)
    assert any("1 tile(s) never computed" in p for p in problems)


def test_solution_tile_order_is_the_grouped_order():
    module = load(ROOT / "solutions" / "solution_7.py")
    for m, n, g in ((5, 3, 2), (9, 5, 4), (2, 2, 8)):
        assert torch.equal(module.tile_order(m, n, g).cpu(), grouped_tile_order(m, n, g))


def test_exercise_7_says_timing_needs_a_gpu(capsys):
    if not runtime.INTERPRET:
        pytest.skip("a GPU is present: the benchmark would run (see the GPU test below)")
    module = load(ROOT / "solutions" / "solution_7.py")
    assert module.benchmark() is False
    assert "Timing needs a GPU" in capsys.readouterr().out


@pytest.mark.skipif(runtime.INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_exercise_7_benchmark_saves_the_plot_on_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_WORKSHOP_AUTOTUNE", "1")
    module = load(ROOT / "solutions" / "solution_7.py")
    assert module.benchmark(str(tmp_path)) is True
    assert (tmp_path / "matmul-fp16.png").stat().st_size > 0


# --------------------------------------------------------------------------------------------
# References and the launchers' bad input.
# --------------------------------------------------------------------------------------------
def test_online_softmax_equals_the_softmax_reference():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 45, 16, generator=gen) for _ in range(3))
    for block_n in (1, 16, 64):
        assert torch.allclose(online_softmax_attention(q, k, v, block_n=block_n),
                              attention_reference(q, k, v), atol=1e-6)
    causal = attention_reference(q, k, v, causal=True)
    assert torch.allclose(causal[..., 0, :], v[..., 0, :], atol=1e-6)  # row 0 sees key 0 only


def test_launchers_refuse_bad_input_naming_the_argument():
    six = load(ROOT / "solutions" / "solution_6.py")
    x = torch.randn(4, 8, device=runtime.DEVICE)
    w = torch.randn(8, device=runtime.DEVICE)
    with pytest.raises(ValueError, match="weight must have shape"):
        six.layer_norm(x, w[:5].contiguous(), w)
    with pytest.raises(ValueError, match="x must be a 2-D matrix"):
        six.layer_norm(x[None], w, w)
    with pytest.raises(ValueError, match="more than 4096 columns"):
        wide = torch.randn(2, 5000, device=runtime.DEVICE)
        six.layer_norm(wide, wide[0].contiguous(), wide[0].contiguous())
    with pytest.raises(ValueError, match="rstd must be float32"):
        six.layer_norm_backward(x, x, w, w[:4].contiguous(), w[:4].double())
    eight = load(ROOT / "solutions" / "solution_8.py")
    q = torch.randn(1, 1, 8, 20, device=runtime.DEVICE)
    with pytest.raises(ValueError, match="head dim must be a power of two"):
        eight.attention(q, q, q)
    q = torch.randn(1, 1, 8, 16, device=runtime.DEVICE)
    with pytest.raises(TypeError, match="same dtype"):
        eight.attention(q, q, q.half())
    with pytest.raises(ValueError, match="same shape"):
        eight.attention(q, q[..., :4, :].contiguous(), q)
    seven = load(ROOT / "solutions" / "solution_7.py")
    with pytest.raises(ValueError, match=r"need a \(M, K\) and b \(K, N\)"):
        seven.matmul(q[0, 0], q[0, 0, :5].contiguous())


@pytest.mark.parametrize("number", NUMBERS)
def test_console_scripts_check_the_solutions(number, capsys):
    from triton_workshop.teach import scripts

    assert getattr(scripts, f"solution_{number}")() == 0
    assert "All checks passed" in capsys.readouterr().out
