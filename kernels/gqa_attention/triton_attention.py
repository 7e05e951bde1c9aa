"""Triton flash attention over the paged MHA/GQA KV cache (page size 1): extend over a cached prefix, and decode.

Legend: T = query tokens, B = sequences, N = query heads, Hkv = KV heads, G = N / Hkv (group), D = head dim,
S = KV slots, L = KV length of a sequence, M = query tokens per program, R = query rows per program.

Versions (validated against ref.gqa_attention_ref by tests/kernels/test_gqa_attention.py):
  v1 (this file) one program per (sequence, KV head, block of M new tokens). Its R = M * G query rows are
     the M tokens times the G query heads that share the KV head, so every gathered K/V tile feeds all of
     them (one tile load, two tensor-core dots); online softmax in base 2; the causal mask is
     bottom-right aligned (token i of q_len sees KV positions <= L - q_len + i). Decode is M = 1 (R = G
     rows, padded to 16 for tl.dot). No split-KV: a long-context decode at small batch uses few programs,
     so this is the fallback when flashinfer is absent, not the fast path.
The grid depends only on host-known shapes (B, Hkv, the longest q_len), so with M = 1 it is CUDA-graph safe.
Must not import flashinfer.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_EXTEND_ROWS = 64        # query rows per program in extend (M = 64 / G tokens)


@triton.jit
def _gqa_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr,
    sm_scale_log2,
    stride_q_t, stride_q_h, stride_k_s, stride_k_h, stride_v_s, stride_v_h, stride_o_t, stride_o_h,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    m_block = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + seq).to(tl.int64)
    q_len = tl.load(qo_indptr_ptr + seq + 1).to(tl.int64) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    kv_start = tl.load(kv_indptr_ptr + seq).to(tl.int64)
    kv_len = tl.load(kv_indptr_ptr + seq + 1).to(tl.int64) - kv_start

    rows = tl.arange(0, BLOCK_ROWS)
    tok = m_block * BLOCK_M + rows // GROUP                       # [R] new-token index in the sequence
    head = kv_head * GROUP + rows % GROUP                         # [R] query head
    row_ok = (rows < BLOCK_M * GROUP) & (tok < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < D
    mask_dv = offs_dv < DV
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_q_t + head[:, None] * stride_q_h + offs_d[None, :],
                mask=row_ok[:, None] & mask_d[None, :], other=0.0)                 # [R, BLOCK_D]

    if CAUSAL:
        last_tok = tl.minimum(m_block * BLOCK_M + BLOCK_M, q_len) - 1
        kv_end = kv_len - q_len + last_tok + 1                    # the block's last token sees this far
        limit = kv_len - q_len + tok                              # [R] last visible KV position per row
    else:
        kv_end = kv_len
    m_i = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], tl.float32)
    acc = tl.zeros([BLOCK_ROWS, BLOCK_DV], tl.float32)
    for n0 in range(0, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < kv_end
        slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)   # [BLOCK_N]
        k = tl.load(k_ptr + slots[:, None] * stride_k_s + kv_head * stride_k_h + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)             # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2  # [R, BLOCK_N]
        visible = mask_n[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= limit[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: p = 0, no NaN
        alpha = tl.exp2(m_i - m_shift)
        p = tl.exp2(s - m_shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + slots[:, None] * stride_v_s + kv_head * stride_v_h + offs_dv[None, :],
                    mask=mask_n[:, None] & mask_dv[None, :], other=0.0)            # [BLOCK_N, BLOCK_DV]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(o_ptr + (q_start + tok)[:, None] * stride_o_t + head[:, None] * stride_o_h + offs_dv[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & mask_dv[None, :])


def gqa_attention_triton(
    q: torch.Tensor,           # [T, N, D] (rows may be strided; last dim contiguous)
    k_cache: torch.Tensor,     # [S, Hkv, D]
    v_cache: torch.Tensor,     # [S, Hkv, Dv]
    qo_indptr: torch.Tensor,   # [B + 1] int32 on q's device
    kv_indptr: torch.Tensor,   # [B + 1] int32
    kv_indices: torch.Tensor,  # [sum L] int32 slots
    sm_scale: float,
    max_q_len: int,            # longest q_len in the batch (host int: sizes the grid; 1 = decode)
    causal: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:             # [T, N, Dv]
    """Same contract as ref.gqa_attention_ref; no host sync (only max_q_len shapes the launch)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, v_dim = k_cache.shape[1], v_cache.shape[-1]
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    assert all(t.stride(-1) == 1 for t in (q, k_cache, v_cache))
    group = num_heads // num_kv_heads
    out = q.new_empty(num_tokens, num_heads, v_dim) if out is None else out
    num_seqs = qo_indptr.numel() - 1
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_m = 1 if max_q_len <= 1 else max(1, _EXTEND_ROWS // group)
    rows = max(16, triton.next_power_of_2(block_m * group))
    block_d, block_dv = triton.next_power_of_2(head_dim), triton.next_power_of_2(v_dim)
    block_n = 64 if max(block_d, block_dv) <= 128 else 32
    _gqa_attention_kernel[(num_seqs, num_kv_heads, triton.cdiv(max(max_q_len, 1), block_m))](
        q, k_cache, v_cache, out, qo_indptr, kv_indptr, kv_indices,
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_M=block_m, BLOCK_ROWS=rows, BLOCK_N=block_n,
        D=head_dim, DV=v_dim, BLOCK_D=block_d, BLOCK_DV=block_dv,
        CAUSAL=causal, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4 if rows <= 16 else 8,
    )
    return out
