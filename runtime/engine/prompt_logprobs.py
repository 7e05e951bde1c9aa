"""Log-probabilities of prompt tokens (SGLang's input_token_logprobs) for the requests that ask: the
rows of each prefill chunk that predict a prompt token, reduced to the token's log-probability and the
top-k as the chunk runs, stitched across a request's chunks and handed over with its first sampled
token. The prefix match of such a request stops at its start (runtime.core.kv_manager), so every
position it asks about runs in its own prefill.
Imports torch; the host-side planning (`PromptAsk`) reads only the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
import torch

from runtime.core.batch import StepPlan
from runtime.engine.forward_batch import _to_device
from runtime.engine.logprob_params import prompt_logprob_start, top_logprobs_num
from runtime.engine.sampler import pinned

BLOCK_ROWS = 256       # rows through the LM head at once: bounds the [rows, vocab] float32 logits


class PromptAsk(NamedTuple):
    """One prefill chunk (sequence `seq` of the step) of a request that wants prompt log-probabilities
    from `start` on; `prompt_ids` are its prompt's tokens. Picklable (TP ranks receive it)."""

    seq: int
    rid: str
    start: int
    prefix: int                 # positions already in the KV pool (cached prefix or earlier chunks)
    num_new: int
    prompt_ids: tuple[int, ...]
    top_num: int
    samples: bool               # the chunk that samples: the values go out with its token


def prompt_asks(plan: StepPlan) -> list[PromptAsk] | None:
    """The step's chunks that prefill part of an asking request's prompt (None when there is none)."""
    asks = []
    for seq, item in enumerate(plan.items):
        req = item.request
        if item.num_prefix_tokens >= len(req.input_ids):     # decoding: past its prompt
            continue
        start = prompt_logprob_start(req.sampling, len(req.input_ids))
        if start is None:
            continue
        asks.append(PromptAsk(seq, req.rid, start, item.num_prefix_tokens, item.num_new_tokens,
                              tuple(req.input_ids), top_logprobs_num(req.sampling) or 0, item.samples))
    return asks or None


@dataclass
class PromptValues:
    """Positions start.. of one request: row j predicts prompt token start + j + 1. On the device until
    `to_host`."""

    start: int
    top_num: int
    token_logprobs: torch.Tensor            # [N] float32
    top_logprobs: torch.Tensor              # [N, K] float32, descending (K >= top_num)
    top_ids: torch.Tensor                   # [N, K] long

    def to_host(self) -> "PromptValues":
        if self.token_logprobs.device.type != "cuda":
            return self
        return PromptValues(self.start, self.top_num, pinned(self.token_logprobs), pinned(self.top_logprobs),
                            pinned(self.top_ids))

    def entry(self) -> tuple[int, list[float], list[list[tuple[int, float]]]]:
        """(start, logprob of each predicted token, its top (id, logprob) pairs)."""
        k = self.top_num
        tops = [list(zip(ids[:k], values[:k])) for ids, values in
                zip(self.top_ids.tolist(), self.top_logprobs.tolist())] if k else [[]] * len(self.token_logprobs)
        return self.start, self.token_logprobs.tolist(), tops


@dataclass
class _Partial:
    start: int
    next_pos: int                           # the position the request's next chunk starts at
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)


class PromptLogprobs:
    """Per request, the values of its chunks so far. `lm_head(hidden)`: float32 logits [rows, V]."""

    def __init__(self, lm_head: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._lm_head = lm_head
        self._partial: dict[str, _Partial] = {}

    def __len__(self) -> int:
        return len(self._partial)

    def step(self, asks: list[PromptAsk], hidden: torch.Tensor, extend_lens: list[int]) -> dict[int, PromptValues]:
        """Reduce this step's rows ([T, H] hidden states of its new tokens) for each ask; returns, by
        sequence index, the stitched values of the requests whose sampling chunk this is."""
        offsets = [0]
        for n in extend_lens:
            offsets.append(offsets[-1] + n)
        # a request mid-prefill continues in the next prefill step (the scheduler's chunked request
        # goes first): one that a step with asks leaves out was aborted or retracted
        live = {ask.rid for ask in asks}
        for rid in [r for r in self._partial if r not in live]:
            del self._partial[rid]
        done: dict[int, PromptValues] = {}
        for ask in asks:
            last = len(ask.prompt_ids) - 1      # positions before the last prompt token predict one
            part = self._partial.get(ask.rid)
            if part is None or part.next_pos != ask.prefix:        # its first chunk (or a new prefill)
                if ask.prefix > ask.start:
                    raise RuntimeError(f"{ask.rid}: prompt log-probabilities from {ask.start} on, but its "
                                       f"prefill starts at {ask.prefix} (the prefix match must stop at the start)")
                part = self._partial[ask.rid] = _Partial(ask.start, ask.start)
            lo, hi = max(ask.start, ask.prefix), min(ask.prefix + ask.num_new, last)
            if lo < hi:
                base = offsets[ask.seq] - ask.prefix
                part.parts.append(self._reduce(hidden[base + lo:base + hi], ask.prompt_ids[lo + 1:hi + 1],
                                               ask.top_num))
            part.next_pos = ask.prefix + ask.num_new
            if ask.samples:
                done[ask.seq] = self._stitch(self._partial.pop(ask.rid), ask.top_num, hidden)
        return done

    def _reduce(self, rows: torch.Tensor, targets, top_num: int):   # [N, H] -> ([N], [N, K], [N, K])
        chosen, top_values, top_ids = [], [], []
        target_t = _to_device(np.asarray(targets, dtype=np.int64), rows.device)          # [N]
        for b in range(0, rows.shape[0], BLOCK_ROWS):
            logprobs = torch.log_softmax(self._lm_head(rows[b:b + BLOCK_ROWS]), dim=-1)     # [n, V]
            # finite where a logit is -inf (valid JSON), as the sampled tokens' values are
            logprobs.clamp_min_(torch.finfo(torch.float32).min)
            chosen.append(logprobs.gather(1, target_t[b:b + BLOCK_ROWS, None]).squeeze(1))
            values, ids = logprobs.topk(max(top_num, 1), dim=-1)
            top_values.append(values)
            top_ids.append(ids)
        return torch.cat(chosen), torch.cat(top_values), torch.cat(top_ids)

    @staticmethod
    def _stitch(part: _Partial, top_num: int, like: torch.Tensor) -> PromptValues:
        if not part.parts:                  # nothing to predict: the prompt's last token, or a cached one
            k = max(top_num, 1)
            return PromptValues(part.start, top_num, torch.empty(0, device=like.device),
                                torch.empty((0, k), device=like.device),
                                torch.empty((0, k), dtype=torch.long, device=like.device))
        chosen, values, ids = (torch.cat(cols) for cols in zip(*part.parts))
        return PromptValues(part.start, top_num, chosen, values, ids)
