"""Coalesced decode runs (the simulator's fast-forward): how many decode steps provably decide
nothing new, and applying them at once with the same effects as stepping one by one.

Must not import torch, simpy or time: times arrive as arguments.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from runtime.core.batch import ForwardMode, StepPlan
from runtime.core.cache.radix_cache import MatchResult
from runtime.core.request import Request

if TYPE_CHECKING:
    from runtime.core.scheduler import Scheduler


class DecodeRuns:
    """Works on its scheduler's queues and KV: `bound` after a decode plan is made, `commit`
    instead of k commits. Between the two it remembers which later steps of the run would have
    tried admission (their matches touch the cache, and `commit` replays the last)."""

    def __init__(self, sched: "Scheduler") -> None:
        self.sched = sched
        self._match_steps: np.ndarray = np.empty(0, dtype=np.int64)

    def bound(self, plan: StepPlan, max_steps: int, now: float) -> int:
        """How many consecutive decode steps, starting with `plan`, provably make the same
        decisions as `plan` when nothing arrives: no request can be admitted, none finishes
        before the last of them, none can hit a stop token, and the KV pool has enough free
        slots (no eviction, no retraction). Always >= 1."""
        sched = self.sched
        self._match_steps = np.empty(0, dtype=np.int64)
        if plan.mode is not ForwardMode.DECODE or max_steps <= 1 or sched.chunked is not None:
            return 1
        if sched._abort_rids or sched.config.enable_mixed_chunk:
            return 1
        k = max_steps
        for req in sched.running:
            sampling = req.sampling
            if sampling.stop_token_ids and not sampling.ignore_eos:
                return 1
            left = sampling.max_new_tokens - len(req.output_ids)
            if left < k:
                k = left
        if k <= 1:
            return 1
        free_pages = sched.kv.allocator.num_free_slots // sched.kv.page_size
        if sched.waiting:
            if (sched.kv.page_size != 1 or sched.policy.preemption_threshold is not None
                    or not sched.policy.stateless_order):
                return 1                           # the per-step admission attempt cannot be replayed
            order = sched.policy.order(sched.waiting, sched.kv.match, now)   # as each step's attempt does
            steps, available, rem_total = self._admission_budget(k)
            if order and len(sched.running) < sched.config.max_running_requests:
                k = min(k, self._steps_until_admission(order[0], k, steps, rem_total))
            # the later schedule() calls of the run that try admission (and so match, touching the
            # matched prefixes): `commit` replays the last one's touches
            self._match_steps = steps[(rem_total > 0) & (available > 0)]
        if k <= 1:
            return 1
        if sched.kv.page_size == 1:
            return max(1, min(k, free_pages // len(sched.running) + 1))
        lo, hi = 1, k                              # largest k whose pages fit (monotone in k)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._pages(mid) <= free_pages:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _admission_budget(self, max_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The PrefillBudget of each later step j = 1 .. max_steps-1 of a decode run when nothing
        arrives, replayed exactly (KV use grows, the reservation ratio decays, the running
        requests' remaining tokens shrink): (steps, free + evictable KV, rem_total_tokens).
        Pages of one token only; no mixed decodes."""
        sched = self.sched
        clip = sched.config.clip_max_new_tokens
        steps = np.arange(1, max_steps)                                              # [k-1]
        left = np.array([r.max_new_tokens_left for r in sched.running])              # [n]
        reserved_tokens = np.minimum(left[None, :] - steps[:, None], clip).sum(axis=1)
        ratio = np.subtract.accumulate(np.concatenate(([sched.new_token_ratio], np.full(max_steps - 2, sched.config.new_token_ratio_decay))))
        ratio = np.maximum(ratio, sched.config.min_new_token_ratio)                  # sequential decay, as stepping
        available = (sched.kv.allocator.num_free_slots - len(sched.running) * (steps - 1)
                     + sched.kv.cache.evictable_size())
        return steps, available, available - reserved_tokens * ratio

    def _steps_until_admission(self, first: Request, max_steps: int, steps: np.ndarray,
                               rem_total: np.ndarray) -> int:
        """With requests waiting but blocked by memory: the first later step j (1 <= j < max_steps)
        at whose schedule() the policy's first candidate `first` would fit (PrefillBudget.fits,
        on that step's `rem_total`). Returns max_steps if none."""
        sched = self.sched
        match = sched.kv.match(first)
        left = max(first.sampling.max_new_tokens - len(first.output_ids), 0)
        cost = (first.num_fill_tokens - match.length) + min(left, sched.config.clip_max_new_tokens)
        fits = cost < rem_total - sched.kv.newly_protected_tokens(match)
        hits = np.flatnonzero(fits)
        return int(steps[hits[0]]) if hits.size else max_steps

    def _replay_admission_matches(self, now: float) -> None:
        """Touch what a schedule() at `now` that tries admission and admits nothing touches: the
        policy's matches, then its first candidate's when a running slot is free."""
        sched = self.sched
        matched: set[Request] = set()

        def match(req: Request) -> MatchResult:
            matched.add(req)
            return sched.kv.match(req, now)
        order = sched.policy.order(sched.waiting, match, now)
        if order and order[0] not in matched and len(sched.running) < sched.config.max_running_requests:
            match(order[0])

    def _pages(self, num_steps: int) -> int:
        """Pages the running requests need for steps 2..num_steps of a decode run."""
        sched = self.sched
        return sum(sched.kv.allocator.num_pages_needed(r.num_kv_slots, num_steps - 1) for r in sched.running)

    def commit(self, plan: StepPlan, end_s: list[float], tokens: list[list[int]],
               schedule_s: list[float] | None = None) -> list[int]:
        """Apply k = len(end_s) decode steps of `plan`'s batch at once (k <= bound).
        `tokens[i]` are the k tokens of plan.items[i]. `schedule_s[j-1]`: when step j's schedule()
        would have run (j = 1 .. k-1; default end_s[j-1], stepping without overlap): the last of
        them that tried admission touched the prefixes its matches walked, and this replays it.
        Returns KV slots in use after each step."""
        sched = self.sched
        k = len(end_s)
        tried = self._match_steps[self._match_steps < k]
        self._match_steps = np.empty(0, dtype=np.int64)
        if tried.size:                               # before any finish changes the tree
            times = end_s[:-1] if schedule_s is None else schedule_s
            self._replay_admission_matches(times[int(tried[-1]) - 1])
        used_after_first = sched.kv.used_tokens()
        page = sched.kv.page_size
        new_slots_per_step = [0] * k
        if k > 1 and page == 1:                      # one allocator call for the whole run
            sched.kv.allocate_many([it.request for it in plan.items], k - 1, end_s[0])
        clip = sched.config.clip_max_new_tokens
        for item, toks in zip(plan.items, tokens):
            req = item.request
            left = req.sampling.max_new_tokens - len(req.output_ids)
            sched.reserved_running_tokens -= min(left, clip) - min(left - k, clip)
            if k > 1 and page > 1:
                pos0 = req.num_kv_slots               # position of step 2's token
                for j in range(1, k):
                    if (pos0 + j - 1) % page == 0:
                        new_slots_per_step[j] += page
                sched.kv.allocate(req, k - 1, end_s[0])
            req.num_computed_tokens += k
            req.output_ids.extend(toks)
            req.token_times_s.extend(end_s)
            if req.first_token_s is None:
                req.first_token_s = end_s[0]
            reason = req.finishes_with(toks[-1])
            if reason is not None:
                sched._end(req, reason, end_s[-1])
        if page == 1:
            n = len(plan.items)
            used = [used_after_first + n * j for j in range(k)]
        else:
            used, total = [], used_after_first
            for j in range(k):
                total += new_slots_per_step[j]
                used.append(total)
        used[-1] = sched.kv.used_tokens()            # after the last step's finishes released KV
        sched._keep_running(lambda r: not r.is_finished)
        for _ in range(k - 1):                       # sequentially, to round exactly as stepping does
            sched.new_token_ratio = max(sched.new_token_ratio - sched.config.new_token_ratio_decay,
                                        sched.config.min_new_token_ratio)
        sched.step_id += k
        return used
