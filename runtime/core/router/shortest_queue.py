"""Shortest-queue DP routing: the replica with the fewest requests in flight (waiting plus
running), ties to the lowest index (SGLang's `--load-balance-method shortest_queue`).

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.request import RequestSpec
from runtime.core.router.base import InFlightCounts


class ShortestQueueRouter:
    def __init__(self, num_replicas: int) -> None:
        self.in_flight = InFlightCounts(num_replicas)
        self.num_replicas = num_replicas

    def route(self, spec: RequestSpec, now: float) -> int:
        return self.in_flight.add(self.in_flight.least_loaded())

    def finish(self, replica: int) -> None:
        self.in_flight.remove(replica)
