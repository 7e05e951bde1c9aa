"""Torch references for MLA attention: the absorbed form over the paged latent KV cache (decode and extend),
and the MHA form of a prefill over k/v expanded from the latents.

Legend: B = sequences, N = query heads, C = kv_lora_rank (latent dim), R = rope dim, S = KV slots,
T = new tokens, K = attended tokens, Dqk = qk_nope + R, Dv = v_head_dim.
The cache holds one latent "head" per token: kv_cache[s] = [c_kv (C) | k_rope (R)].
"""
from __future__ import annotations

import torch


def mla_decode_ref(
    q_nope: torch.Tensor,      # [B, N, C]  query already multiplied by W_UK (absorbed)
    q_rope: torch.Tensor,      # [B, N, R]
    kv_cache: torch.Tensor,    # [S, C + R] one layer of the latent pool
    kv_indptr: torch.Tensor,   # [B + 1] int, CSR offsets into kv_indices
    kv_indices: torch.Tensor,  # [sum of KV lengths] int, slot of every cached token of every sequence
    sm_scale: float,
) -> torch.Tensor:             # [B, N, C]  latent output (multiply by W_UV afterwards)
    """One query token per sequence attends all of that sequence's cached tokens. float32 math."""
    latent_dim = q_nope.shape[-1]
    out = torch.empty(q_nope.shape, dtype=torch.float32, device=q_nope.device)
    indptr = kv_indptr.tolist()
    for b in range(q_nope.shape[0]):
        kv = kv_cache[kv_indices[indptr[b]:indptr[b + 1]]].float()    # [L, C+R]
        c_kv, k_rope = kv[:, :latent_dim], kv[:, latent_dim:]
        scores = q_nope[b].float() @ c_kv.t() + q_rope[b].float() @ k_rope.t()   # [N, L]
        probs = torch.softmax(scores * sm_scale, dim=-1)
        out[b] = probs @ c_kv                                          # [N, C]
    return out.to(q_nope.dtype)


def mla_extend_ref(
    q_nope: torch.Tensor,      # [T, N, C]  new tokens of all sequences, concatenated (absorbed query)
    q_rope: torch.Tensor,      # [T, N, R]
    kv_cache: torch.Tensor,    # [S, C + R] one layer; the new tokens' latents are already stored
    qo_indptr: torch.Tensor,   # [B + 1] int, CSR offsets of each sequence's new tokens in T
    kv_indptr: torch.Tensor,   # [B + 1] int, CSR offsets into kv_indices (prefix + new tokens)
    kv_indices: torch.Tensor,  # [sum of KV lengths] int, slot of every token of every sequence
    sm_scale: float,
    causal: bool = True,
) -> torch.Tensor:             # [T, N, C]
    """Extend (prefill over a cached prefix): sequence b's q_len new tokens are the LAST q_len of its
    kv_len tokens, so with causal=True new token i (0-based) sees KV positions < kv_len - q_len + i + 1
    (bottom-right aligned mask, FlashInfer's convention). Decode is the case q_len = 1. float32 math."""
    latent_dim = q_nope.shape[-1]
    out = torch.empty(q_nope.shape, dtype=torch.float32, device=q_nope.device)
    q_ptr, kv_ptr = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(q_ptr) - 1):
        q_len, kv_len = q_ptr[b + 1] - q_ptr[b], kv_ptr[b + 1] - kv_ptr[b]
        if q_len == 0:
            continue
        kv = kv_cache[kv_indices[kv_ptr[b]:kv_ptr[b + 1]]].float()      # [L, C+R]
        c_kv, k_rope = kv[:, :latent_dim], kv[:, latent_dim:]
        qn, qr = q_nope[q_ptr[b]:q_ptr[b + 1]].float(), q_rope[q_ptr[b]:q_ptr[b + 1]].float()
        scores = torch.einsum("qnc,lc->nql", qn, c_kv) + torch.einsum("qnr,lr->nql", qr, k_rope)  # [N, q, L]
        if causal:
            query_pos = torch.arange(q_len, device=kv.device)[:, None] + (kv_len - q_len)     # [q, 1]
            visible = torch.arange(kv_len, device=kv.device)[None, :] <= query_pos             # [q, L]
            scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores * sm_scale, dim=-1)
        out[q_ptr[b]:q_ptr[b + 1]] = torch.einsum("nql,lc->qnc", probs, c_kv)
    return out.to(q_nope.dtype)


def mla_mha_prefill_ref(
    q: torch.Tensor,           # [T, N, Dqk]  new tokens of all sequences (qk_nope | roped q_pe per head)
    k: torch.Tensor,           # [K, N, Dqk]  every attended token (prefix then new, per sequence)
    v: torch.Tensor,           # [K, N, Dv]
    qo_indptr: torch.Tensor,   # [B + 1] int, CSR offsets of each sequence's new tokens in T
    kv_indptr: torch.Tensor,   # [B + 1] int, CSR offsets of each sequence's tokens in K
    sm_scale: float,
) -> torch.Tensor:             # [T, N, Dv]
    """MLA in MHA form ("prefill as MHA"): k/v expanded from the latents by kv_b_proj. Causal, bottom-right
    aligned as mla_extend_ref (sequence b's new tokens are the last of its kv_len). float32 math."""
    out = torch.empty(*q.shape[:2], v.shape[-1], dtype=torch.float32, device=q.device)
    q_ptr, kv_ptr = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(q_ptr) - 1):
        q_len, kv_len = q_ptr[b + 1] - q_ptr[b], kv_ptr[b + 1] - kv_ptr[b]
        if q_len == 0:
            continue
        qb = q[q_ptr[b]:q_ptr[b + 1]].float()                           # [q, N, Dqk]
        kb, vb = k[kv_ptr[b]:kv_ptr[b + 1]].float(), v[kv_ptr[b]:kv_ptr[b + 1]].float()   # [L, N, *]
        scores = torch.einsum("qnd,lnd->nql", qb, kb)                    # [N, q, L]
        query_pos = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)      # [q, 1]
        visible = torch.arange(kv_len, device=q.device)[None, :] <= query_pos             # [q, L]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")) * sm_scale, dim=-1)
        out[q_ptr[b]:q_ptr[b + 1]] = torch.einsum("nql,lnd->qnd", probs, vb)
    return out.to(q.dtype)
