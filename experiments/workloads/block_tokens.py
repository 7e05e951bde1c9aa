"""Tokens for traces that give only prefix-block hashes (Mooncake): same hash id, same tokens.

Block `h` is the window pool[offset(h) : offset(h) + block_size] of one seeded random pool (int32),
with offset(h) = (h * ODD + seed_shift) mod num_windows, a bijection on [0, num_windows):
distinct hash ids get distinct windows, hence (up to chance 1/vocab per token) different
tokens. Slicing a pool tuple is far faster than hashing every token.
"""
from __future__ import annotations

from array import array
from typing import Sequence

import numpy as np

from experiments.workloads.arrivals import rng_for
from experiments.workloads.tokens import POOL_WINDOWS, window_offsets


class BlockTokenSynthesizer:
    """Deterministic tokens per (hash id, seed, vocab_size, block_size).

    num_windows = max(2^16, smallest power of two > max_hash_id), so ids in [0, max_hash_id]
    never alias each other. The tokens of an id depend on num_windows, i.e. on the trace's
    largest hash id (not on num_requests: the caller passes the whole file's maximum).
    """

    def __init__(self, vocab_size: int, block_size_tokens: int, seed: int, max_hash_id: int) -> None:
        if block_size_tokens < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size_tokens}")
        self.block_size_tokens = block_size_tokens
        self.num_windows = max(POOL_WINDOWS, 1 << max(0, int(max_hash_id)).bit_length())
        rng = rng_for(seed, "block_tokens")
        self._shift = int(rng.integers(0, POOL_WINDOWS))
        draws = rng.integers(0, vocab_size, size=self.num_windows + block_size_tokens)   # as tokens.random_pool
        self._pool = array("i", draws.astype(np.int32).tobytes())

    def offsets(self, hash_ids: np.ndarray) -> np.ndarray:
        """Pool offsets [N] of the given (non-negative) hash ids [N]."""
        return window_offsets(hash_ids, self._shift, self.num_windows)

    def prompt(self, block_offsets: Sequence[int], num_tokens: int) -> array:
        """The tokens of a prompt made of the given blocks, the last one cut so that the
        prompt has `num_tokens` tokens: len(block_offsets) == ceil(num_tokens / block_size).
        An int32 array (RequestSpec.input_ids): block copies are memcpy, and requests share it."""
        block = self.block_size_tokens
        pool = self._pool
        tokens = array("i")
        for offset in block_offsets[:-1]:
            tokens += pool[offset:offset + block]
        last_tokens = num_tokens - block * (len(block_offsets) - 1)
        last = block_offsets[-1]
        tokens += pool[last:last + last_tokens]
        return tokens
