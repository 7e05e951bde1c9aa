"""The end-of-run checks of every mode: the run drained (no request left unfinished in a scheduler,
none lost on the way) and no KV slot leaked. Imports neither torch nor simpy.
"""
from __future__ import annotations

from typing import Sequence

from runtime.build import leaked_slots
from runtime.core.request import Request
from runtime.core.scheduler import Scheduler


def unfinished_requests(scheduler: Scheduler) -> int:
    """Requests still waiting or running, unfinished."""
    return sum(1 for r in [*scheduler.waiting, *scheduler.running] if not r.is_finished)


def check_drained(scheduler: Scheduler, where: str = "") -> None:
    """The stall check: raise if the scheduler still holds unfinished work (a queued request, a
    chunked prefill) once its driver stopped; a driver stops only when the scheduler says it has none."""
    left = unfinished_requests(scheduler)
    if left or scheduler.chunked is not None:
        held = " and a chunked prefill" if scheduler.chunked is not None else ""
        raise RuntimeError(f"run ended with {left} unfinished requests{held}{where}: the scheduler stalled "
                           "(it reported no work while some was left)")


def end_of_run_checks(schedulers: Sequence[Scheduler], requests: Sequence[Request], num_specs: int) -> dict:
    """Both checks after a run of `num_specs` requests over `schedulers` (one per replica) that
    reported `requests` as ended: raises if any scheduler holds unfinished work or a request was
    lost or never ended; returns the summary's `leaked_kv_slots` (all replicas; must be 0)."""
    for replica, scheduler in enumerate(schedulers):
        check_drained(scheduler, f" on replica {replica}" if len(schedulers) > 1 else "")
    open_rids = [r.rid for r in requests if not r.is_finished]
    if open_rids or len(requests) != num_specs:
        raise RuntimeError(f"run ended with {len(requests)} of {num_specs} requests reported, {len(open_rids)} of "
                           f"them not finished (first: {open_rids[:3]}): a driver lost requests")
    return {"leaked_kv_slots": sum(leaked_slots(s) for s in schedulers)}
