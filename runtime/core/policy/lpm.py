"""Longest prefix match: admit the requests with the most cached tokens first (SGLang's `lpm`),
with in-batch prefix caching; plain FCFS when the queue is too long for matching to pay off.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.policy.base import MatchFn, by_arrival
from runtime.core.policy.in_batch_prefix import held_back
from runtime.core.request import Request


class LPMPolicy:
    preemption_threshold: int | None = None
    stateless_order = True    # same queue and cache -> same order (no hidden state)

    def __init__(self, max_queue_for_matching: int = 128, in_batch_prefix_threshold_tokens: int = 32) -> None:
        self.max_queue_for_matching = max_queue_for_matching
        self.in_batch_prefix_threshold_tokens = in_batch_prefix_threshold_tokens

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        queue = by_arrival(waiting)
        if len(queue) > self.max_queue_for_matching:
            return queue
        for req in queue:
            match(req)
        held = held_back(queue, self.in_batch_prefix_threshold_tokens)
        # held-back requests wait a step; longest match first, ties in arrival order (stable sort)
        return sorted((r for r in queue if r not in held), key=lambda r: -r.prefix_match_len)
