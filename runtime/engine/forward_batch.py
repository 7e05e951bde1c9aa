"""The tensors of one forward step over the paged KV pool, built from a core StepPlan (or plain lists in tests).

Legend: T = new tokens in the step (all sequences), B = sequences, K = sum of seq_lens (KV tokens attended).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
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
        for new_ids, prefix_len, slots in seqs:
            _check_counts(len(new_ids), prefix_len, len(slots))
        return cls._assemble(
            new_ids=[s[0] for s in seqs], prefix_lens=[s[1] for s in seqs],
            kv_parts=[s[2] for s in seqs], out_parts=[s[2][s[1]:] for s in seqs],
            is_decode=is_decode, device=device)

    @classmethod
    def from_plan(cls, plan: "StepPlan", device: torch.device | str) -> "ForwardBatch":
        """One sequence per scheduled item, in plan order: the new tokens are
        fill_ids[prefix:prefix+new], the prefix KV is request.kv_slots[:prefix]."""
        new_ids, prefix_lens, kv_parts = [], [], []
        for item in plan.items:
            req, start, num_new = item.request, item.num_prefix_tokens, item.num_new_tokens
            ids = _fill_slice(req.input_ids, req.output_ids, start, num_new)
            _check_counts(len(ids), start, min(len(req.kv_slots), start) + len(item.new_slots),
                          num_new_slots=len(item.new_slots))
            new_ids.append(ids)
            prefix_lens.append(start)
            slots = req.kv_slots
            if len(slots) == start + num_new and np.array_equal(slots[start:], item.new_slots):
                kv_parts.append(slots)          # already prefix + new (the usual case): no slice copy
            else:
                kv_parts += (slots[:start], item.new_slots)
        return cls._assemble(new_ids, prefix_lens, kv_parts, [it.new_slots for it in plan.items],
                             [it.is_decode for it in plan.items], device)

    @classmethod
    def _assemble(cls, new_ids: Sequence[Sequence[int]], prefix_lens: list[int],
                  kv_parts: Sequence[Sequence[int]] | None, out_parts: Sequence[Sequence[int]],
                  is_decode: Sequence[bool] | None, device: torch.device | str,
                  device_kv_indices=None) -> "ForwardBatch":
        """Per-token lists go through numpy (np.fromiter, no Python loop per token); all long fields
        travel to the device in one copy, the int32 ones in another (pinned, async on CUDA).
        `device_kv_indices(kv_indptr_device, num_kv_tokens, max_seq_len)`, when given, builds
        kv_indices on the device (then `kv_parts` is unused and no per-KV-token host work happens)."""
        extend_lens = [len(ids) for ids in new_ids]
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
        num_seqs, num_tokens, num_kv = len(prefix_lens), sum(extend_lens), sum(seq_lens)
        if is_decode is None:
            is_decode = [n == 1 and p > 0 for n, p in zip(extend_lens, prefix_lens)]
        qo_indptr = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(extend_lens, out=qo_indptr[1:])
        kv_indptr = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(seq_lens, out=kv_indptr[1:])
        prefix = np.asarray(prefix_lens, dtype=np.int64)
        # long fields packed: ids | positions | out_loc [T each] | seq | prefix | extend | logits rows [B each]
        longs = np.empty(3 * num_tokens + 4 * num_seqs, dtype=np.int64)
        ids, positions, out_loc, per_seq = np.split(longs, [num_tokens, 2 * num_tokens, 3 * num_tokens])
        ids[:] = np.fromiter(chain.from_iterable(new_ids), dtype=np.int64, count=num_tokens)
        out_loc[:] = np.fromiter(chain.from_iterable(out_parts), dtype=np.int64, count=num_tokens)
        # position of token t of sequence b: prefix[b] + (t - qo_indptr[b])
        positions[:] = np.arange(num_tokens) + np.repeat(prefix - qo_indptr[:-1], extend_lens)
        per_seq[:] = np.concatenate([kv_indptr[1:] - kv_indptr[:-1], prefix, extend_lens, qo_indptr[1:] - 1])
        # int32 fields packed: qo_indptr [B + 1] | kv_indptr [B + 1] (| kv_indices [K] when built here)
        host_kv = 0 if device_kv_indices is not None else num_kv
        int32s = np.empty(2 * (num_seqs + 1) + host_kv, dtype=np.int32)
        int32s[:num_seqs + 1] = qo_indptr
        int32s[num_seqs + 1:2 * (num_seqs + 1)] = kv_indptr
        if host_kv:
            int32s[2 * (num_seqs + 1):] = np.fromiter(chain.from_iterable(kv_parts), dtype=np.int32, count=num_kv)
        long_t = _to_device(longs, device)
        int32_t = _to_device(int32s, device)
        seq_t, prefix_t, extend_t, logits_t = long_t[3 * num_tokens:].split(num_seqs)
        kv_indptr_t = int32_t[num_seqs + 1:2 * (num_seqs + 1)]
        if device_kv_indices is not None:
            kv_indices_t = device_kv_indices(kv_indptr_t, num_kv, max(seq_lens, default=0))
        else:
            kv_indices_t = int32_t[2 * (num_seqs + 1):]
        return cls(
            input_ids=long_t[:num_tokens],
            positions=long_t[num_tokens:2 * num_tokens],
            out_cache_loc=long_t[2 * num_tokens:3 * num_tokens],
            seq_lens=seq_t,
            prefix_lens=prefix_t,
            extend_lens=extend_t,
            qo_indptr=int32_t[:num_seqs + 1],
            kv_indptr=kv_indptr_t,
            kv_indices=kv_indices_t,
            logits_indices=logits_t,
            is_decode=_to_device(np.asarray(list(is_decode), dtype=np.bool_), device),
            seq_lens_cpu=seq_lens,
            prefix_lens_cpu=list(prefix_lens),
            extend_lens_cpu=extend_lens,
        )


def _check_counts(num_new: int, prefix_len: int, num_slots: int, num_new_slots: int | None = None) -> None:
    if num_new == 0 or num_slots != prefix_len + num_new or num_new_slots not in (None, num_new):
        raise ValueError(f"need >= 1 new token and prefix+new slots; got {num_new} new, "
                         f"prefix {prefix_len}, {num_slots} slots")


def _fill_slice(input_ids: Sequence[int], output_ids: list[int], start: int, count: int) -> Sequence[int]:
    """(input_ids + output_ids)[start:start + count] without concatenating the whole history
    (the prompt may be a tuple or a list; a slice across both is a list)."""
    num_input = len(input_ids)
    if start >= num_input:
        return output_ids[start - num_input:start - num_input + count]
    head = input_ids[start:start + count]
    return [*head, *output_ids[:count - len(head)]] if len(head) < count else head


def _to_device(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """One host-to-device copy; on CUDA staged through pinned memory (the caching host allocator
    keeps the block until the async copy is done), so it does not block the host."""
    tensor = torch.from_numpy(array)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def cpu_int32(values: list[int]) -> torch.Tensor:
    """A small host list as the int32 CPU tensor FlashInfer's planners take: pinned where CUDA is
    present, so the planners' non_blocking uploads of it never wait for the stream (a copy from
    pageable memory may wait until the device has finished the work queued before it)."""
    return torch.tensor(values, dtype=torch.int32, pin_memory=torch.cuda.is_available())


def indptr(lengths: list[int]) -> list[int]:
    """CSR offsets [0, l0, l0 + l1, ...] of per-sequence lengths (host)."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out
