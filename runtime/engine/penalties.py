"""Frequency, presence and repetition penalties, logit bias and min_new_tokens on a step's logits (SGLang's
penalizers), with running token counts per request kept on the device, as SGLang's `cumulated_*` tensors.

  frequency: logit -= frequency_penalty x (times the token was generated)
  presence:  logit -= presence_penalty  x (1 if it was generated)
  repetition (after the two): a token in the prompt or generated gets logit / p if logit > 0, else logit x p
  logit_bias: the given bias added to each named token's logit (after the penalties)
  min_new_tokens: before that many tokens, the stop tokens' logits are -inf (unless ignore_eos)

Two halves, as BatchBuilder's: `PenaltyBook` (host, the scheduling rank) decides which state row each
counting request holds and when a row is (re)built from the request's tokens; it emits picklable
`PenaltyInputs`, which `PenaltyCounts` (device, every TP rank) applies before sampling and updates with
the sampled tokens after it, so every rank keeps the same state. Host work per step is O(penalised rows);
a request's tokens are read on the host only when its row is built (first sampling step, or after a
retraction). Requests that ask for no counting penalty hold no state.

Legend: S = sampled rows, C = rows with a counting penalty, R = state rows (capacity), V = vocabulary,
N = tokens of rebuilt rows. Imports torch.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from runtime.core.request import Request, RequestStatus, SamplingParams
from runtime.engine.forward_batch import _to_device

_NO_PAIRS = np.empty((2, 0), dtype=np.int64)


def counts_tokens(params: SamplingParams) -> bool:
    """A penalty that depends on the tokens seen (frequency, presence, repetition)."""
    return params.frequency_penalty != 0 or params.presence_penalty != 0 or params.repetition_penalty != 1


def has_penalty(params: SamplingParams) -> bool:
    return counts_tokens(params) or bool(params.logit_bias)


def blocks_stop_tokens(req: Request, params: SamplingParams) -> bool:
    """The request's next token must not be a stop token (min_new_tokens not reached yet)."""
    return not params.ignore_eos and len(req.output_ids) < params.min_new_tokens and bool(params.stop_token_ids)


@dataclass
class PenaltyInputs:
    """One step's penalty work, as every rank runs it (picklable). Row pairs are int64 [2, *]."""

    capacity: int                   # state rows after this step's resize
    keep_rows: np.ndarray | None    # int64 [L]: a resize (None: none); new row i is old row keep_rows[i]
    reset_rows: np.ndarray          # int64 [Z] state rows rebuilt this step: zeroed, then filled from
    output_tokens: np.ndarray       #   (state row, output token), tokens may be placeholders (< 0)
    prompt_tokens: np.ndarray       #   (state row, prompt token), rows with a repetition penalty
    counted: np.ndarray             # (sampled row, state row) [2, C] of the rows with a counting penalty
    weights: np.ndarray             # float32 [3, C]: frequency, presence, repetition
    blocked: np.ndarray             # (sampled row, stop token) [2, M], rows below their min_new_tokens
    biased: np.ndarray              # (sampled row, token) [2, K]
    bias: np.ndarray                # float32 [K]

    @property
    def touches_logits(self) -> bool:
        return bool(self.counted.shape[1] or self.blocked.shape[1] or self.biased.shape[1])


@dataclass
class _Entry:
    request: Request
    row: int
    counted: int                    # output tokens the row counts: the next sampled position
    retractions: int                # request.num_retractions when it was built


class PenaltyBook:
    """Host half: the state row of each request with a counting penalty. A row is built when its request
    first samples, rebuilt from the request's tokens when it no longer matches them (re-admitted after a
    retraction), and freed once the request ended or went back to the queue. Rows are compacted as the
    count of holders moves: capacity is the power of two >= holders (0 when none), shrunk at a quarter."""

    def __init__(self) -> None:
        self.capacity = 0
        self._entries: dict[str, _Entry] = {}
        self._free: list[int] = []

    @property
    def num_requests(self) -> int:
        """Requests holding a state row."""
        return len(self._entries)

    def inputs(self, requests: Sequence[Request], params: Sequence[SamplingParams]) -> PenaltyInputs | None:
        """For one step's sampled rows (their requests and params); None when the step has nothing to do
        (no penalised row, no resize). Mutates the bookkeeping: call once per launched step."""
        if not requests:
            return None
        counting = [i for i, p in enumerate(params) if counts_tokens(p)]
        in_step = {requests[i].rid: requests[i] for i in counting}
        self._sweep(in_step)
        stale = [i for i in counting if not self._matches(requests[i])]
        num_new = sum(requests[i].rid not in self._entries for i in stale)
        keep = self._fit(len(self._entries) + num_new)
        reset, outputs, prompts = [], [], []
        for i in stale:
            entry = self._build(requests[i])
            reset.append(entry.row)
            outputs.append(_pairs(entry.row, requests[i].output_ids))
            if params[i].repetition_penalty != 1:
                prompts.append(_pairs(entry.row, requests[i].input_ids))
        state_rows = []
        for i in counting:
            entry = self._entries[requests[i].rid]
            state_rows.append(entry.row)
            entry.counted += 1                      # this step's token, added on the device after sampling
        counted = np.asarray([counting, state_rows], dtype=np.int64).reshape(2, -1)
        blocked, biased, bias = _stop_and_bias(requests, params)
        if keep is None and not counting and not blocked.shape[1] and not biased.shape[1]:
            return None
        weights = np.asarray([[params[i].frequency_penalty, params[i].presence_penalty,
                               params[i].repetition_penalty] for i in counting], dtype=np.float32).reshape(-1, 3).T
        return PenaltyInputs(self.capacity, keep, np.asarray(reset, dtype=np.int64), _cat(outputs), _cat(prompts),
                             counted, np.ascontiguousarray(weights), blocked, biased, bias)

    def _matches(self, req: Request) -> bool:
        entry = self._entries.get(req.rid)
        return (entry is not None and entry.counted == len(req.output_ids)
                and entry.retractions == req.num_retractions)

    def _sweep(self, in_step: dict[str, Request]) -> None:
        """Free the rows of requests replaced by another of the same id, ended, or back in the queue
        (stream order keeps a step in flight safe: a freed row is rebuilt only after it ran)."""
        for rid, entry in list(self._entries.items()):
            req, current = entry.request, in_step.get(rid)
            if current is req:
                continue
            if current is not None or req.is_finished or req.status is RequestStatus.WAITING:
                self._free.append(self._entries.pop(rid).row)

    def _build(self, req: Request) -> _Entry:
        entry = self._entries.get(req.rid)
        if entry is None:
            entry = self._entries[req.rid] = _Entry(req, self._free.pop(), 0, 0)
        entry.counted, entry.retractions = len(req.output_ids), req.num_retractions
        return entry

    def _fit(self, num_rows: int) -> np.ndarray | None:
        """Resize for `num_rows` holders when they outgrow the capacity or fill a quarter of it or less;
        returns the old rows of the holders (renumbered 0..L-1 in order), None without a resize."""
        if num_rows == 0:
            capacity = 0
        elif num_rows > self.capacity or 4 * num_rows <= self.capacity:
            capacity = 1 << (num_rows - 1).bit_length()
        else:
            return None
        if capacity == self.capacity:
            return None
        keep = np.asarray([e.row for e in self._entries.values()], dtype=np.int64)
        for new_row, entry in enumerate(self._entries.values()):
            entry.row = new_row
        self.capacity = capacity
        self._free = list(range(capacity - 1, len(keep) - 1, -1))
        return keep


def _pairs(row: int, tokens: Sequence[int]) -> np.ndarray:
    ids = np.asarray(tokens, dtype=np.int64)
    return np.stack([np.full(len(ids), row, dtype=np.int64), ids])


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts, axis=1) if parts else _NO_PAIRS


def _stop_and_bias(requests: Sequence[Request], params: Sequence[SamplingParams]):
    """(sampled row, stop token) pairs of rows below min_new_tokens; (sampled row, token) pairs and values
    of logit biases. O(rows + their stop tokens and biases)."""
    blocked, biased, bias = [], [], []
    for i, p in enumerate(params):
        if p.min_new_tokens and blocks_stop_tokens(requests[i], p):
            blocked.append(_pairs(i, p.stop_token_ids))
        if p.logit_bias:
            for token, value in p.logit_bias:
                biased.append((i, token))
                bias.append(value)
    pairs = np.asarray(biased, dtype=np.int64).reshape(-1, 2).T
    return _cat(blocked), np.ascontiguousarray(pairs), np.asarray(bias, dtype=np.float32)


class PenaltyCounts:
    """Device half (every rank): counts [R, V] float32 of each row's output tokens, and in_prompt [R, V]
    bool of its prompt tokens (rows with a repetition penalty). No tensor while no row is held."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.counts: torch.Tensor | None = None       # [R, V] float32
        self.in_prompt: torch.Tensor | None = None    # [R, V] bool
        self._counted: tuple[PenaltyInputs, torch.Tensor] | None = None   # this step's rows, copied once

    @property
    def capacity(self) -> int:
        return 0 if self.counts is None else self.counts.shape[0]

    def apply(self, logits: torch.Tensor, pen: PenaltyInputs,
              resolve: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """logits [S, V] -> a penalised float copy (or logits itself when no row's logits change), after
        this step's resize and rebuilds. `resolve` maps placeholder ids (< 0) to the tokens the steps in
        flight sampled (the future ring)."""
        self._resize(pen, logits.shape[1])
        self._rebuild(pen, resolve)
        if not pen.touches_logits:
            return logits
        vocab = logits.shape[1]
        out = logits.float().clone()                                                 # [S, V]
        if pen.counted.shape[1]:
            counted, weights = self._counted_rows(pen), self._put(pen.weights)       # [2, C], [3, C]
            counts = self.counts.index_select(0, counted[1])                         # [C, V]
            sub = out.index_select(0, counted[0])                                    # [C, V]
            sub = sub - weights[0, :, None] * counts - weights[1, :, None] * (counts > 0).float()
            if (pen.weights[2] != 1).any():
                seen = (counts > 0) | self.in_prompt.index_select(0, counted[1])      # [C, V]
                rep = weights[2, :, None]                                            # [C, 1]
                sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
            out.index_copy_(0, counted[0], sub)
        if pen.biased.shape[1]:
            biased = self._put(pen.biased)
            out.index_put_((biased[0], biased[1].clamp(0, vocab - 1)), self._put(pen.bias), accumulate=True)
        if pen.blocked.shape[1]:
            blocked = self._put(pen.blocked)
            out[blocked[0], blocked[1].clamp(0, vocab - 1)] = float("-inf")
        return out

    def cumulate(self, pen: PenaltyInputs, token_ids: torch.Tensor) -> None:
        """After sampling: each counting row's sampled token (token_ids [S] on the device, no sync) joins
        its request's counts (SGLang's _cumulate_output_tokens)."""
        if not pen.counted.shape[1]:
            return
        counted = self._counted_rows(pen)                                            # [2, C]
        tokens = token_ids.index_select(0, counted[0]).clamp(0, self.counts.shape[1] - 1)
        self.counts.index_put_((counted[1], tokens), torch.ones_like(tokens, dtype=torch.float32),
                               accumulate=True)

    def _resize(self, pen: PenaltyInputs, vocab: int) -> None:
        if pen.keep_rows is not None:
            if pen.capacity == 0:
                self.counts = self.in_prompt = None
            else:
                width = vocab if self.counts is None else self.counts.shape[1]
                counts = torch.zeros(pen.capacity, width, dtype=torch.float32, device=self.device)
                in_prompt = torch.zeros(pen.capacity, width, dtype=torch.bool, device=self.device)
                if pen.keep_rows.size:
                    keep = self._put(pen.keep_rows)
                    counts[:len(keep)] = self.counts.index_select(0, keep)
                    in_prompt[:len(keep)] = self.in_prompt.index_select(0, keep)
                self.counts, self.in_prompt = counts, in_prompt
        if pen.capacity != self.capacity:
            raise RuntimeError(f"penalty state holds {self.capacity} rows, the step expects {pen.capacity}")

    def _rebuild(self, pen: PenaltyInputs, resolve: Callable[[torch.Tensor], torch.Tensor]) -> None:
        if not pen.reset_rows.size:
            return
        vocab = self.counts.shape[1]
        reset = self._put(pen.reset_rows)
        self.counts.index_fill_(0, reset, 0.0)
        self.in_prompt.index_fill_(0, reset, False)
        if pen.output_tokens.shape[1]:
            pairs = self._put(pen.output_tokens)                                     # [2, N]
            tokens = resolve(pairs[1]).clamp_(0, vocab - 1)
            self.counts.index_put_((pairs[0], tokens), torch.ones_like(tokens, dtype=torch.float32),
                                   accumulate=True)
        if pen.prompt_tokens.shape[1]:
            pairs = self._put(pen.prompt_tokens)
            self.in_prompt[pairs[0], pairs[1].clamp(0, vocab - 1)] = True

    def _counted_rows(self, pen: PenaltyInputs) -> torch.Tensor:
        if self._counted is None or self._counted[0] is not pen:
            self._counted = pen, self._put(pen.counted)
        return self._counted[1]

    def _put(self, array: np.ndarray) -> torch.Tensor:
        return _to_device(np.ascontiguousarray(array), self.device)
