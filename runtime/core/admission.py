"""The token budget of one prefill step (SGLang's PrefillAdder): what is left of the KV pool after
the running requests' expected growth, of the step's prefill tokens, and of the chunk.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.kv_manager import KVManager
from runtime.core.request import Request
from runtime.core.scheduler_config import SchedulerConfig


class PrefillBudget:
    """Running requests reserve `min(max_new_tokens_left, clip) * new_token_ratio` future tokens
    each; a newly admitted request costs its new prefill tokens plus `min(max_new_tokens, clip)`.
    A request is admitted only if that cost fits in free + evictable KV minus all reservations."""

    def __init__(self, config: SchedulerConfig, kv: KVManager, running: list[Request],
                 new_token_ratio: float, num_mixed_decodes: int = 0) -> None:
        self.kv = kv
        self.clip = config.clip_max_new_tokens
        self.ratio = new_token_ratio
        clip = self.clip
        self.reserved_running = sum(
            min(r.sampling.max_new_tokens - len(r.output_ids), clip) for r in running) * new_token_ratio
        self.promised_tokens = 0
        self.rem_input_tokens = config.max_prefill_tokens - num_mixed_decodes
        chunk = config.chunked_prefill_size
        self.rem_chunk_tokens: int | None = chunk - num_mixed_decodes if chunk > 0 else None
        self.num_taken = 0

    # -- state --------------------------------------------------------------------------
    def rem_total_tokens(self) -> float:
        return self.kv.available_tokens() - self.reserved_running - self.promised_tokens

    def can_admit_more(self) -> bool:
        return self.rem_input_tokens > 0 and not self.chunk_full()

    def chunk_full(self) -> bool:
        return self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0

    def _cost(self, req: Request) -> tuple[int, int]:
        extend = req.num_fill_tokens - req.num_computed_tokens
        return extend, min(req.max_new_tokens_left, self.clip)

    def fits(self, req: Request, newly_protected_tokens: int = 0) -> bool:
        """Whether admitting `req` (its prefix not yet pinned; pinning would take
        `newly_protected_tokens` out of the evictable pool) keeps within the budget."""
        extend, reserve = self._cost(req)
        return extend + reserve <= self.rem_total_tokens() - newly_protected_tokens

    # -- taking ----------------------------------------------------------------------------
    def take_chunk(self, req: Request) -> int:
        """Next chunk of the request already being prefilled: bounded by the chunk and by memory."""
        extend, _ = self._cost(req)
        limit = min(extend, int(self.rem_total_tokens()))
        if self.rem_chunk_tokens is not None:
            limit = min(limit, self.rem_chunk_tokens)
        return self._take(max(limit, 0), 0)

    def take_new(self, req: Request, nothing_else_runs: bool) -> int:
        """Tokens of a newly admitted request (its prefix already pinned) to prefill this step;
        0 means it does not fit. When nothing else holds KV the request runs anyway if its new
        tokens fit now: the decode path retracts or aborts it should it outgrow the pool."""
        extend, reserve = self._cost(req)
        rem_total = self.rem_total_tokens()
        if extend + reserve > rem_total and not (nothing_else_runs and extend <= rem_total):
            return 0
        if extend > self.rem_input_tokens and self.num_taken > 0:
            return 0
        take = extend
        if self.rem_chunk_tokens is not None:
            take = min(take, self.rem_chunk_tokens)
        return self._take(take, reserve)

    def _take(self, take: int, reserve: int) -> int:
        if take <= 0:
            return 0
        self.promised_tokens += take + reserve
        self.rem_input_tokens -= take
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= take
        self.num_taken += 1
        return take

    def forget_running(self, req: Request) -> None:
        """A running request was preempted: its reservation is released."""
        self.reserved_running -= min(req.max_new_tokens_left, self.clip) * self.ratio
