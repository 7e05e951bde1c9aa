"""Sum of the routed experts' rows over top-k (SGLang's moe_sum_reduce), skipping the pairs the align
step left out (negative topk ids: experts another EP rank holds), whose rows no GEMM wrote.

Legend: M = tokens, K = top-k, H = hidden, S = M*K slots, BH = hidden columns per program.
One launch, grid (M, H / BH); each program reads its token's K ids and accumulates in float32 the rows
of the pairs kept, so a skipped pair costs neither a read nor a zero-fill of its row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK_H = 1024   # hidden columns per program


@triton.jit
def _topk_sum_kernel(
    rows_ptr, ids_ptr, out_ptr,
    size_h, stride_rm, stride_om, stride_it, stride_ik,
    TOP_K: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Program (t, j): out[t, j*BH:(j+1)*BH] = sum over k with ids[t, k] >= 0 of rows[t*K + k, same columns]."""
    token = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_row = offs_h < size_h
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        expert = tl.load(ids_ptr + token * stride_it + k * stride_ik)
        kept = in_row & (tl.full([BLOCK_H], 0, dtype=tl.int32) + expert.to(tl.int32) >= 0)   # [BH]
        row = rows_ptr + (token * TOP_K + k) * stride_rm + offs_h
        acc += tl.load(row, mask=kept, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_om + offs_h, acc.to(out_ptr.dtype.element_ty), mask=in_row)


def topk_sum(
    rows: torch.Tensor,      # [S, H] row t*K+k = pair (t, k)'s weighted expert output
    topk_ids: torch.Tensor,  # [M, K] negative = skipped pair (its row is not read)
    out: torch.Tensor,       # [M, H] written whole (zeros for a token whose pairs are all skipped)
) -> torch.Tensor:
    num_tokens, top_k = topk_ids.shape
    size_h = rows.shape[1]
    assert rows.shape[0] == num_tokens * top_k and out.shape == (num_tokens, size_h), (rows.shape, out.shape)
    assert rows.stride(1) == 1 and out.stride(1) == 1
    if num_tokens == 0:
        return out
    block_h = min(MAX_BLOCK_H, triton.next_power_of_2(size_h))
    grid = (num_tokens, triton.cdiv(size_h, block_h))
    _topk_sum_kernel[grid](
        rows, topk_ids, out, size_h, rows.stride(0), out.stride(0), topk_ids.stride(0), topk_ids.stride(1),
        TOP_K=top_k, BLOCK_H=block_h, num_warps=4)
    return out
