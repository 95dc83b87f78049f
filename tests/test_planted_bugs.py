"""Every classic mistake of exercises 1-5, planted one at a time into a copy of the solution: the
checker must not accept the kernel, and its diagnosis must name the mistake.

Plants whose only symptom is an out-of-bounds load or store (``memory=True``) are checked
bounds-checked: in this process in interpreter mode, and on a GPU machine through
``workshop check``'s rerun of each case in an interpreter subprocess.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from triton_workshop import runtime
from triton_workshop.teach import EXERCISES, check_exercise, check_module, load_module

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Plant:
    number: int
    name: str
    old: str
    new: str
    expect: tuple  # phrases the diagnosis must contain (each an alternative set: any of "a|b")
    memory: bool = False  # only bounds checks can see it
    avoid: tuple = ()  # phrases that would be a wrong diagnosis
    # On a GPU, where the planted kernel does not compile (Triton 3.6 refuses a float16
    # accumulator in tl.dot), the phrases that must name it instead; {dot_line} is the line of
    # the planted file's tl.dot.
    gpu_expect: tuple = ()


PLANTS = [
    # Exercise 1: vector addition.
    Plant(1, "mask_le", "mask = offsets < n_elements", "mask = offsets <= n_elements",
          ("store at offsets 1000 of out (1000 elements) in program 7", "`<=`", "compare with `<`",
           "solution_1_mask_le.py:30"), memory=True),
    Plant(1, "loads_unmasked",
          "x = tl.load(x_ptr + offsets, mask=mask)\n    y = tl.load(y_ptr + offsets, mask=mask)",
          "x = tl.load(x_ptr + offsets)\n    y = tl.load(y_ptr + offsets)",
          ("load at offsets 1000..1023 of x", "has no mask=", "does not protect the loads"),
          memory=True),
    Plant(1, "store_unmasked", "tl.store(out_ptr + offsets, x + y, mask=mask)",
          "tl.store(out_ptr + offsets, x + y)", ("store at offsets", "has no mask=|past the end"),
          memory=True),
    Plant(1, "store_into_input", "tl.store(out_ptr + offsets, x + y, mask=mask)",
          "tl.store(x_ptr + offsets, x + y, mask=mask)",
          ("stored into x (an input)|changed x (an input)",), avoid=("check the grid covers",)),
    Plant(1, "offsets_without_block", "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
          "offsets = pid + tl.arange(0, BLOCK_SIZE)",
          ("step by one|steps by 1", "pid * BLOCK_SIZE + tl.arange"), avoid=("check the grid covers",)),
    Plant(1, "y_from_x", "y = tl.load(y_ptr + offsets, mask=mask)", "y = tl.load(x_ptr + offsets, mask=mask)",
          ("y loaded from x_ptr",)),
    # Exercise 2: greyscale and sepia.
    Plant(2, "or_mask", "mask = (rows[:, None] < H) & (cols[None, :] < W)\n    plane = H * W  # the G",
          "mask = (rows[:, None] < H) | (cols[None, :] < W)\n    plane = H * W  # the G",
          ("store at offsets 1961", "of out (37 x 53, 1961 elements)", "past the last row",
           "`|` keeps a lane", "with `&`"), memory=True),
    Plant(2, "rounded_weights", "grey = 0.299 * r + 0.587 * g + 0.114 * b",
          "grey = 0.3 * r + 0.59 * g + 0.11 * b", ("rounded weights 0.3 / 0.59 / 0.11",),
          avoid=("TF32", "tl.dot")),
    Plant(2, "pid0_for_both",
          "    pid_1 = tl.program_id(1)\n    rows = pid_0 * BLOCK_H + tl.arange(0, BLOCK_H)\n"
          "    cols = pid_1 * BLOCK_W + tl.arange(0, BLOCK_W)\n    # (BLOCK_H",
          "    pid_1 = tl.program_id(0)\n    rows = pid_0 * BLOCK_H + tl.arange(0, BLOCK_H)\n"
          "    cols = pid_1 * BLOCK_W + tl.arange(0, BLOCK_W)\n    # (BLOCK_H",
          ("both program ids taken from axis 0", "tl.program_id(1)"), avoid=("check the grid covers",)),
    Plant(2, "row_offset_h", "offsets = rows[:, None] * W + cols[None, :]\n    mask = (rows[:, None] < H) & "
          "(cols[None, :] < W)\n    plane = H * W  # the G",
          "offsets = rows[:, None] * H + cols[None, :]\n    mask = (rows[:, None] < H) & "
          "(cols[None, :] < W)\n    plane = H * W  # the G",
          ("a row offset of rows * H", "rows[:, None] * W"), avoid=("check the grid covers",)),
    Plant(2, "g_from_r_plane", "g = tl.load(img_ptr + plane + offsets, mask=mask)\n    b = tl.load(img_ptr + 2 "
          "* plane + offsets, mask=mask)\n    grey",
          "g = tl.load(img_ptr + offsets, mask=mask)\n    b = tl.load(img_ptr + 2 * plane + offsets, "
          "mask=mask)\n    grey", ("channel planes mixed up", "the G values came from the R plane")),
    Plant(2, "plane_of_w", "plane = H * W  # the G", "plane = W  # the G",
          ("a channel plane of W elements|a channel plane of H elements", "H * W")),
    Plant(2, "sepia_b_into_g_plane", "tl.store(out_ptr + 2 * plane + offsets, new_b, mask=mask)",
          "tl.store(out_ptr + plane + offsets, new_b, mask=mask)",
          ("wrong channel planes", "B' went to plane 1 (G)")),
    Plant(2, "sepia_unclipped", "new_r = tl.minimum(0.393 * r + 0.769 * g + 0.189 * b, 1.0)\n"
          "    new_g = tl.minimum(0.349 * r + 0.686 * g + 0.168 * b, 1.0)\n"
          "    new_b = tl.minimum(0.272 * r + 0.534 * g + 0.131 * b, 1.0)",
          "new_r = 0.393 * r + 0.769 * g + 0.189 * b\n    new_g = 0.349 * r + 0.686 * g + 0.168 * b\n"
          "    new_b = 0.272 * r + 0.534 * g + 0.131 * b", ("no clipping at 1.0", "tl.minimum")),
    # Exercise 3: 2-D convolution.
    Plant(3, "not_centred", "in_rows = rows[:, None] + (i - K // 2)\n            in_cols = cols[None, :] + (j - K // 2)",
          "in_rows = rows[:, None] + i\n            in_cols = cols[None, :] + j",
          ("a window that is not centred", "i - K // 2")),
    Plant(3, "off_by_one", "in_rows = rows[:, None] + (i - K // 2)\n            in_cols = cols[None, :] + (j - K // 2)",
          "in_rows = rows[:, None] + (i - K // 2)\n            in_cols = cols[None, :] + (j - K // 2 - 1)",
          ("a window shifted by (+0, -1) pixels", "off by one")),
    Plant(3, "flipped", "weight = tl.load(kernel_ptr + i * K + j)",
          "weight = tl.load(kernel_ptr + (K - 1 - i) * K + (K - 1 - j))",
          ("a flipped filter (a convolution, not a correlation)",)),
    Plant(3, "transposed_filter", "weight = tl.load(kernel_ptr + i * K + j)",
          "weight = tl.load(kernel_ptr + j * K + i)", ("a transposed filter",)),
    Plant(3, "acc_assign", "acc += pixels.to(tl.float32) * weight", "acc = pixels.to(tl.float32) * weight",
          ("acc = instead of acc +=",)),
    Plant(3, "border_minus_one", "mask=inside, other=0.0", "mask=inside, other=-1.0",
          ("a border of -1 (other=-1.0)", "other=0.0")),
    Plant(3, "reads_channel_0", "plane = img_ptr + channel * H * W", "plane = img_ptr",
          ("every channel read from channel 0",)),
    Plant(3, "stores_plane_0", "tl.store(out_ptr + channel * H * W + rows", "tl.store(out_ptr + rows",
          ("every channel stored into plane 0|never written",)),
    # Exercise 4: matrix multiplication.
    Plant(4, "k_tile_fixed", "ks = k0 + tl.arange(0, BLOCK_K)", "ks = tl.arange(0, BLOCK_K)",
          ("a K tile that never advances", "k0 + tl.arange")),
    Plant(4, "acc_assign", "acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)",
          "acc = tl.dot(a, b, input_precision=INPUT_PRECISION)", ("acc = instead of accumulating",)),
    Plant(4, "tf32_always", "INPUT_PRECISION=precision)", 'INPUT_PRECISION="tf32")',
          ("TF32", "ieee")),
    Plant(4, "tf32_by_default", "acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)",
          "acc = tl.dot(a, b, acc)", ("TF32", "left out")),
    Plant(4, "fp16_accumulator", "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
          "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)",
          ("40x1100 @ 1100x36 float16", "rounded to float16 along the way", "Accumulate in float32"),
          avoid=("TF32",),
          gpu_expect=("40x1100 @ 1100x36 float16: raised CompilationError at line {dot_line}: "
                      "acc = tl.dot(a, b, acc", "the accumulator passed to tl.dot is not float32",
                      "Accumulate in float32")),
    Plant(4, "fp16_partial_sums", "acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)",
          "acc += tl.dot(a, b, input_precision=INPUT_PRECISION).to(c_ptr.dtype.element_ty)",
          ("rounded to float16 along the way",), avoid=("TF32",)),
    Plant(4, "no_k_mask", "mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0",
          "mask=(cols[None, :] < N), other=0.0", ("load at offsets", "of b (45 x 83"), memory=True),
    # Exercise 5: softmax.
    Plant(5, "grid_of_columns", "grid = (n_rows,)", "grid = (n_cols,)",
          ("the grid launches 100 programs along axis 0, but the output has 37 rows",
           "program 37 has no row of its own"), memory=True),
    Plant(5, "padding_zero", 'mask=mask, other=-float("inf")', "mask=mask, other=0.0",
          ("padding lanes loaded as 0", 'other=-float("inf")')),
    Plant(5, "padding_minus_one", 'mask=mask, other=-float("inf")', "mask=mask, other=-1.0", ("padding lanes loaded as -1",)),
    Plant(5, "no_normalisation", "y = numerator / tl.sum(numerator, axis=0)", "y = numerator",
          ("a missing normalisation",)),
    Plant(5, "exponent_in_fp16", "numerator = tl.exp(x - tl.max(x, axis=0))",
          "numerator = tl.exp((x - tl.max(x, axis=0)).to(x_ptr.dtype.element_ty).to(tl.float32))",
          ("33x70 x8 float16", "ran in float16", ".to(tl.float32)")),
]


def planted_copy(tmp_path: Path, plant: Plant) -> Path:
    source = (ROOT / "solutions" / f"solution_{plant.number}.py").read_text()
    assert source.count(plant.old) == 1, f"{plant.old!r} must occur once in solution_{plant.number}.py"
    path = tmp_path / f"solution_{plant.number}_{plant.name}.py"
    path.write_text(source.replace(plant.old, plant.new))
    return path


def check(plant: Plant, path: Path) -> tuple[bool, str]:
    """(accepted, the failing cases' report)."""
    if plant.memory and not runtime.INTERPRET:  # a GPU: the interpreter rerun sees the bounds
        stream = io.StringIO()
        code = check_exercise(plant.number, path=path, seed=0, console=Console(file=stream, width=400))
        return code == 0, stream.getvalue()
    module = load_module(path, f"_planted_{plant.number}_{plant.name}")
    cases = [c for r in check_module(EXERCISES[plant.number], module, seed=0) for c in r.cases]
    failed = [c for c in cases if not c.verdict.passed]
    return not failed, "\n".join(f"{c.label}: {c.verdict.headline}\n" + "\n".join(c.verdict.details)
                                  for c in failed)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on the poison (NaN) of stray loads
@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: f"{p.number}-{p.name}")
def test_planted_bug_is_caught_and_named(tmp_path, plant):
    path = planted_copy(tmp_path, plant)
    accepted, text = check(plant, path)
    assert not accepted, "the checker accepted a buggy kernel"
    flat = " ".join(text.split())
    expect = plant.expect
    if plant.gpu_expect and not runtime.INTERPRET and "raised CompilationError" in flat:
        dot_line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "tl.dot(" in ln)
        expect = tuple(p.format(dot_line=dot_line) for p in plant.gpu_expect)
    for phrase in expect:
        assert any(" ".join(p.split()) in flat for p in phrase.split("|")), f"{phrase!r} not in:\n{text}"
    for phrase in plant.avoid:
        assert phrase not in flat, f"wrong diagnosis {phrase!r} in:\n{text}"


def test_plants_cover_each_exercise():
    assert {p.number for p in PLANTS} == {1, 2, 3, 4, 5}


def test_tf32_advice_only_where_tl_dot_can_cause_it():
    """A result off by a little in an exercise without tl.dot never gets TF32 advice."""
    import torch

    from triton_workshop.teach.diagnose import diagnose
    from triton_workshop.teach.verdict import Tolerance

    ref = torch.rand(40, 40) + 0.5
    out = ref * (1 + 3e-3)
    no_dot = "\n".join(diagnose(out, ref, block=(16, 32), tol=Tolerance(1e-5, 1e-5)).details)
    with_dot = "\n".join(diagnose(out, ref, block=(16, 32), tol=Tolerance(1e-5, 1e-5),
                                  uses_dot=True).details)
    assert "TF32" not in no_dot and "constant slightly off" in no_dot
    assert "TF32" in with_dot and "ieee" in with_dot


def test_softmax_without_fp32_upcast_computes_in_fp32_anyway(tmp_path):
    """Leaving out .to(tl.float32) on the load is harmless in Triton: tl.max promotes float16 to
    float32 (so x - max is float32) and tl.exp accepts only float32. The float16 case's
    tolerance is one rounding from exact, so real float16 arithmetic is caught (above), and
    this kernel's results are that close."""
    plant = Plant(5, "no_upcast", 'other=-float("inf")).to(tl.float32)', 'other=-float("inf"))', ())
    accepted, text = check(plant, planted_copy(tmp_path, plant))
    assert accepted, text
