"""Exercise 4: tiled matrix multiplication, and respecting the data types.

C = A @ B with A (M, K) and B (K, N). Each program computes one BLOCK_M x BLOCK_N tile of C: it
walks K in steps of BLOCK_K, loads a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile of B,
and multiplies them with ``tl.dot`` into a float32 accumulator. Masks zero the parts of tiles that
stick out past M, N or K (zeros add nothing to a dot product).

Respect the data types: on an NVIDIA GPU ``tl.dot`` on float32 inputs uses TF32 by default, which
keeps only 10 bits of mantissa: errors of ~1e-3 where float32 promises ~1e-7. Ask for
``input_precision="ieee"`` unless the caller allows TF32. float16/bfloat16 inputs go to the tensor
cores as they are; the accumulator stays float32 and is rounded once, on the store.
"""

import torch

import triton_workshop  # noqa: F401  (first: picks GPU or interpreter before any @triton.jit)
import triton
import triton.language as tl
from triton_workshop.debug import breakpoint_if, cdiv, check_tensors_gpu_ready, print_if  # noqa: F401

BLOCK_M = 32
BLOCK_N = 32
BLOCK_K = 32


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
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
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, c, mask=mask)


def matmul(a: torch.Tensor, b: torch.Tensor, allow_tf32: bool = False) -> torch.Tensor:
    check_tensors_gpu_ready(a, b)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need a (M, K) and b (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    precision = "tf32" if (allow_tf32 and a.dtype == torch.float32) else "ieee"
    grid = (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))
    matmul_kernel[grid](a, b, c, M, N, K,
                        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                        INPUT_PRECISION=precision)
    return c


if __name__ == "__main__":
    from triton_workshop.teach import run_exercise

    raise SystemExit(run_exercise(__name__))
