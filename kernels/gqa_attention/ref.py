"""Torch reference for attention over the paged MHA/GQA KV cache (extend over a cached prefix; decode).

Legend: T = query tokens (new tokens of all sequences), B = sequences, N = query heads, Hkv = KV heads,
D = head dim, S = KV slots, L = KV length of one sequence. Query head h reads KV head h // (N / Hkv).
Float32 math; loops over sequences (host reads of the indptrs): an oracle, not a kernel.
"""
from __future__ import annotations

import torch


def gqa_attention_ref(
    q: torch.Tensor,           # [T, N, D]
    k_cache: torch.Tensor,     # [S, Hkv, D] one layer; the new tokens' keys are already stored
    v_cache: torch.Tensor,     # [S, Hkv, Dv]
    qo_indptr: torch.Tensor,   # [B + 1] int, CSR offsets of each sequence's new tokens in T
    kv_indptr: torch.Tensor,   # [B + 1] int, CSR offsets into kv_indices (prefix + new tokens)
    kv_indices: torch.Tensor,  # [sum L] int, slot of every token of every sequence
    sm_scale: float,
    causal: bool = True,
) -> torch.Tensor:             # [T, N, Dv]
    """Sequence b's q_len new tokens are the LAST q_len of its kv_len tokens; with causal=True new token i
    sees KV positions <= kv_len - q_len + i (bottom-right aligned, FlashInfer's convention). Decode is
    q_len = 1 (it sees every KV token either way)."""
    num_heads, group = q.shape[1], q.shape[1] // k_cache.shape[1]
    out = torch.zeros(q.shape[0], num_heads, v_cache.shape[-1], dtype=torch.float32, device=q.device)
    q_ptr, kv_ptr = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(q_ptr) - 1):
        q_len, kv_len = q_ptr[b + 1] - q_ptr[b], kv_ptr[b + 1] - kv_ptr[b]
        if q_len == 0:
            continue
        slots = kv_indices[kv_ptr[b]:kv_ptr[b + 1]].long()
        k = k_cache[slots].float().repeat_interleave(group, dim=1)                  # [L, N, D]
        v = v_cache[slots].float().repeat_interleave(group, dim=1)                  # [L, N, Dv]
        scores = torch.einsum("qnd,lnd->nql", q[q_ptr[b]:q_ptr[b + 1]].float(), k) * sm_scale   # [N, q, L]
        if causal:
            query_pos = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)       # [q, 1]
            visible = torch.arange(kv_len, device=q.device)[None, :] <= query_pos              # [q, L]
            scores = scores.masked_fill(~visible, float("-inf"))
        out[q_ptr[b]:q_ptr[b + 1]] = torch.einsum("nql,lnd->qnd", scores.softmax(dim=-1), v)
    return out.to(q.dtype)


def store_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor) -> None:
    """k_cache[slots[t]] = k[t], v_cache[slots[t]] = v[t]  (k [T, Hkv, D], v [T, Hkv, Dv]); in place."""
    k_cache[slots.long()] = k.to(k_cache.dtype)
    v_cache[slots.long()] = v.to(v_cache.dtype)
