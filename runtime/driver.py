"""The real-time loop (wall clock): take requests from a source (a workload replay or an online
front end), then schedule -> launch on the GPU/CPU -> resolve -> record. The only runtime code
that reads a clock. With `overlap` (SGLang's zero-overhead scheduler) step n+1 is planned and
launched while the device still runs step n; the scheduler itself is unaware of it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from tqdm import tqdm

from runtime.core.batch import StepPlan, StepResult
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.core.scheduler import Scheduler
from runtime.request_source import ReplaySource, RequestSource
from runtime.request_source import at_time_zero as all_at_once  # noqa: F401  (callers import it from here)


@dataclass
class RealOutcome:
    requests: list[Request]
    steps: StepLog
    elapsed_s: float


class LaunchedStep(Protocol):
    """A step handed to the device. `placeholder_ids`: one per sampling item, what the scheduler
    appends until the real tokens arrive (the executor resolves them on the device)."""

    placeholder_ids: list[int]

    def wait(self) -> StepResult:
        """Block until the step's tokens are on the host."""
        ...

    def interval_s(self, origin: object) -> tuple[float, float] | None:
        """(start, end) of the step on the device, seconds since `origin` (the executor's clock
        origin); None when the executor cannot tell (the driver then uses host times)."""
        ...


class StepExecutor(Protocol):
    def launch(self, plan: StepPlan) -> LaunchedStep:
        """Start the step without waiting for the device."""
        ...


class FinishedStep:
    """A step that ran synchronously (CPU, or a plain `execute(plan)` callable), timed on the host
    clock: `start_s`/`end_s` are that clock's readings, `origin` is its reading at the run start."""

    def __init__(self, result: StepResult, start_s: float, end_s: float) -> None:
        self.result = result
        self.placeholder_ids = list(result.next_token_ids)
        self.start_s, self.end_s = start_s, end_s

    def wait(self) -> StepResult:
        return self.result

    def interval_s(self, origin: object) -> tuple[float, float] | None:
        return self.start_s - origin, self.end_s - origin


class _SyncExecutor:
    def __init__(self, execute: Callable[[StepPlan], StepResult], clock: Callable[[], float]) -> None:
        self.execute, self.clock = execute, clock

    def clock_origin(self) -> float:
        return self.clock()

    def launch(self, plan: StepPlan) -> FinishedStep:
        start = self.clock()
        result = self.execute(plan)
        return FinishedStep(result, start, self.clock())


@dataclass
class _Launched:
    plan: StepPlan
    step: LaunchedStep
    host_start_s: float


class RealDriver:
    """`executor`: a StepExecutor (`launch`) or a plain `execute(plan) -> StepResult` callable.
    `as_fast_as_possible`: every request arrives at t=0 (offline throughput), else each is
    added once the wall clock passes its `arrival_s` (measured from the start of the run).
    A source whose requests ask for log-probabilities also has `on_logprobs(items, logprobs)`: called
    before `on_tokens` with a step's sampling items and its StepResult.logprobs (one entry per item)."""

    def __init__(self, scheduler: Scheduler, executor: StepExecutor | Callable[[StepPlan], StepResult],
                 as_fast_as_possible: bool = False, progress: bool = True, record_plans: bool = False,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 overlap: bool = False, idle_poll_s: float | None = None,
                 predict: Callable[[StepPlan], float] | None = None) -> None:
        """`predict(plan)`: the simulator's duration for the step, recorded next to the measured one."""
        self.scheduler = scheduler
        self.executor = executor if hasattr(executor, "launch") else _SyncExecutor(executor, clock)
        self.as_fast_as_possible = as_fast_as_possible
        self.progress = progress
        self.record_plans = record_plans   # keep every plan's signature (parity checks)
        self.clock, self.sleep = clock, sleep
        self.overlap = overlap
        self.idle_poll_s = idle_poll_s     # online sources: how long one idle wait may block
        self.predict = predict

    def run(self, specs: Sequence[RequestSpec]) -> RealOutcome:
        """Replay workload specs on their arrival times (or all at t=0)."""
        return self.serve(ReplaySource(specs, all_at_once=self.as_fast_as_possible, sleep=self.sleep),
                          total=len(specs))

    def serve(self, source: RequestSource, total: int | None = None) -> RealOutcome:
        """Run until the source is exhausted and every request has ended."""
        sched, steps, done = self.scheduler, StepLog(), []
        if self.record_plans:
            steps.plan_signatures = []
        gpu_origin = getattr(self.executor, "clock_origin", lambda: None)()
        origin = self.clock()
        now = lambda: self.clock() - origin                   # noqa: E731
        bar = tqdm(total=total, desc="serving", unit="req", disable=not self.progress, mininterval=0.5)

        def ended(requests: list[Request], t: float) -> None:
            if requests:
                source.on_finished(requests, t)
                done.extend(requests)
                bar.update(len(requests))

        def complete(launched: _Launched) -> float:
            """Wait for a launched step, apply its tokens, record it; returns its end time."""
            result = launched.step.wait()
            interval = launched.step.interval_s(gpu_origin) if gpu_origin is not None else None
            start, end = interval if interval is not None else (launched.host_start_s, now())
            plan = launched.plan
            if self.overlap:
                sched.resolve(plan, result, end)
            else:
                sched.commit(plan, result, end)
            steps.record(plan, start, end, sched.kv.used_tokens(), len(sched.waiting), len(sched.running),
                         predicted_s=self.predict(plan) if self.predict is not None else None)
            if result.logprobs is not None:       # only requests of a source that implements it ask
                source.on_logprobs(plan.sampling_items, result.logprobs)
            source.on_tokens([it.request for it in plan.items if it.samples and not it.dropped], end)
            ended(sched.pop_finished(), end)
            return end

        last: _Launched | None = None
        while True:
            t = now()
            for req in source.poll(t):
                sched.add(req, t)
            for rid in source.aborted_rids():
                sched.abort(rid)
            plan = sched.schedule(t)
            ended(sched.pop_finished(), t)
            if plan is not None:
                launched = _Launched(plan, self.executor.launch(plan), t)
                if not self.overlap:
                    complete(launched)
                    continue
                if last is not None:
                    complete(last)
                sched.advance(plan, now(), launched.step.placeholder_ids)
                last = launched
            elif last is not None:
                complete(last)
                last = None
            elif source.exhausted():
                if sched.has_work():
                    raise RuntimeError("scheduler stalled: work left but no step planned")
                break
            else:
                source.wait(now(), self.idle_poll_s)
        bar.close()
        return RealOutcome(done, steps, now())
