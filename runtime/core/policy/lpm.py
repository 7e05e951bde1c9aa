"""Longest prefix match: admit the requests with the most cached tokens first (SGLang's `lpm`),
with in-batch prefix caching; plain FCFS when the queue is too long for matching to pay off.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.policy.base import MatchFn, PolicyDefaults
from runtime.core.policy.in_batch_prefix import deprioritized
from runtime.core.request import Request


class LPMPolicy(PolicyDefaults):
    """SGLang's `_sort_by_longest_prefix`: longest match first, ties in arrival order; requests
    deprioritized by in-batch prefix caching go last (in arrival order) but are still tried.
    More than `max_queue_for_matching` waiting requests (SGLang: 128): FCFS, no matching."""

    cache_aware = True

    def __init__(self, max_queue_for_matching: int | None = 128, in_batch_prefix_threshold_tokens: int = 32) -> None:
        self.max_queue_for_matching = max_queue_for_matching
        self.in_batch_prefix_threshold_tokens = in_batch_prefix_threshold_tokens

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        queue = list(waiting)
        if self.max_queue_for_matching is not None and len(queue) > self.max_queue_for_matching:
            return queue
        lengths = {req: match(req).length for req in queue}
        moved = deprioritized(queue, lengths, self.in_batch_prefix_threshold_tokens)
        last = float("inf")
        return sorted(queue, key=lambda r: last if r in moved else -lengths[r])
