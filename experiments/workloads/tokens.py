"""Token-id synthesis: numpy id arrays to tuples of Python ints, and seeded random prompts.

Tuples reuse one int object per vocabulary id (an object array indexed by the ids), which
is several times faster than `ndarray.tolist()` and keeps millions of ids cheap in memory.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class TokenTupleBuilder:
    """Turns int arrays of ids in [0, vocab_size) into tuples of shared Python ints."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._int_objects = np.arange(vocab_size).astype(object)  # [V] Python ints

    def as_list(self, ids: np.ndarray) -> list[int]:
        """Ids [N] as a list; ids must already lie in [0, vocab_size)."""
        return self._int_objects[ids].tolist()

    def split(self, flat_ids: np.ndarray, lengths_tokens: Sequence[int]) -> list[tuple[int, ...]]:
        """Cut `flat_ids` [sum(lengths)] into consecutive tuples of the given lengths."""
        flat = self.as_list(flat_ids)
        out: list[tuple[int, ...]] = []
        start = 0
        for length in lengths_tokens:
            out.append(tuple(flat[start:start + length]))
            start += length
        return out


def random_prompts(rng: np.random.Generator, lengths_tokens: Sequence[int],
                   builder: TokenTupleBuilder) -> list[tuple[int, ...]]:
    """One random prompt per length (each >= 1), ids uniform in [0, vocab_size).

    The first tokens are distinct (a prefix of one random permutation of the vocabulary)
    while there are no more prompts than vocabulary ids, so no two prompts share even one
    leading token by accident: a radix cache sees no sharing the workload did not intend.
    Prefix-stable: the first k prompts do not depend on how many more lengths follow.
    """
    lengths = np.asarray(lengths_tokens, dtype=np.int64)
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"prompt lengths must be >= 1, got min {lengths.min()}")
    heads = rng.permutation(builder.vocab_size)  # drawn first: its cost does not depend on lengths
    flat = rng.integers(0, builder.vocab_size, size=int(lengths.sum()))
    if 0 < lengths.size <= builder.vocab_size:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        flat[starts] = heads[:lengths.size]
    return builder.split(flat, lengths.tolist())


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
