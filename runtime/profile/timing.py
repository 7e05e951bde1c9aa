"""Times step plans through the runner the way serving launches them, and single operators.
Imports torch.

A step is timed by the runner's own CUDA events (host perf_counter on CPU). Launches are pipelined as
the overlap loop does (launch step n+1, then wait for step n), so a timed step starts on the device
when the previous one ends and its interval holds the device time plus any host launch time the
device had to wait for -- what `mode=real` records per step.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from runtime.core.batch import StepPlan


@dataclass(frozen=True)
class StepTiming:
    durations_s: tuple[float, ...]   # every timed step's interval (CUDA events; CPU: host clock)
    launch_host_s: float             # median host time of runner.launch: batch build, attention plan, launches
    repeats: int

    @property
    def device_s(self) -> float:     # the median interval
        return statistics.median(self.durations_s)

    @property
    def device_min_s(self) -> float:
        return min(self.durations_s)


@dataclass(frozen=True)
class EagerDecode:
    """A TP leader's word to its peers (runtime.profile.ranks.follow_steps): run the steps that follow
    eagerly (on) or as serving does (off)."""

    on: bool


@dataclass(frozen=True)
class SleepBeforeStep:
    """A TP leader's word to its peers (runtime.profile.ranks.follow_steps): enqueue a sleep kernel of
    `cycles` before the next step, so that its launch is hidden on every rank (device_alone_s)."""

    cycles: int


@contextmanager
def eager_decode(runner) -> Iterator[None]:
    """Decode steps run eagerly inside the block: no decode graph, and no piecewise graphs (which would
    otherwise take a decode batch the decode graphs do not cover). A TP leader's peers are told so."""
    tell = getattr(runner, "step_sender", None)
    saved, runner.graphs = runner.graphs, None
    saved_piecewise, runner.piecewise = getattr(runner, "piecewise", None), None
    if tell is not None:
        tell(EagerDecode(True))
    try:
        yield
    finally:
        runner.graphs, runner.piecewise = saved, saved_piecewise
        if tell is not None:
            tell(EagerDecode(False))


def time_plan(runner, plan: StepPlan, repeats: int) -> StepTiming:
    """One untimed launch (JIT, allocator), then `repeats` timed ones, each launched before the
    previous one is waited for."""
    launched, host_s = [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        step = runner.launch(plan)
        host_s.append(time.perf_counter() - start)
        if launched:
            launched[-1].wait()
        launched.append(step)
    durations = [step.wait().duration_s for step in launched[1:]]
    return StepTiming(tuple(durations), statistics.median(host_s[1:]), repeats)


def device_alone_s(runner, plan: StepPlan, timing: StepTiming) -> float:
    """Median device seconds of the step `timing` (time_plan's) timed back to back, now with its launch
    hidden: each of as many launches is enqueued behind a sleep kernel that outlasts it (twice the measured
    launch plus 5 ms) on every rank of the group, so the step's interval -- its start event runs when the
    sleep ends -- holds its kernels only, where the back-to-back interval also holds any launch the device
    waited for. A launch that itself waits for the device (a plan fence) still shows. CPU: `timing`'s
    interval (no device to hide a launch behind)."""
    if runner.device.type != "cuda":
        return timing.device_s
    from kernels.event_timing import sleep_cycles

    cycles = sleep_cycles(2 * timing.launch_host_s + 0.005)
    tell = getattr(runner, "step_sender", None)
    samples = []
    for _ in range(timing.repeats):
        torch.cuda.synchronize(runner.device)
        if tell is not None:
            tell(SleepBeforeStep(cycles))
        torch.cuda._sleep(cycles)
        samples.append(runner.launch(plan).wait().duration_s)
    return statistics.median(samples)


def time_behind_decodes(runner, decode_plan: StepPlan, plan: StepPlan, repeats: int,
                        decodes: int = 3) -> tuple[float, float]:
    """(median interval of `plan` launched right behind `decodes` decode steps, median interval of a decode step
    launched right behind it): one pipeline of rounds -- the decodes, `plan`, one decode more -- launched as the
    overlap loop launches steps (the next before waiting for the one before) with no idle device between rounds,
    as a busy server runs them; the first round is untimed (JIT, allocator). The decodes ahead hide `plan`'s launch
    as a served decode run hides the launch of the extend that follows it."""
    round_plans = [decode_plan] * decodes + [plan, decode_plan]
    pending, durations = None, []
    for step_plan in round_plans * (repeats + 1):
        step = runner.launch(step_plan)
        if pending is not None:
            durations.append(pending.wait().duration_s)
        pending = step
    durations.append(pending.wait().duration_s)
    per_round = len(round_plans)
    extend_s = [durations[r * per_round + decodes] for r in range(1, repeats + 1)]
    decode_s = [durations[r * per_round + decodes + 1] for r in range(1, repeats + 1)]
    return statistics.median(extend_s), statistics.median(decode_s)


def time_op(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of fn() on the device (CUDA events around each call; CPU: host clock)."""
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)
