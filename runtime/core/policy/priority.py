"""Priority scheduling: most important first, then arrival. A waiting request may preempt
(retract) running requests whose priority is lower by at least `preemption_threshold`.

By default a larger `priority` value is more important (SGLang's default); set
`low_value_first=True` for the opposite. Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.policy.base import MatchFn, PolicyDefaults
from runtime.core.request import Request


class PriorityPolicy(PolicyDefaults):
    def __init__(self, preemption_threshold: int | None = 10, low_value_first: bool = False) -> None:
        self.preemption_threshold = preemption_threshold
        self.low_value_first = low_value_first

    def importance(self, req: Request) -> int:
        return -req.priority if self.low_value_first else req.priority

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        return sorted(waiting, key=lambda r: -self.importance(r))   # stable: ties by arrival
