"""Sampling parameters of a request that asks for log-probabilities of its output tokens; what the
sampler reads to know which rows pay for them. Torch-free (the HTTP process builds them).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.core.request import SamplingParams

MAX_TOP_LOGPROBS = 20       # OpenAI's chat limit; also the most /generate accepts


@dataclass(frozen=True)
class LogprobSamplingParams(SamplingParams):
    """SamplingParams plus `top_logprobs_num`: each sampled token comes back with its log-probability
    and the `top_logprobs_num` most likely (token, log-probability) pairs of its distribution."""

    top_logprobs_num: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs_num}")


def top_logprobs_num(params: SamplingParams) -> int | None:
    """None when the request does not ask for log-probabilities, else its top-k count (0 = the
    sampled token's only)."""
    return params.top_logprobs_num if isinstance(params, LogprobSamplingParams) else None
