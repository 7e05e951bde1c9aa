"""The real-time loop (wall clock): take requests from a source (a workload replay or an online
front end), then schedule -> launch on the GPU/CPU -> resolve -> record. The only runtime code
that reads a clock. With `overlap` (SGLang's zero-overhead scheduler) step n+1 is planned and
launched while the device still runs step n; the scheduler itself is unaware of it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from tqdm import tqdm

from runtime.core.batch import StepPlan, StepResult
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.core.scheduler import Scheduler
from runtime.executor import CallableExecutor, Executor, LaunchedStep, accepts_poll, check_executor
from runtime.executor import FinishedStep  # noqa: F401  (the runner imports it from here)
from runtime.request_source import ReplaySource, RequestSource
from runtime.request_source import at_time_zero as all_at_once  # noqa: F401  (callers import it from here)
from runtime.run_checks import check_drained


@dataclass
class RealOutcome:
    requests: list[Request]
    steps: StepLog
    elapsed_s: float


@dataclass
class _Launched:
    plan: StepPlan
    step: LaunchedStep
    host_start_s: float


class RealDriver:
    """`executor`: an Executor (runtime/executor.py) or a plain `execute(plan) -> StepResult` callable.
    `as_fast_as_possible`: every request arrives at t=0 (offline throughput), else each is
    added once the wall clock passes its `arrival_s` (measured from the start of the run).
    A source whose requests ask for log-probabilities also has `on_logprobs(items, logprobs)`: called
    before `on_tokens` with a step's sampling items and its StepResult.logprobs (one entry per item)."""

    def __init__(self, scheduler: Scheduler, executor: Executor | Callable[[StepPlan], StepResult],
                 as_fast_as_possible: bool = False, progress: bool = True, record_plans: bool = False,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 overlap: bool = False, idle_poll_s: float | None = None,
                 predict: Callable[[StepPlan], float] | None = None) -> None:
        """`predict(plan)`: the simulator's duration for the step, recorded next to the measured one."""
        self.scheduler = scheduler
        self.executor = _as_executor(executor, clock)
        self.as_fast_as_possible = as_fast_as_possible
        self.progress = progress
        self.record_plans = record_plans   # keep every plan's signature (parity checks)
        self.clock, self.sleep = clock, sleep
        self.overlap = overlap
        self.idle_poll_s = idle_poll_s     # online sources: how long one idle wait may block
        self.predict = predict
        self.steps: StepLog | None = None    # the current (or last) serve's step log

    def run(self, specs: Sequence[RequestSpec]) -> RealOutcome:
        """Replay workload specs on their arrival times (or all at t=0)."""
        return self.serve(ReplaySource(specs, all_at_once=self.as_fast_as_possible, sleep=self.sleep),
                          total=len(specs))

    def serve(self, source: RequestSource, total: int | None = None) -> RealOutcome:
        """Run until the source is exhausted and every request has ended."""
        sched, steps, done = self.scheduler, StepLog(), []
        self.steps = steps                   # the log being filled: an online source may dump it mid-run
        if self.record_plans:
            steps.plan_signatures = []
        gpu_origin = self.executor.clock_origin()
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
            gauges = (sched.kv.used_tokens(), len(sched.waiting), len(sched.running))   # as the step left them
            if result.logprobs is not None:       # only requests of a source that implements it ask
                source.on_logprobs(plan.sampling_items, result.logprobs)
            # the tokens leave before the step's bookkeeping (its record and prediction: ~20-50 us of host)
            source.on_tokens([it.request for it in plan.items if it.samples and not it.dropped], end)
            ended(sched.pop_finished(), end)
            steps.record(plan, start, end, *gauges,
                         predicted_s=self.predict(plan) if self.predict is not None else None)
            return end

        last: _Launched | None = None

        def complete_if_done() -> None:
            """Called inside the next step's launch: the step ahead leaves as soon as the device is done."""
            nonlocal last
            if last is not None and last.step.done():
                complete(last)
                last = None

        poll = {"poll": complete_if_done} if self.overlap and accepts_poll(self.executor) else {}
        while True:
            t = now()
            for req in source.poll(t):
                sched.add(req, t)
            for rid in source.aborted_rids():
                sched.abort(rid)
            plan = sched.schedule(t)
            ended(sched.pop_finished(), t)
            if plan is not None:
                launched = _Launched(plan, self.executor.launch(plan, **poll), t)
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
        check_drained(sched)                 # the stall check, as the simulator's driver ends its run
        return RealOutcome(done, steps, now())


def _as_executor(executor: Executor | Callable[[StepPlan], StepResult], clock: Callable[[], float]) -> Executor:
    """An Executor as it is, a plain `execute(plan)` callable wrapped (timed on `clock`); anything
    else fails here, naming what it lacks, rather than at the first step."""
    if hasattr(executor, "launch") or not callable(executor):
        return check_executor(executor)
    return CallableExecutor(executor, clock)
