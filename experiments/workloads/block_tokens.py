"""Tokens for traces that give only prefix-block hashes (Mooncake): same hash id, same tokens.

Block `h` is the window pool[offset(h) : offset(h) + block_size] of one seeded random pool,
with offset(h) = (h * ODD + seed_shift) mod pool_size, a bijection on [0, pool_size): distinct
hash ids below pool_size get distinct windows, hence (up to chance 1/vocab per token)
different tokens. Slicing a pool list is far faster than hashing every token.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from experiments.workloads.arrivals import rng_for
from experiments.workloads.tokens import TokenTupleBuilder

MIN_POOL_SIZE = 1 << 20           # hash ids below this never alias one another
_OFFSET_MULTIPLIER = 0x9E3779B1   # odd, so h -> h * M mod 2^k is a bijection


class BlockTokenSynthesizer:
    """Deterministic tokens per (hash id, seed, vocab_size, block_size).

    pool_size = max(2^20, smallest power of two > max_hash_id), so ids in [0, max_hash_id]
    never alias each other; while max_hash_id < 2^20 the tokens of an id do not depend on it.
    """

    def __init__(self, vocab_size: int, block_size_tokens: int, seed: int, max_hash_id: int) -> None:
        if block_size_tokens < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size_tokens}")
        self.block_size_tokens = block_size_tokens
        self.pool_size = max(MIN_POOL_SIZE, 1 << max(0, int(max_hash_id)).bit_length())
        rng = rng_for(seed, "block_tokens")
        self._shift = int(rng.integers(0, self.pool_size))
        ids = rng.integers(0, vocab_size, size=self.pool_size + block_size_tokens)
        self._pool = TokenTupleBuilder(vocab_size).as_list(ids)  # [pool + block] Python ints

    def offsets(self, hash_ids: np.ndarray) -> np.ndarray:
        """Pool offsets of the given (non-negative) hash ids."""
        mask = self.pool_size - 1
        return (hash_ids.astype(np.uint64) * np.uint64(_OFFSET_MULTIPLIER) + np.uint64(self._shift)) & np.uint64(mask)

    def prompt(self, block_offsets: Sequence[int], num_tokens: int) -> tuple[int, ...]:
        """The tokens of a prompt made of the given blocks, the last one cut so that the
        prompt has `num_tokens` tokens: len(block_offsets) == ceil(num_tokens / block_size)."""
        block = self.block_size_tokens
        pool = self._pool
        tokens: list[int] = []
        for offset in block_offsets[:-1]:
            tokens += pool[offset:offset + block]
        last_tokens = num_tokens - block * (len(block_offsets) - 1)
        last = block_offsets[-1]
        tokens += pool[last:last + last_tokens]
        return tuple(tokens)
