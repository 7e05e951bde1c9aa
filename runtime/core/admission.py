"""The token budget of one prefill step (SGLang's PrefillAdder): what is left of the KV pool after
the running requests' expected growth, of the step's prefill tokens, and of the chunk.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from runtime.core.kv_manager import KVManager
from runtime.core.request import Request
from runtime.core.scheduler_config import SchedulerConfig


def running_reservation_tokens(running: list[Request], clip: int) -> int:
    """Decode tokens the running requests may still write: sum of min(max_new_tokens left, clip)
    (SGLang's PrefillAdder._get_running_request_total_token_offset before the ratio)."""
    return sum(min(r.sampling.max_new_tokens - len(r.output_ids), clip) for r in running)


class PrefillBudget:
    """SGLang's PrefillAdder arithmetic, in tokens:

    - `rem_total_tokens` = free + evictable KV - (running reservation x new_token_ratio
      + mixed decode tokens + every admitted chunk (page-ceiled) + its decode reservation);
    - a new request fits when extend + min(max_new_tokens left, clip) < rem_total_tokens
      (strictly, as SGLang's add_one_req), and its page-ceiled extend < the step's remaining
      `max_prefill_tokens` unless it is the first of the step;
    - a request that fits whole reserves min(max_new_tokens, clip); a truncated first chunk is
      page-aligned (rem_chunk // page * page) and reserves nothing; the continuing chunk of the
      request already being prefilled reserves min(max_new_tokens, clip) when it is its last.
    Lengths are charged page-ceiled to the prefill, chunk and KV budgets (_update_prefill_budget).
    """

    def __init__(self, config: SchedulerConfig, kv: KVManager, running: list[Request],
                 new_token_ratio: float, num_mixed_decodes: int = 0,
                 reserved_running_tokens: int | None = None) -> None:
        self.kv = kv
        self.page_size = kv.page_size
        self.clip = config.clip_max_new_tokens
        self.ratio = new_token_ratio
        if reserved_running_tokens is None:
            reserved_running_tokens = running_reservation_tokens(running, self.clip)
        self.total_offset_tokens = reserved_running_tokens * new_token_ratio + num_mixed_decodes
        self.current_offset_tokens = num_mixed_decodes
        self.rem_input_tokens = config.max_prefill_tokens - num_mixed_decodes
        chunk = config.chunked_prefill_size
        self.rem_chunk_tokens: int | None = chunk - num_mixed_decodes if chunk > 0 else None
        self.num_taken = 0

    # -- state --------------------------------------------------------------------------
    def rem_total_tokens(self) -> float:
        """KV left after every reservation (may be fractional: the ratio scales reservations)."""
        return self.kv.available_tokens() - self.total_offset_tokens

    def cur_rem_tokens(self) -> int:
        """KV left after the tokens this step writes (no future decode reservations)."""
        return self.kv.available_tokens() - self.current_offset_tokens

    def can_admit_more(self) -> bool:
        """SGLang's budget_state() == CONTINUE: KV, prefill tokens and chunk all left."""
        return (self.rem_input_tokens > 0 and not self.chunk_full()
                and self.rem_total_tokens() > 0 and self.cur_rem_tokens() > 0)

    def chunk_full(self) -> bool:
        return self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0

    def ceil_paged(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size) * self.page_size

    def _total_tokens(self, req: Request, prefix_tokens: int) -> int:
        """What admission must find room for: the new prefill tokens and the decode estimate."""
        left = max(req.sampling.max_new_tokens - len(req.output_ids), 0)
        return req.num_fill_tokens - prefix_tokens + min(left, self.clip)

    def fits(self, req: Request, prefix_tokens: int, newly_protected_tokens: int = 0) -> bool:
        """Whether `req` with a cached prefix of `prefix_tokens` (not pinned yet; pinning it takes
        `newly_protected_tokens` out of the evictable pool) fits the KV budget. Pure."""
        return self._total_tokens(req, prefix_tokens) < self.rem_total_tokens() - newly_protected_tokens

    # -- taking ----------------------------------------------------------------------------
    def take_chunk(self, req: Request) -> int:
        """Next chunk of the request already being prefilled (SGLang's add_chunked_req): bounded
        by the chunk and by memory; when memory is short the chunk still advances by the chunk
        budget (the request holds KV already: stalling it would only waste what it holds)."""
        extend = req.num_fill_tokens - req.num_computed_tokens
        rem = int(self.rem_total_tokens())
        if self.rem_chunk_tokens is not None:
            rem = min(self.rem_chunk_tokens, rem)
            if rem <= 0:
                rem = self.rem_chunk_tokens
        take = min(extend, rem)
        if take <= 0:
            return 0
        reserve = 0 if take < extend else min(req.sampling.max_new_tokens, self.clip)
        return self._take(take, reserve)

    def take_new(self, req: Request, nothing_else_runs: bool) -> int:
        """Tokens of a newly admitted request (its prefix already pinned) to prefill this step;
        0 means it does not fit (SGLang's add_one_req). When nothing else holds KV the request
        runs anyway if its new tokens fit now (where SGLang would wait forever): the decode path
        retracts or aborts it should it outgrow the pool."""
        extend = req.num_fill_tokens - req.num_computed_tokens
        rem_total = self.rem_total_tokens()
        if self._total_tokens(req, req.num_computed_tokens) >= rem_total \
                and not (nothing_else_runs and extend <= rem_total):
            return 0
        input_tokens = self.ceil_paged(extend)
        if input_tokens >= self.rem_input_tokens and self.num_taken > 0:
            return 0
        if self.rem_chunk_tokens is None or input_tokens <= self.rem_chunk_tokens:
            return self._take(extend, min(req.sampling.max_new_tokens, self.clip))
        take = self.rem_chunk_tokens // self.page_size * self.page_size   # a page-aligned first chunk
        if take <= 0:
            return 0
        return self._take(take, 0)

    def _take(self, take: int, reserve: int) -> int:
        paged = self.ceil_paged(take)
        self.total_offset_tokens += paged + reserve
        self.current_offset_tokens += paged
        self.rem_input_tokens -= paged
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= paged
        self.num_taken += 1
        return take

    def forget_running(self, req: Request) -> None:
        """A running request was preempted: its reservation is released."""
        self.total_offset_tokens -= min(req.max_new_tokens_left, self.clip) * self.ratio
