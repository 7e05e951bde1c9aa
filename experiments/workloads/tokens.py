"""Token-id synthesis: numpy ids to tuples of Python ints, and seeded random prompts.

Tuples reuse one int object per vocabulary id (an object array indexed by the ids), which
is several times faster than `ndarray.tolist()` and keeps millions of ids cheap in memory.
Random prompts are windows of one seeded random pool: a tuple slice per prompt, no per-token work.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

POOL_WINDOWS = 1 << 16            # distinct window offsets of a random pool (grows if needed)
_OFFSET_MULTIPLIER = 0x9E3779B1   # odd, so i -> i * M mod 2^k is a bijection


class TokenTupleBuilder:
    """Turns int arrays of ids in [0, vocab_size) into lists of shared Python ints."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._int_objects = np.arange(vocab_size).astype(object)  # [V] Python ints

    def as_list(self, ids: np.ndarray) -> list[int]:
        """Ids [N] as a list; ids must already lie in [0, vocab_size)."""
        return self._int_objects[ids].tolist()


def random_pool(rng: np.random.Generator, vocab_size: int, num_tokens: int) -> tuple[int, ...]:
    """num_tokens ids uniform in [0, vocab_size); prefix-stable in num_tokens."""
    return tuple(TokenTupleBuilder(vocab_size).as_list(rng.integers(0, vocab_size, size=num_tokens)))


def window_offsets(indices: np.ndarray, shift: int, num_windows: int) -> np.ndarray:
    """(index * odd + shift) mod num_windows (a power of two): distinct for distinct indices
    below num_windows. Overlapping windows are harmless: a radix cache compares tokens at
    equal positions, and those are independent draws."""
    mixed = indices.astype(np.uint64) * np.uint64(_OFFSET_MULTIPLIER) + np.uint64(shift)
    return (mixed & np.uint64(num_windows - 1)).astype(np.int64)


def random_prompts(rng: np.random.Generator, lengths_tokens: Sequence[int], vocab_size: int) -> list[tuple[int, ...]]:
    """One seeded pseudo-random prompt per length (each >= 1), ids in [0, vocab_size).

    Prompt i is (head_i,) + pool[o_i + 1 : o_i + len_i] with distinct window offsets o_i;
    the heads of the first vocab_size prompts are distinct (a permutation of the
    vocabulary), so no two prompts share even one leading token: a radix cache sees no
    sharing the workload did not intend. Prefix-stable: the first k prompts do not depend
    on how many lengths follow (up to 2^16 prompts; beyond, the window count grows).
    """
    lengths = np.asarray(lengths_tokens, dtype=np.int64)
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"prompt lengths must be >= 1, got min {lengths.min()}")
    heads = rng.permutation(vocab_size).tolist()  # fixed draw sizes first: prefix-stable
    shift = int(rng.integers(0, POOL_WINDOWS))
    num_windows = max(POOL_WINDOWS, 1 << max(lengths.size - 1, 0).bit_length())
    longest = int(lengths.max()) if lengths.size else 1
    pool = random_pool(rng, vocab_size, num_windows + longest)
    offsets = window_offsets(np.arange(lengths.size), shift, num_windows).tolist()
    prompts = []
    for i, (offset, length) in enumerate(zip(offsets, lengths.tolist())):
        if i < vocab_size:
            prompts.append((heads[i],) + pool[offset + 1:offset + length])
        else:
            prompts.append(pool[offset:offset + length])
    return prompts


def uniform_lengths(rng: np.random.Generator, num: int, max_len_tokens: int, range_ratio: float) -> np.ndarray:
    """Lengths [num] uniform in [max(1, int(max_len * range_ratio)), max_len], as SGLang's
    random dataset draws them (range_ratio 1 = fixed length)."""
    check_length_args(max_len_tokens, range_ratio)
    low = max(1, int(max_len_tokens * range_ratio))
    return rng.integers(low, max_len_tokens + 1, size=num)


def check_length_args(max_len_tokens: int, range_ratio: float) -> None:
    """ValueError unless max_len_tokens >= 1 and 0 <= range_ratio <= 1."""
    if max_len_tokens < 1:
        raise ValueError(f"length must be >= 1, got {max_len_tokens}")
    if not 0 <= range_ratio <= 1:
        raise ValueError(f"range_ratio must be in [0, 1], got {range_ratio}")
