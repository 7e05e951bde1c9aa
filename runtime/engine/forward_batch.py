"""The tensors of one forward step over the paged KV pool, built from a core StepPlan (or plain lists in tests).

Legend: T = new tokens in the step (all sequences), B = sequences, K = sum of seq_lens (KV tokens attended).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from runtime.core.batch import StepPlan


@dataclass
class ForwardBatch:
    """Sequence b owns new-token rows qo_indptr[b]:qo_indptr[b+1] of the T axis, at positions
    prefix_lens[b] + 0..extend_lens[b]-1; its KV (prefix then new) sits at slots
    kv_indices[kv_indptr[b]:kv_indptr[b+1]]. New tokens' KV is written to out_cache_loc before
    attention reads it. The `*_cpu` lists mirror the small per-sequence tensors so host code
    (reference kernels, planners) needs no device sync."""

    input_ids: torch.Tensor       # [T] long
    positions: torch.Tensor       # [T] long
    out_cache_loc: torch.Tensor   # [T] long, KV slot each new token writes
    seq_lens: torch.Tensor        # [B] long, KV length after this step (prefix + new)
    prefix_lens: torch.Tensor     # [B] long, tokens already in the pool
    extend_lens: torch.Tensor     # [B] long, new tokens (decode = 1)
    qo_indptr: torch.Tensor       # [B + 1] int32, CSR offsets of each sequence's rows in T
    kv_indptr: torch.Tensor       # [B + 1] int32, CSR offsets into kv_indices
    kv_indices: torch.Tensor      # [K] int32, slots of every token of every sequence (FlashInfer's dtype)
    logits_indices: torch.Tensor  # [B] long, row in T of each sequence's last new token
    is_decode: torch.Tensor       # [B] bool, one new token appended after a non-empty prefix
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    attn_backend: Any = None      # AttentionBackend; None means the torch reference

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.extend_lens_cpu))

    @property
    def all_decode(self) -> bool:
        return all(n == 1 and p > 0 for n, p in zip(self.extend_lens_cpu, self.prefix_lens_cpu))

    @classmethod
    def build(
        cls,
        seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]],
        device: torch.device | str,
        is_decode: Sequence[bool] | None = None,
    ) -> "ForwardBatch":
        """seqs: per sequence (new token ids, prefix_len, all_slots) where all_slots lists the KV
        slot of each of its prefix_len + len(new) tokens, prefix first."""
        ids: list[int] = []
        positions: list[int] = []
        out_loc: list[int] = []
        kv_indices: list[int] = []
        prefix_lens, extend_lens, seq_lens = [], [], []
        for new_ids, prefix_len, slots in seqs:
            num_new = len(new_ids)
            if num_new == 0 or len(slots) != prefix_len + num_new:
                raise ValueError(f"need >= 1 new token and prefix+new slots; got {num_new} new, "
                                 f"prefix {prefix_len}, {len(slots)} slots")
            ids.extend(new_ids)
            positions.extend(range(prefix_len, prefix_len + num_new))
            out_loc.extend(slots[prefix_len:])
            kv_indices.extend(slots)
            prefix_lens.append(prefix_len)
            extend_lens.append(num_new)
            seq_lens.append(prefix_len + num_new)
        qo_indptr = _cumsum0(extend_lens)
        if is_decode is None:
            is_decode = [n == 1 and p > 0 for n, p in zip(extend_lens, prefix_lens)]

        def long(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return cls(
            input_ids=long(ids),
            positions=long(positions),
            out_cache_loc=long(out_loc),
            seq_lens=long(seq_lens),
            prefix_lens=long(prefix_lens),
            extend_lens=long(extend_lens),
            qo_indptr=torch.tensor(qo_indptr, dtype=torch.int32, device=device),
            kv_indptr=torch.tensor(_cumsum0(seq_lens), dtype=torch.int32, device=device),
            kv_indices=torch.tensor(kv_indices, dtype=torch.int32, device=device),
            logits_indices=long([end - 1 for end in qo_indptr[1:]]),
            is_decode=torch.tensor(list(is_decode), dtype=torch.bool, device=device),
            seq_lens_cpu=seq_lens,
            prefix_lens_cpu=prefix_lens,
            extend_lens_cpu=extend_lens,
        )

    @classmethod
    def from_plan(cls, plan: "StepPlan", device: torch.device | str) -> "ForwardBatch":
        """One sequence per scheduled item, in plan order: the new tokens are
        fill_ids[prefix:prefix+new], the prefix KV is request.kv_slots[:prefix]."""
        seqs = []
        for item in plan.items:
            req, start = item.request, item.num_prefix_tokens
            new_ids = req.fill_ids[start:start + item.num_new_tokens]
            seqs.append((new_ids, start, list(req.kv_slots[:start]) + list(item.new_slots)))
        return cls.build(seqs, device, is_decode=[it.is_decode for it in plan.items])


def _cumsum0(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out
