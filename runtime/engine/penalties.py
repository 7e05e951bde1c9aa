"""Frequency, presence and repetition penalties on a step's logits (SGLang's penalizers): built on the
host from the requests' tokens (`penalty_inputs`, picklable: every TP rank applies the same), applied on
the device before sampling (`apply_penalties`). Only rows whose request asks pay anything.

  frequency: logit -= frequency_penalty x (times the token was generated)
  presence:  logit -= presence_penalty  x (1 if it was generated)
  repetition (after the two): a token in the prompt or generated gets logit / p if logit > 0, else logit x p
  logit_bias: the given bias added to each named token's logit (after the penalties)
  min_new_tokens: before that many tokens, the stop tokens' logits are -inf (unless ignore_eos)

Legend: S = sampled rows, P = rows with penalties, V = vocabulary, N = tokens counted. Imports torch.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from runtime.core.request import Request, SamplingParams


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
    """The penalised rows of a step and the tokens each has seen (output tokens may be placeholders of a
    step still in flight: negative ids, resolved on the device)."""

    rows: np.ndarray            # int64 [P] sampled-row index of each penalised row
    frequency: np.ndarray       # float32 [P]
    presence: np.ndarray        # float32 [P]
    repetition: np.ndarray      # float32 [P]
    output_ids: np.ndarray      # int64 [N_out] generated tokens of the rows that count them, concatenated
    output_row: np.ndarray      # int64 [N_out] its row (0..P-1)
    prompt_ids: np.ndarray      # int64 [N_in] prompt tokens of rows with a repetition penalty
    prompt_row: np.ndarray      # int64 [N_in]
    blocked_ids: np.ndarray     # int64 [M] stop tokens of rows below their min_new_tokens
    blocked_row: np.ndarray     # int64 [M]
    bias_ids: np.ndarray        # int64 [K] tokens with a logit bias
    bias_row: np.ndarray        # int64 [K]
    bias: np.ndarray            # float32 [K]


def penalty_inputs(requests: Sequence[Request], params: Sequence[SamplingParams]) -> PenaltyInputs | None:
    """For the sampled rows' requests and their params; None when no row asks for a penalty."""
    rows = [i for i, (req, p) in enumerate(zip(requests, params)) if has_penalty(p) or blocks_stop_tokens(req, p)]
    if not rows:
        return None
    out_ids, out_row, in_ids, in_row, stop_ids, stop_row = [], [], [], [], [], []
    bias_ids, bias_row, bias = [], [], []
    for j, i in enumerate(rows):
        req = requests[i]
        for token, value in params[i].logit_bias:
            bias_ids.append(token)
            bias_row.append(j)
            bias.append(value)
        if blocks_stop_tokens(req, params[i]):
            stop_ids.append(np.asarray(params[i].stop_token_ids, dtype=np.int64))
            stop_row.append(np.full(len(params[i].stop_token_ids), j, dtype=np.int64))
        if not counts_tokens(params[i]):     # a logit bias or min_new_tokens only: no tokens to count
            continue
        generated = np.asarray(req.output_ids, dtype=np.int64)
        out_ids.append(generated)
        out_row.append(np.full(len(generated), j, dtype=np.int64))
        if params[i].repetition_penalty != 1:
            prompt = np.asarray(req.input_ids, dtype=np.int64)
            in_ids.append(prompt)
            in_row.append(np.full(len(prompt), j, dtype=np.int64))
    cat = lambda parts: np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)   # noqa: E731
    pick = lambda name: np.asarray([getattr(params[i], name) for i in rows], dtype=np.float32)   # noqa: E731
    return PenaltyInputs(np.asarray(rows, dtype=np.int64), pick("frequency_penalty"), pick("presence_penalty"),
                         pick("repetition_penalty"), cat(out_ids), cat(out_row), cat(in_ids), cat(in_row),
                         cat(stop_ids), cat(stop_row), np.asarray(bias_ids, dtype=np.int64),
                         np.asarray(bias_row, dtype=np.int64), np.asarray(bias, dtype=np.float32))


def apply_penalties(logits: torch.Tensor, pen: PenaltyInputs,
                    resolve: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """logits [S, V] float -> a penalised copy. `resolve` maps placeholder ids (< 0) to the tokens the
    steps in flight sampled (the future ring)."""
    device, vocab = logits.device, logits.shape[1]
    put = lambda a: torch.from_numpy(a).to(device, non_blocking=True)   # noqa: E731
    rows = put(pen.rows)
    sub = logits.index_select(0, rows).float()                                       # [P, V]
    if pen.output_ids.size or pen.prompt_ids.size:           # some row counts the tokens it has seen
        counts = torch.zeros_like(sub)                                               # [P, V]
        if pen.output_ids.size:
            ids = resolve(put(pen.output_ids)).clamp_(0, vocab - 1)                  # [N_out]
            counts.index_put_((put(pen.output_row), ids), torch.ones_like(ids, dtype=sub.dtype), accumulate=True)
        sub = sub - put(pen.frequency)[:, None] * counts - put(pen.presence)[:, None] * (counts > 0).to(sub.dtype)
        if (pen.repetition != 1).any():
            seen = counts > 0                                                        # [P, V]
            if pen.prompt_ids.size:
                seen[put(pen.prompt_row), put(pen.prompt_ids).clamp_(0, vocab - 1)] = True
            rep = put(pen.repetition)[:, None]                                       # [P, 1]
            sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    if pen.bias_ids.size:
        sub.index_put_((put(pen.bias_row), put(pen.bias_ids).clamp_(0, vocab - 1)), put(pen.bias), accumulate=True)
    if pen.blocked_ids.size:
        sub[put(pen.blocked_row), put(pen.blocked_ids).clamp_(0, vocab - 1)] = float("-inf")
    out = logits.float().clone()
    out[rows] = sub
    return out
