"""Knobs of the scheduler (SGLang's server args that shape batching), as one frozen dataclass.

Must not import torch, simpy or time.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    chunked_prefill_size: int = 8192      # max new prefill tokens of one request per step; <= 0 disables chunking
    max_prefill_tokens: int = 16384       # max new prefill tokens of one step (a single longer request still runs)
    max_running_requests: int = 1024      # decoding + prefilling requests at once
    enable_mixed_chunk: bool = False      # run decodes in the same step as a prefill
    init_new_token_ratio: float = 0.7     # share of max_new_tokens reserved for running requests ...
    min_new_token_ratio_factor: float = 0.14  # ... decaying linearly to init x this (SGLang: 0.7 x 0.14) ...
    new_token_ratio_decay_steps: int = 600  # ... over this many decode steps
    retract_decode_steps: int = 20        # after a retraction keep room for this many decode steps per request
    clip_max_new_tokens: int = 4096       # cap on max_new_tokens when estimating future KV use

    def __post_init__(self) -> None:
        if self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if not 0 <= self.init_new_token_ratio <= 1 or not 0 <= self.min_new_token_ratio_factor <= 1:
            raise ValueError("need init_new_token_ratio and min_new_token_ratio_factor in [0, 1]")
        if self.new_token_ratio_decay_steps < 1:
            raise ValueError("new_token_ratio_decay_steps must be >= 1")

    @property
    def min_new_token_ratio(self) -> float:
        """The floor of the decaying reservation ratio (SGLang's Scheduler.min_new_token_ratio:
        init_new_token_ratio x default_min_new_token_ratio_factor, 0.7 x 0.14 = 0.098)."""
        return self.init_new_token_ratio * self.min_new_token_ratio_factor

    @property
    def new_token_ratio_decay(self) -> float:
        return (self.init_new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps
