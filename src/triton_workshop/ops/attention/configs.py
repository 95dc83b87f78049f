"""The attention kernels' autotuning: the candidate configs of each autotuned kernel, the key
they are tuned under, and the pruning that keeps only the tiles that fit shared memory and
registers.

Plain Python, read by the ``@runtime.autotune`` decorators of :mod:`.kernels` (which re-exports
the configs and the pruning functions). The sm_90 compiles behind the register budgets are in
docs/kernels/attention.md.
"""

from __future__ import annotations

import triton

from ... import runtime


# --------------------------------------------------------------------------------------------
# Configs. One list per kernel, configs[0] first: it is the interpreter's, and the GPU's fallback
# when pruning leaves nothing. Tuned for Hopper (228 KB shared memory, 64K registers per SM).
# --------------------------------------------------------------------------------------------
def _config(block_m, block_n, stages, warps):
    return triton.Config(
        {"BLOCK_M": block_m, "BLOCK_N": block_n}, num_stages=stages, num_warps=warps
    )


#: Forward: BLOCK_M query rows, BLOCK_N keys per step (BLOCK_M a multiple of BLOCK_N, which the
#: causal split needs). 128 x 64 with 4 warps is FlashAttention-2's choice for D <= 128; 8 warps
#: and 128-key tiles pay off for D = 128 and long sequences; 64 x 64 is the fallback for D = 256
#: (a 128 x 256 fp32 accumulator does not fit the registers of 4 warps).
FWD_CONFIGS = [
    _config(128, 64, 3, 4),
    _config(128, 64, 4, 4),
    _config(128, 64, 2, 4),
    _config(128, 64, 3, 8),
    _config(128, 128, 3, 8),
    _config(128, 128, 2, 8),
    _config(64, 64, 3, 4),
    # D = 256: 64 x 256 fp32 accumulators over 8 warps; 32 x 32 is also the only tile whose K/V
    # pipeline fits shared memory in fp32.
    _config(64, 64, 2, 8),
    _config(32, 32, 2, 4),
]

#: dK/dV: BLOCK_N keys stay resident (two fp32 accumulators), BLOCK_M query rows stream by
#: (BLOCK_N a multiple of BLOCK_M). The kernel's first two dots (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ) have
#: BLOCK_N rows, and an sm_90 warpgroup (4 warps) takes 64 of them per wgmma: with fewer than
#: 16 rows a warp (BLOCK_N 64 on 8 warps) both warpgroups compute the *same* Sᵀ and dPᵀ, in
#: n16 instructions, and do every exp twice (``prune_dkdv_configs`` drops those configs where
#: others remain). So 64-key tiles take 4 warps and 128-key tiles 8; at D = 128, 2 x 128 x 128
#: fp32 accumulators over 8 warps is 128 registers a thread, and only BLOCK_M <= 32 leaves room
#: for the score tiles (BLOCK_M 64 spills, and ptxas serialises the wgmmas: warning C7515).
DKDV_CONFIGS = [
    # D <= 64 (64 fp32 accumulators a thread); also the interpreter's.
    _config(32, 64, 3, 4),
    # D = 128 (fits the registers of 8 warps: see docs/kernels/attention.md).
    _config(32, 128, 2, 8),
    _config(32, 128, 3, 8),
    _config(16, 128, 3, 8),
    _config(16, 64, 4, 4),
    # D <= 64: larger query tiles, deeper pipeline (at D = 128 the latter spills).
    _config(64, 64, 2, 4),
    _config(32, 128, 4, 8),
    # D = 256 and fp32 (FMA dots: far more registers a tile): narrow key tiles; the first two are
    # also the only tiles whose pipeline fits shared memory in fp32 at D = 256.
    _config(16, 32, 2, 8),
    _config(32, 32, 2, 8),
    _config(16, 64, 2, 8),
]

#: dQ: BLOCK_M query rows stay resident (one fp32 accumulator), BLOCK_N keys stream by
#: (BLOCK_M a multiple of BLOCK_N).
DQ_CONFIGS = [
    _config(64, 32, 3, 4),
    _config(128, 32, 3, 4),
    _config(128, 32, 4, 8),
    _config(128, 64, 3, 8),
    _config(64, 64, 3, 4),
    _config(64, 16, 4, 4),
    _config(64, 32, 2, 8),
    # fp32 with D = 256.
    _config(32, 16, 2, 4),
]

#: fp32 accumulator elements a thread may hold: past 64, the recomputed score tile and the operands
#: no longer fit beside them in 255 registers and ptxas spills (the sm_90 compiles behind this
#: bound are in docs/kernels/attention.md).
_MAX_ACC_PER_THREAD = 64


def _prune(
    configs, element_size, head_dim_pad, accumulator_rows, shared_rows,
    registers_fit=None, preferred=None,
):  # fmt: skip
    """Keep the configs whose tiles fit shared memory and whose fp32 accumulators fit registers.

    ``accumulator_rows(c)``: rows (of ``head_dim_pad`` fp32) of accumulators a program keeps for
    its whole life; more than ``_MAX_ACC_PER_THREAD`` a thread and registers spill.
    ``shared_rows(c)``:
    rows (of ``head_dim_pad`` elements) of tiles in shared memory, all pipeline stages counted.
    ``registers_fit(c)``, when given, replaces the accumulator rule with a kernel's own.
    ``preferred(c)``, when given, narrows what fits to the configs it accepts, if any.
    """
    # 4 KB spare: the compiler adds a little (reduction scratch, barriers) to what the tiles need.
    limit = runtime.shared_memory_limit() - 4096

    def fits(c):
        if shared_rows(c) * head_dim_pad * element_size > limit:
            return False
        if registers_fit is not None:
            return registers_fit(c)
        return accumulator_rows(c) * head_dim_pad <= _MAX_ACC_PER_THREAD * 32 * c.num_warps

    kept = [c for c in configs if fits(c)]
    if preferred is not None:
        best = [c for c in kept if preferred(c)]
        if best:
            return best
    if kept:
        return kept
    # Nothing fits comfortably (D = 256 in fp32): the smallest tiles spill least.
    return [min(configs, key=lambda c: (c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"], -c.num_warps))]


def prune_fwd_configs(configs, named_args, **kwargs):
    """attn_fwd_kernel's configs that fit: one fp32 accumulator row per query row."""
    args = {**named_args, **kwargs}
    return _prune(
        configs,
        args["q_ptr"].element_size(),
        args["HEAD_DIM_PAD"],
        accumulator_rows=lambda c: c.kwargs["BLOCK_M"],  # acc
        # The Q tile once; one K and one V tile per pipeline stage.
        shared_rows=lambda c: c.kwargs["BLOCK_M"] + 2 * c.num_stages * c.kwargs["BLOCK_N"],
    )


#: dK/dV on the tensor cores (fp16/bf16): fp32 values a thread may hold, counting the dK and dV
#: accumulators plus two BLOCK_M x BLOCK_N score tiles (Sᵀ/Pᵀ and dPᵀ/dSᵀ are live together),
#: before ptxas spills on sm_90. 8 warps: BLOCK_N 128, BLOCK_M 32, D 128 is 128 + 32 and fits;
#: BLOCK_M 64 (128 + 64) spills. 4 warps: BLOCK_N 64, D 128 with BLOCK_M 16 is 128 + 16 and
#: fits; BLOCK_M 32 (128 + 32) spills (docs/kernels/attention.md).
_DKDV_MAX_LIVE_PER_THREAD = {4: 144, 8: 160}
#: The same for fp32 inputs (IEEE FMA dots, no tensor cores): see ``prune_dkdv_configs``.
_DKDV_MAX_FMA_PER_THREAD = 80


def prune_dkdv_configs(configs, named_args, **kwargs):
    """attn_bwd_dkdv_kernel's configs that fit, by its own register count (two accumulators and
    two live score tiles), preferring those whose every warp owns distinct key rows."""
    args = {**named_args, **kwargs}
    head_dim_pad = args["HEAD_DIM_PAD"]
    tensor_cores = args["q_ptr"].element_size() < 4  # fp32 dots are IEEE FMAs (the host's)

    def registers_fit(c):
        threads = 32 * c.num_warps
        block_m, block_n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        if not tensor_cores:
            # FMA dots keep their operands in registers too: K and V beside dK and dV, and the
            # Q and dO tiles (fp32, D = 128: BLOCK 16 x 32 on 8 warps is 80 and fits; 32 x 32,
            # 96, spills; D = 64: 16 x 64 on 4 warps, 144, spills).
            return (4 * block_n + 2 * block_m) * head_dim_pad / threads <= _DKDV_MAX_FMA_PER_THREAD
        live = (2 * block_n * head_dim_pad + 2 * block_m * block_n) / threads
        return live <= _DKDV_MAX_LIVE_PER_THREAD.get(c.num_warps, 128)

    return _prune(
        configs,
        args["q_ptr"].element_size(),
        head_dim_pad,
        accumulator_rows=lambda c: 2 * c.kwargs["BLOCK_N"],  # dk and dv
        # K and V once; one Q and one dO tile per stage.
        shared_rows=lambda c: 2 * c.kwargs["BLOCK_N"] + 2 * c.num_stages * c.kwargs["BLOCK_M"],
        registers_fit=registers_fit,
        # Every warp owns 16 distinct key rows of the Sᵀ and dPᵀ wgmmas (see DKDV_CONFIGS).
        preferred=(lambda c: c.kwargs["BLOCK_N"] >= 16 * c.num_warps) if tensor_cores else None,
    )


def prune_dq_configs(configs, named_args, **kwargs):
    """attn_bwd_dq_kernel's configs that fit: one fp32 accumulator row per query row."""
    args = {**named_args, **kwargs}
    return _prune(
        configs,
        args["q_ptr"].element_size(),
        args["HEAD_DIM_PAD"],
        accumulator_rows=lambda c: c.kwargs["BLOCK_M"],  # dq
        # Q and dO once; one K and one V tile per stage.
        shared_rows=lambda c: 2 * c.kwargs["BLOCK_M"] + 2 * c.num_stages * c.kwargs["BLOCK_N"],
    )


#: The kernels' compile-time feature switches (``Features.consts``).
FEATURE_SWITCHES = ("KEY_MASK", "WINDOW", "SOFTCAP", "SINKS", "DROPOUT", "VARLEN")
#: Buckets, not lengths: every length in one power-of-two bucket reuses the tuned config. The dtype
#: is in the key implicitly (Triton's autotuner adds the dtypes of tensor arguments). Each feature
#: is a compile-time switch and part of the key: a feature's extra registers may favour another
#: tile, and the plain kernel keeps its own tuning.
TUNE_KEY = ["N_Q_BUCKET", "N_K_BUCKET", "HEAD_DIM", "CAUSAL", *FEATURE_SWITCHES]
#: Integer arguments equal to 1 would otherwise become compile-time constants: one more compile per
#: length of 1, and loop bounds that are Python ints where the kernels expect tensors.
NOT_SPECIALIZED = ["n_q", "n_k", "max_seqlen_q", "max_seqlen_k", "window", "N_Q_BUCKET",
                   "N_K_BUCKET"]
#: The dK/dV kernel lets Triton specialise n_q (a multiple of 16, or 1): its loop over query
#: tiles starts at a bound made from n_q, and unless n_q is known a multiple of 16 the loads the
#: pipeline issues a step ahead (the LSE and delta rows) are not known aligned and go 4 bytes at
#: a time, each with its own address and predicate. At the Llama shape (4 x 2048, 32/8 heads of
#: 64, Triton 3.6, H200) the kernel took 623 us with n_q unspecialised and 494 us with it
#: (docs/kernels/attention.md). A length of 1 compiles once more, and its bounds are then Python
#: ints, which this kernel's code takes.
DKDV_NOT_SPECIALIZED = [name for name in NOT_SPECIALIZED if name != "n_q"]
