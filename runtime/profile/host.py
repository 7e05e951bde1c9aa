"""Host time per step, measured by driving the real Scheduler (the run's policy, radix cache and
allocator) and the real runner with synthetic requests: schedule, launch (batch build, attention plan,
kernel launches or graph replay) and commit (advance + resolve), each on the host clock. The device
time is waited for but not counted. Uses torch only through the runner.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

from omegaconf import DictConfig

from runtime.build import CoreComponents, build_scheduler
from runtime.core.request import Request, SamplingParams


def synthetic_prompt(seed: int, length: int, vocab_size: int) -> list[int]:
    """`length` token ids in [0, vocab_size), distinct per seed (no cache hit between seeds)."""
    return [(seed * 7919 + i * 104729 + 13) % vocab_size for i in range(length)]


def timed_step(scheduler, runner, now: float) -> tuple[object, dict] | None:
    """(plan, host times) of one step: schedule, launch, commit, and the interval from the launch's begin to the
    result; None when the scheduler plans nothing."""
    t0 = time.perf_counter()
    plan = scheduler.schedule(now)
    if plan is None:
        return None
    t1 = time.perf_counter()
    launched = runner.launch(plan)
    t2 = time.perf_counter()
    result = launched.wait()
    t3 = time.perf_counter()
    scheduler.commit(plan, result, now)
    t4 = time.perf_counter()
    return plan, {"schedule_s": t1 - t0, "launch_s": t2 - t1, "commit_s": t4 - t3, "interval_s": t3 - t1}


def _timed_steps(scheduler, runner, now: float) -> Iterator[tuple[float, object, dict]]:
    """(clock, plan, host times) of each step until the scheduler has no work or plans nothing; the
    clock advances 1 ms a step from `now`."""
    while scheduler.has_work():
        now += 1e-3
        step = timed_step(scheduler, runner, now)
        if step is None:
            return
        yield (now, *step)


def _row(kind: str, num_reqs: int, new_tokens: int, samples: list[dict]) -> dict:
    row = {"kind": kind, "num_reqs": num_reqs, "new_tokens": new_tokens}
    for key in ("schedule_s", "launch_s", "commit_s"):
        row[key] = statistics.median(s[key] for s in samples)
    row["host_s"] = row["schedule_s"] + row["launch_s"] + row["commit_s"]
    row["samples"] = len(samples)
    return row


def host_decode_row(cfg: DictConfig, core: CoreComponents, runner, batch: int, steps: int) -> dict:
    """Decode steps of `batch` requests (32-token prompts, prefilled first, untimed)."""
    scheduler = build_scheduler(cfg, core.model, core.kv_capacity_tokens)
    vocab = core.model.vocab_size
    for b in range(batch):
        scheduler.add(Request(f"hd{batch}-{b}", synthetic_prompt(b, 32, vocab),
                              SamplingParams(max_new_tokens=steps + 4, ignore_eos=True), 0.0), 0.0)
    samples = []
    for _, plan, sample in _timed_steps(scheduler, runner, 0.0):
        if plan.num_decode_requests == batch and len(samples) < steps:
            samples.append(sample)
    return _row("decode", batch, batch, samples)


def host_prefill_row(cfg: DictConfig, core: CoreComponents, runner, num_reqs: int, tokens_each: int,
                     steps: int) -> dict:
    """Prefill steps of `num_reqs` fresh prompts of `tokens_each` tokens (no cache hit), `steps` times."""
    scheduler = build_scheduler(cfg, core.model, core.kv_capacity_tokens)
    vocab, now, samples = core.model.vocab_size, 0.0, []
    for rep in range(steps + 1):                 # the first round is untimed
        for b in range(num_reqs):
            ids = synthetic_prompt(rep * 1009 + b, tokens_each, vocab)
            scheduler.add(Request(f"hp{num_reqs}x{tokens_each}-{rep}-{b}", ids,
                                  SamplingParams(max_new_tokens=1, ignore_eos=True), now), now)
        for now, plan, sample in _timed_steps(scheduler, runner, now):
            if rep and plan.num_prefill_tokens == num_reqs * tokens_each:
                samples.append(sample)
        scheduler.pop_finished()
    return _row("prefill", num_reqs, num_reqs * tokens_each, samples)
