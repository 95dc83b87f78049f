"""Exercise 7 (making matmul fast): the tuning list, launched config by config.

The interpreter runs only the first config of an autotuned kernel (it cannot time the others), so
a config whose keys do not match the kernel's constexprs (GROUP_SIZE_M left out, BLOCK_SIZE_M for
BLOCK_M) passes every case there and fails on a GPU, where the autotuner launches each.
:func:`tuning_config_problems` launches every config of the learner's list once, with the raw
kernel, and names each one that fails to launch or computes a wrong product;
:func:`tuning_configs_verdict` makes that a verdict on the learner's module.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...runtime.parallel_compile import compile_in_parallel
from ..verdict import Verdict

__all__ = ["TUNING_CONFIGS_LABEL", "tuning_config_problems", "tuning_configs_verdict"]

TUNING_CONFIGS_LABEL = "every config of CONFIGS, launched once"


def _describe(index: int, config) -> str:
    meta = getattr(config, "kwargs", None)
    return f"CONFIGS[{index}] ({meta!r})" if meta is not None else f"CONFIGS[{index}] ({config!r})"


def tuning_config_problems(configs: Sequence, kernel, device, *, shape=(40, 24, 36)) -> list[str]:
    """One sentence per config of ``configs`` that fails when ``kernel`` (exercise 7's
    ``matmul_kernel``, not the autotuned one) is launched with it on a small float32 product; an
    empty list when every config launches and computes it."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(device)
    b = torch.randn(k, n, generator=gen).to(device)
    expected = (a.double() @ b.double()).float()
    launches = []  # (index, config, the launch's arguments, its keywords, the output)
    for index, config in enumerate(configs):
        meta = dict(getattr(config, "kwargs", None) or {})
        if not meta:
            continue  # not a triton.Config: the launcher names it (an unfinished TODO)
        options = {name: getattr(config, name) for name in ("num_warps", "num_stages")
                   if getattr(config, name, None) is not None}
        c = torch.full((m, n), float("nan"), device=device)
        args = (a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                c.stride(1))
        launches.append((index, config, args, dict(INPUT_PRECISION="ieee", **meta, **options), c))
    # On a GPU each config is a compile of its own, seconds each one after the other: all of
    # them at once first (a no-op in the interpreter).
    compile_in_parallel(kernel, [(args, dict(kwargs, grid=_grid(kwargs, m, n)))
                                 for _, _, args, kwargs, _ in launches])
    problems = []
    for index, config, args, kwargs, c in launches:
        try:
            kernel[_grid(kwargs, m, n)](*args, **kwargs)
        except Exception as exc:  # the learner's config: any error is the finding
            reason = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            problems.append(
                f"{_describe(index, config)} fails to launch ({type(exc).__name__}: {reason}): the "
                "interpreter runs only the first config, a GPU's autotuner launches every one. Each "
                "config's dict needs exactly the kernel's meta-parameters: BLOCK_M, BLOCK_N, "
                "BLOCK_K and GROUP_SIZE_M")
            continue
        if not torch.allclose(c.cpu(), expected.cpu(), rtol=1e-4, atol=1e-4):
            problems.append(f"{_describe(index, config)} launches but computes a wrong product")
    return problems


def _grid(meta: dict, m: int, n: int) -> tuple:
    """A 1-D grid of output tiles; a key missing here is named by the launch itself (32: any tile
    covers the grid)."""
    try:
        block_m, block_n = (int(meta.get(name, 32)) for name in ("BLOCK_M", "BLOCK_N"))
    except (TypeError, ValueError):
        block_m = block_n = 32
    return (-(-m // max(block_m, 1)) * -(-n // max(block_n, 1)),)


def tuning_configs_verdict(module, device) -> Verdict:
    """Every config of the module's ``CONFIGS`` launched once with its ``matmul_kernel``: the
    first that fails is named with the reason, the others counted."""
    configs, kernel = getattr(module, "CONFIGS", None), getattr(module, "matmul_kernel", None)
    if configs is None or kernel is None:
        return Verdict(False, "no CONFIGS list or no matmul_kernel in the file",
                       ["keep the template's names: CONFIGS = tuning_configs(), matmul_kernel"])
    problems = tuning_config_problems(configs, kernel, device)
    if not problems:
        return Verdict(True, "correct")
    more = f" (and {len(problems) - 1} more config(s) the same way)" if len(problems) > 1 else ""
    what = " fails to launch" if "fails to launch" in problems[0] else " computes a wrong product"
    return Verdict(False, problems[0].split(" (")[0] + what + more, problems[:1])
