"""Exercise 7: making matmul fast. Grouped program ordering and autotuning, over exercise 4's kernel.

Exercise 4's kernel is correct; two things make it fast on a GPU.

**Grouped ordering.** Programs run in waves, a few hundred at a time, in program-id order. With
row-major ids (exercise 4's 2-D grid) one wave covers a row of tiles or two: every program reads
the same rows of A but a different column block of B, so B streams through the L2 cache and is
read from memory again by the next wave. Grouped, consecutive ids walk *down* GROUP_SIZE_M rows of
tiles before moving one column right: a wave covers a squarish patch of C, and the rows of A and
the columns of B it needs are reused from L2 by several programs each. The grid becomes 1-D, and
``grouped_tile`` turns a program id into its (pid_m, pid_n). The last group has fewer rows when
the number of tile rows is not a multiple of GROUP_SIZE_M: every tile must still be computed
exactly once.

**Autotuning.** The best tile sizes, warps and pipeline stages depend on the GPU and the shape.
``@autotune`` (``triton.autotune`` on a GPU) times every ``triton.Config`` in the list the first
time it sees a new (M, N, K, dtypes), then keeps the fastest. Block sizes therefore come from the
chosen config, and the grid is a function of it: ``grid = lambda meta: ...``. The interpreter cannot
time anything, so there only the first config runs: keep it small and safe.

Replace each ``...`` marked ``# TODO n`` with code, in order, then run
``python exercises/exercise_7.py`` (or ``exercise_7``). The checker first asks ``grouped_tile`` for
the tile of every program (each tile exactly once? in grouped order?), then checks the matmul on
ragged shapes. On a GPU the file then times it (``triton.testing.do_bench``) and draws the plot
``perf_report`` would: exercise 4's launch (32 x 32 tiles, row-major) against yours and
``torch.matmul`` (cuBLAS); in the interpreter it says why it cannot. Stuck?
``solutions/solution_7.py`` has an answer.
"""

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401
from triton_workshop.runtime import autotune


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """The (pid_m, pid_n) tile of program ``pid`` in grouped order."""
    num_pid_in_group = ...  # TODO 1: programs in one group: GROUP_SIZE_M rows of tiles, num_pid_n wide
    group_id = ...  # TODO 2: the group program pid belongs to
    first_pid_m = ...  # TODO 3: the group's first row of tiles
    group_size_m = ...  # TODO 4: rows in this group: GROUP_SIZE_M, fewer in the last one (tl.minimum)
    pid_m = ...  # TODO 5: down the group's rows first: first_pid_m + (pid % num_pid_in_group) % ...
    pid_n = ...  # TODO 6: one column right every group_size_m programs: (pid % num_pid_in_group) // ...
    return pid_m, pid_n


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_SIZE_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = ...  # TODO 7: this program's tile: grouped_tile(program id, num_pid_m, num_pid_n, ...)
    # From here on, exercise 4's kernel.
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=mask)


# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_SIZE_M, num_warps, num_stages) worth trying on a recent GPU:
# large tiles feed the tensor cores, more stages hide the memory latency (and cost shared memory).
TUNING_SPACE = [
    (128, 256, 64, 8, 8, 3),
    (128, 128, 64, 8, 8, 4),
    (128, 128, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
    (64, 64, 64, 8, 4, 3),
]


def tuning_configs() -> list:
    # The first config is the one the interpreter runs: small, and fine on any GPU.
    configs = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_SIZE_M": 4},
                             num_warps=4, num_stages=2)]
    for block_m, block_n, block_k, group, warps, stages in TUNING_SPACE:
        # Meta-parameters (the kernel's constexprs) go in the dict; warps and stages are options
        # of the launch.
        config = ...  # TODO 8: triton.Config({"BLOCK_M": block_m, ... 4 keys}, num_warps=, num_stages=)
        configs.append(config)
    return configs


CONFIGS = tuning_configs()

# Re-tuned for every new (M, N, K) (and dtypes, which Triton adds to the key). Configs with an
# unfinished entry are left out here; matmul() says which.
matmul_kernel_tuned = autotune(configs=[c for c in CONFIGS if isinstance(c, triton.Config)],
                               key=["M", "N", "K"])(matmul_kernel)


def _check_matmul_args(a: torch.Tensor, b: torch.Tensor) -> None:
    check_tensors_gpu_ready(a, b)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need a (M, K) and b (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with the grouped, autotuned kernel (float32 inputs in IEEE precision)."""
    unfinished = [i for i, c in enumerate(CONFIGS) if not isinstance(c, triton.Config)]
    if unfinished:
        raise TypeError(f"CONFIGS[{unfinished[0]}] is {CONFIGS[unfinished[0]]!r}, not a "
                        "triton.Config: finish tuning_configs()")
    _check_matmul_args(a, b)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    # The block sizes come from the config the autotuner picks: the grid is a function of it.
    grid = ...  # TODO 9: lambda meta: a 1-tuple, tiles of meta["BLOCK_M"] x meta["BLOCK_N"] covering C
    matmul_kernel_tuned[grid](a, b, c, M, N, K,
                              a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                              c.stride(0), c.stride(1), INPUT_PRECISION="ieee")
    return c


def matmul_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exercise 4's launch of the same kernel: 32 x 32 x 32 tiles, row-major order
    (GROUP_SIZE_M = 1), no tuning. The baseline of the benchmark."""
    _check_matmul_args(a, b)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    matmul_kernel[(cdiv(M, 32) * cdiv(N, 32),)](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1,
        INPUT_PRECISION="ieee")
    return c


# What the checker inspects: the order itself, program by program, outside any matmul.
@triton.jit
def tile_order_kernel(tiles_ptr, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    tl.store(tiles_ptr + 2 * pid, pid_m)
    tl.store(tiles_ptr + 2 * pid + 1, pid_n)


def tile_order(num_pid_m: int, num_pid_n: int, group_size_m: int) -> torch.Tensor:
    """Row p: the (pid_m, pid_n) tile that program p computes."""
    tiles = torch.empty((num_pid_m * num_pid_n, 2), dtype=torch.int32,
                        device=triton_workshop.DEVICE)
    tile_order_kernel[(num_pid_m * num_pid_n,)](tiles, num_pid_m, num_pid_n,
                                                GROUP_SIZE_M=group_size_m)
    return tiles


def tile_visits(num_pid_m: int, num_pid_n: int, group_size_m: int) -> torch.Tensor:
    """How many programs compute each tile: it must be exactly one everywhere."""
    tiles = tile_order(num_pid_m, num_pid_n, group_size_m).long().cpu()
    inside = ((tiles[:, 0] >= 0) & (tiles[:, 0] < num_pid_m)
              & (tiles[:, 1] >= 0) & (tiles[:, 1] < num_pid_n))
    flat = tiles[inside, 0] * num_pid_n + tiles[inside, 1]
    counts = torch.bincount(flat, minlength=num_pid_m * num_pid_n)
    return counts.view(num_pid_m, num_pid_n).to(torch.int32)


def benchmark(out_dir: str = "workshop-output/exercise_7") -> bool:
    """On a GPU: TFLOP/s of exercise 4's launch, this one and torch.matmul (cuBLAS) over square
    float16 sizes; prints the table and saves the plot in ``out_dir``, the report
    ``triton.testing.perf_report`` makes (it needs pandas, which the workshop does not install).
    Without a GPU: says why not."""
    if triton_workshop.INTERPRET:
        print("Timing needs a GPU: the interpreter runs each program as NumPy code, so its times "
              "say nothing about a GPU. On a machine with one, run this file again for the "
              "plot (exercise 4's launch vs grouped + tuned vs torch.matmul).")
        return False
    from pathlib import Path

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines = {"exercise 4's launch": matmul_naive, "grouped + autotuned": matmul,
             "torch.matmul (cuBLAS)": torch.matmul}
    sizes = [512 * i for i in range(1, 17)]
    rates = {name: [] for name in lines}
    print(f"{'size':>6}" + "".join(f"{name:>24}" for name in lines) + "   (TFLOP/s, median)")
    for size in sizes:
        a = torch.randn(size, size, device="cuda", dtype=torch.float16)
        b = torch.randn(size, size, device="cuda", dtype=torch.float16)
        for name, fn in lines.items():
            ms = triton.testing.do_bench(lambda: fn(a, b), return_mode="median")
            rates[name].append(2 * size ** 3 / (ms * 1e-3) / 1e12)
        print(f"{size:>6}" + "".join(f"{rates[name][-1]:>24.1f}" for name in lines))
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for (name, values), style in zip(rates.items(), ("--", "-", "-")):
        ax.plot(sizes, values, style, marker="o", markersize=3, label=name)
    ax.set_xlabel("M = N = K (float16)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"matmul on {torch.cuda.get_device_name()}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = Path(out_dir) / "matmul-fp16.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot saved: {path}")
    return True


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    code = run_exercise(__name__)
    if code == 0:
        benchmark()
    raise SystemExit(code)
