"""The DP-router contract: which data-parallel replica serves a request, and the per-replica
count of requests in flight that every policy's load signal comes from.

Must not import torch, simpy or time: the arrival time comes in as `now`.
"""
from __future__ import annotations

from typing import Protocol

from runtime.core.request import RequestSpec


class Router(Protocol):
    """Routes each arriving request to one of `num_replicas` replicas (0..num_replicas-1).

    `route(spec, now)` picks the replica and counts the request in flight there (mutates the
    router's state); the caller must hand the request to that replica. `finish(replica)` is
    called once per routed request when it leaves its replica (finished or aborted), so loads
    drop. Routers never look inside the replicas: like sglang-router, they see only what they
    routed and what came back.
    """

    num_replicas: int

    def route(self, spec: RequestSpec, now: float) -> int:
        ...

    def finish(self, replica: int) -> None:
        ...


class InFlightCounts:
    """Requests routed to each replica and not yet finished (sglang-router's running queue)."""

    def __init__(self, num_replicas: int) -> None:
        if num_replicas < 1:
            raise ValueError(f"a router needs at least one replica, got num_replicas={num_replicas}")
        self.counts = [0] * num_replicas

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, replica: int) -> int:
        self.counts[replica] += 1
        return replica

    def remove(self, replica: int) -> None:
        if self.counts[replica] <= 0:
            raise ValueError(f"replica {replica} has no request in flight to finish")
        self.counts[replica] -= 1

    def least_loaded(self, candidates: list[int] | None = None) -> int:
        """The candidate (default: every replica) with the fewest in flight; ties: lowest index."""
        pool = range(len(self.counts)) if candidates is None else candidates
        return min(pool, key=lambda r: (self.counts[r], r))
