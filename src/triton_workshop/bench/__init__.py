"""Benchmarks: ``workshop bench [NAME ...] [--quick] [--out DIR]``, on a CUDA GPU.

One runner (:mod:`.runner`) measures every op family the same way, with its peers (PyTorch eager,
``torch.compile``, cuBLAS/cuDNN, Liger-Kernel when installed) and a ceiling (the copy bandwidth,
or cuBLAS for matrix products) in the same run. One spec module per family says what to measure:
:mod:`.elementwise`, :mod:`.image`, :mod:`.softmax`, :mod:`.layer_norm`, :mod:`.matmul`,
:mod:`.conv`, :mod:`.attention`.
``python -m triton_workshop.bench`` is the same command.
"""

from .runner import SPEC_NAMES, Spec, Workload, load_spec, main

__all__ = ["SPEC_NAMES", "Spec", "Workload", "load_spec", "main"]
