"""Mistakes of exercises 6-8, planted one at a time into a copy of the solution: the checker must
not accept the kernel, its diagnosis must name the mistake, and advice that does not apply to the
exercise must stay out."""

from __future__ import annotations

import pytest
import torch

from test_planted_bugs import ROOT, Plant, check, planted_copy
from triton_workshop import runtime
from triton_workshop.teach import EXERCISES, load_module
from triton_workshop.teach.diagnose import diagnose
from triton_workshop.teach.verdict import Tolerance

PLANTS = [
    Plant(7, "fp16_accumulator", "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
          "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)",
          ("40x1100 @ 1100x36 float16", "rounded to float16 along the way|raised CompilationError",
           "Accumulate in float32|accumulator"),
          avoid=("other programs' tiles", "Size the grid from the output's shape", "TF32")),
    Plant(8, "running_max_from_zero", 'm_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)',
          "m_i = tl.zeros((BLOCK_M,), dtype=tl.float32)",
          ("every score of row 7 < -200", "running max started at 0", 'float("-inf")'),
          avoid=("partial (masked) block",)),
    Plant(8, "grid_axes_swapped", "grid = (cdiv(N, BLOCK_M), B * H)", "grid = (B * H, cdiv(N, BLOCK_M))",
          ("1x3x37x16", "never written"), avoid=("partial (masked) block",)),
    Plant(7, "configs_without_group_size", '''                                "GROUP_SIZE_M": group}, num_warps=warps, num_stages=stages)''',
          '''                                }, num_warps=warps, num_stages=stages)''',
          ("every config of CONFIGS, launched once", "CONFIGS[1]", "fails to launch",
           "GROUP_SIZE_M"),
          avoid=("other programs' tiles", "Size the grid from the output's shape")),
    Plant(7, "group_columns_by_constant", "    pid_n = (pid % num_pid_in_group) // group_size_m\n",
          "    pid_n = (pid % num_pid_in_group) // GROUP_SIZE_M\n",
          ("1 tile(s) never computed: (4, 2)", "1 tile(s) computed more than once: (4, 0)")),
    Plant(6, "dweight_from_x", "dw_rows = tl.sum(dy * xhat, axis=0)", "dw_rows = tl.sum(dy * x, axis=0)",
          ("dweight from x instead of x̂",), avoid=("not passed to the kernel",)),
    Plant(8, "diagonal_block_skipped", "return tl.minimum((pid_m + 1) * BLOCK_M, seq_len)",
          "return tl.minimum(pid_m * BLOCK_M, seq_len)",
          ("diagonal block skipped", "causal_key_end = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)")),
    Plant(6, "rstd_squared", "tl.store(rstd_ptr + rows[:, None], rstd, mask=row_mask)",
          "tl.store(rstd_ptr + rows[:, None], rstd * rstd, mask=row_mask)",
          ("the means (column 0) are right, the rstd (column 1) is wrong",),
          avoid=("not passed to the kernel", "subtract the row max")),
    Plant(6, "std_saved", "tl.store(rstd_ptr + rows[:, None], rstd, mask=row_mask)",
          "tl.store(rstd_ptr + rows[:, None], 1.0 / rstd, mask=row_mask)",
          ("standard deviation saved instead of rstd",),
          avoid=("not passed to the kernel", "subtract the row max")),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: f"{p.number}-{p.name}")
def test_planted_bug_is_caught_named_and_not_misadvised(tmp_path, plant):
    accepted, text = check(plant, planted_copy(tmp_path, plant))
    assert not accepted, "the checker accepted a buggy kernel"
    flat = " ".join(text.split())
    for phrase in plant.expect:
        assert any(" ".join(p.split()) in flat for p in phrase.split("|")), f"{phrase!r} not in:\n{text}"
    for phrase in plant.avoid:
        assert phrase not in flat, f"wrong advice {phrase!r} in:\n{text}"


def _computed_nan_rows():
    ref = torch.rand(8, 64) + 0.5
    out = ref.clone()
    out[3, :10] = float("nan")
    return out, ref


@pytest.mark.parametrize("uses_exp, said", [(True, "subtract the row max before exp"),
                                            (None, "If the kernel takes tl.exp"),
                                            (False, None)])
def test_nan_advice_names_exp_only_where_there_is_one(uses_exp, said):
    out, ref = _computed_nan_rows()
    text = " ".join(diagnose(out, ref, block=(4, 64), tol=Tolerance(1e-5, 1e-5),
                             uses_exp=uses_exp).details)
    assert "computed those NaNs" in text
    assert (said in text) if said else ("tl.exp" not in text and "row max" not in text), text


def test_partial_block_named_only_where_full_blocks_exist():
    ref = torch.rand(40, 16)
    out = ref.clone()
    out[3] = 0
    text = " ".join(diagnose(out, ref, block=(32, 128), tol=Tolerance(1e-5, 1e-5)).details)
    assert "partial (masked) block" not in text


@pytest.mark.parametrize("old, new, missing", [
    ('"GROUP_SIZE_M": group}, num_warps', "}, num_warps", "GROUP_SIZE_M"),
    ('config = triton.Config({"BLOCK_M": block_m,', 'config = triton.Config({"BLOCK_SIZE_M": block_m,',
     "BLOCK_M"),
])
def test_every_tuning_config_is_launched_and_the_failing_one_named(tmp_path, old, new, missing):
    """The interpreter's autotuner runs only the first config: each config is launched on its own,
    and the first that fails is named (a GPU's autotuner would fail on it)."""
    check_configs = EXERCISES[7].tasks[2].module_check
    solution = load_module(ROOT / "solutions" / "solution_7.py", "_configs_solution_7")
    assert check_configs(solution, runtime.DEVICE).passed
    plant = Plant(7, f"configs_{missing}", old, new, ())
    module = load_module(planted_copy(tmp_path, plant), f"_configs_{missing}")
    verdict = check_configs(module, runtime.DEVICE)
    assert not verdict.passed
    assert verdict.headline.startswith("CONFIGS[1] fails to launch"), verdict.headline
    assert f"'{missing}'" in verdict.details[0] and "GROUP_SIZE_M" in verdict.details[0]
