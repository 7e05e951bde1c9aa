"""Torch reference for MLA attention over the paged latent KV cache (absorbed form, decode and extend).

Legend: B = sequences, N = query heads, C = kv_lora_rank (latent dim), R = rope dim, S = KV slots.
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
