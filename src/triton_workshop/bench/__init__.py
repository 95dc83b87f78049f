"""Benchmarks: ``workshop bench [NAME ...] [--quick] [--out DIR]``, on a CUDA GPU.

Every op family is measured the same way, with its peers (PyTorch eager, ``torch.compile``,
cuBLAS/cuDNN, Liger-Kernel when installed) and a ceiling (the copy bandwidth, or cuBLAS for matrix
products) in the same run. One file per job:

* :mod:`.spec`: what is measured (:class:`Workload`, :class:`Spec`, units, tolerances);
* :mod:`.measure`: correctness first, then the timing of every candidate (:func:`measure_case`);
* :mod:`.report`: rich tables, ``results.csv``, one PNG per spec, ``meta.json``;
* :mod:`.suite`: the suite (:data:`SPECS`, the names that pick specs);
* :mod:`.cli`: the command line and the run (:func:`run_suite`);
* :mod:`.results` and :mod:`.tables`: the results file and the README's and slides' tables made
  from it;
* :mod:`.models`: whole models (``workshop bench models``), measured by the same timer and
  written by the same writers; the model definitions the examples use (:mod:`.models.zoo`).

One spec module per family says what to measure, with the op it benchmarks imported from
``triton_workshop.ops``: :mod:`.elementwise`, :mod:`.image`, :mod:`.softmax`, :mod:`.layer_norm`,
:mod:`.matmul`, :mod:`.conv`, :mod:`.attention`.
``python -m triton_workshop.bench`` is the same command.
"""

from .cli import main, run_suite
from .measure import measure_case
from .spec import Spec, Workload
from .suite import SPEC_NAMES, SPECS, load_spec

__all__ = ["SPECS", "SPEC_NAMES", "Spec", "Workload", "load_spec", "main", "measure_case",
           "run_suite"]
