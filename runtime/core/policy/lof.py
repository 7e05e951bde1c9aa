"""Longest output first: admit requests with the largest max_new_tokens first (SGLang's `lof`).

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.policy.base import MatchFn, PolicyDefaults
from runtime.core.request import Request


class LOFPolicy(PolicyDefaults):
    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        return sorted(waiting, key=lambda r: -r.sampling.max_new_tokens)   # stable: ties by arrival
