"""First come, first served: admit in arrival order (a retracted request keeps its place).

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.policy.base import MatchFn, by_arrival
from runtime.core.request import Request


class FCFSPolicy:
    preemption_threshold: int | None = None
    stateless_order = True    # same queue and cache -> same order (no hidden state)

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        return by_arrival(waiting)
