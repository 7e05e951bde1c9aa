"""Data parallelism in the simulator: one SimPy environment, the DP router in front, and either
independent replicas (each its own scheduler, radix cache and engine process -- the same engine
generator a single-replica run uses) or DP attention (attention ranks stepping in lockstep).

Torch-free. The router decides at each request's arrival time; a replica reports each request
that leaves it back to the router (the router's load signal), as sglang-router sees responses end.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import simpy
from tqdm import tqdm

from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.core.router.base import Router
from runtime.core.scheduler import Scheduler
from runtime.run_checks import check_drained
from sim.costmodel.base import StepShape
from sim.costmodel.dp_attention import DPAttentionCostModel
from sim.clock import ExactClock
from sim.driver import SimDriver
from sim.executor import SimExecutor


class RoutedArrivals:
    """The workload's requests, routed in arrival order when simulated time reaches them; one
    inbox per replica. Replicas waiting for work get an event that fires when a request is routed
    to them, or when the last request has been routed anywhere (so they can stop)."""

    def __init__(self, env: simpy.Environment, specs: Sequence[RequestSpec], router: Router,
                 on_finish=None) -> None:
        self.env, self.specs, self.router = env, list(specs), router
        self.next_idx = 0
        self.inboxes: list[list[RequestSpec]] = [[] for _ in range(router.num_replicas)]
        self.waiters: list[simpy.Event | None] = [None] * router.num_replicas
        self.on_finish = on_finish

    def route_until(self, now: float) -> None:
        specs = self.specs
        while self.next_idx < len(specs) and specs[self.next_idx].arrival_s <= now:
            spec = specs[self.next_idx]
            self.next_idx += 1
            replica = self.router.route(spec, now)
            if not 0 <= replica < len(self.inboxes):
                raise RuntimeError(f"router sent {spec.rid} to replica {replica} of {len(self.inboxes)}")
            self.inboxes[replica].append(spec)
            self._wake(replica)
        if self.next_idx >= len(specs):
            for replica in range(len(self.waiters)):
                self._wake(replica)

    def _wake(self, replica: int) -> None:
        waiter = self.waiters[replica]
        if waiter is not None:
            self.waiters[replica] = None
            waiter.succeed()

    def next_unrouted_s(self) -> float | None:
        return self.specs[self.next_idx].arrival_s if self.next_idx < len(self.specs) else None

    def process(self):
        """The router's own process: route every request exactly at its arrival time."""
        while self.next_idx < len(self.specs):
            yield self.env.timeout_until(self.specs[self.next_idx].arrival_s)
            self.route_until(self.env.now)
        self.route_until(self.env.now)

    def finished(self, replica: int, requests: list[Request]) -> None:
        for _ in requests:
            self.router.finish(replica)
        if self.on_finish is not None:
            self.on_finish(len(requests))


class ReplicaSource:
    """What one replica's engine process sees of the routed arrivals (SimDriver's source)."""

    def __init__(self, arrivals: RoutedArrivals, replica: int) -> None:
        self.arrivals, self.replica = arrivals, replica

    def arrived(self, now: float) -> list[RequestSpec]:
        self.arrivals.route_until(now)
        inbox = self.arrivals.inboxes[self.replica]
        taken = inbox[:]          # routed when time reached them, so all have arrived
        inbox.clear()
        return taken

    def next_arrival_s(self) -> float | None:
        """The earliest time a request may reach this replica (a bound: it may go elsewhere)."""
        times = [s.arrival_s for s in self.arrivals.inboxes[self.replica][:1]]
        unrouted = self.arrivals.next_unrouted_s()
        if unrouted is not None:
            times.append(unrouted)
        return min(times) if times else None

    def more_to_come(self) -> bool:
        return bool(self.arrivals.inboxes[self.replica]) or self.arrivals.next_unrouted_s() is not None

    def wait(self, env: simpy.Environment) -> simpy.Event:
        if self.arrivals.inboxes[self.replica]:
            return env.timeout(0.0)
        event = env.event()
        self.arrivals.waiters[self.replica] = event
        return event

    def finished(self, requests: list[Request]) -> None:
        self.arrivals.finished(self.replica, requests)


@dataclass
class DPOutcome:
    requests: list[list[Request]]     # per replica: every request it served, finished or aborted
    steps: list[StepLog]              # per replica
    sim_time_s: float


def _check_drained(schedulers: Sequence[Scheduler]) -> None:
    for replica, sched in enumerate(schedulers):
        check_drained(sched, f" on replica {replica}")


class DPSimDriver:
    """Replicas behind a router: `drivers[r]` is replica r's single-replica SimDriver (its
    scheduler and executor; fast-forward and overlap as configured) run as one engine process."""

    def __init__(self, drivers: Sequence[SimDriver], router: Router, progress: bool = True) -> None:
        if len(drivers) != router.num_replicas:
            raise ValueError(f"{len(drivers)} replicas but the router routes to {router.num_replicas}")
        self.drivers, self.router, self.progress = list(drivers), router, progress

    def run(self, specs: Sequence[RequestSpec]) -> DPOutcome:
        env = ExactClock()
        bar = tqdm(total=len(specs), desc="simulating", unit="req", disable=not self.progress, mininterval=0.5)
        arrivals = RoutedArrivals(env, specs, self.router, on_finish=bar.update)
        steps = [StepLog(predicted_from_duration=True) for _ in self.drivers]
        done: list[list[Request]] = [[] for _ in self.drivers]
        env.process(arrivals.process())
        for r, driver in enumerate(self.drivers):
            env.process(driver.engine(env, ReplicaSource(arrivals, r), steps[r], done[r]))
        env.run()
        bar.close()
        _check_drained([d.scheduler for d in self.drivers])
        return DPOutcome(done, steps, env.now)


class DPAttentionSimDriver:
    """DP attention: the attention ranks' schedulers plan every step together and the step lasts
    what the DP-attention cost model gives for all their batches at once (an idle rank still takes
    part in the MLP collectives). Steps one at a time: no decode fast-forward, no overlap."""

    def __init__(self, schedulers: Sequence[Scheduler], executor: SimExecutor,
                 cost_model: DPAttentionCostModel, router: Router, progress: bool = True) -> None:
        if len(schedulers) != router.num_replicas:
            raise ValueError(f"{len(schedulers)} attention ranks but the router routes to {router.num_replicas}")
        self.schedulers, self.executor, self.cost_model = list(schedulers), executor, cost_model
        self.router, self.progress = router, progress

    def run(self, specs: Sequence[RequestSpec]) -> DPOutcome:
        env = ExactClock()
        bar = tqdm(total=len(specs), desc="simulating", unit="req", disable=not self.progress, mininterval=0.5)
        arrivals = RoutedArrivals(env, specs, self.router, on_finish=bar.update)
        steps = [StepLog(predicted_from_duration=True) for _ in self.schedulers]
        done: list[list[Request]] = [[] for _ in self.schedulers]
        env.process(self._lockstep(env, arrivals, steps, done))
        env.run()
        bar.close()
        _check_drained(self.schedulers)
        return DPOutcome(done, steps, env.now)

    def _collect_finished(self, arrivals: RoutedArrivals, done: list[list[Request]]) -> None:
        for r, sched in enumerate(self.schedulers):
            finished = sched.pop_finished()
            if finished:
                done[r].extend(finished)
                arrivals.finished(r, finished)

    def _lockstep(self, env: simpy.Environment, arrivals: RoutedArrivals, steps: list[StepLog],
                  done: list[list[Request]]):
        scheds = self.schedulers
        while True:
            arrivals.route_until(env.now)
            for r, sched in enumerate(scheds):
                for spec in arrivals.inboxes[r]:
                    sched.add(Request.from_spec(spec), env.now)
                arrivals.inboxes[r].clear()
            plans = [sched.schedule(env.now) for sched in scheds]
            self._collect_finished(arrivals, done)
            if all(plan is None for plan in plans):
                next_arrival = arrivals.next_unrouted_s()
                if next_arrival is None:
                    if any(sched.has_work() for sched in scheds):
                        raise RuntimeError("scheduler stalled: work left but no step planned")
                    return
                yield env.timeout_until(next_arrival)
                continue
            shapes = [StepShape.from_plan(p) if p is not None else StepShape() for p in plans]
            duration_s = self.cost_model.step_time_s(shapes)
            results = [self.executor.execute(p) if p is not None else None for p in plans]
            start = env.now
            yield env.timeout(duration_s)
            for sched, plan, result, log in zip(scheds, plans, results, steps):
                if plan is None:
                    continue
                sched.commit(plan, replace(result, duration_s=duration_s, host_s=0.0), env.now)
                log.record(plan, start, env.now, sched.kv.used_tokens(), len(sched.waiting), len(sched.running))
            self._collect_finished(arrivals, done)
