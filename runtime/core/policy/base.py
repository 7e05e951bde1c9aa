"""The schedule-policy contract: order the waiting queue before admission.

Must not import torch, simpy or time.
"""
from __future__ import annotations

import operator
from typing import Callable, Protocol

from runtime.core.cache.radix_cache import MatchResult
from runtime.core.request import Request

MatchFn = Callable[[Request], MatchResult]


class SchedulePolicy(Protocol):
    """`order(waiting, match, now)` returns the waiting requests admission should try this step,
    in order. Requests left out wait for a later step (in-batch prefix caching holds some back);
    none may appear twice. It must not mutate the requests, except that
    calling `match(req)` stores the cached-prefix length in `req.prefix_match_len` (cache-aware
    policies call it; the scheduler reuses the matches made in the same step).

    `stateless_order`: calling `order` twice on the same queue and cache gives the same result
    and changes nothing (lets the simulator fast-forward while requests wait).
    `preemption_threshold`: None, or the priority gap at which a waiting request may retract a
    running one (only the priority policy sets it)."""

    preemption_threshold: int | None
    stateless_order: bool   # True: order() has no side effects (the simulator may replay it)

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        ...


_ARRIVAL = operator.attrgetter("arrival_s")


def by_arrival(waiting: list[Request]) -> list[Request]:
    """First come, first served; stable on equal arrival times (the queue's insertion order).
    (The scheduler keeps its queue in this order, so this is a linear pass in practice.)"""
    return sorted(waiting, key=_ARRIVAL)
