"""NVIDIA compute-sanitizer over one small case of every kernel of the library.

    PYTHONPATH=src python scripts/sanitize.py                  # memcheck, racecheck, initcheck
    PYTHONPATH=src python scripts/sanitize.py --tools memcheck,synccheck --cases matmul,attention
    python scripts/sanitize.py --list                          # the cases and their kernels

Each case runs one public op (or a few) forward and backward at a small shape chosen to take one
path of its kernels: every kernel of ``triton_workshop.ops`` is in at least one case (the
single-block and chunked layer_norm and softmax kernels, matmul with its epilogues and its TMA
kernel on Hopper, conv2d in both layouts, the layout transposes, attention forward and backward,
...). First a plain pass (no sanitizer) records which kernels each case launched and checks them
against the case's list; then, per tool, the cases run in one process under

    compute-sanitizer --tool TOOL --error-exitcode 1 python scripts/sanitize.py --run CASE,...

which prints a marker before and after each case, so that each report of the sanitizer is put
down to the case that ran it. A case that breaks the CUDA context ends its process; the cases
after it run in a new one. The full output of each pass goes to ``--out`` (``$OUT/sanitize`` when
``OUT`` is set, else ``bench-results/sanitize/``): ``coverage.log``, ``<tool>.log``, ``summary.json``.

Printed at the end: a table case x tool -> errors. Exit status: 0 when every tool reported zero
errors and every case ran and launched its kernels; 1 otherwise; 2 where there is no CUDA GPU,
no compute-sanitizer, or the sanitizer cannot use the device.

The children run with ``TRITON_WORKSHOP_AUTOTUNE=0`` (one config per kernel: a compile each) and
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` under a sanitizer (each tensor its own allocation, so a read
past a tensor's end is past an allocation's end, and memory is uninitialised until written).
Backward passes ask only for the gradients the library computes itself (conv2d's weight
gradient is cuDNN's: not asked for), so that the reports are about this library's kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOOLS = ("memcheck", "racecheck", "initcheck")
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
#: Options per tool besides ``--tool`` and ``--error-exitcode``.
TOOL_OPTIONS = {
    "memcheck": ["--leak-check", "no"],
    "racecheck": [],
    "initcheck": [],
    "synccheck": [],
}
MARKER = "@@sanitize"
#: Set in a child's environment when it runs under compute-sanitizer.
_UNDER_SANITIZER = "TRITON_WORKSHOP_UNDER_SANITIZER"
SETTLE_SECONDS = 0.25
#: Exit status of a child whose case broke the CUDA context (the next cases need a new process).
CONTEXT_LOST = 3


# --------------------------------------------------------------------------------------------
# The cases.
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    ops: tuple[str, ...]       # public functions it calls
    kernels: tuple[str, ...]   # kernels it launches, on a GPU and in the interpreter
    run: Callable[[str], None]
    #: Kernels it may also launch, depending on the platform: a GPU copies unaligned operands
    #: (pad_copy_kernel) and NCHW inputs (transpose_kernel) first; the interpreter multiplies
    #: what a GPU would have aligned for the TMA kernel with matmul_kernel.
    incidental: tuple[str, ...] = ()
    needs_hopper: bool = False


def _randn(*shape, dtype=None, device="cuda", grad=False, low=None):
    import torch

    t = torch.randn(*shape, device=device, dtype=torch.float32)
    if low is not None:  # positive inputs (a square root's argument)
        t = t.abs() + low
    t = t.to(dtype or torch.float32)
    return t.requires_grad_() if grad else t


def _backward(out) -> None:
    import torch

    out.backward(torch.randn_like(out))


def _module_int(module, name: str, default: int) -> int:
    """A path threshold of an op module (the case follows it if it moves)."""
    value = getattr(module, name, default)
    return value if isinstance(value, int) else default


def case_add(device):
    import torch
    import triton_workshop as tw

    x, y = (_randn(5003, dtype=torch.float16, device=device, grad=True) for _ in range(2))
    _backward(tw.add(x, y))  # two blocks, the second ragged


def case_fused_mul_add_sqrt(device):
    import triton_workshop as tw

    a, b, c = (_randn(4099, device=device, grad=True, low=0.1) for _ in range(3))
    _backward(tw.fused_mul_add_sqrt(a, b, c))


def case_colour(device):
    import torch
    import triton_workshop as tw

    img = torch.rand(3, 37, 45, device=device)
    tw.greyscale(img)
    tw.sepia(img)
    pixels = torch.randint(0, 256, (2, 3, 17, 19), dtype=torch.uint8, device=device)
    tw.greyscale(pixels)
    tw.sepia(pixels)
    strided = torch.rand(3, 20, 40, device=device)[..., ::2]  # planes not contiguous
    tw.greyscale(strided)
    tw.sepia(strided)


def case_filter2d(device):
    import torch
    import triton_workshop as tw

    img = torch.rand(3, 23, 29, device=device)
    for size, padding in ((3, "same"), (5, "valid"), (7, "same")):
        tw.filter2d(img, torch.randn(size, size, device=device), padding)
    # 3x3 to 7x7 keep their taps in registers; 9x9 (81 taps) reads them from memory.
    tw.filter2d(img[:1, :12, :13], torch.randn(9, 9, device=device))
    tw.filter2d(torch.rand(2, 3, 21, 18, device=device, dtype=torch.float16),
                torch.randn(3, 3, device=device, dtype=torch.float16))


def case_softmax(device):
    import torch
    import triton_workshop as tw

    _backward(tw.softmax(_randn(37, 300, dtype=torch.float16, device=device, grad=True)))
    _backward(tw.softmax(_randn(4, 50, 6, device=device, grad=True), dim=1))  # an inner dim


def case_softmax_online(device):
    import triton_workshop as tw
    from triton_workshop.ops import softmax as sm

    cols = max(_module_int(sm, "SINGLE_BLOCK_MAX_COLS", 32768),
               _module_int(sm, "BACKWARD_SINGLE_BLOCK_MAX_COLS", 65536)) + 97
    _backward(tw.softmax(_randn(2, cols, device=device, grad=True)))


def case_layer_norm(device):
    import torch
    import triton_workshop as tw

    x = _randn(37, 300, dtype=torch.float16, device=device, grad=True)
    w = _randn(300, dtype=torch.float16, device=device, grad=True)
    b = _randn(300, dtype=torch.float16, device=device, grad=True)
    _backward(tw.layer_norm(x, (300,), w, b))
    _backward(tw.layer_norm(_randn(5, 1000, device=device, grad=True), (1000,)))  # no affine
    x3 = _randn(3, 7, 64, dtype=torch.bfloat16, device=device, grad=True)
    w3 = _randn(7, 64, dtype=torch.bfloat16, device=device, grad=True)
    _backward(tw.layer_norm(x3, (7, 64), w3, None))


def case_layer_norm_chunked(device):
    import triton_workshop as tw
    from triton_workshop.ops import layer_norm as ln

    # Past the one-block backward, within a row-at-once dx: chunked forward, dx by rows,
    # dweight/dbias partials by column chunks, then their sum.
    cols = _module_int(ln, "BACKWARD_SINGLE_BLOCK_MAX_COLS", 8192) + 808
    x = _randn(6, cols, device=device, grad=True)
    w, b = _randn(cols, device=device, grad=True), _randn(cols, device=device, grad=True)
    _backward(tw.layer_norm(x, (cols,), w, b))


def case_layer_norm_wide(device):
    import torch
    import triton_workshop as tw
    from triton_workshop.ops import layer_norm as ln

    cols = _module_int(ln, "BACKWARD_DX_SINGLE_BLOCK_MAX_COLS", 16384) + 1234
    x = _randn(3, cols, dtype=torch.float16, device=device, grad=True)
    w = _randn(cols, dtype=torch.float16, device=device, grad=True)
    b = _randn(cols, dtype=torch.float16, device=device, grad=True)
    _backward(tw.layer_norm(x, (cols,), w, b))


def case_matmul(device):
    import torch
    import triton_workshop as tw

    half = dict(dtype=torch.float16, device=device, grad=True)
    a, b, bias = _randn(37, 53, **half), _randn(53, 29, **half), _randn(29, **half)
    _backward(tw.matmul(a, b, bias=bias, activation="relu"))  # ragged: aligned copies first
    _backward(tw.matmul(a, b, activation="gelu"))
    _backward(tw.matmul(a, b, bias=bias, activation="leaky_relu", leaky_relu_slope=-0.1))
    batched = _randn(3, 20, 24, device=device, grad=True)  # fp32, a batch against one matrix
    _backward(tw.matmul(batched, _randn(24, 18, device=device, grad=True)))
    x = _randn(2, 8, 64, dtype=torch.bfloat16, device=device, grad=True)
    w = _randn(48, 64, dtype=torch.bfloat16, device=device, grad=True)
    _backward(tw.linear(x, w, _randn(48, dtype=torch.bfloat16, device=device, grad=True)))


def case_matmul_tma(device):
    import torch
    import triton_workshop as tw
    from triton_workshop.ops import matmul as mm

    saved = mm.TUNING
    # Small products too (by default only a full wave of tiles).
    mm.TUNING = dataclasses.replace(saved, tma_matmul=True)
    try:
        half = dict(dtype=torch.float16, device=device, grad=True)
        a, b = _randn(256, 192, **half), _randn(192, 320, **half)
        _backward(tw.matmul(a, b, bias=_randn(320, **half), activation="gelu"))  # a TMA store
        w = _randn(321, 192, **half)  # K-major B; 321 columns: the output's rows are not
        _backward(tw.linear(a, w))     # 16-byte multiples, stored without TMA
    finally:
        mm.TUNING = saved


def case_conv2d_nchw(device):
    import torch
    import triton_workshop as tw

    x = _randn(2, 8, 11, 13, dtype=torch.float16, device=device, grad=True)
    w = _randn(16, 8, 3, 3, dtype=torch.float16, device=device)
    _backward(tw.conv2d(x, w, _randn(16, dtype=torch.float16, device=device), padding=1))
    x = _randn(2, 64, 9, 9, dtype=torch.float16, device=device, grad=True)  # channel tiles
    w = _randn(32, 64, 3, 3, dtype=torch.float16, device=device)
    _backward(tw.conv2d(x, w, padding="same"))
    tw.conv2d(_randn(1, 3, 17, 15, device=device), _randn(4, 3, 5, 5, device=device), stride=2)


def case_conv2d_channels_last(device):
    import torch
    import triton_workshop as tw

    cl = torch.channels_last
    x = _randn(2, 64, 10, 12, dtype=torch.float16, device=device).to(memory_format=cl)
    w = _randn(48, 32, 3, 3, dtype=torch.float16, device=device)
    tw.conv2d(x, w, _randn(48, dtype=torch.float16, device=device), stride=2, dilation=2,
              groups=2)
    x = _randn(2, 32, 9, 7, dtype=torch.float16, device=device).to(memory_format=cl)
    x.requires_grad_()
    w = _randn(24, 32, 3, 3, dtype=torch.float16, device=device).to(memory_format=cl)
    _backward(tw.conv2d(x, w, padding=1))


def case_conv2d_depthwise(device):
    import torch
    import triton_workshop as tw

    for memory_format in (torch.contiguous_format, torch.channels_last):
        x = _randn(2, 16, 10, 12, dtype=torch.float16, device=device)
        x = x.to(memory_format=memory_format).requires_grad_()
        w = _randn(16, 1, 3, 3, dtype=torch.float16, device=device)
        _backward(tw.conv2d(x, w, _randn(16, dtype=torch.float16, device=device), padding=1,
                            groups=16))


def case_layout(device):
    import torch
    from triton_workshop.ops import layout

    _backward(layout.transpose_copy(_randn(70, 130, dtype=torch.float16, device=device, grad=True)))
    layout.transpose_copy(_randn(3, 40, 100, device=device)[:, ::2, 1:])  # strided, offset
    layout.to_channels_last(_randn(2, 5, 9, 11, device=device))


def case_layer_norm_linear(device):
    import torch
    import triton_workshop as tw

    half = dict(dtype=torch.float16, device=device, grad=True)
    x = _randn(3, 17, 96, **half)
    _backward(tw.layer_norm_linear(x, _randn(96, **half), _randn(96, **half),
                                   _randn(80, 96, **half), _randn(80, **half)))


def case_attention(device):
    import torch
    import triton_workshop as tw

    half = dict(dtype=torch.float16, device=device, grad=True)
    q = _randn(2, 4, 37, 64, **half)
    k, v = _randn(2, 2, 53, 64, **half), _randn(2, 2, 53, 64, **half)  # grouped-query
    _backward(tw.attention(q, k, v))


def case_attention_causal(device):
    import torch
    import triton_workshop as tw

    for dtype, head_dim in ((torch.float16, 40), (torch.bfloat16, 16)):  # 40: padded to 64
        q, k, v = (_randn(1, 3, 45, head_dim, dtype=dtype, device=device, grad=True)
                   for _ in range(3))
        _backward(tw.attention(q, k, v, causal=True))


def case_rms_norm(device):
    import torch
    import triton_workshop as tw

    half = dict(dtype=torch.float16, device=device, grad=True)
    x, w = _randn(37, 300, **half), _randn(300, **half)
    _backward(tw.rms_norm(x, (300,), w))
    normed, summed = tw.add_rms_norm(_randn(37, 300, **half), _randn(37, 300, **half), (300,), w)
    (normed.float().sum() + summed.float().sum()).backward()


def case_rms_norm_chunked(device):
    import triton_workshop as tw
    from triton_workshop.ops import rms_norm as rn

    # Past every one-block path: the chunked forward, dx and dweight partials by chunks.
    cols = max(_module_int(rn.TUNING, "backward_dx_single_block_max_cols", 16384),
               _module_int(rn.TUNING, "single_block_max_cols", 4096)) + 1234
    x, w = _randn(3, cols, device=device, grad=True), _randn(cols, device=device, grad=True)
    _backward(tw.rms_norm(x, (cols,), w))


def case_rope(device):
    import torch
    import triton_workshop as tw

    half = dict(dtype=torch.float16, device=device, grad=True)
    q, k = _randn(2, 4, 37, 64, **half), _randn(2, 2, 37, 64, **half)  # grouped-query
    cos, sin = _randn(2, 37, 64, device=device), _randn(2, 37, 64, device=device)
    q_rot, k_rot = tw.rope(q, k, cos.half(), sin.half())
    (q_rot.float().sum() + k_rot.float().sum()).backward()


def case_glu(device):
    import torch
    import triton_workshop as tw

    half = dict(dtype=torch.float16, device=device, grad=True)
    _backward(tw.swiglu(_randn(5003, **half), _randn(5003, **half)))
    _backward(tw.geglu(_randn(3, 1001, **half), _randn(3, 1001, **half)))
    from triton_workshop.ops.glu import glu_halves  # one gradient for both halves

    _backward(glu_halves(_randn(7, 2 * 301, **half)))


def case_cross_entropy(device):
    import torch
    import triton_workshop as tw

    logits = _randn(37, 1000, dtype=torch.float16, device=device, grad=True)
    target = torch.randint(0, 1000, (37,), device=device)
    target[::5] = -100  # ignored rows
    tw.cross_entropy(logits, target).backward()
    tw.cross_entropy(logits, target).backward()  # a kept signature: the loss reduced by a kernel
    x = _randn(37, 64, dtype=torch.float16, device=device, grad=True)
    weight = _randn(1000, 64, dtype=torch.float16, device=device, grad=True)
    tw.linear_cross_entropy(x, weight, target).backward()
    # A logits budget below one row chunk: the vocabulary in blocks (two here, 512 wide).
    from triton_workshop.ops import cross_entropy as ce

    saved = ce.TUNING
    ce.TUNING = dataclasses.replace(saved, logits_chunk_bytes=20 * 1000 * 2)
    try:
        x.grad = weight.grad = None
        tw.linear_cross_entropy(x, weight, target).backward()
    finally:
        ce.TUNING = saved


def case_dropout(device):
    import torch
    import triton_workshop as tw
    from triton_workshop.ops import attention as attention_ops

    half = dict(dtype=torch.float16, device=device, grad=True)
    q, k, v = (_randn(1, 2, 37, 32, **half) for _ in range(3))
    _backward(tw.attention(q, k, v, dropout_p=0.1))
    _backward(tw.linear(_randn(37, 64, **half), _randn(48, 64, **half), None, "gelu",
                        dropout_p=0.1))
    attention_ops.dropout_keep_mask(attention_ops.dropout_seed(torch.device(device)),
                                    (1, 2, 37, 37), 0.1)


_LN_BWD = ("layer_norm_bwd_kernel", "layer_norm_bwd_sum_partials_kernel")
CASES = (
    Case("add", ("add",), ("add_kernel",), case_add),
    Case("fused_mul_add_sqrt", ("fused_mul_add_sqrt",), ("mul_add_sqrt_kernel",),
         case_fused_mul_add_sqrt),
    Case("colour", ("greyscale", "sepia"), ("greyscale_kernel", "sepia_kernel"), case_colour),
    Case("filter2d", ("filter2d",), ("filter2d_kernel",), case_filter2d),
    Case("softmax", ("softmax",), ("softmax_fwd_kernel", "softmax_bwd_kernel"), case_softmax),
    Case("softmax_online", ("softmax",),
         ("softmax_fwd_online_kernel", "softmax_bwd_online_kernel"), case_softmax_online),
    Case("layer_norm", ("layer_norm",), ("layer_norm_fwd_kernel", *_LN_BWD), case_layer_norm),
    Case("layer_norm_chunked", ("layer_norm",),
         ("layer_norm_fwd_chunked_kernel", "layer_norm_bwd_dwdb_chunked_kernel", *_LN_BWD),
         case_layer_norm_chunked),
    Case("layer_norm_wide", ("layer_norm",),
         ("layer_norm_fwd_chunked_kernel", "layer_norm_bwd_dx_chunked_kernel",
          "layer_norm_bwd_dwdb_chunked_kernel", "layer_norm_bwd_sum_partials_kernel"),
         case_layer_norm_wide),
    Case("matmul", ("matmul", "linear"), ("matmul_kernel",), case_matmul,
         incidental=("pad_copy_kernel",)),
    Case("matmul_tma", ("matmul", "linear"), ("matmul_tma_kernel",), case_matmul_tma,
         incidental=("pad_copy_kernel", "matmul_kernel"), needs_hopper=True),
    Case("conv2d_nchw", ("conv2d",), ("conv2d_implicit_gemm_kernel",), case_conv2d_nchw,
         incidental=("transpose_kernel",)),  # the GPU reads NCHW through a channels-last copy
    Case("conv2d_channels_last", ("conv2d",), ("conv2d_implicit_gemm_kernel",),
         case_conv2d_channels_last, incidental=("transpose_kernel",)),
    Case("conv2d_depthwise", ("conv2d",), ("conv2d_depthwise_kernel",), case_conv2d_depthwise),
    Case("layout", ("transpose_copy", "to_channels_last"), ("transpose_kernel",), case_layout),
    Case("layer_norm_linear", ("layer_norm_linear",),
         ("layer_norm_fwd_kernel", "matmul_kernel", *_LN_BWD), case_layer_norm_linear,
         incidental=("pad_copy_kernel",)),
    Case("attention", ("attention",),
         ("attn_fwd_kernel", "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel",
          "attn_bwd_dq_kernel"), case_attention),
    Case("attention_causal", ("attention",),
         ("attn_fwd_kernel", "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel",
          "attn_bwd_dq_kernel"), case_attention_causal),
    Case("rms_norm", ("rms_norm", "add_rms_norm"),
         ("rms_norm_fwd_kernel", "rms_norm_bwd_kernel", "layer_norm_bwd_sum_partials_kernel"),
         case_rms_norm),
    Case("rms_norm_chunked", ("rms_norm",),
         ("rms_norm_fwd_chunked_kernel", "rms_norm_bwd_dx_chunked_kernel",
          "rms_norm_bwd_dw_chunked_kernel"), case_rms_norm_chunked,
         incidental=("rms_norm_bwd_kernel", "layer_norm_bwd_sum_partials_kernel")),
    Case("rope", ("rope",), ("rope_kernel",), case_rope),
    Case("glu", ("swiglu", "geglu"), ("glu_fwd_kernel", "glu_bwd_kernel"), case_glu),
    Case("cross_entropy", ("cross_entropy", "linear_cross_entropy"),
         ("cross_entropy_fwd_kernel", "cross_entropy_bwd_kernel", "cross_entropy_reduce_kernel",
          "linear_ce_block_fwd_kernel",
          "linear_ce_block_grad_kernel"), case_cross_entropy),
    Case("dropout", ("attention", "linear"),
         ("attn_fwd_kernel", "attn_bwd_preprocess_kernel", "attn_bwd_dkdv_kernel",
          "attn_bwd_dq_kernel", "matmul_kernel", "dropout_scale_kernel",
          "attn_dropout_keep_kernel"), case_dropout, incidental=("pad_copy_kernel",)),
)
CASES_BY_NAME = {c.name: c for c in CASES}


def library_kernels() -> dict:
    """Every kernel the library launches: ``{name: kernel}`` for the ``*_kernel`` objects of
    ``triton_workshop.ops`` and its subpackages' modules, wherever an op keeps them (the
    ``_``-prefixed ones are device functions they call)."""
    import importlib
    import pkgutil

    import triton
    import triton_workshop.ops as ops

    kernels = {}
    for info in pkgutil.walk_packages(ops.__path__, prefix="triton_workshop.ops."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, triton.runtime.jit.KernelInterface) and name.endswith("_kernel"):
                kernels[name] = value
    return kernels


def _launch_recorder_target(kernel):
    """The object whose ``pre_run_hooks`` Triton calls at each launch of ``kernel`` (the
    JITFunction, or the interpreter's function, under any autotuner)."""
    while not hasattr(kernel, "pre_run_hooks"):
        kernel = kernel.fn
    return kernel


@contextlib.contextmanager
def recording_launches(launched: set):
    """Add each library kernel's name to ``launched`` when it launches (a pre-run hook: the GPU
    path and the interpreter both call those; on a GPU it sends launches through Triton's own
    path, which is why the sanitized passes run without it)."""
    hooks = []
    for name, kernel in library_kernels().items():
        target = _launch_recorder_target(kernel)

        def hook(*args, _name=name, **kwargs):
            launched.add(_name)

        target.pre_run_hooks.append(hook)
        hooks.append((target, hook))
    try:
        yield launched
    finally:
        for target, hook in hooks:
            target.pre_run_hooks.remove(hook)


# --------------------------------------------------------------------------------------------
# The child: run cases in this process, with a marker before and after each.
# --------------------------------------------------------------------------------------------
def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _context_lost(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(s in text for s in ("cuda error", "illegal", "unspecified launch failure",
                                   "device-side assert", "an illegal memory access",
                                   "misaligned address", "launch failed"))


def run_cases(names: list[str], record: bool) -> int:
    """Run the named cases on the GPU; with ``record``, print the kernels each launched."""
    import torch

    import triton_workshop  # noqa: F401  (decides the mode before anything is decorated)

    torch.manual_seed(0)
    device = "cuda"
    for name in names:
        case = CASES_BY_NAME[name]
        _say(f"{MARKER} begin {name}")
        if case.needs_hopper and torch.cuda.get_device_capability()[0] != 9:
            _say(f"{MARKER} end {name} skipped: needs a Hopper GPU (sm_90)")
            continue
        launched: set = set()
        try:
            with recording_launches(launched) if record else contextlib.nullcontext():
                case.run(device)
                torch.cuda.synchronize()
            # The sanitizer's own process prints the reports of what just ran: let it, before
            # the end marker, so that they land inside this case's lines.
            time.sleep(SETTLE_SECONDS if os.environ.get(_UNDER_SANITIZER) else 0)
        except Exception as exc:  # noqa: BLE001 - reported, and the next case runs
            time.sleep(SETTLE_SECONDS if os.environ.get(_UNDER_SANITIZER) else 0)
            _say(traceback.format_exc().rstrip())
            first_line = (str(exc).splitlines() or [""])[0]
            _say(f"{MARKER} end {name} failed: {type(exc).__name__}: {first_line}")
            if _context_lost(exc):
                return CONTEXT_LOST
            continue
        if record:
            _say(f"{MARKER} kernels {name} {','.join(sorted(launched))}")
        _say(f"{MARKER} end {name} ok")
    return 0


# --------------------------------------------------------------------------------------------
# Reading the sanitizer's output.
# --------------------------------------------------------------------------------------------
_PREFIX = "========= "
#: Sanitizer lines that start no report: banners, summaries, parts of a report's backtrace.
_NOT_A_REPORT = re.compile(
    r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|"
    r"Target application returned an error|Saved host backtrace|Host Frame|Device Frame|"
    r"This application|No (?:errors|hazards))")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACECHECK_SUMMARY = re.compile(
    r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
#: The sanitizer's own words when it cannot check this device or process (on gVisor machines:
#: "Device not supported").
_SANITIZER_REFUSED = re.compile(
    r"^=+ (?:Error: )?((?:Device not supported|No attachable process|Unable to find injection "
    r"library|Target application terminated before first instrumented API call|"
    r"Failed to initialize)[^\n]*)", re.M)


@dataclasses.dataclass
class Report:
    """One report of the sanitizer: its first line and the lines after it."""
    kind: str  # "error", "warning" or "api" (a CUDA API call that failed)
    headline: str
    lines: list = dataclasses.field(default_factory=list)

    def kernel(self, names) -> str | None:
        """Which of the library's kernels it is about (None: another's, torch's or cuDNN's)."""
        text = "\n".join([self.headline, *self.lines])
        return next((n for n in names if re.search(rf"\b{re.escape(n)}\b", text)), None)


def parse_summary(text: str) -> dict:
    """The sanitizer's closing counts: ``{"errors": N, "warnings": W}`` from its
    ``ERROR SUMMARY: N errors`` line (racecheck: ``RACECHECK SUMMARY: H hazards displayed
    (E errors, W warnings)``), the last of each in ``text``; None where there is none (the
    sanitizer did not finish)."""
    errors = warnings = None
    for match in _ERROR_SUMMARY.finditer(text):
        errors = int(match.group(1))
    for match in _RACECHECK_SUMMARY.finditer(text):
        race_errors, warnings = int(match.group(2)), int(match.group(3))
        errors = race_errors if errors is None else max(errors, race_errors)
    return {"errors": errors, "warnings": warnings}


def reports_in(lines: list[str]) -> list[Report]:
    """The sanitizer's reports among ``lines`` (other output is ignored)."""
    reports: list[Report] = []
    current = None
    for line in lines:
        if not line.startswith(_PREFIX.rstrip()):
            continue
        body = line[len(_PREFIX):] if line.startswith(_PREFIX) else ""
        if not body.strip():
            current = None  # the empty line that closes a report
            continue
        if body[0].isspace() or _NOT_A_REPORT.match(body):
            if current is not None:
                current.lines.append(body.strip())
            continue
        if body.startswith("Program hit"):
            kind = "api"
        elif body.startswith("Warning"):
            kind = "warning"
        else:
            kind = "error"
        current = Report(kind, body.strip())
        reports.append(current)
    return reports


@dataclasses.dataclass
class CaseResult:
    status: str = "not run"  # ok, failed, skipped, crashed, not run
    detail: str = ""
    reports: list = dataclasses.field(default_factory=list)
    kernels: tuple | None = None  # launched (coverage pass)

    def count(self, kind: str = "error") -> int:
        return sum(r.kind == kind for r in self.reports)


def split_by_case(text: str, names: list[str]) -> tuple[dict, list]:
    """``({case: CaseResult}, reports outside every case)`` from one child's output."""
    results = {n: CaseResult() for n in names}
    outside: list[str] = []
    current = None
    chunk: list[str] = []
    for line in text.splitlines():
        if line.startswith(MARKER + " "):
            words = line.split(" ", 3)
            what, name = words[1], words[2]
            rest = words[3] if len(words) > 3 else ""
            if what == "begin" and name in results:
                outside += chunk
                current, chunk = name, []
                results[name].status = "crashed"  # until its end marker says otherwise
            elif what == "kernels" and name in results:
                results[name].kernels = tuple(k for k in rest.split(",") if k)
            elif what == "end" and name == current:
                status, _, detail = rest.partition(":")
                results[name].status = status.strip()
                results[name].detail = detail.strip()
                results[name].reports = reports_in(chunk)
                current, chunk = None, []
            continue
        chunk.append(line)
    if current is not None:  # the process ended inside a case
        results[current].reports = reports_in(chunk)
        results[current].detail = "the process ended during this case"
    else:
        outside += chunk
    return results, reports_in(outside)


# --------------------------------------------------------------------------------------------
# The parent: a plain pass that records the kernels, then one pass per tool.
# --------------------------------------------------------------------------------------------
def find_sanitizer(explicit: str | None = None) -> str | None:
    """compute-sanitizer: ``--sanitizer``, ``$COMPUTE_SANITIZER``, the PATH, the CUDA toolkit."""
    candidates = [explicit, os.environ.get("COMPUTE_SANITIZER"), shutil.which("compute-sanitizer")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "bin", "compute-sanitizer"))
            candidates.append(os.path.join(home, "compute-sanitizer", "compute-sanitizer"))
    candidates += sorted(str(p) for p in Path("/usr/local").glob("cuda-*/bin/compute-sanitizer"))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _child_env(sanitized: bool) -> dict:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(TRITON_WORKSHOP_AUTOTUNE="0", TRITON_WORKSHOP_QUIET="1", PYTHONUNBUFFERED="1")
    if sanitized:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        env[_UNDER_SANITIZER] = "1"
    return env


def run_pass(names: list[str], prefix: list[str], record: bool, timeout: float, log) -> dict:
    """Run ``names`` in as many children as it takes (a child whose case lost the CUDA context
    stops; the cases after it go to a new one). Returns ``{"cases": {...}, "outside": [...],
    "summaries": [...], "returncodes": [...], "refused": str}``."""
    results: dict = {}
    outside: list = []
    summaries, returncodes = [], []
    remaining = list(names)
    refused = ""
    deadline = time.monotonic() + timeout
    while remaining:
        cmd = [*prefix, sys.executable, str(Path(__file__).resolve()), "--run", ",".join(remaining)]
        if record:
            cmd.append("--record")
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        left = deadline - time.monotonic()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=_child_env(sanitized=bool(prefix)), cwd=ROOT,
                                  timeout=max(left, 1))
            text, code = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            text = (out.decode(errors="replace") if isinstance(out, bytes) else out)
            text += f"\n[sanitize] timed out after {timeout:.0f} s\n"
            code = None
        log.write(text)
        log.write(f"[sanitize] exit status {code}\n\n")
        log.flush()
        if prefix and _SANITIZER_REFUSED.search(text) and MARKER not in text:
            refused = _SANITIZER_REFUSED.search(text).group(1).strip()
            break
        part, out_reports = split_by_case(text, remaining)
        outside += out_reports
        summaries.append(parse_summary(text))
        returncodes.append(code)
        started = [n for n in remaining if part[n].status != "not run"]
        results.update({n: part[n] for n in started})
        if code is None or not started:
            for n in remaining:
                results.setdefault(n, part[n])
                if code is None and results[n].status in ("not run", "crashed"):
                    results[n].detail = results[n].detail or "timed out"
            break
        last = started[-1]
        remaining = remaining[remaining.index(last) + 1:]
    for n in names:
        results.setdefault(n, CaseResult())
    return {"cases": results, "outside": outside, "summaries": summaries,
            "returncodes": returncodes, "refused": refused}


def coverage_problems(cases: list[Case], results: dict) -> dict:
    """Per case, what its launches say against its list: kernels missing or unexpected."""
    problems = {}
    for case in cases:
        result = results[case.name]
        if result.status != "ok" or result.kernels is None:
            continue
        expected = set(case.kernels) | set(case.incidental)
        launched = set(result.kernels)
        missing, extra = sorted(set(case.kernels) - launched), sorted(launched - expected)
        if missing or extra:
            problems[case.name] = {"missing": missing, "unexpected": extra}
    return problems


def _cell(result: CaseResult, library_names) -> str:
    if result.status == "skipped":
        return "skipped"
    if result.status in ("not run", "crashed", "failed") and not result.reports:
        return result.status
    mine = [r for r in result.reports if r.kind != "warning" and r.kernel(library_names)]
    other = [r for r in result.reports if r.kind != "warning" and not r.kernel(library_names)]
    cell = str(len(mine))
    if other:
        cell += f" +{len(other)} other"
    warnings = result.count("warning")
    if warnings:
        cell += f" ({warnings}w)"
    if result.status != "ok":
        cell += f" {result.status}"
    return cell


def format_table(cases: list[Case], tools: list[str], passes: dict, library_names) -> str:
    """case x tool -> errors: the library's kernels' errors, ``+N other`` for reports about
    other code (torch, cuDNN, a failed CUDA call), ``(Nw)`` warnings (racecheck)."""
    width = max(len(c.name) for c in cases) + 2
    header = "case".ljust(width) + "".join(t.rjust(16) for t in tools)
    rows = [header, "-" * len(header)]
    for case in cases:
        rows.append(case.name.ljust(width) + "".join(
            _cell(passes[t]["cases"][case.name], library_names).rjust(16) for t in tools))
    rows.append("(outside cases)".ljust(width) + "".join(
        str(sum(r.kind != "warning" for r in passes[t]["outside"])).rjust(16) for t in tools))
    totals = []
    for t in tools:
        counts = [s["errors"] for s in passes[t]["summaries"]]
        totals.append("?" if not counts or None in counts else str(sum(counts)))
    rows.append("ERROR SUMMARY".ljust(width) + "".join(c.rjust(16) for c in totals))
    return "\n".join(rows)


def pass_failed(tool_pass: dict) -> bool:
    cases = tool_pass["cases"].values()
    if tool_pass["refused"]:
        return True
    if any(c.status not in ("ok", "skipped") for c in cases):
        return True
    if any(c.count("error") or c.count("api") for c in cases):
        return True
    if any(r.kind != "warning" for r in tool_pass["outside"]):
        return True
    return any(s["errors"] is None or s["errors"] > 0 for s in tool_pass["summaries"])


def _jsonable(tool_pass: dict) -> dict:
    def case(c: CaseResult) -> dict:
        return {"status": c.status, "detail": c.detail, "kernels": c.kernels,
                "errors": c.count("error"), "api_errors": c.count("api"),
                "warnings": c.count("warning"),
                "reports": [{"kind": r.kind, "headline": r.headline, "lines": r.lines[:12]}
                            for r in c.reports[:50]]}

    return {"cases": {n: case(c) for n, c in tool_pass["cases"].items()},
            "outside": [r.headline for r in tool_pass["outside"]],
            "summaries": tool_pass["summaries"], "returncodes": tool_pass["returncodes"],
            "refused": tool_pass["refused"]}


def _default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "sanitize" if out else ROOT / "bench-results" / "sanitize"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                   help=f"comma-separated, of {', '.join(TOOLS)} (default: %(default)s)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--out", type=Path, default=None, help="folder for the logs")
    p.add_argument("--sanitizer", default=None, help="path of compute-sanitizer")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds per pass (the plain one, then each tool's)")
    p.add_argument("--api-errors", choices=("report", "ignore"), default="report",
                   help="failed CUDA API calls (torch's own included): count them as errors, or "
                        "tell the sanitizer not to report them (default: %(default)s)")
    p.add_argument("--no-coverage", action="store_true",
                   help="skip the plain pass that checks which kernels each case launches")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--run", default=None, help=argparse.SUPPRESS)  # a child: run these cases
    p.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if str(ROOT / "src") not in sys.path:  # a checkout without an install (PYTHONPATH unset)
        sys.path.insert(0, str(ROOT / "src"))
    if args.run is not None:
        return run_cases([n for n in args.run.split(",") if n], args.record)
    names = [n for n in args.cases.split(",") if n] or [c.name for c in CASES]
    unknown = [n for n in names if n not in CASES_BY_NAME]
    tools = [t for t in args.tools.split(",") if t]
    bad_tools = [t for t in tools if t not in TOOLS]
    if unknown or bad_tools:
        print(f"unknown case(s) {unknown} / tool(s) {bad_tools}; cases: "
              f"{', '.join(CASES_BY_NAME)}; tools: {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    cases = [CASES_BY_NAME[n] for n in names]
    if args.list:
        for c in cases:
            extra = f" (maybe {', '.join(c.incidental)})" if c.incidental else ""
            print(f"{c.name:22s} {', '.join(c.ops):32s} {', '.join(c.kernels)}{extra}")
        return 0

    import torch

    if not torch.cuda.is_available():
        print("sanitize: no CUDA GPU here: compute-sanitizer checks kernels running on a GPU "
              "(nothing was run)", file=sys.stderr)
        return 2
    sanitizer = find_sanitizer(args.sanitizer)
    if sanitizer is None:
        print("sanitize: compute-sanitizer not found (looked at --sanitizer, $COMPUTE_SANITIZER, "
              "the PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin); nothing was run", file=sys.stderr)
        return 2
    out = args.out or _default_out()
    out.mkdir(parents=True, exist_ok=True)
    print(f"sanitize: {sanitizer} on {torch.cuda.get_device_name()} · torch {torch.__version__} · "
          f"{len(cases)} cases · tools {', '.join(tools)} · logs in {out}/", flush=True)

    failed = False
    summary: dict = {"sanitizer": sanitizer, "device": torch.cuda.get_device_name(),
                     "cases": names, "tools": tools}
    if not args.no_coverage:
        start = time.monotonic()
        with open(out / "coverage.log", "w") as log:
            coverage = run_pass(names, [], True, args.timeout, log)
        problems = coverage_problems(cases, coverage["cases"])
        not_ok = {n: f"{c.status}: {c.detail}" for n, c in coverage["cases"].items()
                  if c.status not in ("ok", "skipped")}
        launched = set().union(*(c.kernels or () for c in coverage["cases"].values()))
        skipped = {k for c in cases if coverage["cases"][c.name].status == "skipped"
                   for k in c.kernels}
        uncovered = (sorted(set(library_kernels_names()) - launched - skipped)
                     if len(cases) == len(CASES) else [])
        print(f"coverage (no sanitizer, {time.monotonic() - start:.0f} s): "
              f"{len(launched)} kernels launched", flush=True)
        for name, problem in problems.items():
            print(f"  {name}: missing {problem['missing']} unexpected {problem['unexpected']}")
        for name, why in not_ok.items():
            print(f"  {name}: {why}")
        if uncovered:
            print(f"  library kernels no case launched: {', '.join(uncovered)}")
        summary["coverage"] = {"problems": problems, "not_ok": not_ok, "uncovered": uncovered,
                               "launched": {n: c.kernels for n, c in coverage["cases"].items()}}
        failed |= bool(problems or not_ok or uncovered)

    passes = {}
    library_names = library_kernels_names()
    for tool in tools:
        start = time.monotonic()
        prefix = [sanitizer, "--tool", tool, "--error-exitcode", "1", "--print-limit", "1000",
                  *TOOL_OPTIONS[tool]]
        if args.api_errors == "ignore":
            prefix += ["--report-api-errors", "no"]
        with open(out / f"{tool}.log", "w") as log:
            passes[tool] = run_pass(names, prefix, False, args.timeout, log)
        if passes[tool]["refused"]:
            print(f"sanitize: compute-sanitizer cannot run here ({passes[tool]['refused']}); "
                  f"see {out / (tool + '.log')}", file=sys.stderr)
            return 2
        print(f"{tool}: {time.monotonic() - start:.0f} s", flush=True)
        failed |= pass_failed(passes[tool])
    table = format_table(cases, tools, passes, library_names)
    summary["passes"] = {t: _jsonable(p) for t, p in passes.items()}
    summary["table"] = table
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print()
    print(table)
    print(f"\nsanitize: {'ERRORS (see the logs)' if failed else 'clean'}; logs in {out}/")
    return 1 if failed else 0


def library_kernels_names() -> list[str]:
    """The names of :func:`library_kernels` (imports the package in interpreter mode when there
    is no GPU, as any import of it does)."""
    return sorted(library_kernels())


if __name__ == "__main__":
    sys.exit(main())
