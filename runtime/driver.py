"""The real-time loop (wall clock): replay arrivals on their timestamps (or all at once), then
schedule -> execute on the GPU/CPU -> commit -> record. The only runtime code that reads a clock.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from tqdm import tqdm

from runtime.core.batch import StepPlan, StepResult
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.core.scheduler import Scheduler


@dataclass
class RealOutcome:
    requests: list[Request]
    steps: StepLog
    elapsed_s: float


def all_at_once(specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """The same requests, all arriving at t=0 (offline throughput runs)."""
    return [dataclasses.replace(s, arrival_s=0.0) for s in specs]


class RealDriver:
    """`as_fast_as_possible`: every request arrives at t=0 (offline throughput), else each is
    added once the wall clock passes its `arrival_s` (measured from the start of the run)."""

    def __init__(self, scheduler: Scheduler, execute: Callable[[StepPlan], StepResult],
                 as_fast_as_possible: bool = False, progress: bool = True, record_plans: bool = False,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> None:
        self.scheduler = scheduler
        self.execute = execute
        self.as_fast_as_possible = as_fast_as_possible
        self.progress = progress
        self.record_plans = record_plans   # keep every plan's signature (parity checks)
        self.clock, self.sleep = clock, sleep

    def run(self, specs: Sequence[RequestSpec]) -> RealOutcome:
        specs = sorted(specs, key=lambda s: (s.arrival_s, s.rid))
        if self.as_fast_as_possible:
            specs = all_at_once(specs)
        sched, steps, done = self.scheduler, StepLog(), []
        if self.record_plans:
            steps.plan_signatures = []
        origin = self.clock()
        now = lambda: self.clock() - origin                   # noqa: E731
        next_idx = 0
        bar = tqdm(total=len(specs), desc="serving", unit="req", disable=not self.progress, mininterval=0.5)
        while True:
            t = now()
            while next_idx < len(specs) and specs[next_idx].arrival_s <= t:
                sched.add(Request.from_spec(specs[next_idx]), t)
                next_idx += 1
            plan = sched.schedule(t)
            finished = sched.pop_finished()
            if plan is not None:
                result = self.execute(plan)
                end = now()
                sched.commit(plan, result, end)
                steps.record(plan, t, end, sched.kv.used_tokens(), len(sched.waiting), len(sched.running))
                finished += sched.pop_finished()
            done.extend(finished)
            bar.update(len(finished))
            if plan is None:
                if next_idx >= len(specs):
                    if sched.has_work():
                        raise RuntimeError("scheduler stalled: work left but no step planned")
                    break
                self.sleep(max(0.0, specs[next_idx].arrival_s - now()))
        bar.close()
        return RealOutcome(done, steps, now())
