"""The workload contract and the checks every workload shares.

Must not import torch or simpy: workloads only build `RequestSpec`s.
"""
from __future__ import annotations

import math
from typing import Protocol, Sequence

from runtime.core.request import RequestSpec


class Workload(Protocol):
    """A deterministic source of requests.

    `requests()` returns specs sorted by (arrival_s, rid), with unique string rids and token
    ids in [0, vocab_size). The same constructor arguments (seed included) always give the
    same list; calling it twice gives equal lists.
    """

    def requests(self) -> list[RequestSpec]: ...


def check_common_args(num_requests: int | None, time_scale: float, vocab_size: int) -> None:
    """Validate the knobs every workload takes; raises ValueError naming the bad one."""
    if num_requests is not None and (not isinstance(num_requests, int) or num_requests < 0):
        raise ValueError(f"num_requests must be None or an int >= 0, got {num_requests!r}")
    if not math.isfinite(time_scale) or time_scale < 0:
        raise ValueError(f"time_scale must be finite and >= 0, got {time_scale!r}")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an int >= 1, got {vocab_size!r}")


def rid_width(count: int) -> int:
    """Zero-padding width so that rids of `count` requests sort as their indices do."""
    return max(6, len(str(max(count - 1, 0))))


def sorted_specs(specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """Specs in the contract order: by arrival time, ties broken by rid."""
    return sorted(specs, key=lambda spec: (spec.arrival_s, spec.rid))


def clamp_output_len(num_output_tokens: int) -> int:
    """Traces record 0 generated tokens for some requests; a request must generate at
    least one token (SamplingParams requires max_new_tokens >= 1), so 0 becomes 1."""
    return max(1, num_output_tokens)
