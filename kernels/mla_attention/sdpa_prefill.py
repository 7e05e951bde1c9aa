"""MLA prefill in MHA form without FlashInfer: torch's scaled_dot_product_attention per sequence (the
fallback of flashinfer_mha_prefill.py; fused kernels on CUDA, so no [N, q, L] score matrix is built).

Legend: T = new tokens, K = attended tokens (prefix + new), N = heads, Dqk / Dv = head dims.
"""
from __future__ import annotations

import torch


def mha_prefill_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: list[int],
                     kv_indptr: list[int], sm_scale: float) -> torch.Tensor:
    """q [T, N, Dqk], k [K, N, Dqk], v [K, N, Dv] -> [T, N, Dv]; rows as in ref.mla_mha_prefill_ref,
    bottom-right causal. The CSR offsets are host lists, so no device sync; one SDPA call per sequence."""
    from torch.nn.attention.bias import causal_lower_right

    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])                 # [T, N, Dv]
    for b in range(len(qo_indptr) - 1):
        q0, q1, k0, k1 = qo_indptr[b], qo_indptr[b + 1], kv_indptr[b], kv_indptr[b + 1]
        if q1 == q0:
            continue
        qb = q[q0:q1].transpose(0, 1)                                      # [N, q, Dqk]
        kb, vb = k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1)        # [N, L, *]
        mask = causal_lower_right(q1 - q0, k1 - k0)
        ob = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=sm_scale)
        out[q0:q1] = ob.transpose(0, 1)
    return out
