"""The matmul family's tuning object: the launch decisions that are not the autotuner's (the
aligned copies, Hopper's TMA kernel and its config, the copy and dropout kernels' tiles).

One frozen :class:`MatmulTuning`, :data:`TUNING`, read at each call by the modules that launch
and part of their plans' keys. The package re-exports it, and setting ``matmul.TUNING`` there (a
test's ``monkeypatch.setattr``) replaces it in every module of the family that reads it.
"""

from __future__ import annotations

import dataclasses

from ... import runtime


@dataclasses.dataclass(frozen=True)
class MatmulTuning:
    """The matmul family's launch decisions that are not the autotuner's. Read at each call from
    :data:`TUNING`; a test replaces the whole object
    (``monkeypatch.setattr(matmul, "TUNING", dataclasses.replace(matmul.TUNING, ...))``)."""

    #: Copy operands whose strides Triton cannot prove 16-byte aligned into rows padded to 16
    #: elements before the product (:func:`aligned`): unaligned, the main loop falls to 2-byte
    #: loads without its software pipeline. Off in the interpreter, which then reads them in
    #: place, so that path stays tested on the CPU.
    align_operands: bool = not runtime.INTERPRET
    #: Whether 2-D fp16/bf16 products run through :func:`matmul_tma_kernel`: None picks it on
    #: Hopper GPUs (compute capability 9.x, where it was measured) for products of at least a wave
    #: of tiles and at least ``tma_min_volume``; True always (tests force it in the interpreter),
    #: False never.
    tma_matmul: bool | None = None
    #: With ``tma_matmul=None``, the smallest product (M*N*K) that takes the TMA kernel. Its
    #: descriptors cost about as much host time again as the rest of a call (built and encoded
    #: for each call's tensors, docs/results.md, the 2026-11-25 run at 1b36eaa), which only a product running
    #: longer than that can earn back; below, matmul_kernel (a model's many mid-size products,
    #: where the host's time per call is what limits an eager step).
    tma_min_volume: int = 2**34
    #: matmul_tma_kernel's config (not autotuned: a persistent grid is the SM count whatever the
    #: config, and this one won or tied at every shape measured; docs/kernels/matmul.md).
    #: 128x256x64 tiles, 3 stages: three stages of operands plus the output tile staged for its
    #: TMA store fit Hopper's 227 KB of shared memory; 4 stages do not.
    tma_block_m: int = 128
    tma_block_n: int = 256
    tma_block_k: int = 64
    #: Tile-rows walked together (grouped ordering: panels shared in L2).
    tma_group_m: int = 8
    tma_num_stages: int = 3
    tma_num_warps: int = 8
    #: Pipeline the tile loop and the K loop as one (the next tile's loads fly during the
    #: epilogue of this one).
    tma_flatten: bool = True
    tma_warp_specialize: bool = False
    #: 32-bit offsets inside an output tile wherever they cannot overflow (fewer registers, see
    #: matmul_kernel's store); False forces 64-bit ones, the path rows of >= 8M elements take.
    int32_tile_offsets: bool = True
    #: pad_copy_kernel's tile and warps: a copy, so a fixed tile rather than autotuning; its
    #: column blocks are whole 16-byte vectors of the padded rows in any dtype.
    pad_block_rows: int = 32
    pad_block_cols: int = 128
    pad_num_warps: int = 4
    #: dropout_scale_kernel's tile and warps (the backward of the epilogue's dropout): an
    #: elementwise pass, so a fixed tile, as the padded copy's.
    dropout_block_rows: int = 32
    dropout_block_cols: int = 128
    dropout_num_warps: int = 4

    def tma_config(self) -> dict:
        """matmul_tma_kernel's config as launch keywords (``BLOCK_M`` ..., ``num_stages``)."""
        return {"BLOCK_M": self.tma_block_m, "BLOCK_N": self.tma_block_n,
                "BLOCK_K": self.tma_block_k, "GROUP_M": self.tma_group_m,
                "num_stages": self.tma_num_stages, "num_warps": self.tma_num_warps,
                "FLATTEN": self.tma_flatten, "WARP_SPECIALIZE": self.tma_warp_specialize}


TUNING = MatmulTuning()
