"""rms_norm's launches for one shape: the forward's (whole rows a program, or one long row a
program in chunks), and the backward's: the fused kernel for rows that fit a block, else dx and
the dweight partials chunk by chunk, and the deterministic sum of the partials (a fixed partition
of the rows, the same bits every run). The host code that finds and launches them is in the
package's ``__init__``.
"""

from __future__ import annotations

from typing import NamedTuple

from ... import runtime
from ...runtime import (
    LaunchPlan,
    acc_dtype,
    chunk_tile,
    num_warps_for,
    plan_cache,
    row_tile,
)
from ..layer_norm.kernels import layer_norm_bwd_sum_partials_kernel
from .kernels import (
    rms_norm_bwd_dw_chunked_kernel,
    rms_norm_bwd_dx_chunked_kernel,
    rms_norm_bwd_kernel,
    rms_norm_fwd_chunked_kernel,
    rms_norm_fwd_kernel,
)


@plan_cache()
def forward_plan(n_rows, n_cols, eps, weight_offset, dtypes, has_residual, has_weight,
                 round_xhat, store_rstd, tuning) -> LaunchPlan:
    """The forward's launch (``dtypes``: of x, the weight as launched, y; ``store_rstd``: write
    the statistics, which only a backward reads) under ``tuning`` (an ``RMSNormTuning``).
    Cached: the same few shapes come back every step."""
    consts = dict(HAS_RESIDUAL=has_residual, HAS_WEIGHT=has_weight, ROUND_XHAT=round_xhat,
                  STORE_RSTD=store_rstd, ACC=acc_dtype(dtypes[0]))
    if n_cols <= tuning.single_block_max_cols:
        tile = row_tile(n_cols, n_rows, tile_elems=tuning.tile_elems,
                        max_rows=tuning.max_rows_per_program)
        consts.update(BLOCK_N=tile.block_cols, ROWS=tile.rows, num_warps=tile.num_warps)
        return LaunchPlan(rms_norm_fwd_kernel, (runtime.cdiv(n_rows, tile.rows),),
                          (n_rows, n_cols, eps, weight_offset), consts)
    tile = chunk_tile(n_cols, tuning.forward_chunk_cols)
    consts.update(BLOCK_N=tile.block_cols, num_warps=tile.num_warps)
    return LaunchPlan(rms_norm_fwd_chunked_kernel, (n_rows,), (n_cols, eps, weight_offset),
                      consts)


class BackwardPlan(NamedTuple):
    """The backward's launches for one shape by name, in launch order (``"fused"``,
    ``"dx_rows"``, ``"dx"``, ``"dw"``, ``"sum"``: the package's ``_backward_launches`` gives
    their operands), and the partial ``dweight`` rows they fill."""

    n_partials: int
    launches: dict[str, LaunchPlan]


def row_groups(n_rows: int, max_groups: int) -> tuple[int, int]:
    """``(n_groups, rows_per_group)``: consecutive rows in at most ``max_groups`` groups, a fixed
    partition (shape and GPU only): the same summation order, so the same bits, every run."""
    rows_per_group = runtime.cdiv(n_rows, max(1, min(max_groups, n_rows)))
    return runtime.cdiv(n_rows, rows_per_group), rows_per_group


@plan_cache()
def backward_plan(n_rows, n_cols, weight_offset, dtypes, has_weight, has_dsum, round_xhat, need,
                  n_sms, tuning) -> BackwardPlan:
    """The backward's launches for one shape (``dtypes``: of dy, x, the weight as launched,
    dsum (None: there is none), dweight) under ``tuning`` (an ``RMSNormTuning``). Cached: the
    same few shapes come back every step."""
    need_dx, need_dw = need
    dy_dtype, x_dtype = dtypes[:2]
    acc = acc_dtype(x_dtype)
    common = dict(ROUND_XHAT=round_xhat, ACC=acc)
    launches = {}
    if n_cols <= tuning.backward_single_block_max_cols:
        tile = row_tile(n_cols, n_rows, tile_elems=tuning.tile_elems,
                        max_rows=tuning.max_rows_per_program)
        elems = tile.rows * tile.block_cols
        wide = elems >= tuning.backward_wide_tile_elems
        n_partials, rows_per_program = row_groups(
            n_rows, min(n_sms * (1 if wide else tuning.backward_programs_per_sm),
                        runtime.cdiv(n_rows, tile.rows)))
        # Pipeline the row loop where the prefetched x and dy tiles fit in shared memory.
        prefetch = (tuning.backward_stages - 1) * elems * (dy_dtype.itemsize + x_dtype.itemsize)
        launches["fused"] = LaunchPlan(
            rms_norm_bwd_kernel, (n_partials,),
            (n_rows, n_cols, rows_per_program, weight_offset), dict(
                common, HAS_WEIGHT=has_weight, HAS_DSUM=has_dsum, COMPUTE_DX=need_dx,
                COMPUTE_DW=need_dw, RELOAD_WEIGHT=n_cols > tuning.backward_weight_held_max_cols,
                BLOCK_N=tile.block_cols, ROWS=tile.rows, STAGES=(
                    tuning.backward_stages if prefetch <= tuning.backward_prefetch_bytes else 1),
                num_warps=tuning.backward_wide_num_warps if wide else tile.num_warps))
    else:
        tile = chunk_tile(n_cols, tuning.chunk_cols)
        if need_dx and n_cols <= tuning.backward_dx_single_block_max_cols:
            # One read of x and dy for dx (not two): without the running sums a whole row fits.
            # Persistent, one wide program an SM.
            n_programs, rows_per_program = row_groups(n_rows, n_sms)
            launches["dx_rows"] = LaunchPlan(
                rms_norm_bwd_kernel, (n_programs,),
                (n_rows, n_cols, rows_per_program, weight_offset), dict(
                    common, HAS_WEIGHT=has_weight, HAS_DSUM=has_dsum, COMPUTE_DX=True,
                    COMPUTE_DW=False, RELOAD_WEIGHT=False, BLOCK_N=runtime.next_power_of_2(n_cols),
                    ROWS=1, STAGES=1, num_warps=tuning.backward_wide_num_warps))
        elif need_dx:
            launches["dx"] = LaunchPlan(
                rms_norm_bwd_dx_chunked_kernel, (n_rows,), (n_cols, weight_offset), dict(
                    common, HAS_WEIGHT=has_weight, HAS_DSUM=has_dsum, BLOCK_N=tile.block_cols,
                    num_warps=tile.num_warps))
        n_col_blocks = runtime.cdiv(n_cols, tile.block_cols)
        n_partials, rows_per_group = row_groups(
            n_rows, runtime.cdiv(n_sms * tuning.backward_programs_per_sm, n_col_blocks))
        if need_dw:
            launches["dw"] = LaunchPlan(
                rms_norm_bwd_dw_chunked_kernel, (n_partials, n_col_blocks),
                (n_rows, n_cols, rows_per_group), dict(
                    common, BLOCK_N=tile.block_cols, STAGES=tuning.dwdb_stages,
                    num_warps=num_warps_for(tile.block_cols)))
    if need_dw:
        # The second, small stage of the reduction, in a fixed order: deterministic.
        launches["sum"] = LaunchPlan(
            layer_norm_bwd_sum_partials_kernel,
            (runtime.cdiv(n_cols, tuning.sum_partials_block_n),), (n_partials, n_cols),
            dict(COMPUTE_DW=True, COMPUTE_DB=False, ACC=acc, BLOCK_P=tuning.sum_partials_block_p,
                 BLOCK_N=tuning.sum_partials_block_n, DB_AFTER_DW=False, num_warps=4))
    return BackwardPlan(n_partials, launches)


def kept_launches(plan: BackwardPlan, n_cols: int) -> tuple:
    """A plan's launches in launch order, by their operands (no names to compare at each call):
    ``(the rows' launch ("fused" or "dx_rows": dx and the partial sums), "dx", "dw", "sum"
    (None: not launched), the partial sums' size)``."""
    launches = plan.launches
    return (launches.get("fused") or launches.get("dx_rows"), launches.get("dx"),
            launches.get("dw"), launches.get("sum"), plan.n_partials * n_cols)
