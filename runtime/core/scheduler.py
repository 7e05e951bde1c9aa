"""The scheduler as a step machine (SGLang's event loop without the loop): `add`, `schedule`,
`advance` / `resolve` (or `commit`, both at once), `abort`, `pop_finished`. Continuous batching,
chunked prefill, admission against a decaying KV reservation (admission.py), retraction when the
KV pool runs out, priority preemption; coalesced decode runs live in decode_runs.py.

Must not import torch, simpy or time: `now` is always an argument.
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Iterator

from runtime.core.admission import PrefillBudget
from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan, StepResult
from runtime.core.cache.radix_cache import MatchResult
from runtime.core.decode_runs import DecodeGroup, DecodeRuns
from runtime.core.kv_manager import KVManager
from runtime.core.policy.base import SchedulePolicy, effective_policy
from runtime.core.request import FinishReason, Request, RequestStatus
from runtime.core.scheduler_config import SchedulerConfig
from runtime.core.shared_prefix import batch_shared_prefix_tokens


class Scheduler:
    """Owns the queues. Every request ends FINISHED or ABORTED with a reason (never lost):
    `waiting` (no KV) -> `chunked` (partly prefilled) -> `running` (decoding) -> done,
    with retraction from `running` back to `waiting`. Finished requests are handed to the
    driver through `pop_finished()`."""

    def __init__(self, config: SchedulerConfig, policy: SchedulePolicy, kv: KVManager,
                 max_context_tokens: int | None = None) -> None:
        self.config = config
        self.policy = effective_policy(policy, kv.cache.enabled)
        self.kv = kv
        self.max_context_tokens = max_context_tokens
        self.waiting: list[Request] = []          # sorted by arrival
        self.running: list[Request] = []          # decoding
        self.reserved_running_tokens = 0         # sum of _reservation(r) over running (kept as it changes)
        self.chunked: Request | None = None       # admitted, prefill not finished
        self.new_token_ratio = config.init_new_token_ratio
        self.step_id = 0
        self.num_retractions = 0
        self._finished: list[Request] = []
        self._abort_rids: set[str] = set()
        self._decode_runs = DecodeRuns(self)

    # -- intake ---------------------------------------------------------------------------
    def add(self, req: Request, now: float) -> None:
        """Queue a new request. One that can never run (longer than the context or the whole
        KV pool) ends at once as ABORTED with reason TOO_LONG."""
        if not req.input_ids:
            raise ValueError(f"request {req.rid} has an empty prompt")
        if self.max_context_tokens is not None:
            room = self.max_context_tokens - len(req.input_ids)
            if room < 1:
                self._end(req, FinishReason.TOO_LONG, now)
                return
            if req.sampling.max_new_tokens > room:
                req.sampling = dataclasses.replace(req.sampling, max_new_tokens=room)
        if len(req.input_ids) + 1 > self.kv.capacity_tokens:
            self._end(req, FinishReason.TOO_LONG, now)
            return
        req.status = RequestStatus.WAITING
        self._enqueue(req)

    def abort(self, rid: str) -> None:
        """Abort a request by id; takes effect at the next `schedule` (never inside a step)."""
        self._abort_rids.add(rid)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked is not None)

    def pop_finished(self) -> list[Request]:
        done, self._finished = self._finished, []
        return done

    # -- planning -------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        """The next step: a prefill (extend) batch if any request can be admitted, otherwise a
        decode batch of all running requests (mixed-chunk mode: both in one). None when idle."""
        if self._abort_rids:
            self._apply_aborts(now)
        if not self.running:                      # an idle batch starts over with the full reservation
            self.new_token_ratio = self.config.init_new_token_ratio
        plan = self._schedule_prefill(now)
        if plan is None:
            plan = self._schedule_decode(now)
        return plan

    def _schedule_prefill(self, now: float) -> StepPlan | None:
        if not self.waiting and self.chunked is None:
            return None
        mixed = self.config.enable_mixed_chunk and bool(self.running)
        budget = PrefillBudget(self.config, self.kv, self.running, self.new_token_ratio,
                               num_mixed_decodes=len(self.running) if mixed else 0,
                               reserved_running_tokens=self.reserved_running_tokens)
        admitted: list[tuple[Request, int]] = []
        num_cache_hit_tokens = 0
        if self.chunked is not None:
            take = budget.take_chunk(self.chunked)
            if take > 0:
                admitted.append((self.chunked, take))
        if self.waiting and budget.can_admit_more() and not (admitted and budget.chunk_full()):
            num_cache_hit_tokens = self._admit_waiting(budget, admitted, now)
        if not admitted:
            return None
        items = self._allocate_prefill(admitted, now)
        if not items:
            return None
        mode = ForwardMode.EXTEND
        retracted: list[str] = []
        if mixed:
            retracted = self._make_room_for_decode(now)
            items += self._decode_items(now)
            mode = ForwardMode.MIXED if self.running else ForwardMode.EXTEND
        return self._count_shared_prefix(StepPlan(self.step_id, mode, items, num_cache_hit_tokens, retracted))

    def _admit_waiting(self, budget: PrefillBudget, admitted: list[tuple[Request, int]],
                       now: float) -> int:
        """Walk the policy's order and admit while the budget allows; returns cache-hit tokens."""
        matches: dict[Request, MatchResult] = {}

        def match(req: Request) -> MatchResult:
            matches[req] = self.kv.match(req, now)         # touches the matched path at `now`
            return matches[req]

        num_cache_hit_tokens = 0
        for req in self.policy.order(self.waiting, match, now):
            if self._num_active(admitted) >= self.config.max_running_requests:
                if not self._preempt_for(req, budget, now, need_slot=True):
                    break
            if not budget.can_admit_more():
                break
            m = matches.get(req) or match(req)
            alone = not self.running and not admitted
            if not alone and not self._fits(req, m, budget):
                if not (self._preempt_for(req, budget, now, need_slot=False) and self._fits(req, m, budget)):
                    break                           # checked before pinning: a miss changes no cache stats
            self.kv.lock_prefix(req, m, now)
            take = budget.take_new(req, nothing_else_runs=not self.running and not admitted)
            if take <= 0:
                self.kv.unlock_prefix(req, now)
                break
            if req.admitted_s is None:
                req.admitted_s = now
                req.num_cached_tokens = m.length
            num_cache_hit_tokens += m.length
            admitted.append((req, take))
            if budget.chunk_full() or take < req.num_fill_tokens - req.num_computed_tokens:
                break
        if admitted:
            chosen = [r for r, _ in admitted if r is not self.chunked]
            if all(a is b for a, b in zip(self.waiting, chosen)):
                del self.waiting[:len(chosen)]       # FCFS-like: the admitted are the queue's head
            else:
                gone = set(chosen)
                self.waiting = [r for r in self.waiting if r not in gone]
        return num_cache_hit_tokens

    def _fits(self, req: Request, match: MatchResult, budget: PrefillBudget) -> bool:
        """Would `req` fit with its cached prefix `match`? (`req` owns no KV yet.)"""
        return budget.fits(req, match.length, self.kv.newly_protected_tokens(match))

    def _allocate_prefill(self, admitted: list[tuple[Request, int]], now: float) -> list[ScheduledItem]:
        items: list[ScheduledItem] = []
        for req, take in admitted:
            start = req.num_computed_tokens
            try:
                slots = self.kv.allocate(req, take, now)
            except MemoryError:                     # page rounding beat the estimate: retry later
                if req is self.chunked:
                    continue
                self.kv.release(req, now)
                self._enqueue(req)
                continue
            done = start + take == req.num_fill_tokens
            req.status = RequestStatus.PREFILL
            self.chunked = None if done else req
            items.append(ScheduledItem(req, start, take, slots, is_decode=False, samples=done))
        return items

    def _schedule_decode(self, now: float) -> StepPlan | None:
        if not self.running:
            return None
        retracted = self._make_room_for_decode(now)
        if not self.running:
            return None
        items = self._decode_items(now)
        return self._count_shared_prefix(StepPlan(self.step_id, ForwardMode.DECODE, items, 0, retracted))

    def _count_shared_prefix(self, plan: StepPlan) -> StepPlan:
        """Set the plan's decode_shared_tokens from the cache's lock counts (the other lock holders:
        its prefill items and a chunked request between chunks)."""
        decodes = [it.request for it in plan.items if it.is_decode]
        if not decodes:
            plan.decode_shared_tokens = 0
            return plan
        others = [it.request for it in plan.items if not it.is_decode]
        if self.chunked is not None and self.chunked not in others:
            others.append(self.chunked)
        plan.decode_shared_tokens = batch_shared_prefix_tokens(decodes, others, self.kv.cache)
        return plan

    def _decode_items(self, now: float) -> list[ScheduledItem]:
        slots = self.kv.allocate_decode(self.running, now)
        return [ScheduledItem(req, req.num_computed_tokens, 1, [s], True, True)   # is_decode, samples
                for req, s in zip(self.running, slots)]

    # -- memory pressure -----------------------------------------------------------------
    def _decode_pages(self, reqs: list[Request]) -> int:
        if self.kv.page_size == 1:
            return len(reqs)
        return sum(self.kv.pages_needed(r, 1) for r in reqs)

    def _make_room_for_decode(self, now: float) -> list[str]:
        """Retract running requests until the next decode step fits (SGLang's retract_decode):
        fewest output tokens first, then longest input. Returns the retracted rids."""
        page = self.kv.page_size
        if self.kv.available_tokens() >= self._decode_pages(self.running) * page:
            self.new_token_ratio = max(self.new_token_ratio - self.config.new_token_ratio_decay,
                                       self.config.min_new_token_ratio)
            return []
        victims = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.input_ids)), reverse=True)
        retracted: list[Request] = []
        while len(victims) > 1 and (
            not retracted
            or self.kv.available_tokens() < len(victims) * self.config.retract_decode_steps * page
        ):
            req = victims.pop()
            self._retract(req, now)
            retracted.append(req)
        if self.kv.available_tokens() < self._decode_pages(victims) * page:
            for req in victims:                    # a lone request longer than the whole pool
                self._end(req, FinishReason.TOO_LONG, now)
            victims = []
        gone = set(retracted)
        self._keep_running(lambda r: r not in gone and not r.is_finished)
        if self.running:
            decoded = sum(len(r.output_ids) for r in self.running)
            budget = sum(r.sampling.max_new_tokens for r in self.running)
            estimate = (decoded + self.config.retract_decode_steps * len(self.running)) / max(budget, 1)
            self.new_token_ratio = min(1.0, estimate)
        return [r.rid for r in retracted]

    def _preempt_for(self, req: Request, budget: PrefillBudget, now: float, need_slot: bool) -> bool:
        """Priority preemption: retract running requests less important than `req` by at least
        the policy's threshold, least important (then newest) first, until `req` fits."""
        threshold = self.policy.preemption_threshold
        if threshold is None:
            return False
        importance = self.policy.importance
        bar = importance(req) - threshold
        victims = sorted((r for r in self.running if importance(r) <= bar),
                         key=lambda r: (importance(r), -r.arrival_s), reverse=True)
        preempted = False
        while victims:
            victim = victims.pop()
            self._retract(victim, now)
            self.running.remove(victim)
            self.reserved_running_tokens -= self._reservation(victim)
            budget.forget_running(victim)
            preempted = True
            if need_slot or budget.fits(req, 0):
                break
        return preempted

    def _retract(self, req: Request, now: float) -> None:
        self.kv.release(req, now, count_hit=False)
        req.num_retractions += 1
        self.num_retractions += 1
        self._enqueue(req)

    # -- results ----------------------------------------------------------------------------
    def commit(self, plan: StepPlan, result: StepResult, now: float) -> None:
        """Apply a finished step at time `now` (its end): `advance` then `resolve` (no overlap)."""
        self.advance(plan, now, result.next_token_ids)
        self.resolve(plan, result, now)

    def advance(self, plan: StepPlan, now: float, placeholder_ids: list[int] | None = None) -> None:
        """Apply what a launched step changes whatever tokens it samples: computed tokens advance,
        each sampling item appends a placeholder output token (`placeholder_ids`, one per sampling
        item in plan order; the executor resolves them on the device, e.g. SGLang's negative
        future-token ids), prefilled prefixes enter the radix cache, finished prefills join
        `running`. With overlap scheduling the next `schedule` runs after `advance` but before
        `resolve` of this step, so a request this step ends is still in the next step's batch
        (its token there is dropped): SGLang's overlap scheduler behaves the same way.
        Items whose request ended (or was retracted) since they were scheduled are skipped."""
        if plan.mode is ForwardMode.DECODE:
            self._advance_decode(plan.items, placeholder_ids)
            self.step_id += 1
            return
        placeholders = iter(placeholder_ids) if placeholder_ids is not None else None
        clip = self.config.clip_max_new_tokens
        waiting, decoding = RequestStatus.WAITING, RequestStatus.DECODING
        for item in plan.items:
            req = item.request
            token = next(placeholders) if placeholders is not None and item.samples else -1
            status = req.status
            if status is not decoding and (status is waiting or req.is_finished):
                item.dropped = True               # ended or retracted after it was scheduled
                continue
            req.num_computed_tokens += item.num_new_tokens
            if not item.samples:
                self.kv.cache_unfinished(req, now, chunked=True)   # no LFU hit for an unfinished chunk
                continue
            outputs = req.output_ids
            if item.is_decode:
                if req.sampling.max_new_tokens - len(outputs) <= clip:
                    self.reserved_running_tokens -= 1        # its reservation shrinks by this token
                outputs.append(token)
            else:
                outputs.append(token)
                self.kv.cache_unfinished(req, now)
                req.status = decoding
                self.running.append(req)
                self.reserved_running_tokens += self._reservation(req)
        self.step_id += 1

    def _advance_decode(self, items: list[ScheduledItem], placeholder_ids: list[int] | None) -> None:
        """`advance` of a decode-only step (every item decodes and samples one token)."""
        clip = self.config.clip_max_new_tokens
        waiting, decoding = RequestStatus.WAITING, RequestStatus.DECODING
        tokens = placeholder_ids if placeholder_ids is not None else itertools.repeat(-1)
        num_shrunk = 0
        for item, token in zip(items, tokens):
            req = item.request
            status = req.status
            if status is not decoding and (status is waiting or req.is_finished):
                item.dropped = True               # ended or retracted after it was scheduled
                continue
            req.num_computed_tokens += 1
            outputs = req.output_ids
            if req.sampling.max_new_tokens - len(outputs) <= clip:
                num_shrunk += 1                   # its reservation shrinks by this token
            outputs.append(token)
        self.reserved_running_tokens -= num_shrunk

    def resolve(self, plan: StepPlan, result: StepResult, now: float) -> None:
        """The step's sampled tokens arrived at `now`: replace the placeholders, stamp token times,
        end requests that reached a stop token or max_new_tokens (releasing their KV)."""
        finished, aborted = RequestStatus.FINISHED, RequestStatus.ABORTED
        num_ended = 0
        items = plan.items if plan.mode is ForwardMode.DECODE else plan.sampling_items
        for item, token in zip(items, result.next_token_ids):
            if item.dropped:
                continue
            req = item.request
            outputs = req.output_ids
            index = item.num_prefix_tokens + item.num_new_tokens - len(req.input_ids)   # its output index
            if index >= len(outputs):             # retracted and re-admitted: the token was recomputed
                continue
            outputs[index] = token
            req.token_times_s.append(now)
            if req.first_token_s is None:
                req.first_token_s = now
            status = req.status
            if status is finished or status is aborted:
                continue
            sampling = req.sampling               # Request.finishes_with, inlined
            if index + 1 >= sampling.max_new_tokens:
                reason = FinishReason.LENGTH
            elif not sampling.ignore_eos and token in sampling.stop_token_ids:
                reason = FinishReason.STOP
            else:
                continue
            in_queue = status is RequestStatus.WAITING
            self._end(req, reason, now)
            if in_queue:                           # retracted after its step was launched
                self.waiting.remove(req)
            num_ended += 1
        if num_ended:
            self._keep_running(lambda r: not r.is_finished)

    # -- decode runs (the simulator's fast-forward) ----------------------------------------------
    def decode_run_bound(self, plan: StepPlan, max_steps: int, now: float, overlap: bool = False) -> int:
        """How many consecutive decode steps, starting with `plan`, provably make the same
        decisions as `plan` when nothing arrives (DecodeRuns.bound). Always >= 1."""
        return self._decode_runs.bound(plan, max_steps, now, overlap)

    def decode_run_length(self, num_steps: int, end_s, next_arrival_s: float | None, overlap: bool) -> int:
        """The longest run <= `num_steps` that stepping would also make (DecodeRuns.run_length)."""
        return self._decode_runs.run_length(num_steps, end_s, next_arrival_s, overlap)

    def decode_run_batches(self, plan: StepPlan, num_steps: int, overlap: bool) -> Iterator[DecodeGroup]:
        """The run's steps grouped by batch as requests finish inside it, lazily (DecodeRuns.batches)."""
        return self._decode_runs.batches(plan, num_steps, overlap)

    def commit_decode_run(self, plan: StepPlan, end_s: list[float], tokens: list[list[int]],
                          schedule_s: list[float] | None = None, overlap: bool = False) -> list[int]:
        """Apply k = len(end_s) decode steps of `plan` at once (DecodeRuns.commit); returns KV
        slots in use when stepping records each step."""
        return self._decode_runs.commit(plan, end_s, tokens, schedule_s, overlap)

    # -- helpers ------------------------------------------------------------------------------
    def _reservation(self, req: Request) -> int:
        """Decode tokens a running request may still write, as admission counts them (SGLang's
        PrefillAdder._get_running_request_total_token_offset before the ratio)."""
        return min(req.sampling.max_new_tokens - len(req.output_ids), self.config.clip_max_new_tokens)

    def _keep_running(self, keep) -> None:
        """Drop the running requests `keep` rejects, with their reservations."""
        kept = []
        for req in self.running:
            if keep(req):
                kept.append(req)
            else:
                self.reserved_running_tokens -= self._reservation(req)
        self.running = kept

    def _num_active(self, admitted: list[tuple[Request, int]]) -> int:
        """Requests holding (or about to hold) KV: running, chunked and admitted this step."""
        extra = sum(1 for r, _ in admitted if r is not self.chunked)
        return len(self.running) + (self.chunked is not None) + extra

    def _enqueue(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        bisect.insort(self.waiting, req, key=lambda r: r.arrival_s)

    def _end(self, req: Request, reason: FinishReason, now: float) -> None:
        self.kv.release(req, now)
        req.finish_reason = reason
        req.finish_s = now
        req.status = RequestStatus.ABORTED if reason in (FinishReason.ABORT, FinishReason.TOO_LONG) \
            else RequestStatus.FINISHED
        if self.chunked is req:
            self.chunked = None
        self._finished.append(req)

    def _apply_aborts(self, now: float) -> None:
        rids, self._abort_rids = self._abort_rids, set()
        for queue in (self.waiting, self.running, [self.chunked] if self.chunked else []):
            for req in [r for r in queue if r.rid in rids]:
                self._end(req, FinishReason.ABORT, now)
        self.waiting = [r for r in self.waiting if not r.is_finished]
        self._keep_running(lambda r: not r.is_finished)
