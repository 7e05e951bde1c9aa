"""Working set of a workload: how many KV tokens a prefix cache must hold never to miss a
reusable prefix. The eviction study sizes caches as fractions of it. Torch-free.
"""
from __future__ import annotations

from typing import Sequence

from runtime.core.request import RequestSpec


def working_set_tokens(specs: Sequence[RequestSpec], page_tokens: int = 64) -> int:
    """Distinct tokens over every request's whole sequence (prompt, then its output): prefixes
    shared by several requests count once. Sequences are compared in pages of `page_tokens`, a
    page being identified by everything before it, as in a radix tree. Outputs without known
    ids (`expected_output_ids`) are unique to their request."""
    if page_tokens < 1:
        raise ValueError(f"page_tokens must be >= 1, got {page_tokens}")
    seen: set[int] = set()
    total_tokens = 0
    for spec in specs:
        expected = list(spec.expected_output_ids or ())
        sequence = list(spec.input_ids) + expected
        prefix_hash = 0
        for start in range(0, len(sequence), page_tokens):
            page = tuple(sequence[start:start + page_tokens])
            prefix_hash = hash((prefix_hash, page))
            if prefix_hash not in seen:
                seen.add(prefix_hash)
                total_tokens += len(page)
        total_tokens += max(spec.output_len - len(expected), 0)
    return total_tokens
