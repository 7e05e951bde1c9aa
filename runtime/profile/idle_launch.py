"""The idle_launch section: how much longer a step's launch takes when the host has idled before it. Drives the
real Scheduler and runner as the host section does; per round, in a shuffled order of gaps, sleeps a gap and then
times one step's launch and interval (launch begin to result) on the host clock; gap 0 is the reference (the step
right after the one before). Served, a launch-bound step after several seconds of idle ran 1.1-1.6x slower
(experiments/results/h200/piecewise_idle_probe). Uses torch only through the runner.
"""
from __future__ import annotations

import random
import statistics
import time

from omegaconf import DictConfig

from runtime.build import CoreComponents, build_scheduler
from runtime.core.request import Request, SamplingParams
from runtime.profile.host import synthetic_prompt, timed_step

IDLE_KINDS = ("prefill", "decode")
FOLLOWING_STEPS = 2     # steps timed back to back after the one behind the gap: does the slow host persist?


def _timed(scheduler, runner, now: float) -> dict:
    step = timed_step(scheduler, runner, now)
    if step is None:
        raise RuntimeError("idle_launch: the scheduler planned no step")
    return step[1]


def idle_launch_rows(cfg: DictConfig, core: CoreComponents, runner, kind: str, size: int,
                     gaps_s: tuple[float, ...], rounds: int, seed: int = 0) -> list[dict]:
    """One row per gap (gap 0 first) for a step of `kind`: "prefill" (one fresh prompt of `size` tokens) or
    "decode" (a batch of `size` requests of 32-token prompts, prefilled untimed): the launch and interval of the step
    behind the gap, and the mean launch of the FOLLOWING_STEPS steps launched back to back after it (next_launch_s).
    Each round times every gap once, in an order shuffled with `seed` (after one untimed round without sleeps); a
    gap's row holds the medians of its rounds."""
    if kind not in IDLE_KINDS:
        raise ValueError(f"idle_launch kind={kind!r}: expected one of {IDLE_KINDS}")
    scheduler = build_scheduler(cfg, core.model, core.kv_capacity_tokens)
    vocab, now = core.model.vocab_size, 0.0
    order = [0.0, *gaps_s]
    if kind == "decode":
        steps = (rounds + 1) * len(order) * (2 + FOLLOWING_STEPS) + 8
        for b in range(size):
            scheduler.add(Request(f"idle-d{size}-{b}", synthetic_prompt(b, 32, vocab),
                                  SamplingParams(max_new_tokens=steps, ignore_eos=True), 0.0), 0.0)
        while scheduler.waiting or scheduler.chunked is not None:      # the prompts, untimed
            now += 1e-3
            _timed(scheduler, runner, now)

    def prompt(name: str, seed: int, now: float) -> None:     # a prefill step's one fresh prompt (decode: none)
        if kind == "prefill":
            scheduler.add(Request(f"idle-{name}-{size}", synthetic_prompt(seed, size, vocab),
                                  SamplingParams(max_new_tokens=1, ignore_eos=True), now), now)

    samples: dict[float, list[dict]] = {gap: [] for gap in order}
    shuffler = random.Random(seed)
    for rnd in range(rounds + 1):                       # the first round is untimed
        gaps = list(order)
        shuffler.shuffle(gaps)
        for k, gap in enumerate(gaps):
            prompt(f"p{rnd}-{k}", rnd * 131 + k, now)
            now += 1e-3
            _timed(scheduler, runner, now)               # the step right before: the gap counts from its end
            prompt(f"q{rnd}-{k}", rnd * 131 + k + 7919, now)
            if gap > 0 and rnd:
                time.sleep(gap)
            now += 1e-3 + gap
            sample = _timed(scheduler, runner, now)
            following = []
            for j in range(FOLLOWING_STEPS):
                prompt(f"f{rnd}-{k}-{j}", rnd * 131 + k + 104729 * (j + 1), now)
                now += 1e-3
                following.append(_timed(scheduler, runner, now)["launch_s"])
            if rnd:
                samples[gap].append({**sample, "next_launch_s": statistics.mean(following)})
            scheduler.pop_finished()
    rows = []
    for gap in order:
        got = samples[gap]
        rows.append({"kind": kind, "new_tokens": size, "gap_s": gap,
                     "launch_s": statistics.median(s["launch_s"] for s in got),
                     "interval_s": statistics.median(s["interval_s"] for s in got),
                     "next_launch_s": statistics.median(s["next_launch_s"] for s in got), "samples": len(got)})
    return rows
