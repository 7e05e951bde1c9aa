"""Coalesced decode runs (the simulator's fast-forward): how many decode steps provably decide
nothing new, and applying them at once with the same effects as stepping one by one.

Must not import torch, simpy or time: times arrive as arguments.
"""
from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from runtime.core.batch import ForwardMode, StepPlan
from runtime.core.cache.allocator import SLOT_DTYPE
from runtime.core.cache.radix_cache import MatchResult
from runtime.core.request import Request, RequestStatus
from runtime.core.shared_prefix import SharedPrefixCount

if TYPE_CHECKING:
    from runtime.core.scheduler import Scheduler

_ENDED = (RequestStatus.FINISHED, RequestStatus.ABORTED)   # Request.is_finished


class DecodeGroup:
    """The steps of a decode run from `first_step` (0-based) on, while its batch is `num_reqs` of the run's
    plan's items (those still running then); `context_tokens`: their decode context at the run's first step
    (sum of context_tokens); `context_lens`: each one's context_tokens at the run's first step (int64
    [num_reqs], read-only use); `shared_tokens`: the batch's decode_shared_tokens. `plan`: the batch as a
    decode plan with the run's step id and positions as of its first step, made when first asked for
    (pricing and recording need only the numbers above)."""

    __slots__ = ("first_step", "num_reqs", "context_tokens", "context_lens", "shared_tokens", "_run_plan",
                 "_kept", "_plan")

    def __init__(self, first_step: int, run_plan: StepPlan, context_tokens: int, context_lens: np.ndarray,
                 shared_tokens: int | None, kept: np.ndarray | None = None, num_reqs: int | None = None) -> None:
        """`kept`: bool [items of run_plan], the items in this batch (None: all, and the batch is run_plan)."""
        self.first_step, self.context_tokens, self.context_lens = first_step, context_tokens, context_lens
        self.shared_tokens = shared_tokens
        self.num_reqs = len(run_plan.items) if num_reqs is None else num_reqs
        self._run_plan, self._kept = run_plan, kept
        self._plan: StepPlan | None = run_plan if kept is None else None

    @property
    def plan(self) -> StepPlan:
        if self._plan is None:
            items = [it for it, keep in zip(self._run_plan.items, self._kept.tolist()) if keep]
            self._plan = StepPlan(self._run_plan.step_id, ForwardMode.DECODE, items,
                                  decode_shared_tokens=self.shared_tokens)
        return self._plan


def run_step_batches(groups: Sequence[DecodeGroup], ends: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Batch size and decode context (int64 [k] each) of steps groups[0].first_step .. ends[-1]-1 of a decode
    run, group g covering steps groups[g].first_step .. ends[g]-1 (consecutive: ends[g] is the next group's
    first step): step j of group g decodes its num_reqs requests at its context_tokens plus one token per
    request per step since the run's first."""
    counts = [end - group.first_step for group, end in zip(groups, ends)]
    sizes = np.repeat(np.asarray([group.num_reqs for group in groups], dtype=np.int64), counts)       # [k]
    contexts = (np.repeat(np.asarray([group.context_tokens for group in groups], dtype=np.int64), counts)
                + sizes * np.arange(groups[0].first_step, ends[-1], dtype=np.int64))                  # [k]
    return sizes, contexts


class DecodeRuns:
    """Works on its scheduler's queues and KV: `bound` after a decode plan is made, `commit`
    instead of k commits. Between the two it remembers which later steps of the run would have
    tried admission (their matches touch the cache, and `commit` replays the last)."""

    def __init__(self, sched: "Scheduler") -> None:
        self.sched = sched
        self._match_steps: np.ndarray = np.empty(0, dtype=np.int64)
        self._lefts: np.ndarray = np.empty(0, dtype=np.int64)   # tokens left per plan item (at `bound`)
        self._contexts: np.ndarray = np.empty(0, dtype=np.int64)   # context_tokens per plan item (at `bound`)

    def bound(self, plan: StepPlan, max_steps: int, now: float, overlap: bool = False) -> int:
        """How many consecutive decode steps, starting with `plan`, provably make the same
        decisions as `plan` when nothing arrives: no request can be admitted, none can hit a stop
        token, and the KV pool has enough free slots (no eviction, no retraction). Requests may
        finish inside the run only when nothing waits (nothing to admit when they leave) and
        pages hold one token; otherwise the run ends at the first finish. `overlap`: the run as
        the overlap scheduler steps it (it ends before the step after which stepping would notice
        a finish; `run_length` cuts it further). Always >= 1."""
        sched = self.sched
        self._match_steps = np.empty(0, dtype=np.int64)
        self._lefts = np.empty(0, dtype=np.int64)
        if plan.mode is not ForwardMode.DECODE or max_steps <= 1 or sched.chunked is not None:
            return 1
        if sched._abort_rids or sched.config.enable_mixed_chunk:
            return 1
        if len(plan.items) != len(sched.running):   # a decode plan holds the running batch, in order
            return 1
        lefts, contexts = [], []
        for item in plan.items:
            sampling = item.request.sampling
            if sampling.stop_token_ids and not sampling.ignore_eos:
                return 1
            lefts.append(sampling.max_new_tokens - len(item.request.output_ids))
            contexts.append(item.num_prefix_tokens + 1)
        span = not sched.waiting and sched.kv.page_size == 1
        # overlap: one step more can be coalesced past the last finish (its request rides along,
        # dropped); the run then gives one step back (the step after it is planned before its end)
        k = min(max_steps, max(lefts) + 2 if overlap else max(lefts)) if span else min(max_steps, min(lefts))
        k = self._bound_without_finishes(k, now)
        if overlap:
            k -= 1
        if k <= 1:
            return 1
        self._lefts = np.array(lefts, dtype=np.int64)                                   # [n]
        self._contexts = np.array(contexts, dtype=np.int64)                             # [n]
        return k

    def _bound_without_finishes(self, k: int, now: float) -> int:
        """`k` cut by the waiting queue (admission) and the KV slots: free ones, and with pages of
        one token and nothing waiting also evictable ones (no step may need a retraction)."""
        sched = self.sched
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
            # with nothing waiting, leaves the steps evict are the ones stepping would evict (commit):
            # the run needs only room to allocate, as stepping's retraction check does
            room = free_pages if sched.waiting else free_pages + sched.kv.cache.evictable_size()
            return max(1, min(k, room // len(sched.running) + 1))
        lo, hi = 1, k                              # largest k whose pages fit (monotone in k)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._pages(mid) <= free_pages:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def run_length(self, num_steps: int, end_s: list[float] | np.ndarray, next_arrival_s: float | None,
                   overlap: bool) -> int:
        """The longest run <= `num_steps` (after `bound`) that stepping would also make, given the
        run's step ends. Overlap: a request whose last token comes in the run's last step would
        still be in the next step's batch (stepping notices it one step later), so no run ends
        there; and every finish inside resolves before the next arrival (so an arrival sees the
        same finished requests). Without overlap every run `bound` allows is exact."""
        if not overlap or self._lefts.size == 0:
            return num_steps
        k = num_steps
        lefts = self._lefts
        finish_steps = set(lefts[lefts >= 1].tolist())            # step whose resolve ends request i
        if next_arrival_s is not None:
            late = [f for f in finish_steps if f < k and end_s[f - 1] >= next_arrival_s]
            if late:
                k = min(late)
        while k in finish_steps:
            k -= 1
        return k

    def batches(self, plan: StepPlan, num_steps: int, overlap: bool) -> Iterator[DecodeGroup]:
        """The run's steps grouped by batch, in order (lazily: a caller that stops early builds no
        later group): (first step, 0-based; a plan of `plan`'s items that are still in the batch
        then; their context tokens at the run's first step). Request i with L_i tokens left decodes
        in steps 1..L_i and (overlap) rides along in step L_i + 1, its token dropped, as stepping
        does. The groups' plans keep `plan`'s step id and items (positions as of the run's first
        step): step j of the run is step j of any of them. The first group's plan is `plan` itself."""
        if self._lefts.size:
            lefts, contexts = self._lefts, self._contexts
        else:
            lefts = np.array([it.request.sampling.max_new_tokens - len(it.request.output_ids)
                              for it in plan.items], dtype=np.int64)
            contexts = np.array([it.context_tokens for it in plan.items], dtype=np.int64)
        last_step = lefts + (1 if overlap else 0)           # [n] last step (1-based) with request i in it
        cuts = sorted(set(last_step[(last_step >= 1) & (last_step < num_steps)].tolist()))   # np.unique, in ints
        return self._groups(plan, last_step, contexts, cuts)

    def _groups(self, plan: StepPlan, last_step: np.ndarray, contexts: np.ndarray, cuts: list[int]) -> Iterator[DecodeGroup]:
        yield DecodeGroup(0, plan, int(contexts.sum()), contexts, plan.decode_shared_tokens)
        if not cuts:
            return
        requests = [it.request for it in plan.items]
        # the items by last step (stably: plan order within a step), and where each cut's leavers end in it
        order = np.argsort(last_step, kind="stable")                                  # [n]
        ends = np.searchsorted(last_step[order], cuts, side="right").tolist()         # [cuts]
        order = order.tolist()
        shared: SharedPrefixCount | None = None         # made at the first cut (a run without one needs none)
        begin, n = 0, len(requests)
        for s, end in zip(cuts, ends):                      # the batch of steps s+1.. (0-based s)
            if shared is None:
                shared = SharedPrefixCount(requests, (), self.sched.kv.cache)
            shared.remove([requests[i] for i in order[begin:end]])   # those with last step in (previous cut, s]
            kept = last_step > s                                                     # [n]
            lens = contexts[kept]
            yield DecodeGroup(s, plan, int(lens.sum()), lens, shared.tokens, kept, n - end)
            begin = end

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
               schedule_s: list[float] | None = None, overlap: bool = False) -> list[int]:
        """Apply k = len(end_s) decode steps of `plan`'s batch at once (k <= bound, cut by
        `run_length`). `tokens[i]`: the tokens plan.items[i] samples in the run (fewer than k for a
        request that finishes in it). `schedule_s[j-1]`: when step j's schedule() would have run
        (j = 1 .. k-1; default end_s[j-1], stepping without overlap): the last of them that tried
        admission touched the prefixes its matches walked, and this replays it.
        Requests finishing inside the run end at their own step's end, their KV released between
        the allocations of the steps around it in stepping's order (overlap: after the next step's
        allocation). Returns the KV slots in use when stepping records each step: after the step
        (overlap: after it resolved and the next step was allocated; the last entry: after the run)."""
        sched = self.sched
        k = len(end_s)
        tried = self._match_steps[self._match_steps < k]
        self._match_steps = np.empty(0, dtype=np.int64)
        if tried.size:                               # before any finish changes the tree
            times = end_s[:-1] if schedule_s is None else schedule_s
            self._replay_admission_matches(times[int(tried[-1]) - 1])
        if sched.kv.page_size != 1:
            return self._commit_paged(plan, end_s, tokens)
        kv, clip = sched.kv, sched.config.clip_max_new_tokens
        shift = 1 if overlap else 0                  # overlap: a step is recorded after the next one's allocation
        members = []                                 # (request, tokens left, its tokens), in plan order
        for item, toks in zip(plan.items, tokens):
            req = item.request
            if req.status not in _ENDED:             # not req.is_finished: overlap, one that the step before the run ended
                members.append((req, req.sampling.max_new_tokens - len(req.output_ids), toks))
        ending: dict[int, list[int]] = {}            # finish step -> members ending there, in plan order
        for i, (_, left, _) in enumerate(members):
            if left <= k:
                ending.setdefault(left, []).append(i)
        finish_steps = sorted(ending)
        if not finish_steps or finish_steps[-1] != k:
            finish_steps.append(k)
        # slots of steps 2..k, member by member (row i), written into a request once: when it ends or after the run
        # (placeholder slots, a counting allocator's: only counted into the requests, no matrix)
        placeholders = kv.placeholder_slots is not None
        slots = None if placeholders else np.empty((len(members), k - 1), dtype=SLOT_DTYPE)   # [n, k-1]
        alive = None if placeholders else np.arange(len(members))                     # [n] rows still running
        lefts = None if placeholders else np.array([left for _, left, _ in members], dtype=np.int64)   # [n]
        n = len(members)                             # members still running
        used: list[int] = []
        allocated = 1                                # steps whose slots are allocated (the plan's own)
        base_used, base_allocated = kv.used_tokens(), 1
        for f in finish_steps:
            target = min(f + shift, k)
            evicted = None                           # [1 + leaves] cumulative tokens evicted, where any were
            if target > allocated:                   # one allocator call for the steps up to this finish
                free = kv.allocator.num_free_slots
                rows, sizes = kv.allocate_rows(n, target - allocated, end_s[0])
                if not placeholders:
                    slots[alive, allocated - 1:target - 1] = rows
                if sizes:
                    evicted = np.array([0, *accumulate(sizes)], dtype=np.int64)
                allocated = target
            if f - 1 > len(used):                    # steps before the finish: allocated through step t
                first = len(used) + 1                # steps first .. f-1, allocated through t = step + shift (<= k)
                if evicted is None:                  # nothing evicted: n more slots each step
                    low = base_used + n * (first + shift - base_allocated)
                    used.extend(range(low, low + n * (f - first), n) if n else [low] * (f - first))
                else:
                    t = np.minimum(np.arange(first, f) + shift, k)                       # [m]
                    # stepping evicts at each step until its slots fit: the first leaves reaching the deficit
                    deficit = n * (t - base_allocated) - (free if target > base_allocated else 0)
                    gone = evicted[np.searchsorted(evicted, np.maximum(deficit, 0), side="left")]
                    used.extend((base_used + n * (t - base_allocated) - gone).tolist())
            for i in ending.get(f, ()):
                member = members[i]
                req = member[0]
                if placeholders:
                    req.count_kv_slots(target - 1)
                else:
                    req.append_kv_slots(slots[i, :target - 1])
                self._apply_tokens(member, f, end_s, clip)
                sched._end(req, req.finishes_with(req.output_ids[-1]), end_s[f - 1])
            if f in ending:
                n -= len(ending[f])
                if not placeholders:
                    alive = alive[lefts[alive] != f]
            used.append(kv.used_tokens())
            base_used, base_allocated = used[-1], allocated
        # the rest (every member whose tokens outlast the run) decode in every step: all k tokens each
        rest = [member for member in members if member[1] > k]
        sched.reserved_running_tokens -= sum(min(left, clip) - min(left - k, clip) for _, left, _ in rest)
        for i, (req, _, toks) in enumerate(rest):    # _apply_tokens of k tokens, inlined
            if placeholders:
                req.count_kv_slots(k - 1)
            else:
                req.append_kv_slots(slots[alive[i]])
            req.num_computed_tokens += k
            req.output_ids.extend(toks if len(toks) == k else toks[:k])
            req.token_times_s.extend(end_s)
            if req.first_token_s is None:
                req.first_token_s = end_s[0]
        self._close_run(k)
        return used

    def _close_run(self, num_steps: int) -> None:
        """What stepping leaves after `num_steps` decode steps besides tokens and KV: finished requests out
        of the running batch, new_token_ratio decayed once per step after the first, step ids advanced."""
        sched = self.sched
        sched._keep_running(lambda r: r.status not in _ENDED)   # not r.is_finished
        ratio, decay, floor = sched.new_token_ratio, sched.config.new_token_ratio_decay, sched.config.min_new_token_ratio
        for _ in range(num_steps - 1):               # sequentially, to round exactly as stepping does
            ratio = max(ratio - decay, floor)
            if ratio == floor:                       # it stays there (decay >= 0)
                break
        sched.new_token_ratio = ratio
        sched.step_id += num_steps

    def _apply_tokens(self, member: tuple[Request, int, list[int]], num_tokens: int,
                      end_s: list[float], clip: int) -> None:
        """A request's first `num_tokens` tokens of the run, stamped with their steps' ends."""
        req, left, toks = member
        self.sched.reserved_running_tokens -= min(left, clip) - min(left - num_tokens, clip)
        req.num_computed_tokens += num_tokens
        req.output_ids.extend(toks if len(toks) == num_tokens else toks[:num_tokens])
        req.token_times_s.extend(end_s[:num_tokens])
        if req.first_token_s is None:
            req.first_token_s = end_s[0]

    def _commit_paged(self, plan: StepPlan, end_s: list[float], tokens: list[list[int]]) -> list[int]:
        """`commit` with pages of several tokens (runs end at the first finish)."""
        sched = self.sched
        k = len(end_s)
        used_after_first = sched.kv.used_tokens()
        page = sched.kv.page_size
        new_slots_per_step = [0] * k
        clip = sched.config.clip_max_new_tokens
        for item, toks in zip(plan.items, tokens):
            req = item.request
            left = req.sampling.max_new_tokens - len(req.output_ids)
            sched.reserved_running_tokens -= min(left, clip) - min(left - k, clip)
            if k > 1:
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
        used, total = [], used_after_first
        for j in range(k):
            total += new_slots_per_step[j]
            used.append(total)
        used[-1] = sched.kv.used_tokens()            # after the last step's finishes released KV
        self._close_run(k)
        return used
