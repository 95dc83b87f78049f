"""layer_norm's launch decisions: the tuning (:class:`LayerNormTuning`) and the launch plans of
the forward and the backward for one shape, worked out once and cached (the op's host code in
:mod:`.` reads them at every call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ... import runtime
from ...runtime import LaunchPlan, acc_dtype, chunk_tile, num_warps_for, plan_cache, row_tile
from .kernels import (
    layer_norm_bwd_dwdb_chunked_kernel,
    layer_norm_bwd_dx_chunked_kernel,
    layer_norm_bwd_kernel,
    layer_norm_bwd_sum_partials_kernel,
    layer_norm_fwd_chunked_kernel,
    layer_norm_fwd_kernel,
)


@dataclass(frozen=True)
class LayerNormTuning:
    """The launch decisions of layer_norm: part of every plan's key (tests replace
    :data:`TUNING` with ``dataclasses.replace`` to reach the chunked paths on short rows).
    docs/kernels/layer_norm.md has the measurements behind the numbers."""

    #: Longest row the forward keeps whole in registers; longer rows are streamed in
    #: ``forward_chunk_cols`` chunks. The chunked kernel reads each row twice (the second time
    #: from L2) and is still the faster from 8192 columns on: a whole row of 8192-16384 values in
    #: registers leaves one program an SM.
    single_block_max_cols: int = 4096
    #: The forward's chunk (a power of two): one chunk holds a whole row of up to 8192 columns.
    forward_chunk_cols: int = 8192
    #: The same for the backward, lower: its program also keeps the running dweight/dbias sums
    #: and the weight row in registers, and spills on longer rows.
    backward_single_block_max_cols: int = 8192
    #: Longer rows up to this length still get ``dx`` from one single-block pass (the fused
    #: kernel with the dweight/dbias sums off: x, dy and the weight row only, as in the forward),
    #: and the partial sums from the column-tiled kernel; longer still, ``dx`` takes two chunked
    #: passes over each row. fp16 rows of 16384 with 32 warps compile to 64 registers on sm_90,
    #: no spills.
    backward_dx_single_block_max_cols: int = 16384
    #: Elements per loop step on the backward's chunked paths (a power of two).
    chunk_cols: int = 4096
    #: Elements a single-block program aims to own (short rows are packed several to a program),
    #: and the most rows it packs.
    tile_elems: int = 4096
    max_rows_per_program: int = 64
    #: Backward programs per SM: each accumulates partial dweight/dbias over its group of rows,
    #: so there are ``programs x n_cols`` partials to sum at the end. More programs an SM add
    #: partials to write and sum and no bandwidth.
    backward_programs_per_sm: int = 2
    #: Single-block backward tiles of at least this many elements (rows of 4097-8192 columns) are
    #: "wide": a program holds the weight row and the running dweight/dbias besides x and dy, and
    #: with 16 warps needs so many registers that one program fills an SM. Wide tiles run
    #: ``backward_wide_num_warps`` warps (64 registers a thread, no spills) and one program an SM.
    backward_wide_tile_elems: int = 8192
    backward_wide_num_warps: int = 32
    #: The single-block backward's row loop is software-pipelined over this many stages
    #: (``cp.async``): the x and dy tiles of the next ``stages - 1`` iterations are loaded into
    #: shared memory while the program reduces and stores the current one; without it a
    #: persistent program has no load in flight during that time. Used only where those tiles fit
    #: in ``backward_prefetch_bytes`` (fp16/bf16 rows up to 8192, fp32 up to 4096); otherwise 1
    #: stage: an fp32 row of 8192 pipelined over 2 stages spilled at the 64 registers 32 warps
    #: allow (sm_90, Triton 3.6).
    backward_stages: int = 3
    #: 64 KiB of shared memory a program: fits any GPU with ``cp.async`` (sm_80 and later).
    backward_prefetch_bytes: int = 64 * 1024
    #: Software-pipeline stages of the column-tiled dweight/dbias kernel's row loop.
    dwdb_stages: int = 3
    #: The partial-sum reduction's tile: ``BLOCK_P`` partial rows x ``BLOCK_N`` columns a step
    #: (narrow, so that even 1024 columns are 32 programs).
    sum_partials_block_p: int = 32
    sum_partials_block_n: int = 32



@plan_cache()
def forward_launch(n_rows, n_cols, eps, dtypes, has_weight, has_bias,
                  tuning: LayerNormTuning, store_stats: bool = True) -> LaunchPlan:
    """The forward's launch (``dtypes``: of x, weight and bias as launched; ``store_stats``
    off: ``mean`` and ``rstd`` are not written, their operands only stand in). Cached: the same
    few shapes come back every step, and on a slow host working this out costs as much as a
    launch."""
    consts = dict(HAS_WEIGHT=has_weight, HAS_BIAS=has_bias, STORE_STATS=store_stats,
                  ACC=acc_dtype(dtypes[0]))
    if n_cols <= tuning.single_block_max_cols:
        tile = row_tile(n_cols, n_rows, tile_elems=tuning.tile_elems,
                        max_rows=tuning.max_rows_per_program)
        consts.update(BLOCK_N=tile.block_cols, ROWS=tile.rows, num_warps=tile.num_warps)
        return LaunchPlan(layer_norm_fwd_kernel, (runtime.cdiv(n_rows, tile.rows),),
                          (n_rows, n_cols, eps), consts)
    tile = chunk_tile(n_cols, tuning.forward_chunk_cols)
    consts.update(BLOCK_N=tile.block_cols, num_warps=tile.num_warps)
    return LaunchPlan(layer_norm_fwd_chunked_kernel, (n_rows,), (n_cols, eps), consts)


class BackwardPlan(NamedTuple):
    """The backward's launches for one shape, in launch order, by name (``"fused"``,
    ``"dx_rows"``, ``"dx"``, ``"dwdb"``, ``"sum"``: see :func:`layer_norm`'s ``_backward_launches`` for their
    operands), and the rows of partial ``dweight`` (and of partial ``dbias``) they fill."""

    n_partials: int
    launches: dict[str, LaunchPlan]


@plan_cache()
def backward_plan(n_rows, n_cols, dtypes, has_weight, need, n_sms,
                   tuning: LayerNormTuning) -> BackwardPlan:
    """The backward's launches for one shape. Cached like the forward's plan. ``dtypes``: of
    ``dy``, ``x``, the weight as launched, ``dweight`` and ``dbias``."""
    _, need_dw, need_db = need
    dy_dtype, dtype = dtypes[:2]
    acc = acc_dtype(dtype)
    n_partials, launches = _backward_main_launches(
        n_rows, n_cols, dy_dtype.itemsize + dtype.itemsize, acc, has_weight, need, n_sms, tuning)
    if need_dw or need_db:
        # The second, small stage of the reduction, in a fixed order: deterministic.
        launches["sum"] = LaunchPlan(
            layer_norm_bwd_sum_partials_kernel,
            (runtime.cdiv(n_cols, tuning.sum_partials_block_n),), (n_partials, n_cols),
            dict(COMPUTE_DW=need_dw, COMPUTE_DB=need_db, ACC=acc,
                 BLOCK_P=tuning.sum_partials_block_p, BLOCK_N=tuning.sum_partials_block_n,
                 DB_AFTER_DW=need_dw and need_db, num_warps=4))
    return BackwardPlan(n_partials, launches)


def _backward_main_launches(n_rows, n_cols, bytes_per_elem_pair, acc, has_weight, need, n_sms,
                            tuning: LayerNormTuning) -> tuple[int, dict[str, LaunchPlan]]:
    """``(n_partials, launches)``: the backward's launches before the partial sums: one fused
    kernel for rows that fit a block, else dx and the dweight/dbias partials chunk by chunk.
    ``bytes_per_elem_pair``: bytes of one ``x`` and one ``dy`` element."""
    need_dx, need_dw, need_db = need
    wide_num_warps = tuning.backward_wide_num_warps
    if n_cols <= tuning.backward_single_block_max_cols:
        tile = row_tile(n_cols, n_rows, tile_elems=tuning.tile_elems,
                        max_rows=tuning.max_rows_per_program)
        elems = tile.rows * tile.block_cols
        wide = elems >= tuning.backward_wide_tile_elems
        programs_per_sm = tuning.backward_programs_per_sm
        # A fixed partition of the rows into groups (it depends only on the shape and the GPU):
        # the same summation order, so the same bits, every run.
        n_programs = min(n_sms * (1 if wide else programs_per_sm), runtime.cdiv(n_rows, tile.rows))
        rows_per_program = runtime.cdiv(n_rows, n_programs)
        n_programs = runtime.cdiv(n_rows, rows_per_program)
        # Pipeline the row loop where the prefetched x and dy tiles fit in shared memory.
        stages = tuning.backward_stages
        prefetch = (stages - 1) * elems * bytes_per_elem_pair
        consts = dict(
            HAS_WEIGHT=has_weight, COMPUTE_DX=need_dx, COMPUTE_DW=need_dw, COMPUTE_DB=need_db,
            ACC=acc, BLOCK_N=tile.block_cols, ROWS=tile.rows,
            STAGES=stages if prefetch <= tuning.backward_prefetch_bytes else 1,
            num_warps=wide_num_warps if wide else tile.num_warps,
        )
        launches = {"fused": LaunchPlan(layer_norm_bwd_kernel, (n_programs,),
                                        (n_rows, n_cols, rows_per_program), consts)}
        return n_programs, launches
    tile = chunk_tile(n_cols, tuning.chunk_cols)
    launches = {}
    if need_dx and n_cols <= tuning.backward_dx_single_block_max_cols:
        # One read of x and dy for dx (not two): without the running sums a whole row fits.
        # Persistent, one wide program an SM. Not pipelined: 2 stages measured slower than 1
        # (docs/kernels/layer_norm.md).
        block_cols = runtime.next_power_of_2(n_cols)
        rows_per_program = runtime.cdiv(n_rows, min(n_sms, n_rows))
        launches["dx_rows"] = LaunchPlan(
            layer_norm_bwd_kernel, (runtime.cdiv(n_rows, rows_per_program),),
            (n_rows, n_cols, rows_per_program),
            dict(HAS_WEIGHT=has_weight, COMPUTE_DX=True, COMPUTE_DW=False, COMPUTE_DB=False,
                 ACC=acc, BLOCK_N=block_cols, ROWS=1, STAGES=1, num_warps=wide_num_warps))
    elif need_dx:
        launches["dx"] = LaunchPlan(layer_norm_bwd_dx_chunked_kernel, (n_rows,), (n_cols,), dict(
            HAS_WEIGHT=has_weight, ACC=acc, BLOCK_N=tile.block_cols, num_warps=tile.num_warps))
    n_col_blocks = runtime.cdiv(n_cols, tile.block_cols)
    n_groups = min(n_rows, runtime.cdiv(n_sms * tuning.backward_programs_per_sm, n_col_blocks))
    rows_per_group = runtime.cdiv(n_rows, n_groups)
    n_groups = runtime.cdiv(n_rows, rows_per_group)
    if need_dw or need_db:
        launches["dwdb"] = LaunchPlan(
            layer_norm_bwd_dwdb_chunked_kernel, (n_groups, n_col_blocks),
            (n_rows, n_cols, rows_per_group),
            dict(COMPUTE_DW=need_dw, COMPUTE_DB=need_db, ACC=acc, BLOCK_N=tile.block_cols,
                 STAGES=tuning.dwdb_stages, num_warps=num_warps_for(tile.block_cols)))
    return n_groups, launches
