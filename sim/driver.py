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
from runtime.core.decode_runs import DecodeGroup, run_step_batches
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.core.scheduler import Scheduler
from sim.clock import ExactClock
from sim.executor import SimExecutor
from sim.step_placement import place_step


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
        return env.timeout_until(self.specs[self.next_idx].arrival_s)

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
    run_group: DecodeGroup | None = None   # the tail of a coalesced run: recorded when it would resolve
    run_offset: int = 0


def _is_decode(step: "_InFlight | None") -> bool:
    """Whether the step in flight is decode-only (a coalesced decode run's tail has no plan left)."""
    return step is not None and (step.plan is None or step.plan.mode is ForwardMode.DECODE)


class SimDriver:
    """`fast_forward`: coalesce runs of decode steps that provably change nothing but token counts
    (Scheduler.decode_run_bound) into one event; the records are the same as stepping one by one.

    `overlap` (SGLang's overlap scheduler, as the real driver runs it): the next step is planned
    while the GPU runs the current one, so a step costs max(GPU, host) instead of their sum, the
    next plan sees the current step advanced but not resolved (a request this step ends is still
    in the next batch), and arrivals during a step are seen one step later. The next plan also waits
    for the step's launch to return (the cost model's launch_time_s), as the real loop plans only after
    `launch` returns: an eager 8k-token prefill keeps the host ~30 ms, and arrivals in that time make the
    next plan. A launch-bound step (cost model's launch_bound_s: the device waits for its launch)
    whose launch began while the step ahead still ran ends that much earlier, up to its launch-bound part.
    A step whose kernels reach the device only as its launch returns (a decode graph replay: the cost
    model's device_waits_for_launch) computes no earlier than its launch time after its launch began, nor
    than that long after the step ahead was launched on every rank (a launch-bound step, whose end its
    launch set, is launched on every rank only then: the ranks launch in lockstep, and a tensor-parallel
    follower receives each step from the leader). After a host-bound step the device is idle by then, and
    the decode lasts its launch plus its kernels (tp=2 serving: 8.5 ms after a prefill, 5.1 ms otherwise).
    A step whose launch ends it (cost model's launch_ends_step: piecewise-graph extends under tensor
    parallelism) is taken by every rank once the leader launches it and each rank has launched the step
    ahead; it ends at the later of its back-to-back interval less what the step ahead still ran after that
    (its whole launch-bound part at most) and its launch time after it, and its ranks are done launching it
    only as it ends (a follower's launch of the pieces keeps pace with its device), so a decode replay after
    it begins its launch then. A step that starts as a decode-only step ends (no idle device between) takes
    the cost model's after_decode_saving_s less: its price was timed back to back after a step like it.
    The first step after the host waited for arrivals with nothing in flight launches idle_launch_factor(the
    wait) times slower (its launch, and a graph replay's lead, stretch; a launch-bound step ends that much
    later; none ends before its launch returns), with overlap or without.
    Coalesced decode runs apply the same rules step by step, so their records equal stepping's."""

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
        env = ExactClock()
        steps = StepLog(predicted_from_duration=True)
        if self.record_plans:
            steps.plan_signatures = []
        done: list[Request] = []
        self.executor.prepare_streams(specs)      # every request's tokens in one vectorised pass
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
        idle_from: float | None = None      # when the host began waiting for arrivals with nothing to do
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
                idle_from = env.now if idle_from is None else idle_from
                yield source.wait(env)
                continue
            start = env.now
            idle_s, idle_from = (start - idle_from if idle_from is not None else 0.0), None
            next_arrival = source.next_arrival_s()
            num_steps = 1
            if self.fast_forward and plan.mode is ForwardMode.DECODE:
                num_steps = sched.decode_run_bound(plan, self.max_run_steps, env.now)
            if num_steps > 1:
                finished = yield from self._decode_run(env, plan, num_steps, next_arrival, steps, finished,
                                                       done, source)
            else:
                result = self.executor.execute(plan)
                duration_s = result.duration_s
                if idle_s > 0.0 and (result.launch_bound_s > 0.0 or result.launch_lead_s > 0.0):
                    # a launch-bound step after the host idled: its slower launch (idle_launch_factor) lengthens it
                    duration_s += result.launch_s * (self.executor.idle_launch_factor(idle_s) - 1.0)
                yield env.timeout(duration_s)
                sched.commit(plan, result, env.now)
                steps.record(plan, start, env.now, sched.kv.used_tokens(), len(sched.waiting), len(sched.running))
            finished += sched.pop_finished()
            done.extend(finished)
            source.finished(finished)

    def _decode_run(self, env: simpy.Environment, plan, num_steps: int, next_arrival: float | None,
                    steps: StepLog, finished: list[Request], done: list[Request], source: ArrivalSource):
        """A coalesced decode run from now. Requests that end before its last step are reported
        before it is slept through (each step but the last ends before the next arrival, so any
        arrival sees them as stepping would); returns the rest of `finished` and the last step's."""
        sched = self.scheduler
        groups, durations = self._run_costs(plan, num_steps, False, env.now, next_arrival)[:2]
        ends = np.cumsum(np.concatenate(([env.now], durations)))     # sequential sums, like stepping
        num_steps = len(durations)
        if next_arrival is not None:          # stop after the first step that ends at/after it
            num_steps = min(num_steps, int(np.searchsorted(ends[1:], next_arrival, side="left")) + 1)
        starts, ends = ends[:num_steps].tolist(), ends[1:num_steps + 1].tolist()
        num_running = self._running_after_each_step(plan, num_steps)
        tokens = self.executor.decode_tokens(plan, num_steps)
        used = sched.commit_decode_run(plan, ends, tokens)
        self._record_run(steps, groups, starts, ends, used, num_running, len(sched.waiting))
        ended = sched.pop_finished()
        early = [r for r in ended if r.finish_s < ends[-1]]
        if early:
            early = finished + early
            done.extend(early)
            source.finished(early)
            finished = []
        yield env.timeout_until(ends[-1])
        return finished + [r for r in ended if r.finish_s >= ends[-1]]

    def _run_costs(self, plan: StepPlan, num_steps: int, overlap: bool, start_s: float,
                   next_arrival: float | None):
        """The run's batches (Scheduler.decode_run_batches) and each step's duration and, under overlap,
        its host share, launch and launch lead (else None), for its first `num_steps` steps or fewer: priced
        up to three steps past the one whose end (at least `start_s` plus the GPU time so far) reaches the
        next arrival, where runs are cut. Batches are priced together, a window of steps at a time: the
        first batch alone, then as many steps as the last one's duration says reach the arrival (with a
        margin; every step after a finish is shorter); only the batches of the steps kept are returned."""
        batches = self.scheduler.decode_run_batches(plan, num_steps, overlap)
        groups, ends, durations, hosts, launches, leads = [], [], [], [], [], []
        needed, until, window = num_steps, start_s, 1
        group = next(batches)
        while group is not None and group.first_step < needed:
            first = group.first_step                 # the window: groups from here through first + window steps
            window_groups, window_ends = [], []
            while group is not None and group.first_step < needed and group.first_step < first + window:
                following = next(batches, None)
                window_groups.append(group)
                window_ends.append(following.first_step if following is not None else num_steps)
                group = following
            step_s = self.executor.decode_groups_durations_s(window_groups, window_ends)      # [m]
            groups += window_groups
            ends += window_ends
            durations.append(step_s)
            if overlap:
                counts = [end - g.first_step for g, end in zip(window_groups, window_ends)]
                step_launches = [self.executor.decode_launch_s(g.num_reqs) for g in window_groups]
                hosts.append(np.repeat([self.executor.decode_host_s(g.num_reqs) for g in window_groups], counts))
                launches.append(np.repeat([launch for launch, _ in step_launches], counts))
                leads.append(np.repeat([lead for _, lead in step_launches], counts))
                step_s = step_s - hosts[-1]
            if next_arrival is not None and needed == num_steps:
                reach = np.cumsum(np.concatenate(([until], step_s)))[1:]   # a lower bound on the ends
                hit = np.flatnonzero(reach >= next_arrival)
                if hit.size:
                    needed = min(num_steps, first + int(hit[0]) + 3)
                until = float(reach[-1])
                window = max(2 * len(step_s), int((next_arrival - until) / max(float(step_s[-1]), 1e-9) * 1.1) + 4)
            else:
                window = num_steps
        kept = sum(1 for g in groups if g.first_step < needed)          # a window may have priced past `needed`
        groups = groups[:kept]
        durations = (np.concatenate(durations) if len(durations) > 1 else durations[0])[:needed]
        if not overlap:
            return groups, durations, None, None, None
        return (groups, durations, np.concatenate(hosts)[:needed], np.concatenate(launches)[:needed],
                np.concatenate(leads)[:needed])

    @staticmethod
    def _running_after_each_step(plan: StepPlan, num_steps: int) -> list[int]:
        """Running requests once step j (1-based) of the run resolved: those with more than j
        tokens left when it was planned (call before the run is committed)."""
        lefts = np.sort(np.array([it.request.sampling.max_new_tokens - len(it.request.output_ids)
                                  for it in plan.items], dtype=np.int64))                # [n]
        after = np.arange(2, num_steps + 2)                                              # [k]
        return (len(lefts) - np.searchsorted(lefts, after, side="left")).tolist()

    @staticmethod
    def _record_run(steps: StepLog, groups, starts: list[float], ends: list[float], used: list[int],
                    num_running: list[int], num_waiting: int) -> None:
        """Record steps 0 .. len(ends)-1 of a run, each with its own batch (`groups`) and the
        running count after it (a group's plan is at the run's first step: step j is its step j)."""
        bounds = [group.first_step for group in groups[1:]] + [len(ends)]
        j, m = 0, len(ends)
        if m == 0:
            return
        if steps.plan_signatures is None:              # one call: each step's batch size and context by group
            recorded = [group for group in groups if group.first_step < m]
            sizes, contexts = run_step_batches(recorded, [min(end, m) for end in bounds[:len(recorded)]])   # [m]
            steps.record_decode_steps(groups[0].plan, starts, ends, used, num_waiting, num_running[:m],
                                      sizes.tolist(), contexts.tolist())
            return
        for group, end in zip(groups, bounds):
            end = min(end, m)
            size = group.num_reqs
            while j < end:
                t = j
                while t < end - 1 and num_running[t] == size:
                    t += 1                                  # a record call: running == batch but at its last step
                steps.record_decode_run(group.plan, starts[j:t + 1], ends[j:t + 1], used[j:t + 1], num_waiting,
                                        num_running[t], step_offset=j, context_tokens=group.context_tokens)
                j = t + 1
            if j >= m:
                break

    # -- overlap scheduling -------------------------------------------------------------------
    def _engine_overlap(self, env: simpy.Environment, source: ArrivalSource, steps: StepLog,
                        done: list[Request]):
        """The real driver's overlap loop under simulated time: schedule(n+1) and its launch, then
        wait for step n and resolve it, then advance(n+1). Step n+1 starts on the GPU once step n
        ended and its own host work (started when it was scheduled) is done."""
        sched = self.scheduler
        last: _InFlight | None = None
        launched_by = 0.0       # when the latest step's launch had reached the device on every rank
        idle_from: float | None = None      # when the host, with nothing in flight, began waiting for arrivals

        def finish_last():
            nonlocal last
            if last is not None:
                if last.end_s > env.now:
                    yield env.timeout_until(last.end_s)
                if last.plan is not None:
                    sched.resolve(last.plan, last.result, env.now)
                    steps.record(last.plan, last.start_s, last.end_s, sched.kv.used_tokens(),
                                 len(sched.waiting), len(sched.running))
                else:                                    # a run's tail: recorded as stepping would
                    group = last.run_group
                    steps.record_decode_run(group.plan, [last.start_s], [last.end_s], [sched.kv.used_tokens()],
                                            len(sched.waiting), len(sched.running), step_offset=last.run_offset,
                                            context_tokens=group.context_tokens)
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
                    idle_from = env.now if idle_from is None else idle_from
                    yield source.wait(env)
            else:
                prev_end = last.end_s if last is not None else t
                idle_s, idle_from = (t - idle_from if idle_from is not None else 0.0), None
                num_steps = 1
                if self.fast_forward and plan.mode is ForwardMode.DECODE and not plan.retracted_rids:
                    num_steps = sched.decode_run_bound(plan, self.max_run_steps, t, overlap=True)
                if num_steps >= 2:
                    next_arrival = source.next_arrival_s()
                    run = self._overlap_run_times(plan, num_steps, t, prev_end, launched_by, next_arrival)
                if num_steps >= 2 and run is not None:
                    groups, starts, ends, resume_s, planned_s = run
                    k = len(ends)
                    num_running = self._running_after_each_step(plan, k)
                    yield from finish_last()
                    tokens = self.executor.decode_tokens(plan, k)
                    used = sched.commit_decode_run(plan, ends, tokens, schedule_s=planned_s, overlap=True)
                    # a step is recorded when it resolves, after the next step's allocation (as stepping)
                    self._record_run(steps, groups, starts[:-1], ends[:-1], used[:-1], num_running[:-1],
                                     len(sched.waiting))
                    group = [g for g in groups if g.first_step <= k - 1][-1]
                    last = _InFlight(None, None, starts[-1], ends[-1], group, k - 1)   # still running
                    ended = sched.pop_finished()       # all resolve before the next arrival (run_length)
                    done.extend(ended)
                    source.finished(ended)
                    launched_by = resume_s              # the run's last launch returned by its next plan
                    yield env.timeout_until(resume_s)
                else:
                    result = self.executor.execute(plan)
                    # after the host idled its launch is slower (idle_launch_factor): the launch and its lead
                    # stretch, a launch-bound step ends that much later, and no step before its launch returns
                    slow = self.executor.idle_launch_factor(idle_s) if idle_s > 0.0 else 1.0
                    placed = place_step(result, t + result.host_s, prev_end, launched_by, _is_decode(last), slow)
                    start, end, launched_by = placed.start_s, placed.end_s, placed.launched_by_s
                    launched = _InFlight(plan, result, start, end)
                    yield from finish_last()
                    if env.now < placed.launch_end_s:
                        yield env.timeout_until(placed.launch_end_s)      # the launch returns
                    sched.advance(plan, env.now, result.next_token_ids)
                    last = launched
            finished = sched.pop_finished()
            done.extend(finished)
            source.finished(finished)

    def _overlap_run_times(self, plan: StepPlan, num_steps: int, sched_s: float, prev_end_s: float,
                           launched_by_s: float, next_arrival: float | None):
        """Start and end of each step of a coalesced decode run under overlap, and the time the step
        after the run is planned. Step j of the run is planned at sched[j] (sched[0] = sched_s), its launch
        begins at sched[j] + host[j]; it starts at max(end of step j-1, launch begin) and ends its device
        time after max(end of step j-1, launch begin + launch lead); step j+1 is planned once step j-1 has
        ended and step j's launch has returned (step -1: the step in flight when the run was planned, ending
        at prev_end_s, its launch done on every rank at launched_by_s). The run is cut so that no arrival
        falls at or before any planning time inside it, and where Scheduler.decode_run_length allows
        (requests may finish inside it: its batch shrinks at known steps). Returns (the run's batches, starts, ends, the planning time of the step after the
        run, planning times of steps 1..k-1), or None if fewer than two steps remain."""
        if next_arrival is not None and next_arrival <= prev_end_s:
            return None     # step 1 is planned once the step in flight ended: it would see the arrival
        groups, durations, hosts, launches, leads = self._run_costs(plan, num_steps, True, prev_end_s, next_arrival)
        times = self._gpu_bound_run_times(durations, hosts, launches, leads, sched_s, prev_end_s, launched_by_s,
                                          next_arrival)
        if times is not None:
            starts, ends, sched = times
        else:
            starts, ends, sched = self._run_times_stepwise(durations.tolist(), hosts.tolist(), launches.tolist(),
                                                           leads.tolist(), sched_s, prev_end_s, launched_by_s,
                                                           next_arrival)
        k = self.scheduler.decode_run_length(len(ends), ends, next_arrival, overlap=True)
        if k < 2:
            return None
        return groups, starts[:k], ends[:k], sched[k], sched[1:k]

    @staticmethod
    def _gpu_bound_run_times(durations: np.ndarray, hosts: np.ndarray, launches: np.ndarray, leads: np.ndarray,
                             sched_s: float, prev_end_s: float, launched_by_s: float, next_arrival: float | None):
        """`_run_times_stepwise` at once when every step after the first starts when the one before
        it ends and the step after it is planned then (its host work and launch, begun at the end of the
        step before that, are done by then); the ends are sequential sums in stepping's order,
        end = (ready + duration) - host, so they are the very floats stepping gives. None where a step
        would wait on the host."""
        launch0 = sched_s + float(hosts[0])
        start0 = max(prev_end_s, launch0)
        lead0 = float(leads[0])
        ready0 = max(prev_end_s, launch0 + lead0, launched_by_s + lead0) if lead0 else start0
        sched1 = max(prev_end_s, launch0 + float(launches[0]))
        terms = np.empty(2 * len(durations))                                        # [2k] d0, -h0, d1, -h1, ...
        terms[0::2], terms[1::2] = durations, -hosts
        ends = np.cumsum(np.concatenate(([ready0], terms)))[2::2]                   # [k]
        planned = np.concatenate(([sched1], ends[:-1]))                             # [k] planning of steps 1..k
        if not (ends[:-1] >= (planned[:-1] + hosts[1:]) + launches[1:]).all():      # step j's launch returned by then
            return None
        num = len(ends)
        if next_arrival is not None:            # step j (>= 1) whose planning would see the arrival: stop before it
            seen = np.flatnonzero(planned[:-1] >= next_arrival)
            if seen.size:
                num = int(seen[0]) + 1
        ends = ends[:num].tolist()
        starts = [start0] + ends[:-1]
        return starts, ends, [sched_s, sched1] + ends[:num - 1]

    @staticmethod
    def _run_times_stepwise(durations: list[float], hosts: list[float], launches: list[float], leads: list[float],
                            sched_s: float, prev_end_s: float, launched_by_s: float, next_arrival: float | None):
        """Start, end and planning time of each step of an overlap run, one step at a time (as stepping);
        the planning times go one past the last step."""
        starts, ends, sched = [], [], [sched_s]
        end = prev_end_s
        for j in range(len(hosts)):
            if next_arrival is not None and j >= 1 and sched[j] >= next_arrival:
                break                       # step j's planning would see the arrival: stop before it
            launch_begin = sched[j] + hosts[j]
            before = ends[j - 1] if j >= 1 else prev_end_s       # the step ahead of step j
            start = max(before, launch_begin)
            lead = leads[j]
            ready = max(before, launch_begin + lead, launched_by_s + lead) if lead else start
            end = ready + durations[j] - hosts[j]
            starts.append(start)
            ends.append(end)
            launched_by_s = launch_begin + launches[j]
            sched.append(max(before, launched_by_s))
        return starts, ends, sched
