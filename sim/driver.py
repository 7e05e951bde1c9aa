"""The SimPy loop (simulated clock): feed arrivals to the scheduler, advance time by each plan's
predicted duration, commit, record. The only simulator code that knows which clock runs.

Ties: arrivals at time t are added before the step that starts at t (fixed order, deterministic).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import simpy
from tqdm import tqdm

from runtime.core.batch import ForwardMode
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.core.scheduler import Scheduler
from sim.executor import SimExecutor


@dataclass
class SimOutcome:
    requests: list[Request]     # every request, finished or aborted
    steps: StepLog
    sim_time_s: float


class SimDriver:
    """`fast_forward`: coalesce runs of decode steps that provably change nothing but token counts
    (Scheduler.decode_run_bound) into one event; the records are the same as stepping one by one."""

    def __init__(self, scheduler: Scheduler, executor: SimExecutor, fast_forward: bool = True,
                 max_run_steps: int = 1024, progress: bool = True, record_plans: bool = False) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.fast_forward = fast_forward
        self.max_run_steps = max_run_steps
        self.progress = progress
        self.record_plans = record_plans   # keep every plan's signature (parity checks)

    def run(self, specs: Sequence[RequestSpec]) -> SimOutcome:
        env = simpy.Environment()
        steps = StepLog()
        if self.record_plans:
            steps.plan_signatures = []
        done: list[Request] = []
        env.process(self._engine(env, list(specs), steps, done))
        env.run()
        unfinished = [r for r in self.scheduler.waiting + self.scheduler.running if not r.is_finished]
        if unfinished or self.scheduler.chunked is not None:
            raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished requests")
        return SimOutcome(done, steps, env.now)

    def _engine(self, env: simpy.Environment, specs: list[RequestSpec], steps: StepLog, done: list[Request]):
        sched = self.scheduler
        next_idx = 0
        bar = tqdm(total=len(specs), desc="simulating", unit="req", disable=not self.progress, mininterval=0.5)
        while True:
            while next_idx < len(specs) and specs[next_idx].arrival_s <= env.now:
                sched.add(Request.from_spec(specs[next_idx]), env.now)
                next_idx += 1
            plan = sched.schedule(env.now)
            finished = sched.pop_finished()
            if plan is None:
                done.extend(finished)
                bar.update(len(finished))
                if next_idx >= len(specs):
                    if sched.has_work():
                        raise RuntimeError("scheduler stalled: work left but no step planned")
                    break
                yield env.timeout(specs[next_idx].arrival_s - env.now)
                continue
            start = env.now
            next_arrival = specs[next_idx].arrival_s if next_idx < len(specs) else None
            num_steps = 1
            if self.fast_forward and plan.mode is ForwardMode.DECODE:
                num_steps = sched.decode_run_bound(plan, self.max_run_steps, env.now)
            if num_steps > 1:
                yield from self._decode_run(env, plan, num_steps, next_arrival, steps)
            else:
                result = self.executor.execute(plan)
                yield env.timeout(result.duration_s)
                sched.commit(plan, result, env.now)
                steps.record(plan, start, env.now, sched.kv.used_tokens(), len(sched.waiting), len(sched.running))
            finished += sched.pop_finished()
            done.extend(finished)
            bar.update(len(finished))
        bar.close()

    def _decode_run(self, env: simpy.Environment, plan, num_steps: int, next_arrival: float | None, steps: StepLog):
        durations = self.executor.decode_durations_s(plan, num_steps)
        ends = np.cumsum(np.concatenate(([env.now], durations)))     # sequential sums, like stepping
        if next_arrival is not None:          # stop after the first step that ends at/after it
            num_steps = min(num_steps, int(np.searchsorted(ends[1:], next_arrival, side="left")) + 1)
        starts, ends = ends[:num_steps].tolist(), ends[1:num_steps + 1].tolist()
        tokens = self.executor.decode_tokens(plan, num_steps)
        yield env.timeout(ends[-1] - env.now)
        used = self.scheduler.commit_decode_run(plan, ends, tokens)
        steps.record_decode_run(plan, starts, ends, used, len(self.scheduler.waiting), len(self.scheduler.running))
