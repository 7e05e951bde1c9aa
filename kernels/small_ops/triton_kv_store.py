"""Triton KV-cache store: scatter the new tokens' rows into their slots (latent MLA rows, or k and v).

Legend: T = new tokens, S = slots, C = kv_lora_rank, R = rope dim, K = kv heads, D = head dim, W = row width.
Versions: v1 (this file) one program per token copies one row of up to two (source, destination) pairs,
so MLA's c_kv and k_rope (or MHA's k and v) go in one launch. Destinations are row-strided: the combined
latent pool [S, C + R] is written through its two column views. Matches ref.store_rows_ref /
ref.store_mla_kv_ref. Slots must be valid (padded tokens should point at a reserved dummy slot).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_rows_kernel(slots_ptr, src1_ptr, dst1_ptr, src2_ptr, dst2_ptr,
                       stride_src1, stride_dst1, stride_src2, stride_dst2,
                       W1: tl.constexpr, W2: tl.constexpr, BLOCK1: tl.constexpr, BLOCK2: tl.constexpr,
                       HAS_SECOND: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + tok).to(tl.int64)
    offs1 = tl.arange(0, BLOCK1)
    row1 = tl.load(src1_ptr + tok * stride_src1 + offs1, mask=offs1 < W1)
    tl.store(dst1_ptr + slot * stride_dst1 + offs1, row1.to(dst1_ptr.dtype.element_ty), mask=offs1 < W1)
    if HAS_SECOND:
        offs2 = tl.arange(0, BLOCK2)
        row2 = tl.load(src2_ptr + tok * stride_src2 + offs2, mask=offs2 < W2)
        tl.store(dst2_ptr + slot * stride_dst2 + offs2, row2.to(dst2_ptr.dtype.element_ty), mask=offs2 < W2)


def _check_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    assert dst.dim() == 2 and src.dim() == 2 and dst.shape[1] == src.shape[1], "row widths differ"
    assert dst.stride(1) == 1 and src.stride(1) == 1, "rows must be contiguous"


def store_row_pairs_triton(slots: torch.Tensor, src1: torch.Tensor, dst1: torch.Tensor,
                           src2: torch.Tensor | None = None, dst2: torch.Tensor | None = None) -> None:
    """dst1[slots[t]] = src1[t] and dst2[slots[t]] = src2[t]; src [T, W], dst [S, W] row-strided; in place."""
    _check_rows(dst1, src1)
    has_second = src2 is not None
    if has_second:
        _check_rows(dst2, src2)
    else:
        src2, dst2 = src1, dst1
    num_tokens = src1.shape[0]
    if num_tokens:
        _store_rows_kernel[(num_tokens,)](
            slots, src1, dst1, src2, dst2,
            src1.stride(0), dst1.stride(0), src2.stride(0), dst2.stride(0),
            W1=src1.shape[1], W2=src2.shape[1],
            BLOCK1=triton.next_power_of_2(src1.shape[1]), BLOCK2=triton.next_power_of_2(src2.shape[1]),
            HAS_SECOND=has_second, num_warps=4,
        )


def store_latent_triton(ckv_dst: torch.Tensor, kpe_dst: torch.Tensor, slots: torch.Tensor,
                        c_kv: torch.Tensor, k_rope: torch.Tensor) -> None:
    """Separate buffers (or views): ckv_dst [S, C], kpe_dst [S, R] <- c_kv [T, C], k_rope [T, R]."""
    store_row_pairs_triton(slots, c_kv, ckv_dst, k_rope, kpe_dst)


def store_mla_kv_triton(kv_cache: torch.Tensor, slots: torch.Tensor, c_kv: torch.Tensor,
                        k_rope: torch.Tensor) -> None:
    """Combined latent pool [S, C + R] <- [c_kv | k_rope]; same contract as ref.store_mla_kv_ref."""
    latent_dim = c_kv.shape[-1]
    store_latent_triton(kv_cache[:, :latent_dim], kv_cache[:, latent_dim:], slots, c_kv, k_rope)


def store_kv_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor) -> None:
    """MHA/GQA pools: k_cache [S, K, D], v_cache [S, K, Dv] <- k [T, K, D], v [T, K, Dv]."""
    store_row_pairs_triton(slots, k.reshape(k.shape[0], -1), k_cache.view(k_cache.shape[0], -1),
                           v.reshape(v.shape[0], -1), v_cache.view(v_cache.shape[0], -1))
