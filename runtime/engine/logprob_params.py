"""Sampling parameters of a request that asks for log-probabilities of its output (and prompt) tokens;
what the sampler reads to know which rows pay for them, and the entry it returns per row. Torch-free
(the HTTP process builds them, the scheduler process reads the entries).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from runtime.core.request import SamplingParams

MAX_TOP_LOGPROBS = 20       # OpenAI's chat limit; also the most /generate accepts


@dataclass(frozen=True)
class LogprobSamplingParams(SamplingParams):
    """SamplingParams plus `top_logprobs_num`: each sampled token comes back with its log-probability
    and the `top_logprobs_num` most likely (token, log-probability) pairs of its distribution.
    `logprob_start_len` (a SamplingParams field, since the core reads it: the prefix match stops there)
    >= 0 (SGLang's): the prompt tokens from that position on come back too, each with its
    log-probability given the tokens before it (the first one's is None); -1: none."""

    top_logprobs_num: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs_num}")


def top_logprobs_num(params: SamplingParams) -> int | None:
    """None when the request does not ask for log-probabilities, else its top-k count (0 = the
    sampled token's only)."""
    return params.top_logprobs_num if isinstance(params, LogprobSamplingParams) else None


def prompt_logprob_start(params: SamplingParams, num_prompt_tokens: int) -> int | None:
    """The first prompt position whose token's log-probability the request wants (clamped below the
    last), or None when it wants none: the positions before the last prompt token are the ones that
    cost a forward row each."""
    if not isinstance(params, LogprobSamplingParams) or params.logprob_start_len < 0:
        return None
    return min(params.logprob_start_len, num_prompt_tokens - 1)


class TokenLogprobs(NamedTuple):
    """One sampled row's entry (StepResult.logprobs): its token's log-probability and its top (token id,
    logprob) pairs; on the row that samples a request's first token, `prompt` = (start, logprob of each
    prompt token after `start`, their top pairs) when the request asked for prompt log-probabilities."""

    logprob: float
    top: list[tuple[int, float]]
    prompt: tuple[int, list[float], list[list[tuple[int, float]]]] | None = None
