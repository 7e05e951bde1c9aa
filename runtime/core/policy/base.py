"""The schedule-policy contract: order the waiting queue before admission.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from typing import Callable, Protocol

from runtime.core.cache.radix_cache import MatchResult
from runtime.core.request import Request

MatchFn = Callable[[Request], MatchResult]


class SchedulePolicy(Protocol):
    """`order(waiting, match, now)` returns every waiting request once, in the order admission
    should try them this step (SGLang's SchedulePolicy.calc_priority). `waiting` comes in arrival
    order (the scheduler keeps its queue so; ties in insertion order) and is not to be mutated:
    return a new list. It mutates no request;
    cache-aware policies call `match(req)` for each request's cached prefix (the scheduler
    reuses those matches for admission in the same step).

    `cache_aware`: the order depends on the radix cache (lpm, dfs_weight); with the cache
    disabled the scheduler orders FCFS instead, as SGLang does.
    `stateless_order`: the order depends only on the queue and the cache (no generator or other
    hidden state), so the simulator may replay it when it fast-forwards while requests wait.
    `preemption_threshold`: None, or the importance gap at which a waiting request may retract a
    running one; `importance(req)`: larger is more important (priority preemption)."""

    cache_aware: bool
    stateless_order: bool
    preemption_threshold: int | None

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        ...

    def importance(self, req: Request) -> int:
        ...


class PolicyDefaults:
    """What most policies share: cache-agnostic, stateless, no preemption, importance = priority."""

    cache_aware = False
    stateless_order = True
    preemption_threshold: int | None = None

    def importance(self, req: Request) -> int:
        return req.priority


def effective_policy(policy: SchedulePolicy, cache_enabled: bool) -> SchedulePolicy:
    """The policy the scheduler runs: a cache-aware one becomes FCFS when the radix cache is
    disabled (SGLang's SchedulePolicy._validate_and_adjust_policy)."""
    if policy.cache_aware and not cache_enabled:
        from runtime.core.policy.fcfs import FCFSPolicy
        return FCFSPolicy()
    return policy

