"""Round-robin DP routing: replica 0, 1, ..., n-1, 0, ... regardless of load or content
(SGLang's default `--load-balance-method` for `--dp-size`). Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.request import RequestSpec
from runtime.core.router.base import InFlightCounts


class RoundRobinRouter:
    def __init__(self, num_replicas: int) -> None:
        self.in_flight = InFlightCounts(num_replicas)
        self.num_replicas = num_replicas
        self._next = 0

    def route(self, spec: RequestSpec, now: float) -> int:
        replica = self._next
        self._next = (self._next + 1) % self.num_replicas
        return self.in_flight.add(replica)

    def finish(self, replica: int) -> None:
        self.in_flight.remove(replica)
