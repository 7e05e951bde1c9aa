"""Triton linear for few tokens (decode at small batches): y = x W^T with x [M, K], M <= 16, W [N, K].

Legend: M = tokens (rows of x), N = output features, K = input features.
Why: at M = 1-16 a linear is a weight stream (N * K * 2 bytes), and cuBLAS picks 64-column tiles for it, i.e.
N / 64 thread blocks -- 32 blocks for a 2048 x 2048 projection on a 132-SM H200, ~1.4 TB/s. Here each program
owns BLOCK_N output columns (N / BLOCK_N programs, e.g. 128 at BLOCK_N = 16) and streams their K-long weight
rows through a pipelined loop; the M rows of x ride along as one zero-padded 16-row tile of a tensor-core dot.
Versions: v1 (this file) no split over K, fp32 accumulation, output in x's dtype; matches F.linear.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_ROWS = 16                 # rows of x one call takes (one padded tensor-core tile)


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


DEFAULT_CONFIG = SkinnyConfig()


@triton.jit
def _skinny_linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                          HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]                    # [BM, BK]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]       # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + offs_k) < K
        x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: SkinnyConfig = DEFAULT_CONFIG, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS, last dim contiguous), weight [N, K] contiguous rows, bias [N] or None ->
    [M, N] in x's dtype (F.linear's result up to the summation order)."""
    assert x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.stride(-1) == 1 and weight.stride(-1) == 1
    num_rows, in_features = x.shape
    out_features = weight.shape[0]
    assert weight.shape[1] == in_features, f"x [{num_rows}, {in_features}] vs weight {tuple(weight.shape)}"
    out = x.new_empty(num_rows, out_features) if out is None else out
    if num_rows:
        grid = (triton.cdiv(out_features, config.block_n),)
        _skinny_linear_kernel[grid](
            x, weight, bias if bias is not None else weight, out, num_rows, out_features, in_features,
            x.stride(0), weight.stride(0), out.stride(0), HAS_BIAS=bias is not None, BLOCK_M=MAX_ROWS,
            BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
            num_stages=config.num_stages)
    return out
