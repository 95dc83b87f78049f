"""Exercises 6-8: they live in :mod:`.exercises.part_two`; this module keeps the old import path."""

from .exercises.part_two import (
    PART_TWO, StretchTask, is_stretch, layer_norm_reference, layer_norm_statistics_reference,
    layer_norm_grads_reference, grouped_tile_order, row_major_tile_order, tile_visit_counts,
    every_tile_once, attention_reference, online_softmax_attention, LAYER_NORM_BLOCK_ROWS,
    LAYER_NORM_MAX_COLS, ATTENTION_BLOCK_M, ATTENTION_BLOCK_N, ATTENTION_HEAD_DIM_MAX,
    MATMUL_FIRST_BLOCK, MATMUL_FIRST_GROUP,
)

__all__ = [
    "PART_TWO", "StretchTask", "is_stretch", "layer_norm_reference",
    "layer_norm_statistics_reference", "layer_norm_grads_reference", "grouped_tile_order",
    "row_major_tile_order", "tile_visit_counts", "every_tile_once", "attention_reference",
    "online_softmax_attention", "LAYER_NORM_BLOCK_ROWS", "LAYER_NORM_MAX_COLS",
    "ATTENTION_BLOCK_M", "ATTENTION_BLOCK_N", "ATTENTION_HEAD_DIM_MAX", "MATMUL_FIRST_BLOCK",
    "MATMUL_FIRST_GROUP",
]
