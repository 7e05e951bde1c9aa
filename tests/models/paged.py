"""A tiny stand-in for the scheduler in model tests: shuffled slot allocation and one-call steps."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.kv_pool import create_kv_pool
from runtime.models.base import CausalLM


@dataclass
class Seq:
    """Tokens whose KV is in the pool (`ids[:len(slots)]`) and their slots."""

    ids: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)


class PagedRunner:
    """Owns a KV pool whose free slots are handed out in a shuffled order (non-contiguous KV)."""

    def __init__(self, model: CausalLM, num_slots: int = 512, seed: int = 0):
        self.model = model
        self.pool = create_kv_pool(model.config, num_slots, model.dtype, model.device)
        self.free = random.Random(seed).sample(range(num_slots), num_slots)

    def alloc(self, n: int) -> list[int]:
        return [self.free.pop() for _ in range(n)]

    def batch(self, work: list[tuple[Seq, list[int]]]) -> ForwardBatch:
        """work: (sequence, new token ids) per sequence; appends the tokens and their new slots."""
        seqs = []
        for seq, new_ids in work:
            prefix = len(seq.slots)
            seq.ids.extend(new_ids)
            seq.slots.extend(self.alloc(len(new_ids)))
            seqs.append((new_ids, prefix, list(seq.slots)))
        return ForwardBatch.build(seqs, self.model.device)

    def step(self, work: list[tuple[Seq, list[int]]]) -> torch.Tensor:
        """Logits [B, V] of each sequence's last new token."""
        return self.model(self.batch(work), self.pool)

    def step_all(self, work: list[tuple[Seq, list[int]]]) -> torch.Tensor:
        """Logits [T, V] of every new token."""
        return self.model.compute_logits(self.model.hidden_states(self.batch(work), self.pool))

    def share_prefix(self, source: Seq, num_tokens: int) -> Seq:
        """A new sequence whose first num_tokens reuse source's KV slots (a radix-cache hit)."""
        return Seq(ids=source.ids[:num_tokens], slots=source.slots[:num_tokens])
