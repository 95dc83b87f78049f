"""Whole models, a benchmark family of their own: ``workshop bench models``.

* :mod:`.zoo`: the model definitions (GPT-2, ResNet-18, a TransformerEncoder, LLaMA); the
  examples import them from here;
* :mod:`.workloads`: each model with its data, loss, optimiser and sizes, and the candidates;
* :mod:`.run`: one case (a model and a candidate) in a process of its own, timed a step at a time
  by the benchmark's timer (:func:`..measure.measure_steps`);
* :mod:`.report`: the rows, compared with torch, written by the benchmark's writers;
* :mod:`.interleave`: one model's candidates timed in turn in one process (``--interleave``);
* :mod:`.cli`: the command line and the run.
"""

from ..measure import CudaTimer, Measurement, Steps, WallTimer
from ..measure import measure_steps as measure
from .cli import list_models, main, run_models
from .interleave import interleavable, run_interleaved
from .report import (CSV_COLUMNS, ModelResult, compare, result_of, table, verdicts, write_csv,
                     write_plot, write_reports)
from .run import Case, NotApplicable, make_step, prepare, run_case, run_inline, run_isolated
from .workloads import (CANDIDATES, LIGER, LIGER_COMPILED, OURS, OURS_COMPILED, SIZE_NAMES, STEPS,
                        TORCH_COMPILE, TORCH_EAGER, WORKLOADS, ModelWorkload)
from .zoo import (GPT, BasicBlock, Block, GPTConfig, ResNet, gpt2_hf, llama, resnet18,
                  transformer_encoder)

#: The name this package's workload class had: a model workload (``bench.spec.Workload`` is an
#: op's).
Workload = ModelWorkload

__all__ = [
    "BasicBlock", "Block", "CANDIDATES", "CSV_COLUMNS", "Case", "CudaTimer", "GPT", "GPTConfig",
    "LIGER", "LIGER_COMPILED", "Measurement", "ModelResult", "ModelWorkload", "NotApplicable",
    "OURS", "OURS_COMPILED", "ResNet", "SIZE_NAMES", "STEPS", "Steps", "TORCH_COMPILE",
    "TORCH_EAGER", "WORKLOADS", "WallTimer", "Workload", "compare", "gpt2_hf", "interleavable",
    "list_models", "llama",
    "main", "make_step", "measure", "prepare", "resnet18", "result_of", "run_case", "run_inline",
    "run_interleaved", "run_isolated", "run_models", "table", "transformer_encoder", "verdicts", "write_csv",
    "write_plot", "write_reports",
]
