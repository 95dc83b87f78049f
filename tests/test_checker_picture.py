"""The picture of a failing case (teach/picture.py): the output as cells coloured by the program
that stored them, wrong / never written / out-of-bounds cells marked; in the terminal and as a
PNG (``workshop check N --png``)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from rich.console import Console

from triton_workshop import cli, runtime
from triton_workshop.teach import EXERCISES, check_module, load_module
from triton_workshop.teach.verdict import Geometry, Tolerance
from triton_workshop.teach.picture import (OK, OUT_OF_BOUNDS, UNWRITTEN, WRONG, build_picture, render,
                                           save_png)

ROOT = Path(__file__).resolve().parents[1]


def planted(tmp_path, number, old, new):
    source = (ROOT / "solutions" / f"solution_{number}.py").read_text()
    assert source.count(old) == 1, old
    path = tmp_path / f"picture_{number}.py"
    path.write_text(source.replace(old, new))
    return path


def first_failing(number, path):
    module = load_module(path, f"_picture_{number}_{path.stem}")
    for report in check_module(EXERCISES[number], module, seed=0):
        for case in report.cases:
            if not case.verdict.passed:
                return case
    raise AssertionError("the planted bug went unnoticed")


def grid(pic):
    return np.array(pic["status"]).reshape(pic["rows"], pic["cols"])


def test_1d_output_is_one_row_per_block_and_marks_the_unwritten_tail(tmp_path):
    case = first_failing(1, planted(tmp_path, 1, "grid = (cdiv(n, BLOCK_SIZE),)", "grid = (n // BLOCK_SIZE,)"))
    pic = case.verdict.picture
    assert pic["rows"] == 8 and pic["cols"] == 128  # n=1000, blocks of 128
    status = grid(pic)
    assert (status[:7] == OK).all()
    assert (status[7, :104] == UNWRITTEN).all() and (status[7, 104:] == -1).all()  # no element there


def test_out_of_bounds_stores_show_below_the_output(tmp_path):
    case = first_failing(2, planted(
        tmp_path, 2, "mask = (rows[:, None] < H) & (cols[None, :] < W)\n    plane = H * W  # the G",
        "mask = (rows[:, None] < H) | (cols[None, :] < W)\n    plane = H * W  # the G"))
    pic = case.verdict.picture
    status = grid(pic)
    assert pic["height"] == 37 and pic["rows"] > 37 and pic["oob"] > 0
    assert (status[37:] == OUT_OF_BOUNDS).any() and not (status[:37] == OUT_OF_BOUNDS).any()
    if runtime.INTERPRET:  # the write map: colours are the programs that actually stored
        assert pic["actual_writers"] and [2, 0] in pic["programs"]
    text = Console(file=io.StringIO(), width=120, record=True)
    text.print(render(pic))
    drawn = text.export_text()
    assert "past the end (stores the checker dropped)" in drawn and "!" in drawn
    assert "· right   ✗ wrong   ? never written" in drawn


def test_3d_output_draws_the_first_failing_plane(tmp_path):
    case = first_failing(3, planted(tmp_path, 3, "tl.store(out_ptr + channel * H * W + rows",
                                    "tl.store(out_ptr + rows"))
    pic = case.verdict.picture
    assert pic["title"] in ("slice 0 of the leading dim", "slice 1 of the leading dim")
    assert pic["rows"] == 37 and pic["cols"] == 53
    assert (grid(pic) != OK).any()


def test_large_outputs_shrink_to_the_worst_cell():
    ref = torch.rand(600, 700)
    out = ref.clone()
    out[599, 699] = float("nan")  # one hole in the last element
    out[0, 0] += 1.0  # one wrong value
    pic = build_picture(out, ref, tol=Tolerance(1e-5, 1e-5), geometry=Geometry((600, 700), (16, 32)))
    status = grid(pic)
    assert pic["cell"] == [3, 3] and status.shape == (200, 234)
    assert status[0, 0] == WRONG and status[-1, -1] == UNWRITTEN
    assert (status == OK).sum() == status.size - 2


def test_png_is_written(tmp_path):
    ref = torch.rand(40, 70)
    out = ref.clone()
    out[30:, :] = float("nan")
    out[:5, :5] = 0
    pic = build_picture(out, ref, tol=Tolerance(1e-5, 1e-5), geometry=Geometry((40, 70), (16, 32)),
                        oob=[(40 * 70 + i, 0) for i in range(70)])
    path = save_png([("demo(40x70)", pic)], tmp_path / "pic.png")
    image = Image.open(path)
    assert image.size[0] > 400 and image.size[1] > 200
    pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 5  # colours, not a blank canvas


def test_workshop_check_png_and_terminal_picture(tmp_path, capsys):
    path = planted(tmp_path, 1, "grid = (cdiv(n, BLOCK_SIZE),)", "grid = (n // BLOCK_SIZE,)")
    png = tmp_path / "check.png"
    assert cli.main(["check", "1", "--file", str(path), "--seed", "0", "--png", str(png)]) == 1
    out = capsys.readouterr().out
    assert png.is_file() and Image.open(png).size[0] > 0
    assert "one row per block of 128" in out and "? never written" in out
