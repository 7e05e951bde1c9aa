"""In-batch prefix caching (SGLang): among requests whose cached prefix is short, keep one of each
group that shares a long prefix and hold the others back, so they hit the cache next step.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.request import Request


def held_back(ordered: list[Request], threshold_tokens: int) -> set[Request]:
    """Requests to hold back this step: one whose cached match is <= threshold_tokens and whose
    first `threshold_tokens` tokens equal those of an earlier such request in `ordered`.
    (Sharing >= threshold tokens with an earlier request is exactly having the same first
    `threshold_tokens` tokens, so a set of prefixes is all the bookkeeping needed.)"""
    held: set[Request] = set()
    if threshold_tokens <= 0:
        return held
    seen: set[tuple[int, ...]] = set()
    for req in ordered:
        if req.prefix_match_len > threshold_tokens or len(req.input_ids) < threshold_tokens:
            continue
        head = tuple(req.input_ids[:threshold_tokens])
        if head in seen:
            held.add(req)
        else:
            seen.add(head)
    return held
