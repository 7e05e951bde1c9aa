"""First come, first served: admit in arrival order (a retracted request keeps its place).

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.policy.base import MatchFn, PolicyDefaults
from runtime.core.request import Request


class FCFSPolicy(PolicyDefaults):
    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        return list(waiting)                # the scheduler keeps it in arrival order
