"""The SimPy loop (simulated clock): feed arrivals to the scheduler, advance time by each plan's
predicted duration, commit, record. The only simulator code that knows which clock runs.

Ties: arrivals at time t are added before the step that starts at t (fixed order, deterministic).
One engine process serves one replica; where its requests come from is an ArrivalSource (the
workload itself here, the DP router's share of it in sim/dp_driver.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np
import simpy
from tqdm import tqdm

from runtime.core.batch import ForwardMode, StepPlan, StepResult
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.core.scheduler import Scheduler
from sim.executor import SimExecutor


@dataclass
class SimOutcome:
    requests: list[Request]     # every request, finished or aborted
    steps: StepLog
    sim_time_s: float


class ArrivalSource(Protocol):
    """Requests reaching one engine process. `arrived(now)`: those that arrived by `now`, not
    handed out before, in arrival order; `next_arrival_s()`: a lower bound on the next arrival
    (None: none will come), which ends coalesced decode runs; `more_to_come()`; `wait(env)`: an
    event to sleep on while idle; `finished(requests)`: the engine reports requests that ended."""

    def arrived(self, now: float) -> list[RequestSpec]: ...

    def next_arrival_s(self) -> float | None: ...

    def more_to_come(self) -> bool: ...

    def wait(self, env: simpy.Environment) -> simpy.Event: ...

    def finished(self, requests: list[Request]) -> None: ...


class SpecQueue:
    """The ArrivalSource of a single replica: the workload's requests in arrival order."""

    def __init__(self, specs: Sequence[RequestSpec], on_finish: Callable[[int], object] | None = None) -> None:
        self.specs, self.next_idx, self.on_finish = list(specs), 0, on_finish

    def arrived(self, now: float) -> list[RequestSpec]:
        specs, start = self.specs, self.next_idx
        while self.next_idx < len(specs) and specs[self.next_idx].arrival_s <= now:
            self.next_idx += 1
        return specs[start:self.next_idx]

    def next_arrival_s(self) -> float | None:
        return self.specs[self.next_idx].arrival_s if self.next_idx < len(self.specs) else None

    def more_to_come(self) -> bool:
        return self.next_idx < len(self.specs)

    def wait(self, env: simpy.Environment) -> simpy.Event:
        return env.timeout(self.specs[self.next_idx].arrival_s - env.now)

    def finished(self, requests: list[Request]) -> None:
        if self.on_finish is not None:
            self.on_finish(len(requests))


@dataclass
class _InFlight:
    """A launched step whose tokens are not applied yet (overlap): it occupies the GPU until end_s."""

    plan: StepPlan | None          # None: already resolved (the tail of a coalesced decode run)
    result: StepResult | None
    start_s: float
    end_s: float
    run_plan: StepPlan | None = None   # the tail of a coalesced run: recorded when it would resolve
    run_offset: int = 0


class SimDriver:
    """`fast_forward`: coalesce runs of decode steps that provably change nothing but token counts
    (Scheduler.decode_run_bound) into one event; the records are the same as stepping one by one.

    `overlap` (SGLang's overlap scheduler, as the real driver runs it): the next step is planned
    while the GPU runs the current one, so a step costs max(GPU, host) instead of their sum, the
    next plan sees the current step advanced but not resolved (a request this step ends is still
    in the next batch), and arrivals during a step are seen one step later."""

    def __init__(self, scheduler: Scheduler, executor: SimExecutor, fast_forward: bool = True,
                 max_run_steps: int = 1024, progress: bool = True, record_plans: bool = False,
                 overlap: bool = False) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.fast_forward = fast_forward
        self.max_run_steps = max_run_steps
        self.progress = progress
        self.record_plans = record_plans   # keep every plan's signature (parity checks)
        self.overlap = overlap

    def run(self, specs: Sequence[RequestSpec]) -> SimOutcome:
        env = simpy.Environment()
        steps = StepLog(predicted_from_duration=True)
        if self.record_plans:
            steps.plan_signatures = []
        done: list[Request] = []
        bar = tqdm(total=len(specs), desc="simulating", unit="req", disable=not self.progress, mininterval=0.5)
        env.process(self.engine(env, SpecQueue(specs, on_finish=bar.update), steps, done))
        env.run()
        bar.close()
        unfinished = [r for r in self.scheduler.waiting + self.scheduler.running if not r.is_finished]
        if unfinished or self.scheduler.chunked is not None:
            raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished requests")
        return SimOutcome(done, steps, env.now)

    def engine(self, env: simpy.Environment, source: ArrivalSource, steps: StepLog, done: list[Request]):
        """The SimPy process of this replica: requests from `source`, steps into `steps`, ended
        requests into `done` (and reported to `source`)."""
        engine = self._engine_overlap if self.overlap else self._engine
        return engine(env, source, steps, done)

    def _engine(self, env: simpy.Environment, source: ArrivalSource, steps: StepLog, done: list[Request]):
        sched = self.scheduler
        while True:
            for spec in source.arrived(env.now):
                sched.add(Request.from_spec(spec), env.now)
            plan = sched.schedule(env.now)
            finished = sched.pop_finished()
            if plan is None:
                done.extend(finished)
                source.finished(finished)
                if not source.more_to_come():
                    if sched.has_work():
                        raise RuntimeError("scheduler stalled: work left but no step planned")
                    break
                yield source.wait(env)
                continue
            start = env.now
            next_arrival = source.next_arrival_s()
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
            source.finished(finished)

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

    # -- overlap scheduling -------------------------------------------------------------------
    def _engine_overlap(self, env: simpy.Environment, source: ArrivalSource, steps: StepLog,
                        done: list[Request]):
        """The real driver's overlap loop under simulated time: schedule(n+1) and its launch, then
        wait for step n and resolve it, then advance(n+1). Step n+1 starts on the GPU once step n
        ended and its own host work (started when it was scheduled) is done."""
        sched = self.scheduler
        last: _InFlight | None = None

        def finish_last():
            nonlocal last
            if last is not None:
                if last.end_s > env.now:
                    yield env.timeout(last.end_s - env.now)
                if last.plan is not None:
                    sched.resolve(last.plan, last.result, env.now)
                    steps.record(last.plan, last.start_s, last.end_s, sched.kv.used_tokens(),
                                 len(sched.waiting), len(sched.running))
                else:                                    # a run's tail: recorded as stepping would
                    steps.record_decode_run(last.run_plan, [last.start_s], [last.end_s], [sched.kv.used_tokens()],
                                            len(sched.waiting), len(sched.running), step_offset=last.run_offset)
                last = None

        while True:
            for spec in source.arrived(env.now):
                sched.add(Request.from_spec(spec), env.now)
            t = env.now
            plan = sched.schedule(t)
            if plan is None:
                if last is not None:
                    yield from finish_last()
                elif not source.more_to_come():
                    if sched.has_work():
                        raise RuntimeError("scheduler stalled: work left but no step planned")
                    break
                else:
                    yield source.wait(env)
            else:
                prev_end = last.end_s if last is not None else t
                num_steps = 1
                if self.fast_forward and plan.mode is ForwardMode.DECODE and not plan.retracted_rids:
                    num_steps = sched.decode_run_bound(plan, self.max_run_steps, t) - 1
                if num_steps >= 2:
                    next_arrival = source.next_arrival_s()
                    run = self._overlap_run_times(plan, num_steps, t, prev_end, next_arrival)
                if num_steps >= 2 and run is not None:
                    starts, ends, resume_s, planned_s = run
                    yield from finish_last()
                    tokens = self.executor.decode_tokens(plan, len(ends))
                    used = sched.commit_decode_run(plan, ends, tokens, schedule_s=planned_s)
                    # a step is recorded when it resolves, after the next step's allocation (as stepping)
                    steps.record_decode_run(plan, starts[:-1], ends[:-1], used[1:], len(sched.waiting),
                                            len(sched.running))
                    last = _InFlight(None, None, starts[-1], ends[-1], plan, len(ends) - 1)   # still running
                    yield env.timeout(resume_s - env.now)
                else:
                    result = self.executor.execute(plan)
                    start = max(prev_end, t + result.host_s)
                    launched = _InFlight(plan, result, start, start + result.duration_s - result.host_s)
                    yield from finish_last()
                    sched.advance(plan, env.now, result.next_token_ids)
                    last = launched
            finished = sched.pop_finished()
            done.extend(finished)
            source.finished(finished)

    def _overlap_run_times(self, plan: StepPlan, num_steps: int, sched_s: float, prev_end_s: float,
                           next_arrival: float | None):
        """Start and end of each step of a coalesced decode run under overlap, and the time the step
        after the run is planned (the end of the run's second-to-last step). Step j of the run is
        planned at sched[j] (sched[0] = sched_s, sched[1] = prev_end_s, then the end of step j-2) and
        starts at max(end of step j-1, sched[j] + host). The run is cut so that no arrival falls at
        or before any planning time inside it. Returns (starts, ends, resume time, planning times of
        steps 1..k-1), or None if fewer than two steps remain."""
        durations = self.executor.decode_durations_s(plan, num_steps)
        host = self.executor.decode_host_s(plan)
        gpu = np.asarray(durations, dtype=np.float64) - host
        starts, ends, sched = [], [], [sched_s, prev_end_s]
        end = prev_end_s
        for j in range(num_steps):
            if j >= 2:
                sched.append(ends[j - 2])
            if next_arrival is not None and j >= 1 and sched[j] >= next_arrival:
                break                       # step j's planning would see the arrival: stop before it
            start = max(end, sched[j] + host)
            end = start + gpu[j]
            starts.append(start)
            ends.append(end)
        if len(ends) < 2:
            return None
        return starts, ends, ends[-2], sched[1:len(ends)]
