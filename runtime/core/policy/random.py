"""Random order from a seeded generator (SGLang's `random`), reproducible run to run.

Must not import torch, simpy or time.
"""
from __future__ import annotations

import random as _random

from runtime.core.policy.base import MatchFn, PolicyDefaults
from runtime.core.request import Request


class RandomPolicy(PolicyDefaults):
    stateless_order = False   # its generator advances on every call

    def __init__(self, seed: int = 0) -> None:
        self.rng = _random.Random(seed)

    def order(self, waiting: list[Request], match: MatchFn, now: float) -> list[Request]:
        queue = list(waiting)
        self.rng.shuffle(queue)
        return queue
