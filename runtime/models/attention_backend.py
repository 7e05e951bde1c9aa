"""Attention over the paged KV pool behind a small interface; the torch reference is the default backend.

Legend: T = new tokens, N = query heads, Hkv = KV heads, D/Dv = key/value head dim, C = kv_lora_rank,
R = rope dim, S = slots, L = KV length of one sequence, K = KV tokens of the step. A fast backend
(FlashInfer/Triton) implements the same methods and is handed to the model through `ForwardBatch.attn_backend`.
MLA layers attend in one of two forms per step, as SGLang does (runtime.core.mla_form): absorbed (`mla`), or
MHA over k/v expanded from the latents (`mla_store`, then `mla_mha`) when `mla_as_mha(fb)` says so.
"""
from __future__ import annotations

from typing import Protocol

import torch

from kernels.mla_attention.ref import mla_decode_ref, mla_extend_ref, mla_mha_prefill_ref
from runtime.core.mla_form import mla_attends_as_mha
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.kv_pool import MHAKVPool, MLAKVPool


class AttentionBackend(Protocol):
    def mha(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            fb: ForwardBatch, pool: MHAKVPool, scale: float) -> torch.Tensor:
        """Write k, v [T, Hkv, D|Dv] at fb.out_cache_loc, then attend q [T, N, D] -> [T, N, Dv]."""
        ...

    def mla(self, layer: int, q_latent: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
            k_rope: torch.Tensor, fb: ForwardBatch, pool: MLAKVPool, scale: float) -> torch.Tensor:
        """Write [c_kv | k_rope] ([T, C], [T, R]) at fb.out_cache_loc, then attend in latent space:
        q_latent [T, N, C] (absorbed), q_rope [T, N, R] -> [T, N, C]."""
        ...

    def mla_as_mha(self, fb: ForwardBatch) -> bool:
        """Whether this step's MLA layers run in MHA form (mla_store + mla_mha) rather than mla()."""
        ...

    def mla_store(self, layer: int, c_kv: torch.Tensor, k_rope: torch.Tensor, fb: ForwardBatch,
                  pool: MLAKVPool) -> None:
        """Write [c_kv | k_rope] ([T, C], [T, R]) at fb.out_cache_loc (MHA form: decode reads them later)."""
        ...

    def mla_mha(self, layer: int, q: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch, scale: float) -> torch.Tensor:
        """MHA form: q [T, N, Dn + R] of the new tokens attends, causally, the keys k = [k_nope | k_rope]
        (k_nope [K, N, Dn], k_rope [K, R] shared by the heads) and values v [K, N, Dv] of every KV token of
        the step (rows in kv_indptr order: each sequence's prefix, then its new tokens) -> [T, N, Dv]."""
        ...


class TorchAttentionBackend:
    """Loops over sequences; float32 math; any mix of extends (with prefix) and decodes.
    mla_prefill_as_mha=False keeps every MLA step in absorbed form (the two forms agree; tests compare them)."""

    mla_prefill_as_mha: bool = True

    def __init__(self, mla_prefill_as_mha: bool = True) -> None:
        self.mla_prefill_as_mha = mla_prefill_as_mha

    def mha(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            fb: ForwardBatch, pool: MHAKVPool, scale: float) -> torch.Tensor:
        pool.write(layer, fb.out_cache_loc, k, v)
        k_cache, v_cache = pool.get_kv(layer)
        return paged_mha_ref(q, k_cache, v_cache, fb, scale)

    def mla(self, layer: int, q_latent: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
            k_rope: torch.Tensor, fb: ForwardBatch, pool: MLAKVPool, scale: float) -> torch.Tensor:
        pool.write(layer, fb.out_cache_loc, c_kv, k_rope)
        cache = pool.get_kv(layer)
        if fb.all_decode:  # the kernel contract the fast decode path implements
            return mla_decode_ref(q_latent, q_rope, cache, fb.kv_indptr, fb.kv_indices, scale)
        return mla_extend_ref(q_latent, q_rope, cache, fb.qo_indptr, fb.kv_indptr, fb.kv_indices, scale)

    def mla_as_mha(self, fb: ForwardBatch) -> bool:
        return (self.mla_prefill_as_mha and not fb.all_decode
                and mla_attends_as_mha(fb.prefix_lens_cpu, fb.seq_lens_cpu))

    def mla_store(self, layer: int, c_kv: torch.Tensor, k_rope: torch.Tensor, fb: ForwardBatch,
                  pool: MLAKVPool) -> None:
        pool.write(layer, fb.out_cache_loc, c_kv, k_rope)

    def mla_mha(self, layer: int, q: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch, scale: float) -> torch.Tensor:
        k = torch.cat([k_nope, k_rope[:, None, :].expand(-1, k_nope.shape[1], -1)], dim=-1)   # [K, N, Dn + R]
        return mla_mha_prefill_ref(q, k, v, fb.qo_indptr, fb.kv_indptr, scale)


def _causal_mask(prefix_len: int, num_new: int, device: torch.device) -> torch.Tensor:
    """[n, L] True where new token i (position prefix_len + i) may see KV token j."""
    kv_pos = torch.arange(prefix_len + num_new, device=device)
    q_pos = torch.arange(num_new, device=device) + prefix_len
    return kv_pos[None, :] <= q_pos[:, None]


def _sequences(fb: ForwardBatch):
    """(rows of T, KV slots, prefix_len) of each sequence."""
    q_start, kv_start = 0, 0
    for num_new, seq_len, prefix in zip(fb.extend_lens_cpu, fb.seq_lens_cpu, fb.prefix_lens_cpu):
        yield slice(q_start, q_start + num_new), fb.kv_indices[kv_start:kv_start + seq_len], prefix
        q_start += num_new
        kv_start += seq_len


def paged_mha_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  fb: ForwardBatch, scale: float) -> torch.Tensor:
    """q [T, N, D]; k_cache [S, Hkv, D]; v_cache [S, Hkv, Dv] -> [T, N, Dv]. Query head h reads
    KV head h // (N / Hkv) (GQA)."""
    num_heads, group = q.shape[1], q.shape[1] // k_cache.shape[1]
    out = torch.empty(q.shape[0], num_heads, v_cache.shape[-1], dtype=torch.float32, device=q.device)
    for rows, slots, prefix in _sequences(fb):
        k = k_cache[slots].float().repeat_interleave(group, dim=1)        # [L, N, D]
        v = v_cache[slots].float().repeat_interleave(group, dim=1)        # [L, N, Dv]
        scores = torch.einsum("qnd,knd->nqk", q[rows].float(), k) * scale  # [N, n, L]
        mask = _causal_mask(prefix, rows.stop - rows.start, q.device)
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        out[rows] = torch.einsum("nqk,knd->qnd", probs, v)
    return out.to(q.dtype)
